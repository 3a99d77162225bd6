"""What hostile messages cost the link-aware viewers (scripts/bench_hostile; not a test).

    source "$(bash scripts/build)/devel/setup.bash"
    bash scripts/bench_hostile [--out artifacts] [--width 1920] [--height 1080] [--rate 10]
                               [--flood-seconds 3] [--flood-hz 200] [--workdir DIR]

The viewers of one camera topic, as a lab runs them: ``image_transport republish link_aware_h264``
(the H.264 subscriber plugin), this package's ``compressed_decoder`` with
``_transport:=link_aware_h264`` and ``image_transport republish link_aware`` (the JPEG subscriber
plugin). The C++ test camera driver (it publishes through image_transport, so the publisher plugins
encode inside it) streams WIDTHxHEIGHT to them: each viewer's VmRSS (largest of 2 s of samples) and
VmHWM on that stream are the baseline. Then the driver stops and a sender (``send``, a rospy node of
this module) publishes on ``<image>/link_aware_h264`` and ``<image>/link_aware``, one at a time
(:func:`hostile_messages`): 8 MB of filler NAL units, a keyframe whose SPS claims 16000x16000, a
2x2 keyframe (valid: a 2x2 picture may come out), a JPEG whose SOF0 claims 8192x8192, a truncated
JPEG; then random garbage to both topics at ``--flood-hz`` for ``--flood-seconds``. Before each,
every viewer's peak RSS is reset (``/proc/<pid>/clear_refs``, "5"); after it, a probe (a valid
640x480 keyframe or JPEG) is sent until each viewer of that transport shows it, and VmHWM is the
peak while the viewer handled the message and the probe. Last, a valid 640x480 stream of both
transports. The issue's goal: the peak after any single hostile message <= 2x the RSS on a 1080p
stream. libavcodec lines in each viewer's log (throttled into ROS logging) are counted.

Writes artifacts/bench_hostile.json and prints a markdown table. Everything is stopped by pid.
test/rostest/test_video_e2e.py runs the same rig (:func:`run`) and asserts on it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from overlay_manager.system import children, waiting

REPO = Path(__file__).resolve().parents[3]
PY = "/usr/bin/python3"
H264_FORMAT = "h264"
JPEG_FORMAT = "rgb8; jpeg compressed bgr8"  # compressed_image_transport's format string
PROBE_W, PROBE_H = 640, 480
RED_X = 40  # inside the red block (x < 80) of every picture made here and by the test driver

# ---- pictures and streams (no ROS) -----------------------------------------------------------


def camera_picture(width: int, height: int, frame: int = 0):
    """An rgb8 picture (numpy HxWx3) like the test driver's: a grey gradient, a pure red block at
    x < 80 and a white bar that moves with ``frame`` (so P frames carry motion)."""
    import numpy as np

    x = np.arange(width, dtype=np.float64)
    row = (255.0 * x / max(width, 1)).astype(np.uint8)
    pic = np.repeat(np.repeat(row[None, :, None], 3, axis=2), height, axis=0)
    pic[:, :min(80, width)] = (255, 0, 0)
    if width > 116:
        bar = (frame * 8) % (width - 100) + 100
        pic[height // 2:min(height, height // 2 + 40), bar:min(width, bar + 16)] = 255
    return pic


def h264_access_units(width: int, height: int, frames: int, gop: int) -> List[bytes]:
    """``frames`` Annex B access units (one per frame, SPS/PPS before every IDR) of
    :func:`camera_picture`, from libx264 through PyAV with the link-aware encoder's settings
    (ultrafast, zerolatency: no B-frames), a keyframe every ``gop`` frames."""
    from fractions import Fraction

    import av

    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height = width, height
    ctx.pix_fmt = "yuv420p"
    ctx.time_base = Fraction(1, 30)
    ctx.framerate = Fraction(30, 1)
    ctx.gop_size = gop
    ctx.options = {"preset": "ultrafast", "tune": "zerolatency",
                   "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0"}
    out: List[bytes] = []
    for i in range(frames):
        frame = av.VideoFrame.from_ndarray(camera_picture(width, height, i), format="rgb24").reformat(format="yuv420p")
        frame.pts = i
        out += [bytes(p) for p in ctx.encode(frame)]
    out += [bytes(p) for p in ctx.encode(None)]
    return out


def jpeg_bytes(width: int, height: int, quality: int = 80) -> bytes:
    """:func:`camera_picture` as a baseline JPEG (OpenCV)."""
    import cv2

    ok, buf = cv2.imencode(".jpg", camera_picture(width, height)[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


def nal_units(data: bytes) -> List[Tuple[int, int, int]]:
    """(nal_unit_type, start of the NAL header byte, end) of each NAL unit of an Annex B buffer."""
    starts = [m.end() for m in re.finditer(b"\x00\x00\x01", data)]
    out = []
    for k, s in enumerate(starts):
        e = starts[k + 1] - 3 if k + 1 < len(starts) else len(data)
        while e > s and data[e - 1] == 0:
            e -= 1
        if s < len(data):
            out.append((data[s] & 0x1F, s, e))
    return out


class _BitReader:
    """Exp-Golomb reader over a NAL payload (emulation prevention bytes removed)."""

    def __init__(self, payload: bytes):
        rbsp, zeros = bytearray(), 0
        for b in payload:
            if zeros >= 2 and b == 3:
                zeros = 0
                continue
            rbsp.append(b)
            zeros = zeros + 1 if b == 0 else 0
        self.data, self.pos = bytes(rbsp), 0

    def u(self, n: int) -> int:
        v = 0
        for _ in range(n):
            v = (v << 1) | ((self.data[self.pos >> 3] >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return v

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        k = self.ue()
        return (k + 1) // 2 if k % 2 else -(k // 2)


class _BitWriter:
    def __init__(self) -> None:
        self.bits: List[int] = []

    def u(self, value: int, n: int) -> None:
        self.bits += [(value >> (n - 1 - i)) & 1 for i in range(n)]

    def ue(self, value: int) -> None:
        v = value + 1
        n = v.bit_length()
        self.u(0, n - 1)
        self.u(v, n)

    def nal(self, header: int) -> bytes:
        """The NAL unit (start code, header byte, payload with emulation prevention and the stop bit)."""
        bits = self.bits + [1]
        bits += [0] * (-len(bits) % 8)
        rbsp = bytes(int("".join(map(str, bits[i:i + 8])), 2) for i in range(0, len(bits), 8))
        out, zeros = bytearray(), 0
        for b in rbsp:
            if zeros >= 2 and b <= 3:
                out.append(3)
                zeros = 0
            out.append(b)
            zeros = zeros + 1 if b == 0 else 0
        return b"\x00\x00\x00\x01" + bytes([header]) + bytes(out)


_HIGH_PROFILES = (100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135)


def sps_claiming(sps_nal: bytes, width: int, height: int) -> bytes:
    """The SPS NAL unit ``sps_nal`` (header byte first, no start code) with its picture size
    replaced by ``width`` x ``height`` (multiples of 16; no cropping, no VUI). Every field before
    the size is copied bit for bit, so the stream's PPS and slices still parse against it."""
    assert width % 16 == 0 and height % 16 == 0, "whole macroblocks"
    r = _BitReader(sps_nal[1:])
    profile = r.u(8)
    r.u(16)  # constraint flags, level
    r.ue()  # seq_parameter_set_id
    if profile in _HIGH_PROFILES:
        if r.ue() == 3:  # chroma_format_idc
            r.u(1)
        r.ue()
        r.ue()
        r.u(1)
        assert r.u(1) == 0, "SPS with scaling matrices: not rewritten here"
    r.ue()  # log2_max_frame_num_minus4
    poc_type = r.ue()
    if poc_type == 0:
        r.ue()
    elif poc_type == 1:
        r.u(1)
        r.se()
        r.se()
        for _ in range(r.ue()):
            r.se()
    r.ue()  # max_num_ref_frames
    r.u(1)  # gaps_in_frame_num_value_allowed_flag
    prefix = r.pos
    r.ue()
    r.ue()
    frame_mbs_only = r.u(1)
    assert frame_mbs_only == 1, "interlaced SPS: not rewritten here"
    direct_8x8 = r.u(1)
    w = _BitWriter()
    for i in range(prefix):
        w.bits.append((r.data[i >> 3] >> (7 - (i & 7))) & 1)
    w.ue(width // 16 - 1)
    w.ue(height // 16 - 1)
    w.u(1, 1)  # frame_mbs_only_flag
    w.u(direct_8x8, 1)
    w.u(0, 1)  # frame_cropping_flag
    w.u(0, 1)  # vui_parameters_present_flag
    return w.nal(sps_nal[0])


def keyframe_claiming(access_unit: bytes, width: int, height: int) -> bytes:
    """A keyframe access unit whose SPS is replaced by one claiming ``width`` x ``height``: its
    PPS and IDR slice follow unchanged (a decoder that trusts the SPS allocates that picture)."""
    out = b""
    for typ, s, e in nal_units(access_unit):
        out += sps_claiming(access_unit[s:e], width, height) if typ == 7 else b"\x00\x00\x00\x01" + access_unit[s:e]
    return out


def filler_message(size: int) -> bytes:
    """``size`` bytes of empty filler NAL units (00 00 01 0c repeated): size / 4 NAL units."""
    return b"\x00\x00\x01\x0c" * (size // 4)


def jpeg_claiming(jpeg: bytes, width: int, height: int) -> bytes:
    """``jpeg`` with the picture size in its SOF0 header patched to ``width`` x ``height``."""
    i = jpeg.find(b"\xff\xc0")
    assert i > 0, "no SOF0 marker"
    b = bytearray(jpeg)
    b[i + 5:i + 7] = height.to_bytes(2, "big")
    b[i + 7:i + 9] = width.to_bytes(2, "big")
    return bytes(b)


class Garbage:
    """Random messages, seeded (the same flood every run). H.264 ones: random bytes, random NAL
    units behind start codes, or a real SPS and PPS with an IDR slice of random bytes (what reaches
    libavcodec's slice decoder and makes it log). JPEG ones: random bytes, a JPEG start with random
    bytes, or a real JPEG's headers with random entropy-coded data."""

    def __init__(self, parameter_sets: bytes, jpeg: bytes, seed: int = 24):
        import numpy as np

        self.rng = np.random.default_rng(seed)
        self.parameter_sets = parameter_sets
        sos = jpeg.find(b"\xff\xda")
        self.jpeg_head = jpeg[:sos + 14] if sos > 0 else jpeg[:600]

    def _random(self, lo: int, hi: int) -> bytes:
        return self.rng.integers(0, 256, int(self.rng.integers(lo, hi)), dtype="uint8").tobytes()

    def h264(self) -> bytes:
        kind = int(self.rng.integers(0, 3))
        if kind == 0:
            return self._random(1, 16384)
        if kind == 1:
            return b"".join(b"\x00\x00\x00\x01" + self._random(1, 2048) for _ in range(int(self.rng.integers(1, 8))))
        return self.parameter_sets + b"\x00\x00\x00\x01\x65\x88" + self._random(16, 16384)

    def jpeg(self) -> bytes:
        kind = int(self.rng.integers(0, 3))
        if kind == 0:
            return self._random(1, 16384)
        if kind == 1:
            return b"\xff\xd8\xff" + self._random(1, 16384)
        return self.jpeg_head + self._random(16, 16384) + b"\xff\xd9"


@dataclass
class HostileMessage:
    name: str
    transport: str  # "h264" or "jpeg"
    data: bytes
    picture_allowed: bool = False  # a valid message (the 2x2 keyframe): its picture may be shown


@dataclass
class Streams:
    """The valid material the sender needs, made once."""
    probe_h264: bytes = b""  # a 640x480 keyframe (SPS, PPS, IDR)
    probe_jpeg: bytes = b""
    valid_h264: List[bytes] = field(default_factory=list)  # a 640x480 stream, a keyframe every 15 frames
    parameter_sets: bytes = b""


def make_streams() -> Streams:
    s = Streams()
    s.valid_h264 = h264_access_units(PROBE_W, PROBE_H, 30, 15)
    s.probe_h264 = s.valid_h264[0]
    s.probe_jpeg = jpeg_bytes(PROBE_W, PROBE_H)
    s.parameter_sets = b"".join(b"\x00\x00\x00\x01" + s.probe_h264[a:e]
                                for t, a, e in nal_units(s.probe_h264) if t in (7, 8))
    return s


def hostile_messages(streams: Streams) -> List[HostileMessage]:
    """The single hostile messages, in the order they are sent (the flood comes after them)."""
    jpeg = streams.probe_jpeg
    return [
        HostileMessage("filler_8mb", "h264", filler_message(8 << 20)),
        HostileMessage("sps_16000x16000", "h264", keyframe_claiming(streams.probe_h264, 16000, 16000)),
        HostileMessage("idr_2x2", "h264", h264_access_units(2, 2, 1, 1)[0], picture_allowed=True),
        HostileMessage("jpeg_8192x8192", "jpeg", jpeg_claiming(jpeg, 8192, 8192)),
        HostileMessage("jpeg_truncated", "jpeg", jpeg[:len(jpeg) // 2]),
        # a JPEG start whose next marker does not exist (0xaa): 204 bytes
        HostileMessage("jpeg_bad_marker", "jpeg", b"\xff\xd8\xff\xaa" + bytes(range(200))),
    ]


# ---- processes ---------------------------------------------------------------------------------


@dataclass
class Viewer:
    name: str
    transport: str  # "h264" or "jpeg"
    output: str  # its sensor_msgs/Image topic
    argv: List[str]
    encoding: str  # what it labels a colour picture


def viewers(image: str, prefix: str) -> List[Viewer]:
    """The three viewers of ``image``: both subscriber plugins through image_transport's republish
    and the decoder node, outputs under ``prefix``. Node names are unique per prefix (private
    parameters stay on the master after a node ends)."""
    tag = prefix.strip("/").replace("/", "_")
    return [
        Viewer(f"{tag}_republish_h264", "h264", f"{prefix}/republish_h264",
               ["rosrun", "image_transport", "republish", "link_aware_h264", f"in:={image}", "raw",
                f"out:={prefix}/republish_h264", f"__name:={tag}_republish_h264"], "bgr8"),
        Viewer(f"{tag}_decoder_h264", "h264", f"{prefix}/decoder_h264",
               ["rosrun", "overlay_manager", "compressed_decoder", "_transport:=link_aware_h264", f"in:={image}",
                f"out:={prefix}/decoder_h264", f"__name:={tag}_decoder_h264"], "rgb8"),
        Viewer(f"{tag}_republish_jpeg", "jpeg", f"{prefix}/republish_jpeg",
               ["rosrun", "image_transport", "republish", "link_aware", f"in:={image}", "raw",
                f"out:={prefix}/republish_jpeg", f"__name:={tag}_republish_jpeg"], "rgb8"),
    ]


def driver_argv(name: str, image: str, width: int, height: int, rate: float, lie: str = "") -> List[str]:
    """The C++ test camera driver (test/cpp/test_camera_driver.cpp) publishing ``image`` through
    image_transport; ``lie``: its ~lie kinds."""
    argv = ["rosrun", "overlay_manager", "test_camera_driver", f"image:={image}", f"__name:={name}",
            f"_width:={width}", f"_height:={height}", f"_rate:={rate}"]
    return argv + ([f"_lie:={lie}"] if lie else [])


def memory_kb(pid: int) -> Dict[str, int]:
    """VmRSS and VmHWM (kB) of ``pid`` from /proc/<pid>/status ({} when it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out["rss" if line.startswith("VmRSS") else "hwm"] = int(line.split()[1])
    except OSError:
        return {}
    return out


def reset_peak(pid: int) -> bool:
    """Resets ``pid``'s VmHWM to its current RSS (``5`` into /proc/<pid>/clear_refs, Linux >= 4.0;
    needs the right to ptrace it). False when that is refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


LIBAV_LINE = re.compile(r"libavcodec|\[h264 @ |\[mjpeg @ ")


def log_lines(path: Path) -> Dict[str, int]:
    """Lines in a viewer's log: all, and those from libavcodec (routed into ROS logging, or libav's
    own stderr format ``[h264 @ 0x...]``)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return {"lines": 0, "libav_lines": 0}
    lines = text.splitlines()
    return {"lines": len(lines), "libav_lines": sum(1 for x in lines if LIBAV_LINE.search(x))}


# ---- the sender (a rospy node) -------------------------------------------------------------------


def _send(args: argparse.Namespace) -> int:
    import threading

    import rosgraph
    import rospy
    from sensor_msgs.msg import CompressedImage, Image
    from std_msgs.msg import Empty

    views = [dict(zip(("name", "pid", "transport", "topic"), v.split(":", 3))) for v in args.viewer]
    for v in views:
        v["pid"] = int(v["pid"])
    base_w, base_h = (int(x) for x in args.baseline_size.split("x"))
    out = open(args.out, "a", encoding="utf-8")
    lock = threading.Lock()
    outputs: Dict[str, List[Dict[str, Any]]] = {v["name"]: [] for v in views}

    def write(rec: Dict[str, Any]) -> None:
        rec["t"] = time.time()
        with lock:
            out.write(json.dumps(rec) + "\n")
            out.flush()

    def memory() -> Dict[str, Dict[str, int]]:
        return {v["name"]: memory_kb(v["pid"]) for v in views}

    def on_image(msg: Image, name: str) -> None:
        rec: Dict[str, Any] = {"event": "output", "viewer": name, "frame_id": msg.header.frame_id, "w": msg.width,
                               "h": msg.height, "step": msg.step, "encoding": msg.encoding, "len": len(msg.data)}
        if msg.width and msg.height and msg.step >= 3 * msg.width and len(msg.data) >= msg.step * msg.height:
            x, y = min(RED_X, msg.width - 1), msg.height // 4
            rec["px"] = list(bytearray(msg.data[y * msg.step + 3 * x:y * msg.step + 3 * x + 3]))
        with lock:
            outputs[name].append(rec)
        write(rec)

    def seen(name: str, frame_id: str) -> bool:
        with lock:
            return any(r["frame_id"] == frame_id for r in outputs[name])

    rospy.init_node("hostile_sender", anonymous=True, disable_signals=False)
    streams = make_streams()
    messages = hostile_messages(streams)
    pubs = {"h264": rospy.Publisher(args.image + "/link_aware_h264", CompressedImage, queue_size=20),
            "jpeg": rospy.Publisher(args.image + "/link_aware", CompressedImage, queue_size=20)}
    formats = {"h264": H264_FORMAT, "jpeg": JPEG_FORMAT}
    for v in views:
        rospy.Subscriber(v["topic"], Image, on_image, callback_args=v["name"], queue_size=2, buff_size=1 << 25)
    rospy.Subscriber(args.image + "/link_aware_h264/keyframe_request", Empty,
                     lambda m: write({"event": "keyframe_request",
                                      "caller": m._connection_header.get("callerid", "")}))
    seq = [0]

    def publish(transport: str, data: bytes, frame_id: str) -> None:
        seq[0] += 1
        m = CompressedImage(format=formats[transport], data=data)
        m.header.seq, m.header.stamp, m.header.frame_id = seq[0], rospy.Time.now(), frame_id
        pubs[transport].publish(m)

    def wait(what: str, check: Callable[[], Any], timeout: float) -> Any:
        def guarded() -> Any:
            dead = [v["name"] for v in views if not running(v["pid"])]
            if dead:
                raise RuntimeError(f"viewer(s) {', '.join(dead)} exited")
            return check()
        return waiting.wait_for(what, guarded, timeout, interval=0.05, fatal=(RuntimeError,))

    try:
        # 1. the baseline: the driver's WIDTHxHEIGHT stream decoded by every viewer
        def baseline_frames() -> bool:
            with lock:
                return all(sum(1 for r in outputs[v["name"]] if (r["w"], r["h"]) == (base_w, base_h))
                           >= args.baseline_frames for v in views)
        wait(f"{args.baseline_frames} pictures of {args.baseline_size} from every viewer", baseline_frames, 60)
        rss_max: Dict[str, int] = {}
        t_end = time.monotonic() + 2.0
        while time.monotonic() < t_end:
            for name, m in memory().items():
                rss_max[name] = max(rss_max.get(name, 0), m.get("rss", 0))
            time.sleep(0.1)
        mem = memory()
        write({"event": "baseline", "size": args.baseline_size,
               "mem": {n: dict(m, rss_max=rss_max.get(n, 0)) for n, m in mem.items()}})

        # 2. the driver leaves (the caller stops it); then only this node publishes to the viewers
        master = rosgraph.Master(rospy.get_name())

        def only_me() -> bool:
            pubs_now = dict((t, n) for t, n in master.getSystemState()[0])
            return all(pubs_now.get(p.resolved_name, []) == [rospy.get_name()] for p in pubs.values())
        wait("the camera driver to leave (only this sender publishing to the viewers)", only_me, 60)
        wanted = {t: sum(1 for v in views if v["transport"] == t) for t in pubs}
        wait(f"every viewer connected to this sender ({wanted})",
             lambda: all(pubs[t].get_num_connections() >= n for t, n in wanted.items()), 30)
        time.sleep(0.5)
        write({"event": "driver_gone", "mem": memory()})

        def after(name: str, transports: Sequence[str], send: Callable[[], Tuple[int, int]],
                  picture_allowed: bool = False) -> None:
            """Reset the peaks, send, settle, probe every viewer of ``transports`` until it shows
            its probe, record the peaks."""
            peak_reset = all([reset_peak(v["pid"]) for v in views])
            before = memory()
            t0 = time.monotonic()
            count, n_bytes = send()
            sent_s = time.monotonic() - t0
            time.sleep(args.settle)
            probe_id = f"probe:{name}"
            targets = [v for v in views if v["transport"] in transports]
            t_probe = time.monotonic()
            shown: Dict[str, Optional[float]] = {}
            while time.monotonic() - t_probe < args.probe_timeout:
                for t in transports:
                    publish(t, streams.probe_h264 if t == "h264" else streams.probe_jpeg, probe_id)
                t_next = time.monotonic() + 0.5
                while time.monotonic() < t_next:
                    for v in targets:
                        if v["name"] not in shown and seen(v["name"], probe_id):
                            shown[v["name"]] = round(time.monotonic() - t_probe, 3)
                    if len(shown) == len(targets):
                        break
                    time.sleep(0.02)
                if len(shown) == len(targets):
                    break
            write({"event": "hostile", "name": name, "transports": list(transports), "messages": count,
                   "picture_allowed": picture_allowed,
                   "bytes": n_bytes, "send_s": round(sent_s, 3), "peak_reset": peak_reset, "mem_before": before,
                   "mem": memory(), "probe_shown_s": {v["name"]: shown.get(v["name"]) for v in targets},
                   "alive": {v["name"]: running(v["pid"]) for v in views}})

        # 3. one hostile message at a time
        for m in messages:
            after(m.name, [m.transport],
                  lambda m=m: (publish(m.transport, m.data, f"hostile:{m.name}"), (1, len(m.data)))[1],
                  m.picture_allowed)

        # 4. the flood: random garbage to both transports
        garbage = Garbage(streams.parameter_sets, streams.probe_jpeg)

        def flood() -> Tuple[int, int]:
            n, n_bytes, period = 0, 0, 1.0 / args.flood_hz
            t_start = time.monotonic()
            while time.monotonic() - t_start < args.flood_seconds:
                for t, data in (("h264", garbage.h264()), ("jpeg", garbage.jpeg())):
                    publish(t, data, "hostile:garbage")
                    n_bytes += len(data)
                    n += 1
                time.sleep(max(0.0, t_start + (n // 2) * period - time.monotonic()))
            return n, n_bytes
        after("garbage_flood", ["h264", "jpeg"], flood)

        # 5. a valid stream decodes afterwards
        t_valid = time.monotonic()
        for i in range(args.valid_frames):
            publish("h264", streams.valid_h264[i % len(streams.valid_h264)], "valid")
            publish("jpeg", streams.probe_jpeg, "valid")
            time.sleep(max(0.0, t_valid + (i + 1) / 15.0 - time.monotonic()))
        time.sleep(1.0)
        with lock:
            shown_valid = {v["name"]: sum(1 for r in outputs[v["name"]] if r["frame_id"] == "valid") for v in views}
        write({"event": "valid", "sent": args.valid_frames, "shown": shown_valid,
               "alive": {v["name"]: running(v["pid"]) for v in views}})
        write({"event": "done", "mem": memory()})
        return 0
    except Exception as e:  # noqa: BLE001 - said in the events file, for the caller's report
        write({"event": "error", "what": f"{type(e).__name__}: {e}"})
        return 1
    finally:
        out.close()


# ---- the rig: driver, viewers, sender ----------------------------------------------------------


def read_events(path: Path) -> List[Dict[str, Any]]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def run(workdir: Path, start: Callable[[Sequence[str], Path], subprocess.Popen],
        stop: Callable[[subprocess.Popen], None], width: int = 1920, height: int = 1080, rate: float = 10.0,
        flood_seconds: float = 3.0, flood_hz: float = 200.0, prefix: str = "/hostile",
        error: type = waiting.WaitTimeout) -> Dict[str, Any]:
    """Runs the driver, the viewers and the sender (each through ``start``, against one master);
    returns what happened: ``events`` (the sender's), ``viewers`` (name -> pid, exit code or None while running,
    log, line counts), ``baseline``, ``hostile`` (one event per message), ``valid``, ``driver`` exit
    code. ``start(argv, log)`` starts a process (its caller stops everything it started);
    ``stop(proc)`` stops one. Waits end in ``error``, naming what was waited for."""
    image = f"{prefix}/image"
    workdir.mkdir(parents=True, exist_ok=True)
    driver = start(driver_argv(prefix.strip("/") + "_camera", image, width, height, rate), workdir / "driver.log")
    views = viewers(image, prefix)
    procs = {v.name: start(v.argv, workdir / f"{v.name}.log") for v in views}
    events_path = workdir / "sender.jsonl"
    sender = start([PY, "-m", "overlay_manager.lab.bench.hostile", "send", "--image", image, "--out", str(events_path),
                    "--baseline-size", f"{width}x{height}", "--flood-seconds", str(flood_seconds),
                    "--flood-hz", str(flood_hz)]
                   + [a for v in views for a in ("--viewer", f"{v.name}:{procs[v.name].pid}:{v.transport}:{v.output}")],
                   workdir / "sender.log")

    def event(kind: str) -> Callable[[], Optional[Dict[str, Any]]]:
        def check() -> Optional[Dict[str, Any]]:
            evs = read_events(events_path)
            err = next((e for e in evs if e["event"] == "error"), None)
            if err or sender.poll() is not None:
                raise RuntimeError(f"the sender failed: {err['what'] if err else 'exit ' + str(sender.returncode)}; "
                                   f"log: {waiting.tail(workdir / 'sender.log', 8)}")
            return next((e for e in evs if e["event"] == kind), None)
        return check

    def state() -> str:
        return "; ".join(f"{n}: {'running' if p.poll() is None else 'exit ' + str(p.returncode)}, log "
                         f"{waiting.tail(workdir / (n + '.log'), 3)}" for n, p in procs.items())

    try:
        waiting.wait_for(f"the viewers to decode the driver's {width}x{height} stream (baseline)", event("baseline"),
                         90, interval=0.2, detail=state, fatal=(RuntimeError,), error=error)
        stop(driver)
        waiting.wait_for("the sender to finish the hostile messages and the valid stream", event("done"), 120,
                         interval=0.2, detail=state, fatal=(RuntimeError,), error=error)
    except RuntimeError as e:
        raise error(f"{e}; viewers: {state()}") from e
    events = read_events(events_path)
    return {
        "width": width, "height": height, "rate": rate, "flood_seconds": flood_seconds, "flood_hz": flood_hz,
        "events": events,
        "baseline": next(e for e in events if e["event"] == "baseline"),
        "hostile": [e for e in events if e["event"] == "hostile"],
        "valid": next(e for e in events if e["event"] == "valid"),
        "done": next(e for e in events if e["event"] == "done"),
        "outputs": [e for e in events if e["event"] == "output"],
        "keyframe_requests": [e for e in events if e["event"] == "keyframe_request"],
        "driver": driver.returncode,
        "viewers": {v.name: dict(pid=procs[v.name].pid, exit=procs[v.name].poll(), transport=v.transport,
                                 encoding=v.encoding, log=str(workdir / f"{v.name}.log"),
                                 **log_lines(workdir / f"{v.name}.log")) for v in views},
    }


def memory_rows(result: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per viewer: baseline RSS (MB), the peak after each hostile message (MB) and the
    largest peak / baseline ratio."""
    rows = []
    for name, v in result["viewers"].items():
        base = result["baseline"]["mem"][name]
        base_rss = max(base.get("rss_max", 0), base.get("rss", 0))
        peaks = {h["name"]: h["mem"].get(name, {}).get("hwm", 0) for h in result["hostile"]}
        rows.append({"viewer": name, "transport": v["transport"], "baseline_rss_mb": round(base_rss / 1024, 1),
                     "baseline_hwm_mb": round(base.get("hwm", 0) / 1024, 1),
                     "peak_mb": {k: round(p / 1024, 1) for k, p in peaks.items()},
                     "ratio": round(max(peaks.values()) / base_rss, 2) if base_rss and peaks else None,
                     "lines": v["lines"], "libav_lines": v["libav_lines"], "exit": v["exit"]})
    return rows


def table(result: Dict[str, Any]) -> str:
    """Markdown: per viewer, RSS on the stream and the peak RSS after each hostile message (MB)."""
    rows = memory_rows(result)
    names = [h["name"] for h in result["hostile"]]
    head = (f"| viewer | RSS on {result['width']}x{result['height']} (HWM) | "
            + " | ".join(names) + " | worst / RSS on the stream | log lines (libavcodec) |")
    out = [head, "|" + "---|" * (len(names) + 4)]
    for r in rows:
        out.append(f"| {r['viewer']} | {r['baseline_rss_mb']} ({r['baseline_hwm_mb']}) | "
                   + " | ".join(str(r["peak_mb"][n]) for n in names)
                   + f" | {r['ratio']} | {r['lines']} ({r['libav_lines']}) |")
    return "\n".join(out)


def _bench(args: argparse.Namespace) -> int:
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    procs: List[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="bench_hostile_") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, ROS_MASTER_URI=f"http://127.0.0.1:{port}", ROS_IP="127.0.0.1", ROS_HOME=str(work),
                   PYTHONUNBUFFERED="1")
        env.pop("ROS_HOSTNAME", None)
        env["PATH"] = "/usr/bin:/bin:/usr/sbin:/sbin:" + env.get("PATH", "")
        env["PYTHONPATH"] = str(REPO) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")

        def start(argv: Sequence[str], log: Path) -> subprocess.Popen:
            with open(log, "wb") as fh:
                p = children.spawn(list(argv), env=env, stdout=fh, stderr=subprocess.STDOUT)
            procs.append(p)
            return p

        def stop(p: subprocess.Popen) -> None:
            children.stop(p, 10.0, signal.SIGINT)

        try:
            core = start(["roscore", "-p", str(port)], work / "roscore.log")

            def up() -> bool:
                if core.poll() is not None:
                    raise RuntimeError(f"roscore exited: {waiting.tail(work / 'roscore.log')}")
                with socket.socket() as s:
                    return s.connect_ex(("127.0.0.1", port)) == 0
            waiting.wait_for(f"roscore on 127.0.0.1:{port}", up, 30, fatal=(RuntimeError,))
            print(f"[bench] roscore on {port}; driver {args.width}x{args.height} at {args.rate} Hz", file=sys.stderr)
            result = run(work, start, stop, args.width, args.height, args.rate, args.flood_seconds, args.flood_hz)
        finally:
            for p in reversed(procs):
                stop(p)
    result["date"] = time.strftime("%Y-%m-%d %H:%M")
    result["load"] = os.getloadavg()
    result["rows"] = memory_rows(result)
    keep = {k: v for k, v in result.items() if k not in ("events", "outputs")}
    (outdir / "bench_hostile.json").write_text(json.dumps(keep, indent=1))
    print(table(result))
    print(f"\n{len(result['keyframe_requests'])} keyframe requests; valid stream afterwards: "
          f"{result['valid']['shown']} of {result['valid']['sent']} frames shown; load {result['load'][0]:.1f}; "
          f"written {outdir / 'bench_hostile.json'}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="bench_hostile", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command")
    p.add_argument("--out", default=str(REPO / "artifacts"), help="directory for bench_hostile.json")
    p.add_argument("--width", type=int, default=1920, help="the driver's picture (baseline stream)")
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--rate", type=float, default=10.0, help="the driver's frame rate (Hz)")
    p.add_argument("--flood-seconds", type=float, default=3.0, help="seconds of random garbage")
    p.add_argument("--flood-hz", type=float, default=200.0, help="garbage messages per second and transport")
    p.add_argument("--workdir", default="", help="keep every process's log and the sender's events here "
                   "(default: a temporary directory, removed)")
    s = sub.add_parser("send", help="(internal) the sender node of the rig")
    s.add_argument("--image", required=True)
    s.add_argument("--viewer", action="append", default=[], help="NAME:PID:h264|jpeg:OUTPUT_TOPIC")
    s.add_argument("--out", required=True, help="events file (JSON lines)")
    s.add_argument("--baseline-size", default="1920x1080")
    s.add_argument("--baseline-frames", type=int, default=10)
    s.add_argument("--flood-seconds", type=float, default=3.0)
    s.add_argument("--flood-hz", type=float, default=200.0)
    s.add_argument("--settle", type=float, default=0.5, help="seconds between a hostile message and its probe")
    s.add_argument("--probe-timeout", type=float, default=5.0)
    s.add_argument("--valid-frames", type=int, default=30)
    args = p.parse_args(argv)
    if args.command == "send":
        return _send(args)
    return _bench(args)


if __name__ == "__main__":
    sys.exit(main())
