"""The shipped systemd units: systemd-analyze accepts them; a stop or restart of tailscaled (a
tailscale package upgrade) reaches no other unit, so the robot's ROS stack never goes down with
it; overlay-env.service's command writes the EnvironmentFile overlay-manager.service reads, or
fails without writing it.

systemd is not PID 1 here: `systemd-analyze verify` checks the files offline (SYSTEMD_UNIT_PATH
= a temp dir with the units, ahead of the system's), and the propagation graph is read from the
files themselves (overlay_manager.lab.campus.units, following systemd.unit(5)).
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from overlay_manager.lab.campus import units as unitfiles

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "config" / "systemd"
EXAMPLE = ROOT / "config" / "robot.example.yaml"
SHIPPED = ("overlay-env.service", "overlay-upkeep.service", "overlay-manager.service")
BRINGUP = "overlay-manager.service"

# The dependency-relevant lines of the tailscale package's tailscaled.service (v1.102.5,
# cmd/tailscaled/tailscaled.service). verify checks that ExecStart's program exists, so TAILSCALED
# is replaced by a stand-in executable.
TAILSCALED_UNIT = """[Unit]
Description=Tailscale node agent
Wants=network-pre.target
After=network-pre.target NetworkManager.service systemd-resolved.service
[Service]
EnvironmentFile=-/etc/default/tailscaled
ExecStart=TAILSCALED --state=/var/lib/tailscale/tailscaled.state \\
  --socket=/run/tailscale/tailscaled.sock --port=${PORT} $FLAGS
ExecStopPost=TAILSCALED --cleanup
Restart=on-failure
RuntimeDirectory=tailscale
RuntimeDirectoryMode=0755
StateDirectory=tailscale
StateDirectoryMode=0700
CacheDirectory=tailscale
CacheDirectoryMode=0750
Type=notify
[Install]
WantedBy=multi-user.target
"""


def unit_dir(tmp_path: Path, extra: dict = None) -> Path:
    """tmp_path/units: the shipped units, the tailscaled drop-in, a stand-in tailscaled.service,
    plus extra {relative path: text} (e.g. a drop-in)."""
    d = tmp_path / "units"
    d.mkdir()
    for f in SHIPPED:
        shutil.copy(UNITS / f, d / f)
    stub = tmp_path / "tailscaled"
    stub.write_text("#!/bin/sh\nexec sleep infinity\n")
    stub.chmod(0o755)
    (d / "tailscaled.service").write_text(TAILSCALED_UNIT.replace("TAILSCALED", str(stub)))
    (d / "tailscaled.service.d").mkdir()
    shutil.copy(UNITS / "tailscaled.service.d" / "overlay_manager.conf", d / "tailscaled.service.d")
    for rel, text in (extra or {}).items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def shipped_unit(name: str) -> unitfiles.Unit:
    return unitfiles.load_units([UNITS])[name]


def verify(d: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", *SHIPPED, "tailscaled.service"],
                          cwd=d, capture_output=True, text=True, check=False, timeout=60,
                          env=dict(os.environ, SYSTEMD_UNIT_PATH=f"{d}:"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_accepts_units_and_drop_in(tmp_path):
    proc = verify(unit_dir(tmp_path))
    out = (proc.stdout + proc.stderr).strip()
    # verify exits 0 on unknown keys and bad assignments but prints them: treat any output as failure
    assert proc.returncode == 0 and out == "", f"systemd-analyze verify:\n{out}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_notices_a_broken_unit(tmp_path):
    """The check above can fail: a typo in a key and a missing program are reported."""
    d = unit_dir(tmp_path, {"overlay-upkeep.service.d/typo.conf": "[Service]\nRestartSecs=5\n",
                            "overlay-env.service.d/exec.conf": "[Service]\nExecStartPre=/nonexistent/x\n"})
    out = verify(d)
    text = out.stdout + out.stderr
    assert "RestartSecs" in text and "/nonexistent/x" in text, text


def test_a_tailscaled_restart_reaches_no_other_unit(tmp_path):
    """No Requires=/Requisite=/BindsTo=/PartOf=/PropagatesStopTo= chain (nor [Install]
    RequiredBy=) from tailscaled.service to any shipped unit, the drop-in included."""
    units = unitfiles.load_units([unit_dir(tmp_path)])
    assert set(SHIPPED) | {"tailscaled.service"} <= set(units)
    assert unitfiles.stopped_with(units, "tailscaled.service") == set()
    for name in SHIPPED:
        assert unitfiles.propagation_path(units, "tailscaled.service", name) == [], name
    # ordering and pulling in are there: tailscaled starts first at boot when it can
    for name in ("overlay-env.service", "overlay-upkeep.service"):
        assert "tailscaled.service" in units[name].names("Unit", "Wants")
        assert "tailscaled.service" in units[name].names("Unit", "After")
    bringup = units[BRINGUP]
    assert "overlay-env.service" in bringup.names("Unit", "After")
    assert "overlay-env.service" in bringup.names("Unit", "Wants")
    # nothing at all carries a stop into the bringup
    assert not [x for x, targets in unitfiles.stop_edges(units).items() if BRINGUP in targets]


def test_the_graph_check_sees_a_propagating_chain(tmp_path):
    """The same check on a graph like the first release's (overlay-env Requires tailscaled,
    the bringup Requires overlay-env) names the chain."""
    units = unitfiles.load_units([unit_dir(tmp_path, {
        "overlay-env.service.d/old.conf": "[Unit]\nRequires=tailscaled.service\n",
        f"{BRINGUP}.d/old.conf": "[Unit]\nRequires=overlay-env.service\n"})])
    assert unitfiles.propagation_path(units, "tailscaled.service", BRINGUP) == [
        "overlay-env.service: Requires=tailscaled.service", f"{BRINGUP}: Requires=overlay-env.service"]
    assert unitfiles.stopped_with(units, "tailscaled.service") == {"overlay-env.service", BRINGUP}


def test_bringup_is_unprivileged_and_root_parts_are_separate():
    bringup = shipped_unit(BRINGUP)
    assert bringup.value("Service", "User") not in ("", "root", "0")
    assert "manage_hosts:=false" in unitfiles.exec_start(bringup)
    for name in ("overlay-env.service", "overlay-upkeep.service"):
        assert shipped_unit(name).value("Service", "User") in ("", "root")
    upkeep = unitfiles.exec_start(shipped_unit("overlay-upkeep.service"))
    assert "--watch" in upkeep and "$OVERLAY_UPKEEP_ARGS" in upkeep
    assert shipped_unit("overlay-upkeep.service").value("Service", "Restart") == "always"
    env = unitfiles.exec_start(shipped_unit("overlay-env.service"))
    assert "--offline-ok" in env and "--retry" in env
    assert shipped_unit("overlay-env.service").value("Service", "TimeoutStartSec") != "infinity"


def test_units_wire_the_env_file_and_the_failure_path():
    env_unit = shipped_unit("overlay-env.service")
    mgr_unit = shipped_unit(BRINGUP)
    assert env_unit.value("Service", "Type") == "oneshot" and env_unit.value("Service", "RemainAfterExit") == "yes"
    # no '-': a missing env file (overlay-env failed on a bad config) must stop the start too
    assert "/run/overlay_manager/ros.env" in mgr_unit.values("Service", "EnvironmentFile")
    assert "--env-file /run/overlay_manager/ros.env" in unitfiles.exec_start(env_unit)
    drop_in = (UNITS / "tailscaled.service.d" / "overlay_manager.conf").read_text()
    assert "Environment=TS_NO_LOGS_NO_SUPPORT=true" in drop_in and "Environment=SSL_CERT_FILE=" in drop_in


@pytest.mark.skipif(shutil.which("rosrun") is None, reason="rosrun not installed (scripts/setup)")
@pytest.mark.parametrize("config,ok", [(str(EXAMPLE), True), ("/nonexistent/robot.yaml", False)])
def test_overlay_env_unit_command(tmp_path, config, ok):
    """The unit's own command line, run by bash as systemd would (env file path moved to tmp)."""
    target = tmp_path / "ros.env"
    script = unitfiles.exec_start(shipped_unit("overlay-env.service")).replace("/run/overlay_manager/ros.env",
                                                                              str(target))
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
