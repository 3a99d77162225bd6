"""Every section a bundle writes into robot.yaml reads back through the robot config's loader
(overlay_manager.core.config.load_robot_config) as the value the fleet meant: the writer
(fleet/bundle.py) and the reader (core/config.py) share the types of the sections both know
(``relay``: RelaySettings, ``derper``: DerperSettings), and this test ties the rest."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import pytest

from overlay_manager.core.config import (
    DerperSettings,
    RelaySettings,
    RobotConfig,
    load_robot_config,
    parse_derper_settings,
    parse_relay_settings,
)
from overlay_manager.core.validation import Reader
from overlay_manager.fleet.bundle import robot_config, robot_yaml
from overlay_manager.fleet.config import load_fleet, load_fleet_dict
from overlay_manager.fleet.deploy import Deployment
from overlay_manager.fleet.derp import derper_settings, servers_on
from overlay_manager.fleet.model import FleetConfig
from overlay_manager.fleet.relays import relay_settings
from overlay_manager.testing.fleet_files import fleet_data

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = load_fleet(REPO / "config" / "fleet.example.yaml")
# a relay whose static endpoints the fleet file gives in a non-canonical form, and a second derper
OTHER = load_fleet_dict(fleet_data(
    {"alpha": {"robots": ["alpha-robot1"], "base_stations": ["relay1", "derp1"]}},
    relays={"relay1": {"port": 41000, "static_endpoints": ["[2001:DB8::1]:41000", "192.0.2.7:41000"]}},
    derp_regions={"north": {"id": 950, "servers": [{"host": "derp1", "address": "10.9.0.1", "http_port": 8080}]}},
), "fleet.yaml")
OVERRIDES: List[Optional[Dict[str, Any]]] = [
    None,
    {"tailscale": {"socket": "/run/ts/tailscaled.sock", "cli": "/opt/tailscale", "accept_dns": True}},
    {"node": {"ping_interval": 2.0, "watch_peers": ["alpha-robot2"], "manage_hosts": False}},
]
CASES: List[Tuple[str, FleetConfig, str, int]] = (
    [("example", EXAMPLE, h, i) for h in sorted(EXAMPLE.hosts) for i in range(len(OVERRIDES))]
    + [("other", OTHER, h, i) for h in sorted(OTHER.hosts) for i in range(len(OVERRIDES))])


def _bundle(tmp_path: Path, fleet: FleetConfig, host: str, overrides: Optional[Dict[str, Any]],
            ca: bool) -> Tuple[Dict[str, Any], RobotConfig]:
    """(what the bundle writes, what the loader reads back) for ``host``, through a file."""
    dep = Deployment(tmp_path, fleet.name, "https://10.231.0.2:8443", fleet.base_domain,
                     tmp_path / "ca.crt" if ca else None, "headscale")
    raw = robot_config(dep, fleet, host, overrides)
    path = tmp_path / "bundle" / "robot.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(robot_yaml(raw, "# header as write_bundle writes it\n"), encoding="utf-8")
    return raw, load_robot_config(str(path))


def _read_back(cfg: RobotConfig, key: str, written: Any, base: Path) -> Any:
    """The value the loader made of top-level ``key``, in the form the bundle wrote it."""
    value = getattr(cfg, key)
    if key in ("auth_key_file", "ca_cert"):
        return os.path.relpath(value, base) if value else ""  # the loader resolves against the file's folder
    if isinstance(value, (RelaySettings, DerperSettings)):
        return value.to_yaml()
    if isinstance(value, tuple):
        return list(value)
    if isinstance(written, dict):  # tailscale, node: the keys the bundle wrote, as written
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in ((k, getattr(value, k)) for k in written)}
    return value


@pytest.mark.parametrize("which,fleet,host,i", CASES, ids=[f"{c[0]}-{c[2]}-{c[3]}" for c in CASES])
def test_every_written_key_reads_back_as_written(tmp_path: Path, which: str, fleet: FleetConfig, host: str,
                                                 i: int) -> None:
    raw, cfg = _bundle(tmp_path, fleet, host, OVERRIDES[i], ca=i == 1)
    base = tmp_path / "bundle"
    for key, written in raw.items():
        assert _read_back(cfg, key, written, base) == written, (
            f"robot.yaml of {host}: {key} written as {written!r}, read back as {getattr(cfg, key)!r}")
    relay = fleet.relays.get(host)
    assert cfg.relay == (relay_settings(relay) if relay else None)
    derpers = servers_on(fleet.derp_regions, host)
    assert cfg.derper == (derper_settings(derpers[0]) if derpers else None)


def test_the_cases_cover_every_section_a_bundle_writes(tmp_path: Path) -> None:
    seen: Set[str] = set()
    for _, fleet, host, i in CASES:
        seen.update(robot_config(Deployment(tmp_path, fleet.name, "https://x:1", fleet.base_domain, None, ""),
                                 fleet, host, OVERRIDES[i]))
    assert {"relay", "derper", "tailscale", "node", "tags", "ca_cert", "auth_key_file", "master_port"} <= seen


def test_sections_from_the_fleet_are_canonical(tmp_path: Path) -> None:
    raw, cfg = _bundle(tmp_path, OTHER, "relay1", None, ca=False)
    assert raw["relay"] == {"port": 41000, "static_endpoints": ["192.0.2.7:41000", "[2001:db8::1]:41000"]}
    assert cfg.relay == RelaySettings(41000, ("192.0.2.7:41000", "[2001:db8::1]:41000"))
    raw, cfg = _bundle(tmp_path, OTHER, "derp1", None, ca=False)
    assert raw["derper"] == {"url": "http://127.0.0.1:8080", "region": "north"}
    assert cfg.derper == DerperSettings("http://127.0.0.1:8080", "north")


@pytest.mark.parametrize("value", [RelaySettings(), RelaySettings(41000, ("192.0.2.1:41000", "[2001:db8::1]:41000"))])
def test_relay_to_yaml_parses_back(value: RelaySettings) -> None:
    assert parse_relay_settings(Reader("robot.yaml"), value.to_yaml()) == value


@pytest.mark.parametrize("value", [DerperSettings("http://127.0.0.1:3340"),
                                   DerperSettings("http://localhost:80", "east")])
def test_derper_to_yaml_parses_back(value: DerperSettings) -> None:
    assert parse_derper_settings(Reader("robot.yaml"), value.to_yaml()) == value
