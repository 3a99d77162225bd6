"""Children started through overlay_manager.system.children die with their parent, are killed by pid on
shutdown, and run() bounds their time."""
import os
import signal
import subprocess
import sys
import time

import pytest

from overlay_manager.system import children

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def _gone(pid, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split(")")[-1].split()[0] == "Z":
                    return True  # exited, waiting for its (init) reaper
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_child_dies_when_parent_is_sigkilled():
    code = ("import time;"
            "from overlay_manager.system import children;"
            "p = children.spawn(['sleep', '60']); print(p.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert not _gone(child, 0.2)
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        assert _gone(child), f"child {child} outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.stdout.close()


def test_kill_all_stops_tracked_children():
    p = children.spawn(["sleep", "60"])
    assert p.pid in children.alive()
    children.kill_all(grace_s=1.0)
    assert p.poll() is not None and p.pid not in children.alive()


def test_run_kills_on_timeout_and_reports_output():
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        children.run(["sleep", "30"], timeout_s=0.3)
    assert time.monotonic() - start < 3
    assert children.alive() == []
    done = children.run([sys.executable, "-c", "print('hi')"], timeout_s=10)
    assert done.returncode == 0 and done.stdout.strip() == "hi"


def test_netcheck_child_is_bounded(tmp_path):
    from overlay_manager.tailscaled.localapi import TailscaleError, netcheck
    cli = tmp_path / "tailscale"
    cli.write_text("#!/bin/sh\nsleep 30\n")
    cli.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(TailscaleError, match="longer than"):
        netcheck(str(cli), "/nonexistent.sock", timeout_s=0.5)
    assert time.monotonic() - start < 3 and children.alive() == []
