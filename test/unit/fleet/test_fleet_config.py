"""Fleet file validation: every bad input is a ConfigError naming file, key and host."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest

from overlay_manager.core.validation.errors import ConfigError
from overlay_manager.fleet.config import load_fleet, load_fleet_dict, parse_duration
from overlay_manager.fleet.model import FleetError
from overlay_manager.testing.fleet_files import fleet_data

REPO = Path(__file__).resolve().parents[3]

TEAMS: Dict[str, Any] = {
    "alpha": {"master": "alpha-base", "robots": ["alpha-robot1", "alpha-robot2"],
              "base_stations": ["alpha-base"], "operators": ["alpha-op"]},
    "bravo": {"robots": ["bravo-robot1"]},
}


def fleet(**changes: Any) -> Dict[str, Any]:
    """The test fleet (teams alpha and bravo) with top-level keys replaced by ``changes``."""
    return fleet_data(TEAMS, **changes)


def error(data: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_fleet_dict(data, path="fleet.yaml")
    return info.value


def test_example_file_loads() -> None:
    f = load_fleet(REPO / "config" / "fleet.example.yaml")
    assert f.name == "lab"
    assert f.base_domain == "fleet.internal"
    assert set(f.teams) == {"alpha", "bravo"}
    assert f.teams["alpha"].master == "alpha-base"
    assert f.host("alpha-robot1").role == "robot"
    assert f.host_tags("alpha-op") == ["tag:ops-alpha", "tag:operator"]
    assert f.host_tags("alpha-base") == ["tag:team-alpha", "tag:base-station"]


def test_defaults() -> None:
    f = load_fleet_dict(fleet())
    assert f.server.listen == "0.0.0.0:8443"
    assert f.server.tls.generate
    assert f.server.derp.embedded and f.server.derp.stun_listen == "0.0.0.0:3478"
    assert f.keys.auth_key_expiry == 86400 and f.keys.node_expiry == 0
    assert f.teams["bravo"].master == "bravo-robot1"  # first robot by default
    assert list(f.hosts) == ["alpha-robot1", "alpha-robot2", "alpha-base", "alpha-op",
                             "bravo-robot1"]


def test_hosts_section_merges_into_teams() -> None:
    f = load_fleet_dict(fleet(hosts={"bravo-op": {"team": "bravo", "role": "operator"}}))
    assert f.host("bravo-op").team == "bravo"
    assert f.host_tags("bravo-op") == ["tag:ops-bravo", "tag:operator"]


def test_unknown_team() -> None:
    e = error(fleet(hosts={"charlie-robot1": {"team": "charlie"}}))
    assert e.host == "charlie-robot1" and e.key == "hosts.charlie-robot1.team"
    assert "unknown team 'charlie'" in str(e) and "fleet.yaml" in str(e)


def test_duplicate_host() -> None:
    d = fleet()
    d["teams"]["bravo"]["robots"].append("alpha-robot2")
    e = error(d)
    assert e.host == "alpha-robot2"
    assert "duplicate" in str(e) and "teams.alpha.robots[1]" in str(e)


def test_duplicate_host_across_sections() -> None:
    e = error(fleet(hosts={"alpha-op": {"team": "bravo"}}))
    assert e.host == "alpha-op" and "duplicate" in e.reason


@pytest.mark.parametrize("bad", ["Robot1", "robot_1", "-robot", "robot-", "a" * 64, "r.1", ""])
def test_bad_dns_label(bad: str) -> None:
    d = fleet()
    d["teams"]["alpha"]["robots"].append(bad)
    e = error(d)
    assert e.host == bad and "DNS label" in str(e)


def test_upper_case_host_gets_its_lower_case_form() -> None:
    d = fleet()
    d["teams"]["alpha"]["robots"].append("Alpha-Robot9")
    e = error(d)
    assert e.key.startswith("teams.alpha.robots[") and "'alpha-robot9'" in str(e) and "\n" not in str(e)


@pytest.mark.parametrize("good", ["alpha-robot9", "4th-robot", "3d-scanner", "x"])
def test_dns_labels_with_hyphens_and_leading_digits(good: str) -> None:
    d = fleet()
    d["teams"]["alpha"]["robots"].append(good)
    f = load_fleet_dict(d)
    assert good in {h.name for t in f.teams.values() for h in t.hosts}


def test_bad_team_name() -> None:
    d = fleet()
    d["teams"]["Team_A"] = {"robots": ["x1"]}
    assert "teams.Team_A" in str(error(d))


@pytest.mark.parametrize("url", ["https://fleet.internal:8443", "https://hs.fleet.internal"])
def test_base_domain_equal_to_server_domain(url: str) -> None:
    e = error(fleet(server={"url": url}))
    assert e.key == "base_domain" and "must differ" in str(e)


def test_server_domain_outside_base_domain_ok() -> None:
    f = load_fleet_dict(fleet(server={"url": "https://headscale.campus.example"}))
    assert f.server.listen == "0.0.0.0:443"


def test_master_checks() -> None:
    d = fleet()
    d["teams"]["alpha"]["master"] = "ghost"
    assert error(d).host == "ghost"
    d["teams"]["alpha"]["master"] = "bravo-robot1"
    e = error(d)
    assert "not in this team" in str(e) and e.key == "teams.alpha.master"


def test_unknown_keys_are_errors() -> None:
    assert error(fleet(servers={})).key == "servers"
    assert error(fleet(server={"url": "https://10.0.0.1", "tsl": {}})).key == "server.tsl"
    d = fleet()
    d["teams"]["alpha"]["robot"] = ["x"]
    assert error(d).key == "teams.alpha.robot"


@pytest.mark.parametrize("url", ["10.0.0.1:8443", "ftp://x", "https://10.0.0.1/path", "https://:80"])
def test_bad_server_url(url: str) -> None:
    assert error(fleet(server={"url": url})).key == "server.url"


def test_tls_own_files_required() -> None:
    e = error(fleet(server={"url": "https://10.0.0.1", "tls": {"generate": False}}))
    assert e.key == "server.tls"


def test_missing_and_empty() -> None:
    assert error({}).reason == "empty fleet file"
    assert error(fleet(teams={})).key == "teams"
    d = fleet()
    del d["base_domain"]
    assert error(d).key == "base_domain"
    d = fleet()
    d["teams"]["bravo"] = {"operators": ["bravo-op"]}
    assert error(d).key == "teams.bravo.master"


def test_durations() -> None:
    assert parse_duration("90s") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("24h") == 86400
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration(0) == 0
    for bad in ("1y", "-1h", True, "h"):
        with pytest.raises(ConfigError):
            parse_duration(bad, file="f", key="k")
    assert error(fleet(keys={"auth_key_expiry": "3 weeks"})).key == "keys.auth_key_expiry"


def test_load_fleet_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_fleet(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("fleet: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_fleet(bad)
    assert str(bad) in str(info.value)


def test_relative_paths_resolve_against_file(tmp_path: Path) -> None:
    (tmp_path / "f.yaml").write_text(
        "fleet: x\nbase_domain: fleet.internal\n"
        "server: {url: 'https://10.0.0.1', tls: {generate: false, cert: c.pem, key: k.pem}}\n"
        "teams: {a: {robots: [r1]}}\n")
    cwd = os.getcwd()
    try:
        os.chdir("/")
        f = load_fleet(tmp_path / "f.yaml")
    finally:
        os.chdir(cwd)
    assert f.server.tls.cert == tmp_path / "c.pem"


def test_unknown_host_lookup() -> None:
    f = load_fleet_dict(fleet(), path="fleet.yaml")
    with pytest.raises(FleetError) as info:
        f.host("zulu")
    assert info.value.host == "zulu" and "fleet.yaml" in str(info.value)
