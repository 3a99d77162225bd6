"""``rosrun overlay_manager dashboard``: the dashboard widget in its own window, without rqt.

Settings (node, columns, sort, window geometry) persist through QSettings
(``~/.config/overlay_manager/dashboard.conf`` on Linux).

    rosrun overlay_manager dashboard [--node /robot1/overlay_manager]

With ``OVERLAY_DASHBOARD_DUMP=/path/state.json`` in the environment the window also writes what it
shows (``OverlayDashboardWidget.snapshot()`` plus screen positions of the window, the peer rows and
the action buttons) to that file twice a second, replaced atomically: for tests and headless checks.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any, Dict, List, Optional

import rospy
from python_qt_binding.QtCore import QSettings, QTimer
from python_qt_binding.QtWidgets import QApplication, QMainWindow

from overlay_manager.dashboard.model import OverlayModel
from overlay_manager.dashboard.widget import SETTING_KEYS, OverlayDashboardWidget
from overlay_manager.system.files import atomic_write

SETTINGS_ORG = "overlay_manager"
SETTINGS_APP = "dashboard"
DUMP_ENV = "OVERLAY_DASHBOARD_DUMP"
DUMP_PERIOD_MS = 500


def parse_args(argv: List[str]) -> argparse.Namespace:
    """Command line (ROS remappings already removed)."""
    parser = argparse.ArgumentParser(prog="dashboard", description=__doc__.splitlines()[0])
    parser.add_argument("--node", default="",
                        help="overlay_manager node to show (default: the saved one, else "
                             "/overlay_manager or the first found on the graph)")
    parser.add_argument("--no-settings", action="store_true",
                        help="neither read nor write the saved settings")
    return parser.parse_args(argv)


class DashboardWindow(QMainWindow):
    """QMainWindow holding the widget; saves settings when closed."""

    def __init__(self, settings: Optional[QSettings], node: str = "") -> None:
        """Build model and widget, restore settings (unless None), pick node, start discovery."""
        super().__init__()
        self.setWindowTitle("Overlay dashboard")
        self._settings = settings
        self.model = OverlayModel(self)
        self.widget = OverlayDashboardWidget(self.model, self)
        self.setCentralWidget(self.widget)
        self.resize(1100, 780)
        if settings is not None:
            geometry = settings.value("geometry")
            if geometry is not None:
                self.restoreGeometry(geometry)
            self.widget.restore_state({k: settings.value(k) for k in SETTING_KEYS
                                       if settings.contains(k)})
        if node:
            self.widget.select_node(node, user=True)
        self.widget.start()

    def dump_state(self) -> Dict[str, Any]:
        """The widget's snapshot plus global screen positions (x, y, width, height) of the window,
        each peer row (by name) and the action buttons."""
        w = self.widget
        table = w.peer_table

        def rect(widget: Any, local: Any = None) -> List[int]:
            r = local if local is not None else widget.rect()
            top_left = widget.mapToGlobal(r.topLeft())
            return [top_left.x(), top_left.y(), r.width(), r.height()]

        rows = {}
        for row in range(table.rowCount()):
            item = table.item(row, 0)
            if item is not None:
                rows[item.text()] = rect(table.viewport(), table.visualItemRect(item))
        frame = self.frameGeometry()
        state = w.snapshot()
        state["screen"] = {
            "window": [frame.x(), frame.y(), frame.width(), frame.height()],
            "rows": rows,
            "buttons": {name: rect(getattr(w, f"{name}_button")) for name in ("ping", "measure", "wait")},
        }
        return state

    def write_dump(self, path: str) -> None:
        """Write dump_state() as JSON to path (overlay_manager.system.files.atomic_write)."""
        state = self.dump_state()
        state["pid"] = os.getpid()
        try:
            atomic_write(path, json.dumps(state).encode("utf-8"), 0o644)
        except OSError as exc:
            rospy.logwarn_throttle(60, f"dashboard: cannot write {path}: {exc}")

    def closeEvent(self, event: object) -> None:  # noqa: N802 (Qt override)
        """Save settings, unregister subscribers."""
        if self._settings is not None:
            for key, value in self.widget.save_state().items():
                self._settings.setValue(key, value)
            self._settings.setValue("geometry", self.saveGeometry())
            self._settings.sync()
        self.widget.shutdown()
        self.model.shutdown()
        super().closeEvent(event)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the window until it is closed or SIGINT/SIGTERM arrives; returns the exit code."""
    argv = rospy.myargv(sys.argv if argv is None else argv)
    args = parse_args(argv[1:])
    window: Optional[DashboardWindow] = None
    stop_requested = []

    def close(signum: int, frame: object) -> None:
        stop_requested.append(signum)
        if window is not None:
            window.close()

    # before anything else: a SIGINT while the window is built must close it, not raise in Qt code
    signal.signal(signal.SIGINT, close)
    signal.signal(signal.SIGTERM, close)
    app = QApplication(argv[:1])
    rospy.init_node("overlay_dashboard", anonymous=True, disable_signals=True)
    settings = None if args.no_settings else QSettings(SETTINGS_ORG, SETTINGS_APP)
    window = DashboardWindow(settings, args.node)
    window.show()
    if stop_requested:
        window.close()
        rospy.signal_shutdown("dashboard closed")
        return 0
    pulse = QTimer()  # lets Python run its signal handlers while Qt's loop waits
    pulse.timeout.connect(lambda: None)
    pulse.start(200)
    dump_path = os.environ.get(DUMP_ENV, "")
    dump = QTimer()
    if dump_path:
        dump.timeout.connect(lambda: window.write_dump(dump_path))
        dump.start(DUMP_PERIOD_MS)
    code = app.exec_()
    rospy.signal_shutdown("dashboard closed")
    return code
