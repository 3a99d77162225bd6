"""The lab's campus building modes for peer relays: ``public`` (a routed server network) and
``udp-servers`` (UDP only to STUN and the relays' ports), as nft rulesets (text; with root also
``nft --check`` in a throw-away namespace-free check that commits nothing)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from overlay_manager.lab.campus.nft import router_ruleset
from overlay_manager.lab.campus.spec_model import parse_nat_kind

WAN, CTL, STUN = "10.231.0.10", "10.231.0.2", 3478
RELAYS = [("10.231.12.10", 40000), ("10.231.13.10", 41000)]


def test_udp_servers_lets_only_stun_and_relays_through() -> None:
    text = router_ruleset(parse_nat_kind("udp-servers"), WAN, CTL, STUN, RELAYS)
    accepts = [line.strip() for line in text.splitlines() if "udp dport" in line]
    assert accepts == [
        f'iifname "br0" oifname "wan" ip daddr {CTL} udp dport {STUN} accept',
        'iifname "br0" oifname "wan" ip daddr 10.231.12.10 udp dport 40000 accept',
        'iifname "br0" oifname "wan" ip daddr 10.231.13.10 udp dport 41000 accept',
    ]
    lines = [line.strip() for line in text.splitlines()]
    # the drop comes after the accepts and before the general accept
    drop = lines.index('iifname "br0" oifname "wan" meta l4proto udp drop')
    assert drop > max(lines.index(a) for a in accepts)
    assert drop < lines.index('iifname "br0" oifname "wan" accept')
    assert 'oifname "wan" masquerade' in text  # TCP (DERP over HTTPS) still works
    # the relays' ports are not opened by the other kinds
    for kind in ("eim-adpf", "udp-blocked", "tcp-only"):
        assert "udp dport 40000" not in router_ruleset(parse_nat_kind(kind), WAN, CTL, STUN, RELAYS)


def test_public_routes_without_nat() -> None:
    text = router_ruleset(parse_nat_kind("public"), WAN, CTL, STUN, RELAYS)
    assert "masquerade" not in text and "snat" not in text and "dnat" not in text
    assert "type filter hook forward priority filter; policy accept;" in text
    assert "type filter hook input priority filter; policy drop;" in text
    assert "jump actions" in text  # block-udp and cut still work on it


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None, reason="nft --check needs root and nft")
@pytest.mark.parametrize("kind", ["udp-servers", "public"])
def test_nft_accepts(kind: str) -> None:
    text = router_ruleset(parse_nat_kind(kind), WAN, CTL, STUN, RELAYS)
    # as in test_lab_nft: --check of "delete table" fails when the table is absent
    body = text.replace("delete table inet olab\n", "")
    res = subprocess.run(["nft", "--check", "-f", "-"], input=body, text=True, capture_output=True, check=False)
    assert res.returncode == 0, res.stderr


def test_matrix_model_with_relay() -> None:
    from overlay_manager.lab.matrix.model import expected, expected_with_relay

    assert expected("adpm-adpf", "adpm-adpf")[0] == "derp"
    assert expected_with_relay("adpm-adpf", "adpm-adpf")[0] == "peer-relay"
    assert expected_with_relay("eim-adpf", "adpm-adpf")[0] == "peer-relay"
    assert expected_with_relay("eim-eif", "adpm-adpf")[0] == "direct"  # direct stays direct
    assert expected_with_relay("udp-servers", "adpm-adpf")[0] == "peer-relay"
    assert expected("udp-servers", "eim-eif")[0] == "derp"  # no UDP to the peer itself
    assert expected_with_relay("udp-blocked", "eim-eif") == ("derp", "udp-blocked: no UDP to the relay")
    assert expected_with_relay("eim", "tcp-only")[0] == "derp"


def test_matrix_relay_spec_and_report() -> None:
    from overlay_manager.lab.campus.spec import parse_spec
    from overlay_manager.lab.matrix.model import RELAY_KINDS, cells, matrix_spec
    from overlay_manager.lab.matrix.run import render_relay_markdown

    spec = parse_spec(matrix_spec(relay=True), "nat_matrix_relay")
    assert list(spec.relays) == ["relay"] and spec.building("campus").nat.public
    assert len(RELAY_KINDS) == 12 and len(cells(RELAY_KINDS)) == 12 * 13 // 2
    assert "relays" not in matrix_spec() and "campus" not in matrix_spec()["buildings"]
    plain = [{"a": "adpm-adpf", "b": "adpm-adpf", "expected": "derp", "observed": "derp", "via": "lab",
              "reason": "r"},
             {"a": "eim-eif", "b": "eim-eif", "expected": "direct", "observed": "direct", "via": "x", "reason": "r"}]
    relayed = [{"a": "adpm-adpf", "b": "adpm-adpf", "expected": "peer-relay", "observed": "peer-relay",
                "via": "10.231.22.10:40000:vni:1", "reason": "r2"}]
    meta = {"date": "d", "tailscale": "t", "headscale": "h", "relay_wait_s": 15, "count": 10, "seconds": 1,
            "agree": 2, "cells": 2, "relay_agree": 2, "derp_before": 1, "derp_after": 0, "peer_relay_after": 1}
    text = render_relay_markdown(plain, relayed, meta)
    assert "## Without the relay" in text and "## With the relay" in text
    assert "| adpm-adpf | adpm-adpf | derp | peer-relay | peer-relay | 10.231.22.10:40000:vni:1 | r2 |" in text


def test_runtime_udp_servers_only_action() -> None:
    from overlay_manager.lab.campus.nft import actions_ruleset

    text = actions_ruleset(udp_blocked=True, udp_servers=[("10.231.0.2", 3478), ("10.231.12.10", 40000)])
    lines = text.splitlines()
    drop = next(i for i, line in enumerate(lines) if "meta l4proto udp drop" in line)
    for rule in ("ip daddr 10.231.12.10 udp dport 40000 accept", "ip saddr 10.231.12.10 udp sport 40000 accept",
                 "ip daddr 10.231.0.2 udp dport 3478 accept"):
        assert any(rule in line and i < drop for i, line in enumerate(lines)), rule
    assert "accept" not in actions_ruleset(udp_blocked=True)
