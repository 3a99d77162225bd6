"""What /diagnostics and ~preflight say, from the monitor's values. Pure: no ROS, no tailscaled.

The monitor calls these with what it holds (reading, NAT check, relay state, preflight checks);
the node turns the :class:`~overlay_manager.monitor.readings.Diagnostic` values into
``diagnostic_msgs``. A peer's entry (:func:`peer_diagnostic`) is kept with its PeerState
(:class:`DiagnosticParts`) while the peer, whether it is required and the NAT wording stay the same.
"""

from __future__ import annotations

import math
from typing import FrozenSet, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

from overlay_manager.core.config import DerperSettings, RobotConfig
from overlay_manager.core.identity import peer_key, short_label
from overlay_manager.core.mobility import HomeCheck
from overlay_manager.core.nat import NatInfo
from overlay_manager.core.peers import (
    PATH_DERP,
    PATH_DIRECT,
    PATH_IDLE,
    PATH_OFFLINE,
    PATH_PEER_RELAY,
    PeerState,
    Snapshot,
)
from overlay_manager.core.ros_env import RosEnv
from overlay_manager.monitor.readings import (
    ERROR,
    OK,
    WARN,
    Check,
    Diagnostic,
    Freshness,
    PortReading,
    is_overlay_address,
)
from overlay_manager.system import firewall
from overlay_manager.system.probes import NameLookups
from overlay_manager.tailscaled.derper import DerperState, derper_summary
from overlay_manager.tailscaled.relay import RelayServerState, relay_summary


def preflight_checks(cfg: RobotConfig, env: Mapping[str, str], want: RosEnv, own: Set[str],
                     seen: NameLookups) -> List[Check]:
    """Check this machine's ROS names resolve to overlay addresses and the master answers.

    env: the environment the ROS processes run with; want: the overlay names they should use;
    own: this machine's overlay addresses (empty when not known yet); seen: what the resolver
    and the master's port answered (system.probes.look_up_names, run by the caller).
    """
    checks: List[Check] = []
    host = env.get("ROS_HOSTNAME", "")
    if host.rstrip(".") != want.ros_hostname:
        checks.append(Check("ros_hostname_set", False,
                            f"ROS_HOSTNAME is {host!r}, not this machine's overlay name {want.ros_hostname}",
                            'eval "$(rosrun overlay_manager overlay_env --config <robot.yaml>)" before roslaunch'))
    else:
        checks.append(Check("ros_hostname_set", True, f"ROS_HOSTNAME={host}"))
    addrs = seen.own
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
    master = cfg.master_fqdn
    maddrs = seen.master
    if not maddrs:
        checks.append(Check("master_resolves", False, f"master {master} does not resolve",
                            "is the master machine enrolled? turn MagicDNS on or node.manage_hosts: true"))
    elif not any(is_overlay_address(a) or a.startswith("127.") for a in maddrs):
        checks.append(Check("master_resolves", False,
                            f"master {master} resolves to {', '.join(maddrs)}, not an overlay address",
                            "fix DNS or /etc/hosts so overlay names map to 100.64.0.0/10 addresses"))
    else:
        checks.append(Check("master_resolves", True, f"{master} -> {', '.join(maddrs)}"))
    if maddrs and seen.master_answers:
        checks.append(Check("master_xmlrpc", True, f"{master}:{cfg.master_port} answers"))
    else:
        checks.append(Check("master_xmlrpc", False,
                            f"ROS master XML-RPC {master}:{cfg.master_port} does not answer",
                            "start roscore on the master machine; check the overlay path to it"))
    return checks


MALFORMED_FIX = ("check that tailscaled is a supported version (`tailscale version`; tested with "
                 "1.102) and restart it (systemctl restart tailscaled)")
"""What to do when tailscaled's status has fields of the wrong type or out of range."""


def stale_diagnostic(snap: Optional[Snapshot], fresh: Freshness, login_server: str) -> Diagnostic:
    """The one entry while tailscaled cannot be read (nothing per peer is known then)."""
    age = "never" if math.isnan(fresh.age_s) else f"{fresh.age_s:.1f}"
    vals = [("error", fresh.error), ("status_age_s", age), ("login_server", login_server)]
    if snap is None:
        msg = f"tailscaled not reachable: {fresh.error}"
    else:
        msg = f"stale: tailscaled last answered {age} s ago: {fresh.error}"
        if snap.self_peer:
            vals.append(("addresses", " ".join(snap.self_peer.addresses)))
    return Diagnostic(ERROR, "overlay", msg, tuple(vals))


def overlay_diagnostic(snap: Snapshot, cfg: RobotConfig, env: RosEnv, nat: NatInfo, checks: Iterable[Check],
                       enrol_error: str, hosts_error: str) -> Diagnostic:
    """The "overlay" entry: enrolment, control server, hosts file, preflight and tailscaled
    health, the first problem in that order as the message."""
    values = [("backend_state", snap.backend_state), ("login_server", cfg.login_server),
              ("control_reachable", str(snap.control_reachable)), ("nat", nat.summary),
              ("peers", str(len(snap.peers))),
              ("ros_hostname", env.ros_hostname),
              ("ros_master_uri", env.ros_master_uri)]
    if snap.self_peer:
        values.append(("addresses", " ".join(snap.self_peer.addresses)))
    for h in snap.health:
        values.append(("health", h))
    checks = list(checks)
    failing = [c for c in checks if not c.ok]
    for c in checks:
        values.append((f"preflight {c.name}", c.message + (f" -- {c.hint}" if c.hint and not c.ok else "")))
    for m in snap.malformed:
        values.append(("malformed", m))
    if enrol_error:
        values.append(("enrol_error", enrol_error))
        level, msg = ERROR, f"enrolment failed: {enrol_error}"
    elif snap.malformed:
        # not "control server unreachable" or "not enrolled": what tailscaled said cannot be read
        level = WARN if snap.backend_state == "Running" else ERROR
        msg = f"tailscaled's status answer is malformed ({snap.malformed[0]}) -- fix: {MALFORMED_FIX}"
    elif snap.backend_state != "Running":
        level, msg = ERROR, f"not enrolled: tailscaled state is {snap.backend_state or 'unknown'}"
    elif not snap.control_reachable:
        level, msg = WARN, "control server unreachable: existing links keep working, changes wait"
    elif hosts_error:
        level, msg = WARN, hosts_error
    elif failing:
        level, msg = WARN, f"preflight: {failing[0].message} -- {failing[0].hint}"
    elif snap.health:
        level, msg = WARN, snap.health[0]
    else:
        level, msg = OK, f"enrolled as {snap.self_peer.dns_name if snap.self_peer else '?'}"
    return Diagnostic(level, "overlay", msg, tuple(values))


def relay_diagnostic(cfg: RobotConfig, st: RelayServerState) -> Optional[Diagnostic]:
    """The "peer relay" entry: on a relay host (or one serving a relay it should not), what it
    relays, on which port, how many sessions; None on other machines."""
    if cfg.relay is None and not st.active and not st.error:
        return None
    text, ok = relay_summary(cfg.relay, st)
    values = [("asked_port", str(cfg.relay.port) if cfg.relay else "none (no relay key)"),
              ("port", "off" if st.port is None else str(st.port)),
              ("sessions", str(len(st.sessions))),
              ("sessions_carrying_traffic", str(sum(1 for x in st.sessions if x.bound)))]
    if cfg.relay and cfg.relay.static_endpoints:
        values.append(("static_endpoints", " ".join(cfg.relay.static_endpoints)))
    for x in st.sessions:
        values.append((f"session vni {x.vni}", f"{x.endpoints[0] or '?'} <-> {x.endpoints[1] or '?'}, "
                                               f"bytes {x.bytes[0]} / {x.bytes[1]}"))
    return Diagnostic(OK if ok else WARN, "peer relay", text, tuple(values))


def beyond_overlay(reading: PortReading, own: Iterable[str]) -> List[str]:
    """Addresses the port listens on that reach beyond this machine and the overlay: every
    address (0.0.0.0, ::) or one that is neither loopback, an overlay address nor in ``own``."""
    own = set(own)
    return [x.address for x in reading.listeners
            if not x.loopback and (x.wildcard or not (x.address in own or is_overlay_address(x.address)))]


def rosbridge_diagnostic(reading: Optional[PortReading], own: Iterable[str]) -> Optional[Diagnostic]:
    """The "rosbridge" entry: is rosbridge's websocket port reachable beyond loopback and the
    overlay? None when the port is not checked (node.rosbridge_port 0).

    OK: it listens on loopback/overlay addresses only, or on every address with the nftables
    table restricting it; WARN: nothing listens, it is reachable beyond the overlay, or it
    listens on every address and this process cannot tell whether nftables restricts it.
    own: this machine's overlay addresses.
    """
    if reading is None or reading.port == 0:
        return None
    port = reading.port
    fix = firewall.fix(port)
    addrs = " ".join(x.address for x in reading.listeners)
    values = [("port", str(port)), ("listening_on", addrs or "nothing")]
    if reading.error:
        values.append(("error", reading.error))
    r = reading.restriction
    if r is not None:
        values.append(("nftables", f"{r.state}: {r.detail}"))
    name = "rosbridge"
    if not reading.listeners:
        if reading.error:
            return Diagnostic(WARN, name, f"cannot read the listening sockets: {reading.error}", tuple(values))
        return Diagnostic(WARN, name, f"nothing listens on TCP port {port}: rosbridge_websocket is not "
                          "running (not started yet, or it failed: see its log)", tuple(values))
    wide = beyond_overlay(reading, own)
    if not wide:
        return Diagnostic(OK, name, f"TCP port {port} listens on loopback/overlay addresses only ({addrs})",
                          tuple(values))
    where = ", ".join(wide)
    if r is not None and r.state == firewall.RESTRICTED:
        return Diagnostic(OK, name, f"TCP port {port} listens on {where}, restricted: {r.detail}", tuple(values))
    if r is not None and r.state == firewall.MISSING:
        return Diagnostic(WARN, name, f"TCP port {port} is reachable beyond the overlay: it listens on "
                          f"{where} and {r.detail} -- fix: {fix}", tuple(values))
    why = r.detail if r is not None else "cannot tell whether nftables restricts it"
    return Diagnostic(WARN, name, f"TCP port {port} listens on {where}, maybe reachable beyond the overlay: "
                      f"{why} -- fix if not done: {fix}", tuple(values))


def missing_required(required: FrozenSet[str], snap: Snapshot) -> List[Diagnostic]:
    """An ERROR entry for each required host (OverlayMonitor.required_peers) that names no peer
    of the tailnet (core.identity.refers_to)."""
    return [Diagnostic(ERROR, f"peer {short_label(name)}", "required peer is not on the overlay (never "
                       "enrolled, or removed from the tailnet, or hidden by the ACL policy)",
                       (("required", "true"),))
            for name in sorted(required) if snap.find(name) is None]


def required_keys(required: FrozenSet[str], snap: Snapshot) -> FrozenSet[str]:
    """The peer keys (core.identity.peer_key) of the peers the required hosts name."""
    found = (snap.find(name) for name in required)
    return frozenset(peer_key(p) for p in found if p is not None)


def derp_reason(nat: NatInfo) -> str:
    """Why a link is relayed through DERP, as far as this machine's NAT check can tell."""
    reason = "relayed through DERP"
    if nat.known and not nat.udp:
        return reason + ": UDP is blocked on this network"
    if nat.known and nat.hard_nat:
        return reason + ": this machine is behind a hard (symmetric) NAT"
    return reason + " (hole punching failed or not finished; the peer's NAT may be hard)"


def peer_diagnostic(p: PeerState, required: bool, derp_why: str) -> Diagnostic:
    """A peer's entry: OK direct, peer-relay or idle; WARN relayed through DERP (derp_why says
    why); offline is ERROR for a required peer, else OK. Its values hold the link's figures as
    plain numbers (latency_ms, rx_bytes, tx_bytes), which PlotJuggler's /diagnostics parser plots
    by the entry's name, i.e. by peer."""
    pv: Tuple[Tuple[str, str], ...] = (
        ("dns_name", p.dns_name), ("addresses", " ".join(p.addresses)), ("path", p.path),
        ("endpoint", p.endpoint), ("relay_region", p.relay_region),
        ("latency_ms", "unknown" if math.isnan(p.latency_ms) else f"{p.latency_ms:.2f}"),
        ("rx_bytes", str(p.rx_bytes)), ("tx_bytes", str(p.tx_bytes)))
    name = f"peer {p.name}"
    if p.path == PATH_OFFLINE:
        if required:
            return Diagnostic(ERROR, name, "offline (a required peer: the ROS master's machine or in "
                              "node.required_peers)", pv)
        return Diagnostic(OK, name, "offline (not a required peer)", pv)
    if p.path == PATH_DIRECT:
        return Diagnostic(OK, name, f"direct via {p.endpoint}", pv)
    if p.path == PATH_DERP:
        return Diagnostic(WARN, name, f"{derp_why}, region {p.relay_region}", pv)
    if p.path == PATH_PEER_RELAY:
        # OK, not WARN: one UDP hop through a fleet relay machine carries near-direct throughput
        # (measured: several times DERP); the WARN is for DERP, where links fall back to when the
        # relay goes away
        relay = f"relay {p.relay_host} ({p.peer_relay})" if p.relay_host else f"relay {p.peer_relay}"
        return Diagnostic(OK, name, f"peer-relay via {relay}: one UDP hop through the relay, near-direct "
                          "throughput", pv + (("peer_relay", p.peer_relay), ("relay_host", p.relay_host or "unknown")))
    if p.path == PATH_IDLE:
        return Diagnostic(OK, name, "online, idle (no traffic yet: path unknown)", pv)
    return Diagnostic(WARN, name, "path unknown", pv)


class DiagnosticParts(NamedTuple):
    """/diagnostics as the monitor states it: the entries about this machine (head, in order), then
    one per peer (:meth:`peer_entry`), kept with the peer (PeerState.derived) while the peer, its
    required flag and derp_why stay the same.

    required: the peer keys (core.identity.peer_key) of the required peers (:func:`required_keys`);
    derp_why: :func:`derp_reason` of the NAT check.
    """

    head: List[Diagnostic]
    peers: Sequence[PeerState]
    required: FrozenSet[str]
    derp_why: str

    def is_required(self, p: PeerState) -> bool:
        """Whether p is one of the required peers."""
        return peer_key(p) in self.required

    def peer_entry(self, p: PeerState) -> Diagnostic:
        """p's entry (:func:`peer_diagnostic`), built once per peer, required flag and derp_why."""
        return p.derived(peer_diagnostic, self.is_required(p), self.derp_why)

    def entries(self) -> List[Diagnostic]:
        """Every entry, in order."""
        return self.head + [self.peer_entry(p) for p in self.peers]


def derper_diagnostic(settings: Optional[DerperSettings], state: DerperState) -> Optional[Diagnostic]:
    """The "DERP server" /diagnostics entry of a derper host: OK while derper answers (with its
    counters), ERROR when it does not (its region is gone for the machines homed there); None on
    machines without the ``derper`` key."""
    if settings is None:
        return None
    text, ok = derper_summary(settings, state)
    values = [("region", settings.region or "?"), ("url", settings.url),
              ("listening", "true" if state.listening else "false")]
    if state.listening:
        values += [("connections", str(state.connections)), ("home_connections", str(state.home_connections)),
                   ("clients", str(state.clients)), ("bytes_received", str(state.bytes_received)),
                   ("bytes_sent", str(state.bytes_sent)), ("packets_received", str(state.packets_received)),
                   ("packets_sent", str(state.packets_sent)), ("version", state.version or "?")]
    return Diagnostic(OK if ok else ERROR, "DERP server", text, tuple(values))


def mobility_diagnostic(home: HomeCheck, episodes: int, actions: int, underlay: str) -> Optional[Diagnostic]:
    """The "home DERP region" entry (monitor/path_guard.py): ERROR while the home region's derper
    refuses connections, saying what the node did about it; OK with the region otherwise. None
    before the first check."""
    if not home.region and not home.error:
        return None
    values = (("home_region", home.region or "unknown"), ("forced_region", home.forced_region or "none"),
              ("stalls_and_roams_15s", str(episodes)), ("debug_actions_asked", str(actions)),
              ("underlay", underlay))
    if not home.ok:
        return Diagnostic(ERROR, "home DERP region",
                          f"home DERP region {home.region} refuses connections ({home.error}); {home.action}"
                          f" -- fix: start its derper; meanwhile machines that need DERP relay through another"
                          f" region", values)
    text = f"home DERP region {home.region or 'unknown'}"
    if home.forced_region:
        text += (" (the node asked tailscaled to prefer it while another region's derper refused connections)")
    if home.error:
        text += f"; {home.error}"
    return Diagnostic(OK, "home DERP region", text, values)
