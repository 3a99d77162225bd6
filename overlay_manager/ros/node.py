"""The ROS node (`rosrun overlay_manager overlay_manager_node`): all ROS I/O, no decisions.

Parameters are read once at start: ~config (robot config file, required) and any node.* key of
the config as a ~private parameter of the same name (overrides the file). Then:
- enrol tailscaled if needed (never re-enrol or rename);
- poll tailscaled at node.poll_rate (node.bus_poll_rate while its IPN bus is open; a state or
  peer change on the bus is read at once), publish ~peers/~status (latched, at once on a change and
  at node.publish_rate), ~path_changes (one per change), /diagnostics;
- disco-ping watched peers every node.ping_interval seconds; netcheck every netcheck_interval;
- serve ~list_peers ~get_peer ~ping_peer ~wait_for_peer ~measure_link ~get_ros_env ~preflight;
- publish a few peers' Peer messages on topics named after them, ~links/<ROS name of the peer>
  (node.link_topics, node.max_link_topics; ros/peer_topics.py), for rqt_plot and PlotJuggler;
- map which ROS topic connections cross which overlay path every node.topic_links_interval s:
  ~topic_links (latched) and ~get_topic_links; ~host_aliases (host -> machine) maps node hosts
  that are not overlay names; the machines found carrying topics are the ones pinged;
- optionally serve iperf3 on the overlay address and keep a managed block in the hosts file.
Exit codes: 2 bad config, 0 normal shutdown. A tailscaled that is not running yet is waited for
and an enrolment that fails (bad or used key, other login server) is retried; both are reported
on /diagnostics as ERROR, neither is fatal (robot.launch respawns the node if it ever exits).

Threads and locks
-----------------
Reporting never waits on I/O: no thread holds anything that publishing needs while it talks to
tailscaled, the ROS master or the log.

| thread | runs | may block on |
|---|---|---|
| overlay-poll | ``m.poll`` every 1/poll_rate s; queues path changes, logs | LocalAPI (STATUS_TIMEOUT_S) |
| overlay-hosts | after each read (manage_hosts): ``m.hosts_entries`` -> hosts file, ``m.hosts_error`` | hosts file |
| overlay-report | changes at once (a stalled link's once it resumed), all at publish_rate | nothing (publish) |
| overlay-ping | ``ping_watched`` every ping_interval s (its pool: overlay-ping_N) | LocalAPI ping (bounded) |
| overlay-netcheck | ``refresh_nat`` every netcheck_interval s | `tailscale netcheck` (bounded, dies with us) |
| overlay-preflight | ``preflight`` every preflight_interval s | DNS lookups, TCP connect to the master (2 s) |
| overlay-iperf | keeps the iperf3 server running (every 2 s) | spawning iperf3 |
| overlay-guard | ``PathGuard.tick`` every guard_interval s (pool: overlay-guard_N) | LocalAPI ping, debug (2 s) |
| overlay-home | ``PathGuard.check_home`` every home_check_interval s | TCP connects to derpers (1 s each), LocalAPI |
| overlay-relay | ``refresh_relay`` every RELAY_INTERVAL_S: relay server as ``relay`` says | LocalAPI (bounded) |
| overlay-rosbridge | ``refresh_rosbridge`` every ROSBRIDGE_INTERVAL_S (rosbridge_port) | /proc/net/tcp, nft (5 s) |
| overlay-derper | ``refresh_derper`` every DERPER_INTERVAL_S (``derper`` key only) | HTTP to localhost (2 s) |
| overlay-ipnbus | tailscaled's IPN bus; a state or peer change wakes overlay-poll | the bus (stop() closes it) |
| overlay-topics | ~topic_links every topic_links_interval s (pool: overlay-graph_N) | XML-RPC (XMLRPC_TIMEOUT_S) |
| overlay-links | plans ~links/<peer> every LINKS_INTERVAL_S; advertises, unregisters | the master (getPid, 1 s) |
| overlay-enrol | ``ensure_enrolled`` until it succeeds; sets ``m.enrol_error`` | LocalAPI, `tailscale up` (bounded) |
| overlay-log | writes queued log lines with rospy | rospy logging (it may wait for the master) |
| rospy service threads | the services | LocalAPI, iperf3; never a lock publishing needs |

Every periodic thread is a ``workers.Worker``: any exception in a cycle is caught, reported in
~status ``faults`` and /diagnostics, logged once per distinct error, and the loop goes on. The
reporting thread checks every worker each tick and reports a dead or stuck one as ERROR naming
it; the poll thread logs if the reporting thread itself is stuck.

Locks: ``OverlayMonitor._lock`` guards its latency map and in-flight pings (no I/O under it);
``Worker._lock`` guards a worker's counters; ``LogQueue`` has its own condition. What tailscaled
said is an immutable ``monitor.readings.Reading`` swapped by one assignment. Change detection state
(``_last_*``) and publish faults belong to overlay-report alone; path changes reach it through a
deque (thread-safe append/popleft). The ~links/<peer> publishers reach it as one dict that
overlay-links replaces whole (``PeerTopics.publishers``); rospy registers and unregisters a topic
with the master while holding its topic manager's lock, which publishing does not take.
overlay-topics also subscribes to and unsubscribes from shaped streams' stream_state topics (after
the master answered getPid within 1 s; ros/stream_states.py), whose messages arrive on rospy's threads.
"""

from __future__ import annotations

import collections
import math
import subprocess
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

import rospy
from diagnostic_msgs.msg import DiagnosticArray

from overlay_manager.core.identity import peer_key
from overlay_manager.core.mobility import Explanation, completed, explain
from overlay_manager.core.peers import PathChangeEvent, Snapshot, same_but_measurements
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.monitor.path_guard import PathGuard
from overlay_manager.monitor.readings import ERROR, STATUS_TIMEOUT_S, Freshness, Reading
from overlay_manager.msg import OverlayStatus, PathChange, PeerList, PreflightCheck
from overlay_manager.ros.messages import ReportMessages, path_change_msg, peer_msg, status_key
from overlay_manager.ros.peer_topics import LINKS_INTERVAL_S, TOPIC_PREFIX, PeerTopics
from overlay_manager.ros.topic_links import XMLRPC_TIMEOUT_S, TopicLinkReporter
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
from overlay_manager.system import children
from overlay_manager.system.hosts import ManagedHosts
from overlay_manager.system.iperf import iperf_server_argv
from overlay_manager.system.workers import LOG_ERROR, LOG_INFO, LOG_WARN, LogQueue, Worker, WorkerHealth, describe
from overlay_manager.tailscaled.derper import derper_summary
from overlay_manager.tailscaled.ipnbus import BusWatcher

RELAY_INTERVAL_S = 10.0
"""Seconds between checks of this machine's peer relay server (prefs as configured, sessions)."""
DERPER_INTERVAL_S = 5.0
"""Seconds between reads of this machine's derper counters (derper hosts only)."""
ROSBRIDGE_INTERVAL_S = 10.0
"""Seconds between reads of who can reach rosbridge's port (node.rosbridge_port > 0)."""
HOSTS_STUCK_S = 30.0
"""Seconds a write of the hosts file may take before overlay-hosts is reported stuck (it waits for
the file's flock while ``overlay_env --write-hosts`` holds it)."""
REPORT_TICK_S = 0.25
"""Longest sleep of the reporting thread between checks. Every finished read, path change,
relay and NAT check wakes it at once, and it wakes itself when a read in progress turns into a
hang or the status turns stale (OverlayMonitor.freshness_changes_at), so this bounds only how
late a failing worker thread or a publish fault is reported."""
CHANGE_HOLD_S = 2.0
"""Longest time a path change explained by a stall or roam waits for the traffic to resume before
it is published without traffic_resumed."""
REPORT_MIN_SLEEP_S = 0.01
"""Shortest sleep of the reporting thread (a deadline that has just passed does not spin it)."""


class OverlayNode:
    """ROS adapter around OverlayMonitor: publishers, services and the worker threads.

    Args:
        monitor: the node's logic (owns the LocalAPI client).
        log: where every thread's log lines go (a LogQueue; never rospy directly).
        start: start the worker threads (False in tests that drive cycles by hand).
        host_aliases: node URI host -> machine short name, for the topic-link map.
    """

    def __init__(self, monitor: OverlayMonitor, log: LogQueue, start: bool = True,
                 host_aliases: Optional[Dict[str, str]] = None) -> None:
        self.m = monitor
        self.cfg = monitor.cfg
        self.log = log
        n = self.cfg.node
        self._name = rospy.get_name().lstrip("/")
        self._changes: Deque[Tuple[rospy.Time, PathChangeEvent, Explanation, str]] = collections.deque()
        # overlay-report only: changes waiting for their stall or roam to resume (CHANGE_HOLD_S at most)
        self._held: List[Tuple[rospy.Time, PathChangeEvent, Explanation, str, float]] = []
        self._last_change_at: Dict[str, float] = {}        # overlay-poll only: peer key -> POSIX s
        self._last_status: Optional[bytes] = None        # overlay-report only
        self._last_peers: Optional[Tuple[Optional[Snapshot], bool]] = None  # overlay-report only: published
        self._next_periodic = 0.0                          # overlay-report only (monotonic s)
        self._publish_faults: Dict[str, str] = {}          # overlay-report only: topic -> error
        self.msgs = ReportMessages(monitor, self._name)     # overlay-report only: builders and caches
        self._logged_error = ""                            # overlay-poll only
        self._reporter_fault = ""                          # overlay-poll only
        self._iperf: Optional[Any] = None                  # overlay-iperf only
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

        def every(interval_s: float) -> float:
            return interval_s if interval_s > 0 else math.inf  # 0 = once at start

        self.reporter = Worker("overlay-report", self._report_cycle, REPORT_TICK_S, 2.0, log, start=False)
        self.poller = Worker("overlay-poll", self._poll_cycle, 1.0 / n.poll_rate, STATUS_TIMEOUT_S + 5.0,
                             log, start=False)
        self.workers: List[Worker] = [self.poller]
        self.hosts: Optional[Worker] = None
        if n.manage_hosts:
            self._hosts = ManagedHosts(n.hosts_file)       # overlay-hosts only
            self._hosts_read: Optional[Reading] = None     # overlay-hosts only: the reading last written
            self.hosts = Worker("overlay-hosts", self._hosts_cycle, 1.0 / n.poll_rate, HOSTS_STUCK_S, log,
                                start=False)
            self.workers.append(self.hosts)
        if n.ping_interval > 0:
            self.workers.append(Worker("overlay-ping", self._ping_cycle, n.ping_interval, 60.0, log,
                                       start=False))
        self.workers.append(Worker("overlay-netcheck", self._netcheck_cycle, every(n.netcheck_interval),
                                   45.0, log, start=False))
        self.workers.append(Worker("overlay-preflight", lambda: self.run_preflight(log=True),
                                   every(n.preflight_interval), 30.0, log, start=False))
        if n.iperf_server:
            self.workers.append(Worker("overlay-iperf", self._ensure_iperf, 2.0, 15.0, log, start=False))
        self._relay_note = ""                              # overlay-relay only
        self.workers.append(Worker("overlay-relay", self._relay_cycle, RELAY_INTERVAL_S, 30.0, log,
                                   start=False))
        if n.rosbridge_port > 0:
            self.workers.append(Worker("overlay-rosbridge", self._rosbridge_cycle, ROSBRIDGE_INTERVAL_S, 30.0,
                                       log, start=False))
        if self.cfg.derper is not None:
            self._derper_up: Optional[bool] = None         # overlay-derper only
            self.workers.append(Worker("overlay-derper", self._derper_cycle, DERPER_INTERVAL_S, 15.0, log,
                                       start=False))
        self.guard: Optional[PathGuard] = None
        if n.guard_interval > 0 or n.home_check_interval > 0:
            self.guard = PathGuard(monitor.api, lambda: monitor.snapshot, monitor.watched, n.stall_after)
            monitor.guard = self.guard
            if n.guard_interval > 0:
                self.workers.append(Worker("overlay-guard", self._guard_cycle, n.guard_interval,
                                           n.stall_after + 10.0, log, start=False))
            if n.home_check_interval > 0:
                self.workers.append(Worker("overlay-home", self._home_cycle, n.home_check_interval,
                                           30.0, log, start=False))
        self.topics = TopicLinkReporter(monitor, host_aliases)
        self.peer_topics = PeerTopics(monitor, log)
        if self.peer_topics.enabled:
            self.workers.append(Worker("overlay-links", self.peer_topics.cycle, LINKS_INTERVAL_S, 30.0, log,
                                       start=False))
        self._last_poll = 0.0                              # overlay-poll only (monotonic s)
        self._bus_woke = threading.Event()                 # set by overlay-ipnbus
        self._bus_was_connected = False                    # overlay-report only
        self.bus = BusWatcher(self.cfg.tailscale.socket, on_change=self._on_bus_change)
        if n.topic_links_interval > 0:
            monitor.set_topic_peers(frozenset())  # ping only what matters, from the first map on
            self.workers.append(Worker("overlay-topics", self.topics.cycle, n.topic_links_interval,
                                       4 * XMLRPC_TIMEOUT_S + 10.0, log, start=False))
        if start:
            self.start()

    def start(self) -> None:
        """Read tailscaled once (so the first messages carry a status), then start every thread."""
        try:
            self._poll_cycle()
        except Exception as exc:  # noqa: BLE001 - the poll thread retries and reports
            self.log(LOG_WARN, f"first status read failed: {describe(exc)}")
        self.reporter.start()
        for w in self.workers:
            w.start()
        self.bus.start()

    # ----- periodic work --------------------------------------------------------------------
    def _on_bus_change(self, _kinds: Tuple[str, ...]) -> None:
        """overlay-ipnbus: tailscaled said its state or a peer changed: read the status now."""
        self._bus_woke.set()
        self.poller.wake()

    def _pace_poll(self) -> None:
        """overlay-poll: read the status at bus_poll_rate while the IPN bus is open (the changes
        it reports wake this thread, at most poll_rate times a second), else at poll_rate. The
        status is still read periodically: a peer's path (direct/derp/peer-relay) is only there."""
        n = self.cfg.node
        rate = n.poll_rate
        if n.bus_poll_rate > 0 and self.bus.connected:
            rate = min(rate, n.bus_poll_rate)
        if 1.0 / rate != self.poller.period_s:
            self.poller.period_s = 1.0 / rate
            self.m.set_poll_interval(self.poller.period_s)
        if self._bus_woke.is_set():
            self._bus_woke.clear()
            early = self._last_poll + 1.0 / n.poll_rate - time.monotonic()
            if early > 0:  # a burst of bus notifications: not faster than poll_rate
                time.sleep(early)
        self._last_poll = time.monotonic()

    def _poll_cycle(self) -> None:
        """overlay-poll: read tailscaled, queue path changes and log lines, wake the reporter."""
        self._pace_poll()
        changes = self.m.poll()
        for line in self.m.take_warnings():
            self.log(LOG_WARN, line)
        if changes:
            now = rospy.Time.now()
            episodes = self.guard.episodes if self.guard is not None else {}
            for ev in changes:
                key = peer_key(ev.peer)
                why = explain(episodes.get(key), self._last_change_at.get(key, 0.0))
                self._last_change_at[key] = now.to_sec()
                self._changes.append((now, ev, why, key))
                if ev.old_path:
                    self.log(LOG_INFO, f"path to {ev.peer.name}: {ev.old_path} -> {ev.new_path} "
                                   f"{ev.peer.endpoint or ev.peer.relay_region}")
        error = self.m.error
        if error != self._logged_error:
            self.log(LOG_ERROR if error else LOG_INFO,
                     f"overlay_manager: {error}" if error else "overlay_manager: tailscaled answers again")
            self._logged_error = error
        if self.hosts is not None:
            self.hosts.wake()
        self.reporter.wake()
        rh = self.reporter.health()
        if rh.level == ERROR and rh.message != self._reporter_fault:
            self.log(LOG_ERROR, f"overlay_manager: {rh.message}: ~status and /diagnostics are not updated")
        self._reporter_fault = rh.message if rh.level == ERROR else ""

    def _hosts_cycle(self) -> None:
        """overlay-hosts: keep the managed block of the hosts file in step with the last read (the
        monitor computes the entries); a failure is reported as hosts_error on /diagnostics."""
        reading = self.m.reading
        if reading is self._hosts_read:
            return
        self._hosts_read = reading
        entries = self.m.hosts_entries(reading)
        if entries is not None:
            error = self._hosts.write(entries)
            if error != self.m.hosts_error:
                self.m.hosts_error = error
                self.reporter.wake()

    def _ping_cycle(self) -> None:
        self.m.ping_watched(timeout_s=min(3.0, self.cfg.node.ping_interval))

    def _guard_cycle(self) -> None:
        """overlay-guard: probe the active peers' paths; on a stall or a roam ask tailscaled to
        re-evaluate (PathGuard.tick); wake the poll thread to read the new path at once."""
        assert self.guard is not None
        lines = self.guard.tick()
        for line in lines:
            self.log(LOG_WARN, f"overlay_manager: {line}")
        if lines:
            self.poller.wake()
        if self._held:
            self.reporter.wake()  # a held path change may have resumed

    def _home_cycle(self) -> None:
        """overlay-home: is the home DERP region's derper answering (PathGuard.check_home)?"""
        assert self.guard is not None
        for line in self.guard.check_home():
            self.log(LOG_WARN, f"overlay_manager: {line}")
        self.reporter.wake()

    def _relay_cycle(self) -> None:
        """overlay-relay: relay server as configured (on/off), then its port and sessions."""
        note = self.m.refresh_relay()
        if note and note != self._relay_note:
            self.log(LOG_WARN if self.m.relay_state.error else LOG_INFO, f"overlay_manager: {note}")
        self._relay_note = note
        self.reporter.wake()

    def _rosbridge_cycle(self) -> None:
        """overlay-rosbridge: who can reach rosbridge's port (the reporting thread reads it)."""
        self.m.refresh_rosbridge()
        self.reporter.wake()

    def _derper_cycle(self) -> None:
        """overlay-derper: read this machine's derper counters; log when it stops or starts answering."""
        st = self.m.refresh_derper()
        if st.listening != self._derper_up:
            text = derper_summary(self.cfg.derper, st)[0]
            self.log(LOG_INFO if st.listening else LOG_WARN, f"overlay_manager: {text}")
        self._derper_up = st.listening
        self.reporter.wake()

    def _netcheck_cycle(self) -> None:
        self.m.refresh_nat()
        self.reporter.wake()

    def _report_cycle(self) -> None:
        """overlay-report: publish what changed now, everything at publish_rate."""
        mono = time.monotonic()
        now = rospy.Time.now()
        while self._changes:
            self._held.append(self._changes.popleft() + (mono,))
        if self._held:
            self._publish_changes(mono)
        connected = self.bus.connected
        if self._bus_was_connected and not connected:
            self.poller.wake()  # the IPN bus dropped: tailscaled may be gone, read the status now
        self._bus_was_connected = connected
        periodic = mono >= self._next_periodic
        if periodic:
            period = 1.0 / self.cfg.node.publish_rate
            self._next_periodic = max(self._next_periodic + period, mono + period / 2)
        reading = self.m.reading
        fresh = self.m.freshness(mono)
        health = [self.reporter.health(mono)] + [w.health(mono) for w in self.workers]
        last = self._last_peers
        peers_changed = (last is None or last[1] != fresh.stale
                         or not same_but_measurements(last[0], reading.snapshot))
        if periodic or peers_changed:
            self._last_peers = (reading.snapshot, fresh.stale)
            pl = self.peer_list_msg(reading, fresh, now)
            self._publish(self.pub_peers, pl, "~peers")
            self._publish_links(reading, pl)
        st = self.status_msg(reading, fresh, health)  # after ~peers: its publish fault shows at once
        key = status_key(st)
        status_changed = key is None or key != self._last_status
        if periodic or status_changed:
            self._last_status = key
            st.header.stamp = now
            self._publish(self.pub_status, st, "~status")
        if periodic or status_changed or peers_changed:
            self._publish(self.pub_diag, self.diagnostics_msg(now, health), "/diagnostics")
        # sleep until the next periodic publish or the moment the status may turn stale on its
        # own, REPORT_TICK_S at most; every other change wakes this thread
        wake = min(self._next_periodic, self.m.freshness_changes_at(mono) + REPORT_MIN_SLEEP_S)
        self.reporter.period_s = min(REPORT_TICK_S, max(REPORT_MIN_SLEEP_S, wake - mono))

    def _publish_changes(self, mono: float) -> None:
        """overlay-report: publish the queued path changes in order; one that a stall or roam
        explains waits until the guard saw the traffic resume (its first answered probe, usually
        a guard_interval after the change), CHANGE_HOLD_S at most, so that it carries
        traffic_resumed; later changes of the same peer wait behind it."""
        episodes = self.guard.episodes if self.guard is not None else {}
        keep: List[Tuple[rospy.Time, PathChangeEvent, Explanation, str, float]] = []
        blocked = set()
        for stamp, ev, why, key, seen in self._held:
            if key not in blocked:
                done = completed(why, episodes.get(key), mono - seen, CHANGE_HOLD_S)
                if done is None:
                    blocked.add(key)
                else:
                    why = done
            if key in blocked:
                keep.append((stamp, ev, why, key, seen))
                continue
            self._publish(self.pub_changes, path_change_msg(stamp, ev, why), "~path_changes")
        self._held = keep

    def _publish(self, pub: rospy.Publisher, msg: Any, topic: str) -> None:
        """Publish; a message that cannot be sent is reported (faults, once in the log), not fatal."""
        try:
            pub.publish(msg)
        except Exception as exc:  # noqa: BLE001 - e.g. ROSSerializationException: report, go on
            text = f"cannot publish {topic}: {describe(exc)}"
            if self._publish_faults.get(topic) != text:
                self.log(LOG_ERROR, f"overlay_manager: {text}")
            self._publish_faults[topic] = text
        else:
            self._publish_faults.pop(topic, None)

    def _publish_links(self, reading: Reading, pl: PeerList) -> None:
        """~links/<peer>: the chosen peers' elements of ~peers, each on its own topic."""
        snap = reading.snapshot
        self.peer_topics.publish(snap.peers if snap else (), pl.peers, self._publish)
        if self._publish_faults:  # a fault of a topic that is gone goes with it
            live = set(self.peer_topics.topic_names())
            for topic in [t for t in self._publish_faults if t.startswith(TOPIC_PREFIX) and t not in live]:
                del self._publish_faults[topic]

    def peer_list_msg(self, reading: Reading, fresh: Freshness, now: rospy.Time) -> PeerList:
        """~peers (see ReportMessages.peer_list)."""
        return self.msgs.peer_list(reading, fresh, now)

    def status_msg(self, reading: Optional[Reading] = None, fresh: Optional[Freshness] = None,
                   health: Optional[List[WorkerHealth]] = None) -> OverlayStatus:
        """Current OverlayStatus (header.stamp left 0 for the caller)."""
        reading = reading if reading is not None else self.m.reading
        fresh = fresh if fresh is not None else self.m.freshness()
        return self.msgs.status(reading, fresh, health or [], list(self._publish_faults.values()))

    def diagnostics_msg(self, now: rospy.Time, health: List[WorkerHealth]) -> DiagnosticArray:
        """One DiagnosticStatus for the overlay, one per peer, one for the node's own threads."""
        return self.msgs.diagnostics(now, self.m.diagnostic_parts(), health, list(self._publish_faults.values()))

    def run_preflight(self, log: bool = False) -> PreflightResponse:
        """Run the preflight checks, return the service response (/diagnostics picks them up)."""
        checks = self.m.preflight()
        if log:
            for c in checks:
                if not c.ok:
                    self.log(LOG_WARN, f"preflight {c.name}: {c.message} -- {c.hint}")
        self.reporter.wake()
        return PreflightResponse(ok=all(c.ok for c in checks), checks=[
            PreflightCheck(name=c.name, ok=c.ok, message=c.message, hint=c.hint) for c in checks])

    def _ensure_iperf(self) -> None:
        """overlay-iperf: keep an iperf3 server bound to this machine's overlay IPv4 address."""
        if self._iperf is not None and self._iperf.poll() is None:
            return
        if self._iperf is not None:
            children.forget(self._iperf)
            self._iperf = None
        snap = self.m.snapshot
        ip = snap.self_peer.ipv4 if snap and snap.self_peer else ""
        if not ip:
            return
        try:
            self._iperf = children.spawn(iperf_server_argv(ip, self.cfg.node.iperf_port),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.log(LOG_INFO, f"iperf3 server on {ip}:{self.cfg.node.iperf_port}")
        except FileNotFoundError:
            self.log(LOG_WARN, "iperf3 not installed: ~measure_link from peers will fail")

    def shutdown(self) -> None:
        """Stop every thread and every child this node started (by pid)."""
        for w in [self.reporter] + self.workers:
            w.stop()
        children.kill_all()
        self.topics.close()
        self.bus.stop()
        self.m.close()
        if self.guard is not None:
            self.guard.close()
        self.log.close()

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
        self.poller.wake()  # the ping may have changed the path: read it now
        return PingPeerResponse(ok=o.ok, latency_min_ms=o.latency_min_ms, latency_mean_ms=o.latency_mean_ms,
                                latency_max_ms=o.latency_max_ms, received=o.received, path=o.path,
                                endpoint=o.endpoint, message=o.message)

    def srv_wait_for_peer(self, req: Any) -> WaitForPeerResponse:
        r = self.m.wait_for_peer(req.name, req.timeout, req.require_direct, rospy.is_shutdown,
                                 accept_peer_relay=req.accept_peer_relay)
        return WaitForPeerResponse(ok=r.ok, peer=peer_msg(r.peer), waited=r.waited_s, message=r.message)

    def srv_measure_link(self, req: Any) -> MeasureLinkResponse:
        r = self.m.measure_link(req.peer, req.duration, req.udp_bitrate)
        v = r.result
        return MeasureLinkResponse(ok=r.ok, tcp_throughput_mbps=v.tcp_throughput_mbps,
                                   udp_jitter_ms=v.udp_jitter_ms, udp_loss_percent=v.udp_loss_percent,
                                   rtt_min_ms=v.rtt_min_ms, rtt_mean_ms=v.rtt_mean_ms,
                                   rtt_max_ms=v.rtt_max_ms, path=r.path, message=r.message)

    def srv_get_ros_env(self, _req: Any) -> GetRosEnvResponse:
        env = self.m.ros_env()
        snap = self.m.snapshot
        ok = snap is not None and snap.backend_state == "Running"
        return GetRosEnvResponse(ok=ok, ros_master_uri=env.ros_master_uri, ros_hostname=env.ros_hostname,
                                 shell=env.shell(),
                                 message="" if ok else "not enrolled yet: names are computed from the config")

    def srv_preflight(self, _req: Any) -> PreflightResponse:
        return self.run_preflight()
