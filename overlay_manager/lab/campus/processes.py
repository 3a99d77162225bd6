"""Programs of a lab run: commands and background processes inside the run's namespaces.

Every background process is recorded (pid, namespace, argv) in the run's state file the moment it
starts, so any later process (``lab down``, a crash cleanup) can stop it by pid after checking
that the pid still runs the recorded argv. Nothing is ever stopped by name.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from overlay_manager.lab.campus import system
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import RunLayout
from overlay_manager.lab.campus.state import RunState, argv_matches
from overlay_manager.lab.campus.system import Echo


class Processes:
    """Start, track and stop the processes of one run.

    Args:
        layout: the run's paths and names.
        state: the run's state file (where each process is recorded).
        echo: receives one line per action.
    """

    def __init__(self, layout: RunLayout, state: RunState, echo: Echo) -> None:
        self.layout = layout
        self.state = state
        self.echo = echo
        self.procs: Dict[str, subprocess.Popen] = {}
        """Processes this object started, by key (``headscale``, ``tailscaled:<host>``, ``popen:...``)."""

    def track(self, key: str, proc: subprocess.Popen, ns: str, argv: Sequence[str]) -> None:
        """Remember ``proc`` under ``key`` here and in the state file."""
        self.procs[key] = proc
        with self.state.locked() as st:
            st.setdefault("processes", {})[key] = {"pid": proc.pid, "ns": ns, "argv": [str(a) for a in argv]}

    def untrack(self, key: str) -> None:
        """Forget the process ``key`` (here and in the state file)."""
        self.procs.pop(key, None)
        with self.state.locked() as st:
            st.setdefault("processes", {}).pop(key, None)

    def running(self, key: str) -> bool:
        """True when the process recorded as ``key`` in the state file is alive (any process)."""
        info = self.state.read().get("processes", {}).get(key)
        return bool(info) and argv_matches(info["pid"], info["argv"])

    def stop(self, key: str, grace: float = 5.0) -> None:
        """Stop one tracked process by pid (checked to still be the process we started):
        SIGTERM, SIGKILL after ``grace`` seconds."""
        proc = self.procs.get(key)
        info = self.state.read().get("processes", {}).get(key)
        pid = proc.pid if proc is not None else (info or {}).get("pid")
        if pid is not None and (proc is not None or argv_matches(pid, (info or {}).get("argv", []))):
            system.terminate_pids([pid], f"{key} in {(info or {}).get('ns', '?')}", self.echo, grace)
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                system.kill_group(proc.pid)
                proc.wait(timeout=5)
        self.untrack(key)

    def kill(self, key: str) -> None:
        """SIGKILL one tracked process by pid (checked to still be the process we started), as a
        crash or ``kill -9`` ends it: no clean shutdown. LabError when it is not running."""
        proc = self.procs.get(key)
        info = self.state.read().get("processes", {}).get(key)
        pid = proc.pid if proc is not None else (info or {}).get("pid")
        if pid is None or not argv_matches(pid, (info or {}).get("argv", [])):
            raise LabError(f"cannot kill {key}: it is not running (no live process recorded under that key)")
        self.echo(f"({(info or {}).get('ns', '?')}) kill -9 {pid}  # {key}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc is not None:
            proc.wait(timeout=10)
        self.untrack(key)

    def host_env(self, host: str, env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """Environment for programs on a lab host: ours, ``<host_dir>/bin`` first on PATH (its
        ``tailscale`` wrapper talks to the host's own tailscaled), LAB_HOST/LAB_RUN_ID, plus ``env``."""
        out = dict(os.environ)
        out["PATH"] = f"{self.layout.host_dir(host) / 'bin'}:{out.get('PATH', '/usr/bin:/bin')}"
        out["LAB_HOST"] = host
        out["LAB_RUN_ID"] = self.layout.run_id
        if env:
            out.update(env)
        return out

    def _env_for(self, host: str, env: Optional[Mapping[str, str]]) -> Dict[str, str]:
        if host in self.layout.hosts:
            return self.host_env(host, env)
        return {**os.environ, **(env or {})}

    def exec(self, host: str, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
             timeout: float = 60.0, check: bool = True, input: Optional[str] = None,
             quiet: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` in a host's (or router's, ``control``'s) namespace and wait for it.

        stdout and stderr are captured as text. ``timeout`` in seconds: the process group is
        killed and LabTimeout raised. ``check``: CommandError on a non-zero exit.
        """
        ns = self.layout.namespace(host)
        return system.run(argv, ns, echo=self.echo, timeout=timeout, check=check, input=input,
                          env=self._env_for(host, env), quiet=quiet)

    def popen(self, host: str, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
              log: Union[str, Path, None] = None, **popen_kw: Any) -> subprocess.Popen:
        """Start ``argv`` in a host's namespace in the background (own session, pgid = pid).

        Tracked: the run stops it at down() if it is still running (by pid). ``log``: file for
        stdout and stderr; otherwise ``stdout``/``stderr`` etc. go to subprocess.Popen.
        """
        ns = self.layout.namespace(host)
        proc = system.spawn(argv, ns, echo=self.echo, env=self._env_for(host, env),
                            log=Path(log) if log is not None else None, **popen_kw)
        self.track(f"popen:{host}:{proc.pid}", proc, ns, argv)
        return proc

    def spawn(self, key: str, ns: str, argv: Sequence[str], env: Mapping[str, str], log: Path) -> subprocess.Popen:
        """Start a daemon of the run (headscale, tailscaled) in ``ns``, logging to ``log``, tracked as ``key``."""
        proc = system.spawn(argv, ns, echo=self.echo, env=env, log=log)
        self.track(key, proc, ns, argv)
        return proc
