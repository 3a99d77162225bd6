"""The real node refuses a bad ~host_aliases (exit 2, naming the parameter) instead of starting
with a topic-link map that silently misplaces nodes."""
import os
import shutil
import subprocess

import pytest

from overlay_manager.testing.tsfake import FakeTailscaled, write_robot_config

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(shutil.which("roscore") is None, reason="ROS not installed (scripts/setup)")


def test_bad_host_aliases_exit_2(master, tmp_path):
    fake = FakeTailscaled()
    try:
        cfg = tmp_path / "robot.yaml"
        write_robot_config(cfg, fake.socket_path, {"iperf_server": False, "netcheck_interval": 0})
        proc = subprocess.run(["rosrun", "overlay_manager", "overlay_manager_node", f"_config:={cfg}",
                               "_host_aliases:=[robot1, robot2]", "__name:=om_alias_test"], env=master,
                              capture_output=True, text=True, timeout=60, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out[-2000:]
        assert "host_aliases" in out and "must be a mapping" in out, out[-2000:]
    finally:
        fake.close()
