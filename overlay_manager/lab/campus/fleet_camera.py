"""A fleet's cameras through one relayed uplink: the set-up shared by the fleet camera benchmark
(bench/fleet.py) and its system test (test/system/test_fleet_camera.py).

::

    building-robots (udp-blocked; uplink tbf 30 Mbit/s)              building-ops (eim-adpf)
      alpha-robot1  roscore + robot.launch, camera, encoder, echo      ops-laptop  robot.launch,
      alpha-robot2  robot.launch, camera, encoder, echo                            one viewer for
      alpha-robot3  "                                                             all 4 streams,
      alpha-robot4  "                                                             Twist to each
                  \\___________ every robot <-> laptop link relayed through DERP ___________/

Each robot plays the real scene (rosnodes ``camera``, 640x480 rgb8 30 Hz, frame index in
header.frame_id) on ``/<ns>/camera/image_raw`` (``ns`` = ros_namespace(host)), serves it
link-aware with its own encoder (link_aware_camera.launch) and echoes Twist on ``/<ns>/cmd_vel``
-> ``/<ns>/cmd_vel_echo``. UDP is blocked at the robots' router from the start (NAT kind
``udp-blocked``), so every robot <-> laptop link is derp; the robots' uplink is limited to
30 Mbit/s (tc tbf, both directions), the one relayed link the four streams share.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional

from overlay_manager.core.ros_names import overlay_node, ros_namespace
from overlay_manager.core.stats import window_stats
from overlay_manager.lab.campus import camera_streams, robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.spec_model import Impairment

ROBOTS = ("alpha-robot1", "alpha-robot2", "alpha-robot3", "alpha-robot4")
LAPTOP = "ops-laptop"
ROBOT_BUILDING, LAPTOP_BUILDING = "building-robots", "building-ops"
SPEC: Dict[str, Any] = {
    "name": "fleet_camera",
    "buildings": {
        ROBOT_BUILDING: {"nat": "udp-blocked", "hosts": {r: {"team": "alpha", "role": "robot"} for r in ROBOTS}},
        LAPTOP_BUILDING: {"nat": "eim-adpf", "hosts": {LAPTOP: {"team": "alpha", "role": "operator"}}},
    },
    "teams": {"alpha": {"master": ROBOTS[0]}},
}
UPLINK_MBIT = 30.0
TWIST_MARGIN_S = 5.0
"""Seconds the Twist round trips run beyond the viewer's measurement: they start with the viewer,
which measures only from every stream's first message (up to a few seconds later)."""
BUDGET_KBPS = 6000.0
"""Each encoder's budget on derp: four streams share the 30 Mbit/s uplink (4 x 6 = 24 Mbit/s)."""


def node(host: str) -> str:
    """The overlay node of ``host`` (robot.launch's namespace: ros_names.overlay_node)."""
    return overlay_node(host)


def raw_topic(host: str) -> str:
    """The robot's raw camera topic."""
    return f"/{ros_namespace(host)}/camera/image_raw"


class FleetCamera:
    """The four robots, their cameras, encoders and echoes, and the laptop viewer, in ``lab``
    (made from :data:`SPEC`). Every process started is kept in ``procs`` and stopped by pid in
    :meth:`stop`; ``say`` narrates."""

    def __init__(self, lab: Lab, say: Any = print, video: str = "") -> None:
        self.lab, self.say = lab, say
        self.video = video  # the file every camera plays ("" = the lab camera's default scene)
        self.procs: List[subprocess.Popen] = []
        self.encoders: Dict[str, subprocess.Popen] = {}
        self.streams: Dict[str, Dict[str, str]] = {}  # robot -> kind -> topic

    def start(self, uplink_mbit: float = UPLINK_MBIT, budget_kbps: float = BUDGET_KBPS,
              pacing_factor: Optional[float] = None) -> Dict[str, float]:
        """robot.launch everywhere (alpha-robot1 is the master), cameras, echoes, encoders (with
        ``pacing_factor``; None = their default), the uplink limit; returns timings (s) of the steps."""
        lab, t0 = self.lab, time.monotonic()
        times: Dict[str, float] = {}
        self.say(f"robot.launch on {ROBOTS[0]} (ROS master)")
        self.procs.append(robots.start_robot(lab, ROBOTS[0], master=True))
        robots.peers(lab, ROBOTS[0], timeout=120, node=node(ROBOTS[0]))
        self.say(f"robot.launch on {', '.join(ROBOTS[1:])} and {LAPTOP}")
        for h in (*ROBOTS[1:], LAPTOP):
            self.procs.append(robots.start_robot(lab, h, master=False))
        for h in (*ROBOTS[1:], LAPTOP):
            robots.peers(lab, h, min_peers=1, timeout=150, node=node(h))
        times["nodes_up_s"] = round(time.monotonic() - t0, 1)
        lab.impair(ROBOT_BUILDING, Impairment(rate_mbit=uplink_mbit))
        for r in ROBOTS:
            ns = ros_namespace(r)
            camera = ["probe.rosnodes", "camera", "--topic", raw_topic(r), *camera_streams.video_args(self.video)]
            self.procs.append(robots.start_tool(lab, r, camera, "camera"))
            self.procs.append(robots.start_tool(lab, r, ["probe.rosnodes", "echo", "--input", f"/{ns}/cmd_vel",
                                                         "--output", f"/{ns}/cmd_vel_echo"], "twist_echo"))
            self.encoders[r] = camera_streams.start_encoder(
                lab, r, raw_topic(r), node(r), f"link_aware_camera_{ns}", budget_kbps, "encoder",
                params=None if pacing_factor is None else {"pacing_factor": pacing_factor})
        for r in ROBOTS:
            camera_streams.encoder_pids(self.encoders[r])  # each encoder's node is up
        self.wait_derp()
        times["derp_s"] = round(time.monotonic() - t0, 1)
        found = camera_streams.detect_many(lab, LAPTOP, [raw_topic(r) for r in ROBOTS])
        self.streams = {r: found[raw_topic(r)] for r in ROBOTS}
        times["ready_s"] = round(time.monotonic() - t0, 1)
        self.say(f"streams: {self.streams[ROBOTS[0]]} (and the same for each robot); {times}")
        return times

    def wait_derp(self, timeout: float = 90.0) -> None:
        """Until the laptop's node lists every robot on derp (pings first: paths show after traffic)."""
        spec = {"ping": [[node(LAPTOP), r] for r in ROBOTS], "ping_count": 1,
                "peers": {node(LAPTOP): {r: "derp" for r in ROBOTS}}}
        robots.run_probe(self.lab, LAPTOP, ["nodes", json.dumps(spec), "--timeout", f"{timeout:g}"],
                         timeout=timeout + 30)

    def kinds(self) -> List[str]:
        """Stream kinds every robot publishes, in report order (raw, jpeg, h264)."""
        return [k for k in ("raw", "jpeg", "h264") if all(k in self.streams.get(r, {}) for r in ROBOTS)]

    def best_kind(self) -> str:
        """h264 where published, otherwise jpeg (the link-aware JPEG stream)."""
        return "h264" if "h264" in self.kinds() else "jpeg"

    def measure(self, kind: str, seconds: float, psnr_every: int = 1, control: bool = True,
                frames: bool = False, during: Optional[Any] = None) -> Dict[str, Any]:
        """All four robots' ``kind`` streams in one viewer on the laptop for ``seconds``, a Twist
        round trip (50 Hz) to each robot at the same time, the encoders' CPU; ``during(t_start)``
        (optional) runs in its own thread once the viewer is measuring (for a congestion episode).
        The round trips start with the viewer and run TWIST_MARGIN_S longer than it measures; their
        statistics are those of the Twists sent in the viewer's window (from every stream's first
        message, for ``seconds``: probe ``window_stats``, ``covered`` = the share of that window
        they span), so the figures do not depend on how fast either probe starts.
        Returns {"streams": {robot: row}, "control": {robot: rtt}, "encoder_cpu_pct": {robot: %},
        "quality": the probe's JSON}."""
        out: Dict[str, Any] = {"control": {}}
        twists: Dict[str, Any] = {}  # robot -> its round trip probe's JSON (samples)
        topics = [(kind, self.streams[r][kind]) for r in ROBOTS]

        def viewer() -> None:
            out["quality"] = camera_streams.quality(self.lab, LAPTOP, topics, seconds, psnr_every=psnr_every,
                                                    frames=frames, video=self.video)

        def twist(r: str) -> None:
            ns = ros_namespace(r)
            try:
                twists[r] = robots.run_probe(
                    self.lab, LAPTOP, ["control", "--out", f"/{ns}/cmd_vel", "--echo", f"/{ns}/cmd_vel_echo",
                                       "--rate", "50", "--seconds", f"{seconds + TWIST_MARGIN_S:g}", "--samples"],
                    timeout=seconds + TWIST_MARGIN_S + 90)
            except Exception as exc:  # noqa: BLE001 - reported in the row, the streams still count
                out["control"][r] = {"error": str(exc)[:300]}

        threads = [threading.Thread(target=viewer)]
        if control:
            threads += [threading.Thread(target=twist, args=(r,)) for r in ROBOTS]
        samplers = {r: camera_streams.CpuSampler(camera_streams.encoder_pids(self.encoders[r])) for r in ROBOTS}
        for t in threads:
            t.start()
        extra: Optional[threading.Thread] = None
        while threads[0].is_alive() or any(t.is_alive() for t in threads[1:]):
            for s in samplers.values():
                s.sample()
            if during is not None and extra is None:
                extra = threading.Thread(target=during)
                extra.start()
            time.sleep(1.0)
        for t in threads:
            t.join()
        if extra is not None:
            extra.join()
        q = out.get("quality") or {}
        for r in ROBOTS:
            res = twists.get(r)
            if res is None:
                continue
            if q.get("t_start") is None:
                out["control"][r] = {"error": "the viewer measured no window to take the round trip in"}
                continue
            out["control"][r] = window_stats(res.get("samples") or [], q["t_start"], q["t_end"])
        streams = q.get("streams") or {}
        out["streams"] = {r: camera_streams.stream_row(streams.get(self.streams[r][kind], {})) for r in ROBOTS}
        out["encoder_cpu_pct"] = {r: (samplers[r].pct() if kind != "raw" else None) for r in ROBOTS}
        out["receiver_cpu_pct"] = q.get("receiver_cpu_pct")
        return out

    def late_subscriber(self, kind: str, robot: str, seconds: float = 4.0) -> Dict[str, Any]:
        """A new viewer of one robot's stream while the others stream: seconds to its first
        message and its first decoded picture (a keyframe for H.264)."""
        q = camera_streams.quality(self.lab, LAPTOP, [(kind, self.streams[robot][kind])], seconds,
                                   video=self.video)
        return camera_streams.stream_row(q["streams"][self.streams[robot][kind]])

    def stop(self) -> None:
        """Stop everything started here (by pid) and lift the uplink limit."""
        for p in self.encoders.values():
            robots.stop(self.lab, p)
        for p in reversed(self.procs):
            robots.stop(self.lab, p)
        try:
            self.lab.impair(ROBOT_BUILDING, None)
        except Exception:  # noqa: BLE001 - the lab may already be gone; its down() removes the qdisc too
            pass

