"""Child processes that die with the process that started them.

Every program the node runs (``tailscale netcheck``, ``tailscale up``, the iperf3 server and
client) is started here:
- on Linux the child asks the kernel for SIGKILL when its parent goes away
  (``prctl(PR_SET_PDEATHSIG)``), so even a SIGKILLed node leaves no child behind. The kernel
  sends it when the *thread* that started the child ends, so start long-lived children from
  threads that live as long as the node (its worker threads do);
- every child is registered until it ends, and :func:`kill_all` (the node's shutdown) kills
  what is left, by pid; each child leads its own process group, and kills go to that group, so
  a wrapper script's own children go too (and hold no pipe open after a timeout);
- :func:`run` is ``subprocess.run`` with a bounded timeout that kills the child on expiry.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, List, Optional, Sequence, Set

PR_SET_PDEATHSIG = 1

_children: Set[subprocess.Popen] = set()
_lock = threading.Lock()             # guards _children; nothing blocks under it


def _load_prctl() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()


def _die_with(parent: int) -> Callable[[], None]:
    """preexec_fn: SIGKILL this child when the thread that forked it ends; exit at once if the
    parent already died between fork and prctl (the signal would never come)."""
    def preexec() -> None:
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)
    return preexec


def spawn(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen that dies with this process and is killed by :func:`kill_all`.

    Raises what Popen raises (FileNotFoundError when the program is missing).
    """
    proc = subprocess.Popen(list(argv), preexec_fn=_die_with(os.getpid()), start_new_session=True, **kwargs)
    with _lock:
        _children.add(proc)
    return proc


def forget(proc: subprocess.Popen) -> None:
    """Stop tracking a child that has been waited for."""
    with _lock:
        _children.discard(proc)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """Send sig to the child's process group (it leads one), or to the child alone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except OSError:
            pass


def stop(proc: subprocess.Popen, grace_s: float = 2.0, sig: int = signal.SIGTERM) -> None:
    """``sig`` (SIGTERM; SIGINT for roslaunch, which then stops its nodes), wait up to grace_s
    seconds, then SIGKILL; always reaps and forgets the child. Signals go to the child's process
    group when it leads one."""
    try:
        if proc.poll() is None:
            _signal(proc, sig)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal(proc, signal.SIGKILL)
                proc.wait(grace_s)
    except (OSError, subprocess.TimeoutExpired):
        pass
    finally:
        forget(proc)


def run(argv: Sequence[str], timeout_s: float, env: Optional[dict] = None,
        text: bool = True) -> subprocess.CompletedProcess:
    """Run argv to completion, capturing stdout/stderr, killing it after timeout_s seconds.

    Raises:
        FileNotFoundError: the program does not exist.
        subprocess.TimeoutExpired: it ran longer than timeout_s (the child is killed and reaped).
    """
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text, env=env)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        if proc.poll() is None:
            _signal(proc, signal.SIGKILL)
            proc.wait()
        forget(proc)
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def alive() -> List[int]:
    """Pids of tracked children still running."""
    with _lock:
        procs = list(_children)
    return [p.pid for p in procs if p.poll() is None]


def kill_all(grace_s: float = 1.0) -> None:
    """Stop every tracked child (SIGTERM, then SIGKILL after grace_s seconds), by pid."""
    with _lock:
        procs = list(_children)
    for p in procs:
        if p.poll() is None:
            _signal(p, signal.SIGTERM)
    for p in procs:
        stop(p, grace_s)
