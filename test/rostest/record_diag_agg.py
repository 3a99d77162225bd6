#!/usr/bin/python3
"""Test helper: append every /diagnostics_agg status of the overlay analyzers to a JSON-lines
file: {"t": wall time, "name": ..., "level": ..., "message": ...}. Usage: record_diag_agg.py OUT."""
import json
import sys
import time

import rospy
from diagnostic_msgs.msg import DiagnosticArray


def main() -> None:
    out = open(sys.argv[1], "a", buffering=1, encoding="utf-8")

    def cb(msg: DiagnosticArray) -> None:
        now = time.time()
        for s in msg.status:
            if s.name.startswith("/Overlay"):
                out.write(json.dumps({"t": now, "name": s.name, "level": s.level, "message": s.message}) + "\n")

    rospy.init_node("record_diag_agg", anonymous=True)
    rospy.Subscriber("/diagnostics_agg", DiagnosticArray, cb, queue_size=20)
    rospy.spin()


if __name__ == "__main__":
    main()
