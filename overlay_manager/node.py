"""The ROS node (`rosrun overlay_manager overlay_manager_node`): all ROS I/O, no decisions.

Parameters are read once at start: ~config (robot config file, required) and any node.* key of
the config as a ~private parameter of the same name (overrides the file). Then:
- enrol tailscaled if needed (never re-enrol or rename);
- poll tailscaled at node.poll_rate, publish ~peers/~status (latched, on change and at
  node.publish_rate), ~path_changes (one per change), /diagnostics;
- disco-ping watched peers every node.ping_interval seconds; netcheck every netcheck_interval;
- serve ~list_peers ~get_peer ~ping_peer ~wait_for_peer ~measure_link ~get_ros_env ~preflight;
- optionally serve iperf3 on the overlay address and keep a managed block in the hosts file.
Exit codes: 2 bad config, 3 enrolment failed (bad key, other login server), 0 normal shutdown.
A tailscaled that is not running yet is waited for (reported on /diagnostics), not fatal.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from dataclasses import replace
from typing import Any, Dict, List, Optional

import rospy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from overlay_manager.msg import NatSummary, OverlayStatus, PathChange, Peer, PeerList, PreflightCheck
from overlay_manager.srv import (
    GetPeer,
    GetPeerResponse,
    GetRosEnv,
    GetRosEnvResponse,
    ListPeers,
    ListPeersResponse,
    MeasureLink,
    MeasureLinkResponse,
    PingPeer,
    PingPeerResponse,
    Preflight,
    PreflightResponse,
    WaitForPeer,
    WaitForPeerResponse,
)

from .config import ConfigError, NodeSettings, apply_overrides, load_robot_config
from .enrolment import ensure_enrolled
from .links import iperf_server_argv
from .monitor import OverlayMonitor
from .peers import PeerState
from .tailscale import EnrolError, LocalAPI, TailscaleError


def _time(posix_s: float) -> rospy.Time:
    return rospy.Time.from_sec(posix_s) if posix_s > 0 else rospy.Time(0)


def peer_msg(p: Optional[PeerState]) -> Peer:
    """PeerState -> overlay_manager/Peer."""
    m = Peer()
    if p is None:
        m.path = Peer.PATH_UNKNOWN
        m.latency_ms = math.nan
        return m
    m.name, m.dns_name, m.addresses = p.name, p.dns_name, list(p.addresses)
    m.online, m.active, m.path = p.online, p.active, p.path
    m.endpoint, m.relay_region, m.latency_ms = p.endpoint, p.relay_region, p.latency_ms
    m.last_handshake, m.last_seen = _time(p.last_handshake), _time(p.last_seen)
    m.rx_bytes, m.tx_bytes, m.tags, m.os = p.rx_bytes, p.tx_bytes, list(p.tags), p.os
    return m


class OverlayNode:
    """ROS adapter around OverlayMonitor."""

    def __init__(self, monitor: OverlayMonitor) -> None:
        self.m = monitor
        self.cfg = monitor.cfg
        n = self.cfg.node
        self._lock = threading.Lock()
        self._last_peers: Optional[Any] = None
        self._last_status: Optional[Any] = None
        self._iperf: Optional[subprocess.Popen] = None
        self.pub_peers = rospy.Publisher("~peers", PeerList, queue_size=5, latch=True)
        self.pub_status = rospy.Publisher("~status", OverlayStatus, queue_size=5, latch=True)
        self.pub_changes = rospy.Publisher("~path_changes", PathChange, queue_size=50)
        self.pub_diag = rospy.Publisher("/diagnostics", DiagnosticArray, queue_size=5)
        rospy.Service("~list_peers", ListPeers, self.srv_list_peers)
        rospy.Service("~get_peer", GetPeer, self.srv_get_peer)
        rospy.Service("~ping_peer", PingPeer, self.srv_ping_peer)
        rospy.Service("~wait_for_peer", WaitForPeer, self.srv_wait_for_peer)
        rospy.Service("~measure_link", MeasureLink, self.srv_measure_link)
        rospy.Service("~get_ros_env", GetRosEnv, self.srv_get_ros_env)
        rospy.Service("~preflight", Preflight, self.srv_preflight)
        self.poll(force=True)
        threading.Thread(target=self._slow_checks, name="overlay-preflight", daemon=True).start()
        rospy.Timer(rospy.Duration(1.0 / n.poll_rate), lambda _e: self.poll())
        rospy.Timer(rospy.Duration(1.0 / n.publish_rate), lambda _e: self._republish())
        if n.ping_interval > 0:
            threading.Thread(target=self._pinger, name="overlay-pinger", daemon=True).start()
        if n.iperf_server:
            rospy.Timer(rospy.Duration(2.0), lambda _e: self._ensure_iperf())
        rospy.on_shutdown(self.shutdown)

    # ----- periodic work --------------------------------------------------------------------
    def poll(self, force: bool = False) -> None:
        """Read tailscaled; publish path changes at once and peers/status when changed."""
        with self._lock:
            changes = self.m.poll()
            now = rospy.Time.now()
            for ev in changes:
                msg = PathChange()
                msg.header.stamp = now
                msg.peer, msg.dns_name = ev.peer.name, ev.peer.dns_name
                msg.old_path, msg.new_path = ev.old_path, ev.new_path
                msg.endpoint, msg.relay_region = ev.peer.endpoint, ev.peer.relay_region
                self.pub_changes.publish(msg)
                if ev.old_path:
                    rospy.loginfo("path to %s: %s -> %s %s", ev.peer.name, ev.old_path, ev.new_path,
                                  ev.peer.endpoint or ev.peer.relay_region)
            if self.m.error and (force or changes):
                rospy.logerr("overlay_manager: %s", self.m.error)
            self.publish(force=force)

    def _republish(self) -> None:
        """Periodic republish (under the same lock as poll, so change detection stays consistent)."""
        with self._lock:
            self.publish(force=True)

    def publish(self, force: bool = False) -> None:
        """Publish ~peers, ~status and /diagnostics (when changed, or always if force)."""
        snap = self.m.snapshot
        now = rospy.Time.now()
        peers_key = (snap.self_peer, snap.peers) if snap else None
        if force or peers_key != self._last_peers:
            self._last_peers = peers_key
            pl = PeerList()
            pl.header.stamp = now
            pl.self_peer = peer_msg(snap.self_peer if snap else None)
            pl.peers = [peer_msg(p) for p in snap.peers] if snap else []
            self.pub_peers.publish(pl)
        st = self.status_msg()
        status_key = (st.backend_state, st.control_reachable, tuple(st.health), st.nat.summary,
                      st.self_dns_name, tuple(st.self_addresses))
        if force or status_key != self._last_status:
            self._last_status = status_key
            st.header.stamp = now
            self.pub_status.publish(st)
            self.publish_diagnostics(now)

    def status_msg(self) -> OverlayStatus:
        """Current OverlayStatus."""
        snap = self.m.snapshot
        st = OverlayStatus()
        st.tailscaled_reachable = snap is not None
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
        else:
            st.health = [self.m.error] if self.m.error else []
        nat = self.m.nat
        st.nat = NatSummary(known=nat.known, udp=nat.udp, hard_nat=nat.hard_nat,
                            hard_nat_known=nat.hard_nat_known, preferred_derp=nat.preferred_derp,
                            preferred_derp_latency_ms=nat.preferred_derp_latency_ms, summary=nat.summary)
        return st

    def publish_diagnostics(self, now: rospy.Time) -> None:
        """One DiagnosticStatus for the overlay and one per peer."""
        arr = DiagnosticArray()
        arr.header.stamp = now
        node = rospy.get_name().lstrip("/")
        for d in self.m.diagnostics():
            s = DiagnosticStatus(level=d.level, name=f"{node}: {d.name}", message=d.message,
                                 hardware_id=self.cfg.hostname)
            s.values = [KeyValue(key=k, value=v) for k, v in d.values]
            arr.status.append(s)
        self.pub_diag.publish(arr)

    def _pinger(self) -> None:
        rate = self.cfg.node.ping_interval
        while not rospy.is_shutdown():
            try:
                self.m.ping_watched(timeout_s=min(3.0, rate))
            except TailscaleError as exc:  # tailscaled went away; the poll reports it
                rospy.logdebug("ping round failed: %s", exc)
            rospy.sleep(rate)

    def _slow_checks(self) -> None:
        """netcheck and preflight, off the poll timer (each may take seconds)."""
        n = self.cfg.node
        next_nat = next_pre = 0.0
        while not rospy.is_shutdown():
            now = rospy.get_time()
            if now >= next_nat:
                self.m.refresh_nat()
                next_nat = now + (n.netcheck_interval if n.netcheck_interval > 0 else math.inf)
                self._last_status = None
            if now >= next_pre:
                self.run_preflight(log=True)
                next_pre = now + (n.preflight_interval if n.preflight_interval > 0 else math.inf)
            rospy.sleep(1.0)

    def run_preflight(self, log: bool = False) -> PreflightResponse:
        """Run the preflight checks, publish diagnostics, return the service response."""
        checks = self.m.preflight()
        if log:
            for c in checks:
                if not c.ok:
                    rospy.logwarn("preflight %s: %s -- %s", c.name, c.message, c.hint)
        self.publish_diagnostics(rospy.Time.now())
        return PreflightResponse(ok=all(c.ok for c in checks), checks=[
            PreflightCheck(name=c.name, ok=c.ok, message=c.message, hint=c.hint) for c in checks])

    def _ensure_iperf(self) -> None:
        """Keep an iperf3 server bound to this machine's overlay IPv4 address."""
        if self._iperf is not None and self._iperf.poll() is None:
            return
        snap = self.m.snapshot
        ip = snap.self_peer.ipv4 if snap and snap.self_peer else ""
        if not ip:
            return
        try:
            self._iperf = subprocess.Popen(iperf_server_argv(ip, self.cfg.node.iperf_port),
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rospy.loginfo("iperf3 server on %s:%d", ip, self.cfg.node.iperf_port)
        except FileNotFoundError:
            rospy.logwarn_once("iperf3 not installed: ~measure_link from peers will fail")

    def shutdown(self) -> None:
        """Stop what this node started (by pid)."""
        if self._iperf is not None and self._iperf.poll() is None:
            self._iperf.terminate()
            try:
                self._iperf.wait(3)
            except subprocess.TimeoutExpired:
                self._iperf.kill()
        self.m.close()

    # ----- services -------------------------------------------------------------------------
    def srv_list_peers(self, req: Any) -> ListPeersResponse:
        return ListPeersResponse(peers=[peer_msg(p) for p in self.m.list_peers(
            req.online_only, req.tag, req.path)])

    def srv_get_peer(self, req: Any) -> GetPeerResponse:
        p = self.m.find(req.name)
        if p is None:
            return GetPeerResponse(found=False, peer=peer_msg(None),
                                   message=f"unknown peer {req.name!r}")
        return GetPeerResponse(found=True, peer=peer_msg(p), message="")

    def srv_ping_peer(self, req: Any) -> PingPeerResponse:
        o = self.m.ping(req.name, req.count, req.timeout)
        self.poll()
        return PingPeerResponse(ok=o.ok, latency_min_ms=o.latency_min_ms, latency_mean_ms=o.latency_mean_ms,
                                latency_max_ms=o.latency_max_ms, received=o.received, path=o.path,
                                endpoint=o.endpoint, message=o.message)

    def srv_wait_for_peer(self, req: Any) -> WaitForPeerResponse:
        ok, peer, waited, msg = self.m.wait_for_peer(req.name, req.timeout, req.require_direct,
                                                     rospy.is_shutdown)
        return WaitForPeerResponse(ok=ok, peer=peer_msg(peer), waited=waited, message=msg)

    def srv_measure_link(self, req: Any) -> MeasureLinkResponse:
        ok, r, path, msg = self.m.measure_link(req.peer, req.duration, req.udp_bitrate)
        return MeasureLinkResponse(ok=ok, tcp_throughput_mbps=r.tcp_throughput_mbps,
                                   udp_jitter_ms=r.udp_jitter_ms, udp_loss_percent=r.udp_loss_percent,
                                   rtt_min_ms=r.rtt_min_ms, rtt_mean_ms=r.rtt_mean_ms,
                                   rtt_max_ms=r.rtt_max_ms, path=path, message=msg)

    def srv_get_ros_env(self, _req: Any) -> GetRosEnvResponse:
        env = self.m.ros_env()
        ok = self.m.snapshot is not None and self.m.snapshot.backend_state == "Running"
        return GetRosEnvResponse(ok=ok, ros_master_uri=env.ros_master_uri, ros_hostname=env.ros_hostname,
                                 shell=env.shell(),
                                 message="" if ok else "not enrolled yet: names are computed from the config")

    def srv_preflight(self, _req: Any) -> PreflightResponse:
        return self.run_preflight()


def _read_overrides() -> Dict[str, Any]:
    """node.* settings given as ~private params."""
    out: Dict[str, Any] = {}
    for name in NodeSettings.__dataclass_fields__:
        if rospy.has_param("~" + name):
            out[name] = rospy.get_param("~" + name)
    return out


def main() -> None:
    """Entry point of overlay_manager_node."""
    rospy.init_node("overlay_manager")
    path = rospy.get_param("~config", os.environ.get("OVERLAY_MANAGER_CONFIG", ""))
    if not path:
        rospy.logfatal("overlay_manager: parameter ~config (robot config file) is required; "
                       "e.g. roslaunch overlay_manager robot.launch config:=/etc/overlay_manager/robot.yaml")
        sys.exit(2)
    try:
        cfg = load_robot_config(path)
        cfg = apply_overrides(cfg, _read_overrides(), f"{rospy.get_name()} private parameters")
        master = str(rospy.get_param("~master", "") or "")
        if master:
            cfg = replace(cfg, master=master.rstrip("."))
    except ConfigError as exc:
        rospy.logfatal("overlay_manager: bad config: %s", exc)
        sys.exit(2)
    api = LocalAPI(cfg.tailscale.socket)
    monitor = OverlayMonitor(cfg, api)
    OverlayNode(monitor)
    exit_code: List[int] = [0]
    threading.Thread(target=_enrol_loop, args=(api, cfg, exit_code), name="overlay-enrol", daemon=True).start()
    rospy.spin()
    sys.exit(exit_code[0])


def _enrol_loop(api: LocalAPI, cfg: Any, exit_code: List[int]) -> None:
    """Enrol once tailscaled answers; a missing daemon is retried, a bad key/config is fatal."""
    reported = ""
    while not rospy.is_shutdown():
        try:
            result = ensure_enrolled(api, cfg)
            rospy.loginfo("overlay_manager: %s", result.message)
            return
        except EnrolError as exc:
            rospy.logfatal("overlay_manager: enrolment failed: %s", exc)
            exit_code[0] = 3
            rospy.signal_shutdown("enrolment failed")
            return
        except TailscaleError as exc:
            if str(exc) != reported:
                rospy.logerr("overlay_manager: %s (retrying every 2 s)", exc)
                reported = str(exc)
            rospy.sleep(2.0)
