#!/usr/bin/python3
"""Test helper: wait for a /diagnostics status whose name contains NAME and whose message
contains TEXT; print it as JSON and exit 0, or exit 1 after TIMEOUT seconds.
Usage: wait_diag.py NAME TEXT TIMEOUT"""
import json
import sys
import threading

import rospy
from diagnostic_msgs.msg import DiagnosticArray


def main() -> int:
    name, text, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    found = threading.Event()
    seen = []

    def cb(msg: DiagnosticArray) -> None:
        for s in msg.status:
            if name in s.name:
                seen[:] = [f"{s.level} {s.message}"]
                if text in s.message and not found.is_set():
                    print(json.dumps({"name": s.name, "level": s.level, "message": s.message,
                                      "values": {v.key: v.value for v in s.values}}), flush=True)
                    found.set()

    rospy.init_node("wait_diag", anonymous=True, disable_signals=True)
    rospy.Subscriber("/diagnostics", DiagnosticArray, cb, queue_size=20)
    if found.wait(timeout):
        return 0
    print(f"no /diagnostics status named *{name}* with {text!r} within {timeout} s; last: {seen}",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
