"""Robots that move (overlay_manager.lab.campus.mobility): roam plans, visitor addresses, flap
schedules, the action log and the schedule runner (pure parts; the moves themselves run in the
mobility system test)."""
from __future__ import annotations

import json
import tempfile
import time
import unittest
from pathlib import Path

from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.mobility import (
    ActionLog,
    attachment,
    flap_schedule,
    home_attachment,
    read_actions,
    roam_plan,
    run_schedule,
)
from overlay_manager.lab.campus.naming import IFNAME_MAX, Names
from overlay_manager.lab.campus.spec import parse_spec

SPEC = parse_spec({"buildings": {
    "b1": {"nat": "eim", "hosts": ["robot1", "robot2"]},
    "b2": {"nat": "adm-eif", "hosts": ["robot3"]},
    "b3": {"nat": "eim", "hosts": ["laptop"]},
}})


class AttachmentTest(unittest.TestCase):
    def setUp(self) -> None:
        self.n = Names(SPEC, "r42")

    def test_home_is_the_spec_address_and_router_end(self) -> None:
        a = home_attachment(self.n, "robot2")
        self.assertEqual((a.building, a.ifname, a.address, a.gateway, a.cidr),
                         ("b1", "h1", "10.231.10.11", "10.231.10.1", "10.231.10.11/24"))

    def test_visitor_address_never_collides_with_the_buildings_own_hosts(self) -> None:
        a = attachment(self.n, "robot2", "b2")  # robot2 is host 1 of the spec
        self.assertEqual((a.building, a.ifname, a.address, a.gateway), ("b2", "v1", "10.231.11.101", "10.231.11.1"))
        own = {self.n.host_address(h.name) for h in SPEC.hosts}
        for h in SPEC.hosts:
            for b in SPEC.buildings:
                self.assertNotIn(attachment(self.n, h.name, b.name).address,
                                 own - {self.n.host_address(h.name)})

    def test_attachment_in_the_home_building_is_home(self) -> None:
        self.assertEqual(attachment(self.n, "robot3", "b2"), home_attachment(self.n, "robot3"))

    def test_unknown_host_or_building(self) -> None:
        with self.assertRaises(LabError):
            attachment(self.n, "nobody", "b2")
        with self.assertRaises(LabError):
            attachment(self.n, "robot1", "b9")


class RoamPlanTest(unittest.TestCase):
    def setUp(self) -> None:
        self.n = Names(SPEC, "r42")

    def test_commands_leave_join_then_readdress(self) -> None:
        plan = roam_plan(self.n, "robot1", home_attachment(self.n, "robot1"), "b3")
        cmds = plan.commands()
        self.assertEqual(cmds[0], ("olabr42-r-b1", ["ip", "link", "set", "dev", "h0", "down", "name", "m0"]))
        self.assertEqual(cmds[1], ("olabr42-r-b1", ["ip", "link", "set", "dev", "m0", "netns", "olabr42-r-b3"]))
        self.assertEqual(cmds[2], ("olabr42-r-b3", ["ip", "link", "set", "dev", "m0", "name", "v0"]))
        self.assertEqual(cmds[3], ("olabr42-r-b3", ["ip", "link", "set", "dev", "v0", "master", "br0", "up"]))
        self.assertEqual([ns for ns, _ in cmds[4:]], ["olabr42-h-robot1"] * 3)
        self.assertIn("10.231.12.100/24", cmds[5][1])
        self.assertEqual(cmds[6][1][-4:], ["via", "10.231.12.1", "dev", "eth0"])
        for _, argv in cmds:  # interface names fit the kernel's limit
            for word in argv:
                if word.startswith(("h", "m", "v")) and word[1:].isdigit():
                    self.assertLessEqual(len(word), IFNAME_MAX)

    def test_back_home_takes_the_home_name_and_address(self) -> None:
        away = attachment(self.n, "robot1", "b3")
        plan = roam_plan(self.n, "robot1", away, "b1")
        self.assertEqual(plan.old_router_ns, "olabr42-r-b3")
        self.assertEqual(plan.new, home_attachment(self.n, "robot1"))
        self.assertEqual(plan.commands()[2][1][-1], "h0")

    def test_already_there(self) -> None:
        with self.assertRaisesRegex(LabError, "already in building b1"):
            roam_plan(self.n, "robot1", home_attachment(self.n, "robot1"), "b1")


class FlapScheduleTest(unittest.TestCase):
    def test_down_then_up_each_period(self) -> None:
        self.assertEqual(flap_schedule(3, 2.0, 1.0),
                         [(0.0, "down"), (1.0, "up"), (2.0, "down"), (3.0, "up"), (4.0, "down"), (5.0, "up")])

    def test_invalid(self) -> None:
        for args in ((0, 2.0, 1.0), (3, 2.0, 2.0), (3, 0.0, 1.0), (3, 2.0, 0.0)):
            with self.assertRaises(LabError, msg=str(args)):
                flap_schedule(*args)

    def test_runner_keeps_absolute_deadlines(self) -> None:
        seen = []

        def slow() -> None:
            seen.append(("down", time.monotonic()))
            time.sleep(0.03)

        t0 = run_schedule([(0.0, "down"), (0.05, "up"), (0.1, "down")],
                          {"down": slow, "up": lambda: seen.append(("up", time.monotonic()))})
        self.assertEqual([w for w, _ in seen], ["down", "up", "down"])
        self.assertAlmostEqual(seen[2][1] - t0, 0.1, delta=0.02)

    def test_runner_stops_early(self) -> None:
        calls = []
        run_schedule([(0.0, "a"), (0.0, "a"), (0.0, "a")], {"a": lambda: calls.append(1)},
                     stop=lambda: len(calls) >= 2)
        self.assertEqual(len(calls), 2)


class ActionLogTest(unittest.TestCase):
    def test_records_times_in_memory_and_file(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            log = ActionLog(Path(d) / "actions.jsonl")
            t0 = time.monotonic()
            rec = log.run("move", "robot1", lambda: time.sleep(0.01), to_building="b2")
            self.assertGreaterEqual(rec["t_mono"], t0)
            self.assertGreaterEqual(rec["done_mono"] - rec["t_mono"], 0.009)
            self.assertAlmostEqual(rec["t_wall"], time.time(), delta=5)
            with self.assertRaises(ValueError):
                log.run("flap", "b1", lambda: (_ for _ in ()).throw(ValueError("boom")))
            on_disk = read_actions(Path(d) / "actions.jsonl")
            self.assertEqual([r["action"] for r in on_disk], ["move", "flap"])
            self.assertEqual(on_disk[0]["to_building"], "b2")
            self.assertIn("boom", on_disk[1]["error"])
            self.assertEqual(json.loads(json.dumps(log.records)), on_disk)
            self.assertEqual(len(log.since(rec["done_mono"])), 1)

    def test_missing_file_reads_empty(self) -> None:
        self.assertEqual(read_actions(Path("/nonexistent/actions.jsonl")), [])


if __name__ == "__main__":
    unittest.main()
