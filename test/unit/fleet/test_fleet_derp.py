"""The fleet file's derp_regions section: validation naming the key, the DERP map headscale reads,
the policy that lets derper's --verify-clients know every machine, the derper host's bundle
(certificate from the fleet CA, unit from the template, robot.yaml ``derper`` key), the robot
config's ``derper`` key and the parsing of derper's /debug/vars (pure, plus real openssl)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from overlay_manager.core.validation import ConfigError
from overlay_manager.fleet import derp, policy
from overlay_manager.fleet.config import load_fleet, load_fleet_dict
from overlay_manager.testing.fleet_files import fleet_data

REPO = Path(__file__).resolve().parents[3]

TEAMS: Dict[str, Any] = {
    "alpha": {"robots": ["alpha-robot1"], "base_stations": ["east-derp", "west-derp"],
              "operators": ["alpha-op"]},
    "bravo": {"robots": ["bravo-robot1"], "operators": ["bravo-op"]},
}
EAST = {"id": 901, "name": "East campus", "servers": [{"host": "east-derp", "address": "10.231.12.10"}]}
WEST = {"id": 902, "servers": [{"host": "west-derp", "address": "10.231.13.10", "hostname": "Derp-West.campus.example.",
                                "port": 8443, "stun_port": 3479, "http_port": 8080}]}


def fleet_with(regions: Any, **server_derp: Any) -> Any:
    server: Dict[str, Any] = {"url": "https://10.231.0.2:8443"}
    if server_derp:
        server["derp"] = server_derp
    return load_fleet_dict(fleet_data(TEAMS, derp_regions=regions, server=server), "fleet.yaml")


def test_defaults_and_canonical_values() -> None:
    f = fleet_with({"east": EAST, "west": WEST})
    east, west = f.derp_regions["east"], f.derp_regions["west"]
    assert (east.id, east.name, east.meshed) == (901, "East campus", False)
    assert east.servers == (derp.DerpServer("east-derp", "east", "10.231.12.10", "10.231.12.10", 443, 3478, 3340),)
    s = west.servers[0]
    assert west.name == "west" and s.hostname == "derp-west.campus.example" and (s.port, s.stun_port) == (8443, 3479)
    assert s.cert_names == ["derp-west.campus.example", "10.231.13.10"] and s.debug_url == "http://127.0.0.1:8080"
    assert load_fleet_dict(fleet_data(TEAMS), "fleet.yaml").derp_regions == {}


@pytest.mark.parametrize("regions,key,words", [
    (["east"], "derp_regions", "mapping"),
    ({"East_1": EAST}, "derp_regions.East_1", "DNS label"),
    ({"east": {**EAST, "id": 899}}, "derp_regions.east.id", "[900, 999]"),
    ({"east": {**EAST, "id": "901"}}, "derp_regions.east.id", "integer"),
    ({"east": EAST, "west": {**WEST, "id": 901}}, "derp_regions.west.id", "already used by region 'east'"),
    ({"east": {**EAST, "id": 999}}, "derp_regions.east.id", "embedded DERP"),
    ({"east": {"id": 901}}, "derp_regions.east.servers", "required"),
    ({"east": {**EAST, "servers": []}}, "derp_regions.east.servers", "non-empty"),
    ({"east": {**EAST, "zone": 1}}, "derp_regions.east.zone", "unknown key"),
    ({"east": {**EAST, "servers": [{"host": "nobody", "address": "10.0.0.1"}]}},
     "derp_regions.east.servers[0].host", "not a host of the fleet"),
    ({"east": {**EAST, "servers": [{"host": "alpha-op", "address": "10.0.0.1"}]}},
     "derp_regions.east.servers[0].host", "operators"),
    ({"east": {**EAST, "servers": [{"host": "east-derp"}]}}, "derp_regions.east.servers[0].address", "required"),
    ({"east": {**EAST, "servers": [{"host": "east-derp", "address": "derp.example"}]}},
     "derp_regions.east.servers[0].address", "IPv4"),
    ({"east": {**EAST, "servers": [{"host": "east-derp", "address": "127.0.0.1"}]}},
     "derp_regions.east.servers[0].address", "cannot be dialled"),
    ({"east": {**EAST, "servers": [{"host": "east-derp", "address": "10.0.0.1", "hostname": "bad name"}]}},
     "derp_regions.east.servers[0].hostname", "DNS name"),
    ({"east": {**EAST, "servers": [{"host": "east-derp", "address": "10.0.0.1", "port": 0}]}},
     "derp_regions.east.servers[0].port", "1..65535"),
    ({"east": {**EAST, "servers": [{"host": "east-derp", "address": "10.0.0.1", "port": 80, "http_port": 80}]}},
     "derp_regions.east.servers[0].http_port", "must differ"),
    ({"east": {**EAST, "servers": [{"host": "east-derp", "address": "10.0.0.1"},
                                   {"host": "west-derp", "address": "10.0.0.1"}]}},
     "derp_regions.east.servers[1].port", "already used"),
    ({"east": {**EAST, "servers": [{"host": "east-derp", "address": "10.0.0.1", "ports": 1}]}},
     "derp_regions.east.servers[0].ports", "unknown key"),
])
def test_errors_name_file_and_key(regions: Any, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        fleet_with(regions)
    assert e.value.key == key and e.value.file == "fleet.yaml" and words in str(e.value)
    assert str(e.value).startswith(f"fleet.yaml: {key}: ")


def test_embedded_off_needs_regions_and_region_ids_are_free_then() -> None:
    with pytest.raises(ConfigError) as e:
        load_fleet_dict(fleet_data(TEAMS, server={"url": "https://10.231.0.2:8443", "derp": {"embedded": False}}),
                        "fleet.yaml")
    assert e.value.key == "server.derp" and "derp_regions" in str(e.value)
    f = fleet_with({"east": {**EAST, "id": 999}}, embedded=False)
    assert f.derp_regions["east"].id == 999 and not f.server.derp.embedded


def test_regions_need_the_fleet_ca() -> None:
    data = fleet_data(TEAMS, derp_regions={"east": EAST}, server={"url": "http://10.231.0.2:8080"})
    with pytest.raises(ConfigError) as e:
        load_fleet_dict(data, "fleet.yaml")
    assert e.value.key == "derp_regions" and "fleet CA" in str(e.value)


def test_derp_map_is_headscales_format() -> None:
    f = fleet_with({"east": EAST, "west": WEST})
    m = derp.derp_map(f.derp_regions)
    assert list(m) == ["regions"] and list(m["regions"]) == [901, 902]
    assert m["regions"][902] == {
        "regionid": 902, "regioncode": "west", "regionname": "west",
        "nodes": [{"name": "902a", "regionid": 902, "hostname": "derp-west.campus.example", "ipv4": "10.231.13.10",
                   "ipv6": "none", "stunport": 3479, "stunonly": False, "derpport": 8443}]}
    text = derp.render_derp_map(f.derp_regions, "fleet.yaml")
    assert text.startswith("# DERP regions") and yaml.safe_load(text) == m


def test_tags_and_policy_make_every_machine_visible_to_derper_hosts() -> None:
    f = fleet_with({"east": EAST})
    assert f.host_tags("east-derp") == ["tag:team-alpha", "tag:base-station", "tag:derp"]
    assert f.host_tags("west-derp") == ["tag:team-alpha", "tag:base-station"]
    p = policy.generate_policy(f)
    assert "tag:derp" in p["tagOwners"]
    assert {"action": "accept", "proto": "icmp",
            "src": ["tag:team-alpha", "tag:ops-alpha", "tag:team-bravo", "tag:ops-bravo"],
            "dst": ["tag:derp:*"]} in p["acls"]
    # visibility for --verify-clients, and no new connection across teams
    for h in ("alpha-robot1", "alpha-op", "bravo-robot1", "bravo-op"):
        assert policy.visible(f, h, "east-derp")
    assert not policy.allowed(f, "bravo-robot1", "east-derp") and not policy.allowed(f, "east-derp", "bravo-op")
    assert not policy.can_ping(f, "bravo-robot1", "alpha-robot1")
    assert "tag:derp" not in policy.generate_policy(load_fleet_dict(fleet_data(TEAMS), "f"))["tagOwners"]


def test_derper_args_and_unit_from_the_template() -> None:
    two = [EAST["servers"][0], {"host": "west-derp", "address": "10.231.13.10"}]
    f = fleet_with({"east": {**EAST, "servers": two}})
    reg = f.derp_regions["east"]
    assert reg.meshed
    args = derp.derper_args(reg.servers[0], reg, certdir="/c", socket="/s.sock", mesh_key_file="/c/mesh.key")
    assert args[:4] == ["-a", ":443", "-http-port", "3340"] and "--verify-clients" in args
    assert args[args.index("--socket") + 1] == "/s.sock" and args[args.index("-certmode") + 1] == "manual"
    assert args[args.index("-mesh-with") + 1] == "10.231.12.10/10.231.12.10,10.231.13.10/10.231.13.10"
    template = derp.template_path()
    unit = derp.derper_unit(template.read_text(), str(template), reg.servers[0], reg, fleet="lab",
                            derper_bin="/usr/local/bin/derper", certdir="/c", socket="/s.sock",
                            mesh_key_file="/c/mesh.key")
    assert "@" not in unit.replace("@HOST@", "")  # every placeholder filled
    assert "ExecStart=/usr/local/bin/derper -a :443 -http-port 3340" in unit and "TCP 443" in unit
    assert "Wants=network-online.target tailscaled.service" in unit
    assert not [line for line in unit.splitlines() if line.startswith(("Requires=", "BindsTo="))]
    with pytest.raises(KeyError) as e:
        derp.render_template("x @NOPE@", {}, "t.in")
    assert "t.in" in str(e.value) and "@NOPE@" in str(e.value)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_init_writes_the_map_and_bundle_writes_derper_files(tmp_path: Path) -> None:
    from overlay_manager.core.config import parse_robot_config
    from overlay_manager.fleet.bundle import robot_config, write_derper_files
    from overlay_manager.fleet.deploy import init_deployment, write_derp_map

    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump(fleet_data(TEAMS, derp_regions={"east": EAST, "west": WEST},
                                                    server={"url": "https://10.231.0.2:8443",
                                                            "derp": {"embedded": False}})))
    f = load_fleet(fleet_file)
    dep = init_deployment(f, tmp_path / "hs", "/bin/true")
    cfg = yaml.safe_load((dep.root / "config.yaml").read_text())
    assert cfg["derp"]["paths"] == [str(dep.derp_map_path)] and cfg["derp"]["server"]["enabled"] is False
    assert yaml.safe_load(dep.derp_map_path.read_text()) == derp.derp_map(f.derp_regions)
    assert not write_derp_map(dep.root, f)  # unchanged: not rewritten

    server = f.derp_regions["west"].servers[0]
    unit = write_derper_files(dep, f, server, tmp_path / "b" / "derper", socket="/run/ts.sock")
    out = unit.parent
    crt, key = out / "derp-west.campus.example.crt", out / "derp-west.campus.example.key"
    assert crt.exists() and (key.stat().st_mode & 0o777) == 0o600 and not (out / "mesh.key").exists()
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(dep.root / "tls" / "ca.crt"), str(crt)],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    sans = subprocess.run(["openssl", "x509", "-in", str(crt), "-noout", "-ext", "subjectAltName"],
                          capture_output=True, text=True, check=True).stdout
    assert "DNS:derp-west.campus.example" in sans and "IP Address:10.231.13.10" in sans
    assert "--socket /run/ts.sock" in unit.read_text() and "-a :8443" in unit.read_text()

    rc = robot_config(dep, f, "west-derp")
    assert rc["derper"] == {"url": "http://127.0.0.1:8080", "region": "west"}
    assert "derper" not in robot_config(dep, f, "alpha-robot1")
    parsed = parse_robot_config(yaml.safe_load(yaml.safe_dump(rc)), str(tmp_path / "robot.yaml"))
    assert parsed.derper is not None and parsed.derper.url == "http://127.0.0.1:8080"


@pytest.mark.parametrize("raw,key,words", [
    ({"url": "http://10.0.0.1:3340"}, "derper.url", "127.0.0.1"),
    ({"url": "https://127.0.0.1:3340"}, "derper.url", "http"),
    ({"region": "east"}, "derper.url", "required"),
    ({"url": "http://127.0.0.1:3340", "port": 1}, "derper.port", "unknown key"),
])
def test_robot_config_derper_key_errors(raw: Any, key: str, words: str) -> None:
    from overlay_manager.core.config import parse_robot_config

    data = {"hostname": "east-derp", "login_server": "https://10.231.0.2:8443", "base_domain": "fleet.internal",
            "master": "alpha-robot1", "derper": raw}
    with pytest.raises(ConfigError) as e:
        parse_robot_config(data, "robot.yaml")
    assert e.value.key == key and words in str(e.value)


def test_derper_vars_parsing_and_summary() -> None:
    from overlay_manager.core.config import DerperSettings
    from overlay_manager.tailscaled.derper import DerperState, derper_summary, parse_derper_vars

    st = parse_derper_vars({"derp": {"gauge_current_connections": 5, "gauge_current_home_connections": 3,
                                     "gauge_clients_total": 4, "bytes_received": 2_500_000, "bytes_sent": 1_000_000,
                                     "packets_received": 10, "packets_sent": "x", "version": "1.102.5"}}, 7.0)
    assert (st.listening, st.connections, st.home_connections, st.clients) == (True, 5, 3, 4)
    assert (st.bytes_received, st.bytes_sent, st.packets_sent, st.version, st.read_at) == (2_500_000, 1_000_000, 0,
                                                                                         "1.102.5", 7.0)
    bad = parse_derper_vars({"memstats": {}}, 1.0)
    assert not bad.listening and "no 'derp'" in bad.error
    s = DerperSettings("http://127.0.0.1:3340", "east")
    assert derper_summary(None, st) == ("", True)
    line, ok = derper_summary(s, st)
    assert ok and line == "derper region east: 5 connections (3 home), 4 clients, 2.5 MB in / 1.0 MB out"
    line, ok = derper_summary(s, DerperState(error="derper at x not answering: refused"))
    assert not ok and "not answering" in line


def test_example_fleet_file_documents_regions() -> None:
    f = load_fleet(REPO / "config" / "fleet.example.yaml")
    assert f.derp_regions, "config/fleet.example.yaml documents the derp_regions section"


# ----- the lab spec's derp section ------------------------------------------------------------------
LAB: Dict[str, Any] = {
    "name": "derptest",
    "buildings": {
        "east": {"nat": "public", "hosts": {"east-derp": {"team": "alpha", "role": "base_station"}}},
        "north": {"nat": "adpm-adpf", "hosts": {"alpha-robot1": {"team": "alpha"},
                                                "alpha-op1": {"team": "alpha", "role": "operator"}}},
    },
    "derp": {"embedded": False, "regions": {"east": {"id": 901, "name": "East campus", "servers": ["east-derp"]}}},
}


def test_lab_spec_derp_and_fleet_file() -> None:
    import copy

    from overlay_manager.lab.campus.control import fleet_dict
    from overlay_manager.lab.campus.naming import Names
    from overlay_manager.lab.campus.spec import parse_spec, spec_to_dict
    from overlay_manager.lab.campus.spec_model import DerpRegionSpec

    spec = parse_spec(copy.deepcopy(LAB), "lab.yaml")
    assert not spec.derp.embedded
    assert spec.derp.regions == {"east": DerpRegionSpec("east", 901, "East campus", ("east-derp",))}
    assert parse_spec(spec_to_dict(spec), "lab.yaml") == spec
    f = load_fleet_dict(fleet_dict(Names(spec, "t1")), "lab-fleet")
    s = f.derp_regions["east"].servers[0]
    assert (s.host, s.address, s.hostname) == ("east-derp", Names(spec, "t1").host_address("east-derp"),
                                               "east-derp.campus.internal")
    assert not f.server.derp.embedded and "tag:derp" in f.host_tags("east-derp")


@pytest.mark.parametrize("derp_section,key", [
    ({"regions": {"east": {"id": 901, "servers": ["alpha-robot1"]}}}, "derp.regions.east.servers[0]"),  # not public
    ({"regions": {"east": {"id": 901, "servers": ["nobody"]}}}, "derp.regions.east.servers[0]"),
    ({"regions": {"east": {"id": 999, "servers": ["east-derp"]}}}, "derp.regions.east.id"),  # the embedded id
    ({"regions": {"east": {"id": 901, "servers": []}}}, "derp.regions.east.servers"),
    ({"embedded": False}, "derp.embedded"),
    ({"regions": {"east": {"id": 901, "servers": ["east-derp"], "port": 1}}}, "derp.regions.east.port"),
])
def test_lab_spec_derp_errors(derp_section: Any, key: str) -> None:
    import copy

    from overlay_manager.lab.campus.spec import parse_spec

    data = copy.deepcopy(LAB)
    data["derp"] = derp_section
    with pytest.raises(ConfigError) as e:
        parse_spec(data, "lab.yaml")
    assert e.value.key == key and str(e.value).startswith(f"lab.yaml: {key}: ")
