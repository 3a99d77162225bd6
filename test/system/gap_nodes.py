#!/usr/bin/python3
"""Two small ROS nodes for gap measurements (run inside a lab host's namespace, by hand or from a
launch file as ``pkg="overlay_manager" type="gap_nodes.py"``; roslaunch's own arguments such as
``__name:=`` are dropped).

    python3 gap_nodes.py pub TOPIC RATE_HZ        publish std_msgs/Header with seq 1, 2, ... at RATE_HZ
    python3 gap_nodes.py sub TOPIC OUT_FILE       append "<monotonic s> <seq>" per message to OUT_FILE

Arrival times are CLOCK_MONOTONIC seconds, the same clock in every network namespace and in the
test process (time.monotonic()). Both run until SIGTERM/SIGINT.
"""
from __future__ import annotations

import sys
import time


def main(argv: list) -> int:
    """Run the publisher or the subscriber named by argv[0] (see module doc)."""
    import rospy
    from std_msgs.msg import Header
    argv = rospy.myargv(["gap_nodes"] + list(argv))[1:]
    mode, topic = argv[0], argv[1]
    rospy.init_node(f"gap_{mode}", anonymous=True)
    if mode == "pub":
        pub = rospy.Publisher(topic, Header, queue_size=100, tcp_nodelay=True)
        rate = rospy.Rate(float(argv[2]))
        seq = 0
        while not rospy.is_shutdown():
            seq += 1
            pub.publish(Header(seq=seq, stamp=rospy.Time.now()))
            rate.sleep()
        return 0
    fh = open(argv[2], "a", buffering=1, encoding="ascii")

    def cb(msg: Header) -> None:
        fh.write(f"{time.monotonic():.6f} {msg.seq}\n")

    rospy.Subscriber(topic, Header, cb, queue_size=1000, tcp_nodelay=True)
    rospy.spin()
    fh.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(0)
