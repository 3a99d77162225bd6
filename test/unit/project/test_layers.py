"""The folders are the layers, and a test holds them (docs/ARCHITECTURE.md, "Layers").

1. Imports run only downwards: a module imports overlay_manager modules of its own folder or of a
   folder of a lower layer, never one above it or beside it.
2. The ROS boundary: rospy, genpy, the generated messages and Qt are imported only by the ROS
   adapter (ros/), the dashboard (Qt) and the lab. Everything else is plain Python,
   unit-tested without ROS.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path
from typing import List, Optional, Set, Tuple

import pytest

PKG = Path(__file__).resolve().parents[3] / "overlay_manager"

# layer of each top-level folder of overlay_manager/: a folder may import only lower layers (and itself)
LAYERS = {
    "core": 0,        # pure values: peers, NAT summary, topic links, robot config, validation
    "system": 1,      # OS plumbing: files, hosts block, processes, workers, nftables, sockets, iperf3
    "tailscaled": 2,  # the machine's daemons: LocalAPI client, status decoding, IPN bus, relay, derper
    "monitor": 3,     # the overlay monitor: readings, diagnostics wording
    "fleet": 3,       # provisioning: fleet file -> Headscale deployment, policy, bundles
    "view": 3,        # the view model every front end shares: words, colours, history, Topics rows
    "ros": 4,         # the ROS adapter: node, messages, topics, services
    "cli": 4,         # command-line tools: overlay_env, fleet
    "dashboard": 4,   # rqt plugin and standalone window
    "testing": 5,     # fakes shared by tests and the lab (never installed)
    "lab": 6,         # network-namespace campus, demo, benchmarks (never installed)
}

# top-level names (or dotted prefixes) that belong to ROS or Qt
ROS_OR_QT = ("rospy", "genpy", "rosgraph", "roslib", "rostopic", "rosnode", "rosservice", "roslaunch",
             "rosbag", "std_msgs", "sensor_msgs", "diagnostic_msgs", "geometry_msgs", "cv_bridge",
             "python_qt_binding", "PyQt5", "qt_gui", "rqt_gui", "rqt_gui_py",
             "overlay_manager.msg", "overlay_manager.srv")

# where such imports belong (paths relative to overlay_manager/); the view model the dashboard
# shows is the pure folder view/, one layer below it
ADAPTER = ("ros/*.py", "dashboard/*.py", "lab/*.py", "lab/*/*.py", "lab/*/*/*.py")


def _imports(path: Path) -> List[Tuple[int, str]]:
    """(line, absolute dotted name) of everything path imports, at any depth; relative imports resolved."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    out: List[Tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join(base + ([mod] if mod else []))
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return out


def _ros_imports(path: Path) -> List[str]:
    """ROS or Qt modules path imports."""
    found: Set[str] = set()
    for _, n in _imports(path):
        if any(n == r or n.startswith(r + ".") for r in ROS_OR_QT):
            found.add(n)
    return sorted(found)


def _folder(dotted: str) -> Optional[str]:
    """The top-level folder of overlay_manager a dotted name lies in (None: not one of ours)."""
    parts = dotted.split(".")
    if parts[0] != "overlay_manager" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else None


def _upward(path: Path) -> List[str]:
    """Imports of path that run up or sideways between layers, as 'line N: name (layer)'."""
    rel = path.relative_to(PKG)
    own = rel.parts[0] if len(rel.parts) > 1 else None
    if own is None:
        return []  # overlay_manager/__init__.py
    bad = []
    for line, name in _imports(path):
        other = _folder(name)
        if other is None or other == own:
            continue
        if LAYERS[other] >= LAYERS[own]:
            bad.append(f"line {line}: {name} ({other}, layer {LAYERS[other]})")
    return sorted(set(bad))


def _allowed(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel, p) for p in ADAPTER)


MODULES = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py"))


def test_every_module_is_in_a_layer():
    loose = [m for m in MODULES if "/" not in m and m != "__init__.py"]
    folders = sorted({m.split("/")[0] for m in MODULES if "/" in m})
    assert not loose, f"modules outside the layer folders: {loose}; put each in one of {sorted(LAYERS)}"
    assert folders == sorted(LAYERS), f"folders {folders} differ from the layer table {sorted(LAYERS)}"


@pytest.mark.parametrize("rel", MODULES)
def test_imports_run_downwards(rel):
    own = rel.split("/")[0]
    bad = _upward(PKG / rel)
    assert not bad, (f"overlay_manager/{rel} (layer {own}, {LAYERS.get(own)}) imports from a layer that is not "
                     f"below it: {'; '.join(bad)}")


@pytest.mark.parametrize("rel", MODULES)
def test_ros_and_qt_only_in_the_adapter(rel):
    if _allowed(rel):
        return
    imported = _ros_imports(PKG / rel)
    assert not imported, (f"overlay_manager/{rel} imports {', '.join(imported)}: ROS and Qt belong in the "
                          f"ROS adapter ({', '.join(ADAPTER)}); keep this module plain Python")


def test_the_checks_see_imports(tmp_path):
    f = PKG / "core" / "_layers_probe_tmp.py"
    try:
        f.write_text("def f():\n    import rospy\nfrom ..msg import Peer\nfrom PyQt5.QtCore import Qt\nimport json\n"
                     "from ..monitor import readings\nfrom . import peers\nfrom overlay_manager.ros.node import x\n")
        assert _ros_imports(f) == ["PyQt5.QtCore", "PyQt5.QtCore.Qt", "overlay_manager.msg",
                                   "overlay_manager.msg.Peer", "rospy"]
        assert [b.split(":")[1].split()[0] for b in _upward(f)] == [
            "overlay_manager.monitor", "overlay_manager.monitor.readings", "overlay_manager.ros.node",
            "overlay_manager.ros.node.x"]
    finally:
        f.unlink()
    assert _allowed("ros/node.py") and _allowed("dashboard/widget.py") and not _allowed("view/state.py")
    assert not _allowed("core/peers.py") and not _allowed("monitor/diagnose.py")
