"""Runs the rostest launch files (real node, real roscore) from pytest so one command runs all."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.skipif(shutil.which("rostest") is None, reason="rostest not installed (scripts/setup)")
@pytest.mark.parametrize("launch", ["node.test", "topic_links.test"])
def test_rostest(launch, tmp_path):
    env = dict(os.environ, ROS_HOME=str(tmp_path), ROS_LOG_DIR=str(tmp_path / "log"))
    env["PATH"] = "/usr/bin:/bin:/usr/sbin:/sbin:" + env.get("PATH", "")
    proc = subprocess.run(["rostest", "overlay_manager", launch], capture_output=True, text=True,
                          env=env, timeout=240, check=False)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
    assert proc.returncode == 0 and "RESULT: SUCCESS" in proc.stdout, f"rostest {launch} failed:\n{tail}"
