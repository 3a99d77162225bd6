"""docs/ARCHITECTURE.md's map of the code matches the tree: every file or folder it names exists."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
# where a bare or partial name is looked up, in order (the doc names modules the short way)
BASES = ["", "overlay_manager", "overlay_manager/fleet", "overlay_manager/lab", "overlay_manager/dashboard",
         "docs", "src", "include/overlay_manager", "test", "test/unit", "test/system", "test/rostest",
         "test/integration", "test/cpp", "test/gui", "config", "config/systemd", "launch", "scripts",
         "overlay_msgs/msg", "overlay_msgs/srv"]
FILE = re.compile(r"^[\w./-]+\.(py|cpp|h|md|launch|yaml|test|xml|msg|srv|service|in|conf|ui|txt|rst)$")


def named_paths() -> List[str]:
    """Every `code span` (or markdown link target) of the doc that looks like a file or folder path."""
    text = DOC.read_text(encoding="utf-8")
    spans = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)#\s]+)", text)
    out = []
    for s in spans:
        s = s.strip().rstrip(",.;:")
        if s.startswith(("http", "/", "~", "$", "-")) or "*" in s or "<" in s or "{" in s:
            continue
        if FILE.match(s) or (s.endswith("/") and re.match(r"^[\w./-]+/$", s)):
            out.append(s)
    return sorted(set(out))


def exists(name: str) -> bool:
    return any((ROOT / base / name).exists() or (DOC.parent / name).exists() for base in BASES)


def test_the_doc_names_paths():
    assert len(named_paths()) > 40


@pytest.mark.parametrize("name", named_paths())
def test_named_path_exists(name):
    assert exists(name), f"docs/ARCHITECTURE.md names {name}, which is not in the tree (looked in {BASES})"


def test_a_missing_path_is_caught():
    assert not exists("overlay_manager/no_such_module.py")
    assert exists("peers.py") and exists("lab/") and exists("src/link_aware_stream.cpp")
