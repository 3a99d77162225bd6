#!/usr/bin/python3
"""rostest helper: ``topic_pair.py talk TOPIC HZ`` publishes std_msgs/String (200 bytes) at HZ;
``topic_pair.py listen TOPIC...`` subscribes to each TOPIC. Runs until roslaunch ends it."""
import sys

import rospy
from std_msgs.msg import String


def main() -> None:
    args = rospy.myargv(sys.argv)[1:]
    rospy.init_node("topic_pair", anonymous=False)
    if args[0] == "talk":
        pub = rospy.Publisher(args[1], String, queue_size=10)
        rate = rospy.Rate(float(args[2]))
        try:
            while not rospy.is_shutdown():
                pub.publish(String(data="x" * 200))
                rate.sleep()
        except rospy.ROSInterruptException:  # roslaunch is ending us
            pass
    else:
        subs = [rospy.Subscriber(t, String, lambda _m: None) for t in args[1:]]
        rospy.spin()
        del subs


if __name__ == "__main__":
    main()
