"""Bundles turn the node's managed hosts block on whenever MagicDNS is off on the machine."""
from pathlib import Path

import yaml

from overlay_manager.core.config import parse_robot_config
from overlay_manager.fleet.bundle import robot_config
from overlay_manager.fleet.config import load_fleet
from overlay_manager.fleet.deploy import Deployment

REPO = Path(__file__).resolve().parents[3]


def _cfg(tmp_path, overrides=None):
    fleet = load_fleet(REPO / "config" / "fleet.example.yaml")
    host = sorted(fleet.hosts)[0]
    dep = Deployment(tmp_path, "lab", "https://10.231.0.2:8443", fleet.base_domain, None, "headscale")
    raw = robot_config(dep, fleet, host, overrides)
    return raw, parse_robot_config(yaml.safe_load(yaml.safe_dump(raw)), str(tmp_path / "robot.yaml"))


def test_magicdns_off_by_default_turns_manage_hosts_on(tmp_path):
    raw, cfg = _cfg(tmp_path)
    assert raw["node"] == {"manage_hosts": True}
    assert cfg.tailscale.accept_dns is False and cfg.node.manage_hosts is True


def test_other_node_keys_are_kept_and_an_explicit_choice_wins(tmp_path):
    _, cfg = _cfg(tmp_path, {"node": {"ping_interval": 2.0}})
    assert cfg.node.manage_hosts is True and cfg.node.ping_interval == 2.0
    _, cfg = _cfg(tmp_path, {"node": {"manage_hosts": False}})
    assert cfg.node.manage_hosts is False


def test_magicdns_on_leaves_hosts_file_alone(tmp_path):
    raw, cfg = _cfg(tmp_path, {"tailscale": {"accept_dns": True}})
    assert "node" not in raw and cfg.node.manage_hosts is False
