"""Router rulesets per NAT kind, runtime actions and impairment fallbacks (pure text checks).

The rulesets are also syntax-checked with ``nft --check`` when nft is installed and we are root
(``nft -c`` needs CAP_NET_ADMIN; it changes nothing).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import unittest

from overlay_manager.lab.campus import impair
from overlay_manager.lab.campus.nft import actions_ruleset, router_ruleset
from overlay_manager.lab.campus.spec_model import Impairment, nat_kind_names, parse_nat_kind

WAN, CTL, STUN = "10.231.0.10", "10.231.0.2", 3478


def rules(kind: str) -> str:
    return router_ruleset(parse_nat_kind(kind), WAN, CTL, STUN)


def can_check() -> bool:
    return os.geteuid() == 0 and shutil.which("nft") is not None


class RulesetTest(unittest.TestCase):
    def test_input_policy_drop_everywhere(self) -> None:
        for kind in nat_kind_names():
            if kind == "public":  # a routed server network (no NAT): see test_lab_relays.py
                continue
            text = rules(kind)
            self.assertIn("type filter hook input priority filter; policy drop;", text)
            self.assertIn("ct state established,related accept", text)
            self.assertIn('iifname "br0" accept', text)
            self.assertIn("type filter hook forward priority filter; policy drop;", text)
            self.assertIn("jump actions", text)
            self.assertIn('oifname "wan" masquerade', text)  # TCP (DERP over HTTPS) always works

    def test_mapping(self) -> None:
        self.assertIn(f"snat ip to {WAN} : jhash ip saddr . udp sport mod", rules("eim-adpf"))
        self.assertIn(f"snat ip to {WAN} : jhash ip saddr . udp sport . ip daddr mod", rules("adm-adpf"))
        self.assertIn("masquerade fully-random", rules("adpm-adpf"))
        self.assertNotIn("fully-random", rules("eim-adpf"))

    def test_filtering(self) -> None:
        adpf = rules("eim-adpf")
        self.assertNotIn("@mapped", adpf)
        self.assertNotIn("ct status dnat", adpf)
        eif = rules("eim-eif")
        self.assertIn("update @mapped { udp sport : ct original ip saddr . ct original proto-src }", eif)
        self.assertIn("ct state new dnat ip to udp dport map @mapped", eif)
        self.assertNotIn("@contacted", eif)
        adf = rules("adpm-adf")
        self.assertIn("update @contacted { udp sport . ip daddr }", adf)
        self.assertIn("udp dport . ip saddr @contacted dnat ip to udp dport map @mapped", adf)
        self.assertIn('iifname "wan" oifname "br0" ct status dnat accept', adf)

    def test_udp_policies(self) -> None:
        blocked = rules("udp-blocked")
        self.assertIn(f"ip daddr {CTL} udp dport {STUN} accept", blocked)
        self.assertIn('iifname "br0" oifname "wan" meta l4proto udp drop', blocked)
        self.assertLess(blocked.index(f"udp dport {STUN} accept"), blocked.index("meta l4proto udp drop"))
        tcp_only = rules("tcp-only")
        self.assertNotIn(f"udp dport {STUN} accept", tcp_only)
        self.assertIn('iifname "br0" oifname "wan" meta l4proto udp drop', tcp_only)

    def test_replaces_atomically(self) -> None:
        text = rules("eim")
        self.assertTrue(text.splitlines()[1:3] == ["table inet olab", "delete table inet olab"])

    def test_actions(self) -> None:
        self.assertEqual(actions_ruleset(), "flush chain inet olab actions\n")
        self.assertIn("meta l4proto udp drop", actions_ruleset(udp_blocked=True))
        cut = actions_ruleset(cut=True)
        self.assertIn('oifname "wan" drop', cut)
        self.assertIn('iifname "wan" drop', cut)
        self.assertNotIn("udp", cut)

    @unittest.skipUnless(can_check(), "nft --check needs root and nft")
    def test_nft_accepts_every_ruleset(self) -> None:
        # --check parses and validates against the kernel without committing; the router
        # rulesets reference interface names only as strings, so no namespace is needed.
        for kind in nat_kind_names():
            text = rules(kind).replace("delete table inet olab\n", "")
            with self.subTest(kind=kind):
                res = subprocess.run(["nft", "--check", "-f", "-"], input=text, text=True,
                                     capture_output=True, check=False)
                self.assertEqual(res.returncode, 0, res.stderr)


class ImpairFallbackTest(unittest.TestCase):
    def test_tbf_and_loss(self) -> None:
        argv = impair.tbf_argv("wan", 100)
        self.assertEqual(argv[:7], ["tc", "qdisc", "replace", "dev", "wan", "root", "tbf"])
        self.assertIn("100mbit", argv)
        text = impair.loss_ruleset("eth0", 2.5)
        self.assertIn('hook ingress device "eth0"', text)
        self.assertIn("numgen random mod 1000000 < 25000 drop", text)
        self.assertNotIn("numgen", impair.loss_ruleset("eth0", 0))
        total = impair.loss_ruleset("eth0", 100)
        self.assertIn('loss_eth0 drop comment "lab impair loss 100%"', total)
        self.assertNotIn("numgen", total)

    def test_delay_needs_netem(self) -> None:
        self.assertIsNone(impair.fallback_supported(Impairment(loss_pct=1, rate_mbit=10)))
        self.assertIn("netem", impair.fallback_supported(Impairment(delay_ms=10)) or "")


if __name__ == "__main__":
    unittest.main()
