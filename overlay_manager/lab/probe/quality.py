"""``probe quality``: what a viewer gets of one or more camera streams: rate, latency, bitrate, PSNR.

Runs inside a lab host's namespace (``python3 -m overlay_manager.lab.probe.main quality ...``) and
prints one JSON document (see main.py). Each ``--stream KIND:TOPIC`` is one subscription:

    raw   sensor_msgs/Image (rgb8 or bgr8)
    jpeg  sensor_msgs/CompressedImage with a JPEG picture per message (the link-aware encoder's
          ``<image>/compressed`` and the ``link_aware`` transport)
    h264  sensor_msgs/CompressedImage, format "h264": H.264 Annex B of one frame per message,
          keyframes with SPS/PPS (the ``link_aware_h264`` transport); decoded with PyAV
          (libavcodec), in order, as a viewer does

For every message the subscriber's callback notes the receipt (CLOCK_MONOTONIC), the latency
(receive wall time - header.stamp; the lab hosts share one clock), the payload bytes and the
source frame's index from header.frame_id (``camera#123``, scene.frame_index), and hands the
payload to the stream's worker thread, so decoding never delays the receipt times. The worker
decodes every message (H.264 needs every frame for its references), and for every
``--psnr-every``-th decoded picture computes its PSNR against the source frame, read from the
scene the camera plays (scene.SceneFrames: the same cached, scaled frames, bit-identical to
what the camera sent).

``receiver_cpu_pct``: this process's CPU (all threads: receiving, decoding, PSNR) over the window,
in % of one core. Measurement window: from the moment every stream has delivered its first message (or
``--timeout`` has passed) for ``--seconds``. Per stream (keys of the JSON's ``streams`` map,
in the order given): ``count``, ``rate_hz``, ``span_rate_hz``, ``max_gap_s``,
``latency_p50_ms``/``p99``/``max``, ``bytes_per_s``, ``kbps`` (payload bytes in the window),
``decoded``, ``undecodable`` (messages that gave no picture: for H.264 those before the first
keyframe, and any broken one), ``psnr_mean``/``psnr_min``/``psnr_p5``/``psnr_frames`` (dB over
the window's pictures whose PSNR was computed; None when none), ``no_index`` (messages without a
frame index), ``first_message_s`` and ``first_picture_s`` (seconds from subscribing to the first
message and to the first decoded picture: a late subscriber's wait for a keyframe), and with
``--frames`` the list ``frames`` of ``[t, index, latency_ms, bytes, psnr or null]`` for every
message of the run (t = CLOCK_MONOTONIC; psnr null where not computed or not decodable).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Tuple

from overlay_manager.core.stats import latency_stats, percentile, rate_stats
from overlay_manager.lab.probe.scene import DEFAULT_FRAMES, DEFAULT_VIDEO, SceneFrames, frame_index, psnr

KINDS = ("raw", "jpeg", "h264")


def parse_stream(text: str) -> Tuple[str, str]:
    """``KIND:TOPIC`` -> (kind, topic); ValueError naming the argument and the kinds otherwise."""
    kind, sep, topic = text.partition(":")
    if not sep or kind not in KINDS or not topic:
        raise ValueError(f"--stream {text!r}: expected KIND:TOPIC with KIND one of {', '.join(KINDS)}")
    return kind, topic


class Decoder:
    """Payload -> RGB picture (HxWx3 uint8) for one stream kind; ``decode(data, n)`` returns a
    list of (message number, picture), the number being the ``n`` of the message the picture
    came from (H.264 may hold a picture back; with one frame per message and no B-frames it does
    not). Raises on a broken payload."""

    def __init__(self, kind: str) -> None:
        import cv2
        import numpy as np

        self.kind, self._cv2, self._np = kind, cv2, np
        self._ctx: Any = None
        if kind == "h264":
            import av

            self._av = av
            self._ctx = av.CodecContext.create("h264", "r")

    def decode(self, data: bytes, n: int, width: int = 0, height: int = 0, encoding: str = "") -> List[Tuple[int, Any]]:
        """Decode one message's payload (raw: width, height and encoding of the Image)."""
        cv2, np = self._cv2, self._np
        if self.kind == "raw":
            pic = np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)
            return [(n, cv2.cvtColor(pic, cv2.COLOR_BGR2RGB) if encoding == "bgr8" else pic)]
        if self.kind == "jpeg":
            bgr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
            if bgr is None:
                raise ValueError("not a decodable JPEG")
            return [(n, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))]
        packet = self._av.Packet(data)
        packet.pts = n
        return [(int(f.pts) if f.pts is not None else n, f.to_ndarray(format="rgb24"))
                for f in self._ctx.decode(packet)]


class Stream:
    """One subscription: receipts (callback thread) and pictures with PSNR (worker thread).

    Threads: rospy's connection thread calls :meth:`on_message` (appends to ``_todo`` and the
    receipt lists under ``_lock``, never decodes); the worker thread (:meth:`work`) takes from
    ``_todo`` under ``_lock`` and decodes without it; ``results`` is written only by the worker and
    read after :meth:`finish`."""

    def __init__(self, kind: str, topic: str, video: Path, psnr_every: int, t_subscribe: float,
                 scene_frames: int = DEFAULT_FRAMES) -> None:
        self.kind, self.topic, self.video, self.psnr_every = kind, topic, video, max(1, psnr_every)
        self.scene_frames = scene_frames
        self.t_subscribe = t_subscribe
        self._lock = threading.Condition()
        self._todo: Deque[Tuple[int, bytes, int, int, str]] = deque()
        self.receipts: List[Tuple[float, Optional[int], Optional[float], int]] = []  # t, index, lat_ms, bytes
        self.results: Dict[int, Optional[float]] = {}  # message number -> PSNR (None: picture, no PSNR)
        self.undecodable: List[int] = []
        self.errors: List[str] = []
        self.first_picture_t: Optional[float] = None
        self._closed = False
        # made before subscribing, so a first picture's time is the stream's, not our start-up's
        self._decoder: Optional[Decoder] = None
        self._refs: Optional[SceneFrames] = None
        try:
            self._decoder = Decoder(kind)
            self._refs = SceneFrames(video, frames=scene_frames)
        except Exception as exc:  # noqa: BLE001 - reported in the JSON, the receipts still count
            self.errors.append(f"{topic}: cannot decode ({type(exc).__name__}: {exc})")
        self._thread = threading.Thread(target=self.work, name=f"quality {topic}", daemon=True)
        self._thread.start()

    def on_message(self, msg: Any, now_wall: float) -> None:
        """Subscriber callback body: note the receipt, queue the payload (no decoding here)."""
        t = time.monotonic()
        stamp = msg.header.stamp.to_sec()
        lat = (now_wall - stamp) * 1000.0 if stamp > 0 else None
        idx = frame_index(msg.header.frame_id)
        data = bytes(msg.data)
        with self._lock:
            n = len(self.receipts)
            self.receipts.append((t, idx, lat, len(data)))
            if not self._closed:
                self._todo.append((n, data, getattr(msg, "width", 0), getattr(msg, "height", 0),
                                   getattr(msg, "encoding", "")))
                self._lock.notify()

    def work(self) -> None:
        """Worker: decode every queued payload in order, PSNR every psnr_every-th picture."""
        decoder, refs = self._decoder, self._refs
        if decoder is None or refs is None:
            return
        pictures = 0
        while True:
            with self._lock:
                while not self._todo and not self._closed:
                    self._lock.wait(0.5)
                if not self._todo:
                    break
                n, data, width, height, encoding = self._todo.popleft()
            try:
                out = decoder.decode(data, n, width, height, encoding)
            except Exception as exc:  # noqa: BLE001 - a broken or undecodable message is counted
                self.undecodable.append(n)
                if len(self.errors) < 5:
                    self.errors.append(f"message {n}: {type(exc).__name__}: {exc}")
                continue
            if not out:
                self.undecodable.append(n)
                continue
            for m, pic in out:
                if self.first_picture_t is None:
                    self.first_picture_t = time.monotonic()
                pictures += 1
                value: Optional[float] = None
                idx = self.receipts[m][1] if m < len(self.receipts) else None
                if idx is not None and pictures % self.psnr_every == 0:
                    src = refs.frame(idx)
                    if src is not None and src.shape == pic.shape:
                        value = round(psnr(pic, src), 2)
                self.results[m] = value

    def finish(self, timeout: float) -> bool:
        """No more payloads; wait up to ``timeout`` s for the worker to drain. True if it did."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def report(self, start: float, end: float, frames: bool) -> Dict[str, Any]:
        """The JSON for this stream over the window [start, end) (see the module doc)."""
        seconds = end - start
        with self._lock:
            receipts = list(self.receipts)
        win = [(n, r) for n, r in enumerate(receipts) if start <= r[0] < end]
        times = [r[0] for _, r in win]
        lats = [r[2] for _, r in win if r[2] is not None]
        nbytes = sum(r[3] for _, r in win)
        ps = [self.results[n] for n, _ in win if self.results.get(n) is not None]
        undecodable = set(self.undecodable)
        out: Dict[str, Any] = {
            "kind": self.kind, "topic": self.topic, **rate_stats(times, seconds), **latency_stats(lats),
            "bytes_per_s": nbytes / seconds if seconds > 0 else None,
            "kbps": nbytes * 8 / 1000.0 / seconds if seconds > 0 else None,
            "decoded": sum(1 for n, _ in win if n in self.results),
            "undecodable": sum(1 for n, _ in win if n in undecodable),
            "undecodable_total": len(undecodable),
            "psnr_frames": len(ps), "psnr_mean": round(sum(ps) / len(ps), 2) if ps else None,
            "psnr_min": min(ps) if ps else None, "psnr_p5": percentile(ps, 5),
            "no_index": sum(1 for _, r in win if r[1] is None),
            "first_message_s": receipts[0][0] - self.t_subscribe if receipts else None,
            "first_picture_s": (self.first_picture_t - self.t_subscribe) if self.first_picture_t else None,
            "errors": self.errors[:5],
        }
        if frames:
            out["frames"] = [[round(r[0], 4), r[1], None if r[2] is None else round(r[2], 2), r[3],
                              self.results.get(n)] for n, r in enumerate(receipts)]
        return out


def quality(rospy: Any, args: Any) -> Dict[str, Any]:
    """Run the probe (args: stream, seconds, timeout, video, scene_frames, psnr_every, frames); returns the JSON
    data (``ok``, ``streams``, ``t_start``/``t_end`` CLOCK_MONOTONIC, ``waited_s``)."""
    from sensor_msgs.msg import CompressedImage, Image

    specs = [parse_stream(s) for s in args.stream]
    streams: List[Stream] = []
    subs = []
    video = Path(args.video) if args.video else DEFAULT_VIDEO
    for kind, topic in specs:
        st = Stream(kind, topic, video, args.psnr_every, time.monotonic(), args.scene_frames)
        streams.append(st)

        def cb(msg: Any, st: Stream = st) -> None:
            st.on_message(msg, rospy.Time.now().to_sec())

        st.t_subscribe = time.monotonic()
        subs.append(rospy.Subscriber(topic, Image if kind == "raw" else CompressedImage, cb, queue_size=200,
                                     buff_size=2 ** 24, tcp_nodelay=True))
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    while time.monotonic() < deadline and not all(st.receipts for st in streams):
        time.sleep(0.05)
    start, cpu0 = time.monotonic(), time.process_time()
    time.sleep(args.seconds)
    end, cpu1 = time.monotonic(), time.process_time()
    for s in subs:
        s.unregister()
    drained = all(st.finish(max(1.0, args.seconds)) for st in streams)
    return {"ok": True, "t_start": start, "t_end": end, "waited_s": round(start - t0, 3), "drained": drained,
            "receiver_cpu_pct": round(100.0 * (cpu1 - cpu0) / (end - start), 1),
            "streams": {st.topic: st.report(start, end, args.frames) for st in streams}}
