"""A fleet's cameras through one relayed uplink (overlay_manager.lab.campus.fleet_camera).

    building-robots (udp-blocked, uplink tbf 30 Mbit/s)            building-ops (eim-adpf)
      alpha-robot1..4: robot.launch, scene camera 640x480 30 Hz,     ops-laptop: robot.launch,
      link-aware encoder, Twist echo                                 one viewer for all 4 streams
                 \\________ every robot <-> laptop link relayed through DERP ________/

Four robots in one building whose router drops UDP (every link to the laptop is derp) share a
30 Mbit/s uplink; the laptop in another building watches all four cameras at once in one viewer
(probe quality: rate, latency, bitrate, PSNR against the source frame) while a Twist round trip
runs to each robot. The stream is the link-aware H.264 transport where the encoder publishes it
(``<image>/link_aware_h264``), the link-aware JPEG stream otherwise (the test prints which).

Checks (one campus for the module): every stream reaches the viewer over derp (H.264: at >= 25
Hz; JPEG, until the encoder publishes H.264: flowing, >= 5 Hz) with a PSNR that only the right
source frames give, every robot answers the Twist round trip; a late subscriber gets a
decodable picture within 2 s of its first message. The benchmark
(lab/bench/fleet.py) reports the numbers against the goals (29 Hz, 38 dB, latency p99 100 ms, Twist
p99 50 ms); this test keeps margins for a busy 2-core machine.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict

import pytest

from overlay_manager.lab.campus import camera_streams, robots
from overlay_manager.lab.campus.fleet_camera import LAPTOP, ROBOTS, SPEC, FleetCamera, node

MIN_HZ = {"h264": 25.0, "jpeg": 5.0}
"""Per stream kind: every stream must flow over derp while four share the uplink, far above raw's
0.5-0.8 Hz. H.264: the goal's >= 25 Hz (docs/bench.md; 29.9-30.0 Hz measured on a quiet machine,
28.7-29.4 Hz at load 5.4). On a 2-core machine where four encoders, the DERP server, five
tailscaleds and the viewer's four decoders share the CPU, one stall can cost a window a few
frames, so a window below the bound is measured once more (MEASURE_TRIES); a stream that is really
slow stays slow in both. Four link-aware JPEG streams do not fit this uplink at 30 Hz (about
4 Mbit/s each at the lowest quality on this scene): they must flow, at a reduced rate."""
MEASURE_TRIES = 2
MIN_PSNR_DB = 30.0  # a wrong source frame gives 15-25 dB on this scene; JPEG at low quality 32+
KEYFRAME_WAIT_S = 2.0
MEASURE_S = 8.0
MEASURED: Dict[str, Any] = {}


@pytest.fixture(scope="module")
def fleet(lab_factory):
    """The fleet campus with cameras, encoders and echoes running and every link derp; the lab
    down at the end of the module (its idle daemons would share the cores with later modules)."""
    lab = lab_factory(SPEC)
    fc = FleetCamera(lab, say=lambda m: print(f"[fleet] {m}", flush=True))
    try:
        MEASURED["setup"] = fc.start()
        yield fc
    except Exception:
        robots.print_launch_logs(lab, (*ROBOTS, LAPTOP))
        raise
    finally:
        try:
            fc.stop()
        finally:
            lab.down()  # lab_factory's own down() at session end is a no-op then


def test_four_streams_over_one_relayed_uplink(fleet):
    kind = fleet.best_kind()
    for attempt in range(MEASURE_TRIES):
        res = fleet.measure(kind, MEASURE_S, psnr_every=3)
        slow = {r: res["streams"][r]["rate_hz"] for r in ROBOTS if res["streams"][r]["rate_hz"] < MIN_HZ[kind]}
        if not slow:
            break
        print(f"window {attempt + 1}: below {MIN_HZ[kind]} Hz: {slow}", flush=True)
    MEASURED[kind] = res
    for r in ROBOTS:
        print(f"{kind} {r}: {json.dumps(res['streams'][r])}")
        print(f"Twist {r}: {json.dumps(res['control'].get(r))}; encoder CPU {res['encoder_cpu_pct'][r]} %")
    if kind != "h264":
        print("NOTE: no <image>/link_aware_h264 published: measured the link-aware JPEG stream")
    paths = robots.peers(fleet.lab, LAPTOP, node=node(LAPTOP))
    derp = {p["name"]: p["path"] for p in paths["peers"]}
    assert all(derp.get(r) == "derp" for r in ROBOTS), f"every robot must be derp from the laptop: {derp}"
    for r in ROBOTS:
        s = res["streams"][r]
        assert s["count"], f"{r}: nothing arrived on {s['topic']}: {s}"
        assert s["no_index"] == 0, f"{r}: frames without a source index in header.frame_id: {s}"
        assert s["rate_hz"] >= MIN_HZ[kind], f"{r}: {s['topic']} at {s['rate_hz']} Hz over derp: {s}"
        assert s["psnr_frames"] and s["psnr_mean"] >= MIN_PSNR_DB, f"{r}: PSNR {s['psnr_mean']} dB: {s}"
        c = res["control"].get(r) or {}
        assert c.get("received", 0) >= 0.9 * (c.get("sent") or 1), f"{r}: Twist round trip: {c}"


def test_late_subscriber_gets_a_picture_quickly(fleet):
    kind = fleet.best_kind()
    robot = ROBOTS[-1]
    # the other three stream meanwhile, so the uplink is shared as before
    others = [(kind, fleet.streams[r][kind]) for r in ROBOTS[:-1]]
    bg = threading.Thread(target=camera_streams.quality, args=(fleet.lab, LAPTOP, others, 10.0))
    bg.start()
    try:
        time.sleep(3.0)
        late = fleet.late_subscriber(kind, robot, seconds=4.0)
    finally:
        bg.join(timeout=120)
    MEASURED["late"] = late
    print(f"late subscriber to {late['topic']}: {json.dumps(late)}")
    assert late["first_message_s"] is not None, f"no message at all on {late['topic']}"
    assert late["first_picture_s"] is not None, f"no decodable picture on {late['topic']}: {late}"
    wait = late["first_picture_s"] - late["first_message_s"]
    assert wait <= KEYFRAME_WAIT_S, f"first decodable picture {wait:.2f} s after the first message: {late}"
    assert late["psnr_mean"] is None or late["psnr_mean"] >= MIN_PSNR_DB, late
