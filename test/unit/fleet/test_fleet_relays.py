"""The fleet file's relays section: validation naming the key, policy grants and team isolation,
the relay key of the bundle's robot config (pure: no headscale)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from overlay_manager.core.validation import ConfigError
from overlay_manager.fleet import policy
from overlay_manager.fleet.config import load_fleet_dict
from overlay_manager.fleet.relays import RELAY_CAP, Relay
from overlay_manager.testing.fleet_files import fleet_data

REPO = Path(__file__).resolve().parents[3]

TEAMS: Dict[str, Any] = {
    "alpha": {"robots": ["alpha-robot1", "alpha-robot2"], "base_stations": ["campus-relay"],
              "operators": ["alpha-op"]},
    "bravo": {"robots": ["bravo-robot1"], "operators": ["bravo-op"]},
}


def fleet_with(relays: Any) -> Any:
    """The test fleet (campus-relay an alpha base station) with this ``relays`` section, loaded."""
    return load_fleet_dict(fleet_data(TEAMS, relays=relays), "fleet.yaml")


def test_defaults() -> None:
    f = fleet_with({"campus-relay": None})
    assert f.relays == {"campus-relay": Relay("campus-relay", 40000, (), ("alpha", "bravo"))}
    assert load_fleet_dict(fleet_data(TEAMS), "fleet.yaml").relays == {}


def test_full_entry_canonical() -> None:
    f = fleet_with({"campus-relay": {"port": 41000, "teams": ["bravo"],
                                     "static_endpoints": ["[2001:db8::1]:41000", "192.0.2.1:41000"]}})
    r = f.relays["campus-relay"]
    assert r.port == 41000 and r.teams == ("bravo",)
    assert r.static_endpoints == ("192.0.2.1:41000", "[2001:db8::1]:41000")
    assert r.tag == "tag:relay-campus-relay"


@pytest.mark.parametrize("relays,key,words", [
    (["campus-relay"], "relays", "mapping"),
    ({"nobody": {}}, "relays.nobody", "not a host of the fleet"),
    ({"alpha-op": {}}, "relays.alpha-op", "operators"),
    ({"campus-relay": 40000}, "relays.campus-relay", "mapping"),
    ({"campus-relay": {"ports": 1}}, "relays.campus-relay.ports", "unknown key"),
    ({"campus-relay": {"port": 0}}, "relays.campus-relay.port", "1..65535"),
    ({"campus-relay": {"port": 70000}}, "relays.campus-relay.port", "1..65535"),
    ({"campus-relay": {"port": "40000"}}, "relays.campus-relay.port", "1..65535"),
    ({"campus-relay": {"static_endpoints": "1.2.3.4:1"}}, "relays.campus-relay.static_endpoints", "list"),
    ({"campus-relay": {"static_endpoints": ["relay.campus:40000"]}},
     "relays.campus-relay.static_endpoints[0]", "no host names"),
    ({"campus-relay": {"teams": ["alpha", "charlie"]}}, "relays.campus-relay.teams[1]", "unknown team"),
    ({"campus-relay": {"teams": []}}, "relays.campus-relay.teams", "non-empty"),
    ({"campus-relay": {"teams": "alpha"}}, "relays.campus-relay.teams", "'all' or"),
])
def test_errors_name_file_and_key(relays: Any, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        fleet_with(relays)
    assert e.value.key == key and e.value.file == "fleet.yaml" and words in str(e.value)
    assert str(e.value).startswith(f"fleet.yaml: {key}: ")


def test_relay_tags_and_owners() -> None:
    f = fleet_with({"campus-relay": {}})
    assert f.host_tags("campus-relay") == ["tag:team-alpha", "tag:base-station", "tag:relay",
                                           "tag:relay-campus-relay"]
    assert f.host_tags("alpha-robot1") == ["tag:team-alpha", "tag:robot"]
    p = policy.generate_policy(f)
    assert {"tag:relay", "tag:relay-campus-relay"} <= set(p["tagOwners"])


def test_policy_grants_and_visibility() -> None:
    f = fleet_with({"campus-relay": {}})
    p = policy.generate_policy(f)
    assert p["grants"] == [{
        "src": ["tag:team-alpha", "tag:ops-alpha", "tag:team-bravo", "tag:ops-bravo"],
        "dst": ["tag:relay-campus-relay"],
        "app": {RELAY_CAP: []},
    }]
    # bravo is not the relay's team: it may only ping the relay (to see it in its netmap)
    assert {"action": "accept", "proto": "icmp", "src": ["tag:team-bravo", "tag:ops-bravo"],
            "dst": ["tag:relay-campus-relay:*"]} in p["acls"]
    assert policy.may_use_relay(f, "bravo-robot1", "campus-relay")
    assert policy.may_use_relay(f, "alpha-op", "campus-relay")
    assert policy.can_ping(f, "bravo-robot1", "campus-relay")


def test_team_isolation_holds_with_a_relay() -> None:
    f = fleet_with({"campus-relay": {}})
    ok = policy.allowed
    # a relay opens no path between teams, nor into the relay host for other teams
    for a in ("alpha-robot1", "alpha-robot2", "campus-relay", "alpha-op"):
        for b in ("bravo-robot1", "bravo-op"):
            assert not ok(f, a, b) and not ok(f, b, a)
    assert not ok(f, "bravo-robot1", "campus-relay") and not ok(f, "bravo-op", "campus-relay")
    assert not ok(f, "campus-relay", "bravo-robot1")
    assert not policy.can_ping(f, "bravo-robot1", "alpha-robot1")
    # the relay's own team keeps its rules
    assert ok(f, "alpha-robot1", "campus-relay") and ok(f, "campus-relay", "alpha-robot1")
    # team not served: no grant, no visibility rule
    g = fleet_with({"campus-relay": {"teams": ["alpha"]}})
    assert not policy.may_use_relay(g, "bravo-robot1", "campus-relay")
    assert not policy.can_ping(g, "bravo-robot1", "campus-relay")
    assert all(r.get("proto") != "icmp" for r in policy.generate_policy(g)["acls"])


def test_no_relays_no_grants() -> None:
    p = policy.generate_policy(load_fleet_dict(fleet_data(TEAMS), "fleet.yaml"))
    assert "grants" not in p and "tag:relay" not in p["tagOwners"]


def test_example_fleet_file_has_a_valid_relay() -> None:
    from overlay_manager.fleet.config import load_fleet
    f = load_fleet(REPO / "config" / "fleet.example.yaml")
    assert f.relays, "config/fleet.example.yaml documents the relays section"
    text = policy.render_policy(f)
    assert RELAY_CAP in text


def test_bundle_robot_config_has_relay_key(tmp_path: Path) -> None:
    from overlay_manager.core.config import parse_robot_config
    from overlay_manager.fleet.bundle import robot_config
    from overlay_manager.fleet.deploy import Deployment

    f = fleet_with({"campus-relay": {"static_endpoints": ["192.0.2.1:40000"]}})
    dep = Deployment(tmp_path, "lab", "https://10.231.0.2:8443", "fleet.internal", None, "headscale")
    cfg = robot_config(dep, f, "campus-relay")
    assert cfg["relay"] == {"port": 40000, "static_endpoints": ["192.0.2.1:40000"]}
    assert "relay" not in robot_config(dep, f, "alpha-robot1")
    text = yaml.safe_dump(cfg)
    parsed = parse_robot_config(yaml.safe_load(text), str(tmp_path / "robot.yaml"))
    assert parsed.relay is not None and parsed.relay.port == 40000
    assert parsed.relay.static_endpoints == ("192.0.2.1:40000",)


# ----- the lab spec's relays and campus building modes --------------------------------------------
LAB = {
    "name": "relaytest",
    "buildings": {
        "campus": {"nat": "public", "hosts": {"relay1": {"team": "alpha", "role": "base_station"}}},
        "sym1": {"nat": "adpm-adpf", "hosts": {"robot3": {"team": "alpha"}}},
        "guest": {"nat": "udp-servers", "hosts": {"robot5": {"team": "alpha"}}},
        "ops": {"nat": "eim", "hosts": {"laptop": {"team": "alpha", "role": "operator"}}},
    },
    "relays": {"relay1": {"port": 41000}},
}


def test_lab_spec_relays_and_modes() -> None:
    from overlay_manager.lab.campus.spec import parse_spec, spec_to_dict
    from overlay_manager.lab.campus.spec_model import RelaySpec, parse_nat_kind

    spec = parse_spec(copy.deepcopy(LAB), "lab.yaml")
    assert spec.relays == {"relay1": RelaySpec("relay1", 41000, ())}
    assert spec.building("campus").nat.public and spec.building("campus").nat.name == "public"
    assert parse_nat_kind("udp-servers").udp == "servers"
    assert parse_nat_kind("udp-servers").name == "udp-servers"
    assert not parse_nat_kind("eim-adpf").public
    assert parse_spec(spec_to_dict(spec), "lab.yaml") == spec


@pytest.mark.parametrize("relays,key", [
    ({"nobody": {}}, "relays.nobody"),
    ({"laptop": {}}, "relays.laptop"),
    ({"relay1": {"port": 0}}, "relays.relay1.port"),
    ({"relay1": {"teams": ["bravo"]}}, "relays.relay1.teams[0]"),
    ({"relay1": {"prot": 1}}, "relays.relay1.prot"),
])
def test_lab_spec_relay_errors(relays: Any, key: str) -> None:
    from overlay_manager.lab.campus.spec import parse_spec

    data = copy.deepcopy(LAB)
    data["relays"] = relays
    with pytest.raises(ConfigError) as e:
        parse_spec(data, "lab.yaml")
    assert e.value.key == key and str(e.value).startswith(f"lab.yaml: {key}: ")
