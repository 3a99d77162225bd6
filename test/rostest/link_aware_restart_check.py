#!/usr/bin/python3
"""rostest: the standalone republisher (link_aware_encoder) keeps no stale settings across a restart
against the same master (see link_aware_restart.test).

It starts the node with the shared ~tiers false and ~budget_kbps_derp 300, kills it (SIGKILL, as a
crash: no clean-up at exit), changes the shared parameters (~tiers removed, so the default, true,
applies; ~budget_kbps_derp 400; ~max_rate 7) and starts it again. The second run must publish the
full tiers, the streams' namespaces must hold the new shared values (also max_rate, which the
JPEG stream's dynamic_reconfigure server wrote there as its default in the first run), and the
user's ~link_aware/budget_kbps_derp (700, set in the launch file) must be kept.
"""
import os
import signal
import subprocess
import sys
import time
import unittest
from typing import List, Optional

import rosgraph
import roslib.packages
import rospy
import rostest
from link_aware_common import wait_for

NODE = "/restart_encoder"
IMAGE = "/restart/image"
JPEG_NS, H264_NS = NODE + "/link_aware", NODE + "/link_aware_h264"
START_TIMEOUT_S = 15.0


def publishers(topic: str) -> List[str]:
    """Nodes the master lists as publishers of topic."""
    pubs, _, _ = rosgraph.Master("/link_aware_restart").getSystemState()
    return next((nodes for name, nodes in pubs if name == topic), [])


def param(name: str) -> Optional[object]:
    """The parameter's value, None when it is not set."""
    return rospy.get_param(name, None)


class LinkAwareRestart(unittest.TestCase):
    def setUp(self):
        found = roslib.packages.find_node("overlay_manager", "link_aware_encoder")
        self.assertTrue(found, "link_aware_encoder not found in the package (is the workspace built?)")
        self.exe = found[0]
        self.proc: Optional[subprocess.Popen] = None

    def tearDown(self):
        self.kill()

    def start(self) -> None:
        self.proc = subprocess.Popen([self.exe, "__name:=" + NODE.lstrip("/"), "image:=" + IMAGE],
                                     env=dict(os.environ))

    def kill(self) -> None:
        """SIGKILL by pid (a crash: the node cleans nothing up), then reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def test_restart_follows_shared_params(self):
        self.start()
        # both streams started: the H.264 stream's reconfigure server (the last thing started) wrote its values
        wait_for(H264_NS + "/max_rate written by the H.264 stream's reconfigure server",
                 lambda: param(H264_NS + "/max_rate") is not None, START_TIMEOUT_S)
        # and remembered what it wrote (after its server's writes: the kill below must not fall between
        # them, as a crash at that moment would leave the server's values unremembered). A node
        # that remembers nothing gets 3 s, then the checks below show what it leaves behind.
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and "max_rate" not in (param(H264_NS + "/inherited_params") or {}):
            time.sleep(0.05)
        wait_for(IMAGE + "/link_aware advertised by " + NODE,
                 lambda: NODE in publishers(IMAGE + "/link_aware"), START_TIMEOUT_S)
        self.assertEqual(publishers(IMAGE + "/link_aware/full"), [], "first run: ~tiers false, no full tier")
        self.assertIs(param(H264_NS + "/tiers"), False)
        self.assertEqual(param(JPEG_NS + "/budget_kbps_derp"), 700.0, "the user's per-stream value")
        self.assertEqual(param(H264_NS + "/budget_kbps_derp"), 300.0)
        first_max_rate = param(JPEG_NS + "/max_rate")
        self.assertIsNotNone(first_max_rate, "the JPEG stream's reconfigure server writes its max_rate")
        self.assertNotEqual(first_max_rate, 7.0)

        self.kill()
        rospy.delete_param(NODE + "/tiers")
        rospy.set_param(NODE + "/budget_kbps_derp", 400.0)
        rospy.set_param(NODE + "/max_rate", 7.0)
        self.start()

        for topic in (IMAGE + "/link_aware/full", IMAGE + "/link_aware_h264/full"):
            wait_for(topic + " advertised by the restarted node (~tiers removed: default true)",
                     lambda t=topic: NODE in publishers(t), START_TIMEOUT_S)
        # the reconfigure servers write the settings the streams use back into their namespaces
        wait_for(f"{JPEG_NS}/max_rate = the new shared ~max_rate 7 (was {first_max_rate!r})",
                 lambda: param(JPEG_NS + "/max_rate") == 7.0, START_TIMEOUT_S)
        wait_for(H264_NS + "/max_rate = 7", lambda: param(H264_NS + "/max_rate") == 7.0, START_TIMEOUT_S)
        self.assertEqual(param(H264_NS + "/budget_kbps_derp"), 400.0, "the copy follows the shared value")
        self.assertEqual(param(JPEG_NS + "/budget_kbps_derp"), 700.0, "the user's per-stream value is kept")
        self.assertIsNone(param(H264_NS + "/tiers"), "the copy of a shared key that is gone is removed")


if __name__ == "__main__":
    rospy.init_node("link_aware_restart", anonymous=True)
    rostest.rosrun("overlay_manager", "link_aware_restart", LinkAwareRestart, sys.argv)
