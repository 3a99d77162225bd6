"""The node's logic without ROS: polls tailscaled, tracks paths and latency, answers requests.

ros/node.py owns all ROS I/O and calls into OverlayMonitor; everything here takes and returns plain
values so it is unit-testable against a fake LocalAPI.

Concurrency: poll() runs on the node's poll thread, the others on the pinger, NAT-check,
preflight and service threads, and the reporting thread reads. What tailscaled last said is one
immutable :class:`Reading`, built without any lock and swapped in by one assignment, so readers
never wait for a LocalAPI call. ``_lock`` guards only the latency map and the in-flight ping
futures (no I/O under it).

When tailscaled cannot be read (gone, hanging, garbage, HTTP errors), the last known peers are
kept with path ``offline`` (daemon not running) or ``unknown`` (daemon there but unreadable) and
the reading carries the error; :meth:`OverlayMonitor.freshness` says how old the last useful
answer is and also notices a read that is still hanging, before its timeout.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from overlay_manager.core.config import RobotConfig
from overlay_manager.core.identity import HostMatcher, normalise_host, peer_key, short_label
from overlay_manager.core.json_fields import finite_ms
from overlay_manager.core.nat import NatInfo, derp_region_names, parse_netcheck
from overlay_manager.core.peers import (
    PATH_DIRECT,
    PATH_PEER_RELAY,
    PATH_UNKNOWN,
    Latency,
    PathChangeEvent,
    PeerState,
    Snapshot,
    SnapshotBuilder,
    blind,
    path_changes,
    ping_path,
)
from overlay_manager.core.ros_env import RosEnv, compute_env
from overlay_manager.monitor.diagnose import (
    MALFORMED_FIX,
    DiagnosticParts,
    derp_reason,
    derper_diagnostic,
    missing_required,
    mobility_diagnostic,
    overlay_diagnostic,
    preflight_checks,
    relay_diagnostic,
    required_keys,
    rosbridge_diagnostic,
    stale_diagnostic,
)
from overlay_manager.monitor.path_guard import PathGuard
from overlay_manager.monitor.readings import (
    STATUS_TIMEOUT_S,
    Check,
    Diagnostic,
    Freshness,
    LinkMeasurement,
    PingOutcome,
    PortReading,
    Reading,
    WaitResult,
)
from overlay_manager.system import firewall, iperf, probes, sockets
from overlay_manager.system.hosts import Entry, wanted_entries
from overlay_manager.system.workers import describe
from overlay_manager.tailscaled.derper import DerperState, read_derper
from overlay_manager.tailscaled.localapi import LocalAPI, TailscaledNotRunning, TailscaleError, netcheck
from overlay_manager.tailscaled.relay import RelayServerState, sync_relay
from overlay_manager.tailscaled.status_json import StatusDecoder

STALE_READS = 3.0
"""Reads missed before the presented status counts as stale."""
STALE_MIN_S = 1.5
"""Seconds without a read before the status is stale, at the fastest poll rate."""


class OverlayMonitor:
    """Polls tailscaled and keeps the overlay's state for the node.

    Args:
        cfg: validated robot config (node settings already merged with ~params).
        api: LocalAPI client.
        env: the ROS env this process actually runs with (ROS_HOSTNAME, ROS_MASTER_URI), for
            preflight; None = os.environ.
        clock: monotonic seconds (tests inject a fake).
    """

    def __init__(self, cfg: RobotConfig, api: LocalAPI, env: Optional[Dict[str, str]] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.api = api
        self.env = env
        self.clock = clock
        self.reading = Reading()
        self.stale_after_s = STALE_MIN_S  # s without a read -> stale (set_poll_interval)
        self.set_poll_interval(1.0 / cfg.node.poll_rate)
        self._poll_started: Optional[float] = None  # monotonic s when the read in progress began
        self.nat = NatInfo()
        self.checks: List[Check] = []
        self.hosts_error: str = ""  # why the last write of the hosts block failed ("" = none); set by the node
        self.enrol_error: str = ""  # why the last enrolment attempt failed ("" = none); set by the node
        self._latency: Dict[str, Latency] = {}   # key: core.identity.peer_key -> the last ping
        self._lock = threading.Lock()
        self._regions: Dict[int, str] = {}
        # DERP region code -> readable name (DERP map; overlay-netcheck, one assignment)
        self.region_names: Dict[str, str] = {}
        self._names_by_id: Dict[int, str] = {}
        # this machine's derper as last read (overlay-derper thread; one assignment)
        self.derper_state = DerperState(error="not read yet") if cfg.derper else DerperState()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="overlay-ping")
        self._pings: Set[Future] = set()          # in-flight ping_watched futures (cancelled by close)
        # this machine's peer relay server as last read (overlay-relay thread; one assignment)
        self.relay_state = RelayServerState(error="not read yet" if cfg.relay else "")
        # short names of the machines carrying ROS connections to or from this one (set by the
        # node's topic-link thread in one assignment); None = no topic-link map (ping every peer)
        self.topic_peers: Optional[FrozenSet[str]] = None
        self._decoder = StatusDecoder()           # the poll thread's (unchanged peers' JSON reused)
        self._snapshots = SnapshotBuilder()       # the poll thread's (unchanged peers kept)
        self._required: Tuple[Optional[RobotConfig], FrozenSet[str]] = (None, frozenset())  # required_peers()
        # who can reach rosbridge's port, as last read (overlay-rosbridge thread; one assignment);
        # None = not checked (node.rosbridge_port 0) or not read yet
        self.rosbridge: Optional[PortReading] = None
        self._malformed_seen: Set[str] = set()    # the poll thread's: malformed notes in the last read
        self._warnings: List[str] = []            # the poll thread's: lines for take_warnings()
        # the guard against stalled paths and a dead home region (set by the node when
        # node.guard_interval or node.home_check_interval is on; its values are swapped whole)
        self.guard: Optional[PathGuard] = None

    # ----- status ---------------------------------------------------------------------------
    @property
    def snapshot(self) -> Optional[Snapshot]:
        """The presented status (see Reading.snapshot)."""
        return self.reading.snapshot

    @property
    def error(self) -> str:
        """Why the last read of tailscaled failed ("" = it succeeded)."""
        return self.reading.error

    def poll(self) -> List[PathChangeEvent]:
        """Read tailscaled's status once; returns the path changes since the last poll.

        Never raises for anything tailscaled answers: errors become Reading.error. The read is
        bounded by STATUS_TIMEOUT_S and holds no lock. The snapshot is built once, with every
        value a peer shows (core.peers.SnapshotBuilder), and swapped in whole.
        """
        old = self.reading
        self._poll_started = self.clock()
        try:
            raw = self.api.status(timeout=STATUS_TIMEOUT_S, decoder=self._decoder)
            with self._lock:
                latency = dict(self._latency)
            snap = self._snapshots.build(raw, self.region_names, latency)
        except TailscaleError as exc:
            return self._failed(old, str(exc), isinstance(exc, TailscaledNotRunning))
        except Exception as exc:  # noqa: BLE001 - whatever tailscaled sends must not stop polling
            return self._failed(old, f"unusable status from tailscaled: {describe(exc)}", False)
        finally:
            self._poll_started = None
        self._note_malformed(snap)
        changes = path_changes(old.snapshot, snap)
        if changes:
            with self._lock:
                for ev in changes:
                    if ev.old_path:  # not shown on the new path (Latency.holds_for); a way back must not revive it
                        self._latency.pop(peer_key(ev.peer), None)
        self.reading = Reading(snap, "", False, self.clock(), time.time())
        return changes

    def _note_malformed(self, snap: Snapshot) -> None:
        """Queue one WARN line per malformed field that was not malformed in the last read
        (naming the peer and the field): the values were clamped or taken as unknown, and
        nobody would know tailscaled sends nonsense. Poll thread only."""
        notes = [f"tailscaled's status: {m}" for m in snap.malformed]
        for p in snap.peers:
            if p.malformed:
                notes.extend(f"peer {p.name or p.node_id or '?'}: tailscaled sent {m}" for m in p.malformed)
        current = set(notes)
        for n in notes:
            if n not in self._malformed_seen:
                self._warnings.append(f"overlay_manager: {n} -- fix: {MALFORMED_FIX}")
        self._malformed_seen = current

    def take_warnings(self) -> List[str]:
        """WARN lines queued by the last polls (malformed fields from tailscaled), then none
        until new ones come. Poll thread only (the node logs them after poll())."""
        out, self._warnings = self._warnings, []
        return out

    def _failed(self, old: Reading, error: str, gone: bool) -> List[PathChangeEvent]:
        """Swap in a failed reading: the last peers, blinded; returns their path changes."""
        presented = blind(old.snapshot, gone) if old.snapshot is not None else None
        changes = path_changes(old.snapshot, presented) if presented is not None else []
        with self._lock:
            for ev in changes:
                self._latency.pop(peer_key(ev.peer), None)
        self.reading = replace(old, snapshot=presented, error=error, daemon_gone=gone)
        return changes

    def set_poll_interval(self, interval_s: float) -> None:
        """The status is read every interval_s seconds from now on (the node slows down while
        tailscaled's IPN bus reports changes): it turns stale after STALE_READS missed reads,
        STALE_MIN_S seconds at least."""
        self.stale_after_s = max(STALE_READS * interval_s, STALE_MIN_S)

    def freshness(self, now: Optional[float] = None) -> Freshness:
        """Is the presented status current, as of now (monotonic s; default: the clock)?"""
        return self._freshness(self.reading, self.clock() if now is None else now)

    def _freshness(self, r: Reading, now: float) -> Freshness:
        return r.freshness(now, self._poll_started, self.stale_after_s, self.api.socket_path)

    def freshness_changes_at(self, now: float) -> float:
        """When freshness() may change with no read finishing (Reading.freshness_changes_at)."""
        return self.reading.freshness_changes_at(now, self._poll_started, self.stale_after_s)

    def hosts_entries(self, reading: Optional[Reading] = None) -> Optional[List[Entry]]:
        """The managed hosts block's entries for a reading (default: the presented one; split
        horizon, system/hosts.py ``wanted_entries``), or None when the block is to stay as it is:
        node.manage_hosts off, the read failed or tailscaled is not Running (starting or logged
        out: it lists no peers). Pure: the node writes the file (its overlay-hosts thread)."""
        r = self.reading if reading is None else reading
        snap = r.snapshot
        if not self.cfg.node.manage_hosts or r.error or snap is None or snap.backend_state != "Running":
            return None
        return wanted_entries(snap.self_peer, self.cfg.fqdn, snap.peers)

    def ros_env(self) -> RosEnv:
        """ROS env in overlay names (uses tailscaled's own name and address for this machine when
        known)."""
        me = self.snapshot.self_peer if self.snapshot else None
        return compute_env(self.cfg, me.dns_name if me else "", me.ipv4 if me else "")

    def refresh_nat(self) -> NatInfo:
        """Run a NAT check (tailscale netcheck) and keep the result; failures keep the old one."""
        from overlay_manager.tailscaled.enrolment import tailscale_env
        try:
            try:  # the map changes when regions are added: read it every check
                info = derp_region_names(self.api.derp_map())
                self._regions = {rid: code for rid, (code, _) in info.items()}
                self._names_by_id = {rid: name for rid, (_, name) in info.items()}
                self.region_names = {code: name for code, name in info.values() if name}
            except TailscaleError:
                if not self._regions:
                    raise
            report = netcheck(self.cfg.tailscale.cli, self.api.socket_path, env=tailscale_env(self.cfg))
            self.nat = parse_netcheck(report, self._regions, self._names_by_id)
        except TailscaleError as exc:
            self.nat = replace(self.nat, summary=f"NAT check failed: {exc}")
        return self.nat

    # ----- this machine as a peer relay -------------------------------------------------------
    def refresh_relay(self) -> str:
        """Make tailscaled's relay server match the config's ``relay`` key and read its state
        into :attr:`relay_state` (relay.sync_relay). Returns a line worth logging ("" = nothing
        to say). Blocks on the LocalAPI (bounded), so only the overlay-relay thread calls it."""
        self.relay_state, note = sync_relay(self.api, self.cfg.relay)
        return note

    # ----- this machine as a DERP server ------------------------------------------------------
    def refresh_derper(self) -> DerperState:
        """Read this machine's derper (robot config ``derper``) into :attr:`derper_state`; one
        bounded HTTP read to localhost, so only the overlay-derper thread calls it."""
        if self.cfg.derper is not None:
            self.derper_state = read_derper(self.cfg.derper)
        return self.derper_state

    def relay_diagnostic(self) -> Optional[Diagnostic]:
        """The "peer relay" entry (diagnose.relay_diagnostic); None on machines that are not relays."""
        return relay_diagnostic(self.cfg, self.relay_state)

    # ----- rosbridge's websocket port ---------------------------------------------------------
    def refresh_rosbridge(self) -> PortReading:
        """Read who can reach node.rosbridge_port: the listening sockets (/proc/net/tcp, tcp6)
        and, when one reaches beyond loopback, what nftables says (``nft``, bounded by
        firewall.NFT_TIMEOUT_S). Blocks on that I/O, so only the overlay-rosbridge thread calls
        it; the result is swapped in by one assignment."""
        port = self.cfg.node.rosbridge_port
        listeners, error = sockets.read_listeners()
        mine = tuple(sockets.on_port(listeners, port))
        restriction = None
        if any(not x.loopback for x in mine):
            restriction = firewall.read_restriction(port)
        self.rosbridge = PortReading(port, mine, error, restriction)
        return self.rosbridge

    # ----- peers ----------------------------------------------------------------------------
    def find(self, name: str) -> Optional[PeerState]:
        """The peer named by short name, FQDN or overlay IP in the latest snapshot
        (core.identity.refers_to)."""
        return self.snapshot.find(name) if self.snapshot else None

    def list_peers(self, online_only: bool = False, tag: str = "", path: str = "") -> List[PeerState]:
        """Peers matching every given filter."""
        if not self.snapshot:
            return []
        return [p for p in self.snapshot.peers
                if (not online_only or p.online) and (not tag or tag in p.tags)
                and (not path or p.path == path)]

    def set_topic_peers(self, names: FrozenSet[str]) -> None:
        """The machines that carry ROS connections to or from this one (from the topic links)."""
        self.topic_peers = frozenset(names)

    def required_peers(self) -> FrozenSet[str]:
        """Hosts (normalised: core.identity.normalise_host) whose peer's absence is an ERROR:
        node.required_peers and the ROS master's machine (unless that is this machine). The same
        set object while the config is the same."""
        cfg = self.cfg
        known = self._required
        if known[0] is cfg:
            return known[1]
        names = {normalise_host(n) for n in cfg.node.required_peers}
        if short_label(cfg.master) != normalise_host(cfg.hostname):
            names.add(normalise_host(cfg.master))
        names.discard("")
        self._required = (cfg, frozenset(names))
        return self._required[1]

    def watched(self) -> List[PeerState]:
        """Online peers to keep fresh with disco pings (N^2 pings across a fleet otherwise).

        With a topic-link map (``topic_peers`` set): node.watch_peers, the ROS master's machine and
        the machines that carry ROS connections to or from this one. Without one: node.watch_peers,
        or every online peer when that is empty.
        """
        snap = self.snapshot
        if not snap:
            return []
        names = tuple(self.cfg.node.watch_peers)
        topic = self.topic_peers
        if topic is None:
            if not names:
                return [p for p in snap.peers if p.online]
        else:
            names += (*topic, self.cfg.master, self.cfg.master_fqdn)
        hosts = HostMatcher(snap.peers)
        keys = {peer_key(p) for p in (hosts.peer(n) for n in names) if p is not None}
        return [p for p in snap.peers if p.online and peer_key(p) in keys]

    def ping(self, name: str, count: int = 3, timeout_s: float = 5.0) -> PingOutcome:
        """Disco pings to a peer; records its latency. Never raises."""
        peer = self.find(name)
        if peer is None:
            return PingOutcome(False, message=f"unknown peer {name!r} (not in this machine's tailnet view)")
        if not peer.addresses:
            return PingOutcome(False, message=f"peer {peer.name} has no overlay address")
        count = max(1, min(count or 3, 100))
        timeout_s = timeout_s if timeout_s and timeout_s > 0 else 5.0
        samples: List[float] = []
        path, endpoint, last_err = PATH_UNKNOWN, "", ""
        for _ in range(count):
            try:
                res = self.api.ping(peer.ipv4, "disco", timeout=timeout_s)
            except TailscaleError as exc:
                return PingOutcome(False, message=str(exc))
            if res.get("Err"):
                last_err = str(res.get("Err"))
                continue
            lat = finite_ms(res.get("LatencySeconds"), 1000.0)
            if not math.isnan(lat):
                samples.append(lat)
            path, endpoint = ping_path(res)
        if not samples:
            return PingOutcome(False, path=PATH_UNKNOWN,
                               message=f"no answer from {peer.name} ({peer.ipv4}): {last_err or 'timeout'}")
        with self._lock:
            self._latency[peer_key(peer)] = Latency(samples[-1], peer.path, peer.relay_region)
        return PingOutcome(True, min(samples), sum(samples) / len(samples), max(samples),
                           len(samples), path, endpoint, "")

    def ping_watched(self, timeout_s: float = 3.0) -> None:
        """One disco ping to every watched peer, in parallel (also refreshes their paths)."""
        futures = []
        for p in self.watched():
            f = self._pool.submit(self.ping, p.dns_name or p.name, 1, timeout_s)
            with self._lock:
                self._pings.add(f)
            f.add_done_callback(self._ping_done)
            futures.append(f)
        for f in futures:
            if not f.cancelled():
                f.result()  # each ping is bounded by timeout_s

    def _ping_done(self, f: Future) -> None:
        with self._lock:
            self._pings.discard(f)

    def wait_for_peer(self, name: str, timeout_s: float, require_direct: bool,
                      should_stop: Callable[[], bool] = lambda: False,
                      accept_peer_relay: bool = False) -> WaitResult:
        """Wait until name answers a disco ping (on a direct path if asked) or timeout_s passes.

        ``accept_peer_relay`` with ``require_direct``: a path through a peer relay is good enough
        (one UDP hop through a relay machine, near-direct throughput); only DERP is not.
        """
        good = (PATH_DIRECT, PATH_PEER_RELAY) if accept_peer_relay else (PATH_DIRECT,)
        goal = "direct or peer-relay" if accept_peer_relay else "direct"
        timeout_s = timeout_s if timeout_s and timeout_s > 0 else 30.0
        start = self.clock()
        last = "peer not known yet"
        while True:
            waited = self.clock() - start
            peer = self.find(name)
            if peer is not None and peer.online:
                out = self.ping(name, 1, min(2.0, max(0.5, timeout_s - waited)))
                if out.ok and (not require_direct or out.path in good):
                    return WaitResult(True, self.find(name) or peer, self.clock() - start)
                last = (f"path is {out.path}, not {goal}" if out.ok else out.message)
            elif peer is not None:
                last = f"{peer.name} is offline"
            if self.clock() - start >= timeout_s or should_stop():
                return WaitResult(False, peer, self.clock() - start, (
                    f"timed out after {timeout_s:.1f} s waiting for {name}"
                    f"{f' on a {goal} path' if require_direct else ''}: {last}"))
            time.sleep(0.2)

    def measure_link(self, name: str, duration_s: float, udp_mbps: float) -> LinkMeasurement:
        """iperf3 + ping against a peer. Never raises."""
        peer = self.find(name)
        if peer is None:
            return LinkMeasurement(False, iperf.LinkResult(), PATH_UNKNOWN, f"unknown peer {name!r}")
        if not peer.ipv4:
            return LinkMeasurement(False, iperf.LinkResult(), PATH_UNKNOWN,
                                   f"peer {peer.name} has no overlay address")
        duration_s = duration_s if duration_s and duration_s > 0 else 3.0
        udp_mbps = udp_mbps if udp_mbps and udp_mbps > 0 else 10.0
        try:
            result = iperf.measure(peer.ipv4, self.cfg.node.iperf_port, duration_s, udp_mbps)
        except iperf.LinkError as exc:
            return LinkMeasurement(False, iperf.LinkResult(), peer.path, f"{peer.name}: {exc}")
        after = self.find(name)  # the node's poll loop keeps the snapshot fresh during the run
        return LinkMeasurement(True, result, (after or peer).path)

    # ----- preflight and diagnostics --------------------------------------------------------
    def preflight(self) -> List[Check]:
        """Check this machine's ROS names resolve to overlay addresses and the master answers
        (diagnose.preflight_checks with this process's environment); kept for /diagnostics. Does
        DNS lookups and one TCP connect to the master (2 s at most)."""
        import os
        env = self.env if self.env is not None else dict(os.environ)
        snap = self.snapshot
        own = set(snap.self_peer.addresses) if snap and snap.self_peer else set()
        want = self.ros_env()
        seen = probes.look_up_names(want.ros_hostname, self.cfg.master_fqdn, self.cfg.master_port, 2.0)
        self.checks = preflight_checks(self.cfg, env, want, own, seen)
        return self.checks

    def diagnostics(self) -> List[Diagnostic]:
        """One entry for the overlay and one per peer: OK direct, peer-relay or idle; WARN relayed
        through DERP; offline is ERROR for a required peer (required_peers()), else OK. A required
        peer missing from the tailnet gets an ERROR entry of its own. While tailscaled cannot be
        read, one entry only (see diagnose.py)."""
        return self.diagnostic_parts().entries()

    def diagnostic_parts(self) -> DiagnosticParts:
        """diagnostics() as its parts: the entries about this machine and the peers whose entries
        follow them (kept with each peer: diagnose.DiagnosticParts)."""
        r = self.reading
        snap = r.snapshot
        fresh = self._freshness(r, self.clock())
        if fresh.stale or snap is None:
            return DiagnosticParts([stale_diagnostic(snap, fresh, self.cfg.login_server)], (), frozenset(), "")
        out = [overlay_diagnostic(snap, self.cfg, self.ros_env(), self.nat, self.checks, self.enrol_error,
                                  self.hosts_error)]
        relay = self.relay_diagnostic()
        if relay is not None:
            out.append(relay)
        bridge = rosbridge_diagnostic(self.rosbridge, snap.self_peer.addresses if snap.self_peer else ())
        if bridge is not None:
            out.append(bridge)
        guard = self.guard
        if guard is not None:
            home = mobility_diagnostic(guard.home, len(guard.episodes), guard.actions, guard.underlay.describe())
            if home is not None:
                out.append(home)
        derper = derper_diagnostic(self.cfg.derper, self.derper_state)
        if derper is not None:
            out.append(derper)
        required = self.required_peers()
        out.extend(missing_required(required, snap))
        return DiagnosticParts(out, snap.peers, required_keys(required, snap), derp_reason(self.nat))

    def close(self) -> None:
        """Stop background pings: cancel the queued ones (running ones end within their timeout).

        (ThreadPoolExecutor.shutdown(cancel_futures=...) needs Python 3.9; this works on 3.8.)
        """
        with self._lock:
            pending = list(self._pings)
        for f in pending:
            f.cancel()
        self._pool.shutdown(wait=False)

