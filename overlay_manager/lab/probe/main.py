"""ROS client probes run *inside* a lab host's namespace (python3 -m overlay_manager.lab.probe.main ...).

The test process lives in the host's root namespace and cannot reach overlay addresses, so system
tests, the demo and the benchmark run these small ROS clients in a lab host and read one JSON
document from stdout. Every probe waits with a bounded timeout and says what it waited for.

    probe peers [--node /overlay_manager] [--min-peers N] [--timeout S]      -> PeerList
    probe status [--node ...] [--timeout S] [--where 'python expr']          -> OverlayStatus
    probe call SERVICE TYPE '{"field": value}' [--timeout S]                 -> response
    probe rate TOPIC TYPE --seconds S                                         -> rate, gaps, latency
    probe collect TOPIC TYPE --seconds S                                      -> messages
    probe nodes '{"ping": [[node, peer]...], "peers": {node: {peer: path|"*"}}}' -> pings, PeerLists
    probe control [--rate 50] [--seconds S]      Twist /cmd_vel -> /cmd_vel_echo round trip p50/p99
    probe record [--image T] [--node N]... [--seconds S]   JSON lines of events until SIGTERM
    probe quality --stream raw|jpeg|h264:TOPIC ... --seconds S   rate, latency, bitrate, PSNR per stream
    probe topics [--wait-for TOPIC]... [--timeout S]          the master's published topics
    probe pid NODE [--timeout S]                 the pid of a ROS node (C++ or Python), from its getPid

Times: ``t`` values are CLOCK_MONOTONIC seconds (the same clock in every namespace, so the test
process compares them with its own time.monotonic()); latencies from header stamps use the wall
clock, which all lab hosts share.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from overlay_manager.core.stats import latency_stats, rate_stats
from overlay_manager.lab.probe.scene import DEFAULT_FRAMES


def to_dict(msg: Any) -> Any:
    """A genpy message (or value) -> JSON-able data; times as float seconds."""
    if hasattr(msg, "__slots__") and hasattr(msg, "_slot_types"):
        return {k: to_dict(getattr(msg, k)) for k in msg.__slots__}
    if hasattr(msg, "to_sec"):
        return msg.to_sec()
    if isinstance(msg, (list, tuple)):
        return [to_dict(x) for x in msg]
    if isinstance(msg, bytes):
        return len(msg)
    if isinstance(msg, float) and math.isnan(msg):
        return None
    return msg


def load_type(name: str, kind: str = "msg") -> Any:
    """'pkg/Name' -> the generated class (kind 'msg' or 'srv'); roslib's look-up."""
    from roslib.message import get_message_class, get_service_class
    return (get_service_class if kind == "srv" else get_message_class)(name)


def _out(data: Any) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def _fail(what: str, detail: str = "") -> int:
    _out({"ok": False, "error": f"timed out waiting for {what}" + (f": {detail}" if detail else "")})
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    """Probe entry point; exit 0 with JSON on success, 1 with {"ok": false, "error"} otherwise."""
    ap = argparse.ArgumentParser(prog="probe")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("peers")
    p.add_argument("--node", default="/overlay_manager")
    p.add_argument("--min-peers", type=int, default=0)
    p.add_argument("--where", default="", help="python expression on dict m that must hold")
    p.add_argument("--timeout", type=float, default=30.0)
    s = sub.add_parser("status")
    s.add_argument("--node", default="/overlay_manager")
    s.add_argument("--where", default="")
    s.add_argument("--timeout", type=float, default=30.0)
    c = sub.add_parser("call")
    c.add_argument("service")
    c.add_argument("type")
    c.add_argument("args", nargs="?", default="{}")
    c.add_argument("--timeout", type=float, default=30.0)
    r = sub.add_parser("rate")
    r.add_argument("topic")
    r.add_argument("type")
    r.add_argument("--seconds", type=float, default=5.0)
    r.add_argument("--timeout", type=float, default=30.0, help="for the first message")
    k = sub.add_parser("collect")
    k.add_argument("topic")
    k.add_argument("type")
    k.add_argument("--seconds", type=float, default=5.0)
    n = sub.add_parser("nodes", help="several overlay nodes at once: ping_peer calls, then ~peers conditions")
    n.add_argument("spec", help='{"ping": [[node, peer], ...], "ping_count": 3, '
                                '"peers": {node: {peer: "direct"|"derp"|"*"}}, "lenient": false} '
                                '(lenient: on timeout report "unmet" instead of failing)')
    n.add_argument("--timeout", type=float, default=30.0)
    t = sub.add_parser("control", help="Twist round trip through an echo")
    t.add_argument("--out", default="/cmd_vel")
    t.add_argument("--echo", default="/cmd_vel_echo")
    t.add_argument("--rate", type=float, default=50.0)
    t.add_argument("--seconds", type=float, default=5.0)
    t.add_argument("--timeout", type=float, default=30.0, help="for the first echo")
    t.add_argument("--samples", action="store_true", help="also each Twist's send time and round trip (samples)")
    e = sub.add_parser("record", help="stream events as JSON lines until SIGTERM/SIGINT or --seconds")
    e.add_argument("--image", default="", help="an image topic: one line per frame (seq, latency)")
    e.add_argument("--compressed", action="store_true", help="the image topic is sensor_msgs/CompressedImage "
                   "(JPEG or H.264 streams), not sensor_msgs/Image")
    e.add_argument("--node", action="append", default=[], help="an overlay node: its ~peers paths, "
                   "~path_changes, ~status and its /diagnostics overlay entry")
    e.add_argument("--seconds", type=float, default=0.0, help="0 = until SIGTERM/SIGINT")
    e.add_argument("--twist-rate", type=float, default=0.0, help="Hz of a Twist round trip through an echo "
                   "(0 = none): one 'echo' line per echo")
    e.add_argument("--twist-out", default="/cmd_vel")
    e.add_argument("--twist-echo", default="/cmd_vel_echo")
    q = sub.add_parser("quality", help="camera streams as a viewer gets them: rate, latency, bitrate, PSNR "
                                       "(probe_quality.py)")
    q.add_argument("--stream", action="append", required=True, help="KIND:TOPIC, KIND raw|jpeg|h264 (repeat)")
    q.add_argument("--seconds", type=float, default=8.0)
    q.add_argument("--timeout", type=float, default=30.0, help="for every stream's first message")
    q.add_argument("--video", default="", help="the camera's video file (default: the lab camera's)")
    q.add_argument("--scene-frames", type=int, default=DEFAULT_FRAMES, help="frames of the video the camera loops")
    q.add_argument("--psnr-every", type=int, default=1, help="PSNR of every N-th decoded picture")
    q.add_argument("--frames", action="store_true", help="include every message's [t, index, latency, bytes, psnr]")
    o = sub.add_parser("topics", help="published topics (name -> type), optionally after some appear")
    o.add_argument("--wait-for", action="append", default=[], help="a topic that must be published (repeat)")
    o.add_argument("--timeout", type=float, default=10.0)
    d = sub.add_parser("pid", help="the pid of a node (waits until it is registered and answers getPid)")
    d.add_argument("node")
    d.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args(argv)
    if args.cmd == "pid":
        return _pid(args.node, args.timeout)

    import rospy
    rospy.init_node("lab_probe", anonymous=True, disable_signals=True)

    if args.cmd in ("peers", "status"):
        topic = f"{args.node}/{'peers' if args.cmd == 'peers' else 'status'}"
        typ = load_type("overlay_manager/PeerList" if args.cmd == "peers" else "overlay_manager/OverlayStatus")
        latest: Dict[str, Any] = {}
        cond = threading.Condition()

        def cb(msg: Any) -> None:
            with cond:
                latest["m"] = to_dict(msg)
                cond.notify_all()

        rospy.Subscriber(topic, typ, cb)
        deadline = time.monotonic() + args.timeout
        with cond:
            while True:
                m = latest.get("m")
                if m is not None:
                    good = True
                    if args.cmd == "peers" and len(m["peers"]) < args.min_peers:
                        good = False
                    if good and args.where:
                        good = bool(eval(args.where, {"math": math}, {"m": m}))  # noqa: S307 - test probe
                    if good:
                        _out({"ok": True, "msg": m})
                        return 0
                left = deadline - time.monotonic()
                if left <= 0:
                    return _fail(f"{topic}" + (f" with {args.min_peers}+ peers" if args.cmd == "peers" else "")
                                 + (f" where {args.where}" if args.where else ""), json.dumps(m)[:2000])
                cond.wait(min(left, 0.5))
    if args.cmd == "call":
        srv = load_type(args.type, "srv")
        try:
            rospy.wait_for_service(args.service, timeout=args.timeout)
        except rospy.ROSException:
            return _fail(f"service {args.service}")
        resp = rospy.ServiceProxy(args.service, srv)(**json.loads(args.args))
        _out({"ok": True, "msg": to_dict(resp)})
        return 0
    if args.cmd in ("rate", "collect"):
        typ = load_type(args.type)
        stamps: List[float] = []
        lats: List[float] = []
        msgs: List[Any] = []
        first = threading.Event()

        def rcb(msg: Any) -> None:
            stamps.append(time.monotonic())
            header = getattr(msg, "header", None)
            if header is not None and header.stamp.to_sec() > 0:
                lats.append((rospy.Time.now() - header.stamp).to_sec() * 1000.0)
            if args.cmd == "collect":
                msgs.append(to_dict(msg))
            first.set()

        rospy.Subscriber(args.topic, typ, rcb, queue_size=100, buff_size=2 ** 24, tcp_nodelay=True)
        if args.cmd == "rate" and not first.wait(args.timeout):
            return _fail(f"first message on {args.topic}")
        start = time.monotonic()
        n0, l0 = len(stamps), len(lats)
        time.sleep(args.seconds)
        window = [t for t in stamps[n0:] if t >= start]
        _out({"ok": True, **rate_stats(window, args.seconds), **latency_stats(lats[l0:]), "msgs": msgs})
        return 0
    if args.cmd == "nodes":
        return _nodes(rospy, json.loads(args.spec), args.timeout)
    if args.cmd == "control":
        return _control(rospy, args)
    if args.cmd == "record":
        from overlay_manager.lab.probe.record import record
        return record(rospy, args)
    if args.cmd == "quality":
        from overlay_manager.lab.probe.quality import quality
        _out(quality(rospy, args))
        return 0
    if args.cmd == "topics":
        return _topics(rospy, args.wait_for, args.timeout)
    return 2


def _topics(rospy: Any, wanted: List[str], timeout: float) -> int:
    """The master's published topics ({name: type}) once every ``wanted`` topic is among them, or
    after ``timeout`` s (then ``missing`` lists the others; not a failure: callers ask whether a
    stream exists)."""
    deadline = time.monotonic() + timeout
    while True:
        topics = dict(rospy.get_published_topics())
        missing = [t for t in wanted if t not in topics]
        if not missing or time.monotonic() >= deadline:
            _out({"ok": True, "topics": topics, "missing": missing})
            return 0
        time.sleep(0.5)
def _pid(node: str, timeout: float) -> int:
    """The node's pid from its slave API (getPid), through the master's lookupNode; no rospy node
    is started, so the probe itself adds nothing to the graph."""
    import xmlrpc.client

    import rosgraph
    master = rosgraph.Master("/lab_probe_pid")
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            uri = master.lookupNode(node)
            code, msg, pid = xmlrpc.client.ServerProxy(uri).getPid("/lab_probe_pid")
            if code == 1:
                _out({"ok": True, "pid": int(pid), "uri": uri})
                return 0
            last = msg
        except (OSError, rosgraph.MasterException, xmlrpc.client.Error) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            return _fail(f"node {node} to answer getPid", last)
        time.sleep(0.3)


def _nodes(rospy: Any, spec: Dict[str, Any], timeout: float) -> int:
    """ping_peer on each (node, peer), then wait until every node's ~peers lists each expected
    peer on the expected path ("*" = any path)."""
    ping_srv = load_type("overlay_manager/PingPeer", "srv")
    peer_list = load_type("overlay_manager/PeerList")
    deadline = time.monotonic() + timeout
    pings = []
    for node, peer in spec.get("ping", []):
        try:
            rospy.wait_for_service(f"{node}/ping_peer", timeout=max(0.1, deadline - time.monotonic()))
        except rospy.ROSException:
            return _fail(f"service {node}/ping_peer")
        resp = rospy.ServiceProxy(f"{node}/ping_peer", ping_srv)(name=peer, count=int(spec.get("ping_count", 3)),
                                                                  timeout=3.0)
        pings.append({"node": node, "peer": peer, **to_dict(resp)})
    want: Dict[str, Dict[str, str]] = spec.get("peers", {})
    latest: Dict[str, Any] = {}
    cond = threading.Condition()

    def make_cb(node: str) -> Any:
        def cb(msg: Any) -> None:
            with cond:
                latest[node] = to_dict(msg)
                cond.notify_all()
        return cb

    subs = [rospy.Subscriber(f"{node}/peers", peer_list, make_cb(node)) for node in want]

    def unmet() -> List[str]:
        out = []
        for node, peers in want.items():
            m = latest.get(node)
            if m is None:
                out.append(f"{node}: no ~peers yet")
                continue
            got = {p["name"]: p for p in m["peers"]}
            for name, path in peers.items():
                if name not in got:
                    out.append(f"{node}: {name} not listed (lists {sorted(got)})")
                elif path != "*" and got[name]["path"] != path:
                    out.append(f"{node}: {name} path {got[name]['path']}, want {path}")
        return out

    with cond:
        while True:
            missing = unmet()
            if not missing:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                if spec.get("lenient"):  # the caller judges each condition itself
                    break
                for s in subs:
                    s.unregister()
                return _fail("~peers of " + ", ".join(want), "; ".join(missing) + " | pings: " + json.dumps(pings))
            cond.wait(min(left, 0.5))
    for s in subs:
        s.unregister()
    _out({"ok": True, "pings": pings, "peers": latest, "unmet": missing})
    return 0


def control_round_trip(rospy: Any, out_topic: str, echo_topic: str, rate_hz: float, seconds: float,
                       timeout: float, samples: bool = False) -> Optional[Dict[str, Any]]:
    """The Twist round trip through an echo (rosnodes.py ``echo``), measured for ``seconds``.

    Publishes geometry_msgs/Twist at ``rate_hz`` on ``out_topic`` (linear.x = sequence number,
    linear.y = send time, CLOCK_MONOTONIC) and matches each echo on ``echo_topic``. Warm-up: send
    until the first echo returns (at most ``timeout`` s; None if none does), then 1 s more; echoes
    up to 1 s after the window still count. Returns ``sent``, ``received``, ``rate_hz``,
    ``seconds``, ``rtt_p50_ms``/``rtt_p99_ms``/``rtt_max_ms`` (stats.latency_stats),
    ``rtt_min_ms`` and the window ``t_start``/``t_end`` (CLOCK_MONOTONIC s); with ``samples``
    also ``samples``: [send time (CLOCK_MONOTONIC s), round trip ms or None if no echo came] per
    Twist sent in the window, so that a caller can take the statistics of another window (e.g.
    the one in which a viewer measured its streams: ``core.stats.window_stats``).
    """
    from geometry_msgs.msg import Twist

    sent: Dict[int, float] = {}
    rtts: List[float] = []
    window: Dict[int, List[Any]] = {}  # seq -> [send time, round trip ms or None], sent in the window
    measuring = threading.Event()
    first = threading.Event()

    arrivals: List[float] = []

    def cb(msg: Any) -> None:
        now = time.monotonic()
        first.set()
        seq = int(msg.linear.x)
        t0 = sent.pop(seq, None)
        if t0 is not None and measuring.is_set():
            rtts.append((now - t0) * 1000.0)
            if seq in window:
                window[seq][1] = round(rtts[-1], 2)
            arrivals.append(now)

    pub = rospy.Publisher(out_topic, Twist, queue_size=100, tcp_nodelay=True)
    sub = rospy.Subscriber(echo_topic, Twist, cb, queue_size=100, tcp_nodelay=True)
    period = 1.0 / rate_hz
    seq = 0

    def send_for(duration: float, stop: Optional[threading.Event] = None) -> int:
        nonlocal seq
        n = 0
        nxt = time.monotonic()
        end = nxt + duration
        while time.monotonic() < end and not (stop is not None and stop.is_set()):
            seq += 1
            msg = Twist()
            msg.linear.x = float(seq)
            now = time.monotonic()
            msg.linear.y = now
            sent[seq] = now
            if measuring.is_set():
                window[seq] = [round(now, 4), None]
            pub.publish(msg)
            n += 1
            nxt += period
            time.sleep(max(0.0, nxt - time.monotonic()))
        return n

    try:
        send_for(timeout, stop=first)  # warm up until the first echo comes back (connections made)
        if not first.is_set():
            return None
        send_for(1.0)
        sent.clear()
        conns_start = connection_ids(rospy, (out_topic, echo_topic))
        measuring.set()
        t_start = time.monotonic()
        n = send_for(seconds)
        t_end = time.monotonic()
        time.sleep(1.0)  # late echoes
        measuring.clear()
        conns_end = connection_ids(rospy, (out_topic, echo_topic))
    finally:
        sub.unregister()
        pub.unregister()
    edges = [t_start] + arrivals + [t_end]
    gaps = [(a, b - a) for a, b in zip(edges, edges[1:]) if b - a >= GAP_REPORT_S]
    return {"sent": n, "received": len(rtts), "rate_hz": rate_hz, "seconds": seconds,
            **latency_stats(rtts, "rtt"), "rtt_min_ms": min(rtts) if rtts else None,
            "t_start": t_start, "t_end": t_end,
            "echo_gaps": [[round(a, 3), round(g, 3)] for a, g in gaps],
            "echo_max_gap_s": round(max((b - a for a, b in zip(edges, edges[1:])), default=0.0), 3),
            "connections_start": conns_start, "connections_end": conns_end,
            **({"samples": list(window.values())} if samples else {})}


GAP_REPORT_S = 0.1
"""Gaps between echoes at least this long are listed (start CLOCK_MONOTONIC s, length s): five
periods of the 50 Hz round trip."""


def connection_ids(rospy: Any, topics: Any) -> List[List[Any]]:
    """This process's ROS connections on ``topics``: [connection id, topic, direction, the other
    end's caller id or URI], sorted. rospy numbers every new connection, so the same list before
    and after an event means no connection was re-established."""
    from rospy.impl.registration import get_topic_manager

    out = []
    for info in get_topic_manager().get_pub_sub_info():
        conn_id, dest, direction, _transport, topic = info[:5]
        if topic in topics:
            out.append([conn_id, topic, direction, str(dest)])
    return sorted(out)


def _control(rospy: Any, args: Any) -> int:
    """``probe control``: :func:`control_round_trip` with the command line's topics and rate."""
    res = control_round_trip(rospy, args.out, args.echo, args.rate, args.seconds, args.timeout,
                             samples=getattr(args, "samples", False))
    if res is None:
        return _fail(f"the first echo on {args.echo} of Twist sent on {args.out}")
    _out({"ok": True, **res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
