"""A robot that moves, under live Twist traffic (root; skipped with a reason otherwise).

On the shared two_buildings campus (robot.launch on alpha-robot1 in b1, the ROS master, and on
alpha-laptop in b2): a Twist echo on robot1 and a 50 Hz round trip from the laptop run while
robot1 roams to b2 (new address and gateway; now on the laptop's LAN) and back home, then while
its LAN link flaps three times. Checks: the ROS connections of the round trip are the same
before and after (rospy's connection ids), every Twist sent came back, and the laptop's node
follows the robot: ~peers direct at robot1's new LAN address after the move, at b1's public
address after the move home, direct again after the flaps. The numbers (gaps, ~peers times) are
printed; the goals on them are measured by scripts/bench_mobility (docs/bench.md).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.lab.bench.mobility_report import gap_from_list, peer_is
from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.system import wait_for

ROBOT, LAPTOP = "alpha-robot1", "alpha-laptop"
NODE = overlay_node(LAPTOP)


def _control(lab: Lab, seconds: float, out: Dict[str, Any], errors: List[str]) -> threading.Thread:
    """The 50 Hz Twist round trip from the laptop for ``seconds`` in a thread (result in ``out``)."""
    def run() -> None:
        try:
            out.update(robots.run_probe(lab, LAPTOP, ["control", "--rate", "50", "--seconds", str(seconds),
                                                      "--timeout", "30"], timeout=seconds + 60))
        except LabError as exc:
            errors.append(str(exc))
    th = threading.Thread(target=run, name="twist", daemon=True)
    th.start()
    return th


def _ping(lab: Lab) -> None:
    """A disco ping from the laptop's node (an idle link shows no path until traffic)."""
    robots.call(lab, LAPTOP, f"{NODE}/ping_peer", "overlay_manager/PingPeer", name=ROBOT, count=1, timeout=5.0)


def _wait_latest(rec: robots.Recorder, what: str, pred: Any, timeout: float) -> Dict[str, Any]:
    """Wait until the latest ~peers event of the laptop's node satisfies ``pred`` (the path may
    never have changed, so no new event need come)."""
    def latest() -> Any:
        rec.read()
        evs = [e for e in rec.events if e["ev"] == "peers" and e["node"] == NODE]
        return evs[-1] if evs and pred(evs[-1]) else None

    def seen() -> str:
        evs = [e for e in rec.events if e["ev"] == "peers" and e["node"] == NODE]
        return f"last ~peers: {evs[-1] if evs else 'none'}"

    return wait_for(what, latest, timeout, 0.2, seen)


def test_robot_roams_and_flaps_under_twist(two_buildings_robots: Lab) -> None:
    lab = two_buildings_robots
    home_wan = lab.address("b1")
    with robots.processes(lab, (ROBOT, LAPTOP)) as procs:
        procs.append(robots.start_echo(lab, ROBOT))
        rec = robots.Recorder(lab, LAPTOP, nodes=[NODE], name="record-mobility")
        try:
            _ping(lab)
            _wait_latest(rec, f"{NODE} ~peers: {ROBOT} direct before the move", peer_is(NODE, ROBOT, "direct"), 60)
            twist: Dict[str, Any] = {}
            errors: List[str] = []
            th = _control(lab, 40.0, twist, errors)
            time.sleep(6.0)  # connects, warms up 1 s, then 3 s of steady traffic
            moved = lab.move(ROBOT, "b2")
            away = lab.where(ROBOT)
            assert away.building == "b2" and away.address != lab.names.host_address(ROBOT)
            ok_away = rec.wait(f"{NODE} ~peers: {ROBOT} direct at its new address {away.address} after the move",
                               peer_is(NODE, ROBOT, "direct", away.address), timeout=30, since=moved["t_mono"])
            time.sleep(3.0)
            back = lab.move_home(ROBOT)
            ok_home = rec.wait(f"{NODE} ~peers: {ROBOT} direct at {home_wan} after the move home",
                               peer_is(NODE, ROBOT, "direct", home_wan), timeout=30, since=back["t_mono"])
            th.join(timeout=120)
            assert not errors, errors
            assert twist, "the Twist round trip returned nothing"
            gaps = twist["echo_gaps"]
            print(f"\nmove to b2: laptop ~peers right after {ok_away['t'] - moved['t_mono']:.2f} s, Twist gap "
                  f"{gap_from_list(gaps, moved['t_mono'], back['t_mono']):.2f} s; move home: ~peers right after "
                  f"{ok_home['t'] - back['t_mono']:.2f} s, "
                  f"Twist gap {gap_from_list(gaps, back['t_mono'], 1e12):.2f} s; "
                  f"sent {twist['sent']}, back {twist['received']}, rtt p99 {twist['rtt_p99_ms']:.1f} ms")
            # the same ROS connections: nothing re-established, every Twist came back (TCP kept them)
            assert twist["connections_start"] and twist["connections_start"] == twist["connections_end"], twist
            assert twist["received"] >= 0.98 * twist["sent"], twist

            # flaps: three one-second carrier losses, then direct again and the round trip whole
            twist2: Dict[str, Any] = {}
            th = _control(lab, 14.0, twist2, errors)
            time.sleep(3.5)
            recs = lab.flap(ROBOT, "link", count=3, period_s=2.0, down_s=1.0)
            assert [r["action"] for r in recs] == ["link-down", "link-up"] * 3
            th.join(timeout=90)
            assert not errors, errors
            _ping(lab)
            _wait_latest(rec, f"{NODE} ~peers: {ROBOT} direct at {home_wan} after the flaps",
                         peer_is(NODE, ROBOT, "direct", home_wan), timeout=15)
            print(f"flaps: Twist longest gap {twist2['echo_max_gap_s']:.2f} s, sent {twist2['sent']}, "
                  f"back {twist2['received']}")
            assert twist2["connections_start"] == twist2["connections_end"], twist2
            assert twist2["received"] >= 0.98 * twist2["sent"], twist2
        finally:
            if lab.where(ROBOT).building != "b1":
                lab.move_home(ROBOT)
            rec.stop()
