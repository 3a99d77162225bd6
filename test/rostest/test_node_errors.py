"""The real node's start-up errors: bad config and bad key files are clear, fatal and secret-free."""
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "unit"))
from tsfake import FakeTailscaled  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("roscore") is None, reason="ROS not installed (scripts/setup)")
SECRET = "hskey-auth-DO-NOT-LEAK-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    port = _free_port()
    home = tmp_path_factory.mktemp("roshome")
    env = dict(os.environ, ROS_MASTER_URI=f"http://127.0.0.1:{port}", ROS_IP="127.0.0.1", ROS_HOME=str(home))
    env.pop("ROS_HOSTNAME", None)
    proc = subprocess.Popen(["roscore", "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                os.killpg(proc.pid, 9)
                raise AssertionError(f"roscore on port {port} did not answer within 30 s") from None
            time.sleep(0.2)
    yield env
    os.killpg(proc.pid, 2)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)


def _run_node(env, config, timeout=40):
    proc = subprocess.run(["rosrun", "overlay_manager", "overlay_manager_node", f"_config:={config}",
                           "__name:=om_err_test"], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _config(tmp_path, fake, **extra):
    data = {"hostname": "robota", "login_server": "http://10.250.0.1:8080", "base_domain": "fleet.internal",
            "master": "robota", "tailscale": {"socket": fake.socket_path if fake else "/nonexistent.sock",
                                              "cli": "/bin/false"},
            "node": {"iperf_server": False, "netcheck_interval": 0}}
    data.update(extra)
    p = tmp_path / "robot.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_bad_config_exits_2_naming_key(master, tmp_path):
    rc, out = _run_node(master, _config(tmp_path, None, master_port="eleven"))
    assert rc == 2, out
    assert "master_port" in out and "robot.yaml" in out


def test_world_readable_key_refused_without_leaking(master, tmp_path):
    fake = FakeTailscaled()
    try:
        fake.status = dict(fake.status, BackendState="NeedsLogin")
        fake.prefs = {"ControlURL": ""}
        key = tmp_path / "auth.key"
        key.write_text(SECRET)
        os.chmod(key, 0o644)
        rc, out = _run_node(master, _config(tmp_path, fake, auth_key_file=str(key)))
        assert rc == 3, out
        assert "chmod 600" in out and SECRET not in out
    finally:
        fake.close()


def test_other_login_server_is_not_re_enrolled(master, tmp_path):
    fake = FakeTailscaled()
    try:
        fake.prefs = {"ControlURL": "https://other.example:443"}
        rc, out = _run_node(master, _config(tmp_path, fake))
        assert rc == 3, out
        assert "tailscale logout" in out and "other.example" in out
    finally:
        fake.close()
