"""What the mobility benchmark measures per event (overlay_manager.lab.bench.mobility_report)."""
from __future__ import annotations

import unittest

from overlay_manager.lab.bench.mobility_report import (
    back_after,
    connections_before_after,
    first_after,
    gap_end_after,
    gap_from_list,
    longest_gap_after,
    markdown,
    peer_is,
    ping_reply_times,
    summarise,
)


def stream(start: float, end: float, hz: float = 30.0):
    n = int((end - start) * hz)
    return [start + i / hz for i in range(n)]


class GapTest(unittest.TestCase):
    def test_the_gap_the_action_falls_into_counts(self) -> None:
        times = stream(0, 10) + stream(16.5, 20)  # stopped at 10, back at 16.5
        self.assertAlmostEqual(longest_gap_after(times, 12.0, 20.0), 6.533, places=2)
        # a gap that ended before the action does not count
        self.assertLess(longest_gap_after(times, 17.0, 20.0), 0.05)

    def test_a_stream_still_stopped_at_the_end_counts_up_to_it(self) -> None:
        self.assertAlmostEqual(longest_gap_after(stream(0, 10), 5.0, 30.0), 20.033, places=2)

    def test_nothing_before_the_action(self) -> None:
        self.assertIsNone(longest_gap_after(stream(6, 10), 5.0, 10.0))

    def test_echo_gaps(self) -> None:
        gaps = [[1.0, 0.2], [10.0, 6.6], [30.0, 0.5]]
        self.assertEqual(gap_from_list(gaps, 11.0, 25.0), 6.6)
        self.assertEqual(gap_from_list(gaps, 20.0, 25.0), 0.0)
        self.assertEqual(gap_end_after(gaps, 11.0, 25.0), 5.6)
        self.assertIsNone(gap_end_after(gaps, 11.0, 15.0))
        self.assertEqual(gap_end_after([], 11.0, 15.0), 0.0)

    def test_back_after(self) -> None:
        times = stream(0, 10) + stream(14, 30)
        self.assertEqual(back_after(times, 9.0, 30.0), 5.0)
        self.assertEqual(back_after(stream(0, 30), 9.0, 30.0), 0.0)
        self.assertIsNone(back_after(stream(0, 10), 9.0, 30.0))


class PeersTest(unittest.TestCase):
    EVENTS = [
        {"t": 1.0, "ev": "peers", "node": "/lap/node", "paths": {"r1": ["direct", 0.5, "10.231.0.10:41641"]}},
        {"t": 5.0, "ev": "peers", "node": "/lap/node", "paths": {"r1": ["derp", 1.0, "fleet"]}},
        {"t": 9.0, "ev": "peers", "node": "/lap/node", "paths": {"r1": ["direct", 0.5, "10.231.0.11:3000"]}},
    ]

    def test_path_and_endpoint(self) -> None:
        pred = peer_is("/lap/node", "r1", "direct", "10.231.0.11")
        self.assertEqual(first_after(self.EVENTS, 0.0, pred)["t"], 9.0)
        self.assertEqual(first_after(self.EVENTS, 2.0, peer_is("/lap/node", "r1", "derp"))["t"], 5.0)
        self.assertIsNone(first_after(self.EVENTS, 0.0, peer_is("/other", "r1", "direct")))
        self.assertIsNone(first_after(self.EVENTS, 0.0, peer_is("/lap/node", "r2", "direct")))

    def test_connections(self) -> None:
        a = [[3, "/cam", "i", "http://r1:1234/"]]
        b = [[7, "/cam", "i", "http://r1:1234/"]]
        evs = [{"t": 1.0, "ev": "conns", "connections": a}, {"t": 8.0, "ev": "conns", "connections": b}]
        self.assertTrue(connections_before_after(evs, 2.0, 7.0))
        self.assertFalse(connections_before_after(evs, 2.0, 9.0))
        self.assertIsNone(connections_before_after(evs, 0.5, 9.0))


class SummaryTest(unittest.TestCase):
    def test_percentiles_missing_and_table(self) -> None:
        runs = [{"twist_gap_s": g, "camera_gap_s": g + 0.2, "peers_s": None if g > 6 else g - 1,
                 "same_connections": True} for g in (6.5, 6.6, 6.9)]
        runs.append({"error": "boom", "same_connections": False})
        s = summarise(runs)
        self.assertEqual(s["runs"], 4)
        self.assertEqual(s["twist_gap_s"]["max"], 6.9)
        self.assertEqual(s["twist_gap_s"]["missing"], 1)
        self.assertEqual(s["peers_s"]["missing"], 4)
        self.assertEqual(s["same_connections"], "3/4")
        self.assertEqual(s["errors"], ["boom"])
        table = markdown({"direct-derp": s})
        self.assertIn("| direct-derp | 4 | 6.6 / 6.87 / 6.9 (1 missing) |", table)


class PingTest(unittest.TestCase):
    def test_replies_become_monotonic_times_and_the_rest_is_skipped(self) -> None:
        lines = [
            "PING 100.64.0.2 (100.64.0.2) 56(84) bytes of data.",
            "[1764300000.100000] 64 bytes from 100.64.0.2: icmp_seq=1 ttl=64 time=2.10 ms",
            "[1764300000.110000] no answer yet for icmp_seq=2",
            "[1764300001.250000] 64 bytes from 100.64.0.2: icmp_seq=3 ttl=64 time=1.90 ms",
            "--- 100.64.0.2 ping statistics ---",
        ]
        t = ping_reply_times(lines, 1764300000.0 - 50.0)
        self.assertEqual(len(t), 2)
        self.assertAlmostEqual(t[0], 50.1, places=6)
        self.assertAlmostEqual(longest_gap_after(t, 50.5, 52.0), 1.15, places=6)


if __name__ == "__main__":
    unittest.main()
