"""The shipped systemd units: systemd-analyze accepts them, and overlay-env.service's command
writes the EnvironmentFile overlay-manager.service reads, or fails without writing it."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "config" / "systemd"
EXAMPLE = ROOT / "config" / "robot.example.yaml"

# The parts of the tailscale package's tailscaled.service that matter for the drop-in (the real
# unit runs /usr/sbin/tailscaled; verify checks that ExecStart exists, so a stand-in command).
TAILSCALED_UNIT = """[Unit]
Description=Tailscale node agent
Wants=network-pre.target
After=network-pre.target
[Service]
EnvironmentFile=-/etc/default/tailscaled
ExecStart=/bin/sleep infinity
Type=notify
RuntimeDirectory=tailscale
StateDirectory=tailscale
[Install]
WantedBy=multi-user.target
"""


def unit_lines(path: Path) -> list:
    """Lines of a unit file with systemd's backslash-newline continuations joined."""
    return path.read_text().replace("\\\n", " ").splitlines()


def exec_start(path: Path) -> str:
    """The ExecStart= command of a unit, as bash gets it ($$ -> $)."""
    line = next(ln for ln in unit_lines(path) if ln.startswith("ExecStart="))
    m = re.match(r"^ExecStart=/bin/bash -c '(.*)'\s*$", line)
    assert m, f"{path.name}: ExecStart is not /bin/bash -c '...': {line}"
    return m.group(1).replace("$$", "$")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_accepts_units_and_drop_in(tmp_path):
    for f in ("overlay-env.service", "overlay-manager.service"):
        shutil.copy(UNITS / f, tmp_path / f)
    (tmp_path / "tailscaled.service").write_text(TAILSCALED_UNIT)
    (tmp_path / "tailscaled.service.d").mkdir()
    shutil.copy(UNITS / "tailscaled.service.d" / "overlay_manager.conf", tmp_path / "tailscaled.service.d")
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", "overlay-env.service",
                           "overlay-manager.service", "tailscaled.service"],
                          cwd=tmp_path, capture_output=True, text=True, check=False, timeout=60,
                          env=dict(os.environ, SYSTEMD_UNIT_PATH=f"{tmp_path}:"))
    out = (proc.stdout + proc.stderr).strip()
    # verify exits 0 on unknown keys and bad assignments but prints them: treat any output as failure
    assert proc.returncode == 0 and out == "", f"systemd-analyze verify:\n{out}"


def test_units_wire_the_env_file_and_the_failure_path():
    env_unit = unit_lines(UNITS / "overlay-env.service")
    mgr_unit = unit_lines(UNITS / "overlay-manager.service")
    assert "Type=oneshot" in env_unit and "RemainAfterExit=yes" in env_unit
    assert "Requires=overlay-env.service" in mgr_unit and "After=overlay-env.service" in mgr_unit
    # no '-': a missing env file (overlay-env never succeeded) must stop the start too
    assert "EnvironmentFile=/run/overlay_manager/ros.env" in mgr_unit
    assert "--env-file /run/overlay_manager/ros.env" in exec_start(UNITS / "overlay-env.service")
    drop_in = (UNITS / "tailscaled.service.d" / "overlay_manager.conf").read_text()
    assert "Environment=TS_NO_LOGS_NO_SUPPORT=true" in drop_in and "Environment=SSL_CERT_FILE=" in drop_in


@pytest.mark.skipif(shutil.which("rosrun") is None, reason="rosrun not installed (scripts/setup)")
@pytest.mark.parametrize("config,ok", [(str(EXAMPLE), True), ("/nonexistent/robot.yaml", False)])
def test_overlay_env_unit_command(tmp_path, config, ok):
    """The unit's own command line, run by bash as systemd would (env file path moved to tmp)."""
    target = tmp_path / "ros.env"
    script = exec_start(UNITS / "overlay-env.service").replace("/run/overlay_manager/ros.env", str(target))
    env = dict(os.environ, ROS_SETUP="", OVERLAY_MANAGER_CONFIG=config, OVERLAY_ENV_ARGS="",
               OVERLAY_ENV_RETRY="0", ROS_HOME=str(tmp_path))
    env["PATH"] = "/usr/bin:/bin:/usr/sbin:/sbin:" + env.get("PATH", "")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=False,
                          timeout=60)
    if ok:
        assert proc.returncode == 0, proc.stderr
        assert "ROS_MASTER_URI=http://alpha-robot1.fleet.internal:11311\n" in target.read_text()
    else:
        assert proc.returncode == 2 and "nonexistent/robot.yaml" in proc.stderr
        assert not target.exists()
