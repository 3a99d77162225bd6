"""A robot's sensor mix to a relayed laptop and a direct one: the set-up shared by the mix
benchmark (bench/mix.py) and its system test (test/system/test_robot_mix.py).

::

    building-robot (udp-blocked; uplink tbf 30 Mbit/s)                    building-ops (eim-adpf)
      alpha-robot1   roscore + robot.launch; camera 640x480 30 Hz          ops-laptop  robot.launch;
                     + link-aware H.264 encoder; cloud 10 Hz,                          a viewer of the
                     scan 40 Hz, map 1 Hz (mix_nodes publish);                         mix, Twist to
                     Twist echo; topic_tools throttle (mode throttle)                  the robot
      lab-laptop     robot.launch; a viewer of the mix     \\___ derp (relayed) ___/
         \\__ direct (the building's LAN) __/

The robot plays the real scene on its camera (probe.rosnodes camera: vtest.avi, 640x480 rgb8 30
Hz) into its link-aware encoder (``<image>/link_aware_h264``), publishes the cloud, scan and grid
of probe/mix_data.py (the Aloe stereo scene: 355,755-point cloud, 1282-beam scan, 2564 x 2220 grid;
module doc there) on ``/<ns>/points``, ``/<ns>/scan``, ``/<ns>/map`` (``ns`` =
ros_namespace(robot)) and echoes Twist (``/<ns>/cmd_vel`` -> ``/<ns>/cmd_vel_echo``). UDP is
blocked at the robot's router, so the robot <-> ops-laptop link is derp through the building's
30 Mbit/s uplink (tc tbf, both directions); lab-laptop is on the robot's LAN, a direct path that
never crosses the uplink.

Modes (what the relayed laptop subscribes to; the direct laptop always takes the raw topics):

    raw       the topics as published
    throttle  topic_tools throttle on the robot, rates set by hand as a user would
              (:data:`THROTTLE_HZ`: on paper 21 Mbit/s with the camera, 70 % of the uplink)
    shaped    the robot's topic shaper (:data:`SHAPER_PARAMS`): the relayed laptop takes
              ``<topic>/shaped``
"""
from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from overlay_manager.core.ros_names import overlay_node, ros_namespace
from overlay_manager.lab.campus import camera_streams, robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.spec_model import Impairment
from overlay_manager.system.waiting import tail

ROBOT, DIRECT, RELAYED = "alpha-robot1", "lab-laptop", "ops-laptop"
ROBOT_BUILDING, OPS_BUILDING = "building-robot", "building-ops"
SPEC: Dict[str, Any] = {
    "name": "robot_mix",
    "buildings": {
        ROBOT_BUILDING: {"nat": "udp-blocked", "hosts": {ROBOT: {"team": "alpha", "role": "robot"},
                                                         DIRECT: {"team": "alpha", "role": "operator"}}},
        OPS_BUILDING: {"nat": "eim-adpf", "hosts": {RELAYED: {"team": "alpha", "role": "operator"}}},
    },
    "teams": {"alpha": {"master": ROBOT}},
}
UPLINK_MBIT = 30.0
HEAVY = ("points", "scan", "map")
"""The mix's topics besides the camera, as ``/<ns>/<name>``."""
NOMINAL_HZ = {"points": 10.0, "scan": 40.0, "map": 1.0, "camera": 30.0}
"""Rates the robot publishes at (Hz)."""
THROTTLE_HZ = {"points": 0.3, "scan": 10.0, "map": 0.1}
"""topic_tools throttle rates for the relayed laptop, chosen by hand as a user would to fit the
30 Mbit/s uplink on paper: a 5.69 MB cloud every 3.3 s (13.7 Mbit/s), the 5.69 MB map every 10 s
(4.6), the 10.3 KB scan at 10 Hz (0.8); with the camera's 2.4 Mbit/s, 21.5 Mbit/s."""
MODES = ("shaped", "throttle", "raw")
"""In the order the benchmark runs them: raw last, as it leaves the relayed path's queues full."""
SHAPER_PARAMS: Dict[str, Any] = {
    "budget_kbps_derp": 4000, "compression": "zstd", "zstd_level": 1, "max_backlog_ms": 500,
    "topics": [{"topic": "points", "lossy": "decimate", "max_decimation": 64},
               {"topic": "scan"}, {"topic": "map"}]}
"""The robot's topic shaper in mode shaped (topic_shaper.launch params_file; topic names are
completed with the robot's namespace): 4 Mbit/s per topic for a relayed subscriber, zstd on
everything, the cloud may be decimated (every 64th point at most) for relayed subscribers, the
scan and the map lossless."""
CAMERA_WAIT_S = 60.0
"""How long the set-up waits for the encoder's H.264 topic (seconds; 8 s was too short on a
machine at load 15)."""
WARMUP_S = 3.0
"""Seconds a viewer waits after every topic's first message before it measures: what queued on
the way under the previous mode (or before a shaper's first message) drains first, in every mode
alike."""
IPERF_PORT = 5202
"""iperf3's port for :meth:`RobotMix.capacity` (robot.launch's own iperf server has 5201)."""


def ns() -> str:
    """The robot's ROS namespace."""
    return ros_namespace(ROBOT)


def topic(name: str) -> str:
    """``/<ns>/<name>`` of the robot's mix (``camera`` = the raw image topic)."""
    return f"/{ns()}/camera/image_raw" if name == "camera" else f"/{ns()}/{name}"


def throttled(name: str) -> str:
    """The topic_tools throttle output for ``name``."""
    return f"{topic(name)}_throttle"


class RobotMix:
    """The robot and both laptops in ``lab`` (made from :data:`SPEC`). Every process started is
    kept and stopped by pid in :meth:`stop`; ``say`` narrates."""

    def __init__(self, lab: Lab, say: Any = print, scene: str = "real", pacing_factor: Optional[float] = None,
                 camera_pacing_factor: Optional[float] = None) -> None:
        """``pacing_factor``: the shaper's and the camera's ``pacing_factor`` (None = their default: 2.5
        and 0); ``camera_pacing_factor``: the camera's alone, over ``pacing_factor`` (None = that)."""
        self.lab, self.say, self.scene, self.pacing_factor = lab, say, scene, pacing_factor
        self.camera_pacing_factor = pacing_factor if camera_pacing_factor is None else camera_pacing_factor
        self.procs: List[subprocess.Popen] = []
        self.encoder: Optional[subprocess.Popen] = None
        self.throttles: List[subprocess.Popen] = []
        self.shaper: Optional[subprocess.Popen] = None
        self.camera_stream = ""  # the camera topic the viewers take (H.264 when published)
        self.published: Dict[str, Any] = {}

    def start(self, uplink_mbit: float = UPLINK_MBIT) -> Dict[str, float]:
        """robot.launch on the three hosts (the robot is the master), the mix, the camera and its
        encoder, the echo, the uplink limit; waits for the paths (derp to ops-laptop, direct to
        lab-laptop). Returns timings (s) of the steps."""
        lab, t0 = self.lab, time.monotonic()
        times: Dict[str, float] = {}
        self.say(f"robot.launch on {ROBOT} (ROS master), then {DIRECT} and {RELAYED}")
        robots.start_master_then(lab, ROBOT, [DIRECT, RELAYED], self.procs)
        times["nodes_up_s"] = round(time.monotonic() - t0, 1)
        lab.impair(ROBOT_BUILDING, Impairment(rate_mbit=uplink_mbit))
        n = ns()
        self.procs.append(robots.start_tool(lab, ROBOT, ["probe.rosnodes", "camera", "--topic", topic("camera")],
                                            "camera"))
        self.procs.append(robots.start_tool(lab, ROBOT, ["probe.rosnodes", "echo", "--input", f"/{n}/cmd_vel",
                                                         "--output", f"/{n}/cmd_vel_echo"], "twist_echo"))
        self.procs.append(robots.start_tool(lab, ROBOT, ["probe.mix_nodes", "publish", "--ns", f"/{n}",
                                                         "--scene", self.scene], "mix"))
        self.encoder = camera_streams.start_encoder(lab, ROBOT, topic("camera"), overlay_node(ROBOT),
                                                    f"link_aware_camera_{n}", 6000.0, "encoder",
                                                    params=None if self.camera_pacing_factor is None else
                                                    {"pacing_factor": self.camera_pacing_factor})
        camera_streams.encoder_pids(self.encoder)
        self.wait_paths()
        times["paths_s"] = round(time.monotonic() - t0, 1)
        found = camera_streams.detect_streams(lab, RELAYED, topic("camera"), wait_s=CAMERA_WAIT_S)
        if "h264" not in found:  # the raw picture (221 Mbit/s) would swamp every path it crosses
            log = Path(lab.host_dir(ROBOT)) / "encoder.log"
            raise LabError(f"the link-aware encoder on {ROBOT} does not publish {topic('camera')}/link_aware_h264 "
                           f"after {CAMERA_WAIT_S:g} s (published: {found}); its log {log}: {tail(log, 8)}")
        self.camera_stream = found["h264"]
        self.published = self.wait_mix()
        times["ready_s"] = round(time.monotonic() - t0, 1)
        self.say(f"camera stream {self.camera_stream}; mix {self.published}; {times}")
        return times

    def wait_paths(self, timeout: float = 90.0) -> None:
        """Until ops-laptop's node lists the robot on derp and lab-laptop's on direct, each asked
        on its own host (pings first: paths show after traffic)."""
        for host, path in ((RELAYED, "derp"), (DIRECT, "direct")):
            spec = {"ping": [[overlay_node(host), ROBOT]], "ping_count": 1,
                    "peers": {overlay_node(host): {ROBOT: path}}}
            robots.run_probe(self.lab, host, ["nodes", json.dumps(spec), "--timeout", f"{timeout:g}"],
                             timeout=timeout + 30)

    def capacity(self, seconds: float = 5.0) -> Dict[str, Any]:
        """TCP throughput (iperf3, ``seconds``) from the robot to each laptop over the overlay,
        measured before any viewer subscribes: what each path carries on this machine now (the
        relayed one is bounded by the uplink and by the CPU that DERP's TLS and userspace WireGuard
        get). {host: {"tcp_mbps": ...} or {"error": ...}}."""
        server = self.lab.popen(ROBOT, ["iperf3", "-s", "-p", str(IPERF_PORT)],
                                log=Path(self.lab.host_dir(ROBOT)) / "iperf3.log")
        out: Dict[str, Any] = {}
        try:
            time.sleep(0.5)
            for host in (RELAYED, DIRECT):
                argv = ["iperf3", "-c", self.lab.overlay_ip(ROBOT), "-p", str(IPERF_PORT), "-R", "-t",
                        f"{seconds:g}", "-J", "--connect-timeout", "5000"]
                res = self.lab.exec(host, argv, timeout=seconds + 40, check=False, quiet=True)
                try:
                    data = json.loads(res.stdout)
                    out[host] = ({"error": data["error"]} if data.get("error") else
                                 {"tcp_mbps": round(data["end"]["sum_received"]["bits_per_second"] / 1e6, 1)})
                except (json.JSONDecodeError, KeyError) as exc:
                    out[host] = {"error": f"{exc}: {(res.stderr or res.stdout).strip()[-200:]}"}
        finally:
            robots.stop(self.lab, server)
        return out

    def wait_mix(self, timeout: float = 60.0) -> Dict[str, Any]:
        """The mix publisher's start line (sizes in bytes, rates) once it publishes."""
        log = Path(self.lab.host_dir(ROBOT)) / "mix.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in (log.read_text(errors="replace").splitlines() if log.exists() else []):
                if line.startswith("{"):
                    return json.loads(line)
            time.sleep(0.5)
        raise LabError(f"the mix publisher on {ROBOT} did not start publishing within {timeout:g} s; "
                       f"its log {log}: {tail(log, 8)}")

    def start_throttles(self) -> None:
        """topic_tools throttle on the robot for each heavy topic (:data:`THROTTLE_HZ`), as a user
        starts them: ``rosrun topic_tools throttle messages IN RATE OUT``."""
        if self.throttles:
            return
        for name, hz in THROTTLE_HZ.items():
            line = (f"{robots.overlay_env_line(self.lab, ROBOT)} && exec rosrun topic_tools throttle messages "
                    f"{shlex.quote(topic(name))} {hz:g} {shlex.quote(throttled(name))}")
            self.throttles.append(self.lab.popen(ROBOT, ["bash", "-c", line], env=robots.ros_env(self.lab, ROBOT),
                                                 log=Path(self.lab.host_dir(ROBOT)) / f"throttle_{name}.log"))

    def start_shaper(self) -> None:
        """The robot's topic shaper for the heavy topics (``roslaunch overlay_manager
        topic_shaper.launch params_file:=...``, the settings of :data:`SHAPER_PARAMS`), as a user
        starts it beside robot.launch; waits until it advertises every ``<topic>/shaped``."""
        if self.shaper is not None:
            return
        import yaml

        params = dict(SHAPER_PARAMS)
        if self.pacing_factor is not None:
            params["pacing_factor"] = self.pacing_factor
        params["topics"] = [dict(e, topic=topic(e["topic"])) for e in SHAPER_PARAMS["topics"]]
        path = Path(self.lab.host_dir(ROBOT)) / "shaping.yaml"
        path.write_text(yaml.safe_dump(params, sort_keys=False))
        line = (f"{robots.overlay_env_line(self.lab, ROBOT)} && exec roslaunch overlay_manager topic_shaper.launch "
                f"params_file:={shlex.quote(str(path))} overlay_node:={shlex.quote(overlay_node(ROBOT))}")
        self.shaper = self.lab.popen(ROBOT, ["bash", "-c", line], env=robots.ros_env(self.lab, ROBOT),
                                     log=Path(self.lab.host_dir(ROBOT)) / "topic_shaper.log")
        args = ["topics", "--timeout", "60"]
        for n in HEAVY:
            args += ["--wait-for", f"{topic(n)}/shaped"]
        missing = robots.run_probe(self.lab, RELAYED, args, timeout=90).get("missing")
        if missing:
            raise LabError(f"the topic shaper on {ROBOT} does not advertise {missing} after 60 s; its log "
                           f"{Path(self.lab.host_dir(ROBOT)) / 'topic_shaper.log'}: "
                           f"{tail(Path(self.lab.host_dir(ROBOT)) / 'topic_shaper.log', 8)}")

    def shaped_topics(self) -> Dict[str, str]:
        """name -> ``<topic>/shaped`` (overlay_manager/ShapedMessage, whose header is the
        original's: the viewer's ages are those of the original messages), with the shaper
        running."""
        self.start_shaper()
        return {n: f"{topic(n)}/shaped" for n in HEAVY}

    def relayed_topics(self, mode: str) -> Dict[str, str]:
        """name -> topic the relayed laptop subscribes to in ``mode``."""
        out = {"camera": self.camera_stream}
        if mode == "raw":
            out.update({n: topic(n) for n in HEAVY})
        elif mode == "throttle":
            self.start_throttles()
            out.update({n: throttled(n) for n in HEAVY})
        elif mode == "shaped":
            out.update(self.shaped_topics())
        else:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        return out

    def direct_topics(self) -> Dict[str, str]:
        """name -> topic the direct laptop subscribes to (the raw mix and the camera stream)."""
        return {"camera": self.camera_stream, **{n: topic(n) for n in HEAVY}}

    def ages(self, host: str, topics: Dict[str, str], seconds: float, timeout: float = 40.0,
             warmup: float = WARMUP_S) -> Dict[str, Any]:
        """``mix_nodes ages`` on ``host`` for ``topics`` (name -> topic): {name: report}, the
        probe's window and ``missing`` names."""
        args = ["ages", "--seconds", f"{seconds:g}", "--timeout", f"{timeout:g}", "--warmup", f"{warmup:g}"]
        for t in topics.values():
            args += ["--topic", t]
        inner = (f"{robots.overlay_env_line(self.lab, host)} && exec /usr/bin/python3 "
                 "-m overlay_manager.lab.probe.mix_nodes " + " ".join(shlex.quote(a) for a in args))
        res = self.lab.exec(host, ["bash", "-c", inner], env=robots.ros_env(self.lab, host),
                            timeout=seconds + timeout + warmup + 60, check=False, quiet=True)
        data = robots.json_result(res, f"mix_nodes ages on {host}")
        by_topic = data["topics"]
        return {"topics": {name: by_topic[t] for name, t in topics.items()}, "t_start": data["t_start"],
                "t_end": data["t_end"], "missing": [n for n, t in topics.items() if t in data["missing"]]}

    def measure(self, mode: str, seconds: float, direct: bool = True, control: bool = True,
                relayed: bool = True) -> Dict[str, Any]:
        """One mode for ``seconds``: the relayed laptop's viewer of :meth:`relayed_topics` (unless
        ``relayed`` is False), the direct laptop's of the raw mix (unless ``direct`` is False) and a
        50 Hz Twist round trip from the relayed laptop at the same time. Returns {"relayed": ages,
        "direct": ages, "control": rtt, "topics": name -> topic}."""
        topics = self.relayed_topics(mode)
        out: Dict[str, Any] = {"topics": topics}

        def run(key: str, fn: Any) -> None:
            try:
                out[key] = fn()
            except Exception as exc:  # noqa: BLE001 - reported in the result, the others still count
                out[key] = {"error": str(exc)[:500]}

        n = ns()
        jobs = []
        if relayed:
            jobs.append(threading.Thread(target=run, args=("relayed", lambda: self.ages(RELAYED, topics, seconds))))
        if direct:
            jobs.append(threading.Thread(target=run, args=("direct", lambda: self.ages(DIRECT, self.direct_topics(),
                                                                                      seconds))))
        if control:
            def twist() -> Dict[str, Any]:
                time.sleep(3.0 + WARMUP_S)  # the viewers subscribe first: the round trip is measured under the load
                res = robots.run_probe(self.lab, RELAYED, ["control", "--out", f"/{n}/cmd_vel", "--echo",
                                                           f"/{n}/cmd_vel_echo", "--rate", "50", "--seconds",
                                                           f"{max(2.0, seconds - 2.0):g}"], timeout=seconds + 90)
                return {k: res.get(k) for k in ("rtt_p50_ms", "rtt_p99_ms", "rtt_max_ms", "sent", "received")}
            jobs.append(threading.Thread(target=run, args=("control", twist)))
        for j in jobs:
            j.start()
        for j in jobs:
            j.join()
        return out

    def stop(self) -> None:
        """Stop everything started here (by pid) and lift the uplink limit."""
        for p in self.throttles + ([self.shaper] if self.shaper is not None else []):
            robots.stop(self.lab, p)
        if self.encoder is not None:
            robots.stop(self.lab, self.encoder)
        for p in reversed(self.procs):
            robots.stop(self.lab, p)
        try:
            self.lab.impair(ROBOT_BUILDING, None)
        except Exception:  # noqa: BLE001 - the lab may already be gone; its down() removes the qdisc too
            pass


def goal_rows(res: Dict[str, Any], names: Sequence[str]) -> Dict[str, Any]:
    """The per-topic figures of one viewer's ages result that the reports keep (no series)."""
    topics = (res or {}).get("topics") or {}
    keep = ("count", "rate_hz", "latency_p50_ms", "latency_p99_ms", "age_p50_ms", "age_p99_ms", "age_max_ms",
            "bytes_p50", "kbps", "latency_growth_ms", "latency_slope_ms_per_s", "first_message_s", "no_header")
    return {n: {k: (topics.get(n) or {}).get(k) for k in keep} for n in names}
