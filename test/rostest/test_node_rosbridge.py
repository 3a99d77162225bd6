"""The real node's /diagnostics entry "rosbridge" (~rosbridge_port) against real listening sockets.

A TCP listener of this test on 0.0.0.0:PORT stands in for rosbridge_websocket (which listens on
every interface; rosbridge_suite is not installable here). The node, against the fake
tailscaled, reports WARN: reachable beyond the overlay (as root: nft answers, the table is not
there; this test never installs it on the host) or cannot tell (not root). Moved to 127.0.0.1,
the entry turns OK (loopback only), read by the node's own thread within its 10 s period.
"""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from ros_graph import free_port, stop_all

from overlay_manager.core.levels import Level
from overlay_manager.testing.tsfake import FakeTailscaled, write_robot_config

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(shutil.which("roscore") is None, reason="ROS not installed (scripts/setup)")
NAME = "om_rosbridge_test"


def listener(address: str, port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((address, port))
    s.listen()
    return s


def wait_diag(env, text: str, timeout: float) -> dict:
    proc = subprocess.run([sys.executable, os.path.join(HERE, "wait_diag.py"), f"{NAME}: rosbridge", text,
                           str(timeout)], env=env, capture_output=True, text=True, timeout=timeout + 30,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_rosbridge_port_exposure_on_diagnostics(master, tmp_path):
    fake = FakeTailscaled()
    port = free_port()
    wide = listener("0.0.0.0", port)
    node = None
    try:
        cfg = write_robot_config(tmp_path / "robot.yaml", fake.socket_path,
                                 {"iperf_server": False, "netcheck_interval": 0})
        node = subprocess.Popen(["rosrun", "overlay_manager", "overlay_manager_node", f"_config:={cfg}",
                                 f"_rosbridge_port:={port}", f"__name:={NAME}"], env=master,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        text = "reachable beyond the overlay" if os.geteuid() == 0 else "cannot tell"
        d = wait_diag(master, text, 40)
        assert d["level"] == Level.WARN, d
        assert d["values"]["listening_on"] == "0.0.0.0" and d["values"]["port"] == str(port), d
        assert f"overlay_env --rosbridge-firewall {port}" in d["message"], d
        wide.close()
        local = listener("127.0.0.1", port)
        try:
            d = wait_diag(master, "loopback/overlay addresses only", 30)
            assert d["level"] == Level.OK and d["values"]["listening_on"] == "127.0.0.1", d
        finally:
            local.close()
    finally:
        wide.close()
        if node is not None:
            stop_all([node], 15.0)
        fake.close()
