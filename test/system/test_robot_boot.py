"""The boot sequence of the shipped units on two lab machines behind NATs, without systemd.

On robot1 (b1, the ROS master) and laptop (b2), freshly started tailscaleds that never enrolled:
1. overlay-env.service's own command line (from config/systemd/overlay-env.service, $$ -> $) with
   the unit's settings: enrols from the bundle, writes the hosts block and the EnvironmentFile;
2. overlay-manager.service's command line with the variables of that EnvironmentFile (read the
   way systemd reads it) and ROS_IP dropped: roslaunch robot.launch, roscore on robot1.
Checks: the EnvironmentFile has the overlay names and address; laptop's node lists robot1 and the
ROS env it reports is the one from the file; overlay-env's command with a broken config fails
and writes no file (systemd would then not start overlay-manager: Requires=/After=, checked by
test/integration/test_systemd_units.py). Paths systemd would use (/run, /var/lib, /var/log) are
moved into each host's lab directory. Everything started here is stopped by pid.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Dict

import pytest
import yaml

from overlay_manager.lab import robots
from overlay_manager.ros_names import overlay_node, ros_namespace

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "config" / "systemd"
TWO_BUILDINGS = REPO / "config" / "lab" / "two_buildings.yaml"
ROBOT, LAPTOP = "alpha-robot1", "alpha-laptop"
RUN_ENV = "/run/overlay_manager/ros.env"


def exec_start(unit: str) -> str:
    """The unit's ExecStart= bash script, continuation lines joined and $$ turned into $."""
    text = (UNITS / unit).read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    m = re.match(r"^ExecStart=/bin/bash -c '(.*)'\s*$", line)
    assert m, f"{unit}: ExecStart is not /bin/bash -c '...'"
    return m.group(1).replace("$$", "$")


def environment_file(path: Path) -> Dict[str, str]:
    """KEY=value lines as systemd's EnvironmentFile= reads them (comments skipped, quotes removed)."""
    out = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        out[key.strip()] = value
    return out


def run_overlay_env_unit(lab, host: str, config: Path, env_file: Path):
    script = exec_start("overlay-env.service").replace(RUN_ENV, str(env_file))
    env = dict(robots.ros_env(lab, host), ROS_SETUP="", OVERLAY_MANAGER_CONFIG=str(config),
               OVERLAY_ENV_ARGS="--enrol --write-hosts", OVERLAY_ENV_RETRY="60")
    return lab.exec(host, ["bash", "-c", script], env=env, timeout=120, check=False)


def start_overlay_manager_unit(lab, host: str, env_file: Path):
    env = dict(environment_file(env_file))
    env.update(robots.ros_env(lab, host), ROS_SETUP="", OVERLAY_MANAGER_CONFIG=str(lab.robot_yaml(host)),
               LAUNCH_ARGS="")
    script = "unset ROS_IP; " + exec_start("overlay-manager.service")  # UnsetEnvironment=ROS_IP
    return lab.popen(host, ["bash", "-c", script], env=env, log=Path(lab.host_dir(host)) / "robot.launch.log")


@pytest.fixture(scope="module")
def booted(lab_factory):
    lab = lab_factory(TWO_BUILDINGS)
    files = {h: Path(lab.host_dir(h)) / "run" / "ros.env" for h in (ROBOT, LAPTOP)}
    try:
        with robots.processes(lab, (ROBOT, LAPTOP)) as procs:
            for host in (ROBOT, LAPTOP):
                res = run_overlay_env_unit(lab, host, Path(lab.robot_yaml(host)), files[host])
                assert res.returncode == 0, f"overlay-env on {host}: {res.stderr}"
            procs.append(start_overlay_manager_unit(lab, ROBOT, files[ROBOT]))
            robots.peers(lab, ROBOT, timeout=90, node=overlay_node(ROBOT))
            procs.append(start_overlay_manager_unit(lab, LAPTOP, files[LAPTOP]))
            robots.peers(lab, LAPTOP, min_peers=1, timeout=120, node=overlay_node(LAPTOP))
            yield lab, files
    finally:
        lab.down()  # now, not at session end


def test_environment_file_has_overlay_names_and_address(booted):
    lab, files = booted
    for host in (ROBOT, LAPTOP):
        env = environment_file(files[host])
        assert env == {"ROS_HOSTNAME": f"{host}.fleet.internal",
                       "ROS_MASTER_URI": f"http://{ROBOT}.fleet.internal:11311",
                       "OVERLAY_MANAGER_HOST": host, "OVERLAY_MANAGER_NS": ros_namespace(host),
                       "OVERLAY_MANAGER_ADDRESS": lab.overlay_ip(host)}, files[host].read_text()
        assert "export" not in files[host].read_text() and "unset" not in files[host].read_text()


def test_nodes_started_by_the_unit_see_each_other_on_overlay_names(booted):
    lab, _ = booted
    msg = robots.peers(lab, LAPTOP, min_peers=1, node=overlay_node(LAPTOP))
    assert msg["self_peer"]["dns_name"] == f"{LAPTOP}.fleet.internal"
    assert [p["name"] for p in msg["peers"]] == [ROBOT]
    env = robots.call(lab, LAPTOP, f"{overlay_node(LAPTOP)}/get_ros_env", "overlay_manager/GetRosEnv")
    assert env["ok"] and env["ros_hostname"] == f"{LAPTOP}.fleet.internal"
    assert env["ros_master_uri"] == f"http://{ROBOT}.fleet.internal:11311"


def test_overlay_env_unit_fails_on_a_broken_config_and_writes_nothing(booted):
    lab, _ = booted
    bad = Path(lab.host_dir(LAPTOP)) / "broken.yaml"
    data = yaml.safe_load(Path(lab.robot_yaml(LAPTOP)).read_text())
    data["master_port"] = "eleven"
    bad.write_text(yaml.safe_dump(data))
    target = Path(lab.host_dir(LAPTOP)) / "run" / "broken.env"
    res = run_overlay_env_unit(lab, LAPTOP, bad, target)
    assert res.returncode == 2 and "master_port" in res.stderr, shlex.quote(res.stderr)
    assert not target.exists()
