"""Lab spec validation (overlay_manager.lab.campus.spec): errors name the file and the key. Pure."""
from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

from overlay_manager.lab.campus.errors import SpecError
from overlay_manager.lab.campus.spec import load_spec, parse_spec, spec_to_dict
from overlay_manager.lab.campus.spec_model import Impairment, NatKind, nat_kind_names, parse_nat_kind

REPO = Path(__file__).resolve().parents[3]


def minimal(**extra: object) -> dict:
    data = {"buildings": {"b1": {"nat": "eim", "hosts": ["robot1"]},
                          "b2": {"nat": "adpm", "hosts": {"laptop": {"role": "operator"}}}}}
    data.update(extra)
    return data


class NatKindTest(unittest.TestCase):
    def test_every_mapping_filtering_pair(self) -> None:
        for m in ("eim", "adm", "adpm"):
            for f in ("eif", "adf", "adpf"):
                kind = parse_nat_kind(f"{m}-{f}")
                self.assertEqual((kind.mapping, kind.filtering, kind.udp), (m, f, "open"))
                self.assertEqual(kind.name, f"{m}-{f}")

    def test_bare_mapping_means_adpf(self) -> None:
        self.assertEqual(parse_nat_kind("eim"), NatKind("eim", "adpf"))
        self.assertEqual(parse_nat_kind("adpm").name, "adpm-adpf")

    def test_udp_policies(self) -> None:
        self.assertEqual(parse_nat_kind("udp-blocked").udp, "stun-only")
        self.assertEqual(parse_nat_kind("tcp-only").udp, "none")
        self.assertEqual(parse_nat_kind("tcp-only").name, "tcp-only")

    def test_unknown_kind_lists_valid_names(self) -> None:
        with self.assertRaises(ValueError) as cm:
            parse_nat_kind("symmetric")
        self.assertIn("eim-adpf", str(cm.exception))
        self.assertEqual(len(nat_kind_names()), 9 + 3 + 4)  # + udp-blocked, tcp-only, udp-servers, public


class SpecTest(unittest.TestCase):
    def test_minimal_defaults(self) -> None:
        spec = parse_spec(minimal())
        self.assertEqual([b.name for b in spec.buildings], ["b1", "b2"])
        self.assertEqual(spec.control.port, 8443)
        self.assertEqual(spec.control.stun_port, 3478)
        self.assertEqual(spec.host("laptop").role, "operator")
        self.assertEqual(spec.host("robot1").team, "lab")
        self.assertEqual(spec.teams, {"lab": "robot1"})  # first robot of the team is its master
        self.assertEqual(spec.link_names(), ["control", "b1", "b2", "robot1", "laptop"])

    def test_round_trip_through_dict(self) -> None:
        spec = parse_spec(minimal(impair={"b2": {"delay_ms": 5, "loss_pct": 1}}), default_name="lab")
        self.assertEqual(parse_spec(spec_to_dict(spec), default_name="lab"), spec)

    def test_shipped_specs_are_valid(self) -> None:
        for path in sorted((REPO / "config" / "lab").glob("*.yaml")):
            with self.subTest(path=path.name):
                spec = load_spec(path)
                self.assertEqual(spec.source, str(path))
                self.assertGreaterEqual(len(spec.hosts), 2)

    def assertSpecError(self, data: object, key: str, words: str) -> None:  # noqa: N802
        with self.assertRaises(SpecError) as cm:
            parse_spec(data, source="spec.yaml")
        self.assertEqual(cm.exception.key, key)
        self.assertIn(words, str(cm.exception))
        self.assertTrue(str(cm.exception).startswith(f"spec.yaml: {key}: "))

    def test_errors_name_file_and_key(self) -> None:
        self.assertSpecError({"buildngs": {}}, "buildngs", "unknown key")
        self.assertSpecError({"buildings": {}}, "buildings", "non-empty")
        self.assertSpecError({"buildings": {"b1": {"hosts": ["a"]}}}, "buildings.b1.nat", "missing")
        self.assertSpecError({"buildings": {"b1": {"nat": "cone", "hosts": ["a"]}}}, "buildings.b1.nat",
                             "unknown NAT kind")
        self.assertSpecError({"buildings": {"B1": {"nat": "eim", "hosts": ["a"]}}}, "buildings.B1", "not a name")
        self.assertSpecError({"buildings": {"b1": {"nat": "eim", "hosts": []}}}, "buildings.b1.hosts", "1..")
        self.assertSpecError({"buildings": {"b1": {"nat": "eim", "hosts": ["control"]}}},
                             "buildings.b1.hosts[0]", "reserved")
        self.assertSpecError({"buildings": {"b1": {"nat": "eim", "hosts": {"a": {"role": "pilot"}}}}},
                             "buildings.b1.hosts.a.role", "not one of")
        self.assertSpecError({"buildings": {"b1": {"nat": "eim", "hosts": ["a"]},
                                            "b2": {"nat": "eim", "hosts": ["a"]}}},
                             "buildings.b2.hosts.a", "already used")
        self.assertSpecError({"buildings": {"b1": {"nat": "eim", "hosts": ["b1"]}}},
                             "buildings.b1.hosts.b1", "already used")
        self.assertSpecError(minimal(control={"port": 70000}), "control.port", "port number")
        self.assertSpecError(minimal(control={"base_domain": "nodots"}), "control.base_domain", "DNS domain")
        self.assertSpecError(minimal(impair={"b3": {}}), "impair.b3", "unknown link")
        self.assertSpecError(minimal(impair={"b1": {"loss_pct": 101}}), "impair.b1.loss_pct", "outside")
        self.assertSpecError(minimal(impair={"b1": {"jitter_ms": 3}}), "impair.b1.jitter_ms", "delay_ms")
        self.assertSpecError(minimal(impair={"b1": {"lag": 3}}), "impair.b1.lag", "unknown key")
        self.assertSpecError(minimal(teams={"bravo": {}}), "teams.bravo", "no host has team")
        self.assertSpecError(minimal(teams={"lab": {"master": "nobody"}}), "teams.lab.master", "not a host")

    def test_dns_names_with_hyphens_and_leading_digits(self) -> None:
        spec = parse_spec({"buildings": {"b-1": {"nat": "eim", "hosts": ["alpha-robot1", "4th-robot"]},
                                         "2nd": {"nat": "eim", "hosts": ["base-station1"]}}})
        self.assertEqual([h.name for h in spec.hosts], ["alpha-robot1", "4th-robot", "base-station1"])

    def test_illegal_host_names_are_refused_naming_the_key(self) -> None:
        for bad in ("-robot", "robot-", "robot_1", "r.1", "a" * 25, ""):
            with self.subTest(bad=bad):
                self.assertSpecError({"buildings": {"b1": {"nat": "eim", "hosts": [bad]}}},
                                     "buildings.b1.hosts[0]", "not a name")
        with self.assertRaises(SpecError) as cm:
            parse_spec({"buildings": {"b1": {"nat": "eim", "hosts": ["Alpha-Robot1"]}}}, source="spec.yaml")
        self.assertIn("lower case: 'alpha-robot1'", str(cm.exception))
        self.assertNotIn("\n", str(cm.exception))

    def test_file_errors(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            bad = Path(d) / "bad.yaml"
            bad.write_text("buildings: [unclosed\n")
            with self.assertRaises(SpecError) as cm:
                load_spec(bad)
            self.assertIn(str(bad), str(cm.exception))
            self.assertIn("not valid YAML", str(cm.exception))
            with self.assertRaises(SpecError) as cm:
                load_spec(Path(d) / "missing.yaml")
            self.assertIn("cannot read", str(cm.exception))
            good = Path(d) / "mini.yaml"
            good.write_text("buildings: {b1: {nat: eim, hosts: [r1]}}\n")
            self.assertEqual(load_spec(good).name, "mini")  # name defaults to the file stem


class ImpairmentTest(unittest.TestCase):
    def test_netem_args(self) -> None:
        self.assertEqual(Impairment().netem_args(), [])
        self.assertTrue(Impairment().empty)
        self.assertEqual(Impairment(delay_ms=20, jitter_ms=2.5, loss_pct=0.1, rate_mbit=100).netem_args(),
                         ["delay", "20ms", "2.5ms", "loss", "0.1%", "rate", "100mbit"])


if __name__ == "__main__":
    unittest.main()
