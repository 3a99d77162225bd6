"""ROS client probes run *inside* a lab host's namespace (python3 -m overlay_manager.lab.probe ...).

The test process lives in the host's root namespace and cannot reach overlay addresses, so system
tests, the demo and the benchmark run these small ROS clients in a lab host and read one JSON
document from stdout. Every probe waits with a bounded timeout and says what it waited for.

    probe peers [--node /overlay_manager] [--min-peers N] [--timeout S]      -> PeerList
    probe status [--node ...] [--timeout S] [--where 'python expr']          -> OverlayStatus
    probe call SERVICE TYPE '{"field": value}' [--timeout S]                 -> response
    probe rate TOPIC TYPE --seconds S                                         -> rate, gaps
    probe collect TOPIC TYPE --seconds S                                      -> messages
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import threading
import time
from typing import Any, Dict, List


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
    """'pkg/Name' -> the generated class (kind 'msg' or 'srv')."""
    pkg, _, typ = name.partition("/")
    return getattr(importlib.import_module(f"{pkg}.{kind}"), typ)


def _out(data: Any) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def _fail(what: str, detail: str = "") -> int:
    _out({"ok": False, "error": f"timed out waiting for {what}" + (f": {detail}" if detail else "")})
    return 1


def main(argv: List[str] | None = None) -> int:
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
    args = ap.parse_args(argv)

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
        msgs: List[Any] = []
        first = threading.Event()

        def rcb(msg: Any) -> None:
            stamps.append(time.monotonic())
            if args.cmd == "collect":
                msgs.append(to_dict(msg))
            first.set()

        rospy.Subscriber(args.topic, typ, rcb, queue_size=100, buff_size=2 ** 24)
        if args.cmd == "rate" and not first.wait(args.timeout):
            return _fail(f"first message on {args.topic}")
        start = time.monotonic()
        n0 = len(stamps)
        time.sleep(args.seconds)
        window = [t for t in stamps[n0:] if t >= start]
        gaps = [b - a for a, b in zip(window, window[1:])]
        _out({"ok": True, "count": len(window), "seconds": args.seconds,
              "rate_hz": len(window) / args.seconds, "max_gap_s": max(gaps) if gaps else None,
              "msgs": msgs})
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
