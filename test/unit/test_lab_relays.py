"""The lab's campus building modes for peer relays: ``public`` (a routed server network) and
``udp-servers`` (UDP only to STUN and the relays' ports), as nft rulesets (text; with root also
``nft --check`` in a throw-away namespace-free check that commits nothing)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from overlay_manager.lab.nft import router_ruleset
from overlay_manager.lab.spec import parse_nat_kind

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
