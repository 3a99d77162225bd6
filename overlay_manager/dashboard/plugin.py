"""rqt plugin "Overlay": wiring only (model + widget); the one module that imports rqt_gui_py."""

from __future__ import annotations

from typing import Any

from rqt_gui_py.plugin import Plugin

from overlay_manager.dashboard.model import OverlayModel
from overlay_manager.dashboard.widget import SETTING_KEYS, OverlayDashboardWidget


class OverlayPlugin(Plugin):
    """Shows one overlay_manager node's peers, paths and actions inside rqt."""

    def __init__(self, context: Any) -> None:
        """Create the model and widget and add the widget to rqt (rqt has called init_node)."""
        super().__init__(context)
        self.setObjectName("OverlayDashboard")
        self._model = OverlayModel(self)
        self._widget = OverlayDashboardWidget(self._model)
        if context.serial_number() > 1:
            self._widget.setWindowTitle(f"{self._widget.windowTitle()} ({context.serial_number()})")
        context.add_widget(self._widget)
        self._widget.start()

    def shutdown_plugin(self) -> None:
        """Unregister subscribers and stop timers."""
        self._widget.shutdown()
        self._model.shutdown()

    def save_settings(self, plugin_settings: Any, instance_settings: Any) -> None:
        """Store the selected node, hidden columns and sort in this instance's settings."""
        for key, value in self._widget.save_state().items():
            instance_settings.set_value(key, value)

    def restore_settings(self, plugin_settings: Any, instance_settings: Any) -> None:
        """Apply what save_settings stored (missing keys keep the defaults)."""
        self._widget.restore_state({key: instance_settings.value(key) for key in SETTING_KEYS
                                    if instance_settings.contains(key)})
