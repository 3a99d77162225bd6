"""The ROS boundary is a test, not a habit: rospy, genpy, the generated messages and Qt are imported
only by the ROS adapter (the node's modules), the dashboard's Qt parts and the lab's in-namespace
tools. Everything else is plain Python, unit-tested without ROS (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path
from typing import List, Set

import pytest

PKG = Path(__file__).resolve().parents[2] / "overlay_manager"

# top-level names (or dotted prefixes) that belong to ROS or Qt
ROS_OR_QT = ("rospy", "genpy", "rosgraph", "roslib", "rostopic", "rosnode", "rosservice", "roslaunch",
             "rosbag", "std_msgs", "sensor_msgs", "diagnostic_msgs", "geometry_msgs", "cv_bridge",
             "python_qt_binding", "PyQt5", "qt_gui", "rqt_gui", "rqt_gui_py",
             "overlay_manager.msg", "overlay_manager.srv")

# where such imports belong (paths relative to overlay_manager/)
ADAPTER = ("node.py", "node_main.py", "node_messages.py", "node_topics.py", "wire.py",
           "dashboard/*.py", "lab/*.py", "lab/*/*.py")
# pure parts inside those folders: they must stay importable without ROS and Qt
PURE_INSIDE = ("dashboard/__init__.py", "dashboard/state.py", "dashboard/format.py", "dashboard/topics.py")


def _ros_imports(path: Path) -> List[str]:
    """ROS or Qt modules path imports (at any depth, relative imports of .msg/.srv included)."""
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: List[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: `from .msg import Peer`, `from .. import msg`
                names = [mod] if mod else [a.name for a in node.names]
                names = ["overlay_manager." + n.split(".")[-1] for n in names if n.split(".")[-1] in ("msg", "srv")]
            else:
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for n in names:
            if any(n == r or n.startswith(r + ".") for r in ROS_OR_QT):
                found.add(n)
    return sorted(found)


def _allowed(rel: str) -> bool:
    if any(fnmatch.fnmatch(rel, p) for p in PURE_INSIDE):
        return False
    return any(fnmatch.fnmatch(rel, p) for p in ADAPTER)


MODULES = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py"))


@pytest.mark.parametrize("rel", MODULES)
def test_ros_and_qt_only_in_the_adapter(rel):
    if _allowed(rel):
        return
    imported = _ros_imports(PKG / rel)
    assert not imported, (f"overlay_manager/{rel} imports {', '.join(imported)}: ROS and Qt belong in the "
                          f"ROS adapter ({', '.join(ADAPTER)}); keep this module plain Python")


def test_the_check_sees_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import rospy\nfrom .msg import Peer\nfrom PyQt5.QtCore import Qt\nimport json\n")
    assert _ros_imports(f) == ["PyQt5.QtCore", "PyQt5.QtCore.Qt", "overlay_manager.msg", "rospy"]
    assert _allowed("node.py") and _allowed("dashboard/widget.py") and not _allowed("dashboard/state.py")
    assert not _allowed("peers.py")
