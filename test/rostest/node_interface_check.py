#!/usr/bin/python3
"""rostest: the real node's topics, services and diagnostics (tailscaled faked with recorded JSON)."""
import math
import sys
import unittest

import rospy
import rostest
from diagnostic_msgs.msg import DiagnosticArray

from overlay_manager.msg import OverlayStatus, Peer, PeerList
from overlay_manager.srv import GetPeer, GetRosEnv, ListPeers, MeasureLink, PingPeer, Preflight, WaitForPeer
from overlay_manager.system import waiting

NS = "/overlay_manager/"


def wait_for(what, predicate, timeout=20.0):
    """overlay_manager.system.waiting.wait_for; a timeout is a test failure (AssertionError)."""
    return waiting.wait_for(what, predicate, timeout, error=AssertionError)


class NodeInterface(unittest.TestCase):
    def setUp(self):
        self.msgs = {}
        for topic, typ in (("peers", PeerList), ("status", OverlayStatus)):
            rospy.Subscriber(NS + topic, typ, lambda m, t=topic: self.msgs.__setitem__(t, m))
        rospy.Subscriber("/diagnostics", DiagnosticArray, lambda m: self.msgs.__setitem__("diag", m))
        for s in ("list_peers", "get_peer", "ping_peer", "wait_for_peer", "measure_link", "get_ros_env", "preflight"):
            rospy.wait_for_service(NS + s, timeout=20)

    def test_topics(self):
        peers = wait_for("~peers", lambda: self.msgs.get("peers"))
        self.assertEqual(peers.self_peer.dns_name, "robota.fleet.internal")
        self.assertEqual([p.name for p in peers.peers], ["robotb"])
        self.assertEqual(peers.peers[0].path, Peer.PATH_DIRECT)
        self.assertEqual(peers.peers[0].endpoint, "10.250.0.3:41641")
        status = wait_for("~status", lambda: self.msgs.get("status"))
        self.assertTrue(status.enrolled and status.control_reachable)
        self.assertEqual(status.ros_hostname, "robota.fleet.internal")
        self.assertEqual(status.ros_master_uri, "http://robota.fleet.internal:11311")
        def diag_with_peer():
            d = self.msgs.get("diag")
            return d if d and len(d.status) >= 2 else None

        diag = wait_for("/diagnostics with a peer entry", diag_with_peer)
        names = [s.name for s in diag.status]
        self.assertIn("overlay_manager: peer robotb", names)

    def test_services(self):
        lp = rospy.ServiceProxy(NS + "list_peers", ListPeers)
        self.assertEqual([p.name for p in lp(False, "", "direct").peers], ["robotb"])
        self.assertEqual(lp(False, "", "derp").peers, [])
        gp = rospy.ServiceProxy(NS + "get_peer", GetPeer)
        self.assertTrue(gp("100.64.0.2").found)
        miss = gp("ghost")
        self.assertFalse(miss.found)
        self.assertIn("ghost", miss.message)
        pp = rospy.ServiceProxy(NS + "ping_peer", PingPeer)(name="robotb", count=2, timeout=1.0)
        self.assertTrue(pp.ok, pp.message)
        self.assertEqual(pp.path, "direct")
        self.assertGreater(pp.latency_mean_ms, 0)
        w = rospy.ServiceProxy(NS + "wait_for_peer", WaitForPeer)(name="robotb", timeout=3.0, require_direct=True)
        self.assertTrue(w.ok, w.message)
        env = rospy.ServiceProxy(NS + "get_ros_env", GetRosEnv)()
        self.assertIn("export ROS_HOSTNAME=robota.fleet.internal", env.shell)
        ml = rospy.ServiceProxy(NS + "measure_link", MeasureLink)(peer="ghost", duration=1, udp_bitrate=1)
        self.assertFalse(ml.ok)
        self.assertIn("unknown peer", ml.message)
        pf = rospy.ServiceProxy(NS + "preflight", Preflight)()
        self.assertFalse(pf.ok)  # nothing resolves robota.fleet.internal here
        self.assertTrue(any(c.name == "ros_hostname_resolves" and not c.ok and c.hint for c in pf.checks))
        # latency learnt from pings appears in ~peers
        wait_for("latency in ~peers",
                 lambda: self.msgs.get("peers") and not math.isnan(self.msgs["peers"].peers[0].latency_ms))

    def test_link_topic_carries_the_peer_by_name(self):
        """~links/robotb: robotb's Peer message on a topic named after it once the node has its
        latency (node.link_topics "watched"), so `rqt_plot /overlay_manager/links/robotb/latency_ms` works."""
        got = []
        rospy.Subscriber(NS + "links/robotb", Peer, got.append)
        pp = rospy.ServiceProxy(NS + "ping_peer", PingPeer)(name="robotb", count=1, timeout=1.0)
        self.assertTrue(pp.ok, pp.message)
        m = wait_for("~links/robotb with a latency",
                     lambda: next((m for m in reversed(got) if not math.isnan(m.latency_ms)), None))
        self.assertEqual((m.name, m.path, m.endpoint), ("robotb", Peer.PATH_DIRECT, "10.250.0.3:41641"))
        self.assertGreater(m.latency_ms, 0)
        self.assertEqual(dict(rospy.get_published_topics())[NS + "links/robotb"], "overlay_manager/Peer")


if __name__ == "__main__":
    rospy.init_node("test_node_interface")
    rostest.rosrun("overlay_manager", "node_interface", NodeInterface, sys.argv)
