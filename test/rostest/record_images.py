#!/usr/bin/python3
"""Test helper: record what arrives on sensor_msgs/Image topics (the viewers' outputs).

Usage: record_images.py OUT.jsonl TOPIC [TOPIC ...]
Writes one JSON object per message and flushes it at once: topic, header frame_id and seq, width,
height, step, encoding, the data's length, ``px``: the first three bytes of the pixel at
(x = min(40, width - 1), y = height // 4) when the data holds it (inside the test driver's red
block), in the message's channel order, and ``px_last``: the same of the row's last pixel (the
bright end of the driver's grey gradient). ``t`` is time.time() at arrival.
"""
import json
import sys
import threading
import time

import rospy
from sensor_msgs.msg import Image

RED_X = 40


def main() -> None:
    args = rospy.myargv(sys.argv)[1:]
    out = open(args[0], "a", encoding="utf-8")
    lock = threading.Lock()

    def on_image(msg: Image, topic: str) -> None:
        rec = {"topic": topic, "frame_id": msg.header.frame_id, "seq": msg.header.seq, "w": msg.width,
               "h": msg.height, "step": msg.step, "encoding": msg.encoding, "len": len(msg.data), "t": time.time()}
        y = msg.height // 4
        for key, x in (("px", min(RED_X, max(msg.width, 1) - 1)), ("px_last", max(msg.width, 1) - 1)):
            at = y * msg.step + 3 * x
            if msg.step >= 3 * msg.width and len(msg.data) >= at + 3:
                rec[key] = list(bytearray(msg.data[at:at + 3]))
        with lock:
            out.write(json.dumps(rec) + "\n")
            out.flush()

    rospy.init_node("record_images", anonymous=True)
    for topic in args[1:]:
        rospy.Subscriber(topic, Image, on_image, callback_args=topic, queue_size=2, buff_size=1 << 25)
    rospy.spin()


if __name__ == "__main__":
    main()
