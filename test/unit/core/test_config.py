"""Robot config validation: every error names the file and the key."""
import os
import shutil

import pytest
import yaml

from overlay_manager.core.config import apply_overrides, load_robot_config
from overlay_manager.core.validation.errors import ConfigError

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
EXAMPLE = os.path.join(ROOT, "config", "robot.example.yaml")


def _write(tmp_path, data):
    p = tmp_path / "robot.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def _base():
    with open(EXAMPLE) as fh:
        return yaml.safe_load(fh)


def test_example_loads_with_every_key():
    cfg = load_robot_config(EXAMPLE)
    assert cfg.fqdn == "alpha-robot1.fleet.internal"
    assert cfg.master_fqdn == "alpha-robot1.fleet.internal"
    assert cfg.auth_key_file == os.path.normpath(os.path.join(os.path.dirname(EXAMPLE), "auth.key"))
    assert cfg.tags == ("tag:team-alpha", "tag:robot")
    assert cfg.node.poll_rate == 4.0 and cfg.tailscale.up_timeout == 30.0


@pytest.mark.parametrize("mutate,key,text", [
    (lambda d: d.pop("hostname"), "hostname", "missing"),
    (lambda d: d.update(colour="red"), "colour", "unknown key"),
    (lambda d: d.update(hostname="Robot_1"), "hostname", "DNS label"),
    (lambda d: d.update(hostname="Alpha-Robot1"), "hostname", "lower case: 'alpha-robot1'"),
    (lambda d: d.update(master_port="11311"), "master_port", "integer"),
    (lambda d: d.update(login_server="hs.example"), "login_server", "URL"),
    (lambda d: d.update(tags=["robot"]), "tags[0]", "ACL tag"),
    (lambda d: d["node"].update(publish_rate="fast"), "node.publish_rate", "number"),
    (lambda d: d["node"].update(typo=1), "node.typo", "unknown key"),
    (lambda d: d["tailscale"].update(accept_dns="yes"), "tailscale.accept_dns", "boolean"),
    (lambda d: d["node"].update(ping_interval=-1), "node.ping_interval", "negative"),
    (lambda d: d["node"].update(watch_peers="robot2"), "node.watch_peers", "list"),
])
def test_bad_values_name_file_and_key(tmp_path, mutate, key, text):
    data = _base()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as e:
        load_robot_config(path)
    assert e.value.key == key and text in str(e.value) and path in str(e.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_robot_config(str(tmp_path / "none.yaml"))
    p = tmp_path / "bad.yaml"
    p.write_text("hostname: [unclosed\n")
    with pytest.raises(ConfigError, match="line"):
        load_robot_config(str(p))


def test_relative_paths_and_master_fqdn(tmp_path):
    d = tmp_path / "bundle"
    d.mkdir()
    shutil.copy(EXAMPLE, d / "robot.yaml")
    cfg = load_robot_config(str(d / "robot.yaml"))
    assert cfg.ca_cert == str(d / "ca.crt")
    data = _base()
    data["master"] = "base1.other.domain"
    assert load_robot_config(_write(tmp_path, data)).master_fqdn == "base1.other.domain"


def test_param_overrides_are_validated():
    cfg = load_robot_config(EXAMPLE)
    cfg2 = apply_overrides(cfg, {"manage_hosts": True, "ping_interval": 2}, "/overlay_manager params")
    assert cfg2.node.manage_hosts and cfg2.node.ping_interval == 2.0
    with pytest.raises(ConfigError, match="/overlay_manager params: node.manage_hosts"):
        apply_overrides(cfg, {"manage_hosts": "yes"}, "/overlay_manager params")
