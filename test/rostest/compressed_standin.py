#!/usr/bin/python3
"""rostest helper: stands in for compressed_image_transport (not packaged in Debian) in a camera
driver's place: ``compressed_standin.py TOPIC...`` advertises each TOPIC/compressed
(sensor_msgs/CompressedImage) and publishes a small JPEG on it once a second, as another node that
already serves <image>/compressed. Runs until roslaunch ends it."""
import sys

import cv2
import numpy as np
import rospy
from sensor_msgs.msg import CompressedImage


def main() -> None:
    topics = rospy.myargv(sys.argv)[1:]
    rospy.init_node("compressed_standin")
    pubs = [rospy.Publisher(t + "/compressed", CompressedImage, queue_size=1) for t in topics]
    ok, jpeg = cv2.imencode(".jpg", np.zeros((48, 64, 3), np.uint8))
    msg = CompressedImage(format="bgr8; jpeg compressed bgr8", data=jpeg.tobytes())
    try:
        while not rospy.is_shutdown():
            msg.header.stamp = rospy.Time.now()
            for p in pubs:
                p.publish(msg)
            rospy.sleep(1.0)
    except rospy.ROSInterruptException:  # roslaunch is ending us
        pass


if __name__ == "__main__":
    main()
