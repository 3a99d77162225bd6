"""A robot's sensor mix to a relayed laptop and a direct one (overlay_manager.lab.campus.robot_mix).

    building-robot (udp-blocked, uplink tbf 30 Mbit/s)                  building-ops (eim-adpf)
      alpha-robot1: robot.launch, camera + link-aware H.264,              ops-laptop: robot.launch,
      cloud 10 Hz, scan 40 Hz, map 1 Hz (real stereo scene), Twist echo   a viewer, Twist 50 Hz
      lab-laptop: robot.launch, a viewer           \\______ derp ______/
         \\__ direct (LAN) __/

The robot publishes the mix of lab/probe/mix_data.py (a 355,755-point coloured cloud, a 1282-beam
scan and a 2564 x 2220 grid, 5.69 MB / 10.3 KB / 5.69 MB a message) and its camera; the viewers
(lab/probe/mix_nodes.py ``ages``) measure rate, message age and size per topic. One campus for the
module; two measurements of 8 s (shaped first: the raw one leaves the relayed path's queues full):

- shaped (the robot's topic shaper, lab/campus/robot_mix.py SHAPER_PARAMS): the relayed laptop takes
  ``<topic>/shaped`` of the cloud, scan and map: every one arrives with the original header,
  smaller than the original (zstd; the cloud decimated where allowed), at a bounded age and the
  cloud faster than raw or a hand-set throttle; the camera flows and the Twist round trip
  answers; at the same time the direct laptop gets the raw mix at its full content (the
  published message size) and rate (with margins for the shared CPU);
- raw: the relayed laptop takes the topics as published: the 455 Mbit/s cloud cannot cross the
  30 Mbit/s uplink (it arrives at a fraction of its rate, seconds old), which shows the limit is in
  effect and the viewer measures it.

The numbers against the goals are the benchmark's (lab/bench/mix.py, docs/bench.md); this test
keeps margins for a busy 2-core machine.
"""
from __future__ import annotations

import json
from typing import Any, Dict

import pytest

from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus.robot_mix import DIRECT, HEAVY, NOMINAL_HZ, RELAYED, ROBOT, SPEC, RobotMix

MEASURE_S = 8.0
DIRECT_SHARE = {"points": 0.15, "scan": 0.8, "map": 0.0}
"""Least share of the nominal rate the direct laptop must get (the map: at least one message in
the window, checked by count). The cloud is 455 Mbit/s; this machine's direct path carries about
220 Mbit/s of TCP (userspace WireGuard on 2 shared cores, iperf3 in the benchmark), so the direct
cloud comes at 2-3 Hz here: the check is that it is not held back like the relayed one (0.1-0.3
Hz) and comes whole."""
RAW_CLOUD_MAX_HZ = 3.0
"""Above this the raw cloud would not be limited by a 30 Mbit/s uplink (0.66 Hz fill it)."""
SHAPED_AGE_P99_MS = 3000.0
"""Bound on a shaped topic's message age p99 at the relayed laptop (the goal is 500 ms, measured
by bench_mix: docs/bench.md). At load 5-9 on 2 cores, with the direct laptop pulling 220-270
Mbit/s through userspace WireGuard, the paced cloud's p99 in these 8 s windows reached 0.8-1.9 s
(its first messages, sent while the machine is busiest); a shaper that blocks itself stalls a
topic for 4 s and more (the raw cloud's is 7-18 s)."""
SHAPED_CLOUD_MIN_HZ = 0.25
"""The shaped cloud must come at least as often as a hand-set throttle that fits the uplink on
paper (0.3 Hz, which delivers 0.2-0.3 Hz at 7-18 s of age here) and the raw cloud (0.1-0.15 Hz).
The shaper aims at 2 Hz (decimated to about 250 KB); measured 0.37-1.75 Hz here, as its delivery
feedback sees the one DERP connection the camera, scan and map share (docs/bench.md)."""
MEASURED: Dict[str, Any] = {}


@pytest.fixture(scope="module")
def mix(lab_factory):
    """The mix campus with everything running, the robot derp from ops-laptop, direct from lab-laptop."""
    lab = lab_factory(SPEC)
    rm = RobotMix(lab, say=lambda m: print(f"[mix] {m}", flush=True))
    try:
        MEASURED["setup"] = rm.start()
        yield rm
    except Exception:
        robots.print_launch_logs(lab, (ROBOT, DIRECT, RELAYED))
        raise
    finally:
        rm.stop()


def _rows(res: Dict[str, Any], viewer: str) -> Dict[str, Any]:
    got = res.get(viewer) or {}
    assert not got.get("error"), f"{viewer} viewer failed: {got.get('error')}"
    return {n: {k: v for k, v in r.items() if k != "series"} for n, r in got["topics"].items()}


def test_shaped_to_relayed_and_full_mix_to_direct(mix):
    res = mix.measure("shaped", MEASURE_S)
    relayed, direct = _rows(res, "relayed"), _rows(res, "direct")
    MEASURED["shaped"] = {"relayed": relayed, "direct": direct, "control": res.get("control")}
    print(f"shaped, relayed: {json.dumps(relayed)}")
    print(f"shaped, direct: {json.dumps(direct)}")
    print(f"Twist: {json.dumps(res.get('control'))}")
    sizes = mix.published["bytes"]
    for n in HEAVY:
        d = direct[n]
        assert d["no_header"] == 0 and d["count"], f"direct {n}: {d}"
        assert d["bytes_p50"] == sizes[n], f"direct {n}: message of {d['bytes_p50']} B, published {sizes[n]} B"
        assert d["rate_hz"] >= DIRECT_SHARE[n] * NOMINAL_HZ[n], f"direct {n} at {d['rate_hz']} Hz: {d}"
    for n in HEAVY:
        r = relayed[n]
        assert r["count"] and r["no_header"] == 0, f"relayed {n}/shaped: nothing with the original header: {r}"
        assert r["bytes_p50"] < sizes[n], f"relayed {n}/shaped: {r['bytes_p50']} B, not smaller than {sizes[n]} B"
        assert r["latency_p99_ms"] <= SHAPED_AGE_P99_MS, f"relayed {n}/shaped: message age p99 {r}"
    assert relayed["points"]["rate_hz"] >= SHAPED_CLOUD_MIN_HZ, f"shaped cloud: {relayed['points']}"
    assert relayed["camera"]["rate_hz"] >= 5.0, f"the camera over derp beside the shaped mix: {relayed['camera']}"
    c = res.get("control") or {}
    assert c.get("received", 0) >= 0.9 * (c.get("sent") or 1), f"Twist round trip: {c}"


def test_raw_cloud_is_held_back_by_the_relayed_uplink(mix):
    res = mix.measure("raw", MEASURE_S, direct=False, control=False)
    rows = _rows(res, "relayed")
    MEASURED["raw"] = rows
    print(f"raw, relayed: {json.dumps(rows)}")
    cloud = rows["points"]
    assert cloud["no_header"] == 0, cloud
    assert cloud["rate_hz"] < RAW_CLOUD_MAX_HZ, f"a 455 Mbit/s cloud over a 30 Mbit/s uplink at {cloud['rate_hz']} Hz"
    assert cloud["count"] == 0 or cloud["latency_p50_ms"] > 500, f"the raw cloud arrives without queueing: {cloud}"
