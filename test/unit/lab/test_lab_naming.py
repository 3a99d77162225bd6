"""Run-scoped names and the address plan of the lab (overlay_manager.lab.campus.naming); ping parsing."""
from __future__ import annotations

import unittest

from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.naming import (
    IFNAME_MAX,
    Names,
    check_run_id,
    new_run_id,
    run_id_of_namespace,
)
from overlay_manager.lab.campus.spec import parse_spec
from overlay_manager.lab.campus.tailscaled import parse_ping_output

SPEC = parse_spec({"buildings": {
    "b1": {"nat": "eim", "hosts": ["robot1", "robot2"]},
    "b2": {"nat": "adpm", "hosts": {"a-very-long-host-name-x": {"role": "operator"}}},
}})


class NamesTest(unittest.TestCase):
    def setUp(self) -> None:
        self.n = Names(SPEC, "r42")

    def test_namespaces_are_scoped_and_recognised(self) -> None:
        all_ns = self.n.all_namespaces()
        self.assertEqual(all_ns[:2], ["olabr42-bb", "olabr42-ctl"])
        self.assertIn("olabr42-r-b1", all_ns)
        self.assertIn("olabr42-h-robot2", all_ns)
        self.assertEqual(len(set(all_ns)), len(all_ns))
        for ns in all_ns:
            self.assertTrue(ns.startswith(self.n.prefix))
            self.assertEqual(run_id_of_namespace(ns), "r42")
        self.assertIsNone(run_id_of_namespace("omrec-a"))
        self.assertIsNone(run_id_of_namespace("olab-x"))

    def test_two_runs_never_share_a_name(self) -> None:
        other = Names(SPEC, "r43")
        self.assertFalse(set(self.n.all_namespaces()) & set(other.all_namespaces()))

    def test_interface_names_fit(self) -> None:
        for link in SPEC.link_names():
            for end in self.n.link_endpoints(link):
                self.assertLessEqual(len(end.ifname), IFNAME_MAX, end)
        self.assertEqual(self.n.link_endpoints("b2")[0].ifname, "wan")
        self.assertEqual(self.n.link_endpoints("b2")[1].ifname, "r1")
        self.assertEqual(self.n.link_endpoints("robot2")[1].ifname, "h1")

    def test_address_plan(self) -> None:
        self.assertEqual(self.n.control_address, "10.231.0.2")
        self.assertEqual(self.n.router_wan_address("b2"), "10.231.0.11")
        self.assertEqual(self.n.router_lan_address("b1"), "10.231.10.1")
        self.assertEqual(self.n.host_address("robot2"), "10.231.10.11")
        self.assertEqual(self.n.host_address("a-very-long-host-name-x"), "10.231.11.10")
        self.assertEqual(self.n.lan_cidr("b2"), "10.231.11.0/24")
        self.assertEqual(self.n.server_url, "https://10.231.0.2:8443")

    def test_lookup_errors(self) -> None:
        self.assertEqual(self.n.namespace_of("b1"), "olabr42-r-b1")
        self.assertEqual(self.n.namespace_of("control"), "olabr42-ctl")
        with self.assertRaises(LabError) as cm:
            self.n.namespace_of("robot9")
        self.assertIn("robot9", str(cm.exception))
        with self.assertRaises(LabError):
            self.n.link_endpoints("nowhere")

    def test_run_ids(self) -> None:
        self.assertRegex(new_run_id(), r"^[0-9a-f]{4}$")
        self.assertEqual(check_run_id("abc123"), "abc123")
        for bad in ("", "UPPER", "toolongid9", "a-b", "../x"):
            with self.assertRaises(LabError):
                check_run_id(bad)
            with self.assertRaises(LabError):
                Names(SPEC, bad)


class PingOutputTest(unittest.TestCase):
    def test_direct(self) -> None:
        r = parse_ping_output("pong from robot1 (100.64.0.1) via 10.231.0.10:32634 in 1ms\n")
        self.assertEqual((r.path, r.via, r.latency_ms), ("direct", "10.231.0.10:32634", 1.0))

    def test_derp_then_direct_takes_last(self) -> None:
        text = ("pong from robot1 (100.64.0.1) via DERP(fleet) in 3ms\n"
                "pong from robot1 (100.64.0.1) via 10.231.0.10:41641 in 0s\n")
        self.assertEqual(parse_ping_output(text).path, "direct")

    def test_derp_only(self) -> None:
        text = ("pong from laptop (100.64.0.2) via DERP(fleet) in 2ms\n" * 3
                + "direct connection not established\n")
        r = parse_ping_output(text)
        self.assertEqual((r.path, r.via, r.latency_ms), ("derp", "fleet", 2.0))

    def test_no_pong(self) -> None:
        self.assertEqual(parse_ping_output("ping \"100.64.0.9\" timed out\n").path, "none")


if __name__ == "__main__":
    unittest.main()
