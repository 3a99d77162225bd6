#!/usr/bin/python3
"""rostest: the link-aware encoder and the decoder, run for real (see link_aware_camera.test).

This node is the camera (640x480 rgb8, 30 Hz, noisy so JPEG frames are large), the overlay node's
~peers (a fake PeerList: this host 127.0.0.2 is the peer "alpha-laptop": a host name
shown as is, never turned into a ROS name) and the viewer. It checks:
no raw subscription without subscribers; real JPEG in compressed_image_transport's format that
decodes (OpenCV, as the stock plugin's fallback does) to the original size and colours; the
decoder's raw output; quality and rate dropping when the laptop's path turns derp and coming back
when it is direct again; the raw subscription ending with the last subscriber.
"""
import functools
import math
import sys
import threading
import time
import unittest

import cv2
import dynamic_reconfigure.client
import numpy as np
import rospy
import rostest
from link_aware_common import peers_msg as _peers_msg
from link_aware_common import wait_for
from sensor_msgs.msg import CompressedImage, Image

from overlay_manager.msg import Peer, PeerList, StreamState

peers_msg = functools.partial(_peers_msg, robot="alpha-robot1", laptop="alpha-laptop")
"""~peers of alpha-robot1 with alpha-laptop on a given path (hyphenated host names)."""

RAW = "/camera/image_raw"
RAW_PNG = "/camera_png/image_raw"  # the same frames, for the encoder with format png
OUT = RAW + "/compressed"
WIDTH, HEIGHT = 640, 480
BUDGET_DERP_KBPS = 4000.0  # link_aware_camera.test


def make_frame():
    """rgb8 test frame: a gradient with noise (large JPEGs) and a pure red block at the left."""
    rng = np.random.default_rng(7)
    x = np.linspace(0, 255, WIDTH, dtype=np.float32)
    img = np.stack([np.tile(x, (HEIGHT, 1))] * 3, axis=2)
    img += rng.uniform(-60, 60, size=img.shape)
    img = np.clip(img, 0, 255).astype(np.uint8)
    img[:, :80] = (255, 0, 0)
    return img


class LinkAwareCamera(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.frame = make_frame()
        cls.peers_pub = rospy.Publisher("/overlay_manager/peers", PeerList, queue_size=1, latch=True)
        cls.peers_pub.publish(peers_msg(Peer.PATH_DIRECT))
        cls.cam_pub = rospy.Publisher(RAW, Image, queue_size=2)
        cls.png_pub = rospy.Publisher(RAW_PNG, Image, queue_size=2)
        cls.lock = threading.Lock()
        cls.state = None
        rospy.Subscriber(RAW + "/link_aware/stream_state", StreamState, cls._on_state)
        cls.stop = threading.Event()
        cls.cam = threading.Thread(target=cls._camera, daemon=True)
        cls.cam.start()

    @classmethod
    def tearDownClass(cls):
        cls.stop.set()
        cls.cam.join(timeout=2)

    @classmethod
    def _on_state(cls, msg):
        with cls.lock:
            cls.state = msg

    @classmethod
    def _camera(cls):
        msg = Image(height=HEIGHT, width=WIDTH, encoding="rgb8", step=WIDTH * 3, data=cls.frame.tobytes())
        period = 1.0 / 30.0
        nxt = time.monotonic()
        while not cls.stop.is_set() and not rospy.is_shutdown():
            msg.header.seq += 1
            msg.header.stamp = rospy.Time.now()
            cls.cam_pub.publish(msg)
            cls.png_pub.publish(msg)
            nxt += period
            time.sleep(max(0.0, nxt - time.monotonic()))

    def latest_state(self):
        with self.lock:
            return self.state

    def receive(self, seconds, during=None):
        """Subscribe to the compressed output for `seconds`; returns the messages received and
        what during() returned while still subscribed."""
        got = []
        sub = rospy.Subscriber(OUT, CompressedImage, got.append, queue_size=100, buff_size=2**24)
        try:
            wait_for(f"a first frame on {OUT}", lambda: got, timeout=15)
            del got[:]
            time.sleep(seconds)
            msgs = list(got)
            return msgs, during() if during else None
        finally:
            sub.unregister()

    def set_path(self, path):
        self.peers_pub.publish(peers_msg(path))

    def test_1_no_raw_subscription_without_subscribers(self):
        time.sleep(1.5)  # the encoder is up (it publishes a latched state) and would have subscribed
        wait_for("the encoder's first stream_state", self.latest_state)
        self.assertEqual(self.cam_pub.get_num_connections(), 0, "raw topic subscribed with no viewer")
        self.assertFalse(self.latest_state().input_subscribed)

    def test_2_jpeg_decodes_to_original_and_direct_gets_full_stream(self):
        self.set_path(Peer.PATH_DIRECT)
        msgs, st = self.receive(3.0, lambda: wait_for("stream_state naming the laptop as direct",
                                                        lambda: self._state_with_path(Peer.PATH_DIRECT)))
        self.assertGreaterEqual(len(msgs) / 3.0, 20.0, "direct viewer should get about 30 Hz")
        m = msgs[-1]
        self.assertEqual(m.format, "rgb8; jpeg compressed bgr8")
        self.assertEqual(bytes(m.data[:2]), b"\xff\xd8")
        bgr = cv2.imdecode(np.frombuffer(bytes(m.data), np.uint8), cv2.IMREAD_COLOR)
        self.assertEqual(bgr.shape, (HEIGHT, WIDTH, 3))
        rgb = bgr[:, :, ::-1].astype(np.int16)
        self.assertLess(float(np.abs(rgb - self.frame.astype(np.int16)).mean()), 20.0)
        r, g, b = rgb[HEIGHT // 2, 40]
        self.assertTrue(r > 200 and g < 60 and b < 60, f"red block decoded as {(r, g, b)}")
        self.assertEqual(st.subscribers[0].host, "alpha-laptop")
        self.assertEqual(st.quality, 90)
        self.assertAlmostEqual(st.rate_hz, 30.0)
        self.assertNotEqual(st.reason, "")

    def test_3_decoder_gives_raw_back(self):
        got = []
        sub = rospy.Subscriber("/camera/image_decoded", Image, got.append, queue_size=5, buff_size=2**24)
        try:
            img = wait_for("a decoded raw frame on /camera/image_decoded", lambda: got and got[-1], timeout=15)
        finally:
            sub.unregister()
        self.assertEqual((img.width, img.height, img.encoding, img.step), (WIDTH, HEIGHT, "rgb8", WIDTH * 3))
        px = np.frombuffer(bytes(img.data), np.uint8).reshape(HEIGHT, WIDTH, 3)
        r, g, b = px[HEIGHT // 2, 40]
        self.assertTrue(r > 200 and g < 60 and b < 60, f"red block decoded as {(r, g, b)}")

    def test_3b_png_is_lossless(self):
        got, states = [], []
        state_sub = rospy.Subscriber(RAW_PNG + "/link_aware/stream_state", StreamState, states.append)
        sub = rospy.Subscriber(RAW_PNG + "/compressed", CompressedImage, got.append, queue_size=5, buff_size=2**24)
        try:
            m = wait_for(f"a frame on {RAW_PNG}/compressed", lambda: got and got[-1], timeout=15)
            st = wait_for("the png encoder's stream_state with a subscriber",
                          lambda: [s for s in states if s.subscribers])[-1]
        finally:
            sub.unregister()
            state_sub.unregister()
        self.assertEqual(m.format, "rgb8; png compressed bgr8")
        bgr = cv2.imdecode(np.frombuffer(bytes(m.data), np.uint8), cv2.IMREAD_UNCHANGED)
        self.assertEqual(bgr.shape, (HEIGHT, WIDTH, 3))
        self.assertTrue(np.array_equal(bgr[:, :, ::-1], self.frame), "PNG did not decode to the original pixels")
        # its peers_topic names an overlay node that does not run
        self.assertEqual((st.reason, st.peers_topic), ("no overlay node: paths unknown", ""))
        # a camera stream is not paced unless asked (pacing_factor 0 by default), even for a
        # subscriber whose path (unknown) has a budget
        self.assertTrue(all(math.isnan(s.pacing_kbps) for s in st.subscribers),
                        f"the png encoder (default pacing_factor) paced a subscriber: {st.subscribers}")

    def test_4_derp_lowers_quality_and_rate_then_direct_restores(self):
        got = []
        sub = rospy.Subscriber(OUT, CompressedImage, got.append, queue_size=100, buff_size=2**24)
        try:
            wait_for(f"frames on {OUT}", lambda: len(got) > 5)
            self.set_path(Peer.PATH_DERP)
            st = wait_for("stream_state: laptop on derp, quality and rate lowered",
                          lambda: self._state_with_path(Peer.PATH_DERP,
                                                        lambda s: s.quality < 90 and s.rate_hz < 30.0), timeout=20)
            self.assertEqual(st.limited_by, "alpha-laptop")
            self.assertEqual(st.reason, "path derp")
            self.assertAlmostEqual(st.budget_kbps, BUDGET_DERP_KBPS)
            self.assertEqual(st.subscribers[0].host, "alpha-laptop")
            # its connection is paced at the pacing_factor link_aware_camera.test sets (2.5) x its
            # budget, from the next delivery check on
            wait_for("stream_state: the derp viewer paced at 2.5 x its budget", lambda: self._state_with_path(
                Peer.PATH_DERP, lambda s: abs(s.subscribers[0].pacing_kbps - 2.5 * BUDGET_DERP_KBPS) < 1.0), timeout=5,
                detail=lambda: f"last stream_state: {self.latest_state()}")
            time.sleep(2.0)  # settle, then measure what actually arrives
            del got[:]
            t0 = time.monotonic()
            time.sleep(3.0)
            window = list(got)
            secs = time.monotonic() - t0
            kbps = sum(len(m.data) for m in window) * 8 / 1000.0 / secs
            rate = len(window) / secs
            self.assertLess(rate, 25.0, "derp viewer still gets the full rate")
            self.assertLess(kbps, BUDGET_DERP_KBPS * 1.25, f"{kbps:.0f} kbit/s over a {BUDGET_DERP_KBPS} budget")
            self.set_path(Peer.PATH_DIRECT)
            wait_for("stream_state back to quality 90 at 30 Hz on direct",
                     lambda: self._state_with_path(Peer.PATH_DIRECT, lambda s: s.quality == 90 and s.rate_hz == 30.0))
        finally:
            sub.unregister()

    def test_5_raw_unsubscribed_after_last_viewer(self):
        self.receive(0.5)
        wait_for("the encoder to drop its raw subscription", lambda: self.cam_pub.get_num_connections() == 0, 10)
        wait_for("stream_state with input_subscribed false and no subscribers",
                 lambda: (lambda s: s and not s.input_subscribed and not s.subscribers)(self.latest_state()))

    def _state_with_path(self, path, extra=lambda s: True):
        s = self.latest_state()
        if s and s.subscribers and all(x.path == path for x in s.subscribers) and extra(s):
            return s
        return None

    def test_6_republisher_streams_have_their_own_namespaces(self):
        """~max_rate (30) applies to both streams; ~link_aware_h264/max_rate (15) only to H.264; each
        stream's dynamic_reconfigure server shows what applies."""
        jpeg = dynamic_reconfigure.client.Client("/camera_encoder/link_aware", timeout=20).get_configuration(timeout=10)
        h264 = dynamic_reconfigure.client.Client("/camera_encoder/link_aware_h264",
                                                 timeout=20).get_configuration(timeout=10)
        self.assertEqual((jpeg["max_rate"], jpeg["budget_kbps_derp"], jpeg["max_quality"]), (30.0, 4000.0, 90))
        self.assertEqual(h264["max_rate"], 15.0)
        got = []
        sub = rospy.Subscriber(RAW + "/link_aware_h264/stream_state", StreamState, got.append)
        try:
            st = wait_for("the H.264 stream's stream_state", lambda: got and got[-1], timeout=20)
        finally:
            sub.unregister()
        self.assertEqual(st.rate_hz, 15.0)


if __name__ == "__main__":
    rospy.init_node("link_aware_camera_check")
    rostest.rosrun("overlay_manager", "link_aware_camera", LinkAwareCamera, sys.argv)
