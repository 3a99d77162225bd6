"""Pure dashboard logic: formatting (view/text.py) and model state (view/state.py). No Qt, no ROS."""

from __future__ import annotations

import math
import unittest
from types import SimpleNamespace as NS

from overlay_manager.view import text as fmt
from overlay_manager.view.state import HistoryStore, nodes_from_topics, normalise_node

NAN = math.nan


class PathTest(unittest.TestCase):
    def test_every_path_has_distinct_colour_and_tint(self) -> None:
        paths = ["direct", "peer-relay", "derp", "idle", "offline", "unknown", "self"]
        self.assertEqual(len({fmt.path_colour(p) for p in paths}), len(paths))
        for p in paths:
            self.assertRegex(fmt.path_colour(p), r"^#[0-9a-f]{6}$")
            self.assertRegex(fmt.path_tint(p), r"^#[0-9a-f]{6}$")
            self.assertNotIn("unrecognised", fmt.path_description(p))

    def test_unrecognised_path_falls_back(self) -> None:
        self.assertEqual(fmt.path_colour("warp"), fmt.path_colour("unknown"))
        self.assertIn("unrecognised", fmt.path_description("warp"))

    def test_where(self) -> None:
        self.assertEqual(fmt.path_where("direct", "192.0.2.1:41641", "fra"), "192.0.2.1:41641")
        self.assertEqual(fmt.path_where("peer-relay", "100.64.0.9:7777", "fra"), "100.64.0.9:7777")
        self.assertEqual(fmt.path_where("derp", "", "fra"), "DERP fra")
        self.assertEqual(fmt.path_where("derp", "", ""), "DERP")
        self.assertEqual(fmt.path_where("idle", "", "fra"), "(home DERP fra)")
        self.assertEqual(fmt.path_where("offline", "", ""), "")
        self.assertEqual(fmt.path_where("direct", "", ""), "-")


class NumberTest(unittest.TestCase):
    def test_latency(self) -> None:
        self.assertEqual(fmt.format_latency(0.854), "0.85 ms")
        self.assertEqual(fmt.format_latency(14.23), "14.2 ms")
        self.assertEqual(fmt.format_latency(250.4), "250 ms")
        self.assertEqual(fmt.format_latency(NAN), "-")
        self.assertEqual(fmt.format_latency(None), "-")

    def test_bitrate_units(self) -> None:
        self.assertEqual(fmt.format_bitrate(0), "0 bit/s")
        self.assertEqual(fmt.format_bitrate(950), "950 bit/s")
        self.assertEqual(fmt.format_bitrate(12_345), "12.3 kbit/s")
        self.assertEqual(fmt.format_bitrate(1.7e9), "1.70 Gbit/s")
        self.assertEqual(fmt.format_bitrate(110e6), "110.0 Mbit/s")
        self.assertEqual(fmt.format_bitrate(-5), "0 bit/s")
        self.assertEqual(fmt.format_bitrate(NAN), "-")

    def test_byte_rate_shown_in_bits(self) -> None:
        self.assertEqual(fmt.format_rate(2_000_000), "16.0 Mbit/s")
        self.assertEqual(fmt.format_rate(None), "-")
        self.assertEqual(fmt.format_mbps(1700.0), "1.70 Gbit/s")

    def test_rate_from_counters(self) -> None:
        self.assertEqual(fmt.rate_from_counters(1000, 10.0, 3000, 12.0), 1000.0)
        self.assertEqual(fmt.rate_from_counters(1000, 10.0, 1000, 11.0), 0.0)
        self.assertIsNone(fmt.rate_from_counters(1000, 10.0, 3000, 10.0), "no interval")
        self.assertIsNone(fmt.rate_from_counters(1000, 10.0, 3000, 9.0), "time went backwards")
        self.assertIsNone(fmt.rate_from_counters(5000, 10.0, 100, 11.0), "tailscaled restarted")

    def test_age(self) -> None:
        now = 1_000_000.0
        self.assertEqual(fmt.format_age(0, now), "never")
        self.assertEqual(fmt.format_age(now + 3, now), "just now")
        self.assertEqual(fmt.format_age(now - 0.5, now), "just now")
        self.assertEqual(fmt.format_age(now - 42.9, now), "42 s ago")
        self.assertEqual(fmt.format_age(now - 180, now), "3 min ago")
        self.assertEqual(fmt.format_age(now - 7200, now), "2 h ago")
        self.assertEqual(fmt.format_age(now - 7500, now), "2 h 5 min ago")
        self.assertEqual(fmt.format_age(now - 3 * 86400 - 5, now), "3 d ago")

    def test_clock(self) -> None:
        self.assertEqual(fmt.format_clock(0), "--:--:--")
        self.assertRegex(fmt.format_clock(1_700_000_000), r"^\d\d:\d\d:\d\d$")


class NatTest(unittest.TestCase):
    def test_unknown(self) -> None:
        v = fmt.nat_summary(False, False, False, False)
        self.assertEqual(v.level, fmt.LEVEL_UNKNOWN)
        self.assertIn("not checked yet", v.text)

    def test_udp_blocked(self) -> None:
        v = fmt.nat_summary(True, False, False, False, "lab", 0.4)
        self.assertEqual(v.text, "UDP blocked: every link will be relayed through DERP; home DERP lab (0.40 ms)")
        self.assertEqual(v.level, fmt.LEVEL_ERROR)

    def test_hard_nat(self) -> None:
        v = fmt.nat_summary(True, True, True, True)
        self.assertTrue(v.text.startswith("hard NAT (mapping varies by destination)"))
        self.assertIn("will be relayed", v.text)
        self.assertEqual(v.level, fmt.LEVEL_WARN)

    def test_easy_nat(self) -> None:
        v = fmt.nat_summary(True, True, False, True, "fra", NAN)
        self.assertEqual(v.text, "easy NAT (endpoint-independent mapping): direct links are possible; home DERP fra")
        self.assertEqual(v.level, fmt.LEVEL_OK)

    def test_mapping_unknown(self) -> None:
        self.assertEqual(fmt.nat_summary(True, True, False, False).level, fmt.LEVEL_UNKNOWN)

    def test_from_message(self) -> None:
        nat = NS(known=True, udp=False, hard_nat=False, hard_nat_known=False, preferred_derp="",
                 preferred_derp_latency_ms=NAN)
        self.assertTrue(fmt.nat_verdict(nat).text.startswith("UDP blocked"))

    def test_failed_check_is_not_called_not_checked(self) -> None:
        nat = NS(known=False, udp=False, hard_nat=False, hard_nat_known=False, preferred_derp="",
                 preferred_derp_latency_ms=NAN, summary="NAT check failed: `tailscale netcheck` gave no report")
        v = fmt.nat_verdict(nat)
        self.assertEqual(v.text, "NAT check failed: `tailscale netcheck` gave no report")
        self.assertEqual(v.level, fmt.LEVEL_WARN)
        self.assertTrue(fmt.nat_verdict(NS(**{**vars(nat), "summary": "NAT not checked yet"})).text
                        .startswith("NAT not checked yet"))


def status(**kw: object) -> NS:
    base = dict(tailscaled_reachable=True, enrolled=True, backend_state="Running",
                control_reachable=True, health=[])
    base.update(kw)
    return NS(**base)


class OverlayVerdictTest(unittest.TestCase):
    def test_levels(self) -> None:
        self.assertEqual(fmt.overlay_verdict(status()).level, fmt.LEVEL_OK)
        v = fmt.overlay_verdict(status(tailscaled_reachable=False))
        self.assertEqual((v.level, v.text.split(":")[0]), (fmt.LEVEL_ERROR, "tailscaled not reachable"))
        v = fmt.overlay_verdict(status(enrolled=False, backend_state="NeedsLogin"))
        self.assertEqual(v.text, "not enrolled (NeedsLogin)")
        self.assertEqual(fmt.overlay_verdict(status(control_reachable=False)).level, fmt.LEVEL_WARN)
        self.assertIn("1 health warning", fmt.overlay_verdict(status(health=["x"])).text)

    def test_peer_counts(self) -> None:
        peers = [NS(path="direct"), NS(path="derp"), NS(path="direct"), NS(path="offline")]
        self.assertEqual(fmt.peer_counts(peers), "4 peers: 2 direct, 1 derp, 1 offline")
        self.assertEqual(fmt.peer_counts([]), "0 peers")
        self.assertEqual(fmt.peer_counts([NS(path="idle")]), "1 peer: 1 idle")


class ResultTextTest(unittest.TestCase):
    def test_ping(self) -> None:
        ok = NS(ok=True, latency_min_ms=1.01, latency_mean_ms=1.23, latency_max_ms=1.52, received=3,
                path="direct", endpoint="192.0.2.1:41641", message="")
        v = fmt.ping_text("robot1", ok)
        self.assertEqual(v.text, "ping robot1: 3 answered, 1.23 ms mean (min 1.01 ms, max 1.52 ms), "
                                 "path direct via 192.0.2.1:41641")
        self.assertEqual(v.level, fmt.LEVEL_OK)
        derp = NS(**{**ok.__dict__, "path": "derp", "endpoint": "fra"})
        self.assertEqual(fmt.ping_text("robot1", derp).level, fmt.LEVEL_WARN)
        bad = NS(**{**ok.__dict__, "ok": False, "message": "timeout"})
        self.assertEqual(fmt.ping_text("robot1", bad).text, "ping robot1: failed: timeout")

    def test_measure(self) -> None:
        r = NS(ok=True, tcp_throughput_mbps=110.0, udp_jitter_ms=0.3, udp_loss_percent=1.25,
               rtt_min_ms=5.0, rtt_mean_ms=6.0, rtt_max_ms=9.0, path="derp", message="")
        v = fmt.measure_text("robot2", r)
        self.assertEqual(v.text, "measure robot2: TCP 110.0 Mbit/s; UDP jitter 0.30 ms, loss 1.2 %; "
                                 "RTT 6.00 ms (min 5.00 ms, max 9.00 ms); path derp")
        self.assertEqual(v.level, fmt.LEVEL_WARN)
        r2 = NS(**{**r.__dict__, "udp_loss_percent": NAN})
        self.assertIn("loss -", fmt.measure_text("robot2", r2).text)
        bad = NS(**{**r.__dict__, "ok": False, "message": "iperf3: connection refused"})
        self.assertEqual(fmt.measure_text("robot2", bad).level, fmt.LEVEL_ERROR)

    def test_wait(self) -> None:
        peer = NS(path="direct", endpoint="192.0.2.1:41641", relay_region="fra")
        v = fmt.wait_text("robot1", NS(ok=True, peer=peer, waited=2.5, message=""))
        self.assertEqual(v.text, "wait for robot1 direct: direct after 2.5 s (192.0.2.1:41641)")
        v = fmt.wait_text("robot1", NS(ok=False, peer=NS(path="derp", endpoint="", relay_region="fra"),
                                       waited=30.0, message="timeout"))
        self.assertEqual(v.text, "wait for robot1 direct: not direct after 30.0 s: timeout (path now derp)")
        self.assertEqual(v.level, fmt.LEVEL_ERROR)

    def test_path_change_line(self) -> None:
        change = NS(header=NS(stamp=NS(to_sec=lambda: 0.0)), peer="robot2", old_path="derp",
                    new_path="direct", endpoint="192.0.2.11:41641", relay_region="lab")
        self.assertEqual(fmt.path_change_text(change), "--:--:--  robot2  derp -> direct  192.0.2.11:41641")
        first = NS(**{**change.__dict__, "old_path": "", "new_path": "idle", "endpoint": ""})
        self.assertEqual(fmt.path_change_text(first), "--:--:--  robot2  new -> idle  (home DERP lab)")
        stall = NS(**{**change.__dict__, "old_path": "direct", "new_path": "derp", "endpoint": "", "cause": "stall",
                      "traffic_stopped": NS(to_sec=lambda: 100.0), "traffic_resumed": NS(to_sec=lambda: 100.71)})
        self.assertTrue(fmt.path_change_text(stall).endswith("[stall, traffic stopped 0.71 s]"))
        roam = NS(**{**stall.__dict__, "cause": "roam", "traffic_resumed": NS(to_sec=lambda: 0.0)})
        self.assertTrue(fmt.path_change_text(roam).endswith("[roam]"))

    def test_split_csv(self) -> None:
        self.assertEqual(fmt.split_csv("rx, tx,,"), ("rx", "tx"))
        self.assertEqual(fmt.split_csv(["rx", " "]), ("rx",))
        self.assertEqual(fmt.split_csv(None), ())
        self.assertEqual(fmt.split_csv(""), ())


class StateTest(unittest.TestCase):
    def test_nodes_from_topics(self) -> None:
        topics = [
            ("/robot1/overlay_manager/peers", "overlay_manager/PeerList"),
            ("/overlay_manager/peers", "overlay_manager/PeerList"),
            ("/overlay_manager/status", "overlay_manager/OverlayStatus"),
            ("/camera/peers", "std_msgs/String"),          # wrong type
            ("/peers", "overlay_manager/PeerList"),        # no namespace to name a node
            ("/a/overlay_manager/peer_list", "overlay_manager/PeerList"),
        ]
        self.assertEqual(nodes_from_topics(topics), ["/overlay_manager", "/robot1/overlay_manager"])
        self.assertEqual(nodes_from_topics([]), [])

    def test_normalise_node(self) -> None:
        self.assertEqual(normalise_node(" robot1/overlay_manager/ "), "/robot1/overlay_manager")
        self.assertEqual(normalise_node("/overlay_manager"), "/overlay_manager")
        self.assertEqual(normalise_node(""), "")

    def test_rates_and_history(self) -> None:
        h = HistoryStore(max_samples=3)
        self.assertEqual(h.add_counters("r1", 10.0, 1.0, 1000, 500), (None, None))
        self.assertEqual(h.add_counters("r1", 12.0, 1.5, 3000, 700), (1000.0, 100.0))
        self.assertEqual(h.add_counters("r1", 12.0, 1.5, 3000, 700), (1000.0, 100.0), "same stamp twice")
        self.assertEqual(h.rates("r1"), (1000.0, 100.0))
        self.assertEqual(len(h.samples("r1")), 2)
        self.assertEqual(h.add_counters("r1", 13.0, 2.0, 10, 10), (None, None), "counter reset")
        h.add_latency("r1", 14.0, 3.0)
        samples = h.samples("r1")
        self.assertEqual([s.t for s in samples], [12.0, 13.0, 14.0], "bounded to max_samples")
        self.assertTrue(math.isnan(samples[1].rx_bytes_per_s))
        self.assertEqual(samples[2].latency_ms, 3.0)
        h.add_latency("r1", 5.0, 9.0)  # out of order: ignored
        self.assertEqual(len(h.samples("r1")), 3)
        self.assertEqual(h.peers(), ["r1"])
        h.clear()
        self.assertEqual((h.samples("r1"), h.rates("r1")), ([], (None, None)))


if __name__ == "__main__":
    unittest.main()
