#!/usr/bin/python3
"""rostest: the link_aware image_transport plugins beside another /compressed publisher (see
link_aware_transport.test).

This node is the overlay node's ~peers (/robot1/overlay_manager/peers: this host 127.0.0.2 is the peer
"laptop"), a raw-only camera on /rawcam/image_raw and the checks:
exactly one publisher per camera topic, the streams' tiers included (the master's getSystemState),
held over several of the republisher's checks; the viewer (image_transport republish with the
link_aware subscriber plugin, no parameter of its own) gets decoded frames from the driver's plugin:
on the full tier (<topic>/full) while its path is direct, and on the fitted tier (<topic>), whose
stream_state names the laptop and its path (the ~peers found from $OVERLAY_MANAGER_NS) and lowers
quality, once the path turns derp; the standalone republisher serves /rawcam/image_raw/link_aware
to a plain subscriber (which stays on the fitted tier, fitted to it) without a second /compressed
publisher and found ~peers through the master.
"""
import sys
import threading
import time
import unittest

import numpy as np
import rosgraph
import rospy
import rostest
from link_aware_common import peers_msg, wait_for
from sensor_msgs.msg import CompressedImage, Image

from overlay_manager.msg import Peer, PeerList, StreamState

CAM = "/camera/image_raw"
RAWCAM = "/rawcam/image_raw"
PEERS = "/robot1/overlay_manager/peers"
WIDTH, HEIGHT = 640, 480

# topic -> the one node that must publish it (tiers are on by default: <stream>/full and the directory)
EXPECTED = {
    CAM: "/camera_driver",
    CAM + "/compressed": "/compressed_standin",
    RAWCAM + "/compressed": "/compressed_standin",
}
for _cam, _node in ((CAM, "/camera_driver"), (RAWCAM, "/republisher")):
    for _stream in ("/link_aware", "/link_aware_h264"):
        for _suffix in ("", "/stream_state", "/full", "/full/stream_state", "/tiers"):
            EXPECTED[_cam + _stream + _suffix] = _node


def camera_publishers():
    """topic -> sorted publisher nodes, for every topic under /camera or /rawcam."""
    pubs, _subs, _srvs = rosgraph.Master(rospy.get_name()).getSystemState()
    return {t: sorted(nodes) for t, nodes in pubs if t.startswith((CAM, RAWCAM))}


class LinkAwareTransport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.peers_pub = rospy.Publisher(PEERS, PeerList, queue_size=1, latch=True)
        cls.peers_pub.publish(peers_msg(Peer.PATH_DIRECT))
        cls.lock = threading.Lock()
        cls.states = {}
        # key: the camera (its fitted tier, <camera>/link_aware) or <camera>/full (<camera>/link_aware/full)
        for key, stream in ((CAM, CAM + "/link_aware"), (RAWCAM, RAWCAM + "/link_aware"),
                            (CAM + "/full", CAM + "/link_aware/full")):
            rospy.Subscriber(stream + "/stream_state", StreamState, cls._on_state, callback_args=key)
        cls.cam_pub = rospy.Publisher(RAWCAM, Image, queue_size=2)
        cls.stop = threading.Event()
        cls.cam = threading.Thread(target=cls._camera, daemon=True)
        cls.cam.start()

    @classmethod
    def tearDownClass(cls):
        cls.stop.set()
        cls.cam.join(timeout=2)

    @classmethod
    def _on_state(cls, msg, topic):
        with cls.lock:
            cls.states[topic] = msg

    @classmethod
    def _camera(cls):
        rng = np.random.default_rng(3)
        frame = rng.integers(0, 255, size=(HEIGHT, WIDTH, 3), dtype=np.uint8)
        msg = Image(height=HEIGHT, width=WIDTH, encoding="rgb8", step=WIDTH * 3, data=frame.tobytes())
        while not cls.stop.is_set() and not rospy.is_shutdown():
            msg.header.stamp = rospy.Time.now()
            cls.cam_pub.publish(msg)
            time.sleep(1.0 / 15.0)

    def state(self, topic):
        with self.lock:
            return self.states.get(topic)

    def test_1_one_publisher_per_topic(self):
        expected = dict(EXPECTED, **{RAWCAM: rospy.get_name()})  # this node is the raw-only camera

        def as_expected():
            pubs = camera_publishers()
            return pubs if all(pubs.get(t) == [n] for t, n in expected.items()) else None

        wait_for(f"exactly these publishers: {expected}", as_expected)
        # hold it over several of the republisher's checks (check_period 1 s)
        t_end = time.monotonic() + 4.0
        while time.monotonic() < t_end:
            pubs = camera_publishers()
            for topic, nodes in pubs.items():
                self.assertEqual(len(nodes), 1, f"{topic} has {len(nodes)} publishers: {nodes}")
            for topic, node in expected.items():
                self.assertEqual(pubs.get(topic), [node], f"{topic}: {pubs.get(topic)}")
            time.sleep(0.25)

    def test_2_viewer_decodes_the_driver_plugin_stream(self):
        got = []
        sub = rospy.Subscriber("/viewer/image", Image, got.append, queue_size=5, buff_size=2**24)
        try:
            img = wait_for("a decoded frame from the link_aware subscriber plugin on /viewer/image",
                           lambda: got and got[-1], timeout=30)
            self.assertEqual((img.width, img.height, img.encoding, img.step), (WIDTH, HEIGHT, "rgb8", WIDTH * 3))
            self.assertEqual(img.header.frame_id, "camera")
            px = np.frombuffer(bytes(img.data), np.uint8).reshape(HEIGHT, WIDTH, 3)
            r, g, b = px[HEIGHT // 4, 40]
            self.assertTrue(r > 200 and g < 60 and b < 60, f"red block decoded as {(r, g, b)}")
            # the viewer's path is direct: it moved to the full tier by itself
            st = wait_for("the driver plugin's full tier with the laptop on direct",
                          lambda: self._with_path(CAM + "/full", Peer.PATH_DIRECT))
            self.assertEqual(st.peers_topic, PEERS, "the plugin did not take ~peers from $OVERLAY_MANAGER_NS")
            self.assertEqual(st.topic, CAM + "/link_aware/full")
            self.assertEqual(st.format, "rgb8; jpeg compressed bgr8")
            self.assertEqual(st.quality, 90)
            self.assertEqual([(x.node, x.tier) for x in st.subscribers], [("/viewer", "full")])
            self.peers_pub.publish(peers_msg(Peer.PATH_DERP))
            # on derp it moves to the fitted tier, which lowers quality for it
            st = wait_for("the driver plugin's fitted tier lowering quality for the laptop on derp",
                          lambda: self._with_path(CAM, Peer.PATH_DERP, lambda s: s.quality < 90), timeout=20)
            self.assertEqual(st.topic, CAM + "/link_aware")
            self.assertEqual([(x.node, x.tier, x.wanted_tier) for x in st.subscribers],
                             [("/viewer", "fitted", "fitted")])
            self.assertEqual((st.limited_by, st.reason), ("laptop", "path derp"))
            self.assertAlmostEqual(st.budget_kbps, 4000.0)
            n = len(got)
            wait_for("frames still arriving on derp", lambda: len(got) > n + 5)
            wait_for("the full tier without subscribers once the viewer left it",
                     lambda: (lambda s: s and not s.subscribers and s.reason == "no subscribers")(
                         self.state(CAM + "/full")))
        finally:
            self.peers_pub.publish(peers_msg(Peer.PATH_DIRECT))
            sub.unregister()

    def test_3_republisher_serves_a_raw_camera_without_a_second_compressed(self):
        got = []
        sub = rospy.Subscriber(RAWCAM + "/link_aware", CompressedImage, got.append, queue_size=5, buff_size=2**24)
        try:
            m = wait_for(f"a frame on {RAWCAM}/link_aware", lambda: got and got[-1], timeout=30)
            self.assertEqual(m.format, "rgb8; jpeg compressed bgr8")
            st = wait_for("the republisher's stream_state with the laptop",
                          lambda: self._with_path(RAWCAM, Peer.PATH_DIRECT))
            self.assertEqual(st.peers_topic, PEERS, "the republisher did not find ~peers through the master")
            self.assertEqual(list(st.other_topics), [], "it still says it publishes /compressed")
            self.assertTrue(st.input_subscribed)
            self.assertEqual(camera_publishers()[RAWCAM + "/compressed"], ["/compressed_standin"])
        finally:
            sub.unregister()

    def _with_path(self, topic, path, extra=lambda s: True):
        s = self.state(topic)
        if s and s.subscribers and all(x.path == path for x in s.subscribers) and extra(s):
            return s
        return None


if __name__ == "__main__":
    rospy.init_node("link_aware_transport_check")
    rostest.rosrun("overlay_manager", "link_aware_transport", LinkAwareTransport, sys.argv)
