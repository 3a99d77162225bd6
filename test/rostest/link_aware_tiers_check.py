#!/usr/bin/python3
"""rostest: a direct and a relayed viewer of one camera get different tiers at once (see
link_aware_tiers.test).

This node is the overlay node's ~peers (robot1 with the peers "laptop", 127.0.0.2, on derp and
"base", 127.0.0.3, direct) and the checks: the stream's directory sends each viewer to the tier its
path calls for; each tier's stream_state names only its own subscriber; the relayed viewer's tier
is fitted to the derp budget while the direct one's has none and keeps the maximum quality; both
viewers decode pictures at the same time; two compressed_decoder nodes on the direct host, while
their output is read: the one that follows the directory reads the full tier (its pictures closer
to the camera's than the fitted tier's, which the relayed viewer holds down) with no gap in its
pictures over the move, the one with ~tiers false stays on the fitted tier, and both leave the
stream when nobody reads them; when the laptop's path turns direct, its viewer moves to the full
tier by itself (no parameter on the viewer's side) and the fitted tier stops. Against a stream this
node plays (its own base and tier topics, frame_id naming the topic, and directory): the decoder
shows the base topic's pictures until the tier delivers and then only the tier's, goes back to the
base 2-3 s after the tier's publisher is gone, and a directory naming a topic that cannot be
subscribed to leaves it showing the base with no gap.
"""
import math
import sys
import threading
import time
import unittest

import cv2
import numpy as np
import rospy
import rostest
from link_aware_common import wait_for
from sensor_msgs.msg import CompressedImage, Image

from overlay_manager.msg import Peer, PeerList, StreamState, TierDirectory, TierEntry

CAM = "/camera/image_raw/link_aware"
FULL = CAM + "/full"
PEERS = "/robot1/overlay_manager/peers"
DIRECT, RELAYED = "/viewer_direct", "/viewer_relayed"
DEC_DIRECT, DEC_FIXED = "/decoder_direct", "/decoder_fixed"  # compressed_decoder: following, ~tiers false
DEC_ORPHAN = "/decoder_orphan"  # compressed_decoder reading the stream this node plays
FAKE = "/fake/image_raw/link_aware"
FAKE_FULL = FAKE + "/full"
DERP_BUDGET_KBPS = 2000.0


def peers(laptop_path: str) -> PeerList:
    """~peers of robot1: laptop (127.0.0.2) on laptop_path, base (127.0.0.3) direct."""
    msg = PeerList()
    msg.header.stamp = rospy.Time.now()
    msg.self_peer = Peer(name="robot1", dns_name="robot1.fleet.internal", addresses=["100.64.0.1"], online=True,
                         path=Peer.PATH_SELF)
    msg.peers = [Peer(name="laptop", dns_name="laptop.fleet.internal", addresses=["127.0.0.2"], online=True,
                      active=True, path=laptop_path),
                 Peer(name="base", dns_name="base.fleet.internal", addresses=["127.0.0.3"], online=True,
                      active=True, path=Peer.PATH_DIRECT)]
    return msg


class LinkAwareTiers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.lock = threading.Lock()
        cls.states = {}
        cls.directory = None
        cls.pictures = {DIRECT: [], RELAYED: []}
        cls.peers_pub = rospy.Publisher(PEERS, PeerList, queue_size=1, latch=True)
        cls.peers_pub.publish(peers(Peer.PATH_DERP))
        for topic in (CAM, FULL):
            rospy.Subscriber(topic + "/stream_state", StreamState, cls._on_state, callback_args=topic)
        rospy.Subscriber(CAM + "/tiers", TierDirectory, cls._on_directory)
        for viewer in (DIRECT, RELAYED):
            rospy.Subscriber(viewer + "/image", Image, cls._on_picture, callback_args=viewer)

    @classmethod
    def _on_state(cls, msg, topic):
        with cls.lock:
            cls.states[topic] = msg

    @classmethod
    def _on_directory(cls, msg):
        with cls.lock:
            cls.directory = msg

    @classmethod
    def _on_picture(cls, msg, viewer):
        with cls.lock:
            cls.pictures[viewer].append(time.monotonic())

    def state(self, topic):
        with self.lock:
            return self.states.get(topic)

    def entries(self):
        with self.lock:
            d = self.directory
        return {e.node: (e.tier, e.topic, e.path) for e in d.entries} if d else {}

    def subscribers(self, topic):
        st = self.state(topic)
        return sorted(s.node for s in st.subscribers) if st else []

    def rate(self, viewer, seconds):
        now = time.monotonic()
        with self.lock:
            return sum(1 for t in self.pictures[viewer] if t > now - seconds) / seconds

    def test_1_direct_and_relayed_viewers_get_their_own_tier_at_once(self):
        want = {DIRECT: ("full", FULL, "direct"), RELAYED: ("fitted", CAM, "derp")}
        wait_for(f"the directory to send each viewer to its tier ({want})",
                 lambda: all(self.entries().get(n) == w for n, w in want.items()), 40)
        wait_for("each tier's stream_state to name only its own viewer",
                 lambda: self.subscribers(FULL) == [DIRECT] and self.subscribers(CAM) == [RELAYED], 30)
        # the fitted tier fits the derp budget; the full one has none and keeps the top quality
        wait_for("the fitted tier to settle within its derp budget",
                 lambda: 0.0 < self.state(CAM).bitrate_kbps <= 1.3 * DERP_BUDGET_KBPS, 30)
        full, fitted = self.state(FULL), self.state(CAM)
        self.assertEqual((full.tier, fitted.tier), ("full", "fitted"))
        self.assertTrue(math.isnan(full.budget_kbps), full)
        self.assertEqual(full.quality, 90)
        self.assertEqual(fitted.budget_kbps, DERP_BUDGET_KBPS)
        self.assertEqual((fitted.limited_by, fitted.reason), ("laptop", "path derp"))
        self.assertEqual([s.wanted_tier for s in full.subscribers], ["full"])
        self.assertEqual([s.wanted_tier for s in fitted.subscribers], ["fitted"])
        self.assertEqual(sorted(full.tier_topics), sorted([CAM, FULL]))
        # both viewers decode pictures at the same time, the direct one far more bits of them
        wait_for("both viewers to show pictures over the last 2 s",
                 lambda: self.rate(DIRECT, 2.0) >= 5.0 and self.rate(RELAYED, 2.0) > 0.0, 30)
        wait_for("the full tier to send more than twice the fitted tier's bitrate",
                 lambda: self.state(FULL).bitrate_kbps > 2.0 * self.state(CAM).bitrate_kbps, 20)
        print(f"full tier: {self.state(FULL).bitrate_kbps:.0f} kbit/s at quality {self.state(FULL).quality}, "
              f"{self.state(FULL).output_rate_hz:.1f} Hz; fitted tier: {self.state(CAM).bitrate_kbps:.0f} kbit/s "
              f"at quality {self.state(CAM).quality}, {self.state(CAM).output_rate_hz:.1f} Hz; viewers "
              f"{self.rate(DIRECT, 2.0):.1f} / {self.rate(RELAYED, 2.0):.1f} pictures/s", flush=True)

    def test_2_compressed_decoders_follow_the_directory_unless_told_not_to(self):
        lock = threading.Lock()
        times = {DEC_DIRECT: [], DEC_FIXED: []}
        last = {DEC_DIRECT: [], DEC_FIXED: []}  # the latest decoded pictures
        raw = {}  # the camera's frames by stamp

        def on_decoded(msg, name):
            with lock:
                times[name].append(time.monotonic())
                last[name] = (last[name] + [msg])[-5:]

        def on_raw(msg):
            with lock:
                raw[msg.header.stamp.to_nsec()] = msg
                for k in sorted(raw)[:-20]:
                    del raw[k]

        subs = [rospy.Subscriber(n + "/image", Image, on_decoded, callback_args=n, queue_size=2, buff_size=2**24)
                for n in (DEC_DIRECT, DEC_FIXED)]
        try:
            want = {DEC_DIRECT: ("full", FULL, "direct"), DEC_FIXED: ("full", FULL, "direct")}
            wait_for(f"the directory to name the full tier for both decoders ({want})",
                     lambda: all(self.entries().get(n) == w for n, w in want.items()), 30)
            wait_for("the following decoder on the full tier, the one with ~tiers false on the fitted one",
                     lambda: self.subscribers(FULL) == [DEC_DIRECT, DIRECT]
                     and self.subscribers(CAM) == [DEC_FIXED, RELAYED], 30)
            full, fitted = self.state(FULL), self.state(CAM)
            self.assertEqual(full.quality, 90)
            self.assertTrue(math.isnan(full.budget_kbps), full)
            self.assertEqual((fitted.limited_by, fitted.reason), ("laptop", "path derp"))
            self.assertLess(fitted.quality, full.quality)
            fixed = {x.node: x for x in fitted.subscribers}[DEC_FIXED]
            self.assertEqual((fixed.path, fixed.tier, fixed.wanted_tier), ("direct", "fitted", "full"))
            self.assertEqual({x.node: x.tier for x in full.subscribers}[DEC_DIRECT], "full")
            wait_for("both decoders to publish pictures over the last 2 s",
                     lambda: all(sum(1 for t in times[n] if t > time.monotonic() - 2.0) >= 2
                                 for n in (DEC_DIRECT, DEC_FIXED)), 20)
            # each decoder's picture against the camera's frame of the same stamp
            raw_sub = rospy.Subscriber("/camera/image_raw", Image, on_raw, queue_size=2, buff_size=2**24)
            try:
                def pairs():
                    with lock:
                        found = {}
                        for n in (DEC_DIRECT, DEC_FIXED):
                            match = [(m, raw[m.header.stamp.to_nsec()]) for m in last[n]
                                     if m.header.stamp.to_nsec() in raw]
                            if match:
                                found[n] = match[-1]
                        return found if len(found) == 2 else None

                found = wait_for("a picture of each decoder whose camera frame this node also has", pairs, 20)
            finally:
                raw_sub.unregister()
            psnr = {n: self.psnr(*found[n]) for n in found}
            with lock:
                t = times[DEC_DIRECT]
                gap = max(b - a for a, b in zip(t, t[1:]))
            print(f"compressed_decoder following the directory: {psnr[DEC_DIRECT]:.1f} dB (full tier, quality "
                  f"{full.quality}); with ~tiers false: {psnr[DEC_FIXED]:.1f} dB (fitted tier, quality "
                  f"{fitted.quality}); the following one's longest gap between pictures since its first: "
                  f"{gap * 1000:.0f} ms over {len(t)} pictures", flush=True)
            self.assertGreater(psnr[DEC_DIRECT], psnr[DEC_FIXED] + 1.0)
            self.assertLess(gap, 1.0, "the decoder was without pictures over its move to the full tier")
        finally:
            for sub in subs:
                sub.unregister()
        # lazy: both leave the stream (every tier they read) once nobody reads their output
        wait_for("both decoders gone from the stream once their outputs have no subscribers",
                 lambda: self.subscribers(FULL) == [DIRECT] and self.subscribers(CAM) == [RELAYED], 20)

    @staticmethod
    def psnr(decoded, original):
        """PSNR (dB) of a decoded picture against the camera's frame (same size and encoding)."""
        a = np.frombuffer(bytes(decoded.data), np.uint8).astype(np.float64)
        b = np.frombuffer(bytes(original.data), np.uint8).astype(np.float64)
        assert (decoded.width, decoded.height, decoded.encoding) == (original.width, original.height,
                                                                     original.encoding), "sizes differ"
        mse = float(np.mean((a - b) ** 2))
        return 99.0 if mse == 0 else 10.0 * math.log10(255.0 ** 2 / mse)

    def test_3_a_path_that_turns_direct_moves_its_viewer_to_the_full_tier(self):
        self.peers_pub.publish(peers(Peer.PATH_DIRECT))
        wait_for("the directory to send the laptop's viewer to the full tier",
                 lambda: self.entries().get(RELAYED) == ("full", FULL, "direct"), 30)
        wait_for("both viewers on the full tier and the fitted tier without subscribers",
                 lambda: self.subscribers(FULL) == [DIRECT, RELAYED] and self.subscribers(CAM) == [], 30)
        n = len(self.pictures[RELAYED])
        wait_for("the moved viewer to show pictures from the full tier", lambda: len(self.pictures[RELAYED]) >= n + 10,
                 20)
        self.assertEqual(self.state(CAM).reason, "no subscribers")

    def test_4_a_decoder_shows_the_old_topic_until_the_new_delivers_and_leaves_an_orphaned_tier(self):
        ok, jpeg = cv2.imencode(".jpg", np.full((48, 64, 3), 128, np.uint8))
        self.assertTrue(ok)
        pubs = {FAKE: rospy.Publisher(FAKE, CompressedImage, queue_size=5),
                FAKE_FULL: rospy.Publisher(FAKE_FULL, CompressedImage, queue_size=5)}
        directory = rospy.Publisher(FAKE + "/tiers", TierDirectory, queue_size=1, latch=True)
        stop = threading.Event()
        lock = threading.Lock()
        shown = []  # (monotonic time, frame_id: the topic the picture came from)

        def play():
            while not stop.is_set():
                for topic, pub in list(pubs.items()):
                    msg = CompressedImage(format="rgb8; jpeg compressed bgr8", data=jpeg.tobytes())
                    msg.header.stamp = rospy.Time.now()
                    msg.header.frame_id = topic
                    try:
                        pub.publish(msg)
                    except rospy.ROSException:  # the tier's publisher, unregistered meanwhile
                        pass
                time.sleep(1 / 15)

        def on_picture(msg):
            with lock:
                shown.append((time.monotonic(), msg.header.frame_id))

        def since(t):
            with lock:
                return [f for ts, f in shown if ts >= t]

        def longest_gap(t):
            with lock:
                times = [ts for ts, _ in shown if ts >= t]
            return max((b - a for a, b in zip(times, times[1:])), default=0.0)

        def name(topic):
            d = TierDirectory(topic=FAKE, tier_topics=[FAKE, FAKE_FULL])
            d.entries = [TierEntry(node=DEC_ORPHAN, path="direct", tier="full", topic=topic)]
            return d

        player = threading.Thread(target=play, daemon=True)
        player.start()
        sub = rospy.Subscriber(DEC_ORPHAN + "/image", Image, on_picture, queue_size=10)
        try:
            wait_for("the decoder's first pictures, from the base topic", lambda: len(since(0)) >= 3, 20)
            t0 = time.monotonic()
            directory.publish(name(FAKE_FULL))
            wait_for("the decoder on the tier and gone from the base topic",
                     lambda: FAKE_FULL in since(t0) and pubs[FAKE].get_num_connections() == 0, 20)
            seen = since(t0)
            first_full = seen.index(FAKE_FULL)
            # the base until the tier delivered, then only the tier: no gap, no picture out of turn
            self.assertEqual(set(seen[:first_full]), {FAKE}, seen)
            self.assertEqual(set(seen[first_full:]), {FAKE_FULL}, seen)
            move_gap = longest_gap(t0)
            self.assertLess(move_gap, 0.5)
            # the tier's publisher goes: after 2 s without one the decoder reads the base again
            pubs.pop(FAKE_FULL).unregister()
            t1 = time.monotonic()
            wait_for("the decoder showing the base topic again", lambda: FAKE in since(t1), 10)
            back = min(ts for ts, f in shown if ts >= t1 and f == FAKE) - t1
            print(f"compressed_decoder against a played stream: {first_full} pictures from the base before the "
                  f"tier's first, longest gap over the move {move_gap * 1000:.0f} ms; back on the base "
                  f"{back:.1f} s after the tier's publisher went", flush=True)
            self.assertGreaterEqual(back, 1.9)
            self.assertLess(back, 6.0)  # checked every second, then subscribed again
            # a directory naming a topic that cannot be subscribed to: the base stays shown, no gap
            t2 = time.monotonic()
            directory.publish(name("/fake/not a topic!"))
            time.sleep(3.5)  # past the 2 s after which a tier without a publisher is given up
            directory.publish(name(""))
            time.sleep(0.5)
            self.assertEqual(set(since(t2)), {FAKE})
            self.assertLess(longest_gap(t2), 0.5)
            self.assertGreater(len(since(t2)), 30)
        finally:
            stop.set()
            player.join(2)
            sub.unregister()
            for pub in pubs.values():
                pub.unregister()
            directory.unregister()


if __name__ == "__main__":
    rospy.init_node("link_aware_tiers_check")
    rostest.rosrun("overlay_manager", "link_aware_tiers", LinkAwareTiers, sys.argv)
