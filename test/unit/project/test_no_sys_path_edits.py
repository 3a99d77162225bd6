"""No code puts a directory on sys.path: the package comes from the workspace's Python path (the
install space, or in a clone the devel space, which finds the source tree), and tests import it
the same way (pytest runs from the repository root; shared fakes are overlay_manager.testing)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[3]
FOLDERS = ("overlay_manager", "scripts", "test")
EDIT = re.compile(r"\bsys\.path\s*(?:\.\s*(?:insert|append|extend)\s*\(|\+=|\[[^\]]*\]\s*=)")
"""sys.path.insert(...), .append(...), .extend(...), sys.path += ..., sys.path[...] = ..."""


def python_files() -> List[Path]:
    """Every Python file of the folders (*.py, and scripts whose first line names python) but this
    one, which spells the edits out to catch them."""
    out = []
    for folder in FOLDERS:
        for p in sorted((ROOT / folder).rglob("*")):
            if not p.is_file() or "__pycache__" in p.parts or p == Path(__file__).resolve():
                continue
            if p.suffix == ".py":
                out.append(p)
            elif not p.suffix:
                with p.open("rb") as fh:
                    if b"python" in fh.readline():
                        out.append(p)
    return out


def test_the_scan_finds_the_scripts_and_modules():
    found = {p.relative_to(ROOT).as_posix() for p in python_files()}
    assert {"scripts/overlay_env", "scripts/fleet", "scripts/dashboard", "scripts/overlay_manager_node",
            "overlay_manager/ros/node.py", "test/unit/conftest.py"} <= found
    assert "test/unit/project/test_no_sys_path_edits.py" not in found


@pytest.mark.parametrize("text", [
    "sys.path.insert(0, os.path.dirname(__file__))", "sys.path.append('..')", "sys.path .extend([x])",
    "sys.path += ['..']", "sys.path[:0] = [root]",
])
def test_an_edit_is_caught(text):
    assert EDIT.search(text)


def test_mentions_are_not_edits():
    assert not EDIT.search("pytest puts this directory on ``sys.path``") and not EDIT.search("print(sys.path)")


def test_no_file_edits_sys_path():
    edits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in python_files()
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if EDIT.search(line)]
    assert edits == [], ("these lines put a directory on sys.path; import the package from the "
                         "workspace instead (source the devel or install space's setup.bash):\n" + "\n".join(edits))
