"""ROS env in overlay names, and the overlay_env command."""
import os
import subprocess

from overlay_manager.cli.overlay_env import main
from overlay_manager.core.config import load_robot_config
from overlay_manager.core.ros_env import compute_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EXAMPLE = os.path.join(ROOT, "config", "robot.example.yaml")


def test_compute_env_from_config_and_from_tailscaled_name():
    cfg = load_robot_config(EXAMPLE)
    env = compute_env(cfg)
    assert env.ros_hostname == "alpha-robot1.fleet.internal"
    assert env.ros_master_uri == "http://alpha-robot1.fleet.internal:11311"
    assert compute_env(cfg, "robot1-1.fleet.internal.").ros_hostname == "robot1-1.fleet.internal"
    assert env.shell() == ("export ROS_HOSTNAME=alpha-robot1.fleet.internal\n"
                           "export ROS_MASTER_URI=http://alpha-robot1.fleet.internal:11311\nunset ROS_IP\n"
                           "export OVERLAY_MANAGER_HOST=alpha-robot1\n"
                           "export OVERLAY_MANAGER_NS=alpha_robot1\n"
                           "export OVERLAY_MANAGER_MASTER_LOCAL=true\n")


def test_hyphenated_host_gets_a_ros_legal_namespace_and_keeps_its_name():
    env = compute_env(load_robot_config(EXAMPLE), "alpha-robot1.fleet.internal.")
    assert env.short_name == "alpha-robot1"
    assert env.namespace == "alpha_robot1"
    assert "export OVERLAY_MANAGER_HOST=alpha-robot1\n" in env.shell()
    assert "export OVERLAY_MANAGER_NS=alpha_robot1\n" in env.shell()


def test_main_prints_exports(capsys):
    assert main(["--config", EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "export ROS_MASTER_URI=http://alpha-robot1.fleet.internal:11311" in out


def test_missing_config_is_exit_2_with_hint(capsys, tmp_path):
    assert main(["--config", str(tmp_path / "none.yaml")]) == 2
    err = capsys.readouterr().err
    assert "none.yaml" in err and "does not exist" in err and "--config" in err


def test_script_runs_directly_and_evals_in_a_shell():
    """scripts/overlay_env from the clone, with nothing but the workspace's Python path (the
    devel space, as after sourcing its setup.bash)."""
    env = {"PATH": "/usr/bin:/bin", "ROS_IP": "10.0.0.1", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        ["bash", "-c", f'eval "$(/usr/bin/python3 {ROOT}/scripts/overlay_env --config {EXAMPLE})" '
                       '&& echo "$ROS_HOSTNAME $ROS_MASTER_URI ${ROS_IP-unset}"'],
        capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "alpha-robot1.fleet.internal http://alpha-robot1.fleet.internal:11311 unset"
