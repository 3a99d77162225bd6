"""System helpers for the lab: namespaces, commands in namespaces, process cleanup by pid.

Everything here acts only on namespaces whose names the caller passes in (the lab passes only its
run-scoped names) and on processes found inside those namespaces. Nothing is killed by name.
"""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Dict, List, Mapping, Optional, Sequence, TypeVar, Union

from overlay_manager.lab.campus.errors import CommandError, LabError, LabTimeout
from overlay_manager.system import waiting

NETNS_RUN_DIR = Path("/run/netns")
NETNS_ETC_DIR = Path("/etc/netns")
CLONE_NEWNET = 0x40000000

T = TypeVar("T")

Echo = Callable[[str], None]


def default_echo(line: str) -> None:
    """Print one line of what the lab does, to stderr (stdout stays for command output)."""
    print(f"[lab] {line}", file=sys.stderr, flush=True)


def ns_argv(ns: Optional[str], argv: Sequence[str]) -> List[str]:
    """``argv`` prefixed with ``ip netns exec NS`` (which also bind-mounts /etc/netns/NS/*)."""
    return (["ip", "netns", "exec", ns] if ns else []) + [str(a) for a in argv]


def wait_for(what: str, check: Callable[[], Optional[T]], timeout: float, interval: float = 0.1,
             detail: Optional[Callable[[], str]] = None) -> T:
    """:func:`overlay_manager.system.waiting.wait_for` for the lab: LabTimeout when ``timeout`` seconds
    pass, and a LabError from ``check`` (e.g. "the daemon exited") ends the wait at once."""
    return waiting.wait_for(what, check, timeout, interval, detail, fatal=(LabError,), error=LabTimeout)


def run(argv: Sequence[str], ns: Optional[str] = None, *, echo: Echo = default_echo,
        timeout: float = 30.0, check: bool = True, input: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a command (in namespace ``ns`` if given), capture stdout+stderr as text.

    The child gets its own session; on timeout its whole process group is killed (by pid) and
    LabTimeout is raised. ``check``: CommandError on a non-zero exit. ``quiet``: do not echo.
    """
    full = ns_argv(ns, argv)
    where = ns or "host"
    if not quiet:
        echo(f"({where}) {' '.join(str(a) for a in argv)}")
    proc = subprocess.Popen(full, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env) if env is not None else None, start_new_session=True)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.wait(timeout=5)
        raise LabTimeout(f"[{where}] {' '.join(argv)} did not finish within {timeout:g}s") from None
    result = subprocess.CompletedProcess(full, proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise CommandError(where, [str(a) for a in argv], proc.returncode, (out or "") + (err or ""))
    return result


def spawn(argv: Sequence[str], ns: Optional[str], *, echo: Echo = default_echo,
          env: Optional[Mapping[str, str]] = None, log: Optional[Path] = None,
          stdout: Union[int, IO[bytes], None] = None, stderr: Union[int, IO[bytes], None] = None,
          stdin: Union[int, IO[bytes], None] = subprocess.DEVNULL, cwd: Union[str, Path, None] = None,
          **popen_kw: object) -> subprocess.Popen:
    """Start a long-running process in namespace ``ns``, in its own session (pgid = pid).

    ``log``: append stdout and stderr to this file (overrides ``stdout``/``stderr``).
    """
    echo(f"({ns or 'host'}) start: {' '.join(str(a) for a in argv)}" + (f"  > {log}" if log else ""))
    logf = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        logf = open(log, "ab")  # noqa: SIM115 - handed to the child, closed below
        stdout, stderr = logf, subprocess.STDOUT
    try:
        return subprocess.Popen(ns_argv(ns, argv), stdin=stdin, stdout=stdout, stderr=stderr,
                                env=dict(env) if env is not None else None, cwd=cwd,
                                start_new_session=True, **popen_kw)  # type: ignore[call-overload]
    finally:
        if logf is not None:
            logf.close()


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group led by ``pid`` (our children lead their own groups)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# --- namespaces ---------------------------------------------------------------------------
def ns_exists(ns: str) -> bool:
    """True when /run/netns/NS exists."""
    return (NETNS_RUN_DIR / ns).exists()


def list_namespaces() -> List[str]:
    """Names under /run/netns (all named namespaces on the machine)."""
    try:
        return sorted(p.name for p in NETNS_RUN_DIR.iterdir())
    except FileNotFoundError:
        return []


def ns_inode(ns: str) -> Optional[int]:
    """Inode of a named namespace (identifies it in /proc/PID/ns/net), None if it does not exist."""
    try:
        return os.stat(NETNS_RUN_DIR / ns).st_ino
    except OSError:
        return None


def pids_in_ns(ns: str) -> List[int]:
    """Pids of processes whose network namespace is ``ns`` (same as ``ip netns pids``)."""
    ino = ns_inode(ns)
    if ino is None:
        return []
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:
            continue
        if st.st_ino == ino and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return sorted(pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _signal_pids(pids: Sequence[int], sig: int) -> None:
    """Send sig to each pid; pids that already exited are skipped."""
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def terminate_pids(pids: Sequence[int], what: str, echo: Echo = default_echo,
                   grace: float = 5.0) -> None:
    """SIGTERM each pid, wait up to ``grace`` seconds, then SIGKILL what is left (by pid).

    A zombie counts as ended (its parent reaps it; this function never calls waitpid(-1), which
    would steal exit codes from other Popen objects of this process).
    """
    live = [p for p in pids if _alive(p)]
    if not live:
        return
    echo(f"stop {what}: kill -TERM {' '.join(map(str, live))}")
    _signal_pids(live, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        live = [p for p in live if _alive(p)]
        if not live:
            return
        time.sleep(0.05)
    echo(f"stop {what}: still running after {grace:g}s, kill -KILL {' '.join(map(str, live))}")
    _signal_pids(live, signal.SIGKILL)
    wait_for(f"{what} (pids {live}) to exit after SIGKILL",
             lambda: not any(_alive(p) for p in live), timeout=5.0)


def create_ns(ns: str, echo: Echo = default_echo) -> None:
    """Create a named network namespace with loopback up."""
    from pyroute2 import NetNS, netns

    echo(f"ip netns add {ns}")
    netns.create(ns)
    with NetNS(ns) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")


def delete_ns(ns: str, echo: Echo = default_echo) -> None:
    """Delete a named namespace (its interfaces go with it) and its /etc/netns/NS directory."""
    from pyroute2 import netns

    if ns_exists(ns):
        echo(f"ip netns del {ns}")
        try:
            netns.remove(ns)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise LabError(f"cannot delete namespace {ns}: {exc}") from exc
    etc = NETNS_ETC_DIR / ns
    if etc.exists():
        echo(f"rm -r {etc}")
        for f in etc.iterdir():
            f.unlink()
        etc.rmdir()
    try:
        NETNS_ETC_DIR.rmdir()  # only succeeds when empty: leave no trace if we created it
    except OSError:
        pass


def write_etc(ns: str, name: str, text: str, echo: Echo = default_echo) -> Path:
    """Write /etc/netns/NS/NAME (seen as /etc/NAME by ``ip netns exec NS``)."""
    path = NETNS_ETC_DIR / ns / name
    path.parent.mkdir(parents=True, exist_ok=True)
    echo(f"write {path}")
    path.write_text(text, encoding="utf-8")
    return path


_libc = ctypes.CDLL(None, use_errno=True)


def ns_call(ns: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` in a helper thread that has joined namespace ``ns`` (network only).

    Sockets created by ``fn`` stay in ``ns`` after the thread ends, so the lab can probe
    addresses that exist only inside its namespaces without touching the host's network.
    """
    box: Dict[str, object] = {}

    def body() -> None:
        try:
            fd = os.open(NETNS_RUN_DIR / ns, os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=body, name=f"ns-{ns}", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def tcp_connect(ns: str, address: str, port: int, timeout: float = 2.0) -> bool:
    """True when a TCP connection from namespace ``ns`` to address:port succeeds within ``timeout`` s."""
    def attempt() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect((address, port))
                return True
            except OSError:
                return False

    return ns_call(ns, attempt)
