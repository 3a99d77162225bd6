"""A robot's sensor mix as ROS topics, and what a viewer gets of any topics (run inside a lab host).

    python3 -m overlay_manager.lab.probe.mix_nodes publish [--ns /robot] [--scene real|synthetic]
        [--cloud-hz 10] [--scan-hz 40] [--grid-hz 1] [--stride 2] [--tiles 2]
    python3 -m overlay_manager.lab.probe.mix_nodes ages --topic T [--topic T ...] [--seconds 10]
        [--timeout 30] [--sample-hz 20] [--warmup 0]

``publish``: the data of mix_data.py (real scene by default) on ``<ns>/points``
(sensor_msgs/PointCloud2, frame ``camera_optical``), ``<ns>/scan`` (sensor_msgs/LaserScan,
frame ``laser``) and ``<ns>/map`` (nav_msgs/OccupancyGrid, frame ``map``), each at its rate from
its own thread, header.stamp = the send time (wall clock, shared by the lab hosts), header.seq
counting messages. Publishers keep a queue of 2 per subscriber (rospy queues per connection and
drops the oldest: a slow subscriber never slows the others), as a sensor driver does. The
frames' variants (sensor noise, mix_data.py) are made once at the start and played in a loop
(8 clouds, 40 scans): publishing costs a copy. It prints one JSON line with the sizes once it
publishes.

``ages``: subscribes to every ``--topic`` with rospy.AnyMsg (any type; the payload is not
deserialized) and reads header.seq and header.stamp from the first 12 bytes (every type whose
first field is a std_msgs/Header: clouds, scans, grids, images). Measured from ``--warmup``
seconds after every topic delivered its first message (or ``--timeout`` passed) for
``--seconds``; per topic:

    count, rate_hz                messages received in the window, and per second
    latency_p50/p99/max_ms        receive time - header.stamp of each message
    age_p50/p99/max_ms            the age of the newest message received so far (now - its
                                  stamp), sampled ``--sample-hz`` times a second: what a viewer
                                  showing "the latest" shows; it grows between messages and
                                  with every queue on the way
    bytes_p50, kbps               serialized message size; payload rate in the window
    latency_growth_ms             mean latency of the window's last quarter minus its first
                                  quarter's (a growing queue shows here)
    latency_slope_ms_per_s        least-squares slope of latency over receive time
    first_message_s               seconds from subscribing to the first message
    series                        per second: [t (s from the window's start), messages,
                                  mean latency ms, largest sampled age ms]
    no_header                     messages whose stamp is not a plausible time (no Header first)

Times: latency and age use the wall clock (the lab hosts share it); ``t`` values are
CLOCK_MONOTONIC.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from overlay_manager.core.stats import latency_stats, percentile

CLOUD_VARIANTS, SCAN_VARIANTS = 8, 40
"""Frames made at the start and played in a loop (a cloud variant is 5.7 MB)."""
PLAUSIBLE_LATENCY_S = 3600.0
"""A header stamp further than this from now is not a stamp (the type has no Header first)."""


def _out(data: Any) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def build_messages(scene_kind: str, stride: int, tiles: int) -> Dict[str, Any]:
    """topic suffix -> (message class instance list): the cloud and scan variants and the grid,
    as ROS messages (headers left to the publisher)."""
    from nav_msgs.msg import OccupancyGrid
    from sensor_msgs.msg import LaserScan, PointCloud2, PointField

    from overlay_manager.lab.probe import mix_data

    scene = mix_data.load_scene() if scene_kind == "real" else mix_data.synthetic_scene()
    fields = [PointField(name=n, offset=4 * i, datatype=PointField.FLOAT32, count=1)
              for i, n in enumerate(("x", "y", "z", "rgb"))]
    clouds = []
    for v in range(CLOUD_VARIANTS):
        c = mix_data.point_cloud(scene, stride=stride, variant=v)
        m = PointCloud2(height=c.height, width=c.width, fields=fields, is_bigendian=False,
                        point_step=mix_data.POINT_STEP, row_step=mix_data.POINT_STEP * c.width, data=c.data,
                        is_dense=False)
        m.header.frame_id = "camera_optical"
        clouds.append(m)
    scans = []
    for v in range(SCAN_VARIANTS):
        s = mix_data.laser_scan(scene, variant=v)
        m = LaserScan(angle_min=s.angle_min, angle_max=s.angle_max, angle_increment=s.angle_increment,
                      time_increment=0.0, scan_time=0.025, range_min=s.range_min, range_max=s.range_max,
                      ranges=s.ranges, intensities=s.intensities)
        m.header.frame_id = "laser"
        scans.append(m)
    g = mix_data.occupancy_grid(scene, tiles=tiles)
    grid = OccupancyGrid()
    grid.header.frame_id = "map"
    grid.info.resolution, grid.info.width, grid.info.height = g.resolution, g.width, g.height
    grid.info.origin.orientation.w = 1.0
    grid.data = list(struct.unpack(f"{len(g.data)}b", g.data))
    return {"points": clouds, "scan": scans, "map": [grid], "source": scene.source}


def serialized(msg: Any) -> bytes:
    """A genpy message's wire bytes."""
    import io

    b = io.BytesIO()
    msg.serialize(b)
    return b.getvalue()


def raw_class(msg_class: Any) -> Any:
    """A message class that publishes as ``msg_class`` (same type, md5sum and definition) from
    bytes serialized once (:func:`with_header` puts a new header.seq and stamp in front): a
    5.7 MB cloud or grid costs one copy a message instead of genpy's packing (packing a grid's
    5.7 million int8 cells takes about half a second)."""
    import genpy

    class Raw(genpy.Message):
        __slots__ = ["buff"]
        _slot_types = ["bytes"]
        _type, _md5sum, _full_text = msg_class._type, msg_class._md5sum, msg_class._full_text
        _has_header = False  # rospy would set header.seq on a message it believes has one: ours are bytes

        def __init__(self, buff: bytes = b"") -> None:
            self.buff = buff

        def serialize(self, buff: Any) -> None:
            buff.write(self.buff)

    Raw.__name__ = f"Raw{msg_class.__name__}"
    return Raw


def with_header(wire: bytes, seq: int, secs: int, nsecs: int) -> bytes:
    """``wire`` (a serialized message whose first field is a std_msgs/Header) with header.seq
    and header.stamp replaced."""
    return struct.pack("<III", seq & 0xFFFFFFFF, secs, nsecs) + wire[12:]


def publish(ns: str, scene_kind: str, rates: Dict[str, float], stride: int, tiles: int) -> None:
    """The ``publish`` command (see the module doc); until shutdown."""
    import rospy
    from nav_msgs.msg import OccupancyGrid
    from sensor_msgs.msg import LaserScan, PointCloud2

    rospy.init_node("lab_mix", anonymous=True)
    msgs = build_messages(scene_kind, stride, tiles)
    types = {"points": PointCloud2, "scan": LaserScan, "map": OccupancyGrid}
    wires = {k: [serialized(m) for m in msgs[k]] for k in types}
    del msgs["points"], msgs["scan"], msgs["map"]
    ns = ns.rstrip("/")
    sizes = {k: len(w[0]) for k, w in wires.items()}
    raws = {k: raw_class(t) for k, t in types.items()}
    pubs = {k: rospy.Publisher(f"{ns}/{k}", raws[k], queue_size=2) for k in types if rates.get(k, 0) > 0}

    def loop(key: str) -> None:
        period, seq = 1.0 / rates[key], 0
        nxt = time.monotonic()
        variants = wires[key]
        while not rospy.is_shutdown():
            wire = variants[seq % len(variants)]
            seq += 1
            now = rospy.Time.now()
            try:
                pubs[key].publish(raws[key](with_header(wire, seq, now.secs, now.nsecs)))
            except rospy.ROSException:
                break
            nxt += period
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                nxt = time.monotonic()  # late: never burst to catch up

    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in pubs]
    for t in threads:
        t.start()
    _out({"ok": True, "source": msgs["source"], "bytes": sizes, "rates_hz": {k: rates[k] for k in pubs},
          "topics": [f"{ns}/{k}" for k in pubs]})
    rospy.spin()


def header_stamp(buff: bytes) -> Optional[float]:
    """header.stamp (s) of a serialized message whose first field is a std_msgs/Header
    (uint32 seq, uint32 secs, uint32 nsecs, little-endian); None when shorter than that."""
    if len(buff) < 12:
        return None
    _seq, secs, nsecs = struct.unpack_from("<III", buff, 0)
    return secs + nsecs * 1e-9


def topic_report(rx: Sequence[Sequence[float]], ages: Sequence[float], t0: float, seconds: float,
                 age_series: Sequence[Sequence[float]], no_header: int, first_s: Optional[float]) -> Dict[str, Any]:
    """One topic's numbers (see the module doc) from its receipts ``rx`` = [t (CLOCK_MONOTONIC s),
    latency s, bytes] in the window starting at ``t0``, its sampled ``ages`` (s) and
    ``age_series`` = [t, age s] samples."""
    lat_ms = [r[1] * 1000.0 for r in rx]
    out: Dict[str, Any] = {"count": len(rx), "rate_hz": round(len(rx) / seconds, 2) if seconds > 0 else None,
                           **latency_stats(lat_ms), "bytes_p50": percentile([r[2] for r in rx], 50),
                           "kbps": round(sum(r[2] for r in rx) * 8 / 1000.0 / seconds, 1) if seconds > 0 else None,
                           "first_message_s": None if first_s is None else round(first_s, 3),
                           "no_header": no_header}
    age_ms = [a * 1000.0 for a in ages]
    out.update({"age_p50_ms": percentile(age_ms, 50), "age_p99_ms": percentile(age_ms, 99),
                "age_max_ms": round(max(age_ms), 1) if age_ms else None})
    q = max(1, len(rx) // 4)
    out["latency_growth_ms"] = (round(sum(lat_ms[-q:]) / q - sum(lat_ms[:q]) / q, 1) if len(rx) >= 4 else None)
    out["latency_slope_ms_per_s"] = slope([r[0] for r in rx], lat_ms)
    series = []
    for s in range(int(seconds)):
        lo, hi = t0 + s, t0 + s + 1
        in_s = [r for r in rx if lo <= r[0] < hi]
        ag = [a[1] for a in age_series if lo <= a[0] < hi]
        series.append([s, len(in_s), round(sum(r[1] for r in in_s) * 1000 / len(in_s), 1) if in_s else None,
                       round(max(ag) * 1000, 1) if ag else None])
    out["series"] = series
    return out


def slope(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Least-squares slope dy/dx; None with fewer than 3 points or no spread in x."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx, 2)


def ages(topics: Sequence[str], seconds: float, timeout: float, sample_hz: float,
         warmup: float = 0.0) -> Dict[str, Any]:
    """The ``ages`` command (see the module doc); returns the JSON document."""
    import rospy

    rospy.init_node("lab_ages", anonymous=True, disable_signals=True)
    lock = threading.Lock()
    rx: Dict[str, List[List[float]]] = {t: [] for t in topics}
    newest: Dict[str, float] = {}
    first: Dict[str, float] = {}
    bad: Dict[str, int] = {t: 0 for t in topics}
    t_sub = time.monotonic()

    def make_cb(topic: str) -> Any:
        def cb(msg: Any) -> None:
            now_m, now_w = time.monotonic(), time.time()
            buff = msg._buff
            stamp = header_stamp(buff)
            with lock:
                first.setdefault(topic, now_m)
                if stamp is None or abs(now_w - stamp) > PLAUSIBLE_LATENCY_S:
                    bad[topic] += 1
                    return
                rx[topic].append([now_m, now_w - stamp, float(len(buff))])
                if stamp > newest.get(topic, 0.0):
                    newest[topic] = stamp
        return cb

    subs = [rospy.Subscriber(t, rospy.AnyMsg, make_cb(t), queue_size=10, buff_size=2 ** 27, tcp_nodelay=True)
            for t in topics]
    deadline = t_sub + timeout
    while time.monotonic() < deadline:
        with lock:
            if all(t in first for t in topics):
                break
        time.sleep(0.05)
    time.sleep(warmup)  # what queued on the way before this subscription drains first
    t0 = time.monotonic()
    samples: Dict[str, List[List[float]]] = {t: [] for t in topics}
    period = 1.0 / sample_hz
    nxt = t0
    while True:
        now_m = time.monotonic()
        if now_m >= t0 + seconds:
            break
        now_w = time.time()
        with lock:
            for t in topics:
                if t in newest:
                    samples[t].append([now_m, now_w - newest[t]])
        nxt += period
        time.sleep(max(0.0, nxt - time.monotonic()))
    t_end = time.monotonic()
    for s in subs:
        s.unregister()
    with lock:
        out = {}
        for t in topics:
            win = [r for r in rx[t] if t0 <= r[0] < t_end]
            out[t] = topic_report(win, [a[1] for a in samples[t]], t0, t_end - t0, samples[t], bad[t],
                                  (first[t] - t_sub) if t in first else None)
            out[t]["topic"] = t
    return {"ok": True, "t_start": t0, "t_end": t_end, "seconds": round(t_end - t0, 2), "topics": out,
            "missing": [t for t in topics if t not in first]}


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point (see the module doc)."""
    ap = argparse.ArgumentParser(prog="mix_nodes")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("publish", help="the robot's cloud, scan and grid")
    p.add_argument("--ns", default="/robot")
    p.add_argument("--scene", choices=["real", "synthetic"], default="real")
    p.add_argument("--cloud-hz", type=float, default=10.0)
    p.add_argument("--scan-hz", type=float, default=40.0)
    p.add_argument("--grid-hz", type=float, default=1.0)
    p.add_argument("--stride", type=int, default=2, help="cloud: every N-th pixel (2: 355,755 points)")
    p.add_argument("--tiles", type=int, default=2, help="grid: N x N tiles of the scene (2: 2564 x 2220 cells)")
    a = sub.add_parser("ages", help="rate, latency and age of the newest message per topic")
    a.add_argument("--topic", action="append", required=True)
    a.add_argument("--seconds", type=float, default=10.0)
    a.add_argument("--timeout", type=float, default=30.0, help="for every topic's first message")
    a.add_argument("--sample-hz", type=float, default=20.0)
    a.add_argument("--warmup", type=float, default=0.0, help="seconds from every topic's first message to the window")
    args = ap.parse_args(argv)
    if args.cmd == "publish":
        publish(args.ns, args.scene, {"points": args.cloud_hz, "scan": args.scan_hz, "map": args.grid_hz},
                args.stride, args.tiles)
        return 0
    _out(ages(args.topic, args.seconds, args.timeout, args.sample_hz, args.warmup))
    return 0


if __name__ == "__main__":
    sys.exit(main())
