"""Camera streams in the lab: which encoded streams of a raw topic exist, the link-aware encoder's
launch and its CPU, and what a viewer gets (probe/quality.py), for the camera benchmarks, the
fleet test and the demo.

Streams of a raw image topic ``T`` (sensor_msgs/Image from the lab camera):

    raw    T                      sensor_msgs/Image, rgb8
    jpeg   T/link_aware           image_transport plugin ``link_aware`` (JPEG, link-aware); where it is
                                  not published, T/compressed of the standalone link-aware encoder
    h264   T/link_aware_h264      image_transport plugin ``link_aware_h264`` (H.264 Annex B, one frame
                                  per message, link-aware bitrate)

:func:`detect_streams` asks the ROS master which of them are published, so the same code measures
H.264 the moment the encoder publishes it and JPEG until then.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.system import wait_for
from overlay_manager.lab.probe.scene import DEFAULT_VIDEO, VideoError, check_video, scene_label

KIND_LABELS = {"raw": "raw rgb8", "jpeg": "link-aware JPEG", "h264": "link-aware H.264"}
"""How reports name each stream kind."""
RAW_FRAME_BYTES = 640 * 480 * 3


def add_video_argument(ap: argparse.ArgumentParser, who: str = "the camera") -> None:
    """``--video FILE`` on a benchmark's (or the demo's) command line; check it with :func:`bench_video`."""
    ap.add_argument("--video", default="", metavar="FILE",
                    help=f"the real scene {who} plays (any video OpenCV reads, scaled to 640x480; "
                         f"default {DEFAULT_VIDEO})")


def scene_image(video: str) -> str:
    """A report's description of what the lab camera plays: the scene, scaled and looped."""
    return f"{scene_label(video)} scaled to 640x480 rgb8, 30 Hz, looping"


def bench_video(prog: str, video: str, pattern: str = "scene") -> Optional[str]:
    """A benchmark's ``--video`` checked before its lab comes up: "" for the default scene, the
    file's absolute path when its first frame decodes, or None once it printed what is wrong
    (``prog``: the command's name, for the message)."""
    if not video:
        return ""
    if pattern != "scene":
        print(f"{prog}: --video {video}: the camera plays a video only with --pattern scene "
              f"(got --pattern {pattern})", file=sys.stderr)
        return None
    try:
        return str(check_video(Path(video)))
    except VideoError as exc:
        print(f"{prog}: --video: {exc}", file=sys.stderr)
        return None


def video_args(video: str) -> List[str]:
    """``--video FILE`` for the lab camera and ``probe quality`` ([] for the default scene)."""
    return ["--video", str(video)] if video else []


def stream_topics(raw: str) -> Dict[str, List[str]]:
    """Candidate topics per kind for the raw topic ``raw``, preferred first."""
    return {"raw": [raw], "jpeg": [f"{raw}/link_aware", f"{raw}/compressed"], "h264": [f"{raw}/link_aware_h264"]}


def pick_streams(raw: str, published: Sequence[str]) -> Dict[str, str]:
    """kind -> topic for every kind with a published candidate (raw always)."""
    out = {"raw": raw}
    for kind, cands in stream_topics(raw).items():
        for c in cands:
            if c in published and kind != "raw":
                out[kind] = c
                break
    return out


def detect_streams(lab: Lab, host: str, raw: str, wait_s: float = 8.0) -> Dict[str, str]:
    """kind -> topic of the streams of ``raw`` that the master lists, asked from ``host``; waits
    up to ``wait_s`` for the H.264 topic (an encoder just started advertises within a second or
    two), then takes what is there."""
    return detect_many(lab, host, [raw], wait_s)[raw]


def detect_many(lab: Lab, host: str, raws: Sequence[str], wait_s: float = 8.0) -> Dict[str, Dict[str, str]]:
    """:func:`detect_streams` for several raw topics with one question to the master (waits up to
    ``wait_s`` for every H.264 topic)."""
    args = ["topics", "--timeout", f"{wait_s:g}"]
    for raw in raws:
        args += ["--wait-for", stream_topics(raw)["h264"][0]]
    published = list(robots.run_probe(lab, host, args, timeout=wait_s + 30).get("topics") or {})
    return {raw: pick_streams(raw, published) for raw in raws}


def quality(lab: Lab, host: str, streams: Sequence[Tuple[str, str]], seconds: float, timeout: float = 60.0,
            psnr_every: int = 1, frames: bool = False, video: str = "") -> Dict[str, Any]:
    """``probe quality`` on ``host`` for (kind, topic) streams; the probe's JSON (``streams`` per
    topic, window ``t_start``/``t_end``). ``video``: the file the camera plays ("" = the lab
    camera's default), the source of the PSNR's reference frames."""
    args = ["quality", "--seconds", f"{seconds:g}", "--timeout", f"{timeout:g}", "--psnr-every", str(psnr_every)]
    for kind, topic in streams:
        args += ["--stream", f"{kind}:{topic}"]
    if frames:
        args.append("--frames")
    args += video_args(video)
    return robots.run_probe(lab, host, args, timeout=seconds + timeout + 60)


def start_encoder(lab: Lab, host: str, raw: str, overlay_node: str, name: str, budget_kbps: float,
                  log_name: str, params: Optional[Dict[str, Any]] = None) -> subprocess.Popen:
    """link_aware_camera.launch for ``raw`` on ``host`` (as robot.launch's camera_topics does),
    node ``name``, this budget (kbit/s) for derp and peer-relay subscribers; ``params``: more of the
    republisher's parameters (e.g. ``{"tiers": False}``), written to a YAML file in the host's
    directory and given as ``params_file:=``. Stop with robots.stop."""
    line = (f"{robots.overlay_env_line(lab, host)} && exec roslaunch overlay_manager link_aware_camera.launch "
            f"images:={shlex.quote(raw)} overlay_node:={shlex.quote(overlay_node)} name:={shlex.quote(name)} "
            f"budget_kbps_derp:={budget_kbps:g} budget_kbps_peer_relay:={budget_kbps:g}")
    if params:
        path = Path(lab.host_dir(host)) / f"{log_name}.params.yaml"
        path.write_text(json.dumps(params) + "\n")  # JSON is YAML
        line += f" params_file:={shlex.quote(str(path))}"
    return lab.popen(host, ["bash", "-c", line], env=robots.ros_env(lab, host),
                     log=Path(lab.host_dir(host)) / f"{log_name}.log")


def descendants(pid: int) -> List[int]:
    """Pids of every process below ``pid`` (children, their children, ...)."""
    children: Dict[int, List[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out: List[int] = []
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def encoder_pids(launch: subprocess.Popen, timeout: float = 120.0) -> List[int]:
    """The encoder node processes under an encoder's roslaunch (every descendant that is not
    roslaunch or its shell); waits until there is one. Ask again right before measuring: a
    node may have been respawned."""
    def nodes() -> Optional[List[int]]:
        try:
            own = Path(f"/proc/{launch.pid}/cmdline").read_bytes()
        except OSError:
            raise LabError(f"the encoder's roslaunch (pid {launch.pid}) exited") from None
        if b"roslaunch" not in own:
            return None  # still the shell running overlay_env before its exec
        pids = []
        for p in descendants(launch.pid):
            try:
                argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not any(b"roslaunch" in a for a in argv[:3]) and argv[0] not in (b"bash", b"/bin/bash"):
                pids.append(p)
        return pids or None

    return wait_for("the encoder node under its roslaunch", nodes, timeout) or []


def cpu_seconds(pid: int) -> Optional[float]:
    """utime + stime of a process in seconds; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """CPU of a set of processes sampled once a second (:meth:`sample`), for % of one core over
    the seconds in which they worked (:func:`active_cpu_pct`)."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.samples: List[Tuple[float, Optional[float]]] = []

    def sample(self) -> None:
        """One (time.monotonic(), summed CPU s or None when any process is gone) sample."""
        vals = [cpu_seconds(p) for p in self.pids]
        total = None if not vals or any(v is None for v in vals) else sum(v for v in vals if v is not None)
        self.samples.append((time.monotonic(), total))

    def pct(self) -> Optional[float]:
        """% of one core while working (see active_cpu_pct)."""
        return active_cpu_pct(self.samples)


def active_cpu_pct(samples: Sequence[Tuple[float, Optional[float]]]) -> Optional[float]:
    """CPU share (% of one core) over the 1-s intervals in which the encoder worked (at least
    20 ms of CPU: it encodes only while subscribed, and the probes take seconds to start).

    ``samples`` are (time.monotonic() s, CPU s or None when the process was gone)."""
    busy_cpu = busy_wall = 0.0
    for (w0, c0), (w1, c1) in zip(samples, samples[1:]):
        if c0 is None or c1 is None:
            continue
        if c1 - c0 >= 0.02:
            busy_cpu += c1 - c0
            busy_wall += w1 - w0
    return round(100.0 * busy_cpu / busy_wall, 1) if busy_wall > 0 else None


def stream_row(q: Dict[str, Any]) -> Dict[str, Any]:
    """The fields of one stream of a quality probe's result that the reports keep (no frames)."""
    keys = ("kind", "topic", "count", "rate_hz", "span_rate_hz", "max_gap_s", "latency_p50_ms", "latency_p99_ms",
            "latency_max_ms", "kbps", "decoded", "undecodable", "psnr_mean", "psnr_min", "psnr_p5", "psnr_frames",
            "no_index", "first_message_s", "first_picture_s", "errors")
    return {k: q.get(k) for k in keys}


def check_index(q: Dict[str, Any], what: str) -> None:
    """LabError when a stream's frames carry no source index (the camera is not playing the scene
    or an encoder dropped the header): PSNR would be meaningless."""
    if q.get("count") and q.get("no_index") == q.get("count"):
        raise LabError(f"{what}: no frame carries a source index in header.frame_id (camera#N); "
                       "is the lab camera playing the scene (--pattern scene)?")
