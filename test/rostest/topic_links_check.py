#!/usr/bin/python3
"""rostest: the real node's topic-link map (~get_topic_links, ~topic_links) over real ROS connections.

See topic_links.test for the machines: /camera on robotb (127.0.0.2) publishes /chatter to /viewer
on this machine robota (127.0.0.1), whose path the fake tailscaled reports direct at
10.250.0.3:41641; /local_talker -> /viewer stays inside robota. /shaper on robotb publishes
/points/shaped to /viewer and its stream_state; /far_shaper on robotc one that nobody reads.
"""
import math
import socket
import sys
import time
import unittest
import xmlrpc.client

import rosgraph
import rospy
import rostest
from std_msgs.msg import String

from overlay_manager.msg import TopicLinkList
from overlay_manager.srv import GetTopicLinks
from overlay_manager.system import waiting

NS = "/overlay_manager/"


def wait_for(what, predicate, timeout=30.0, describe=lambda: ""):
    """overlay_manager.system.waiting.wait_for every 0.2 s; a timeout fails the test (AssertionError)."""
    return waiting.wait_for(what, predicate, timeout, interval=0.2, detail=describe, error=AssertionError)


def by_pair(links):
    return {(link.topic, link.publisher_node, link.subscriber_node): link for link in links}


SHAPED = ("/points/shaped", "/shaper", "/viewer")
STATE = "/points/shaped/stream_state"


def subscribers_of(topic):
    """Caller ids the master lists as subscribers of topic."""
    state = xmlrpc.client.ServerProxy(rosgraph.get_master_uri()).getSystemState("/topic_links_check")[2]
    return next((nodes for name, nodes in state[1] if name == topic), [])


class TopicLinks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rospy.wait_for_service(NS + "get_topic_links", timeout=30)
        cls.get = rospy.ServiceProxy(NS + "get_topic_links", GetTopicLinks)
        cls.latest = {}
        rospy.Subscriber(NS + "topic_links", TopicLinkList, lambda m: cls.latest.__setitem__("msg", m))

    def call(self, topic="", host="", include_local=False):
        resp = self.get(topic=topic, host=host, include_local=include_local)
        self.assertTrue(resp.ok, resp.message)
        return resp.links

    def test_cross_machine_link_has_path_and_rate(self):
        last = []

        def ready():
            last[:] = self.call()
            link = by_pair(last).get(("/chatter", "/camera", "/viewer"))
            return link if link is not None and link.bytes_per_second > 0 else None

        link = wait_for("/chatter robotb -> robota with a rate", ready, describe=lambda: last)
        self.assertEqual((link.publisher_host, link.subscriber_host, link.local), ("robotb", "robota", False))
        self.assertEqual((link.path, link.endpoint), ("direct", "10.250.0.3:41641"))
        self.assertEqual(link.type, "std_msgs/String")
        # 20 Hz x about 200 bytes (plus TCPROS framing): between 1 and 20 kB/s
        self.assertGreater(link.bytes_per_second, 1000.0)
        self.assertLess(link.bytes_per_second, 20000.0)

    def test_local_links_only_on_request_and_filters(self):
        wait_for("the local link", lambda: ("/local_chatter", "/local_talker", "/viewer")
                 in by_pair(self.call(include_local=True)))
        local = by_pair(self.call(include_local=True))[("/local_chatter", "/local_talker", "/viewer")]
        self.assertTrue(local.local)
        self.assertEqual((local.publisher_host, local.subscriber_host, local.path), ("robota", "robota", "self"))
        self.assertNotIn(("/local_chatter", "/local_talker", "/viewer"), by_pair(self.call()))
        self.assertTrue(all(link.topic == "/chatter" for link in self.call(topic="/chatter")))
        self.assertEqual(by_pair(self.call(host="robotb.fleet.internal")).keys(),
                         by_pair(self.call(host="robotb")).keys())
        self.assertIn(("/chatter", "/camera", "/viewer"), by_pair(self.call(host="robotb")))
        self.assertEqual(self.call(host="nosuchmachine"), [])

    def test_latched_topic(self):
        msg = wait_for("~topic_links with /chatter", lambda: (
            self.latest.get("msg") if ("/chatter", "/camera", "/viewer") in by_pair(
                self.latest["msg"].links if "msg" in self.latest else []) else None))
        self.assertTrue(all(not link.local for link in msg.links))
        keys = [(link.topic, link.publisher_host, link.subscriber_host) for link in msg.links]
        self.assertEqual(keys, sorted(keys))

    def shaping_of(self, key):
        """(shaping_state, link) of one connection in a fresh map (link None when not listed)."""
        link = by_pair(self.call()).get(key)
        return (link.shaping_state if link else None), link

    def test_shaped_link_says_what_the_subscriber_gets(self):
        last = []

        def ready():
            last[:] = [self.shaping_of(SHAPED)]
            return last[0][1] if last[0][0] == STATE else None

        link = wait_for(f"{SHAPED} with the shaping of {STATE}", ready, describe=lambda: last)
        sub = link.shaping
        self.assertEqual((sub.node, sub.tier, sub.codec, sub.rate_hz, sub.budget_kbps, sub.path),
                         ("/viewer", "fitted", "zstd", 2.0, 800.0, "derp"))
        self.assertEqual((link.shaping_format, link.shaping_reason), ("std_msgs/String; zstd; 1.00:1", "path derp"))
        self.assertEqual((link.path, link.publisher_host), ("direct", "robotb"))  # this machine's view stays
        plain = by_pair(self.call())[("/chatter", "/camera", "/viewer")]
        self.assertEqual((plain.shaping_state, plain.shaping.tier), ("", ""))
        self.assertTrue(math.isnan(plain.shaping.rate_hz) and math.isnan(plain.shaping.budget_kbps))
        # the latched topic carries it too
        wait_for("~topic_links with the shaping", lambda: "msg" in self.latest and by_pair(
            self.latest["msg"].links).get(SHAPED, link).shaping_state == STATE)
        # followed: the stream read here; not followed: the one nobody reads (its /rosout still
        # reaches this machine's rosout)
        node = NS.rstrip("/")
        self.assertIn(node, subscribers_of(STATE))
        self.assertNotIn(node, subscribers_of("/far/points/shaped/stream_state"))
        self.assertIn("/far/points/shaped/stream_state", dict(rosgraph.Master("/t").getPublishedTopics("")))

    def test_real_topic_shaper(self):
        """The real topic shaper (a nodelet: its tiers and stream_state come from one caller id)
        and the real unshape on robotb."""
        key = ("/local_chatter/shaped", "/topic_shaper", "/chatter_unshape")
        state = "/local_chatter/shaped/stream_state"
        last = []

        def ready():
            last[:] = [self.shaping_of(key)]
            return last[0][1] if last[0][0] == state else None

        link = wait_for(f"{key} with the shaping of {state}", ready, describe=lambda: last)
        sub = link.shaping
        self.assertEqual((link.type, link.path, link.subscriber_host), ("overlay_manager/ShapedMessage", "direct",
                                                                        "robotb"))
        self.assertEqual((sub.node, sub.host, sub.path, sub.tier, sub.codec, sub.budget_kbps),
                         ("/chatter_unshape", "robotb", "direct", "fitted", "zstd", 800.0))
        self.assertGreater(sub.rate_hz, 0.0)
        self.assertTrue(link.shaping_format.startswith("std_msgs/String; zstd"), link.shaping_format)
        # the shaper's other topics to the viewer (type, tier directory) are not shaped streams
        for other in ("/local_chatter/shaped/type", "/local_chatter/shaped/tiers"):
            found = by_pair(self.call()).get((other, "/topic_shaper", "/chatter_unshape"))
            self.assertIsNotNone(found, other)
            self.assertEqual(found.shaping_state, "", other)

    def test_stream_state_that_goes_away_is_unfollowed(self):
        wait_for(f"{SHAPED} shaped", lambda: self.shaping_of(SHAPED)[0] == STATE)
        control = rospy.Publisher("/shaper/control", String, queue_size=1, latch=True)
        node = NS.rstrip("/")
        try:
            wait_for("/shaper connected to the control topic", lambda: control.get_num_connections() > 0)
            control.publish(String(data="drop"))
            wait_for(f"{node} no longer subscribed to {STATE} and {SHAPED} without shaping",
                     lambda: node not in subscribers_of(STATE) and self.shaping_of(SHAPED)[0] == "",
                     describe=lambda: (subscribers_of(STATE), self.shaping_of(SHAPED)[0]))
            control.publish(String(data="advertise"))
            wait_for(f"{SHAPED} shaped again after {STATE} came back",
                     lambda: self.shaping_of(SHAPED)[0] == STATE and node in subscribers_of(STATE),
                     describe=lambda: (subscribers_of(STATE), self.shaping_of(SHAPED)[0]))
        finally:
            control.publish(String(data="advertise"))
            control.unregister()

    def test_hung_node_does_not_stall_the_map(self):
        # a "node" whose XML-RPC port accepts connections and never answers, on machine robotc
        hung = socket.socket()
        hung.bind(("127.0.0.3", 0))
        hung.listen(8)
        uri = f"http://127.0.0.3:{hung.getsockname()[1]}/"
        master = xmlrpc.client.ServerProxy(rosgraph.get_master_uri())
        code, msg, _ = master.registerPublisher("/hung_camera", "/chatter", "std_msgs/String", uri)
        self.assertEqual(code, 1, msg)
        try:
            start = time.monotonic()
            links = by_pair(self.call())
            took = time.monotonic() - start
            self.assertLess(took, 5.0, "one hung node must cost at most a call timeout")
            self.assertIn(("/chatter", "/camera", "/viewer"), links)
            dead = links[("/chatter", "/hung_camera", "/viewer")]
            self.assertEqual((dead.publisher_host, dead.path), ("robotc", "unknown"))
            self.assertTrue(math.isnan(dead.bytes_per_second))
        finally:
            master.unregisterPublisher("/hung_camera", "/chatter", uri)
            hung.close()


if __name__ == "__main__":
    rospy.init_node("topic_links_check", anonymous=True)
    rostest.rosrun("overlay_manager", "topic_links_check", TopicLinks, sys.argv)
