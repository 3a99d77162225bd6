#!/usr/bin/python3
"""Test helper: record when ~status, ~peers and /diagnostics messages of one node arrive.

Usage: record_topics.py NODE OUT.jsonl
Writes one JSON object per message and flushes it at once; ``t`` is the wall-clock time of
arrival (time.time(), comparable with the test process on the same machine).
"""
import json
import math
import sys
import time

import rospy
from diagnostic_msgs.msg import DiagnosticArray

from overlay_manager.msg import OverlayStatus, PeerList


def main() -> None:
    args = rospy.myargv(sys.argv)[1:]
    node, out_path = args[0].rstrip("/"), args[1]
    out = open(out_path, "a", encoding="utf-8")

    def write(rec):
        rec["t"] = time.time()
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def on_status(m):
        write({"topic": "status", "stale": m.stale, "error": m.error, "faults": list(m.faults),
               "age": None if math.isnan(m.status_age) else m.status_age,
               "reachable": m.tailscaled_reachable})

    def on_peers(m):
        first = m.peers[0] if m.peers else None
        write({"topic": "peers", "stale": m.stale, "stamp": m.header.stamp.to_sec(),
               "path": first.path if first else "", "rx": first.rx_bytes if first else None,
               "tx": first.tx_bytes if first else None})

    def on_diag(m):
        for s in m.status:
            if s.name.endswith(": overlay"):
                write({"topic": "diag", "level": s.level, "message": s.message})

    rospy.init_node("record_topics", anonymous=True)
    rospy.Subscriber(node + "/status", OverlayStatus, on_status, queue_size=50)
    rospy.Subscriber(node + "/peers", PeerList, on_peers, queue_size=50)
    rospy.Subscriber("/diagnostics", DiagnosticArray, on_diag, queue_size=50)
    rospy.spin()


if __name__ == "__main__":
    main()
