#!/usr/bin/python3
"""rostest: the link_aware_h264 transport inside a camera driver (see link_aware_h264.test).

This node is the overlay node's ~peers (/robot1/overlay_manager/peers: this host 127.0.0.2 is the peer
"laptop") and the checks. The stream has tiers (the default): the image_transport viewer follows the
stream's directory to the full tier (<topic>/full) while its path is direct and to the fitted tier
(<topic>) on derp, with no parameter of its own, and so does the decoder nodelet; this node's rospy
subscribers cannot switch and stay on the topic they subscribed to, which is fitted to them.
Checks: both viewers get decoded pictures, each on the tier it should read; a late subscriber of
the running tier decodes a picture within 1 s (the keyframe interval is 10 s, so only the keyframe
on subscribe can give it); the bitrate follows the path on the fly (direct -> derp) on the same
encoder (its frame counter's stream id unchanged, no new keyframe) for a subscriber that stays on
its tier, while the moving viewer keeps its frame rate; a subscriber that stops reading (a raw
TCPROS connection read at 40 KB/s, on a direct path) makes its tier back off (observed delivery,
skipped frames) while the other tier's viewer is untouched, and every access unit it then reads
continues the H.264 reference chain (frame_num) or starts at a keyframe: nothing a decoder would
smear; a budget and crf changed through dynamic_reconfigure (what rqt_reconfigure does) reach the
relayed viewer's tier within 1 s with no frame gap over 200 ms at the viewer and no new keyframe.
"""
import socket
import struct
import sys
import threading
import time
import unittest
import xmlrpc.client

import av
import dynamic_reconfigure.client
import numpy as np
import rosgraph
import rospy
import rostest
from link_aware_common import peers_msg, wait_for
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Empty

from overlay_manager.msg import Peer, PeerList, StreamState

CAM = "/camera/image_raw"
H264 = CAM + "/link_aware_h264"  # the fitted tier (plain subscribers, relayed viewers)
FULL = H264 + "/full"            # the full tier (viewers on direct paths)
PEERS = "/robot1/overlay_manager/peers"
WIDTH, HEIGHT = 640, 480
MAX_VIDEO_KBPS = 4000.0   # link_aware_h264.test
DERP_VIDEO_KBPS = 800.0   # 0.8 x video_budget_kbps_derp 1000


# ---- H.264 reference chain (frame_num) -----------------------------------------------------------

def nal_units(data):
    """(nal_unit_type, payload without the header byte) for each NAL unit of an Annex B buffer."""
    out, i, n = [], 0, len(data)
    starts = []
    while i + 3 <= n:
        if data[i] == 0 and data[i + 1] == 0 and data[i + 2] == 1:
            starts.append(i + 3)
            i += 3
        else:
            i += 1
    for k, s in enumerate(starts):
        e = starts[k + 1] - 3 if k + 1 < len(starts) else n
        while e > s and data[e - 1] == 0:
            e -= 1
        out.append((data[s] & 0x1F, data[s + 1:e]))
    return out


class Bits:
    """Exp-Golomb reader over an RBSP (emulation prevention bytes removed)."""

    def __init__(self, payload):
        rbsp, zeros = bytearray(), 0
        for b in payload:
            if zeros >= 2 and b == 3:
                zeros = 0
                continue
            rbsp.append(b)
            zeros = zeros + 1 if b == 0 else 0
        self.data, self.pos = bytes(rbsp), 0

    def u(self, n):
        v = 0
        for _ in range(n):
            v = (v << 1) | ((self.data[self.pos >> 3] >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return v

    def ue(self):
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
        return (1 << zeros) - 1 + self.u(zeros)


COUNTER_UUID = bytes([0x2b, 0x66, 0x0c, 0x53, 0x16, 0x0f, 0x40, 0x4e,
                      0xaa, 0x0b, 0x5f, 0x3f, 0xf8, 0x21, 0xeb, 0x22])


def frame_counter(data):
    """(stream id, frame number) of the encoder's frame counter SEI in an access unit (the stream id
    is drawn each time the encoder opens), None without one."""
    for typ, payload in nal_units(data):
        if typ != 6:
            continue
        rbsp = Bits(payload).data
        if len(rbsp) >= 31 and rbsp[0] == 5 and rbsp[1] == 29 and rbsp[2:18] == COUNTER_UUID and rbsp[18] == 1:
            return int.from_bytes(rbsp[19:23], "big"), int.from_bytes(rbsp[23:31], "big")
    return None


class ChainCheck:
    """Feeds access units in order; counts those that break the reference chain (a P slice whose
    frame_num does not follow the previous one). P slices before the first keyframe (sent before the
    new connection's keyframe request took effect) are counted apart: a decoder drops them."""

    def __init__(self):
        self.log2_max = None
        self.prev = None
        self.units = self.keyframes = self.broken = self.before_keyframe = 0

    def feed(self, data):
        self.units += 1
        for typ, payload in nal_units(data):
            if typ == 7:  # SPS
                b = Bits(payload)
                profile = b.u(8)
                b.u(16)
                b.ue()
                if profile in (100, 110, 122, 244, 44, 83, 86, 118, 128):
                    if b.ue() == 3:
                        b.u(1)
                    b.ue()
                    b.ue()
                    b.u(1)
                    assert b.u(1) == 0, "SPS with scaling matrices: not parsed here"
                self.log2_max = b.ue() + 4
            elif typ in (1, 5):
                b = Bits(payload)
                b.ue()
                b.ue()
                b.ue()
                frame_num = b.u(self.log2_max) if self.log2_max else None
                if typ == 5:
                    self.keyframes += 1
                elif self.prev is None:
                    self.before_keyframe += 1
                    return
                elif frame_num != (self.prev + 1) % (1 << self.log2_max):
                    self.broken += 1
                self.prev = frame_num
                return


def tcpros_connect(topic, caller, rcvbuf=8192):
    """A raw TCPROS subscription to `topic` from node `caller`, with a small receive buffer; the
    socket after both headers."""
    master = rosgraph.Master(caller)
    node = dict((t, n) for t, n in master.getSystemState()[0])[topic][0]
    code, _msg, proto = xmlrpc.client.ServerProxy(master.lookupNode(node)).requestTopic(caller, topic, [["TCPROS"]])
    assert code == 1, proto
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect((proto[1], proto[2]))
    fields = {"callerid": caller, "topic": topic, "type": "sensor_msgs/CompressedImage",
              "md5sum": CompressedImage._md5sum, "tcp_nodelay": "0"}
    hdr = b"".join(struct.pack("<I", len(f)) + f for f in (f"{k}={v}".encode() for k, v in fields.items()))
    s.sendall(struct.pack("<I", len(hdr)) + hdr)
    return s


class LinkAwareH264(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.peers_pub = rospy.Publisher(PEERS, PeerList, queue_size=1, latch=True)
        cls.peers_pub.publish(peers_msg(Peer.PATH_DIRECT))
        cls.lock = threading.Lock()
        cls.states = []
        for topic in (H264, FULL):
            rospy.Subscriber(topic + "/stream_state", StreamState, cls._on_state)
        cls.viewer = []
        rospy.Subscriber("/viewer/image", Image, lambda m: cls._append(cls.viewer, m), queue_size=5, buff_size=2**24)
        # keyframe requests of viewers that lost a frame (each may force a keyframe; a loaded
        # machine drops messages at viewers with queue size 1)
        cls.requests = []
        for topic in (H264, FULL):
            rospy.Subscriber(topic + "/keyframe_request", Empty, lambda m, t=topic: cls._append(cls.requests, t))

    @classmethod
    def _append(cls, lst, m):
        with cls.lock:
            lst.append((time.monotonic(), m))

    @classmethod
    def _on_state(cls, msg):
        with cls.lock:
            cls.states.append((time.monotonic(), msg))

    def states_since(self, t, topic=H264):
        """stream_state messages of the tier on `topic` (None: both tiers) received since t."""
        with self.lock:
            return [m for ts, m in self.states if ts >= t and topic in (None, m.topic)]

    def requests_since(self, t, topic=None):
        """Keyframe requests on `topic`'s tier (None: both) since t."""
        with self.lock:
            return [m for ts, m in self.requests if ts >= t and topic in (None, m)]

    def subscribers(self, topic):
        """Nodes the tier on `topic` names in its latest stream_state."""
        states = self.states_since(0, topic)
        return sorted(x.node for x in states[-1].subscribers) if states else []

    def viewer_since(self, t):
        with self.lock:
            return [m for ts, m in self.viewer if ts >= t]

    def test_1_viewers_decode(self):
        img = wait_for("a decoded frame from the link_aware_h264 subscriber plugin on /viewer/image",
                       lambda: self.viewer_since(0) and self.viewer_since(0)[-1], timeout=30)
        self.assertEqual((img.width, img.height, img.encoding), (WIDTH, HEIGHT, "bgr8"))
        self.assertEqual(img.header.frame_id, "camera")
        px = np.frombuffer(bytes(img.data), np.uint8).reshape(HEIGHT, WIDTH, 3)
        b, g, r = (int(v) for v in px[HEIGHT // 4, 40])
        self.assertTrue(r > 180 and g < 80 and b < 80, f"red block decoded as {(r, g, b)}")
        # the viewer (no tier parameter) moved to the full tier: its path, direct, has no budget
        wait_for("the full tier's stream_state naming only the viewer", lambda: self.subscribers(FULL) == ["/viewer"])
        got = []
        sub = rospy.Subscriber("/camera/decoded_h264", Image, got.append, queue_size=5, buff_size=2**24)
        try:
            dec = wait_for("a frame from the decoder nodelet (link_aware_h264)", lambda: got and got[-1], timeout=20)
            # the decoder nodelet follows the directory as the plugin does: its path, direct, has no budget
            wait_for("the full tier's stream_state naming the decoder nodelet and the viewer",
                     lambda: self.subscribers(FULL) == ["/decoder", "/viewer"], timeout=20)
            n = len(got)
            wait_for("10 more pictures from the decoder nodelet on the full tier", lambda: len(got) >= n + 10,
                     timeout=10)
            moved = got[-1]
        finally:
            sub.unregister()
        for img in (dec, moved):
            self.assertEqual((img.width, img.height, img.encoding), (WIDTH, HEIGHT, "rgb8"))
        # nobody reads the decoder: it leaves the stream
        wait_for("the full tier's stream_state naming only the viewer again",
                 lambda: self.subscribers(FULL) == ["/viewer"], timeout=20)
        st = wait_for("the full tier's stream_state naming the laptop on direct",
                      lambda: [s for s in self.states_since(0, FULL)
                               if [(x.host, x.path) for x in s.subscribers] == [("laptop", Peer.PATH_DIRECT)]])[-1]
        self.assertEqual((st.codec, st.format, st.tier), ("h264", "h264", "full"))
        self.assertEqual(st.peers_topic, PEERS)
        self.assertIn(FULL, st.tier_topics)  # the tiers being made
        self.assertEqual({x.codec for x in st.subscribers}, {"h264"})
        self.assertIn("link_aware_h264", st.subscribers[0].codec_reason)
        self.assertEqual((st.subscribers[0].tier, st.subscribers[0].wanted_tier), ("full", "full"))
        # only tiers with subscribers are encoded: the fitted one stops when the decoder leaves
        wait_for("the fitted tier without subscribers while the full one streams",
                 lambda: [s for s in self.states_since(time.monotonic() - 0.6) if s.reason == "no subscribers"
                          and s.output_rate_hz == 0.0]
                 and [s for s in self.states_since(time.monotonic() - 0.6, FULL) if s.output_rate_hz > 20.0])

    def test_2_late_subscriber_decodes_within_one_second(self):
        wait_for("the viewer streaming", lambda: len(self.viewer_since(time.monotonic() - 1.0)) > 10)
        for attempt in range(3):
            ctx = av.CodecContext.create("h264", "r")
            first = {}

            def on_msg(m, ctx=ctx, first=first):
                if "t" in first:
                    return
                try:
                    frames = ctx.decode(av.Packet(bytes(m.data)))
                except av.AVError:  # data before the first keyframe
                    frames = []
                if frames:
                    first["t"] = time.monotonic()
                    first["frame"] = frames[0]

            t0 = time.monotonic()
            # the tier the viewer reads: its encoder runs, so only the keyframe on subscribe helps
            sub = rospy.Subscriber(FULL, CompressedImage, on_msg, queue_size=50, buff_size=2**24)
            try:
                wait_for(f"a decoded picture on a new subscription to {FULL} (attempt {attempt + 1})",
                         lambda first=first: "t" in first, timeout=5)
            finally:
                sub.unregister()
            delay = first["t"] - t0
            print(f"late subscriber {attempt + 1}: first picture after {delay * 1000:.0f} ms", flush=True)
            self.assertLess(delay, 1.0, f"first picture {delay:.2f} s after subscribing (keyframe interval 10 s)")
            self.assertEqual((first["frame"].width, first["frame"].height), (WIDTH, HEIGHT))
            time.sleep(0.5)

    def test_3_bitrate_follows_the_path_on_the_fly(self):
        """This node subscribes to the full tier and stays there (a rospy subscriber cannot switch):
        when its path turns derp the tier is fitted to it on the same encoder, while the viewer
        moves to the fitted tier by itself."""
        self.peers_pub.publish(peers_msg(Peer.PATH_DIRECT))
        units = []  # (arrival, payload bytes, IDR, frame counter) on the full tier

        def on_unit(m):
            data = bytes(m.data)
            with self.lock:
                units.append((time.monotonic(), len(data), 5 in [t for t, _ in nal_units(data)], frame_counter(data)))

        def kbps_since(t0, t1):
            with self.lock:
                return sum(n for t, n, _k, _c in units if t0 <= t < t1) * 8 / 1000.0 / (t1 - t0)

        sub = rospy.Subscriber(FULL, CompressedImage, on_unit, queue_size=100, buff_size=2**24)
        try:
            wait_for("frames on this node's own subscription to the full tier", lambda: len(units) > 5)
            wait_for("the full tier's video bitrate at the maximum on direct",
                     lambda: [s for s in self.states_since(time.monotonic() - 0.6, FULL)
                              if s.video_bitrate_kbps == MAX_VIDEO_KBPS and s.subscribers])
            t_direct = time.monotonic()
            time.sleep(3.0)
            direct = kbps_since(t_direct, time.monotonic())
            t_change = time.monotonic()
            self.peers_pub.publish(peers_msg(Peer.PATH_DERP))
            wait_for("the full tier's video bitrate for this node on derp (0.8 x 1000 kbit/s)",
                     lambda: [s for s in self.states_since(t_change, FULL) if s.video_bitrate_kbps == DERP_VIDEO_KBPS])
            wait_for("the viewer on the fitted tier (its path is derp now)",
                     lambda: self.subscribers(H264) == ["/viewer"])
            time.sleep(1.0)
            t_derp = time.monotonic()
            time.sleep(3.0)
            derp = kbps_since(t_derp, time.monotonic())
            viewer_hz = len(self.viewer_since(t_derp)) / (time.monotonic() - t_derp)
            out_hz = [round(s.output_rate_hz, 1) for s in self.states_since(t_derp, FULL)]
            with self.lock:
                before = [c for t, _n, _k, c in units if t < t_change]
                after = [c for t, _n, _k, c in units if t >= t_change]
                idrs = sum(1 for t, _n, k, _c in units if k and t >= t_change)
            requested = len(self.requests_since(t_change, FULL))
            print(f"bitrate direct {direct:.0f} kbit/s -> derp {derp:.0f} kbit/s on the full tier; viewer "
                  f"{viewer_hz:.1f} Hz on the fitted tier; full tier output {out_hz} Hz; {idrs} keyframes and "
                  f"{requested} keyframe requests since the change", flush=True)
            self.assertLess(derp, 0.5 * direct, f"derp {derp:.0f} kbit/s vs direct {direct:.0f}")
            self.assertLess(derp, DERP_VIDEO_KBPS * 1.5)
            self.assertGreater(viewer_hz, 20.0, "the viewer lost frames over its move to the fitted tier")
            # the same encoder: its frame counter's stream id (drawn at every open) and numbering go on
            self.assertTrue(before and after and None not in before + after, "access units without a frame counter")
            self.assertEqual({c[0] for c in before + after}, {before[0][0]}, "the encoder was reopened")
            frames = [c[1] for c in before + after]
            self.assertTrue(all(b > a for a, b in zip(frames, frames[1:])), "the frame counter went back")
            # no keyframe came with the change (the interval is 10 s: one may fall in the window)
            self.assertLessEqual(idrs, 1 + requested, f"{idrs} keyframes since the change")
        finally:
            sub.unregister()
            self.peers_pub.publish(peers_msg(Peer.PATH_DIRECT))

    def test_4_backed_up_subscriber_backs_off_and_stays_decodable(self):
        """The slow reader is alone on the fitted tier; the viewer (direct) reads the full tier,
        whose delivery is its own: it neither skips nor slows down."""
        self.peers_pub.publish(peers_msg(Peer.PATH_DIRECT))
        wait_for("the viewer back on the full tier at the maximum video bitrate",
                 lambda: self.subscribers(FULL) == ["/viewer"] and
                 [s for s in self.states_since(time.monotonic() - 0.6, FULL) if s.video_bitrate_kbps == MAX_VIDEO_KBPS])
        sock = tcpros_connect(H264, rospy.get_name())
        buf = bytearray()
        chain = ChainCheck()
        t0 = time.monotonic()
        try:
            # the response header, then 40 KB/s for 6 s (the stream makes about 500 KB/s), then as fast as it comes
            while time.monotonic() - t0 < 10.0:
                slow = time.monotonic() - t0 < 6.0
                sock.settimeout(0.1)
                try:
                    chunk = sock.recv(4096 if slow else 1 << 20)
                except socket.timeout:
                    chunk = b""
                buf += chunk
                if slow:
                    time.sleep(0.1)
            sock.settimeout(None)
        finally:
            sock.close()
        (hlen,) = struct.unpack_from("<I", buf, 0)
        pos = 4 + hlen
        while pos + 4 <= len(buf):
            (n,) = struct.unpack_from("<I", buf, pos)
            if pos + 4 + n > len(buf):
                break
            msg = CompressedImage()
            msg.deserialize(bytes(buf[pos + 4:pos + 4 + n]))
            chain.feed(bytes(msg.data))
            pos += 4 + n
        during = self.states_since(t0)
        full_during = self.states_since(t0, FULL)
        viewer_hz = len(self.viewer_since(t0 + 1.0)) / (time.monotonic() - t0 - 1.0)
        mine = [x for s in during for x in s.subscribers if x.node == rospy.get_name()]
        skipped = sum(s.skipped_frames for s in during)
        lowest = min(s.video_bitrate_kbps for s in during)
        backlog = max((x.backlog_bytes for x in mine), default=0)
        print(f"backed-up subscriber: {chain.units} access units read, {chain.keyframes} keyframes, "
              f"{chain.broken} broken, {chain.before_keyframe} before the first keyframe; stream: {skipped} frames "
              f"skipped, video bitrate down to {lowest:.0f} kbit/s, backlog up to {backlog} bytes; the full "
              f"tier meanwhile: {sum(s.skipped_frames for s in full_during)} skipped, viewer {viewer_hz:.1f} Hz",
              flush=True)
        self.assertGreater(chain.units, 20)
        self.assertEqual(chain.broken, 0, "an access unit did not continue the reference chain")
        self.assertGreater(chain.keyframes, 0)
        self.assertLessEqual(chain.before_keyframe, 2)
        self.assertGreater(backlog, 0, "the backlog was not seen")
        self.assertTrue(any(s.reason == "observed delivery" for s in during), "no back-off on the direct path")
        self.assertLess(lowest, MAX_VIDEO_KBPS, "the bitrate did not come down")
        self.assertGreater(skipped, 0, "no frame was skipped while the connection was backed up")
        # delivery feedback per tier: the viewer's tier neither skipped nor lowered its bitrate
        self.assertTrue(full_during and all(s.subscribers for s in full_during), "the viewer left the full tier")
        self.assertEqual(sum(s.skipped_frames for s in full_during), 0, "the full tier skipped frames")
        self.assertEqual(min(s.video_bitrate_kbps for s in full_during), MAX_VIDEO_KBPS)
        self.assertGreater(viewer_hz, 15.0, "the viewer on the full tier slowed down")


    def test_5_budget_and_crf_change_live(self):
        client = dynamic_reconfigure.client.Client(H264, timeout=20)
        before = client.get_configuration(timeout=10)
        self.assertEqual(before["video_budget_kbps_derp"], 1000.0, "the server starts from the stream's parameters")
        self.assertEqual(before["gop"], 300)
        self.peers_pub.publish(peers_msg(Peer.PATH_DERP))
        try:
            wait_for("the viewer on the fitted tier at the derp video bitrate (0.8 x 1000 kbit/s)",
                     lambda: [s for s in self.states_since(time.monotonic() - 0.6)
                              if s.video_bitrate_kbps == DERP_VIDEO_KBPS
                              and [x.node for x in s.subscribers] == ["/viewer"]])
            # the measured bitrate has settled under the derp cap (stream_state measures over 0.5 s windows)
            low_state = wait_for("a measured bitrate under the derp cap",
                                 lambda: [s for s in self.states_since(time.monotonic() - 0.6)
                                          if 0 < s.bitrate_kbps < 1.3 * DERP_VIDEO_KBPS], timeout=15)[-1]
            low = low_state.bitrate_kbps
            t_change = time.monotonic()
            client.update_configuration({"video_budget_kbps_derp": 2500.0})
            wait_for("stream_state with the new cap 0.8 x 2500 kbit/s",
                     lambda: [s for s in self.states_since(t_change) if s.video_bitrate_kbps == 2000.0], timeout=5)
            applied_s = time.monotonic() - t_change
            high_state = wait_for("a measured bitrate above 1.5 x the old one",
                                  lambda: [s for s in self.states_since(t_change) if s.bitrate_kbps > 1.5 * low],
                                  timeout=10)[0]
            time.sleep(1.0)
            states = self.states_since(t_change)
            frames = self.viewer_since(t_change - 0.5)
            stamps = [m.header.stamp.to_sec() for m in frames]
            gap = max((b - a for a, b in zip(stamps, stamps[1:])), default=float("inf"))
            keyframes = sum(s.keyframes for s in states) - len(self.requests_since(t_change))
            print(f"reconfigure: cap applied after {applied_s * 1000:.0f} ms; measured bitrate "
                  f"{low:.0f} -> {high_state.bitrate_kbps:.0f} kbit/s; viewer gap max {gap * 1000:.0f} ms; "
                  f"{keyframes} keyframes", flush=True)
            self.assertLess(applied_s, 1.0)
            self.assertLess(gap, 0.2, "a frame gap over 200 ms at the viewer")
            self.assertLessEqual(keyframes, 1, "the change reopened the encoder")
            # crf live: a higher rate factor spends fewer bits under the same cap, on the same encoder
            t_crf = time.monotonic()
            client.update_configuration({"crf": 40.0})
            coarse = wait_for("a measured bitrate under 0.7 x the crf 23 one",
                              lambda: [s for s in self.states_since(t_crf)
                                       if 0 < s.bitrate_kbps < 0.7 * high_state.bitrate_kbps], timeout=10)[0]
            print(f"crf 23 -> 40: {high_state.bitrate_kbps:.0f} -> {coarse.bitrate_kbps:.0f} kbit/s "
                  f"after {time.monotonic() - t_crf:.1f} s", flush=True)
            self.assertLessEqual(sum(s.keyframes for s in self.states_since(t_crf)) - len(self.requests_since(t_crf)),
                                 1)
            self.assertEqual(client.get_configuration(timeout=10)["crf"], 40.0)
        finally:
            client.update_configuration({"video_budget_kbps_derp": 1000.0, "crf": before["crf"]})
            self.peers_pub.publish(peers_msg(Peer.PATH_DIRECT))

    def test_6_keyframe_request_is_answered_at_once(self):
        """A viewer that lost the stream asks on <topic>/keyframe_request; the publisher answers
        with an IDR at the next frame (the keyframe interval here is 10 s)."""
        arrivals = []
        sub = rospy.Subscriber(H264, CompressedImage,
                               lambda m: arrivals.append((time.monotonic(), 5 in [t for t, _ in nal_units(m.data)])),
                               queue_size=100, buff_size=2**24)
        req = rospy.Publisher(H264 + "/keyframe_request", Empty, queue_size=1)
        try:
            wait_for("the publisher subscribed to the keyframe requests", lambda: req.get_num_connections() > 0)
            wait_for("frames on the new subscription", lambda: len(arrivals) > 5)
            time.sleep(1.2)  # forced keyframes are spaced 1 s apart: the one on subscribe is older
            t_req = time.monotonic()
            req.publish(Empty())
            idr = wait_for("a keyframe after the request", lambda: [t for t, k in arrivals if k and t > t_req],
                           timeout=3)[0]
            print(f"keyframe request answered after {(idr - t_req) * 1000:.0f} ms", flush=True)
            self.assertLess(idr - t_req, 0.5)
        finally:
            sub.unregister()
            req.unregister()


if __name__ == "__main__":
    rospy.init_node("link_aware_h264_check")
    rostest.rosrun("overlay_manager", "link_aware_h264", LinkAwareH264, sys.argv)
