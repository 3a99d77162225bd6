#!/usr/bin/python3
"""A stand-in overlay_manager node for dashboard tests: real topics and services, made-up data.

Run as ``fake_overlay_node.py __name:=overlay_manager`` against a test roscore. It publishes
~peers (latched, 2 Hz, counters growing), ~status (latched, 2 Hz), ~topic_links (latched) and
serves ~ping_peer, ~measure_link, ~wait_for_peer and ~get_peer. Commands on stdin, one per line:

    path <peer> <new_path> [endpoint-or-region]   change a peer's path (publishes ~path_changes)
    pause                                         stop publishing ~peers/~status (a dead node)
    resume                                        publish again
    blind                                         ~status/~peers say tailscaled cannot be read (stale)
    sees                                          ~status/~peers fresh again
    quit                                          exit

It prints "ready" on stdout once everything is advertised.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Dict, Optional

import rospy

from overlay_manager.msg import (
    NatSummary,
    OverlayStatus,
    PathChange,
    Peer,
    PeerList,
    StreamSubscriber,
    TopicLink,
    TopicLinkList,
)
from overlay_manager.srv import (
    GetPeer,
    GetPeerResponse,
    MeasureLink,
    MeasureLinkResponse,
    PingPeer,
    PingPeerResponse,
    WaitForPeer,
    WaitForPeerResponse,
)

PING_MEAN_MS = 1.23


class FakeOverlayNode:
    """Holds the made-up peers and serves them."""

    def __init__(self) -> None:
        """Advertise topics and services under the private namespace."""
        now = rospy.Time.now()
        self.lock = threading.Lock()
        self.peers: Dict[str, Peer] = {
            "robot1": Peer(name="robot1", dns_name="robot1.fleet.internal", addresses=["100.64.0.2"],
                           online=True, active=True, path=Peer.PATH_DIRECT,
                           endpoint="192.0.2.10:41641", relay_region="lab", latency_ms=0.85,
                           last_handshake=now - rospy.Duration(12), tags=["tag:robot"], os="linux"),
            "robot2": Peer(name="robot2", dns_name="robot2.fleet.internal", addresses=["100.64.0.3"],
                           online=True, active=True, path=Peer.PATH_DERP, relay_region="lab",
                           latency_ms=14.2, last_handshake=now - rospy.Duration(75),
                           tags=["tag:robot"], os="linux"),
            "robot3": Peer(name="robot3", dns_name="robot3.fleet.internal", addresses=["100.64.0.4"],
                           online=False, path=Peer.PATH_OFFLINE, relay_region="lab",
                           latency_ms=math.nan, tags=["tag:robot"], os="linux"),
        }
        self.rates = {"robot1": (2_000_000, 150_000), "robot2": (120_000, 40_000), "robot3": (0, 0)}
        self.last_publish = now
        self.paused = False
        self.blind = False
        self.peers_pub = rospy.Publisher("~peers", PeerList, queue_size=1, latch=True)
        self.status_pub = rospy.Publisher("~status", OverlayStatus, queue_size=1, latch=True)
        self.changes_pub = rospy.Publisher("~path_changes", PathChange, queue_size=10)
        self.links_pub = rospy.Publisher("~topic_links", TopicLinkList, queue_size=1, latch=True)
        rospy.Service("~ping_peer", PingPeer, self.ping)
        rospy.Service("~measure_link", MeasureLink, self.measure)
        rospy.Service("~wait_for_peer", WaitForPeer, self.wait)
        rospy.Service("~get_peer", GetPeer, self.get)
        self.status = OverlayStatus(
            header=rospy.Header(stamp=now), backend_state="Running", tailscaled_reachable=True,
            enrolled=True, login_server="https://headscale.lab:8443", control_reachable=True,
            self_name="laptop1", self_dns_name="laptop1.fleet.internal",
            self_addresses=["100.64.0.1", "fd7a:115c:a1e0::1"],
            ros_master_uri="http://robot1.fleet.internal:11311",
            ros_hostname="laptop1.fleet.internal",
            nat=NatSummary(known=True, udp=True, hard_nat=False, hard_nat_known=True,
                           preferred_derp="lab", preferred_derp_latency_ms=0.4,
                           summary="easy NAT (endpoint-independent mapping)"),
            tailscale_version="1.102.5")
        self.status_pub.publish(self.status)
        self.links_pub.publish(TopicLinkList(header=rospy.Header(stamp=now), links=[
            TopicLink(topic="/robot1/camera/image_raw", type="sensor_msgs/Image",
                      publisher_node="/robot1/camera", publisher_host="robot1",
                      subscriber_node="/laptop1/viewer", subscriber_host="laptop1", local=False,
                      path=Peer.PATH_DIRECT, endpoint="192.0.2.10:41641", bytes_per_second=2_000_000.0),
            TopicLink(topic="/robot2/cmd_vel", type="geometry_msgs/Twist",
                      publisher_node="/laptop1/teleop", publisher_host="laptop1",
                      subscriber_node="/robot2/base", subscriber_host="robot2", local=False,
                      path=Peer.PATH_DERP, endpoint="lab", bytes_per_second=math.nan),
            TopicLink(topic="/robot2/points/shaped", type="overlay_manager/ShapedMessage",
                      publisher_node="/robot2/topic_shaper", publisher_host="robot2",
                      subscriber_node="/laptop1/points_unshape", subscriber_host="laptop1", local=False,
                      path=Peer.PATH_DERP, endpoint="lab", bytes_per_second=480_000.0,
                      shaping_state="/robot2/points/shaped/stream_state",
                      shaping_format="sensor_msgs/PointCloud2; zstd; decimate 1/5; 7.12:1",
                      shaping_reason="path derp",
                      shaping=StreamSubscriber(
                          node="/laptop1/points_unshape", host="laptop1", path=Peer.PATH_DERP,
                          budget_kbps=4000.0, observed_cap_kbps=math.nan, queue_delay_ms=12.0,
                          tier="fitted", wanted_tier="fitted", codec="zstd", rate_hz=1.5,
                          bitrate_kbps=3840.0)),
            TopicLink(topic="/rosout", type="rosgraph_msgs/Log", publisher_node="/laptop1/viewer",
                      publisher_host="laptop1", subscriber_node="/rosout", subscriber_host="laptop1",
                      local=True, path=Peer.PATH_SELF, bytes_per_second=100.0),
        ]))

    def publish(self, _event: object = None) -> None:
        """Publish ~peers with byte counters grown at each peer's rate."""
        with self.lock:
            if self.paused:
                return
            now = rospy.Time.now()
            dt = (now - self.last_publish).to_sec()
            self.last_publish = now
            for name, peer in self.peers.items():  # counters grow with time, as tailscaled's do
                rx, tx = self.rates[name]
                peer.rx_bytes += int(rx * dt)
                peer.tx_bytes += int(tx * dt)
            msg = PeerList(header=rospy.Header(stamp=now), peers=[self.peers[n] for n in sorted(self.peers)],
                           stale=self.blind)
            msg.self_peer = Peer(name="laptop1", dns_name="laptop1.fleet.internal", addresses=["100.64.0.1"],
                            online=True, path=Peer.PATH_SELF)
            self.peers_pub.publish(msg)
            self.status.header.stamp = now
            self.status.stale = self.blind
            self.status.status_age = 12.0 if self.blind else 0.1
            self.status.error = "tailscaled is not reachable at /run/ts.sock (no such socket)" if self.blind else ""
            self.status_pub.publish(self.status)

    def set_path(self, name: str, path: str, where: str = "") -> None:
        """Change a peer's path and announce it on ~path_changes."""
        with self.lock:
            peer = self.peers[name]
            old = peer.path
            peer.path = path
            peer.online = path != Peer.PATH_OFFLINE
            peer.endpoint = where if path in (Peer.PATH_DIRECT, Peer.PATH_PEER_RELAY) else ""
            if path == Peer.PATH_DERP and where:
                peer.relay_region = where
            change = PathChange(header=rospy.Header(stamp=rospy.Time.now()), peer=name,
                                dns_name=peer.dns_name, old_path=old, new_path=path,
                                endpoint=peer.endpoint, relay_region=peer.relay_region)
        self.changes_pub.publish(change)
        self.publish()

    def find(self, name: str) -> Optional[Peer]:
        """Peer by short name, FQDN or address."""
        for peer in self.peers.values():
            if name in (peer.name, peer.dns_name, *peer.addresses):
                return peer
        return None

    def ping(self, req: PingPeer._request_class) -> PingPeerResponse:
        """Answer with a fixed latency (1.23 ms mean) on the peer's current path."""
        peer = self.find(req.name)
        if peer is None or not peer.online:
            return PingPeerResponse(ok=False, latency_min_ms=math.nan, latency_mean_ms=math.nan,
                                    latency_max_ms=math.nan, message=f"{req.name}: no answer")
        return PingPeerResponse(ok=True, latency_min_ms=1.01, latency_mean_ms=PING_MEAN_MS,
                                latency_max_ms=1.52, received=req.count or 3, path=peer.path,
                                endpoint=peer.endpoint or peer.relay_region)

    def measure(self, req: MeasureLink._request_class) -> MeasureLinkResponse:
        """A made-up iperf3 result."""
        peer = self.find(req.peer)
        if peer is None:
            return MeasureLinkResponse(ok=False, message=f"{req.peer}: unknown peer")
        fast = peer.path == Peer.PATH_DIRECT
        return MeasureLinkResponse(ok=True, tcp_throughput_mbps=1700.0 if fast else 110.0,
                                   udp_jitter_ms=0.05, udp_loss_percent=0.0, rtt_min_ms=0.7,
                                   rtt_mean_ms=0.85, rtt_max_ms=1.0, path=peer.path)

    def wait(self, req: WaitForPeer._request_class) -> WaitForPeerResponse:
        """Immediate answer: ok when the peer is already direct."""
        peer = self.find(req.name)
        if peer is None:
            return WaitForPeerResponse(ok=False, waited=0.0, message="unknown peer")
        ok = peer.path == Peer.PATH_DIRECT or not req.require_direct
        return WaitForPeerResponse(ok=ok, peer=peer, waited=0.1,
                                   message="" if ok else f"path is {peer.path}")

    def get(self, req: GetPeer._request_class) -> GetPeerResponse:
        """Look a peer up."""
        peer = self.find(req.name)
        return GetPeerResponse(found=peer is not None, peer=peer or Peer(),
                               message="" if peer else f"{req.name}: no such peer")


def main() -> None:
    """Serve until stdin says quit or closes."""
    rospy.init_node("overlay_manager", disable_signals=True)
    node = FakeOverlayNode()
    node.publish()
    rospy.Timer(rospy.Duration(0.5), node.publish)
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] in ("blind", "sees"):
            with node.lock:
                node.blind = words[0] == "blind"
            print(f"ok {words[0]}", flush=True)
        elif words[0] in ("pause", "resume"):
            with node.lock:
                node.paused = words[0] == "pause"
            print(f"ok {words[0]}", flush=True)
        elif words[0] == "path" and len(words) >= 3:
            node.set_path(words[1], words[2], words[3] if len(words) > 3 else "")
            print(f"ok {line.strip()}", flush=True)
        else:
            print(f"error: unknown command {line.strip()!r}", flush=True)
    rospy.signal_shutdown("quit")


if __name__ == "__main__":
    main()
