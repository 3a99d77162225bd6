#!/usr/bin/python3
"""rostest helper: a shaped stream's outside as the overlay node sees it.

``stream_state_talker.py TIER_TOPIC HZ`` publishes std_msgs/String (200 bytes) on TIER_TOPIC at HZ
and, every 0.5 s, a latched overlay_manager/StreamState on TIER_TOPIC/stream_state with one entry
per node subscribed to TIER_TOPIC now (read from this publisher's own connections), as the topic
shaper does: tier "fitted", codec "zstd", budget 800 kbit/s, rate cap 2 Hz. A std_msgs/String on
``~control`` says "drop" (unadvertise the stream_state topic) or "advertise" (again). Runs until
roslaunch ends it.
"""
import math
import sys
import threading

import rospy
from std_msgs.msg import String

from overlay_manager.msg import StreamState, StreamSubscriber


def main() -> None:
    args = rospy.myargv(sys.argv)[1:]
    rospy.init_node("stream_state_talker", anonymous=False)
    topic, hz = args[0], float(args[1])
    out = rospy.Publisher(topic, String, queue_size=1)
    lock = threading.Lock()
    state_pub = [rospy.Publisher(topic + "/stream_state", StreamState, queue_size=1, latch=True)]

    def control(msg: String) -> None:
        # register and unregister outside the lock the publishing loop takes
        if msg.data == "drop":
            with lock:
                pub, state_pub[0] = state_pub[0], None
            if pub is not None:
                pub.unregister()
        elif msg.data == "advertise" and state_pub[0] is None:
            pub = rospy.Publisher(topic + "/stream_state", StreamState, queue_size=1, latch=True)
            with lock:
                state_pub[0] = pub

    rospy.Subscriber("~control", String, control)

    def state() -> StreamState:
        nodes = sorted({c.endpoint_id for c in out.impl.connections})
        return StreamState(
            topic=topic, tier="fitted", tier_topics=[topic], codec="zstd",
            format="std_msgs/String; zstd; 1.00:1", video_bitrate_kbps=math.nan, rate_hz=2.0,
            budget_kbps=800.0, limited_by="robota", reason="path derp",
            subscribers=[StreamSubscriber(node=n, host="robota", path="derp", budget_kbps=800.0,
                                          observed_cap_kbps=math.nan, queue_delay_ms=math.nan,
                                          tier="fitted", wanted_tier="fitted", codec="zstd",
                                          rate_hz=2.0, bitrate_kbps=3.2) for n in nodes])

    rate = rospy.Rate(hz)
    next_state = 0.0
    try:
        while not rospy.is_shutdown():
            out.publish(String(data="x" * 200))
            now = rospy.get_time()
            if now >= next_state:
                next_state = now + 0.5
                with lock:
                    if state_pub[0] is not None:
                        state_pub[0].publish(state())
            rate.sleep()
    except rospy.ROSInterruptException:  # roslaunch is ending us
        pass


if __name__ == "__main__":
    main()
