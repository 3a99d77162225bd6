"""Fixtures shared by the rostest-level tests (real nodes against a fake tailscaled).

``master`` (module scope): a roscore of its own on a free loopback port, ROS_HOME in a temp dir;
yields the environment to run nodes with (ROS_MASTER_URI, ROS_IP=127.0.0.1, no ROS_HOSTNAME).
Stopped by pid (SIGINT to its process group, SIGKILL after 15 s) whatever the tests did.
"""
import socket
import subprocess

import pytest
from ros_graph import free_port, ros_env, stop_all

from overlay_manager.system import waiting


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    port = free_port()
    env = ros_env(port, tmp_path_factory.mktemp("roshome"))
    proc = subprocess.Popen(["roscore", "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"roscore exited with {proc.returncode}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        waiting.wait_for(f"roscore on port {port}", up, 30, interval=0.2, fatal=(RuntimeError,))
        yield env
    finally:
        stop_all([proc], 15.0)  # roscore then stops rosmaster and rosout
