"""Removing lab runs: everything a run created, found from its state file and its names.

Works for a run this process started, one started by another process (``lab down``) and one left
behind by a crash (``lab down --all``): processes are found from the state file (each checked to
still run its recorded argv) and by their network namespace, and killed by pid; namespaces and
their /etc/netns directories are found by the run-scoped ``olab<run>-`` prefix. Nothing outside
the run's names is touched.
"""
from __future__ import annotations

import shutil
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Sequence

from overlay_manager.lab.campus import system
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import RUN_ROOT
from overlay_manager.lab.campus.naming import NS_RE, check_run_id
from overlay_manager.lab.campus.state import argv_matches, list_runs, read_state
from overlay_manager.lab.campus.system import Echo, default_echo


def leftover_runs() -> List[str]:
    """Run ids with anything left: a state directory, a namespace or an /etc/netns directory."""
    ids = set(list_runs())
    for ns in system.list_namespaces():
        m = NS_RE.match(ns)
        if m:
            ids.add(m.group(1))
    try:
        for p in system.NETNS_ETC_DIR.iterdir():
            m = NS_RE.match(p.name)
            if m:
                ids.add(m.group(1))
    except FileNotFoundError:
        pass
    return sorted(ids)


def teardown_run(run_id: str, echo: Echo = default_echo,
                 procs: Optional[Mapping[str, subprocess.Popen]] = None,
                 extra_namespaces: Sequence[str] = ()) -> List[str]:
    """Remove every trace of run ``run_id``; returns the problems met (empty = clean).

    Order: processes recorded in the state file (each checked to still run its recorded argv),
    then every process inside the run's namespaces (found by namespace inode, killed by pid),
    then the namespaces and their /etc/netns directories, then the state directory.
    ``procs`` are Popen objects of this process to reap; ``extra_namespaces`` are namespaces
    the caller knows of (only those with the run's prefix are removed).
    """
    check_run_id(run_id)
    errors: List[str] = []
    run_dir = RUN_ROOT / run_id
    state: Dict[str, Any] = read_state(run_dir)
    echo(f"down: run {run_id}")
    pids = []
    for info in (state.get("processes") or {}).values():
        if argv_matches(info.get("pid", -1), info.get("argv", [])):
            pids.append(info["pid"])
    for proc in (procs or {}).values():
        if proc.poll() is None and proc.pid not in pids:
            pids.append(proc.pid)
    prefix = f"olab{run_id}-"
    namespaces = list(dict.fromkeys(
        [*(state.get("namespaces") or []), *extra_namespaces,
         *[ns for ns in system.list_namespaces() if ns.startswith(prefix) and NS_RE.match(ns)]]))
    namespaces = [ns for ns in namespaces if ns.startswith(prefix)]
    try:
        system.terminate_pids(pids, f"processes of run {run_id}", echo)
        for ns in namespaces:
            system.terminate_pids(system.pids_in_ns(ns), f"processes in {ns}", echo)
    except LabError as exc:
        errors.append(str(exc))
    for proc in (procs or {}).values():
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            errors.append(f"pid {proc.pid} did not exit")
    etc_dirs = []
    try:
        etc_dirs = [p.name for p in system.NETNS_ETC_DIR.iterdir() if p.name.startswith(prefix)]
    except FileNotFoundError:
        pass
    for ns in list(reversed(namespaces)) + [d for d in etc_dirs if d not in namespaces]:
        try:
            system.delete_ns(ns, echo)
        except (LabError, OSError) as exc:
            errors.append(f"namespace {ns}: {exc}")
    if run_dir.exists():
        echo(f"rm -r {run_dir}")
        shutil.rmtree(run_dir, ignore_errors=True)
    return errors


def down_all(echo: Echo = default_echo) -> List[str]:
    """Tear down every lab run found (state dirs, namespaces, /etc/netns dirs); returns the run
    ids removed. LabError lists problems."""
    runs = leftover_runs()
    errors = []
    for run_id in runs:
        errors += teardown_run(run_id, echo)
    if errors:
        raise LabError("lab down --all left problems: " + "; ".join(errors))
    return runs
