"""The node selector lists only overlay nodes that exist (Xvfb, real roscore, fake-data node).

With only a machine's robot.launch node running (``/alpha_laptop/overlay_manager``, the namespace
of host alpha-laptop), the dashboard starts on the default ``/overlay_manager``, finds the laptop's
node and switches to it; the default must not stay in the list (picking it showed an empty table).

    source "$(bash scripts/build)/devel/setup.bash"
    /usr/bin/python3 -m pytest test/gui/test_dashboard_node_list.py -v
"""

from __future__ import annotations

import time
from typing import Iterator, List

import pytest
from dashboard_harness import start_fake_node, stop_fake_node, wait_for

from overlay_manager.core.ros_names import overlay_node, ros_namespace
from overlay_manager.view.state import DEFAULT_NODE

HOST = "alpha-laptop"
NODE = overlay_node(HOST)


def _published(topic: str) -> bool:
    import rosgraph
    return any(t == topic for t, _ in rosgraph.Master("/dashboard_node_list_test").getPublishedTopics(""))


@pytest.fixture(scope="module")
def laptop_node(roscore, ros_env) -> Iterator[None]:
    """Only the laptop's node on the graph (waits for a default node of another module to go)."""
    wait_for(f"no {DEFAULT_NODE}/peers publisher left on the master", lambda: not _published(f"{DEFAULT_NODE}/peers"),
             15)
    proc = start_fake_node(ros_env, ns="/" + ros_namespace(HOST))
    try:
        yield None
    finally:
        stop_fake_node(proc)


def _items(widget) -> List[str]:
    return [widget.node_combo.itemText(i) for i in range(widget.node_combo.count())]


def test_selector_lists_only_the_node_that_exists(qapp, rospy_node, laptop_node) -> None:
    from overlay_manager.dashboard.model import OverlayModel
    from overlay_manager.dashboard.widget import OverlayDashboardWidget

    model = OverlayModel(discovery_period_s=0.3)
    widget = OverlayDashboardWidget(model)
    widget.show()
    try:
        widget.start()
        assert model.node() == DEFAULT_NODE  # before discovery: the default, waiting
        wait_for(f"the dashboard to switch to {NODE}", lambda: model.node() == NODE, 15,
                 lambda: f"model node={model.node()}, found={model.nodes()}, items={_items(widget)}")
        wait_for(f"{NODE}'s peers in the table", lambda: widget.peer_table.rowCount() == 3,
                 15, lambda: f"{widget.peer_table.rowCount()} rows")
        deadline = time.monotonic() + 2.0  # several discovery rounds: the list must stay as it is
        while time.monotonic() < deadline:
            qapp.processEvents()
            assert _items(widget) == [NODE], _items(widget)
            time.sleep(0.05)
        assert widget.node_combo.currentText() == NODE
        assert widget.snapshot()["nodes"] == [NODE]
    finally:
        widget.shutdown()
        model.shutdown()
        widget.close()
        widget.deleteLater()
        qapp.processEvents()
