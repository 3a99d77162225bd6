"""Camera benchmark (not a test): raw vs link-aware JPEG vs H.264 across a 30 Mbit/s relayed campus link.

    sudo bash scripts/bench_camera [--out artifacts] [--seconds 8]
         [--uplink-mbit 30] [--budgets 8000,4000] [--columns direct,derp,peer-relay] [--video FILE]

One lab run::

    robot1 (b1, eim-adpf; uplink tbf 30 Mbit/s)  ---  backbone  ---  laptop (b2, eim-adpf)
      roscore + robot.launch, lab camera 640x480                        robot.launch, probes
      rgb8 30 Hz (real scene), Twist echo, link-aware encoder                 |
                                             relay1 (campus, public): peer relay, UDP 40000

Columns, each the laptop -> robot1 path: ``direct`` (hole punched), ``derp`` (UDP blocked at
b1's router) and ``peer-relay`` (b1 lets UDP out only to STUN and relay1's port; relay1's relay
server on). Per column, measured from the laptop: the Twist round trip (50 Hz, echoed on robot1)
with no camera; then the raw ``/camera/image_raw``, the link-aware JPEG stream and, where the
encoder publishes it, the link-aware H.264 stream (camera_streams.detect_streams), each alone,
while the Twist round trip runs: delivered rate, PSNR of every decoded picture against its
source frame (probe quality: the camera plays a real scene and names each frame's index in
header.frame_id), latency (receive time - header.stamp, one wall clock), bitrate (payload bytes
received), and for the encoded streams the encoder's process CPU (utime + stime of the encoder
launch's processes from /proc, sampled each second, over the seconds in which it worked: it
encodes only while subscribed) and decisions (quality, rate, budget from ``stream_state``).
Relayed columns repeat the encoded streams for each ``--budgets`` value (kbit/s for derp and
peer-relay): a budget well below the link's capacity is the lever that keeps control responsive.

The camera plays opencv-doc's vtest.avi (a pedestrian street) by default; ``--video FILE`` plays
another real scene (any video OpenCV reads; its first 300 frames, scaled to 640x480, looping),
and every PSNR is computed against that file's frames. The file is checked (its first frame must
decode) before the lab comes up.

Writes out/bench_camera.json, bench_camera.md, bench_camera.png. Everything started is stopped
by pid; the lab run is torn down by Lab.down() whatever happens. About 5 min on 2 cores.

``--tiers``: two viewers of one camera at once (the tiers of one link-aware stream)::

    sudo bash scripts/bench_camera --tiers [--kinds h264,jpeg]
         [--seconds 10] [--uplink-mbit 30] [--pattern scene|synthetic] [--video FILE]

    robot1 (b1, eim-adpf; uplink tbf 30 Mbit/s)  ---  backbone  ---  laptop (b2, eim-adpf): direct
      robot.launch (roscore), lab camera 640x480 rgb8 30 Hz,    +---  laptop2 (b3, UDP dropped): derp
      the link-aware republisher (link_aware_camera.launch)

The laptop's path to robot1 is direct (hole punched), laptop2's is relayed through DERP (b3's
router drops UDP); both cross b1's 30 Mbit/s uplink. Per stream kind (H.264 first, then JPEG),
three runs with the same scene, one after the other, each on a fresh republisher:
``tiers`` (the default: the laptop reads the full tier ``<stream>/full``, laptop2 the fitted tier
``<stream>``, which is where the stream's directory sends each path), ``one stream``
(``tiers: false``: both read ``<stream>``, one stream fitted to the relayed viewer) and ``full
alone`` (the laptop alone on ``<stream>/full``: one full-quality stream). Each viewer is
``probe quality`` on its machine (it decodes every message and computes PSNR against the source
frame); per viewer: delivered rate, bitrate received, PSNR mean / p5, latency. Encoder CPU = the
republisher's utime + stime over the window in which its viewers received (% of one core); the
ratio tiers / one stream is the goal's (``cpu_ratio``), tiers / full alone is reported beside it
(``cpu_ratio_full``: the fitted tier added to one full-quality stream). Writes
out/bench_camera_tiers.json and bench_camera_tiers.md. About 5 min on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.lab.bench.report import replot, write_report
from overlay_manager.lab.campus import camera_streams, robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.spec_model import Impairment
from overlay_manager.lab.campus.system import wait_for

REPO_ROOT = Path(__file__).resolve().parents[3]
SPEC: Dict[str, Any] = {
    "name": "bench_camera",
    "buildings": {
        "b1": {"nat": "eim-adpf", "hosts": {"robot1": {"team": "alpha", "role": "robot"}}},
        "b2": {"nat": "eim-adpf", "hosts": {"laptop": {"team": "alpha", "role": "operator"}}},
        "campus": {"nat": "public", "hosts": {"relay1": {"team": "alpha", "role": "base_station"}}},
    },
    "teams": {"alpha": {"master": "robot1"}},
    "relays": {"relay1": {"port": 40000}},
}
ROBOT, LAPTOP, RELAY, B1 = "robot1", "laptop", "relay1", "b1"
N_ROBOT, N_LAPTOP = overlay_node(ROBOT), overlay_node(LAPTOP)
RAW = "/camera/image_raw"
STREAM_KEYS = {"jpeg": "link-aware", "h264": "h264"}
"""Result keys of the encoded streams (then `` <budget Mbit/s>`` on relayed columns)."""
COLUMNS = ("direct", "derp", "peer-relay")
LAPTOP2, B3 = "laptop2", "b3"
TIERS_SPEC: Dict[str, Any] = {
    "name": "bench_tiers",
    "buildings": {
        "b1": {"nat": "eim-adpf", "hosts": {ROBOT: {"team": "alpha", "role": "robot"}}},
        "b2": {"nat": "eim-adpf", "hosts": {LAPTOP: {"team": "alpha", "role": "operator"}}},
        B3: {"nat": "eim-adpf", "hosts": {LAPTOP2: {"team": "alpha", "role": "operator"}}},
    },
    "teams": {"alpha": {"master": ROBOT}},
}
TIER_VIEWERS = {"direct": LAPTOP, "relayed": LAPTOP2}
"""Viewer role -> the machine it runs on (``--tiers``)."""
TIER_GOALS = {"direct": {"rate_hz": 29.0, "psnr_mean": 45.0}, "relayed": {"rate_hz": 29.0, "psnr_mean": 40.0,
                                                                          "mbit": 2.0}, "cpu_ratio": 1.6}
"""Goals of the two-viewer run: per viewer (delivered Hz, PSNR dB, Mbit/s at most) and the
encoder's CPU with both tiers as a multiple of one stream's."""


def say(msg: str) -> None:
    """Progress on stderr."""
    print(f"[bench_camera] {msg}", file=sys.stderr, flush=True)


class CameraBench:
    """One bench run's lab, processes and measurements."""

    def __init__(self, lab: Lab, seconds: float, video: str = "") -> None:
        self.lab = lab
        self.seconds = seconds
        self.video = video  # the file the camera plays ("" = the lab camera's default scene)
        self.procs: List[subprocess.Popen] = []
        self.encoder: Optional[subprocess.Popen] = None
        self.encoder_pids: List[int] = []
        self.streams: Dict[str, str] = {"raw": RAW}  # kind -> topic (camera_streams.detect_streams)

    # --- set-up ---------------------------------------------------------------------------
    def start(self, uplink_mbit: float, viewers: Sequence[str] = (LAPTOP,), pattern: str = "scene") -> None:
        """robot.launch on robot1 (master) and the viewers' machines, camera (playing ``pattern``)
        and echo on robot1, b1's uplink limit."""
        say(f"robot.launch on robot1 (master) and {', '.join(viewers)}")
        robots.start_master_then(self.lab, ROBOT, list(viewers), self.procs)
        camera = ["probe.rosnodes", "camera", "--topic", RAW, "--pattern", pattern]
        self.procs.append(robots.start_tool(self.lab, ROBOT, camera + camera_streams.video_args(self.video),
                                            "camera"))
        self.procs.append(robots.start_echo(self.lab, ROBOT))
        self.lab.impair(B1, Impairment(rate_mbit=uplink_mbit))

    def start_encoder(self, budget_kbps: float, params: Optional[Dict[str, Any]] = None, tag: str = "") -> None:
        """(Re)start the link-aware encoder on robot1 (link_aware_camera.launch, as robot.launch's
        camera_topics does) with this budget for derp and peer-relay (and more parameters:
        camera_streams.start_encoder); note which streams it publishes (JPEG, and H.264 where the
        encoder has it)."""
        self.stop_encoder()
        name = f"encoder_{budget_kbps:g}{tag}"
        self.encoder = camera_streams.start_encoder(self.lab, ROBOT, RAW, N_ROBOT, "link_aware_camera", budget_kbps,
                                                    name, params)
        try:
            self.encoder_pids = camera_streams.encoder_pids(self.encoder)
        except LabError:
            log = Path(self.lab.host_dir(ROBOT)) / f"{name}.log"
            say(f"encoder log {log}:\n" + (log.read_text(errors="replace")[-3000:] if log.exists() else "(none)"))
            raise
        # the first encoder gets 8 s to advertise H.264; later ones are the same binary: once it did,
        # they get 20 s (the wait ends as soon as the topic is listed; a loaded machine has taken
        # more than 3 s to start a republisher), else 3 s
        had_h264 = "h264" in self.streams
        self.streams = camera_streams.detect_streams(self.lab, LAPTOP, RAW, wait_s=20.0 if had_h264 else
                                                     (8.0 if len(self.streams) < 2 else 3.0))

    def stop_encoder(self) -> None:
        """Stop the encoder's roslaunch (by pid)."""
        if self.encoder is not None:
            robots.stop(self.lab, self.encoder)
            self.encoder = None
            self.encoder_pids = []

    def stop(self) -> None:
        """Stop everything started here (by pid)."""
        self.stop_encoder()
        for p in reversed(self.procs):
            robots.stop(self.lab, p)

    def ts_path(self) -> str:
        """laptop -> robot1 path as ``tailscale ping`` proves it."""
        return self.lab.ping(LAPTOP, ROBOT, count=2, timeout=30).path

    def wait_path(self, path: str, timeout: float = 90.0) -> None:
        """Until tailscale proves ``path`` and both nodes' ~peers say it (the encoder reads robot1's)."""
        wait_for(f"the laptop -> robot1 path to turn {path}", lambda: self.ts_path() == path, timeout)
        for host, node, other in ((ROBOT, N_ROBOT, LAPTOP), (LAPTOP, N_LAPTOP, ROBOT)):
            robots.peers(self.lab, host, node=node, timeout=timeout,
                         where=f"any(p['name'] == '{other}' and p['path'] == '{path}' for p in m['peers'])")

    # --- measurements ---------------------------------------------------------------------
    def control(self, seconds: float) -> Dict[str, Any]:
        """Twist round trip laptop -> robot1 -> laptop at 50 Hz (tcp_nodelay both ways)."""
        res = robots.run_probe(self.lab, LAPTOP, ["control", "--rate", "50", "--seconds", f"{seconds:g}"],
                               timeout=seconds + 90)
        return {k: res.get(k) for k in ("rtt_p50_ms", "rtt_p99_ms", "rtt_max_ms", "sent", "received")}

    def stream(self, kind: str) -> Dict[str, Any]:
        """Receive the ``kind`` stream (raw, jpeg, h264) on the laptop for self.seconds while the
        Twist round trip runs: rate, latency, bitrate, PSNR; for encoded streams also the
        encoder's stream_state and its processes' CPU over the same window."""
        topic = self.streams[kind]
        encoded = kind != "raw"
        out: Dict[str, Any] = {}

        def view() -> None:
            out["quality"] = camera_streams.quality(self.lab, LAPTOP, [(kind, topic)], self.seconds,
                                                    video=self.video)

        def control() -> None:
            time.sleep(3.0)  # the stream runs first
            out["control"] = self.control(max(2.0, self.seconds - 4.0))

        def states() -> None:
            try:
                out["state"] = robots.run_probe(self.lab, LAPTOP, ["collect", topic + "/stream_state",
                                                                   "overlay_manager/StreamState", "--seconds",
                                                                   f"{self.seconds + 3:g}"], timeout=self.seconds + 90)
            except LabError as exc:  # a stream without decisions in this format: the row says "-"
                say(f"no stream_state for {topic}: {exc}")

        threads = [threading.Thread(target=f) for f in ((view, control, states) if encoded else (view, control))]
        for t in threads:
            t.start()
        sampler = camera_streams.CpuSampler(camera_streams.encoder_pids(self.encoder) if encoded and self.encoder
                                            else [])
        while any(t.is_alive() for t in threads):
            if encoded:
                sampler.sample()
            time.sleep(1.0)
        for t in threads:
            t.join(timeout=self.seconds + 120)
        q = ((out.get("quality") or {}).get("streams") or {}).get(topic) or {}
        camera_streams.check_index(q, f"{kind} {topic}")
        res: Dict[str, Any] = camera_streams.stream_row(q)
        res["bytes_per_s"] = (q.get("bytes_per_s") or 0.0)
        res["control"] = out.get("control")
        if not encoded:
            return res
        msgs = [m for m in (out.get("state") or {}).get("msgs") or [] if m["subscribers"] and m["bitrate_kbps"] > 0]
        if msgs:
            last = msgs[-1]
            res["state"] = {k: last.get(k) for k in ("quality", "rate_hz", "budget_kbps", "limited_by", "reason",
                                                     "frame_bytes", "encode_ms", "output_rate_hz")}
            res["state"]["paths"] = {s["host"]: s["path"] for s in last["subscribers"]}
        res["encoder_cpu_pct"] = sampler.pct()
        return res


def _column(lab: Lab, bench: CameraBench, col: str, seconds: float, budgets: Sequence[float]) -> Dict[str, Any]:
    """Set up the path of one column and measure control alone, raw, and each encoded stream per budget."""
    if col == "derp":
        lab.block_udp(B1)
    elif col == "peer-relay":
        say("relay1: enrol, relay server on from its bundle; b1 lets UDP out to servers only")
        lab.tailscale_up(RELAY)
        lab.enable_relays()
        lab.unblock_udp(B1)
        lab.udp_servers_only(B1)
    bench.wait_path(col)
    say(f"{col}: Twist round trip, no camera")
    res: Dict[str, Any] = {"control_idle": bench.control(max(2.0, seconds - 4.0))}
    say(f"{col}: raw {RAW}")
    res["raw"] = bench.stream("raw")
    say(f"{col} raw: {json.dumps(res['raw'])}")
    try:
        for budget in (budgets if col != "direct" else budgets[:1]):
            bench.start_encoder(budget)
            for kind in ("jpeg", "h264"):
                if kind not in bench.streams:
                    continue
                key = STREAM_KEYS[kind] + (f" {budget / 1000:g}" if col != "direct" else "")
                say(f"{col}: {key} {bench.streams[kind]}")
                res[key] = bench.stream(kind)
                say(f"{col} {key}: {json.dumps(res[key])}")
    finally:
        bench.stop_encoder()
    return res


# --- two viewers, two tiers (--tiers) ------------------------------------------------------------

def _wait_tier_paths(lab: Lab) -> None:
    """Until tailscale proves each viewer's path to robot1 and robot1's ~peers (the encoder's) says it."""
    for role, host in TIER_VIEWERS.items():
        path = "direct" if role == "direct" else "derp"
        wait_for(f"the {host} -> robot1 path to turn {path}",
                 lambda host=host, path=path: lab.ping(host, ROBOT, count=2, timeout=30).path == path, 90)
        robots.peers(lab, ROBOT, node=N_ROBOT, timeout=90,
                     where=f"any(p['name'] == '{host}' and p['path'] == '{path}' for p in m['peers'])")


def _cpu_in_window(samples: Sequence[Any], t0: float, t1: float) -> Optional[float]:
    """% of one core of the sampled processes between t0 and t1 (CLOCK_MONOTONIC s), from the
    samples (time, CPU s) nearest inside the window; None without two samples there."""
    inside = [(t, c) for t, c in samples if t0 <= t <= t1 and c is not None]
    if len(inside) < 2 or inside[-1][0] - inside[0][0] <= 0:
        return None
    return round(100.0 * (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]), 1)


TIER_MODES = ("tiers", "one stream", "full alone")
"""The runs per kind: both viewers with tiers, both on one stream (``tiers: false``), and the direct
viewer alone on the full tier (the cost of one full-quality stream)."""


def tier_run(bench: CameraBench, kind: str, tiered: bool, seconds: float,
             roles: Sequence[str] = tuple(TIER_VIEWERS)) -> Dict[str, Any]:
    """The viewers of ``roles`` (both by default) at once on the ``kind`` stream of a fresh
    republisher (``tiers`` on or off): per viewer its probe's row and Mbit/s; the encoder's CPU over
    the window all of them received in; the tiers' stream_state at the end."""
    # tiers given either way and in each stream's own namespace: the parameter server keeps what an
    # earlier republisher loaded, and the republisher copies shared keys into the streams' namespaces
    bench.start_encoder(6000.0, {"tiers": tiered, "link_aware": {"tiers": tiered},
                                 "link_aware_h264": {"tiers": tiered}}, "_tiers" if tiered else "_one")
    if kind not in bench.streams:
        raise LabError(f"the republisher does not publish a {kind} stream ({bench.streams})")
    base = bench.streams[kind]
    topics = {role: t for role, t in (("direct", base + "/full" if tiered else base), ("relayed", base))
              if role in roles}
    out: Dict[str, Any] = {}

    def view(role: str) -> None:
        try:
            out[role] = camera_streams.quality(bench.lab, TIER_VIEWERS[role], [(kind, topics[role])], seconds,
                                               video=bench.video)
        except LabError as exc:
            out[role + "_error"] = str(exc)

    def states(topic: str) -> None:
        try:
            out["state " + topic] = robots.run_probe(bench.lab, ROBOT, ["collect", topic + "/stream_state",
                                                                        "overlay_manager/StreamState",
                                                                        "--seconds", f"{seconds + 3:g}"],
                                                     timeout=seconds + 90)
        except LabError as exc:
            say(f"no stream_state for {topic}: {exc}")

    threads = [threading.Thread(target=view, args=(role,)) for role in topics]
    threads += [threading.Thread(target=states, args=(topic,)) for topic in sorted(set(topics.values()))]
    for t in threads:
        t.start()
    sampler = camera_streams.CpuSampler(camera_streams.encoder_pids(bench.encoder) if bench.encoder else [])
    while any(t.is_alive() for t in threads):
        sampler.sample()
        time.sleep(0.5)
    for t in threads:
        t.join()
    res: Dict[str, Any] = {"tiers": tiered, "topics": topics}
    windows = []
    for role in topics:
        if role + "_error" in out:
            res[role] = {"error": out[role + "_error"]}
            continue
        q = ((out.get(role) or {}).get("streams") or {}).get(topics[role]) or {}
        camera_streams.check_index(q, f"{role} viewer {topics[role]}")
        row = camera_streams.stream_row(q)
        row["mbit"] = round((q.get("bytes_per_s") or 0.0) * 8 / 1e6, 3)
        res[role] = row
        windows.append((out[role]["t_start"], out[role]["t_end"]))
    if windows and len(windows) == len(topics):
        t0, t1 = max(w[0] for w in windows), min(w[1] for w in windows)
        res["both_s"] = round(t1 - t0, 1)
        res["encoder_cpu_pct"] = _cpu_in_window(sampler.samples, t0, t1)
    res["encoder_cpu_active_pct"] = sampler.pct()
    res["state"] = {}
    for topic in set(topics.values()):
        msgs = [m for m in (out.get("state " + topic) or {}).get("msgs") or [] if m["subscribers"]]
        if msgs:
            last = msgs[-1]
            res["state"][topic] = {k: last.get(k) for k in ("tier", "quality", "video_bitrate_kbps", "rate_hz",
                                                            "bitrate_kbps", "budget_kbps", "limited_by", "reason",
                                                            "encode_ms", "output_rate_hz")}
            res["state"][topic]["subscribers"] = {x["host"]: x["path"] for x in last["subscribers"]}
    bench.stop_encoder()
    return res


def tier_goals(res: Dict[str, Any], one: Optional[Dict[str, Any]],
               full: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Each goal of TIER_GOALS: the measured value and whether it is met (None: not measured).
    ``one``: the one-stream run (both viewers on one stream fitted to the relayed one), the goal's
    ratio; ``full``: the direct viewer alone on the full tier, a second ratio reported beside it
    (``cpu_ratio_full``: the cost of the fitted tier added to one full-quality stream)."""
    out: Dict[str, Any] = {}
    for role in ("direct", "relayed"):
        row = res.get(role) or {}
        for key, goal in TIER_GOALS[role].items():
            v = row.get(key)
            met = None if v is None else (v <= goal if key == "mbit" else v >= goal)
            out[f"{role} {key}"] = {"value": v, "goal": goal, "met": met}
    a, b = res.get("encoder_cpu_pct"), (one or {}).get("encoder_cpu_pct")
    ratio = round(a / b, 2) if a and b else None
    out["cpu_ratio"] = {"value": ratio, "goal": TIER_GOALS["cpu_ratio"],
                        "met": None if ratio is None else ratio <= TIER_GOALS["cpu_ratio"]}
    if full is not None:
        c = full.get("encoder_cpu_pct")
        ratio = round(a / c, 2) if a and c else None
        out["cpu_ratio_full"] = {"value": ratio, "goal": TIER_GOALS["cpu_ratio"],
                                 "met": None if ratio is None else ratio <= TIER_GOALS["cpu_ratio"]}
    return out


def run_tiers(out_dir: Path, seconds: float, uplink_mbit: float, kinds: Sequence[str], pattern: str,
              run_id: Optional[str] = None, video: str = "") -> Dict[str, Any]:
    """The two-viewer tier benchmark (see the module doc); returns the JSON data (also written).
    ``video``: the file the camera plays with ``pattern`` scene ("" = the default scene)."""
    t_run = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    lab = Lab(TIERS_SPEC, run_id=run_id)
    bench = CameraBench(lab, seconds, video)
    results: Dict[str, Dict[str, Any]] = {}
    errors: List[str] = []
    try:
        lab.up()
        bench.start(uplink_mbit, viewers=list(TIER_VIEWERS.values()), pattern=pattern)
        lab.block_udp(B3)
        _wait_tier_paths(lab)
        for kind in kinds:
            try:
                for mode in TIER_MODES:
                    key = f"{kind} {mode}"
                    roles = ("direct",) if mode == "full alone" else tuple(TIER_VIEWERS)
                    say(f"{key}: " + ("both viewers at once" if len(roles) == 2 else "the direct viewer alone"))
                    results[key] = tier_run(bench, kind, mode != "one stream", seconds, roles)
                    say(f"{key}: {json.dumps(results[key])}")
                results[kind + " tiers"]["goals"] = tier_goals(results[kind + " tiers"],
                                                               results.get(kind + " one stream"),
                                                               results.get(kind + " full alone"))
            except LabError as exc:  # keep the other kind; the report names what failed
                errors.append(f"{kind}: {exc}")
                say(f"{kind}: failed: {exc}")
    finally:
        bench.stop()
        lab.down()
    data = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds": seconds, "uplink_mbit": uplink_mbit,
                     "cores": os.cpu_count(), "pattern": pattern,
                     "image": (camera_streams.scene_image(video)
                               if pattern == "scene" else f"{pattern} pattern, 640x480 rgb8, 30 Hz"),
                     "viewers": TIER_VIEWERS, "run_seconds": round(time.monotonic() - t_run), "errors": errors,
                     "load_start": load_start, "load_end": [round(x, 2) for x in os.getloadavg()]},
            "kinds": list(kinds), "results": results}
    write_report(out_dir, "bench_camera_tiers", data, render_tiers_markdown, lambda _data, _out: None)
    return data


def render_tiers_markdown(data: Dict[str, Any]) -> str:
    """One table: per kind and mode a row per viewer; then the goals."""
    m = data["meta"]
    lines = [f"Tier benchmark {m['date']}: {m['image']}, b1 uplink tbf {m['uplink_mbit']:g} Mbit/s, both viewers "
             f"at once for {m['seconds']:g} s, {m['cores']} cores, load average {m['load_start']} at the start, "
             f"{m['load_end']} at the end.", "",
             "| stream | mode | viewer (path) | topic read | rate Hz | PSNR (YUV 4:2:0) mean / p5 dB | Mbit/s "
             "| latency p50 / p99 ms | encoder CPU % (its viewers receiving) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, res in data["results"].items():
        kind, _, mode = key.partition(" ")
        for role in ("direct", "relayed"):
            if role not in res["topics"]:
                continue
            r = res.get(role) or {}
            if "error" in r:
                lines.append(f"| {kind} | {mode} | {role} | {res['topics'][role]} | not measured: {r['error']} "
                             "| | | | |")
                continue
            path = "direct" if role == "direct" else "derp"
            lines.append(f"| {KIND_NAMES.get(kind, kind)} | {mode} | {TIER_VIEWERS[role]} ({path}) | "
                         f"`{res['topics'][role]}` | {_f(r.get('rate_hz'), '{:.1f}')} | "
                         f"{_psnr(r.get('psnr_mean'))} / {_psnr(r.get('psnr_p5'))} | {_f(r.get('mbit'), '{:.2f}')} | "
                         f"{_f(r.get('latency_p50_ms'))} / {_f(r.get('latency_p99_ms'))} | "
                         f"{_f(res.get('encoder_cpu_pct'), '{:.1f}')} |")
    for key, res in data["results"].items():
        goals = res.get("goals")
        if not goals:
            continue
        parts = []
        for name, g in goals.items():
            verdict = {True: "met", False: "missed", None: "not measured"}[g["met"]]
            value = round(g["value"], 2) if isinstance(g["value"], float) else g["value"]
            parts.append(f"{name} {value} (goal {'<=' if name.endswith('mbit') or 'ratio' in name else '>='} "
                         f"{g['goal']:g}): {verdict}")
        lines.append(f"\nGoals, {key}: " + "; ".join(parts) + ".")
    for err in m.get("errors") or []:
        lines.append(f"\nNot measured: {err}")
    return "\n".join(lines) + "\n"


KIND_NAMES = {"h264": "H.264", "jpeg": "JPEG"}


def run(out_dir: Path, seconds: float, uplink_mbit: float, budgets: Sequence[float], columns: Sequence[str],
        run_id: Optional[str] = None, video: str = "") -> Dict[str, Any]:
    """The whole camera benchmark; returns the JSON data (also written to out_dir). ``video``: the
    file the camera plays ("" = the default scene)."""
    t_run = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    lab = Lab(SPEC, run_id=run_id)
    bench = CameraBench(lab, seconds, video)
    results: Dict[str, Dict[str, Any]] = {}
    errors: List[str] = []
    try:
        lab.up()
        bench.start(uplink_mbit)
        for col in columns:
            try:
                results[col] = _column(lab, bench, col, seconds, budgets)
            except LabError as exc:  # keep the other columns; the report names what failed
                errors.append(f"{col}: {exc}")
                say(f"{col}: failed: {exc}")
    finally:
        bench.stop()
        lab.down()
    data = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds_per_stream": seconds,
                     "uplink_mbit": uplink_mbit, "budgets_kbps": list(budgets), "cores": os.cpu_count(),
                     "image": camera_streams.scene_image(video),
                     "control_hz": 50, "run_seconds": round(time.monotonic() - t_run), "errors": errors,
                     "load_start": load_start, "load_end": [round(x, 2) for x in os.getloadavg()]},
            "columns": list(columns), "results": results}
    write_report(out_dir, "bench_camera", data, render_markdown, plot)
    return data


def _f(v: Optional[float], fmt: str = "{:.0f}") -> str:
    """A table cell: v formatted, "-" for None."""
    return "-" if v is None else fmt.format(v)


def _streams(res: Dict[str, Any]) -> List[str]:
    """The stream keys of one column's results ("raw", "link-aware[ <budget>]" for JPEG,
    "h264[ <budget>]"), in order."""
    return [k for k in res if k == "raw" or k.startswith(("link-aware", "h264"))]


def stream_label(key: str) -> str:
    """A stream key as the report names it: "link-aware 8" -> "link-aware JPEG, budget 8 Mbit/s"."""
    if key == "raw":
        return "raw"
    name, _, budget = key.partition(" ")
    label = "link-aware JPEG" if name == "link-aware" else "link-aware H.264"
    return f"{label}, budget {budget} Mbit/s" if budget else label


def _psnr(v: Optional[float]) -> str:
    """A PSNR cell: "lossless" for an identical picture (scene.PSNR_IDENTICAL), "-" for None."""
    return "lossless" if v is not None and v >= 99 else _f(v, "{:.1f}")


def render_markdown(data: Dict[str, Any]) -> str:
    """One table: per column a row with control alone and a row per stream (raw, encoded per budget)."""
    m = data["meta"]
    lines = [f"Camera benchmark {m['date']}: {m['image']}, b1 uplink tbf {m['uplink_mbit']:g} Mbit/s, "
             f"{m['seconds_per_stream']:g} s per stream, Twist at {m['control_hz']} Hz, {m['cores']} cores"
             + (f", load average {m['load_start']} at the start, {m['load_end']} at the end" if m.get("load_start")
                else "") + ".", ""]
    lines += ["| path | stream | rate Hz | PSNR (YUV 4:2:0) mean / p5 dB | latency p50 / p99 ms "
              "| Twist RTT p50 / p99 ms | Mbit/s | "
              "encoder CPU % | decision |", "|---|---|---|---|---|---|---|---|---|"]
    for col in data["columns"]:
        res = data["results"].get(col, {})
        ci = res.get("control_idle") or {}
        lines.append(f"| {col} | (no camera) | - | - | - | {_f(ci.get('rtt_p50_ms'), '{:.1f}')} / "
                     f"{_f(ci.get('rtt_p99_ms'), '{:.1f}')} | - | - | - |")
        for key in _streams(res):
            s = res[key]
            c = s.get("control") or {}
            st = s.get("state") or {}
            dec = "-"
            if st:
                dec = (f"q{st['quality']}, " if st.get("quality") is not None else "") + f"{st['rate_hz']:.0f} Hz"
            lines.append(f"| {col} | {stream_label(key)} | {_f(s.get('rate_hz'), '{:.1f}')} | "
                         f"{_psnr(s.get('psnr_mean'))} / {_psnr(s.get('psnr_p5'))} | "
                         f"{_f(s.get('latency_p50_ms'))} / {_f(s.get('latency_p99_ms'))} | "
                         f"{_f(c.get('rtt_p50_ms'), '{:.1f}')} / {_f(c.get('rtt_p99_ms'), '{:.1f}')} | "
                         f"{_f((s.get('bytes_per_s') or 0) * 8 / 1e6, '{:.2f}')} | "
                         f"{_f(s.get('encoder_cpu_pct'), '{:.1f}')} | "
                         f"{dec} |")
    for err in m.get("errors") or []:
        lines.append(f"\nNot measured: {err}")
    return "\n".join(lines) + "\n"


def plot(data: Dict[str, Any], out_dir: Path) -> None:
    """bench_camera.png in out_dir, bars per path for each stream: bitrate, PSNR, delivered rate,
    latency p50 and p99, Twist RTT p50 and p99."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = data["columns"]
    keys: List[str] = []
    for c in cols:
        for k in _streams(data["results"].get(c, {})):
            if k not in keys:
                keys.append(k)
    fig, axes = plt.subplots(2, 4, figsize=(18, 7))
    metrics = (("bitrate", "bitrate received (Mbit/s)", True, None),
               ("psnr_mean", "PSNR mean (dB; raw lossless at 60)", False, 38),
               ("rate_hz", "delivered rate (Hz)", False, 29),
               ("latency_p50_ms", "camera latency p50 (ms)", True, None),
               ("latency_p99_ms", "camera latency p99 (ms)", True, 100),
               ("rtt_p50_ms", "Twist round trip p50 (ms)", True, None),
               ("rtt_p99_ms", "Twist round trip p99 (ms)", True, 50))
    width = 0.8 / max(1, len(keys))
    for ax, (metric, title, log, goal) in zip(axes.flat, metrics):
        for i, k in enumerate(keys):
            vals = []
            for c in cols:
                s = data["results"].get(c, {}).get(k) or {}
                if metric.startswith("rtt"):
                    v = (s.get("control") or {}).get(metric)
                elif metric == "bitrate":
                    v = (s.get("bytes_per_s") or 0) * 8 / 1e6 or None
                else:
                    v = s.get(metric)
                    if metric == "psnr_mean" and v is not None:
                        v = min(v, 60.0)
                vals.append(v if v is not None else 0.0)
            ax.bar([x + i * width for x in range(len(cols))], vals, width, label=stream_label(k))
        ax.set_xticks([x + width * (len(keys) - 1) / 2 for x in range(len(cols))])
        ax.set_xticklabels(cols)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
        if goal is not None:
            ax.axhline(goal, color="grey", linestyle=":", linewidth=1)
    axes.flat[-1].axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    axes.flat[-1].legend(handles, labels, fontsize=9, loc="center")
    fig.suptitle(f"raw vs link-aware camera on a real scene, b1 uplink {data['meta']['uplink_mbit']:g} Mbit/s "
                 "(dotted: goals)")
    fig.tight_layout()
    fig.savefig(out_dir / "bench_camera.png", dpi=80)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point (see the module doc)."""
    ap = argparse.ArgumentParser(prog="bench_camera", description="raw vs link-aware camera in the lab (root)")
    ap.add_argument("--out", default=str(REPO_ROOT / "artifacts"))
    ap.add_argument("--seconds", type=float, default=8.0, help="per stream measurement")
    ap.add_argument("--uplink-mbit", type=float, default=30.0, help="tbf limit of b1's uplink")
    ap.add_argument("--budgets", default="8000,4000", help="link-aware budgets (kbit/s) for relayed paths")
    ap.add_argument("--columns", default=",".join(COLUMNS))
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--replot", metavar="JSON", help="only re-render the table and plot from a bench_camera.json")
    ap.add_argument("--tiers", action="store_true",
                    help="two viewers at once, direct and relayed: the stream's tiers vs one stream")
    ap.add_argument("--kinds", default="h264,jpeg", help="--tiers: stream kinds to measure, in order")
    ap.add_argument("--pattern", default="scene", choices=["scene", "synthetic"], help="what the camera plays")
    camera_streams.add_video_argument(ap)
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.replot:
        return replot(Path(a.replot), out, "bench_camera", render_markdown, plot)
    video = camera_streams.bench_video("bench_camera", a.video, a.pattern)
    if video is None:
        return 2
    if os.geteuid() != 0:
        print("bench_camera: needs root (network namespaces)", file=sys.stderr)
        return 2
    if a.tiers:
        kinds = [k for k in a.kinds.split(",") if k]
        if not kinds or any(k not in KIND_NAMES for k in kinds):
            print(f"bench_camera: --kinds: choose from {list(KIND_NAMES)}, got {a.kinds!r}", file=sys.stderr)
            return 2
        try:
            data = run_tiers(out, a.seconds, a.uplink_mbit, kinds, a.pattern, a.run_id, video)
        except LabError as exc:
            print(f"bench_camera: error: {exc}", file=sys.stderr)
            return 1
        print(render_tiers_markdown(data))
        say(f"wrote {out / 'bench_camera_tiers.json'}, bench_camera_tiers.md ({data['meta']['run_seconds']} s)")
        return 0
    columns = [c for c in a.columns.split(",") if c]
    bad = [c for c in columns if c not in COLUMNS]
    if bad:
        print(f"bench_camera: --columns: unknown {bad}; choose from {list(COLUMNS)}", file=sys.stderr)
        return 2
    try:
        data = run(out, a.seconds, a.uplink_mbit, [float(b) for b in a.budgets.split(",") if b], columns, a.run_id,
                   video)
    except LabError as exc:
        print(f"bench_camera: error: {exc}", file=sys.stderr)
        return 1
    print(render_markdown(data))
    say(f"wrote {out / 'bench_camera.json'}, bench_camera.md, bench_camera.png ({data['meta']['run_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
