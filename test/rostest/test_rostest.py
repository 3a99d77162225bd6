"""Runs every rostest launch file (real nodes, real roscore) from pytest, so one command runs all.

The list is CMakeLists.txt's ``add_rostest(...)`` lines (overlay_manager.testing.cmake_tests), the
same list ``catkin_make run_tests`` runs; a launch file in test/rostest/ that is not registered there
is skipped here with the line to add (and test/unit/project/test_cmake_tests.py fails until it is added).
Each run may take its launch file's largest ``time-limit`` plus the time roscore and the nodes need
to start and stop."""
import os
import shutil
import subprocess

import pytest

from overlay_manager.testing.cmake_tests import rostests

START_STOP_S = 120.0
"""What rostest needs besides the tests' own time: roscore, the nodes, shutting them down."""
MIN_TIMEOUT_S = 240.0


def _ros_env(tmp_path):
    """The environment rostest runs with: the launch files name every node's address with
    ROS_HOSTNAME, so ROS_IP / ROS_HOSTNAME left in this process by other tests are dropped."""
    env = dict(os.environ, ROS_HOME=str(tmp_path), ROS_LOG_DIR=str(tmp_path / "log"))
    for leftover in ("ROS_IP", "ROS_HOSTNAME", "ROS_MASTER_URI"):
        env.pop(leftover, None)
    env["PATH"] = "/usr/bin:/bin:/usr/sbin:/sbin:" + env.get("PATH", "")
    return env


@pytest.mark.skipif(shutil.which("rostest") is None, reason="rostest not installed (scripts/setup)")
@pytest.mark.parametrize("test", rostests(), ids=lambda t: t.name)
def test_rostest(test, tmp_path):
    if not test.registered:
        pytest.skip(f"{test.path} is not registered in CMakeLists.txt: add the line {test.cmake_line}")
    assert test.exists, f"CMakeLists.txt registers {test.path}, which does not exist: remove {test.cmake_line}"
    timeout = max(MIN_TIMEOUT_S, test.time_limit_s + START_STOP_S)
    proc = subprocess.run(["rostest", "overlay_manager", test.name], capture_output=True, text=True,
                          env=_ros_env(tmp_path), timeout=timeout, check=False)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-80:])
    assert proc.returncode == 0 and "RESULT: SUCCESS" in proc.stdout, f"rostest {test.name} failed:\n{tail}"
