"""The real node's start-up errors: a bad config is fatal (exit 2); a bad key file or another login
server is reported on /diagnostics and retried while the node keeps running; all are clear and
secret-free."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from overlay_manager.core.levels import Level
from overlay_manager.testing.tsfake import FakeTailscaled, robot_config, write_robot_config

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(shutil.which("roscore") is None, reason="ROS not installed (scripts/setup)")
SECRET = "hskey-auth-DO-NOT-LEAK-0123456789"


def _run_node(env, config, timeout=40):
    proc = subprocess.run(["rosrun", "overlay_manager", "overlay_manager_node", f"_config:={config}",
                           "__name:=om_err_test"], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _enrol_error_reported(env, config, text, timeout=30):
    """Start the node, wait until /diagnostics shows its enrolment error containing text; the node
    must still be running then (it keeps reporting instead of exiting). Returns (diag JSON, output)."""
    node = subprocess.Popen(["rosrun", "overlay_manager", "overlay_manager_node", f"_config:={config}",
                             "__name:=om_err_test"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        waited = subprocess.run([sys.executable, os.path.join(HERE, "wait_diag.py"), "om_err_test: overlay",
                                 text, str(timeout)], env=env, capture_output=True, text=True,
                                timeout=timeout + 30, check=False)
        alive = node.poll() is None
    finally:
        if node.poll() is None:
            os.killpg(node.pid, 2)
        try:
            out, _ = node.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, 9)
            out, _ = node.communicate()
    assert waited.returncode == 0, waited.stderr + out
    assert alive, f"the node exited on an enrolment error:\n{out}"
    diag = json.loads(waited.stdout)
    assert diag["level"] == Level.ERROR and diag["message"].startswith("enrolment failed: "), diag
    return diag, out


def _config(tmp_path, fake, **extra):
    return str(write_robot_config(tmp_path / "robot.yaml", fake.socket_path if fake else "/nonexistent.sock",
                                  {"iperf_server": False, "netcheck_interval": 0}, **extra))


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
        diag, out = _enrol_error_reported(master, _config(tmp_path, fake, auth_key_file=str(key)), "chmod 600")
        assert "chmod 600" in out and SECRET not in out and SECRET not in json.dumps(diag)
    finally:
        fake.close()


def test_other_login_server_is_not_re_enrolled(master, tmp_path):
    fake = FakeTailscaled()
    try:
        fake.prefs = {"ControlURL": "https://other.example:443"}
        diag, out = _enrol_error_reported(master, _config(tmp_path, fake), "tailscale logout")
        assert "other.example" in diag["message"] and "tailscale logout" in out
    finally:
        fake.close()


def _raw_config(tmp_path, case):
    """A config file for each hostile input (None content = a directory)."""
    p = tmp_path / "robot.yaml"
    base = robot_config("/nonexistent.sock", {"iperf_server": False, "netcheck_interval": 0})
    if case == "directory":
        p.mkdir()
        return str(p)
    if case == "binary":
        p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    elif case == "deep":
        p.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    else:
        node_key, value = {"nan": ("publish_rate", float("nan")),
                           "inf": ("poll_rate", float("inf"))}.get(case, (None, None))
        if node_key:
            base["node"][node_key] = value
        if case == "key-as-path":
            base["auth_key_file"] = SECRET
        if case == "big":
            base["hostname"] = "r" * (5 * 1024 * 1024)
        p.write_text(yaml.dump(base, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)))
    return str(p)


# The real node for the inputs that once crashed it; every other hostile input goes through
# the same loader and is covered by test/unit/core/test_validation.py (loaders and CLIs).
@pytest.mark.parametrize("case,key", [
    ("nan", "node.publish_rate"), ("inf", "node.poll_rate"), ("directory", "(file)"),
    ("binary", "(file)"), ("deep", "(yaml)"), ("key-as-path", "auth_key_file"), ("big", "hostname"),
])
def test_hostile_config_exits_2_with_one_clear_line(master, tmp_path, case, key):
    """Any bad config: FATAL naming file and key, exit 2, no traceback, no secret, short."""
    path = _raw_config(tmp_path, case)
    rc, out = _run_node(master, path)
    assert rc == 2, out[-3000:]
    assert f"{path}: {key}: " in out, out[-3000:]
    assert "Traceback" not in out and SECRET not in out
    assert len(out) < 4000, f"{len(out)} characters of output"


def test_nan_parameter_override_is_refused(master, tmp_path):
    proc = subprocess.run(["rosrun", "overlay_manager", "overlay_manager_node",
                           f"_config:={_raw_config(tmp_path, 'ok')}", "_publish_rate:=.nan",
                           "__name:=om_err_test"], env=master, capture_output=True, text=True, timeout=40,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "node.publish_rate" in out and "finite" in out and "Traceback" not in out
