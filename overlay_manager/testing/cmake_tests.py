"""The rostests and gtests of the package, from the one list that registers them: CMakeLists.txt.

``catkin_make run_tests`` runs what CMakeLists.txt registers (``add_rostest(...)``,
``catkin_add_gtest(...)``); the pytest suite runs the same list (test/rostest/test_rostest.py,
test/cpp/test_gtests.py) by reading those lines here, so no second list can drift from it.
test/unit/project/test_cmake_tests.py fails on a launch file in test/rostest/ or a gtest source in test/cpp/
that CMakeLists.txt does not register, and on a registration whose file is gone.

Plain Python (no ROS, Python 3.8): the unit tests read it without a workspace.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
"""The repository (the folder with CMakeLists.txt and package.xml)."""
ROSTEST_DIR = "test/rostest"
GTEST_DIR = "test/cpp"
#: rostest's time limit of a <test> that does not set ``time-limit`` (seconds).
ROSTEST_DEFAULT_TIME_LIMIT_S = 60.0

_CALL = re.compile(r"\b(add_rostest|catkin_add_gtest)\(([^)]*)\)")
_GTEST_INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"]gtest/gtest\.h[>\"]", re.M)


@dataclass(frozen=True)
class Rostest:
    """One rostest launch file.

    Attributes:
        path: relative to the repository, e.g. ``test/rostest/node.test``.
        registered: CMakeLists.txt has ``add_rostest(<path>)``.
        exists: the file is there.
        time_limit_s: the largest ``time-limit`` of its ``<test>`` elements (rostest's default
            when none sets one; 0 when the file is missing or not XML).
    """

    path: str
    registered: bool
    exists: bool
    time_limit_s: float

    @property
    def name(self) -> str:
        """The file name, as ``rostest overlay_manager <name>`` takes it."""
        return Path(self.path).name

    @property
    def cmake_line(self) -> str:
        """The line that registers it."""
        return f"add_rostest({self.path})"


@dataclass(frozen=True)
class Gtest:
    """One C++ unit test.

    Attributes:
        name: the executable (``catkin_add_gtest``'s target; the source's stem when unregistered).
        source: its source file, relative to the repository.
        registered: CMakeLists.txt has ``catkin_add_gtest(<name> <source>)``.
        exists: the source is there.
    """

    name: str
    source: str
    registered: bool
    exists: bool

    @property
    def cmake_line(self) -> str:
        """The line that registers it."""
        return f"catkin_add_gtest({self.name} {self.source})"


def _cmake_calls(root: Path) -> List[List[str]]:
    """[command, arg, ...] of every add_rostest / catkin_add_gtest call of root/CMakeLists.txt,
    comments removed (a commented-out registration registers nothing)."""
    text = re.sub(r"#[^\n]*", "", (root / "CMakeLists.txt").read_text(encoding="utf-8"))
    return [[m.group(1), *m.group(2).split()] for m in _CALL.finditer(text)]


def time_limit_s(path: Path) -> float:
    """The largest ``time-limit`` of the ``<test>`` elements of a rostest launch file (seconds)."""
    try:
        root = ET.parse(str(path)).getroot()
    except (OSError, ET.ParseError):
        return 0.0
    limits = [float(t.get("time-limit", ROSTEST_DEFAULT_TIME_LIMIT_S)) for t in root.iter("test")]
    return max(limits, default=ROSTEST_DEFAULT_TIME_LIMIT_S)


def rostests(root: Optional[Path] = None) -> List[Rostest]:
    """Every rostest, by path: the ones CMakeLists.txt registers and the launch files (``*.test``)
    in test/rostest/ it does not."""
    root = root or ROOT
    registered = [c[1] for c in _cmake_calls(root) if c[0] == "add_rostest" and len(c) > 1]
    on_disk = [str(p.relative_to(root)) for p in sorted((root / ROSTEST_DIR).glob("*.test"))]
    out = []
    for path in sorted(set(registered) | set(on_disk)):
        f = root / path
        out.append(Rostest(path, path in registered, f.is_file(), time_limit_s(f)))
    return out


def gtests(root: Optional[Path] = None) -> List[Gtest]:
    """Every gtest, by name: the ones CMakeLists.txt registers and the sources in test/cpp/ that
    include gtest/gtest.h and no catkin_add_gtest registers."""
    root = root or ROOT
    found: Dict[str, Gtest] = {}
    for call in _cmake_calls(root):
        if call[0] == "catkin_add_gtest" and len(call) > 2:
            source = next((a for a in call[2:] if a.endswith((".cpp", ".cc"))), call[2])
            found[call[1]] = Gtest(call[1], source, True, (root / source).is_file())
    sources = {g.source for g in found.values()}
    for p in sorted((root / GTEST_DIR).glob("*.cpp")):
        rel = str(p.relative_to(root))
        if rel not in sources and _GTEST_INCLUDE.search(p.read_text(encoding="utf-8", errors="replace")):
            found.setdefault(p.stem, Gtest(p.stem, rel, False, True))
    return [found[k] for k in sorted(found)]
