"""The IPN bus watcher against a real tailscaled (userspace networking, not logged in) in a
network namespace of this run that has only loopback.

Checks: the current state arrives at once; a preference change is reported as a change; when
tailscaled dies the watcher says so and reconnects when it is back; stop() ends a blocked read at
once. Needs root (ip netns) and .tools/bin/{tailscale,tailscaled} (scripts/setup).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from overlay_manager.system.waiting import tail, wait_for
from overlay_manager.tailscaled.ipnbus import BusWatcher

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".tools" / "bin"
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a network namespace"),
    pytest.mark.skipif(not (BIN / "tailscaled").exists() or not (BIN / "tailscale").exists(),
                       reason="needs .tools/bin/tailscale and tailscaled (scripts/setup)"),
]


class Daemon:
    """One tailscaled in namespace ns with its state and socket under tmp; started and ended by pid."""

    def __init__(self, ns: str, tmp: Path) -> None:
        self.ns, self.tmp = ns, tmp
        self.socket = str(tmp / "tailscaled.sock")
        self.proc: "subprocess.Popen[bytes] | None" = None

    def start(self) -> None:
        env = dict(os.environ, TS_LOGS_DIR=str(self.tmp), TS_NO_LOGS_NO_SUPPORT="true")
        log = open(self.tmp / "tailscaled.log", "ab")  # noqa: SIM115 - kept by the child
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, str(BIN / "tailscaled"), f"--statedir={self.tmp / 'state'}",
             f"--socket={self.socket}", "--tun=userspace-networking", "--no-logs-no-support", "--port=0"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_for(f"tailscaled's socket {self.socket}", lambda: os.path.exists(self.socket), 20,
                 detail=lambda: tail(self.tmp / "tailscaled.log"))

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@pytest.fixture()
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    ns = f"ombus-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    d = Daemon(ns, tmp_path)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        d.start()
        yield d
    finally:
        d.stop()
        subprocess.run(["ip", "netns", "del", ns], check=False)


def test_bus_reports_state_changes_and_reconnects(daemon: Daemon) -> None:
    got: List[Tuple[float, Tuple[str, ...]]] = []
    watcher = BusWatcher(daemon.socket, on_change=lambda kinds: got.append((time.monotonic(), kinds)),
                         retry_s=0.2)
    watcher.start()
    try:
        wait_for("the IPN bus to connect", lambda: watcher.connected, 10, detail=lambda: str(watcher.stats()))
        wait_for("the initial state on the bus", lambda: any("state" in k for _, k in got), 10,
                 detail=lambda: str(got))
        before = len(got)
        start = time.monotonic()
        subprocess.run([str(BIN / "tailscale"), f"--socket={daemon.socket}", "set", "--hostname=bus-test"],
                       check=True, capture_output=True, timeout=20)
        wait_for("the preference change on the bus", lambda: any("prefs" in k for _, k in got[before:]), 10,
                 detail=lambda: str(got))
        t_prefs = next(t for t, k in got[before:] if "prefs" in k)
        assert t_prefs - start < 5.0

        daemon.stop()
        wait_for("the watcher to notice tailscaled is gone", lambda: not watcher.connected, 10,
                 detail=lambda: str(watcher.stats()))
        daemon.start()
        wait_for("the watcher to reconnect", lambda: watcher.stats()["connects"] >= 2 and watcher.connected, 20,
                 detail=lambda: str(watcher.stats()))
    finally:
        start = time.monotonic()
        watcher.stop()
        watcher.join(5)
        assert time.monotonic() - start < 2.0, "stop() must end a blocked read at once"
