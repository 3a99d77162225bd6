"""The state file of a lab run: /run/overlay-lab/<run>/state.json, shared between processes.

``lab up`` in one process and ``lab block-udp`` or ``lab down`` in another act on the same run,
so everything a later process needs (namespaces created, processes started with their argv,
router flags, impairments) is written here under an exclusive lock as soon as it exists. A crash
at any point leaves enough behind for teardown.py to remove the run.
"""
from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import RUN_ROOT
from overlay_manager.lab.campus.naming import check_run_id
from overlay_manager.system.files import atomic_write


class RunState:
    """Read and update one run's state file (``<run_dir>/state.json``, lock ``<run_dir>/lock``)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / "state.json"

    @contextmanager
    def locked(self) -> Iterator[Dict[str, Any]]:
        """Read-modify-write the state under an exclusive lock; written back atomically on exit."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = json.loads(self.path.read_text()) if self.path.exists() else {}
            except json.JSONDecodeError:
                state = {}
            yield state
            atomic_write(self.path, (json.dumps(state, indent=2) + "\n").encode("utf-8"), 0o644)

    def read(self) -> Dict[str, Any]:
        """The state as last written (empty when the run does not exist)."""
        return read_state(self.run_dir)

    def record_namespace(self, ns: str) -> None:
        """Add ``ns`` to the run's namespaces (before creating it: a crash still leaves a trace)."""
        with self.locked() as st:
            if ns not in st.setdefault("namespaces", []):
                st["namespaces"].append(ns)


def read_state(run_dir: Path) -> Dict[str, Any]:
    """``run_dir/state.json`` as a mapping; empty when missing or unreadable."""
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def argv_matches(pid: int, argv: Sequence[str]) -> bool:
    """True when process ``pid`` is alive and runs exactly ``argv`` (guards against pid reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            actual = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return False
    return bool(actual) and actual[-len(argv):] == list(argv) if argv else False


def check_run_id_ok(run_id: str) -> bool:
    """True when ``run_id`` is a valid run id."""
    try:
        check_run_id(run_id)
        return True
    except LabError:
        return False


def list_runs() -> List[str]:
    """Run ids that have a state directory under /run/overlay-lab."""
    try:
        return sorted(p.name for p in RUN_ROOT.iterdir() if p.is_dir() and check_run_id_ok(p.name))
    except FileNotFoundError:
        return []
