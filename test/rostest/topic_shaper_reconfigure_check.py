#!/usr/bin/python3
"""rostest: a shaped topic's settings changed live (see topic_shaper_reconfigure.test).

This node publishes a laser scan (20 Hz) and the overlay node's ~peers (this host 127.0.0.2 is the
peer "laptop" on a derp path) and subscribes to the shaped scan, so the shaper has a subscriber on a
budgeted path. It changes the topic's budget and max_rate with dynamic_reconfigure's client and with
`rosrun dynamic_reconfigure dynparam set` (as docs/shaping.md gives it), and checks that stream_state
follows; an invalid value (an unknown lossy mode, a pacing_factor between 0 and 1) is refused and the
old one kept, on the server and on the parameter server.
"""
import subprocess
import sys
import threading
import time
import unittest

import dynamic_reconfigure.client
import numpy as np
import rospy
import rostest
from link_aware_common import Background, peers_msg, wait_for
from sensor_msgs.msg import LaserScan

from overlay_manager.msg import Peer, PeerList, ShapedMessage, StreamState

SERVER = "/shaper/scan"  # the scan's nodelet: <node>/<topic with '/' -> '_'>
STATE = "/scan/shaped/stream_state"


class TopicShaperReconfigure(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.lock = threading.Lock()
        cls.state = None
        cls.peers_pub = rospy.Publisher("/overlay_manager/peers", PeerList, queue_size=1, latch=True)
        cls.peers_pub.publish(peers_msg(Peer.PATH_DERP))
        cls.scan_pub = rospy.Publisher("/scan", LaserScan, queue_size=1)
        rospy.Subscriber(STATE, StreamState, cls._on_state)
        rospy.Subscriber("/scan/shaped", ShapedMessage, lambda _m: None, queue_size=1)
        cls.publisher = Background(cls._publish)
        cls.client = dynamic_reconfigure.client.Client(SERVER, timeout=30.0)

    @classmethod
    def tearDownClass(cls):
        cls.publisher.stop()

    @classmethod
    def _publish(cls, stopping):
        rng = np.random.default_rng(1)
        msg = LaserScan()
        msg.header.frame_id = "robot1/laser"
        msg.angle_min, msg.angle_max, msg.angle_increment = -3.14, 3.14, 6.28 / 720
        msg.range_min, msg.range_max = 0.1, 30.0
        msg.ranges = rng.uniform(0.5, 10.0, 720).astype(np.float32).tolist()
        while not stopping.is_set() and not rospy.is_shutdown():
            msg.header.stamp = rospy.Time.now()
            cls.scan_pub.publish(msg)
            time.sleep(0.05)

    @classmethod
    def _on_state(cls, msg):
        with cls.lock:
            cls.state = msg

    def latest(self):
        with self.lock:
            return self.state

    def wait_state(self, what, predicate, timeout=15.0):
        """The newest stream_state once `predicate` holds for it; on timeout the message names the last one."""
        def check():
            st = self.latest()
            return st if st is not None and predicate(st) else None
        try:
            return wait_for(what, check, timeout=timeout)
        except AssertionError as e:
            st = self.latest()
            raise AssertionError(f"{e}; last {STATE}: budget_kbps {st and st.budget_kbps}, rate_hz "
                                 f"{st and st.rate_hz}, reason '{st and st.reason}', codec_state "
                                 f"{st and [(v.key, v.value) for v in st.codec_state]}") from None

    def laptop_on_derp(self, st):
        return any(s.host == "laptop" and s.path == Peer.PATH_DERP for s in st.subscribers)

    def test_1_budget_and_rate_change_live(self):
        self.wait_state("the laptop on derp with the launch file's budget 2000 kbit/s and max_rate 10 Hz",
                        lambda st: self.laptop_on_derp(st) and st.budget_kbps == 2000.0 and st.rate_hz == 10.0,
                        timeout=30.0)
        config = self.client.get_configuration(timeout=10.0)
        self.assertEqual(config["budget_kbps_derp"], 2000.0, "the server starts with the settings read at start")
        self.assertEqual(config["max_rate"], 10.0)
        t0 = time.monotonic()
        config = self.client.update_configuration({"budget_kbps_derp": 500.0, "max_rate": 4.0})
        self.assertEqual((config["budget_kbps_derp"], config["max_rate"]), (500.0, 4.0))
        self.wait_state("budget 500 kbit/s and rate cap 4 Hz after the change",
                        lambda st: self.laptop_on_derp(st) and st.budget_kbps == 500.0 and st.rate_hz == 4.0)
        print(f"[topic_shaper_reconfigure] stream_state followed in {time.monotonic() - t0:.2f} s",
              file=sys.stderr)
        # docs/shaping.md's command, as it runs
        subprocess.run(["rosrun", "dynamic_reconfigure", "dynparam", "set", SERVER, "budget_kbps_derp", "1500"],
                       check=True, timeout=30.0)
        self.wait_state("budget 1500 kbit/s after dynparam set",
                        lambda st: st.budget_kbps == 1500.0 and st.rate_hz == 4.0)
        self.assertEqual(rospy.get_param(SERVER + "/budget_kbps_derp"), 1500.0)
        # a frame-thread setting: what stream_state says the topic may lose follows too
        self.client.update_configuration({"lossy": "voxel"})
        self.wait_state("lossy_allowed voxel", lambda st: ("lossy_allowed", "voxel") in
                        [(v.key, v.value) for v in st.codec_state])

    def test_2_an_invalid_value_is_refused_and_the_old_one_kept(self):
        before = self.client.get_configuration(timeout=10.0)
        config = self.client.update_configuration({"lossy": "cube"})
        self.assertEqual(config["lossy"], before["lossy"], "an unknown lossy mode is refused")
        self.assertEqual(rospy.get_param(SERVER + "/lossy"), before["lossy"])
        config = self.client.update_configuration({"pacing_factor": 0.5, "budget_kbps_derp": 700.0})
        self.assertEqual(config["pacing_factor"], before["pacing_factor"], "a pacing_factor in (0, 1) is refused")
        self.assertEqual(config["budget_kbps_derp"], before["budget_kbps_derp"],
                         "a refused request changes nothing, not even its valid values")
        self.assertEqual(rospy.get_param(SERVER + "/pacing_factor"), before["pacing_factor"])
        # the stream keeps the old budget: still the old one two state periods later
        time.sleep(1.0)
        st = self.wait_state("stream_state with the old budget",
                             lambda st: st.budget_kbps == before["budget_kbps_derp"])
        self.assertEqual(st.rate_hz, before["max_rate"])


if __name__ == "__main__":
    rospy.init_node("topic_shaper_reconfigure_check")
    rostest.rosrun("overlay_manager", "topic_shaper_reconfigure", TopicShaperReconfigure, sys.argv)
