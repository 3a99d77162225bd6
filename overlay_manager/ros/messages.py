"""The node's ROS messages, built from the monitor's immutable values (overlay-report thread).

What changes between two reports at 500 peers is a handful of peers (the ones carrying traffic:
byte counters, handshake times); the others are the same PeerState objects as in the last report
(core.peers.SnapshotBuilder). A peer's ``Peer`` message and its bytes, and its
``DiagnosticStatus`` and bytes, are built once per PeerState and kept with it
(PeerState.derived), and written with wire.py; only the entries about this machine are built and
serialized for every report.
"""

from __future__ import annotations

import io
import math
from typing import Any, List, Optional, Sequence, Tuple

import rospy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from overlay_manager.core.json_fields import TIME_MAX, clamp_uint64
from overlay_manager.core.mobility import Explanation, actual_home
from overlay_manager.core.peers import PathChangeEvent, PeerState
from overlay_manager.monitor.diagnose import DiagnosticParts, peer_diagnostic
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.monitor.readings import ERROR, OK, Diagnostic, Freshness, Reading
from overlay_manager.msg import NatSummary, OverlayStatus, PathChange, Peer, PeerList
from overlay_manager.ros.wire import cached_tail_class, to_bytes
from overlay_manager.system.workers import WorkerHealth
from overlay_manager.tailscaled.derper import derper_summary
from overlay_manager.tailscaled.relay import relay_summary

CachedPeerList = cached_tail_class(PeerList, "peers")
"""PeerList whose peers are written from bytes serialized once per peer (same type on the wire)."""
CachedDiagnosticArray = cached_tail_class(DiagnosticArray, "status")
"""DiagnosticArray whose entries are written from bytes serialized once per entry."""


def ros_time(posix_s: float) -> rospy.Time:
    """POSIX seconds -> rospy.Time; 0 (unknown) outside ROS time's range or not finite."""
    if not (isinstance(posix_s, (int, float)) and math.isfinite(posix_s) and 0 < posix_s <= TIME_MAX):
        return rospy.Time(0)
    return rospy.Time.from_sec(posix_s)


def peer_msg(p: Optional[PeerState]) -> Peer:
    """PeerState -> overlay_manager/Peer (counters clamped to uint64, bad times -> 0)."""
    m = Peer()
    if p is None:
        m.path = Peer.PATH_UNKNOWN
        m.latency_ms = math.nan
        return m
    m.name, m.dns_name, m.addresses = p.name, p.dns_name, list(p.addresses)
    m.online, m.active, m.path = p.online, p.active, p.path
    m.endpoint, m.relay_region, m.latency_ms = p.endpoint, p.relay_region, p.latency_ms
    m.last_handshake, m.last_seen = ros_time(p.last_handshake), ros_time(p.last_seen)
    m.rx_bytes, m.tx_bytes = clamp_uint64(p.rx_bytes), clamp_uint64(p.tx_bytes)
    m.tags, m.os = list(p.tags), p.os
    m.peer_relay, m.relay_host, m.relay_vni = p.peer_relay, p.relay_host, p.relay_vni
    m.derp_region = p.derp_region
    return m


def path_change_msg(stamp: rospy.Time, ev: PathChangeEvent, why: Optional[Explanation] = None) -> PathChange:
    """One ~path_changes message: ev's peer and its old and new path, stamped when it was read,
    with why it changed and when the traffic stopped and resumed where the node knows it."""
    m = PathChange()
    if why is not None:
        m.cause, m.cause_detail = why.cause, why.detail
        m.traffic_stopped, m.traffic_resumed = ros_time(why.stopped), ros_time(why.resumed)
    m.header.stamp = stamp
    m.peer, m.dns_name = ev.peer.name, ev.peer.dns_name
    m.old_path, m.new_path = ev.old_path, ev.new_path
    m.endpoint, m.relay_region = ev.peer.endpoint, ev.peer.relay_region
    m.relay_vni = ev.peer.relay_vni
    m.derp_region = ev.peer.derp_region
    return m


def peer_wire(p: PeerState) -> Tuple[Peer, bytes]:
    """A peer's Peer message and its bytes (kept with the peer: PeerState.derived)."""
    m = peer_msg(p)
    return m, to_bytes(m)


def status_key(st: OverlayStatus) -> Optional[bytes]:
    """The whole message serialized, except header.stamp and status_age (which change every
    time): equal keys mean nothing worth publishing at once changed. None when it cannot be
    serialized (the publish will say why)."""
    saved = st.header.stamp, st.status_age
    st.header.stamp, st.status_age = rospy.Time(0), 0.0
    buf = io.BytesIO()
    try:
        st.serialize(buf)
    except Exception:  # noqa: BLE001 - reported by the publish that follows
        return None
    finally:
        st.header.stamp, st.status_age = saved
    return buf.getvalue()


class ReportMessages:
    """Builds ~peers, ~status and /diagnostics for one node; used by one thread (overlay-report).

    Args:
        monitor: the node's logic (read only: its current reading, NAT, relay and ROS env).
        node_name: this node's name without the leading slash (prefix of diagnostic names).
    """

    def __init__(self, monitor: OverlayMonitor, node_name: str) -> None:
        self.m = monitor
        self.cfg = monitor.cfg
        self.node_name = node_name
        self._peer_diag = self._peer_diag_wire  # one object: the key of what each peer keeps

    def peer_list(self, reading: Reading, fresh: Freshness, now: rospy.Time) -> PeerList:
        """~peers: stamp = when tailscaled last answered (now if never), stale as in ~status."""
        snap = reading.snapshot
        pl = CachedPeerList()
        pl.header.stamp = ros_time(reading.ok_wall) if reading.ok_wall > 0 else now
        pl.stale = fresh.stale
        pl.self_peer = peer_msg(snap.self_peer if snap else None)
        peers = snap.peers if snap else ()
        try:
            built: List[Tuple[Any, bytes]] = [p.derived(peer_wire) for p in peers]
        except Exception:  # noqa: BLE001 - a peer that cannot be serialized: the publish says why
            pl.peers = [peer_msg(p) for p in peers]
        else:
            pl.peers = [m for m, _ in built]
            pl.set_tail(len(built), b"".join(b for _, b in built))
        return pl

    def status(self, reading: Reading, fresh: Freshness, health: Sequence[WorkerHealth],
               publish_faults: Sequence[str]) -> OverlayStatus:
        """Current OverlayStatus (header.stamp left 0 for the caller)."""
        snap = reading.snapshot
        st = OverlayStatus()
        st.tailscaled_reachable = not fresh.stale
        st.login_server = self.cfg.login_server
        env = self.m.ros_env()
        st.ros_master_uri, st.ros_hostname = env.ros_master_uri, env.ros_hostname
        if snap:
            st.backend_state = snap.backend_state
            st.enrolled = snap.backend_state == "Running"
            st.control_reachable = snap.control_reachable
            st.health = list(snap.health)
            st.tailscale_version = snap.version
            if snap.self_peer:
                st.self_name, st.self_dns_name = snap.self_peer.name, snap.self_peer.dns_name
                st.self_addresses = list(snap.self_peer.addresses)
        if fresh.stale:
            st.backend_state, st.enrolled, st.control_reachable = "", False, False
            st.health = [fresh.error] if fresh.error else []
        st.stale, st.error = fresh.stale, fresh.error
        st.status_age = fresh.age_s
        st.faults = [h.message for h in health if h.level > OK] + sorted(publish_faults)
        nat = self.m.nat
        me = snap.self_peer if snap else None
        nat = actual_home(nat, me.relay_region if me is not None and not fresh.stale else "", self.m.region_names)
        st.nat = NatSummary(known=nat.known, udp=nat.udp, hard_nat=nat.hard_nat,
                            hard_nat_known=nat.hard_nat_known, preferred_derp=nat.preferred_derp,
                            preferred_derp_latency_ms=nat.preferred_derp_latency_ms, summary=nat.summary,
                            preferred_derp_name=nat.preferred_derp_name,
                            region_codes=[c for c, _, _ in nat.region_latency],
                            region_names=[n for _, n, _ in nat.region_latency],
                            region_latency_ms=[ms for _, _, ms in nat.region_latency])
        relay = self.m.relay_state
        st.relay_active = relay.active
        st.relay_port = relay.port if relay.port and 0 < relay.port < 65536 else 0  # uint16 (0 = off/unknown)
        st.relay_sessions = min(len(relay.sessions), 2 ** 32 - 1)
        st.relay_summary = relay_summary(self.cfg.relay, relay)[0]
        d = self.m.derper_state
        st.derper_listening = d.listening
        st.derper_region = self.cfg.derper.region if self.cfg.derper else ""
        st.derper_connections = min(d.connections, 2 ** 32 - 1)
        st.derper_home_clients = min(d.home_connections, 2 ** 32 - 1)
        st.derper_clients = min(d.clients, 2 ** 32 - 1)
        st.derper_bytes_received = min(d.bytes_received, 2 ** 64 - 1)
        st.derper_bytes_sent = min(d.bytes_sent, 2 ** 64 - 1)
        st.derper_summary = derper_summary(self.cfg.derper, d)[0]
        return st

    def _diag_status(self, d: Diagnostic) -> DiagnosticStatus:
        s = DiagnosticStatus(level=int(d.level), name=f"{self.node_name}: {d.name}", message=d.message,
                             hardware_id=self.cfg.hostname)
        s.values = [KeyValue(key=k, value=v) for k, v in d.values]
        return s

    def _diag_status_wire(self, d: Diagnostic) -> Tuple[DiagnosticStatus, bytes]:
        s = self._diag_status(d)
        return s, to_bytes(s)

    def _peer_diag_wire(self, p: PeerState, required: bool, derp_why: str) -> Tuple[DiagnosticStatus, bytes]:
        """A peer's DiagnosticStatus and bytes, from its entry (both kept with the peer)."""
        return self._diag_status_wire(p.derived(peer_diagnostic, required, derp_why))

    def diagnostics(self, now: rospy.Time, parts: DiagnosticParts, health: Sequence[WorkerHealth],
                    publish_faults: Sequence[str]) -> DiagnosticArray:
        """The monitor's entries (about this machine, then one per peer) and one for the node's own
        threads."""
        arr = CachedDiagnosticArray()
        arr.header.stamp = now
        bad = [h for h in health if h.level > OK]
        problems = [h.message for h in bad] + sorted(publish_faults)
        level = max([h.level for h in bad] + ([ERROR] if publish_faults else []) + [OK])
        threads = DiagnosticStatus(level=int(level), name=f"{self.node_name}: node threads",
                                   message="; ".join(problems) if problems else f"{len(health)} threads running",
                                   hardware_id=self.cfg.hostname)
        threads.values = [KeyValue(key=h.name, value=h.message or f"ok, {h.cycles} cycles") for h in health]
        try:
            built = [self._diag_status_wire(d) for d in parts.head]
            why, make = parts.derp_why, self._peer_diag
            built.extend(p.derived(make, parts.is_required(p), why) for p in parts.peers)
            built.append((threads, to_bytes(threads)))
        except Exception:  # noqa: BLE001 - an entry that cannot be serialized: the publish says why
            arr.status = [self._diag_status(d) for d in parts.entries()] + [threads]
            return arr
        arr.status = [m for m, _ in built]
        arr.set_tail(len(built), b"".join(b for _, b in built))
        return arr

