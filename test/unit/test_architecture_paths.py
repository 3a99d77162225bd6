"""docs/ARCHITECTURE.md's map of the code matches the tree: every file or folder it names exists."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
# where a bare or partial name is looked up, in order (the doc names modules the short way)
BASES = ["", "overlay_manager", "docs", "src", "include/overlay_manager", "test", "test/unit", "test/system",
         "test/rostest", "test/integration", "test/cpp", "test/gui", "config", "config/systemd", "launch", "scripts",
         "overlay_msgs/msg", "overlay_msgs/srv"]
FILE = re.compile(r"^[\w./-]+\.(py|cpp|h|md|launch|yaml|test|xml|msg|srv|service|in|conf|ui|txt|rst)$")


def _spans(text: str) -> List[str]:
    """Every `code span` (or markdown link target) of text that looks like a file or folder path."""
    spans = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)#\s]+)", text)
    out = []
    for s in spans:
        s = s.strip().rstrip(",.;:")
        if s.startswith(("http", "/", "~", "$", "-")) or "*" in s or "<" in s or "{" in s:
            continue
        if FILE.match(s) or (s.endswith("/") and re.match(r"^[\w./-]+/$", s)):
            out.append(s)
    return out


def named_paths() -> List[str]:
    """Every path the doc names, as 'name' or 'name in folder/' when a line (a table row) names
    its folder: there a bare module name is looked up in that folder of overlay_manager/."""
    out = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        spans = _spans(line)
        folders = [s for s in spans if s.endswith("/")]
        for s in spans:
            out.append(s if s.endswith("/") or "/" in s or not folders else f"{s} in {' '.join(folders)}")
    return sorted(set(out))


def exists(name: str) -> bool:
    """name exists under one of BASES; 'x.py in a/ b/' also under overlay_manager/a/ or b/."""
    name, _, folders = name.partition(" in ")
    bases = BASES + [f"overlay_manager/{f}" for f in folders.split()]
    return any((ROOT / base / name).exists() or (DOC.parent / name).exists() for base in bases)


def test_the_doc_names_paths():
    assert len(named_paths()) > 40


@pytest.mark.parametrize("name", named_paths())
def test_named_path_exists(name):
    assert exists(name), f"docs/ARCHITECTURE.md names {name}, which is not in the tree (looked in {BASES})"


def test_a_missing_path_is_caught():
    assert not exists("overlay_manager/no_such_module.py")
    assert not exists("peers.py")  # a module is named with its layer folder
    assert exists("core/peers.py") and exists("lab/") and exists("src/link_aware_stream.cpp")


# ----- every doc: the package's own paths and module names ------------------------------------
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.rst"] + sorted((ROOT / "docs").glob("*.md"))
PACKAGE_PATH = re.compile(r"(?<![\w/.])overlay_manager/[a-z_][\w/]*(?:\.py)?")  # not overlay_manager/Peer (a type)
MODULE_NAME = re.compile(r"(?<![\w/.])overlay_manager(?:\.[a-z_]\w*)+")
NOT_MODULES = ("overlay_manager.msg", "overlay_manager.srv", "overlay_manager.conf")
"""Dotted names that are no Python module of the tree: the generated messages, a file name."""


def module_exists(dotted: str) -> bool:
    """overlay_manager.a.b[.name]: a package or module of the tree, or a name inside a module."""
    if dotted.startswith(NOT_MODULES):
        return True
    parts = dotted.split(".")
    for k in range(len(parts), 1, -1):
        p = ROOT.joinpath(*parts[:k])
        if p.with_suffix(".py").exists():
            return k >= len(parts) - 1  # the module or a name inside it, not a module path that is gone
        if (p / "__init__.py").exists():  # a package: itself, or a name its __init__ defines
            return k == len(parts) or (k == len(parts) - 1
                                       and re.search(rf"\b{parts[-1]}\b", (p / "__init__.py").read_text()) is not None)
    return False


def doc_names() -> List[str]:
    """'doc: name' for every package path and dotted module name in a code span of a doc (the
    changelog's "``old`` -> ``new``" lines name old modules on purpose: only new names are checked)."""
    out = set()
    for doc in DOCS:
        for line in doc.read_text(encoding="utf-8").splitlines():
            if doc.suffix == ".rst":
                line = re.sub(r"``[^`]+``\s*->", "", line)  # an old name, on purpose
            for span in re.findall(r"`+([^`]+)`+", line):
                out.update(f"{doc.name}: {m}" for m in PACKAGE_PATH.findall(span) + MODULE_NAME.findall(span))
    return sorted(out)


def test_the_docs_name_modules():
    assert len(doc_names()) > 20


@pytest.mark.parametrize("entry", doc_names())
def test_doc_names_a_module_of_the_tree(entry):
    doc, name = entry.split(": ", 1)
    found = module_exists(name) if "/" not in name else (ROOT / name.rstrip("/")).exists()
    assert found, f"{doc} names {name}, which is not in the tree (write the module's path in its layer folder)"


def test_an_old_module_name_is_caught():
    assert not module_exists("overlay_manager.monitor.poll")          # a name in a package, not a module
    assert not module_exists("overlay_manager.peers.PeerState")       # the module moved to core/
    assert module_exists("overlay_manager.core.peers.PeerState") and module_exists("overlay_manager.lab.campus.core")
    assert module_exists("overlay_manager.core.validation.ConfigError")  # the package names it
