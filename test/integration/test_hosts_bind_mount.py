"""The managed hosts block on real bind mounts (root; private mount namespaces only).

Nothing here touches the host's own /etc/hosts: every bind mount is made inside a mount namespace
created with ``unshare --mount --propagation private`` and disappears with it.

- Kill injection: SIGKILL at every step of the update (and inside every pwrite) while the file is
  a bind-mount TARGET, and while it is the SOURCE of a bind mount; after each kill the next update
  gives exactly the expected file through both paths, with the same inode and no files left.
- The ``ip netns exec`` arrangement: a process in its own mount namespace sees a source file
  bound over /etc/hosts; updating the source from outside (where no mount of it is visible in our
  own mount table) must keep the inode, so ``getent hosts`` inside sees the new names.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from overlay_manager.system import files as F
from overlay_manager.system import hosts as H
from overlay_manager.system import mounts as M

REPO = Path(__file__).resolve().parents[2]

HARNESS = REPO / "overlay_manager" / "testing" / "hosts_kill.py"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "nsenter", "mount", "getent")),
    reason="needs root and unshare/nsenter/mount/getent (bind mounts in a private mount namespace)")


@pytest.mark.parametrize("which", ["target", "source"])
def test_sigkill_at_every_step_on_a_bind_mount(which, tmp_path):
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, str(HARNESS),
                           which, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    rnd = result.pop("random")
    print(f"bind-mount {which}: {rnd['kills']} SIGKILLs at random moments of back-and-forth updates, "
          f"file found after the kill: {rnd['mid']}")
    assert rnd["failures"] == [], rnd["failures"][:5]
    for change, r in result.items():
        print(f"bind-mount {which}, block {change}s: killed at each of {r['steps']} steps "
              f"{r['calls']} and inside each pwrite ({r['torn']} torn writes)")
        assert r["failures"] == [], r["failures"][:5]
        assert "replace" not in r["calls"]          # in place, never renamed
        assert r["calls"].count("pwrite") >= 2      # the journal and the file
    assert sorted(os.listdir(tmp_path)) == ["etc-hosts", "netns-hosts"]


def test_source_updated_from_outside_is_seen_inside_the_namespace(tmp_path):
    """What `ip netns exec` does: bind /etc/netns/<ns>/hosts over /etc/hosts in a new mount
    namespace. The writer (this process) does not see that mount in its own mount table."""
    src = tmp_path / "hosts"
    src.write_bytes(b"127.0.0.1 localhost\n")
    ino = os.stat(src).st_ino
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount --bind '{src}' /etc/hosts && echo ready && exec sleep 120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline().strip()
        assert line == "ready", f"holder namespace did not start: {holder.stderr.read() if holder.stderr else ''}"
        own = open("/proc/self/mountinfo", encoding="utf-8").read()
        assert str(src) not in own                     # invisible from here: found through /proc/<pid>

        def inside(name: str) -> str:
            r = subprocess.run(["nsenter", "-t", str(holder.pid), "-m", "getent", "hosts", name],
                               capture_output=True, text=True, timeout=10)
            return r.stdout.strip()
        assert M.bind_mounted(os.path.realpath(src), os.stat(src)) is True
        # the journal of an update through either side lives next to the source, not in /etc
        code = ("import os; from overlay_manager.system import files as F; "
                "print(F.journal_path('/etc/hosts', os.stat('/etc/hosts')))")
        r = subprocess.run(["nsenter", "-t", str(holder.pid), "-m", sys.executable, "-c", code], cwd=str(REPO),
                           env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        want = str(tmp_path / f".hosts.{ino}.overlay_manager-journal")
        assert r.stdout.strip() == want == F.journal_path(str(src), os.stat(src))
        t0 = time.perf_counter()
        assert H.update_hosts_file(str(src), [("100.64.0.2", ["robot2.fleet.internal", "robot2"])])
        took_ms = (time.perf_counter() - t0) * 1000
        print(f"update of a bind-mount source (mount tables of all namespaces scanned): {took_ms:.1f} ms")
        assert os.stat(src).st_ino == ino
        assert inside("robot2.fleet.internal").split() == ["100.64.0.2", "robot2.fleet.internal", "robot2"]
        H.update_hosts_file(str(src), [("100.64.0.3", ["robot3.fleet.internal", "robot3"])])
        assert inside("robot3").split()[0] == "100.64.0.3" and inside("robot2") == ""
        assert os.stat(src).st_ino == ino and os.listdir(tmp_path) == ["hosts"]
    finally:
        holder.kill()
        holder.wait(timeout=10)
    # with the namespace gone the same file is plain again: replaced by rename
    assert M.bind_mounted(os.path.realpath(src), os.stat(src)) is False
    H.update_hosts_file(str(src), [("100.64.0.4", ["robot4.fleet.internal", "robot4"])])
    assert os.stat(src).st_ino != ino and os.listdir(tmp_path) == ["hosts"]
