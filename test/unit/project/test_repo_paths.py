"""Modules that find the repository from their own file (``Path(__file__).resolve().parents[N]``)
count their folders right: the path they compute holds package.xml. A module moved to another
folder without fixing N fails here, not in a system test."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

import pytest

PKG = Path(__file__).resolve().parents[3] / "overlay_manager"
PARENTS = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]")


def uses() -> List[Tuple[str, int]]:
    out = []
    for p in sorted(PKG.rglob("*.py")):
        for n in PARENTS.findall(p.read_text(encoding="utf-8")):
            out.append((str(p.relative_to(PKG)), int(n)))
    return out


def test_some_modules_do_it():
    assert len(uses()) >= 5


@pytest.mark.parametrize("rel,n", uses())
def test_the_parent_is_the_repository(rel, n):
    root = (PKG / rel).resolve().parents[n]
    assert (root / "package.xml").is_file(), (f"overlay_manager/{rel}: parents[{n}] is {root}, not the repository "
                                              f"root (count the folders from the module to the root)")
