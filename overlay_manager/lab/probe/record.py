"""``probe record``: a lab host's view of the overlay as a stream of JSON lines (see main.py).

Runs inside a lab host's namespace (``python3 -m overlay_manager.lab.probe.main record ...``); the
test process reads the lines while it runs (robots.Recorder). ``t`` is CLOCK_MONOTONIC, the same
clock in every namespace.
"""
from __future__ import annotations

import json
import math
import signal
import sys
import threading
import time
from typing import Any, Dict

from roslib.message import get_message_class


def record(rospy: Any, args: Any) -> int:
    """Stream events as JSON lines (flushed) until SIGTERM/SIGINT or args.seconds:
    {"t", "ev": "frame", "seq", "lat_ms"} per image; {"t", "ev": "peers", "node", "paths":
    {peer: [path, latency_ms, endpoint or relay region]}} when a node's paths or latencies change; {"t", "ev": "change",
    "node", "peer", "old", "new"} per ~path_changes message; {"t", "ev": "status", "node",
    "control_reachable", "backend_state"} when it changes; {"t", "ev": "diag", "node", "level",
    "message"} when the node's overlay diagnostic changes; {"t", "ev": "conns", "topic", "connections"}
    when the connections of the image topic and the Twist topics change (probe main.connection_ids:
    a new id = a connection re-established); with ``--twist-rate`` Hz > 0 it publishes
    geometry_msgs/Twist on ``--twist-out`` (linear.x = sequence number, linear.y = send time) and
    emits {"t", "ev": "echo", "seq", "rtt_ms"} per echo on ``--twist-echo`` (rosnodes.py echo);
    {"t", "ev": "ready"} once subscribed."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    lock = threading.Lock()

    def emit(ev: str, **kw: Any) -> None:
        line = json.dumps({"t": time.monotonic(), "ev": ev, **kw})
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    last: Dict[Any, Any] = {}

    def changed(key: Any, value: Any) -> bool:
        if last.get(key) == value:
            return False
        last[key] = value
        return True

    if args.image:
        from sensor_msgs.msg import CompressedImage, Image

        def on_frame(msg: Any) -> None:
            lat = (rospy.Time.now() - msg.header.stamp).to_sec() * 1000.0 if msg.header.stamp.to_sec() > 0 else None
            emit("frame", seq=msg.header.seq, lat_ms=lat)

        rospy.Subscriber(args.image, CompressedImage if getattr(args, "compressed", False) else Image, on_frame,
                         queue_size=100, buff_size=2 ** 24, tcp_nodelay=True)
    twist_topics: tuple = ()
    if getattr(args, "twist_rate", 0.0) > 0:
        twist_topics = _twist(rospy, args, emit, stop)
    from diagnostic_msgs.msg import DiagnosticArray

    peer_list = get_message_class("overlay_manager/PeerList")
    status_t = get_message_class("overlay_manager/OverlayStatus")
    change_t = get_message_class("overlay_manager/PathChange")
    for node in args.node:
        def on_peers(msg: Any, node: str = node) -> None:
            paths = {p.name: [p.path, None if math.isnan(p.latency_ms) else round(p.latency_ms, 2),
                              p.endpoint or p.relay_region] for p in msg.peers}
            if changed(("peers", node), paths):
                emit("peers", node=node, paths=paths)

        def on_change(msg: Any, node: str = node) -> None:
            emit("change", node=node, peer=msg.peer, old=msg.old_path, new=msg.new_path,
                 endpoint=msg.endpoint, relay_region=msg.relay_region,
                 derp_region=getattr(msg, "derp_region", ""))

        def on_status(msg: Any, node: str = node) -> None:
            if changed(("status", node), (msg.control_reachable, msg.backend_state)):
                emit("status", node=node, control_reachable=msg.control_reachable,
                     backend_state=msg.backend_state, health=list(msg.health))

        rospy.Subscriber(f"{node}/peers", peer_list, on_peers)
        rospy.Subscriber(f"{node}/path_changes", change_t, on_change, queue_size=50)
        rospy.Subscriber(f"{node}/status", status_t, on_status)

    def on_diag(msg: Any) -> None:
        for s in msg.status:
            for node in args.node:
                if s.name == f"{node.lstrip('/')}: overlay" and changed(("diag", node), (s.level, s.message)):
                    emit("diag", node=node, level=s.level, message=s.message)

    if args.node:
        rospy.Subscriber("/diagnostics", DiagnosticArray, on_diag, queue_size=50)
    emit("ready")
    end = time.monotonic() + args.seconds if args.seconds > 0 else math.inf
    from overlay_manager.lab.probe.main import connection_ids

    while not stop.is_set() and time.monotonic() < end:
        stop.wait(0.2)
        watched = ((args.image,) if args.image else ()) + twist_topics
        if watched:
            conns = connection_ids(rospy, watched)
            if changed("conns", conns):
                emit("conns", topic=args.image, connections=conns)
    emit("end")
    return 0


def _twist(rospy: Any, args: Any, emit: Any, stop: threading.Event) -> tuple:
    """The round trip of ``record --twist-rate``: a sender thread on absolute deadlines and an
    ``echo`` event per echo; returns the two topics (for the connection ids)."""
    from geometry_msgs.msg import Twist

    def on_echo(msg: Any) -> None:
        now = time.monotonic()
        emit("echo", seq=int(msg.linear.x), rtt_ms=round((now - msg.linear.y) * 1000.0, 3))

    pub = rospy.Publisher(args.twist_out, Twist, queue_size=100, tcp_nodelay=True)
    rospy.Subscriber(args.twist_echo, Twist, on_echo, queue_size=100, tcp_nodelay=True)
    period = 1.0 / args.twist_rate

    def send() -> None:
        seq = 0
        nxt = time.monotonic()
        while not stop.is_set():
            seq += 1
            msg = Twist()
            msg.linear.x = float(seq)
            msg.linear.y = time.monotonic()
            pub.publish(msg)
            nxt += period
            stop.wait(max(0.0, nxt - time.monotonic()))

    threading.Thread(target=send, name="twist-sender", daemon=True).start()
    return (args.twist_out, args.twist_echo)
