"""systemd unit files read as data, for running the shipped units without systemd (the lab and
the tests have no systemd as PID 1): their command lines, their environment, and the graph along
which systemd carries a stop or restart from one unit to others.

What systemd does with a stop or restart (systemd.unit(5), systemd 252): when unit Y is stopped
or restarted explicitly (``systemctl restart tailscaled``, which a tailscale package upgrade
runs), every unit X with ``Requires=Y``, ``Requisite=Y``, ``BindsTo=Y`` or ``PartOf=Y`` in
[Unit] is stopped or restarted with it, and so on transitively; ``StopPropagatedFrom=Y`` in X and
``PropagatesStopTo=X`` in Y carry a stop too, and ``RequiredBy=X`` in Y's [Install] section
becomes ``Requires=Y`` in X once Y is enabled. ``Wants=`` and ``After=``/``Before=`` carry
nothing: they pull a unit in at start and order starts. :func:`stopped_with` follows exactly these
edges; :func:`propagation_path` names the chain that makes a unit go down with another.

File syntax handled: sections, ``#``/``;`` comments, backslash-newline continuations, drop-ins
(``<unit>.d/*.conf`` after the unit, in name order) and empty assignments that reset a list
(``Requires=``). Specifiers (``%i``) are not expanded.
"""
from __future__ import annotations

import re
import shlex
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

# [Unit] keys of X naming units whose stop/restart stops/restarts X as well
PROPAGATED_FROM = ("Requires", "Requisite", "BindsTo", "PartOf", "StopPropagatedFrom")
# [Unit] keys of Y naming units that Y's stop stops
PROPAGATES_TO = ("PropagatesStopTo",)
# [Install] keys of Y naming units that get Requires=Y when Y is enabled
INSTALL_REQUIRED_BY = ("RequiredBy",)


@dataclass
class Unit:
    """One unit file with its drop-ins applied: (key, value) assignments per section, in order."""

    name: str
    sections: Dict[str, List[Tuple[str, str]]] = field(default_factory=dict)

    def values(self, section: str, key: str) -> List[str]:
        """Every value assigned to key in section, in order; an empty assignment resets the list."""
        out: List[str] = []
        for k, v in self.sections.get(section, []):
            if k == key:
                out = [] if v == "" else out + [v]
        return out

    def names(self, section: str, key: str) -> List[str]:
        """The space-separated unit names of a list-valued key (``Requires=a.service b.service``)."""
        return [n for v in self.values(section, key) for n in v.split()]

    def value(self, section: str, key: str, default: str = "") -> str:
        """The last value assigned to key in section (default when none)."""
        vals = self.values(section, key)
        return vals[-1] if vals else default


def parse_unit_text(text: str, into: Optional[Dict[str, List[Tuple[str, str]]]] = None
                    ) -> Dict[str, List[Tuple[str, str]]]:
    """Sections of one unit file or drop-in: continuation lines joined (the backslash becomes a
    space, as systemd does), comments and blank lines skipped. Assignments are appended to
    ``into`` when given (a drop-in after its unit)."""
    sections = into if into is not None else {}
    current = ""
    for line in re.sub(r"\\\n", " ", text).splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            current = stripped[1:-1]
            sections.setdefault(current, [])
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not current:
            raise ValueError(f"not a unit file assignment: {line!r}")
        sections[current].append((key.strip(), value.strip()))
    return sections


def load_units(directories: Sequence[Path]) -> Dict[str, Unit]:
    """Every ``*.service``/``*.target``/... in directories (the first directory naming a unit
    wins, as in systemd's search path), each with its ``<name>.d/*.conf`` drop-ins from every
    directory, in drop-in file name order."""
    units: Dict[str, Unit] = {}
    for d in directories:
        for f in sorted(Path(d).glob("*.*")):
            if f.is_file() and f.suffix in (".service", ".target", ".socket", ".timer", ".path", ".mount") \
                    and f.name not in units:
                units[f.name] = Unit(f.name, parse_unit_text(f.read_text()))
    for name, unit in units.items():
        drop_ins: Dict[str, Path] = {}
        for d in directories:
            for f in sorted((Path(d) / f"{name}.d").glob("*.conf")):
                drop_ins.setdefault(f.name, f)
        for fname in sorted(drop_ins):
            parse_unit_text(drop_ins[fname].read_text(), unit.sections)
    return units


def stop_edges(units: Mapping[str, Unit]) -> Dict[str, Dict[str, str]]:
    """``{Y: {X: why}}``: stopping or restarting Y stops or restarts X (see the module doc);
    why names the assignment (``X: Requires=Y``)."""
    edges: Dict[str, Dict[str, str]] = {}

    def add(src: str, dst: str, why: str) -> None:
        if src != dst:
            edges.setdefault(src, {}).setdefault(dst, why)

    for x, unit in units.items():
        for key in PROPAGATED_FROM:
            for y in unit.names("Unit", key):
                add(y, x, f"{x}: {key}={y}")
        for key in PROPAGATES_TO:
            for y in unit.names("Unit", key):
                add(x, y, f"{x}: {key}={y}")
        for key in INSTALL_REQUIRED_BY:
            for y in unit.names("Install", key):
                add(x, y, f"{x}: [Install] {key}={y} (Requires={x} in {y} once enabled)")
    return edges


def propagation_path(units: Mapping[str, Unit], source: str, target: str) -> List[str]:
    """The assignments through which a stop or restart of source reaches target (shortest
    chain); empty when it does not."""
    edges = stop_edges(units)
    came: Dict[str, Tuple[str, str]] = {}
    todo = deque([source])
    seen = {source}
    while todo:
        y = todo.popleft()
        for x, why in edges.get(y, {}).items():
            if x in seen:
                continue
            seen.add(x)
            came[x] = (y, why)
            if x == target:
                chain = []
                while x != source:
                    x, why = came[x]
                    chain.append(why)
                return chain[::-1]
            todo.append(x)
    return []


def stopped_with(units: Mapping[str, Unit], name: str) -> Set[str]:
    """Every unit that systemd stops or restarts when name is stopped or restarted (name itself
    not included)."""
    edges = stop_edges(units)
    out: Set[str] = set()
    todo = [name]
    while todo:
        for x in edges.get(todo.pop(), {}):
            if x not in out and x != name:
                out.add(x)
                todo.append(x)
    return out


def exec_start(unit: Unit) -> str:
    """The bash script of a unit whose ``ExecStart=/bin/bash -c '...'``, with ``$$`` turned into
    ``$`` (what systemd hands to bash). ValueError for any other ExecStart."""
    line = unit.value("Service", "ExecStart")
    m = re.match(r"^/bin/bash -c '(.*)'$", line)
    if not m:
        raise ValueError(f"{unit.name}: ExecStart is not /bin/bash -c '...': {line!r}")
    return m.group(1).replace("$$", "$")


def unit_environment(unit: Unit) -> Dict[str, str]:
    """The variables of the unit's ``Environment=`` lines (quotes as systemd reads them)."""
    out: Dict[str, str] = {}
    for value in unit.values("Service", "Environment"):
        for word in shlex.split(value):
            k, _, v = word.partition("=")
            out[k] = v
    return out


def read_environment_file(path: Path) -> Dict[str, str]:
    """KEY=value lines as systemd's ``EnvironmentFile=`` reads them (comments skipped, one level
    of double quotes removed)."""
    return environment_lines(path.read_text().splitlines())


def environment_lines(lines: Iterable[str]) -> Dict[str, str]:
    """:func:`read_environment_file` for lines already read."""
    out: Dict[str, str] = {}
    for line in lines:
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        out[key.strip()] = value
    return out
