"""The real node with tailscaled's IPN bus (fake tailscaled that serves watch-ipn-bus): while the
bus is open the status is read at bus_poll_rate (0.5 Hz here, to tell a bus-woken read from a
periodic one) instead of poll_rate (4 Hz), and a change on the bus makes the node read the status
at once (not faster than poll_rate). Without the bus (an old tailscaled answers 404) the node
reads at poll_rate."""
import os
import shutil
import signal
import subprocess
import time

import pytest

from overlay_manager.core.stats import percentile
from overlay_manager.system import children
from overlay_manager.system.waiting import tail, wait_for
from overlay_manager.testing.tsfake import FakeTailscaled, write_robot_config

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(shutil.which("roscore") is None, reason="ROS not installed (scripts/setup)")
STATUS, BUS = "GET /localapi/v0/status", "GET /localapi/v0/watch-ipn-bus"


def _node(env, tmp_path, fake, name, *params):
    cfg = tmp_path / "robot.yaml"
    write_robot_config(cfg, fake.socket_path, {"iperf_server": False, "netcheck_interval": 0, "preflight_interval": 0})
    log = tmp_path / "node.log"
    proc = subprocess.Popen(["rosrun", "overlay_manager", "overlay_manager_node", f"_config:={cfg}",
                             f"__name:={name}", *params], env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, log


def _stop(proc):
    """SIGINT to the process group (roslaunch stops its nodes), SIGKILL after 15 s."""
    children.stop(proc, 15.0, signal.SIGINT)


def _count(fake, key):
    with fake._lock:
        return fake.counts.get(key, 0)


def _rate(fake, seconds):
    n0, t0 = _count(fake, STATUS), time.monotonic()
    time.sleep(seconds)
    return (_count(fake, STATUS) - n0) / (time.monotonic() - t0)


def test_bus_slows_the_poll_and_changes_are_read_at_once(master, tmp_path):
    fake = FakeTailscaled(ipn_bus=True, record_requests=False)
    proc, log = _node(master, tmp_path, fake, "om_bus_test", "_bus_poll_rate:=0.5")
    try:
        wait_for("the node to open the IPN bus", lambda: _count(fake, BUS) >= 1, 30, detail=lambda: tail(log))
        wait_for("the node's first status reads", lambda: _count(fake, STATUS) >= 2, 30, detail=lambda: tail(log))
        rate = _rate(fake, 6.0)
        print(f"status reads with the bus open: {rate:.2f} /s")
        assert 0.3 <= rate <= 0.9, f"expected about 0.5 status reads/s (bus_poll_rate) with the bus, got {rate:.2f}"
        delays = []
        for i in range(6):
            time.sleep(0.3 + 0.31 * i)  # land at different points of the 2 s poll period
            n0 = _count(fake, STATUS)
            t0 = time.monotonic()
            fake.notify({"PeerChangedPatch": [{"NodeID": 2, "Online": i % 2 == 0}]})
            wait_for("a status read after a bus notification", lambda n0=n0: _count(fake, STATUS) > n0,
                     2.0, interval=0.005)
            delays.append(time.monotonic() - t0)
        print("bus notification -> status read: " + ", ".join(f"{d * 1000:.0f} ms" for d in delays))
        # the periodic read alone would come 1 s later on average (0.5 Hz); the bus wakes it at
        # once (at most 250 ms after the previous read: the poll_rate limit)
        assert percentile(delays, 50) < 0.35, delays
        assert max(delays) < 0.9, delays
        assert proc.poll() is None, tail(log)
    finally:
        _stop(proc)
        fake.close()


def test_without_the_bus_the_node_polls_at_poll_rate(master, tmp_path):
    fake = FakeTailscaled(ipn_bus=False, record_requests=False)
    proc, log = _node(master, tmp_path, fake, "om_nobus_test")
    try:
        wait_for("the node's first status reads", lambda: _count(fake, STATUS) >= 2, 30, detail=lambda: tail(log))
        rate = _rate(fake, 3.0)
        print(f"status reads without the bus: {rate:.2f} /s")
        assert 3.0 <= rate <= 5.0, f"expected about 4 status reads/s (poll_rate) without the bus, got {rate:.2f}"
    finally:
        _stop(proc)
        fake.close()
