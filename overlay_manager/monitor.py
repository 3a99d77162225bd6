"""The node's logic without ROS: polls tailscaled, tracks paths and latency, answers requests.

node.py owns all ROS I/O and calls into OverlayMonitor; everything here takes and returns plain
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

import ipaddress
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from . import links
from .config import RobotConfig
from .hosts import HostsError, entries_for, own_names, update_hosts_file
from .peers import (
    PATH_DERP,
    PATH_DIRECT,
    PATH_IDLE,
    PATH_OFFLINE,
    PATH_PEER_RELAY,
    PATH_UNKNOWN,
    NatInfo,
    ParseCache,
    PathChangeEvent,
    PeerState,
    Snapshot,
    blind,
    derp_regions,
    finite_ms,
    parse_netcheck,
    parse_status,
    path_changes,
    ping_path,
    with_latency,
)
from .relay import RelayServerState, apply_relay, read_relay_state, relay_summary
from .ros_env import RosEnv, compute_env, resolve, tcp_answers
from .tailscale import LocalAPI, TailscaledNotRunning, TailscaleError, netcheck
from .workers import describe

OVERLAY_V4 = ipaddress.ip_network("100.64.0.0/10")
OVERLAY_V6 = ipaddress.ip_network("fd7a:115c:a1e0::/48")

# diagnostic levels (same numbers as diagnostic_msgs/DiagnosticStatus)
OK, WARN, ERROR = 0, 1, 2

STATUS_TIMEOUT_S = 1.5
"""Seconds one status read may take. tailscaled answers /status in milliseconds; a hung daemon
must not hold the poll thread longer than this, so polling resumes soon after it answers again."""
HANG_REPORT_S = 0.75
"""A status read still unanswered after this many seconds is reported as tailscaled not
answering, before the read's own timeout expires."""


def is_overlay_address(addr: str) -> bool:
    """True for Tailscale's CGNAT v4 range and ULA v6 range."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return ip in OVERLAY_V4 if ip.version == 4 else ip in OVERLAY_V6


@dataclass(frozen=True)
class PingOutcome:
    """Result of ping_peer. Latencies in ms (NaN when none answered)."""

    ok: bool
    latency_min_ms: float = math.nan
    latency_mean_ms: float = math.nan
    latency_max_ms: float = math.nan
    received: int = 0
    path: str = PATH_UNKNOWN
    endpoint: str = ""
    message: str = ""


@dataclass(frozen=True)
class WaitResult:
    """Result of wait_for_peer. waited_s: seconds spent; peer: the last state seen (None = unknown)."""

    ok: bool
    peer: Optional[PeerState]
    waited_s: float
    message: str = ""


@dataclass(frozen=True)
class LinkMeasurement:
    """Result of measure_link: the measured values, the path at the end of the run, and why it
    failed ("" = ok)."""

    ok: bool
    result: links.LinkResult
    path: str
    message: str = ""


@dataclass(frozen=True)
class Reading:
    """What tailscaled last said, swapped whole by OverlayMonitor.poll.

    snapshot: what to present: the last status read; while tailscaled fails, its peers with path
        offline/unknown (see peers.blind); None until tailscaled first answered.
    error: why the last read failed ("" = it succeeded).
    daemon_gone: the last failure says tailscaled is not running (no socket, refused).
    ok_at: monotonic seconds of the last useful answer; NaN = never.
    ok_wall: POSIX seconds of the same moment; 0 = never.
    """

    snapshot: Optional[Snapshot] = None
    error: str = ""
    daemon_gone: bool = False
    ok_at: float = math.nan
    ok_wall: float = 0.0


@dataclass(frozen=True)
class Freshness:
    """How current the presented status is at one moment.

    stale: not from a current read (an error, a hanging read, or no read for stale_after_s).
    age_s: seconds since tailscaled last answered usefully; NaN = never.
    error: why tailscaled cannot be read right now ("" = it answers); worded to stay the same
        while the condition lasts (no running counts), so change detection stays quiet.
    """

    stale: bool
    age_s: float
    error: str


@dataclass(frozen=True)
class Check:
    """One preflight check."""

    name: str
    ok: bool
    message: str
    hint: str = ""


@dataclass(frozen=True)
class Diagnostic:
    """One /diagnostics entry, ROS-free."""

    level: int
    name: str
    message: str
    values: Tuple[Tuple[str, str], ...] = ()


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
        self.stale_after_s = max(3.0 / cfg.node.poll_rate, 1.5)  # s without a read -> stale
        self._poll_started: Optional[float] = None  # monotonic s when the read in progress began
        self.nat = NatInfo()
        self.checks: List[Check] = []
        self.hosts_error: str = ""
        self.enrol_error: str = ""  # why the last enrolment attempt failed ("" = none); set by the node
        self._latency: Dict[str, float] = {}     # key: dns_name or name -> ms
        self._lock = threading.Lock()
        self._regions: Dict[int, str] = {}
        self._hosts_entries: Optional[List[Tuple[str, Tuple[str, ...]]]] = None
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="overlay-ping")
        self._pings: Set[Future] = set()          # in-flight ping_watched futures (cancelled by close)
        # this machine's peer relay server as last read (overlay-relay thread; one assignment)
        self.relay_state = RelayServerState(error="not read yet" if cfg.relay else "")
        # short names of the machines carrying ROS connections to or from this one (set by the
        # node's topic-link thread in one assignment); None = no topic-link map (ping every peer)
        self.topic_peers: Optional[FrozenSet[str]] = None
        self._parse_cache: ParseCache = {}        # the poll thread's (peers.parse_status)

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
        bounded by STATUS_TIMEOUT_S and holds no lock.
        """
        old = self.reading
        self._poll_started = self.clock()
        try:
            raw = self.api.status(timeout=STATUS_TIMEOUT_S)
            snap = parse_status(raw, self._parse_cache)
        except TailscaleError as exc:
            return self._failed(old, str(exc), isinstance(exc, TailscaledNotRunning))
        except Exception as exc:  # noqa: BLE001 - whatever tailscaled sends must not stop polling
            return self._failed(old, f"unusable status from tailscaled: {describe(exc)}", False)
        finally:
            self._poll_started = None
        changes = path_changes(old.snapshot, snap)
        with self._lock:
            for ev in changes:
                if ev.old_path:  # a latency measured on the old path says nothing about the new one
                    self._latency.pop(self._key(ev.peer), None)
            snap = with_latency(snap, self._latency)
        self.reading = Reading(snap, "", False, self.clock(), time.time())
        if self.cfg.node.manage_hosts:
            self._update_hosts(snap)
        return changes

    def _failed(self, old: Reading, error: str, gone: bool) -> List[PathChangeEvent]:
        """Swap in a failed reading: the last peers, blinded; returns their path changes."""
        presented = blind(old.snapshot, gone) if old.snapshot is not None else None
        changes = path_changes(old.snapshot, presented) if presented is not None else []
        with self._lock:
            for ev in changes:
                self._latency.pop(self._key(ev.peer), None)
        self.reading = replace(old, snapshot=presented, error=error, daemon_gone=gone)
        return changes

    def freshness(self, now: Optional[float] = None) -> Freshness:
        """Is the presented status current, as of now (monotonic s; default: the clock)?"""
        return self._freshness(self.reading, self.clock() if now is None else now)

    def _freshness(self, r: Reading, now: float) -> Freshness:
        started = self._poll_started
        age = now - r.ok_at if not math.isnan(r.ok_at) else math.nan
        error = r.error
        if not error and started is not None and now - started > HANG_REPORT_S:
            error = (f"tailscaled at {self.api.socket_path} has not answered GET /localapi/v0/status "
                     f"for more than {HANG_REPORT_S:.1f} s")
        if not error and not math.isnan(age) and age > self.stale_after_s:
            error = f"tailscaled status not read for more than {self.stale_after_s:.1f} s"
        if not error and math.isnan(age):
            error = "tailscaled not read yet"
        return Freshness(bool(error), age, error)

    @staticmethod
    def _key(p: PeerState) -> str:
        return p.dns_name or p.name

    def _update_hosts(self, snap: Snapshot) -> None:
        # split horizon: this machine's own names -> loopback, so its own ROS graph never
        # depends on tailscaled; every other machine -> its overlay addresses
        if snap.backend_state != "Running":
            return  # starting or logged out: no peers listed; keep the last block meanwhile
        own = own_names(snap.self_peer, self.cfg.fqdn, snap.peers)
        entries = [(a, tuple(n)) for a, n in entries_for(snap.peers, own)]
        if entries == self._hosts_entries:
            return
        try:
            update_hosts_file(self.cfg.node.hosts_file, entries)
            self._hosts_entries = entries
            self.hosts_error = ""
        except HostsError as exc:
            self.hosts_error = str(exc)

    def ros_env(self) -> RosEnv:
        """ROS env in overlay names (uses tailscaled's own name and address for this machine when
        known)."""
        me = self.snapshot.self_peer if self.snapshot else None
        return compute_env(self.cfg, me.dns_name if me else "", me.ipv4 if me else "")

    def refresh_nat(self) -> NatInfo:
        """Run a NAT check (tailscale netcheck) and keep the result; failures keep the old one."""
        from .enrolment import tailscale_env
        try:
            if not self._regions:
                self._regions = derp_regions(self.api.derp_map())
            report = netcheck(self.cfg.tailscale.cli, self.api.socket_path, env=tailscale_env(self.cfg))
            self.nat = parse_netcheck(report, self._regions)
        except TailscaleError as exc:
            self.nat = replace(self.nat, summary=f"NAT check failed: {exc}")
        return self.nat

    # ----- this machine as a peer relay -------------------------------------------------------
    def refresh_relay(self) -> str:
        """Make tailscaled's relay server match the config's ``relay`` key (on, off when the key
        is absent; idempotent) and read its port and sessions into :attr:`relay_state`.

        Returns a line worth logging when the prefs were changed or could not be ("" = nothing
        to say). Never raises for tailscaled's answers: a failure is kept in relay_state.error.
        Blocks on the LocalAPI (bounded), so only the overlay-relay thread calls it.
        """
        note = ""
        try:
            res = apply_relay(self.api, self.cfg.relay)
            if res.changed:
                note = res.message
        except TailscaleError as exc:
            if self.cfg.relay is None:
                # not a relay host: the poll thread reports an unreachable tailscaled
                self.relay_state = RelayServerState()
                return ""
            self.relay_state = RelayServerState(error=f"cannot set the peer relay server: {exc}")
            return self.relay_state.error
        if self.cfg.relay is None:
            self.relay_state = RelayServerState()  # off, as the prefs say now
        else:
            self.relay_state = read_relay_state(self.api)
        return note

    def relay_diagnostic(self) -> Optional[Diagnostic]:
        """The "peer relay" entry: on a relay host (or one serving a relay it should not), what
        it relays, on which port, how many sessions; None on other machines."""
        st = self.relay_state
        if self.cfg.relay is None and not st.active and not st.error:
            return None
        text, ok = relay_summary(self.cfg.relay, st)
        values = [("asked_port", str(self.cfg.relay.port) if self.cfg.relay else "none (no relay key)"),
                  ("port", "off" if st.port is None else str(st.port)),
                  ("sessions", str(len(st.sessions))),
                  ("sessions_carrying_traffic", str(sum(1 for x in st.sessions if x.bound)))]
        if self.cfg.relay and self.cfg.relay.static_endpoints:
            values.append(("static_endpoints", " ".join(self.cfg.relay.static_endpoints)))
        for x in st.sessions:
            values.append((f"session vni {x.vni}", f"{x.endpoints[0] or '?'} <-> {x.endpoints[1] or '?'}, "
                                                   f"bytes {x.bytes[0]} / {x.bytes[1]}"))
        return Diagnostic(OK if ok else WARN, "peer relay", text, tuple(values))

    # ----- peers ----------------------------------------------------------------------------
    def find(self, name: str) -> Optional[PeerState]:
        """The peer named by short name, FQDN or overlay IP in the latest snapshot."""
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
        """Lower-case short names whose absence is an ERROR: node.required_peers and the ROS
        master's machine (unless that is this machine)."""
        names = {n.rstrip(".").split(".")[0].lower() for n in self.cfg.node.required_peers}
        master = self.cfg.master.rstrip(".").split(".")[0].lower()
        if master != self.cfg.hostname.lower():
            names.add(master)
        return frozenset(names)

    def watched(self) -> List[PeerState]:
        """Online peers to keep fresh with disco pings (N^2 pings across a fleet otherwise).

        With a topic-link map (``topic_peers`` set): node.watch_peers, the ROS master's machine and
        the machines that carry ROS connections to or from this one. Without one: node.watch_peers,
        or every online peer when that is empty.
        """
        snap = self.snapshot
        if not snap:
            return []
        names = self.cfg.node.watch_peers
        topic = self.topic_peers
        peers = [p for p in snap.peers if p.online]
        if topic is None:
            if names:
                peers = [p for p in peers if any(p.matches(n) for n in names)]
            return peers
        wanted = {n.rstrip(".").lower() for n in (*names, *topic, self.cfg.master, self.cfg.master_fqdn)}
        return [p for p in peers if p.name.lower() in wanted or p.dns_name.lower() in wanted
                or any(a in wanted for a in p.addresses)]

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
            self._latency[self._key(peer)] = samples[-1]
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
            return LinkMeasurement(False, links.LinkResult(), PATH_UNKNOWN, f"unknown peer {name!r}")
        if not peer.ipv4:
            return LinkMeasurement(False, links.LinkResult(), PATH_UNKNOWN,
                                   f"peer {peer.name} has no overlay address")
        duration_s = duration_s if duration_s and duration_s > 0 else 3.0
        udp_mbps = udp_mbps if udp_mbps and udp_mbps > 0 else 10.0
        try:
            result = links.measure(peer.ipv4, self.cfg.node.iperf_port, duration_s, udp_mbps)
        except links.LinkError as exc:
            return LinkMeasurement(False, links.LinkResult(), peer.path, f"{peer.name}: {exc}")
        after = self.find(name)  # the node's poll loop keeps the snapshot fresh during the run
        return LinkMeasurement(True, result, (after or peer).path)

    # ----- preflight and diagnostics --------------------------------------------------------
    def preflight(self) -> List[Check]:
        """Check this machine's ROS names resolve to overlay addresses and the master answers."""
        import os
        env = self.env if self.env is not None else dict(os.environ)
        want = self.ros_env()
        checks: List[Check] = []
        own = set(self.snapshot.self_peer.addresses) if self.snapshot and self.snapshot.self_peer else set()
        host = env.get("ROS_HOSTNAME", "")
        if host.rstrip(".") != want.ros_hostname:
            checks.append(Check("ros_hostname_set", False,
                                f"ROS_HOSTNAME is {host!r}, not this machine's overlay name {want.ros_hostname}",
                                'eval "$(rosrun overlay_manager overlay_env --config <robot.yaml>)" before roslaunch'))
        else:
            checks.append(Check("ros_hostname_set", True, f"ROS_HOSTNAME={host}"))
        addrs = resolve(want.ros_hostname)
        if not addrs:
            checks.append(Check("ros_hostname_resolves", False, f"{want.ros_hostname} does not resolve",
                                "turn MagicDNS on (accept_dns) or set node.manage_hosts: true"))
        elif own and any(not (a.startswith("127.") or a == "::1") and a not in own for a in addrs):
            # this machine's own name must lead back to this machine: loopback (the managed hosts
            # block's split horizon) or this machine's own overlay address
            checks.append(Check("ros_hostname_resolves", False,
                                f"{want.ros_hostname} resolves to {', '.join(addrs)}, not to loopback or this "
                                f"machine's overlay address {', '.join(sorted(own))}",
                                "remove stale entries for this name from /etc/hosts or DNS"))
        else:
            checks.append(Check("ros_hostname_resolves", True, f"{want.ros_hostname} -> {', '.join(addrs)}"))
        master = self.cfg.master_fqdn
        maddrs = resolve(master)
        if not maddrs:
            checks.append(Check("master_resolves", False, f"master {master} does not resolve",
                                "is the master machine enrolled? turn MagicDNS on or node.manage_hosts: true"))
        elif not any(is_overlay_address(a) or a.startswith("127.") for a in maddrs):
            checks.append(Check("master_resolves", False,
                                f"master {master} resolves to {', '.join(maddrs)}, not an overlay address",
                                "fix DNS or /etc/hosts so overlay names map to 100.64.0.0/10 addresses"))
        else:
            checks.append(Check("master_resolves", True, f"{master} -> {', '.join(maddrs)}"))
        if maddrs and tcp_answers(master, self.cfg.master_port, 2.0):
            checks.append(Check("master_xmlrpc", True, f"{master}:{self.cfg.master_port} answers"))
        else:
            checks.append(Check("master_xmlrpc", False,
                                f"ROS master XML-RPC {master}:{self.cfg.master_port} does not answer",
                                "start roscore on the master machine; check the overlay path to it"))
        self.checks = checks
        return checks

    def diagnostics(self) -> List[Diagnostic]:
        """One entry for the overlay and one per peer: OK direct, peer-relay or idle; WARN relayed
        through DERP; offline is ERROR for a required peer (required_peers()), else OK. A required
        peer missing from the tailnet gets an ERROR entry of its own."""
        out: List[Diagnostic] = []
        r = self.reading
        snap = r.snapshot
        fresh = self._freshness(r, self.clock())
        if fresh.stale or snap is None:
            # one entry only: nothing per peer is known while tailscaled cannot be read
            age = "never" if math.isnan(fresh.age_s) else f"{fresh.age_s:.1f}"
            vals = [("error", fresh.error), ("status_age_s", age), ("login_server", self.cfg.login_server)]
            if snap is None:
                msg = f"tailscaled not reachable: {fresh.error}"
            else:
                msg = f"stale: tailscaled last answered {age} s ago: {fresh.error}"
                if snap.self_peer:
                    vals.append(("addresses", " ".join(snap.self_peer.addresses)))
            out.append(Diagnostic(ERROR, "overlay", msg, tuple(vals)))
            return out
        values = [("backend_state", snap.backend_state), ("login_server", self.cfg.login_server),
                  ("control_reachable", str(snap.control_reachable)), ("nat", self.nat.summary),
                  ("peers", str(len(snap.peers))),
                  ("ros_hostname", self.ros_env().ros_hostname),
                  ("ros_master_uri", self.ros_env().ros_master_uri)]
        if snap.self_peer:
            values.append(("addresses", " ".join(snap.self_peer.addresses)))
        for h in snap.health:
            values.append(("health", h))
        failing = [c for c in self.checks if not c.ok]
        for c in self.checks:
            values.append((f"preflight {c.name}", c.message + (f" -- {c.hint}" if c.hint and not c.ok else "")))
        enrol_error = self.enrol_error
        if enrol_error:
            values.append(("enrol_error", enrol_error))
            level, msg = ERROR, f"enrolment failed: {enrol_error}"
        elif snap.backend_state != "Running":
            level, msg = ERROR, f"not enrolled: tailscaled state is {snap.backend_state or 'unknown'}"
        elif not snap.control_reachable:
            level, msg = WARN, "control server unreachable: existing links keep working, changes wait"
        elif self.hosts_error:
            level, msg = WARN, self.hosts_error
        elif failing:
            level, msg = WARN, f"preflight: {failing[0].message} -- {failing[0].hint}"
        elif snap.health:
            level, msg = WARN, snap.health[0]
        else:
            level, msg = OK, f"enrolled as {snap.self_peer.dns_name if snap.self_peer else '?'}"
        out.append(Diagnostic(level, "overlay", msg, tuple(values)))
        relay = self.relay_diagnostic()
        if relay is not None:
            out.append(relay)
        required = self.required_peers()
        for name in sorted(required - {p.name.lower() for p in snap.peers}):
            out.append(Diagnostic(ERROR, f"peer {name}", "required peer is not on the overlay (never "
                                  "enrolled, or removed from the tailnet, or hidden by the ACL policy)",
                                  (("required", "true"),)))
        for p in snap.peers:
            pv = (("dns_name", p.dns_name), ("addresses", " ".join(p.addresses)), ("path", p.path),
                  ("endpoint", p.endpoint), ("relay_region", p.relay_region),
                  ("latency_ms", "unknown" if math.isnan(p.latency_ms) else f"{p.latency_ms:.2f}"))
            if p.path == PATH_OFFLINE:
                if p.name.lower() in required:
                    d = Diagnostic(ERROR, f"peer {p.name}", "offline (a required peer: the ROS master's "
                                   "machine or in node.required_peers)", pv)
                else:
                    d = Diagnostic(OK, f"peer {p.name}", "offline (not a required peer)", pv)
            elif p.path == PATH_DIRECT:
                d = Diagnostic(OK, f"peer {p.name}", f"direct via {p.endpoint}", pv)
            elif p.path == PATH_DERP:
                reason = "relayed through DERP"
                if self.nat.known and not self.nat.udp:
                    reason += ": UDP is blocked on this network"
                elif self.nat.known and self.nat.hard_nat:
                    reason += ": this machine is behind a hard (symmetric) NAT"
                else:
                    reason += " (hole punching failed or not finished; the peer's NAT may be hard)"
                d = Diagnostic(WARN, f"peer {p.name}", f"{reason}, region {p.relay_region}", pv)
            elif p.path == PATH_PEER_RELAY:
                # OK, not WARN: one UDP hop through a fleet relay machine carries near-direct
                # throughput (measured: several times DERP); the WARN is for DERP, where links
                # fall back to when the relay goes away
                relay = f"relay {p.relay_host} ({p.peer_relay})" if p.relay_host else f"relay {p.peer_relay}"
                d = Diagnostic(OK, f"peer {p.name}", f"peer-relay via {relay}: one UDP hop through the "
                               "relay, near-direct throughput",
                               pv + (("peer_relay", p.peer_relay), ("relay_host", p.relay_host or "unknown")))
            elif p.path == PATH_IDLE:
                d = Diagnostic(OK, f"peer {p.name}", "online, idle (no traffic yet: path unknown)", pv)
            else:
                d = Diagnostic(WARN, f"peer {p.name}", "path unknown", pv)
            out.append(d)
        return out

    def close(self) -> None:
        """Stop background pings: cancel the queued ones (running ones end within their timeout).

        (ThreadPoolExecutor.shutdown(cancel_futures=...) needs Python 3.9; this works on 3.8.)
        """
        with self._lock:
            pending = list(self._pings)
        for f in pending:
            f.cancel()
        self._pool.shutdown(wait=False)

