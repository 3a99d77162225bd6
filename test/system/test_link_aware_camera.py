"""Link-aware camera on a relayed, rate-limited path: the real encoder via robot.launch in the lab.

    b1 (eim-adpf, UDP blocked, uplink tbf 30 Mbit/s)          b2 (eim-adpf)
      robot1: roscore, robot.launch camera_topics:=/camera/image_raw,      laptop: robot.launch,
              lab camera 640x480 rgb8 30 Hz (real scene), Twist echo              probes
                         \\__________ tailscale, relayed through DERP __________/

With UDP blocked at b1 every robot1 <-> laptop link is derp; b1's uplink limited to 30 Mbit/s
stands for a relayed campus link. In the same run the laptop subscribes to the raw topic
(221 Mbit/s of rgb8: it cannot arrive at 30 Hz) and then to the link-aware <topic>/compressed:
at least 25 Hz (the bench goal is 29 Hz; the margin keeps CI on 2 shared cores deterministic)
with every picture decodable and its PSNR against the source frame at least 30 dB (a wrong or
broken frame gives 15-25 dB on this scene), while the encoder's stream_state names the laptop on
derp with a budget. The Twist round trip
while the compressed camera streams is printed (the bench reports it against its goal).
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict

import pytest

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.lab.campus import camera_streams, robots
from overlay_manager.lab.campus.spec_model import Impairment

ROBOT, LAPTOP, B1 = "alpha-robot1", "alpha-laptop", "b1"
N_ROBOT, N_LAPTOP = overlay_node(ROBOT), overlay_node(LAPTOP)
RAW = "/camera/image_raw"
OUT = RAW + "/compressed"  # the republisher's copy of RAW + "/link_aware" (the lab camera is a plain rospy node)
STATE = RAW + "/link_aware/stream_state"
UPLINK_MBIT = 30.0
MIN_LINK_AWARE_HZ = 25.0
DERP_BOUND_S = 60.0
MEASURE_S = 8.0

MEASURED: Dict[str, Any] = {}


@pytest.fixture(scope="module")
def relayed(two_buildings_lab):
    """robot.launch with the link-aware camera on robot1 (master) and on laptop, the scene
    camera and the Twist echo on robot1; then UDP blocked at b1 and its uplink at 30 Mbit/s
    until both nodes report derp. Everything is undone and stopped by pid at the end."""
    lab = two_buildings_lab
    procs: list = []
    try:
        procs.append(robots.start_robot(lab, ROBOT, master=True, launch_args=[f"camera_topics:={RAW}"]))
        robots.peers(lab, ROBOT, timeout=90, node=N_ROBOT)
        procs.append(robots.start_robot(lab, LAPTOP, master=False))
        robots.peers(lab, LAPTOP, min_peers=1, timeout=120, node=N_LAPTOP)
        procs.append(robots.start_camera(lab, ROBOT, RAW))
        procs.append(robots.start_echo(lab, ROBOT))
        lab.block_udp(B1)
        lab.impair(B1, Impairment(rate_mbit=UPLINK_MBIT))
        t0 = time.monotonic()
        for host, node, other in ((ROBOT, N_ROBOT, LAPTOP), (LAPTOP, N_LAPTOP, ROBOT)):
            robots.peers(lab, host, node=node, timeout=DERP_BOUND_S,
                         where=f"any(p['name'] == '{other}' and p['path'] == 'derp' for p in m['peers'])")
        MEASURED["derp_after_s"] = round(time.monotonic() - t0, 1)
        yield lab
    except Exception:
        robots.print_launch_logs(lab, (ROBOT, LAPTOP))
        raise
    finally:
        try:
            lab.impair(B1, None)
            lab.unblock_udp(B1)
        finally:
            for p in reversed(procs):
                robots.stop(lab, p)


def _rate(lab, topic: str, typ: str, seconds: float = MEASURE_S) -> Dict[str, Any]:
    kind = "raw" if typ == "sensor_msgs/Image" else "jpeg"
    res = camera_streams.quality(lab, LAPTOP, [(kind, topic)], seconds)
    return {k: v for k, v in camera_streams.stream_row(res["streams"][topic]).items() if k != "errors"}


def test_raw_topic_falls_short_on_the_limited_relayed_path(relayed):
    raw = _rate(relayed, RAW, "sensor_msgs/Image")
    MEASURED["raw"] = raw
    print(f"raw {RAW} robot1 -> laptop (derp, b1 uplink {UPLINK_MBIT:g} Mbit/s): {json.dumps(raw)}")
    assert raw["count"] > 0, "the raw topic did not arrive at all: the relayed path itself is broken"
    assert raw["rate_hz"] < MIN_LINK_AWARE_HZ, f"raw rgb8 arrived at {raw['rate_hz']} Hz: the limit is not in effect"


def test_link_aware_camera_keeps_full_rate_on_the_same_path(relayed):
    lab = relayed
    out: Dict[str, Any] = {}

    def measure() -> None:
        out["rate"] = _rate(lab, OUT, "sensor_msgs/CompressedImage")

    def control() -> None:
        time.sleep(2.0)  # the camera stream is up first
        out["control"] = robots.run_probe(lab, LAPTOP, ["control", "--rate", "50", "--seconds", "4"], timeout=90)

    def states() -> None:
        # the encoder's decisions over the whole window (it lists the rate probe as a subscriber)
        out["state"] = robots.run_probe(lab, LAPTOP, ["collect", STATE, "overlay_manager/StreamState",
                                                      "--seconds", str(MEASURE_S + 4)], timeout=MEASURE_S + 90)

    threads = [threading.Thread(target=f) for f in (states, measure, control)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    rate = out.get("rate")
    assert rate, "the rate probe on the compressed topic did not finish"
    ctl = out.get("control", {})
    msgs = [m for m in (out.get("state") or {}).get("msgs") or [] if m["subscribers"] and m["bitrate_kbps"] > 0]
    assert msgs, f"no {STATE} with a subscriber while the laptop subscribed: {out.get('state')}"
    st = msgs[-1]
    subs = {s["host"]: s for s in st["subscribers"]}
    MEASURED["link_aware"] = rate
    MEASURED["stream_state"] = {k: st[k] for k in ("quality", "rate_hz", "bitrate_kbps", "budget_kbps", "limited_by",
                                                   "reason", "frame_bytes", "encode_ms")}
    MEASURED["control_rtt"] = {k: ctl.get(k) for k in ("rtt_p50_ms", "rtt_p99_ms", "rtt_max_ms", "received", "sent")}
    print(f"link-aware {OUT} robot1 -> laptop (derp, b1 uplink {UPLINK_MBIT:g} Mbit/s): {json.dumps(rate)}")
    print(f"stream_state: {json.dumps(MEASURED['stream_state'])}")
    print(f"Twist round trip laptop -> robot1 -> laptop while it streams: {json.dumps(MEASURED['control_rtt'])}")
    assert LAPTOP in subs, f"stream_state does not list the laptop: {json.dumps(st)[:800]}"
    assert subs[LAPTOP]["path"] == "derp", subs[LAPTOP]
    assert st["budget_kbps"] is not None and st["limited_by"] == LAPTOP, st
    assert st["bitrate_kbps"] <= st["budget_kbps"] * 1.25, st
    assert rate["rate_hz"] >= MIN_LINK_AWARE_HZ, rate
    assert rate["undecodable"] == 0 and rate["no_index"] == 0, rate
    assert rate["psnr_frames"] and rate["psnr_mean"] >= 30.0, rate
    raw = MEASURED.get("raw")
    if raw:
        assert rate["rate_hz"] > raw["rate_hz"], (rate, raw)
