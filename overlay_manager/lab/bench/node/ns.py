"""The node benchmark's helpers that run inside a namespace, as child processes.

Started as ``python3 -m overlay_manager.lab.bench.node.main _<helper> ...`` (bench_node.main dispatches
the names in HELPERS here). The watchers and ``_wait-links`` print JSON lines on stdout, one per
event, stamped with time.time(); the parent reads them (bench_node_path.LineWatcher) or takes the
last line. ``_talk`` and ``_listen`` only publish and subscribe.

| helper | what it does |
|---|---|
| ``_watch-status SOCKET PEER [--hz HZ]`` | the peer's path in tailscaled's LocalAPI status, on every change |
| ``_watch-changes TOPIC`` | every overlay_manager/PathChange on TOPIC with its arrival time |
| ``_talk TOPIC HZ`` | a robot's stream: std_msgs/String on TOPIC |
| ``_listen TOPIC...`` | the operator's subscribers |
| ``_wait-links NODE N TIMEOUT`` | waits for N cross-machine links in NODE's ~get_topic_links |
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence


def _emit(obj: Dict[str, Any]) -> None:
    """One JSON line on stdout, flushed (the parent reads it at once)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def watch_status(socket_path: str, peer: str, hz: float) -> int:
    """Print {"t", "path", "cur_addr"} whenever the peer's path in tailscaled's status changes.

    ``t`` is the midpoint of the LocalAPI request (time.time()). Runs until killed.
    """
    from overlay_manager.core.peers import parse_status
    from overlay_manager.tailscaled.localapi import LocalAPI, TailscaleError

    api = LocalAPI(socket_path, timeout=2.0)
    period = 1.0 / hz
    last: Optional[str] = None
    n = 0
    _emit({"ready": True, "t": time.time()})
    while True:
        t0 = time.time()
        try:
            raw = api.status()
            t1 = time.time()
            snap = parse_status(raw)
            p = snap.find(peer)
            path = p.path if p else "absent"
            cur = ""
            for v in (raw.get("Peer") or {}).values():
                if v.get("HostName") == peer:
                    cur = v.get("CurAddr") or ""
        except TailscaleError as exc:
            t1, path, cur = time.time(), "error", str(exc)[:200]
        n += 1
        if path != last:
            _emit({"t": (t0 + t1) / 2, "req_s": t1 - t0, "path": path, "cur_addr": cur, "polls": n})
            last = path
        time.sleep(max(0.0, period - (time.time() - t0)))


def watch_changes(topic: str) -> int:
    """Print every PathChange on topic with its arrival time (time.time()). Runs until killed."""
    import rospy

    from overlay_manager.msg import PathChange

    rospy.init_node("bench_path_changes", anonymous=True, disable_signals=True)

    def cb(m: PathChange) -> None:
        _emit({"t": time.time(), "stamp": m.header.stamp.to_sec(), "peer": m.peer,
               "old_path": m.old_path, "new_path": m.new_path, "endpoint": m.endpoint})

    sub = rospy.Subscriber(topic, PathChange, cb, queue_size=100)
    deadline = time.monotonic() + 60
    while sub.get_num_connections() == 0:
        if time.monotonic() > deadline:
            _emit({"ready": False, "error": f"no publisher of {topic} connected within 60 s"})
            return 1
        time.sleep(0.05)
    _emit({"ready": True, "t": time.time()})
    while True:
        time.sleep(1.0)


def topic_talk(topic: str, hz: float) -> int:
    """Publish std_msgs/String (200 bytes) on topic at hz until killed (a robot's stream)."""
    import rospy
    from std_msgs.msg import String

    rospy.init_node("bench_talker", anonymous=True)  # rospy's SIGINT handler ends the loop
    pub = rospy.Publisher(topic, String, queue_size=10)
    while not rospy.is_shutdown():
        pub.publish(String(data="x" * 200))
        time.sleep(1.0 / hz)
    return 0


def topic_listen(topics: Sequence[str]) -> int:
    """Subscribe to every topic until killed (the operator's machine)."""
    import rospy
    from std_msgs.msg import String

    rospy.init_node("bench_listener", anonymous=True)  # rospy's SIGINT handler ends the loop
    subs = [rospy.Subscriber(t, String, lambda _m: None, queue_size=1) for t in topics]
    while subs and not rospy.is_shutdown():
        time.sleep(0.2)
    return 0


def topic_drain(topics: Sequence[str]) -> int:
    """Subscribe to every topic, whatever its type, without decoding, until killed (a dashboard
    or a diagnostic aggregator as the node sees it: every message is serialized and sent)."""
    import rospy

    rospy.init_node("bench_drain", anonymous=True)
    subs = [rospy.Subscriber(t, rospy.AnyMsg, lambda _m: None, queue_size=1) for t in topics]
    while subs and not rospy.is_shutdown():
        time.sleep(0.2)
    return 0


def wait_links(node: str, n: int, timeout: float) -> int:
    """Print {"ok", "links"} once node's ~get_topic_links lists n cross-machine links (or on timeout)."""
    import rospy

    from overlay_manager.msg import TopicLink
    from overlay_manager.srv import GetTopicLinks

    rospy.init_node("bench_wait_links", anonymous=True, disable_signals=True)
    deadline = time.monotonic() + timeout
    links: List[TopicLink] = []
    while time.monotonic() < deadline:
        try:
            rospy.wait_for_service(f"{node}/get_topic_links", timeout=max(0.1, deadline - time.monotonic()))
            links = list(rospy.ServiceProxy(f"{node}/get_topic_links", GetTopicLinks)().links)
        except (rospy.ROSException, rospy.ServiceException, OSError):
            links = []
        if len(links) >= n:
            break
        time.sleep(0.5)
    _emit({"ok": len(links) >= n, "links": [[x.topic, x.publisher_host, x.subscriber_host, x.path]
                                             for x in links]})
    return 0 if len(links) >= n else 1


def _watch_status_main(argv: Sequence[str]) -> int:
    """``_watch-status SOCKET PEER [--hz HZ]``: parse the arguments, run watch_status."""
    ap = argparse.ArgumentParser(prog="bench_node _watch-status")
    ap.add_argument("socket")
    ap.add_argument("peer")
    ap.add_argument("--hz", type=float, default=50.0)
    a = ap.parse_args(argv)
    return watch_status(a.socket, a.peer, a.hz)


HELPERS: Dict[str, Callable[[List[str]], int]] = {
    "_watch-status": _watch_status_main,
    "_watch-changes": lambda args: watch_changes(args[0]),
    "_talk": lambda args: topic_talk(args[0], float(args[1])),
    "_listen": lambda args: topic_listen(args),
    "_drain": lambda args: topic_drain(args),
    "_wait-links": lambda args: wait_links(args[0], int(args[1]), float(args[2])),
}
