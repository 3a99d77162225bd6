"""ros_names.ros_namespace: every DNS host name gives a ROS-legal, distinct namespace."""

from __future__ import annotations

import itertools
import re

import pytest

from overlay_manager.core.ros_names import overlay_node, ros_namespace

LEGAL_BASE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")  # rosgraph.names' rule for a base name


@pytest.mark.parametrize("host, ns", [
    ("robot1", "robot1"), ("alpha-robot1", "alpha_robot1"), ("3d-scanner", "h_3d_scanner"),
    ("Base-Station", "base_station"), ("alpha-robot1.fleet.internal.", "alpha_robot1"),
    ("0", "h_0"), ("a--b", "a__b"),
])
def test_examples(host, ns):
    assert ros_namespace(host) == ns


def test_legal_and_injective_on_dns_labels():
    alphabet = "a1-"
    labels = ["".join(p) for n in range(1, 5) for p in itertools.product(alphabet, repeat=n)
              if not p[0] == "-" and not p[-1] == "-"]
    seen = {}
    for label in labels:
        ns = ros_namespace(label)
        assert LEGAL_BASE.match(ns), (label, ns)
        assert seen.setdefault(ns, label) == label, f"{label} and {seen[ns]} both map to {ns}"


def test_empty_is_refused():
    with pytest.raises(ValueError, match="no host name"):
        ros_namespace(" ")


def test_overlay_node_is_under_the_namespace():
    assert overlay_node("alpha-robot1") == "/alpha_robot1/overlay_manager"
    assert overlay_node("4th-robot.fleet.internal") == "/h_4th_robot/overlay_manager"
