"""The dashboard widget under Xvfb against a real roscore and a real (fake-data) overlay node.

    source "$(bash scripts/build)/devel/setup.bash"
    /usr/bin/python3 -m pytest test/gui -v

Checks: the node is discovered, the peer table fills, a path change recolours the row and lands in
the log, ping / measure link / wait for direct show their results, settings round-trip, the Topics
view fills from ~topic_links, a node that stops publishing is marked stale (and unmarked when it
comes back), the peer table gets most of a small window, and the standalone window runs and
saves QSettings. Saves artifacts/dashboard.png.
"""

from __future__ import annotations

import os
import signal
import subprocess
import xmlrpc.client
from pathlib import Path
from typing import Dict, Iterator

import pytest
from dashboard_harness import ARTIFACTS, REPO, send_command, stop_process, wait_for

from overlay_manager.view import text as fmt

NODE = "/overlay_manager"


@pytest.fixture(scope="module")
def dashboard(qapp, rospy_node, fake_node) -> Iterator[object]:
    """The widget with its model, shown in a 1200x820 window, watching /overlay_manager."""
    from overlay_manager.dashboard.model import OverlayModel
    from overlay_manager.dashboard.widget import OverlayDashboardWidget

    model = OverlayModel(discovery_period_s=0.5)
    widget = OverlayDashboardWidget(model)
    widget.resize(1200, 820)
    widget.show()
    widget.start()
    yield widget
    widget.shutdown()
    model.shutdown()
    widget.close()
    widget.deleteLater()
    qapp.processEvents()


def table_text(widget) -> str:
    """The table as text, for timeout messages."""
    t = widget.peer_table
    rows = []
    for r in range(t.rowCount()):
        rows.append(" | ".join(t.item(r, c).text() if t.item(r, c) else "" for c in range(t.columnCount())))
    return "; ".join(rows) or "(empty table)"


def cell(widget, peer: str, key: str):
    """The table item of a peer's column (None if the peer is not shown)."""
    from overlay_manager.dashboard.peer_table import COL
    row = widget.row_of(peer)
    return None if row < 0 else widget.peer_table.item(row, COL[key])


def test_node_is_discovered(dashboard) -> None:
    combo = dashboard.node_combo
    wait_for(f"{NODE} in the node selector (found by its ~peers topic)",
             lambda: combo.findText(NODE) >= 0 and NODE in dashboard._model.nodes(),
             15,
             lambda: f"combo={[combo.itemText(i) for i in range(combo.count())]}, "
                     f"model nodes={dashboard._model.nodes()}")
    assert dashboard._model.node() == NODE


def test_table_fills(dashboard) -> None:
    wait_for("3 peers in the table", lambda: dashboard.peer_table.rowCount() == 3, 15,
             lambda: table_text(dashboard))
    assert cell(dashboard, "robot1", "path").text() == "direct"
    assert cell(dashboard, "robot1", "where").text() == "192.0.2.10:41641"
    assert cell(dashboard, "robot1", "address").text() == "100.64.0.2"
    assert cell(dashboard, "robot1", "latency").text() == "0.85 ms"
    assert cell(dashboard, "robot2", "path").text() == "derp"
    assert cell(dashboard, "robot2", "where").text() == "DERP lab"
    assert cell(dashboard, "robot3", "online").text() == "no"
    assert cell(dashboard, "robot1", "handshake").text().endswith("s ago")
    # rates need two PeerList messages (2 Hz): 2 Mbyte/s per message pair -> 16 Mbit/s
    wait_for("robot1's rx rate from two counter samples",
             lambda: cell(dashboard, "robot1", "rx").text().endswith("Mbit/s"),
             10, lambda: table_text(dashboard))
    assert cell(dashboard, "robot1", "rx").text() == "16.0 Mbit/s"
    colour = cell(dashboard, "robot2", "path").background().color().name()
    assert colour == fmt.path_colour("derp")


def test_status_panel(dashboard) -> None:
    wait_for("this machine's status", lambda: "laptop1" in dashboard.self_value.text(), 10,
             lambda: dashboard.self_value.text())
    assert "easy NAT" in dashboard.nat_value.text()
    assert "enrolled; control server reachable" in dashboard.state_value.text()
    assert "robot1.fleet.internal:11311" in dashboard.ros_value.text()
    assert dashboard.headline_label.text().startswith("3 peers: 1 direct, 1 derp, 1 offline")


def test_path_change_recolours_row(dashboard, fake_node) -> None:
    wait_for("robot2 in the table", lambda: cell(dashboard, "robot2", "path") is not None, 15)
    assert send_command(fake_node, "path robot2 direct 192.0.2.11:41641").startswith("ok")
    wait_for("robot2's path to become direct", lambda: cell(dashboard, "robot2", "path").text() == "direct",
             10, lambda: table_text(dashboard))
    item = cell(dashboard, "robot2", "path")
    assert item.background().color().name() == fmt.path_colour("direct")
    assert cell(dashboard, "robot2", "name").background().color().name() == fmt.path_tint("direct")
    assert cell(dashboard, "robot2", "where").text() == "192.0.2.11:41641"
    wait_for("a line in the path-change log", lambda: dashboard.path_log.count() >= 1, 10)
    line = dashboard.path_log.item(0)
    assert "robot2  derp -> direct  192.0.2.11:41641" in line.text()
    assert line.foreground().color().name() == fmt.path_colour("direct")


def test_ping_shows_latency(dashboard) -> None:
    wait_for("robot1 row to select", lambda: dashboard.select_peer("robot1"), 15)
    assert dashboard.ping_button.isEnabled()
    dashboard.ping_button.click()
    wait_for("the ping result", lambda: "1.23 ms mean" in dashboard.last_result(), 15,
             lambda: dashboard.result_text.toPlainText())
    assert "ping robot1: 3 answered" in dashboard.last_result()
    assert "path direct via 192.0.2.10:41641" in dashboard.last_result()
    assert any(s.latency_ms == pytest.approx(1.23) for s in dashboard._model.history("robot1"))


def test_measure_and_wait(dashboard) -> None:
    wait_for("robot1 row to select", lambda: dashboard.select_peer("robot1"), 15)
    dashboard.measure_button.click()
    wait_for("the measure-link result", lambda: "measure robot1: TCP 1.70 Gbit/s" in dashboard.last_result(),
             15, lambda: dashboard.result_text.toPlainText())
    dashboard.wait_button.click()
    wait_for("the wait-for-direct result", lambda: "wait for robot1 direct: direct" in dashboard.last_result(),
             15, lambda: dashboard.result_text.toPlainText())


def test_unreachable_service_is_reported(dashboard, qapp) -> None:
    from overlay_manager.dashboard.model import OverlayModel
    from overlay_manager.dashboard.widget import OverlayDashboardWidget
    model = OverlayModel()
    widget = OverlayDashboardWidget(model)
    widget.select_node("/nobody/overlay_manager", user=True)
    model.ping("robot1")
    wait_for("the error for a missing service", lambda: "not available" in widget.last_result(), 15,
             lambda: widget.result_text.toPlainText())
    widget.shutdown()
    model.shutdown()
    widget.deleteLater()


def test_settings_round_trip(dashboard, qapp) -> None:
    from overlay_manager.dashboard.model import OverlayModel
    from overlay_manager.dashboard.peer_table import COL
    from overlay_manager.dashboard.widget import OverlayDashboardWidget
    dashboard.set_column_visible("tx", False)
    dashboard.peer_table.sortItems(COL["latency"], 1)  # Qt.DescendingOrder
    state = dashboard.save_state()
    assert state == {"node": NODE, "hidden_columns": "tx", "sort_column": "latency", "sort_order": "desc"}
    model = OverlayModel()
    other = OverlayDashboardWidget(model)
    other.restore_state(state)
    assert model.node() == NODE
    assert other.hidden_columns() == ["tx"]
    assert other.save_state() == state
    other.shutdown()
    model.shutdown()
    other.deleteLater()
    dashboard.set_column_visible("tx", True)
    dashboard.peer_table.sortItems(COL["name"], 0)


def test_node_selector_is_not_editable(dashboard) -> None:
    # an editable combo box with focus can crash Qt when rqt closes; picking from a list and
    # Refresh serve as well
    assert not dashboard.node_combo.isEditable()
    assert dashboard.refresh_button.isEnabled()


def test_a_second_dashboard_shows_the_latched_topic_links(qapp, dashboard) -> None:
    """A dashboard opened later in the same process (two plugins in one rqt) gets ~topic_links
    from rospy's latch at once when it subscribes; selecting the node must not clear them
    afterwards (the fake node publishes its links only once)."""
    from overlay_manager.dashboard.model import OverlayModel
    from overlay_manager.dashboard.widget import OverlayDashboardWidget

    wait_for("3 topic links in the first dashboard", lambda: len(dashboard.topic_rows()) == 3, 15,
             lambda: str(dashboard.snapshot()["topics"]))
    model = OverlayModel(discovery_period_s=0.5)
    second = OverlayDashboardWidget(model)
    second.show()
    second.start()
    try:
        wait_for("the second dashboard on /overlay_manager with the 3 latched topic links",
                 lambda: model.node() == NODE and len(second.topic_rows()) == 3,
                 15,
                 lambda: f"node={model.node()!r} topics={second.snapshot()['topics']}")
        for _ in range(20):  # and they stay (nothing clears them after the node change)
            qapp.processEvents()
        assert len(second.topic_rows()) == 3
    finally:
        second.shutdown()
        model.shutdown()
        second.close()
        second.deleteLater()
        qapp.processEvents()


def test_topics_view_fills(dashboard) -> None:
    from overlay_manager.dashboard.cells import STALE_BACKGROUND
    wait_for("3 cross-machine topic links in the Topics view (the local /rosout link left out)",
             lambda: len(dashboard.topic_rows()) == 3 and dashboard.topic_rows()[0]["path_colour"]
             != STALE_BACKGROUND,
             15,
             lambda: str(dashboard.snapshot()["topics"]))
    rows = {r["topic"]: r for r in dashboard.topic_rows()}
    cam = rows["/robot1/camera/image_raw"]
    assert (cam["from"], cam["to"], cam["path"], cam["where"]) == ("robot1", "laptop1", "direct",
                                                                  "192.0.2.10:41641")
    assert cam["rate"] == "16.0 Mbit/s"
    assert cam["path_colour"] == fmt.path_colour("direct")
    assert (cam["tier"], cam["cap"], cam["budget"]) == ("", "", "")  # not a shaped stream
    teleop = rows["/robot2/cmd_vel"]
    assert (teleop["from"], teleop["to"], teleop["path"], teleop["where"], teleop["rate"]) == (
        "laptop1", "robot2", "derp", "DERP lab", "-")
    assert teleop["path_colour"] == fmt.path_colour("derp")
    # what the shaping gives the relayed viewer of a shaped cloud, from the publisher's stream_state
    cloud = rows["/robot2/points/shaped (shaped /robot2/points, fitted tier)"]
    assert (cloud["from"], cloud["to"], cloud["path"], cloud["rate"]) == ("robot2", "laptop1", "derp", "3.84 Mbit/s")
    assert (cloud["tier"], cloud["cap"], cloud["budget"]) == ("fitted zstd", "1.5 Hz", "4.00 Mbit/s")
    from overlay_manager.dashboard.topic_table import TCOL
    table = dashboard.topic_table
    row = next(r for r in range(table.rowCount()) if table.item(r, TCOL["topic"]).text().startswith("/robot2/points"))
    tip = table.item(row, TCOL["tier"]).toolTip()
    assert "from /robot2/points/shaped/stream_state" in tip and "decimate 1/5" in tip, tip
    assert [table.horizontalHeaderItem(TCOL[k]).text() for k in ("tier", "cap", "budget")] == [
        "Tier", "Rate cap", "Budget"]
    assert dashboard.snapshot()["topics_headline"] == "3 topic links: 2 derp, 1 direct"


def test_peer_table_gets_most_of_the_window(qapp, rospy_node, fake_node) -> None:
    """At 800x600 (a small rqt window) the peers fill most of the height, all columns fit."""
    from overlay_manager.dashboard.model import OverlayModel
    from overlay_manager.dashboard.widget import OverlayDashboardWidget
    model = OverlayModel()
    widget = OverlayDashboardWidget(model)
    widget.resize(800, 600)
    widget.show()
    widget.start(NODE)
    try:
        wait_for("3 peers in the small window", lambda: widget.peer_table.rowCount() == 3, 15,
                 lambda: table_text(widget))
        qapp.processEvents()
        table = widget.peer_table
        assert table.height() >= 0.5 * widget.height(), (table.height(), widget.height())
        rows_visible = table.viewport().height() // table.verticalHeader().defaultSectionSize()
        assert rows_visible >= 12, rows_visible
        assert not table.horizontalScrollBar().isVisible()
    finally:
        widget.shutdown()
        model.shutdown()
        widget.close()
        widget.deleteLater()


def test_stale_node_is_marked(dashboard, fake_node) -> None:
    from overlay_manager.dashboard.cells import STALE_BACKGROUND
    wait_for("a fresh table", lambda: dashboard.peer_table.rowCount() == 3 and not dashboard.snapshot()["stale"],
             15, lambda: dashboard.snapshot()["headline"])
    assert send_command(fake_node, "pause") == "ok pause"
    try:
        wait_for("the stale mark after ~peers/~status stopped (3 publish periods, at least 3 s)",
                 lambda: dashboard.snapshot()["stale"],
                 10,
                 lambda: dashboard.snapshot()["headline"])
        snap = dashboard.snapshot()
        assert snap["headline"].startswith("STALE since"), snap["headline"]
        assert f"from {NODE}" in snap["headline"]
        assert all(r["path_colour"] == STALE_BACKGROUND for r in snap["rows"]), snap["rows"]
        assert all(r["path_colour"] == STALE_BACKGROUND for r in snap["topics"]), snap["topics"]
    finally:
        assert send_command(fake_node, "resume") == "ok resume"
    wait_for("the stale mark to clear after resume", lambda: not dashboard.snapshot()["stale"], 10,
             lambda: dashboard.snapshot()["headline"])
    assert cell(dashboard, "robot1", "path").background().color().name() == fmt.path_colour("direct")
    assert dashboard.snapshot()["headline"].startswith("3 peers")


def test_node_reporting_stale_is_marked(dashboard, fake_node) -> None:
    from overlay_manager.dashboard.cells import STALE_BACKGROUND
    wait_for("a fresh table", lambda: dashboard.peer_table.rowCount() == 3 and not dashboard.snapshot()["stale"],
             15, lambda: dashboard.snapshot()["headline"])
    assert send_command(fake_node, "blind") == "ok blind"
    try:
        wait_for("the stale mark with the node's reason from ~peers.stale/~status.stale",
                 lambda: "tailscaled is not reachable" in dashboard.snapshot()["headline"],
                 10,
                 lambda: dashboard.snapshot()["headline"])
        snap = dashboard.snapshot()
        assert "cannot read tailscaled (tailscaled is not reachable" in snap["headline"], snap["headline"]
        assert all(r["path_colour"] == STALE_BACKGROUND for r in snap["rows"]), snap["rows"]
    finally:
        assert send_command(fake_node, "sees") == "ok sees"
    wait_for("the stale mark to clear", lambda: not dashboard.snapshot()["stale"], 10,
             lambda: dashboard.snapshot()["headline"])


def test_screenshot(dashboard) -> None:
    wait_for("robot1 row to select", lambda: dashboard.select_peer("robot1"), 15)
    wait_for("three history samples", lambda: len(dashboard._model.history("robot1")) >= 3, 10)
    dashboard._on_tick()
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "dashboard.png"
    assert dashboard.grab().save(str(path)), f"could not write {path}"
    assert path.stat().st_size > 10_000
    print(f"screenshot: {path}")
    dashboard.view_tabs.setCurrentWidget(dashboard.topics_tab)  # the Topics view, for the docs
    wait_for("the Topics view shown with its 3 links",
             lambda: dashboard.topic_table.isVisible() and dashboard.topic_table.rowCount() == 3,
             10)
    topics = ARTIFACTS / "dashboard_topics.png"
    try:
        assert dashboard.grab().save(str(topics)), f"could not write {topics}"
    finally:
        dashboard.view_tabs.setCurrentWidget(dashboard.peers_tab)
    assert topics.stat().st_size > 10_000


def _subscribers(master_uri: str, topic: str) -> list:
    state = xmlrpc.client.ServerProxy(master_uri).getSystemState("/test")[2]
    return next((nodes for name, nodes in state[1] if name == topic), [])


def test_standalone_window(xvfb, roscore, ros_env: Dict[str, str], fake_node, tmp_path: Path) -> None:
    env = dict(ros_env, DISPLAY=xvfb, XDG_CONFIG_HOME=str(tmp_path))
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    proc = subprocess.Popen(["/usr/bin/python3", str(REPO / "scripts" / "dashboard"), "--node",
                             "/robot9/overlay_manager"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("the standalone dashboard to subscribe to /robot9/overlay_manager/peers",
            lambda: proc.poll() is not None or any(
            n.startswith("/overlay_dashboard") for n in _subscribers(roscore, "/robot9/overlay_manager/peers")), 30)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
    finally:
        stop_process(proc, sig=signal.SIGINT, timeout=15)
    out = proc.communicate()[0] if proc.stdout and not proc.stdout.closed else ""
    assert proc.returncode == 0, out[-3000:]
    conf = tmp_path / "overlay_manager" / "dashboard.conf"
    assert conf.is_file(), f"no QSettings file; output: {out[-2000:]}"
    assert "node=/robot9/overlay_manager" in conf.read_text()
