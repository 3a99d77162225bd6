"""Runs the link-aware camera's C++ unit tests and its rostest (real encoder/decoder nodes, real
roscore) from pytest, so the one test command runs them."""
import os
import shutil
import subprocess

import pytest


def _ros_env(tmp_path):
    """The environment rostest runs with: the launch files name every node's address with
    ROS_HOSTNAME, so ROS_IP / ROS_HOSTNAME left in this process by other tests are dropped."""
    env = dict(os.environ, ROS_HOME=str(tmp_path), ROS_LOG_DIR=str(tmp_path / "log"))
    for leftover in ("ROS_IP", "ROS_HOSTNAME", "ROS_MASTER_URI"):
        env.pop(leftover, None)
    env["PATH"] = "/usr/bin:/bin:/usr/sbin:/sbin:" + env.get("PATH", "")
    return env


def _devel_binary(name):
    """The binary `name` of overlay_manager in the sourced devel space(s); None when not built."""
    for prefix in os.environ.get("CMAKE_PREFIX_PATH", "").split(os.pathsep):
        path = os.path.join(prefix, "lib", "overlay_manager", name)
        if prefix and os.access(path, os.X_OK):
            return path
    return None


@pytest.mark.skipif(not os.environ.get("CMAKE_PREFIX_PATH"), reason="no catkin devel space sourced (scripts/build)")
@pytest.mark.parametrize("name", ["test_stream_policy", "test_host_matching", "test_image_rules"])
def test_pure_gtest(name):
    """The stream policy, subscriber_hosts (with test/data/host_matching_cases.yaml) and the
    transports' encodings table, lying frames and JPEG/PNG checks (image_rules.h)."""
    binary = _devel_binary(name)
    assert binary, f"{name} not built: CMAKE_PREFIX_PATH has no devel space with overlay_manager's C++"
    proc = subprocess.run([binary], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "[  PASSED  ]" in proc.stdout


@pytest.mark.skipif(not os.environ.get("CMAKE_PREFIX_PATH"), reason="no catkin devel space sourced (scripts/build)")
def test_h264_codec_gtest():
    """The H.264 codec with the real libx264 and libavcodec decoder on opencv-doc's vtest.avi."""
    binary = _devel_binary("test_h264_codec")
    assert binary, "test_h264_codec not built: CMAKE_PREFIX_PATH has no devel space with overlay_manager's C++"
    proc = subprocess.run([binary], capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "[  PASSED  ]" in proc.stdout


@pytest.mark.skipif(shutil.which("rostest") is None, reason="rostest not installed (scripts/setup)")
@pytest.mark.parametrize("launch, timeout_s", [
    ("link_aware_camera.test", 240),     # encoder/decoder nodes, paths from a fake ~peers
    ("link_aware_transport.test", 240),  # the image_transport plugins beside a /compressed publisher
    ("link_aware_h264.test", 300),       # the H.264 transport: late subscriber, bitrate, backlog
])
def test_link_aware_rostest(tmp_path, launch, timeout_s):
    proc = subprocess.run(["rostest", "overlay_manager", launch], capture_output=True, text=True,
                          env=_ros_env(tmp_path), timeout=timeout_s, check=False)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-80:])
    assert proc.returncode == 0 and "RESULT: SUCCESS" in proc.stdout, f"rostest {launch} failed:\n{tail}"
