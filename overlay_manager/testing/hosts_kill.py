"""Kill injection for the hosts-file writer: SIGKILL the update at every step, then check repair.

Each step k runs ``update_hosts_file`` in a forked child whose ``os`` functions that change files
(open, pwrite, write, ftruncate, fsync, fchmod, chmod, replace, rename, unlink) are wrapped to
count calls; at call k the child kills itself with SIGKILL before the call runs. ``torn`` cases
instead let the k-th pwrite write only a prefix of its data and then kill, which is what the
kernel can leave when a fatal signal arrives inside one large write.

After each kill: without a torn write the file must hold the old content, the new content, or
the new content followed by blank lines (exactly one block, outside bytes intact). Then a fresh
update in this process must produce exactly the expected file and leave no temporary files.

Also runnable as a script (the bind-mount cases need a private mount namespace)::

    unshare --mount --propagation private python3 hosts_kill.py {target|source} DIR

prints one JSON object: {"steps": N, "torn": M, "failures": [...]}.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from overlay_manager.system import hosts as H

WRAPPED = ("open", "pwrite", "write", "ftruncate", "fsync", "fchmod", "chmod", "replace", "rename", "unlink")
TORN_CUTS = (1, 0.5, -1)  # bytes of a torn pwrite: first byte, half, all but the last byte

# Bytes outside the block: Latin-1, invalid UTF-8, CRLF lines, a line after the block, no final newline.
BEFORE = b"127.0.0.1\tlocalhost\r\n# caf\xe9 \xff\xfe not utf-8\r\n::1 ip6-localhost\r\n"
AFTER = b"10.0.0.7 printer # after the block\r\n192.168.1.9 nas"
MANY = [(f"100.64.0.{i}", [f"machine{i:02d}.fleet.internal", f"machine{i:02d}"]) for i in range(2, 40)]
FEW = [("100.64.0.2", ["machine02.fleet.internal", "machine02"])]
OWN = [(H.LOOPBACK, ["robot1.fleet.internal", "robot1"])]


def content(entries: Sequence[H.Entry]) -> bytes:
    """The expected file for entries, built independently of replace_block."""
    lines = [H.BEGIN] + [f"{a} {' '.join(n)}".encode() for a, n in
                         sorted(entries, key=lambda e: (e[0] != H.LOOPBACK, e[1][0]))] + [H.END]
    return BEFORE + b"\r\n".join(lines) + b"\r\n" + AFTER


def reset(path: str, data: bytes) -> None:
    """Put data into path keeping its inode (a bind mount keeps working)."""
    with open(path, "r+b" if os.path.exists(path) else "wb") as fh:
        fh.write(data)
        fh.truncate()


def _child(path: str, entries: Sequence[H.Entry], step: int, cut: Optional[float]) -> None:
    count = [0]

    def wrap(name: str, fn: Callable) -> Callable:
        def inner(*args, **kwargs):
            count[0] += 1
            if count[0] == step:
                if cut is not None and name == "pwrite":
                    data = bytes(args[1])
                    n = int(len(data) * cut) if 0 < cut < 1 else (len(data) - 1 if cut < 0 else int(cut))
                    fn(args[0], data[:max(0, n)], args[2])
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)
        return inner
    for name in WRAPPED:
        setattr(os, name, wrap(name, getattr(os, name)))
    try:
        H.update_hosts_file(path, entries)
    except BaseException:
        os._exit(3)
    os._exit(0)


def killed_run(path: str, entries: Sequence[H.Entry], step: int, cut: Optional[float] = None) -> bool:
    """Run the update in a child killed at call number step; True when the kill happened."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _child(path, entries, step, cut)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return True
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return False
    raise AssertionError(f"step {step}: child ended with status {status:#x}")


def leftovers(directory: str, keep: Sequence[str]) -> List[str]:
    """Files in directory other than keep."""
    return sorted(set(os.listdir(directory)) - set(keep))


def record_calls(path: str, entries: Sequence[H.Entry]) -> List[str]:
    """The wrapped os calls one complete update makes, in order (run in a child)."""
    r, w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        calls: List[str] = []
        real_write = os.write

        def wrap(name: str, fn: Callable) -> Callable:
            def inner(*args, **kwargs):
                calls.append(name)
                return fn(*args, **kwargs)
            return inner
        for name in WRAPPED:
            setattr(os, name, wrap(name, getattr(os, name)))
        code = 0
        try:
            H.update_hosts_file(path, entries)
        except BaseException:
            code = 3
        real_write(w, json.dumps(calls).encode())
        os._exit(code)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise AssertionError(f"recording update failed: status {status:#x}")
    return json.loads(data)


def scenario(path: str, old_entries: Sequence[H.Entry], new_entries: Sequence[H.Entry], keep: Sequence[str],
             views: Sequence[str] = (), same_inode: bool = False) -> Dict[str, object]:
    """Kill the update old -> new at every step (and torn inside every pwrite); returns
    {"calls": [...], "steps": N, "torn": M, "failures": [...]}. When the kill left the old
    content, an update asking for the old content again (a no-op) must also leave nothing behind.

    views: other paths that must show the same content afterwards (a bind mount's other side).
    same_inode: the update must keep path's inode.
    """
    old, new = content(old_entries), content(new_entries)
    failures: List[str] = []
    directory = os.path.dirname(path)
    reset(path, old)
    calls = record_calls(path, new_entries)
    cases: List[Tuple[int, Optional[float]]] = [(k, None) for k in range(1, len(calls) + 1)]
    cases += [(k, c) for k in range(1, len(calls) + 1) if calls[k - 1] == "pwrite" for c in TORN_CUTS]
    for step, cut in cases:
        reset(path, old)
        ino = os.stat(path).st_ino
        label = f"step {step} ({calls[step - 1]})" + (f" torn at {cut}" if cut is not None else "")
        if not killed_run(path, new_entries, step, cut):
            failures.append(f"{label}: the child was not killed")
            continue
        mid = _read(path)
        if cut is None and mid not in (old, new, new + b"\n" * (len(old) - len(new))):
            failures.append(f"{label}: after the kill the file is neither old, new nor new + blank lines: "
                            f"{mid[-120:]!r}")
        if mid == old:
            try:
                H.update_hosts_file(path, old_entries)
            except Exception as exc:  # noqa: BLE001 - recorded as a failure
                failures.append(f"{label}: the no-op update failed: {exc}")
            if _read(path) != old or leftovers(directory, keep):
                failures.append(f"{label}: the no-op update changed the file or left "
                                f"{leftovers(directory, keep)}")
        try:
            H.update_hosts_file(path, new_entries)
        except Exception as exc:  # noqa: BLE001 - recorded as a failure
            failures.append(f"{label}: the next update failed: {exc}")
            continue
        got = _read(path)
        if got != new:
            failures.append(f"{label}: the next update gave {got[-200:]!r}")
        for v in views:
            if _read(v) != new:
                failures.append(f"{label}: {v} does not show the new content")
        if same_inode and os.stat(path).st_ino != ino:
            failures.append(f"{label}: the inode changed")
        extra = leftovers(directory, keep)
        if extra:
            failures.append(f"{label}: files left behind: {extra}")
            for e in extra:
                os.unlink(os.path.join(directory, e))
    return {"calls": calls, "steps": len(calls), "torn": len(cases) - len(calls), "failures": failures}


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def random_kills(path: str, keep: Sequence[str], kills: int = 100, seed: int = 1) -> Dict[str, object]:
    """SIGKILL, at random moments, a child that updates path back and forth between a long and
    a short block without pause (no hooks: kills land anywhere, also inside a write). After each
    kill the file must hold one of the two contents (or a long-to-short update's padded
    intermediate) unless the kill was inside a write, and the next update must give exactly the
    expected file with no files left. Returns {"kills": N, "mid": {...counts}, "failures": [...]}.
    """
    import random
    rnd = random.Random(seed)
    long_c, short_c = content(MANY + OWN), content(FEW + OWN)
    clean = {long_c: "long", short_c: "short", short_c + b"\n" * (len(long_c) - len(short_c)): "padded"}
    failures: List[str] = []
    mid_counts: Dict[str, int] = {}
    directory = os.path.dirname(path)
    reset(path, long_c)
    for i in range(kills):
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                while True:
                    H.update_hosts_file(path, FEW + OWN)
                    H.update_hosts_file(path, MANY + OWN)
            finally:
                os._exit(3)
        time.sleep(rnd.uniform(0.001, 0.03))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            failures.append(f"kill {i}: the updater ended by itself (status {status:#x})")
            continue
        kind = clean.get(_read(path), "torn")
        mid_counts[kind] = mid_counts.get(kind, 0) + 1
        # every other time the next update asks for what the file already holds (a no-op that
        # must still clean up), otherwise for the other content
        same = MANY + OWN if kind == "long" else FEW + OWN
        want = same if i % 2 else (FEW + OWN if same == MANY + OWN else MANY + OWN)
        try:
            H.update_hosts_file(path, want)
        except Exception as exc:  # noqa: BLE001 - recorded as a failure
            failures.append(f"kill {i} ({kind}): the next update failed: {exc}")
            continue
        if _read(path) != content(want):
            failures.append(f"kill {i} ({kind}): the next update gave {_read(path)[-160:]!r}")
        extra = leftovers(directory, keep)
        if extra:
            failures.append(f"kill {i} ({kind}): files left behind: {extra}")
    return {"kills": kills, "mid": mid_counts, "failures": failures}


def bind_case(which: str, directory: str) -> Dict[str, object]:
    """In a private mount namespace: a source file bind-mounted onto a target file; update through
    'target' or 'source' while killing; both must show the result and keep the inode."""
    src = os.path.join(directory, "netns-hosts")
    dst = os.path.join(directory, "etc-hosts")
    reset(src, content(MANY + OWN))
    reset(dst, b"")
    subprocess.run(["mount", "--bind", src, dst], check=True)
    try:
        out: Dict[str, object] = {}
        for label, old, new in (("shrink", MANY + OWN, FEW + OWN), ("grow", FEW + OWN, MANY + OWN)):
            path, other = (dst, src) if which == "target" else (src, dst)
            res = scenario(path, old, new, keep=["netns-hosts", "etc-hosts"], views=[other], same_inode=True)
            out[label] = res
        ino = os.stat(src).st_ino
        res = random_kills(dst if which == "target" else src, keep=["netns-hosts", "etc-hosts"])
        if os.stat(src).st_ino != ino or _read(src) != _read(dst):
            res["failures"].append("after the random kills the two sides of the bind mount differ")
        out["random"] = res
        return out
    finally:
        subprocess.run(["umount", dst], check=False)


if __name__ == "__main__":
    print(json.dumps(bind_case(sys.argv[1], sys.argv[2])))
