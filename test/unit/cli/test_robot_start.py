"""Starting a robot: overlay_env's systemd EnvironmentFile, failing starts, and re-enrolment."""
import os
import stat
import subprocess

import pytest

from overlay_manager.cli.overlay_env import main
from overlay_manager.core.config import load_robot_config
from overlay_manager.core.ros_env import _systemd_value, compute_env
from overlay_manager.tailscaled.enrolment import ensure_enrolled
from overlay_manager.tailscaled.localapi import EnrolError, LocalAPI
from overlay_manager.testing.tsfake import FakeTailscaled, write_robot_config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
EXAMPLE = os.path.join(ROOT, "config", "robot.example.yaml")
SCRIPT = os.path.join(ROOT, "scripts", "overlay_env")

SECRET = "hskey-auth-REAUTH-SECRET-0123456789"


def test_environment_file_is_key_value_only():
    text = compute_env(load_robot_config(EXAMPLE)).environment_file()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines == ["ROS_HOSTNAME=alpha-robot1.fleet.internal",
                     "ROS_MASTER_URI=http://alpha-robot1.fleet.internal:11311",
                     "OVERLAY_MANAGER_HOST=alpha-robot1", "OVERLAY_MANAGER_NS=alpha_robot1",
                     "OVERLAY_MANAGER_MASTER_LOCAL=true"]
    assert "export" not in text and "unset" not in text


def test_systemd_value_quotes_what_systemd_would_split():
    assert _systemd_value("http://a.b:11311") == "http://a.b:11311"
    assert _systemd_value('a b"c\\') == '"a b\\"c\\\\"'
    with pytest.raises(ValueError):
        _systemd_value("a\nb")


def test_env_file_written_and_untouched_on_failure(tmp_path, capsys):
    target = tmp_path / "run" / "ros.env"
    assert main(["--config", EXAMPLE, "--env-file", str(target)]) == 0
    assert capsys.readouterr().out == "", "--env-file prints no shell lines"
    good = target.read_text()
    assert "ROS_MASTER_URI=http://alpha-robot1.fleet.internal:11311\n" in good
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    bad = tmp_path / "bad.yaml"
    bad.write_text("hostname: Robot_1\n")
    assert main(["--config", str(bad), "--env-file", str(target)]) == 2
    assert "bad.yaml" in capsys.readouterr().err
    assert target.read_text() == good, "a failed run must leave the last good file alone"
    assert os.listdir(target.parent) == ["ros.env"], "no temp files left behind"


def _shell(snippet: str, config: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "OVERLAY_ENV": f"/usr/bin/python3 {SCRIPT} --config {config}",
           "ROS_MASTER_URI": "http://old:11311", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # the workspace
    return subprocess.run(["bash", "-c", snippet], capture_output=True, text=True, env=env, check=False)


def test_shell_form_stops_when_overlay_env_fails(tmp_path):
    """The documented start lines (README, docs/node.md) stop on a failing overlay_env and keep the
    shell open; a bare eval "$(...)" would start with the old names, `|| exit 1` would close the
    user's terminal."""
    missing = str(tmp_path / "missing.yaml")
    documented = ('ROS_ENV="$($OVERLAY_ENV)" && eval "$ROS_ENV" &&\n'
                  'echo "started with $ROS_MASTER_URI"\n'
                  'echo "shell still open"')
    out = _shell(documented, missing)
    assert "started" not in out.stdout and out.stdout.strip() == "shell still open", out.stdout
    assert "missing.yaml" in out.stderr
    trap = 'eval "$($OVERLAY_ENV)" && echo "started with $ROS_MASTER_URI"'
    out = _shell(trap, missing)
    assert out.stdout.strip() == "started with http://old:11311", "the trap the docs warn about"
    closes = 'ROS_ENV="$($OVERLAY_ENV)" || exit 1\necho "shell still open"'
    out = _shell(closes, missing)
    assert out.returncode == 1 and "shell still open" not in out.stdout, "what || exit 1 does to a terminal"
    out = _shell(documented, EXAMPLE)
    assert out.returncode == 0 and out.stdout.splitlines() == [
        "started with http://alpha-robot1.fleet.internal:11311", "shell still open"]


@pytest.fixture
def reauth_setup(tmp_path):
    """A Running fake tailscaled, a CLI that records its argv, and a config with a 0600 key file."""
    fake = FakeTailscaled()
    argv_log = tmp_path / "argv"
    cli = tmp_path / "tailscale"
    cli.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {argv_log}\n")
    cli.chmod(0o755)
    key = tmp_path / "auth.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(SECRET + "\n")
    cfg_path = tmp_path / "robot.yaml"
    write_robot_config(cfg_path, fake.socket_path, auth_key_file="auth.key",
                       tailscale={"socket": fake.socket_path, "cli": str(cli), "up_timeout": 5.0})
    yield fake, load_robot_config(str(cfg_path)), argv_log
    fake.close()


def test_reauth_runs_up_with_every_enrol_flag_and_force_reauth(reauth_setup):
    fake, cfg, argv_log = reauth_setup
    api = LocalAPI(fake.socket_path)
    assert ensure_enrolled(api, cfg).action == "already-enrolled"
    assert not argv_log.exists(), "an enrolled machine is never re-enrolled without --reauth"
    result = ensure_enrolled(api, cfg, reauth=True)
    assert result.action == "re-enrolled"
    argv = argv_log.read_text().split("\n")
    assert "up" in argv and "--force-reauth" in argv
    for flag in ("--login-server=http://10.250.0.1:8080", "--hostname=robota", "--accept-dns=false",
                 f"--auth-key=file:{cfg.auth_key_file}"):
        assert flag in argv, (flag, argv)
    assert SECRET not in argv_log.read_text()


def test_reauth_refuses_another_login_server(reauth_setup):
    fake, cfg, argv_log = reauth_setup
    fake.prefs = {"ControlURL": "https://elsewhere.example"}
    with pytest.raises(EnrolError, match="elsewhere.example"):
        ensure_enrolled(LocalAPI(fake.socket_path), cfg, reauth=True)
    assert not argv_log.exists()


def test_reauth_needs_enrol(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--config", EXAMPLE, "--reauth"])
    assert exc.value.code == 2 and "--reauth needs --enrol" in capsys.readouterr().err


def test_overlay_address_exported_when_tailscaled_was_asked(tmp_path, capsys):
    """--write-hosts reads tailscaled: its overlay IPv4 goes out as OVERLAY_MANAGER_ADDRESS (what
    robot.launch binds rosbridge to; the own name resolves to loopback through the hosts block)."""
    fake = FakeTailscaled()
    try:
        hosts = tmp_path / "hosts"
        hosts.write_text("127.0.0.1 localhost\n")
        cfg = tmp_path / "robot.yaml"
        write_robot_config(cfg, fake.socket_path, {"hosts_file": str(hosts)})
        assert main(["--config", str(cfg), "--write-hosts"]) == 0
        assert "export OVERLAY_MANAGER_ADDRESS=100.64.0.1\n" in capsys.readouterr().out
        target = tmp_path / "ros.env"
        assert main(["--config", str(cfg), "--write-hosts", "--env-file", str(target)]) == 0
        assert "OVERLAY_MANAGER_ADDRESS=100.64.0.1\n" in target.read_text()
        assert main(["--config", str(cfg)]) == 0  # config only: the address is not known
        assert "OVERLAY_MANAGER_ADDRESS" not in capsys.readouterr().out
    finally:
        fake.close()
