"""ACL policy generation and the pure parts of deployment/bundle code (no headscale needed)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import yaml

from overlay_manager.fleet import policy
from overlay_manager.fleet.config import load_fleet, load_fleet_dict
from overlay_manager.fleet.deploy import Deployment, headscale_config
from overlay_manager.fleet.headscale import HeadscaleCLI, parse_time
from overlay_manager.fleet.model import FleetError

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture()
def fleet():
    return load_fleet(REPO / "config" / "fleet.example.yaml")


def test_policy_rules(fleet) -> None:
    p = policy.generate_policy(fleet)
    assert p["acls"] == [
        {"action": "accept", "src": ["tag:team-alpha"], "dst": ["tag:team-alpha:*", "tag:ops-alpha:*"]},
        {"action": "accept", "src": ["tag:ops-alpha"], "dst": ["tag:team-alpha:*"]},
        {"action": "accept", "src": ["tag:team-bravo"], "dst": ["tag:team-bravo:*", "tag:ops-bravo:*"]},
        {"action": "accept", "src": ["tag:ops-bravo"], "dst": ["tag:team-bravo:*"]},
        # the relay campus-relay (team alpha) serves bravo too: bravo may only ping it
        {"action": "accept", "proto": "icmp", "src": ["tag:team-bravo", "tag:ops-bravo"],
         "dst": ["tag:relay-campus-relay:*"]},
        # the DERP hosts (east-derp, west-derp): every team may ping them, so their tailscaled
        # knows every machine (derper --verify-clients)
        {"action": "accept", "proto": "icmp",
         "src": ["tag:team-alpha", "tag:ops-alpha", "tag:team-bravo", "tag:ops-bravo"], "dst": ["tag:derp:*"]},
    ]
    # every tag used anywhere (rules and hosts) has an owner, the fleet user
    used = {t for r in p["acls"] for t in r["src"] + [d.rsplit(":", 1)[0] for d in r["dst"]]}
    used |= {t for h in fleet.hosts for t in fleet.host_tags(h)}
    assert used <= set(p["tagOwners"])
    assert all(v == ["lab@"] for v in p["tagOwners"].values())


def test_policy_reachability(fleet) -> None:
    ok = policy.allowed
    assert ok(fleet, "alpha-robot1", "alpha-robot2")
    assert ok(fleet, "alpha-robot1", "alpha-base")
    assert ok(fleet, "alpha-base", "alpha-robot1")
    assert ok(fleet, "alpha-op", "alpha-robot1")
    assert ok(fleet, "alpha-robot1", "alpha-op")  # ROS 1 callbacks to the operator's nodes
    assert not ok(fleet, "alpha-robot1", "bravo-robot1")
    assert not ok(fleet, "bravo-robot1", "alpha-robot1")
    assert not ok(fleet, "alpha-op", "bravo-robot1")
    assert not ok(fleet, "bravo-op", "alpha-base")
    assert not ok(fleet, "alpha-op", "bravo-op")


def test_render_is_hujson_and_deterministic(fleet) -> None:
    text = policy.render_policy(fleet)
    assert text == policy.render_policy(fleet)
    body = "\n".join(line for line in text.splitlines() if not line.startswith("//"))
    assert json.loads(body) == policy.generate_policy(fleet)


def test_headscale_config_is_offline(fleet, tmp_path: Path) -> None:
    cfg = headscale_config(fleet, tmp_path, tmp_path / "c.crt", tmp_path / "c.key")
    assert cfg["server_url"] == "https://10.231.0.2:8443"
    assert cfg["derp"]["urls"] == [] and cfg["derp"]["server"]["enabled"] is True
    assert cfg["derp"]["server"]["stun_listen_addr"] == "0.0.0.0:3478"
    assert cfg["derp"]["auto_update_enabled"] is False
    assert cfg["disable_check_updates"] is True and cfg["logtail"]["enabled"] is False
    assert cfg["dns"]["override_local_dns"] is False and cfg["dns"]["magic_dns"] is True
    assert cfg["dns"]["base_domain"] == "fleet.internal"
    assert cfg["policy"] == {"mode": "file", "path": str(tmp_path / "policy.hujson")}
    assert cfg["tls_cert_path"] == str(tmp_path / "c.crt")
    assert cfg["unix_socket"] == str(tmp_path / "run" / "headscale.sock")
    yaml.safe_dump(cfg)


def test_robot_config_matches_robot_example(fleet, tmp_path: Path) -> None:
    from overlay_manager.fleet.bundle import robot_config

    dep = Deployment(root=tmp_path, fleet_name="lab", server_url="https://10.231.0.2:8443",
                     base_domain="fleet.internal", ca_cert=tmp_path / "ca.crt", headscale="/bin/false")
    cfg = robot_config(dep, fleet, "alpha-robot2", {"tailscale": {"socket": "/tmp/x.sock"}})
    example = yaml.safe_load((REPO / "config" / "robot.example.yaml").read_text())
    assert set(cfg) <= set(example)
    assert {k for k in example if k not in ("tailscale", "node")} <= set(cfg)
    assert cfg["hostname"] == "alpha-robot2" and cfg["master"] == "alpha-base"
    assert cfg["tags"] == ["tag:team-alpha", "tag:robot"]
    assert cfg["auth_key_file"] == "auth.key" and cfg["ca_cert"] == "ca.crt"
    assert cfg["tailscale"] == {"socket": "/tmp/x.sock"}


def test_parse_time() -> None:
    t = parse_time({"seconds": 1795311866, "nanos": 5})
    assert t is not None and t.year == 2026 and t.tzinfo is not None
    assert parse_time({"seconds": -62135596800}) is None
    assert parse_time(None) is None
    assert parse_time("2026-11-22T00:44:23.123456789Z").microsecond == 123456


SECRET = "hskey-auth-SECRETSECRET-0123456789abcdef"


def _fake_headscale(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "headscale"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_cli_errors_never_contain_the_key(tmp_path: Path) -> None:
    exe = _fake_headscale(tmp_path, f'echo \'{{"key": "{SECRET}"\'; echo "boom {SECRET}" >&2; exit 1')
    cli = HeadscaleCLI(exe, tmp_path / "config.yaml")
    with pytest.raises(FleetError) as info:
        cli.create_preauth_key(["tag:robot"], 3600)
    # stderr of a secret-producing command may still echo it: it must not reach the message
    assert "preauthkeys create" in str(info.value) and SECRET not in str(info.value)
    exe = _fake_headscale(tmp_path, f'echo "not json {SECRET}"')
    with pytest.raises(FleetError) as info:
        cli.create_preauth_key(["tag:robot"], 3600)
    assert SECRET not in str(info.value)


def test_cli_create_key_parses(tmp_path: Path) -> None:
    exe = _fake_headscale(tmp_path, 'echo \'{"id": 7, "key": "' + SECRET + '", "acl_tags": ["tag:robot"], '
                                    '"expiration": {"seconds": 4102444800}}\'')
    meta, secret = HeadscaleCLI(exe, tmp_path / "c.yaml").create_preauth_key(["tag:robot"], 60)
    assert secret == SECRET and meta.id == 7 and meta.tags == ("tag:robot",)
    assert SECRET not in repr(meta)


def test_cli_unreachable_headscale_hint(tmp_path: Path) -> None:
    exe = _fake_headscale(tmp_path, 'echo \'{"error": "connecting to headscale: context deadline exceeded"}\'; exit 1')
    with pytest.raises(FleetError, match="not running or not reachable"):
        HeadscaleCLI(exe, tmp_path / "c.yaml").list_nodes()


def test_fleet_error_format() -> None:
    e = FleetError("bad", file="f.yaml", key="teams.a", host="r1")
    assert str(e) == "f.yaml: key 'teams.a': host 'r1': bad"
    assert load_fleet_dict({"fleet": "x", "base_domain": "a.b", "server": {"url": "http://1.2.3.4"},
                            "teams": {"a": {"robots": ["r"]}}}).server.listen == "0.0.0.0:80"
