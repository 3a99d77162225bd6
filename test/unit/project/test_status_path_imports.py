"""The status path's modules (tailscaled -> core -> monitor -> ros) import one another in one
direction: no import cycle between two modules, not even one hidden behind ``TYPE_CHECKING``
(which the layer test cannot see inside a folder: readings <-> peer_rows <-> diagnose was such a
circle)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

PKG = Path(__file__).resolve().parents[3] / "overlay_manager"
FOLDERS = ("core", "system", "tailscaled", "monitor", "ros")


def _name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Dict[str, Path] = {_name(p): p for f in FOLDERS for p in (PKG / f).rglob("*.py")}


def _imports(name: str, path: Path) -> Set[str]:
    """The status-path modules path imports, at any depth (functions, TYPE_CHECKING blocks)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                mod = ".".join(package[: len(package) - (node.level - 1)] + ([mod] if mod else []))
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    out = set()
    for n in found:
        while n and n not in MODULES:
            n = n.rpartition(".")[0]
        if n and n != name and not name.startswith(n + "."):  # a package's own __init__ is no edge
            out.add(n)
    return out


GRAPH = {n: _imports(n, p) for n, p in MODULES.items()}


def _cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle of graph as [a, b, ..., a], or [] when there is none."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(n: str) -> List[str]:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return []

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return []


def test_the_status_path_has_no_import_cycle() -> None:
    assert len(MODULES) > 30
    cycle = _cycle(GRAPH)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_import_hides_behind_type_checking(name: str) -> None:
    assert "TYPE_CHECKING" not in MODULES[name].read_text(encoding="utf-8"), (
        f"{name} imports under TYPE_CHECKING: a sign of a circle between modules; move the shared "
        "type to the module both import")


def test_the_cycle_finder_sees_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    assert "overlay_manager.core.peers" in GRAPH["overlay_manager.monitor.overlay_monitor"]
