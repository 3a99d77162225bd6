"""tailscaled status JSON -> typed peer values, path classification and change detection (pure).

Path rule (measured against tailscale v1.102.5), from ipnstate.PeerStatus:
- not Online                      -> offline
- CurAddr non-empty               -> direct (endpoint = CurAddr), whether Active or not
- PeerRelay non-empty             -> peer-relay
- Active with both empty          -> derp (region = Relay, the peer's home DERP region)
- otherwise                       -> idle (no recent traffic: no path known yet)
``Relay`` alone does NOT mean relayed: it is always set to the peer's home region.

CurAddr without Active: ``tailscale status`` prints such a peer as "idle", because it shows
whether traffic flowed in the last 45 s (Active) before it shows the path. Here it is ``direct``:
tailscaled fills CurAddr only while it trusts that UDP address enough to send to it without
DERP (magicsock's addrForSend), so the next packet goes direct. Calling it idle would make
~path_changes report direct -> idle -> direct whenever a link pauses, without any path change;
whether traffic flows recently is the separate ``active`` field.

Unknown JSON fields are ignored; missing ones become "unknown" values (empty strings, NaN, None).
Values that do not fit a ROS message field are clamped or marked unknown, never fatal: counters
to 0..2^64-1 (NaN, inf and negatives -> 0), times outside ROS time's range -> 0 (unknown),
latencies that are not finite and >= 0 -> NaN, strings that are not valid UTF-8 -> U+FFFD.
Fields tailscaled sent with the wrong type or out of range are named in ``PeerState.malformed``
and ``Snapshot.malformed`` (tailscaled is sending nonsense: the node warns, /diagnostics says so).

Peer relay: ipnstate's ``PeerRelay`` is ``"{ip}:{port}:vni:{vni}"``; ``endpoint`` and
``peer_relay`` carry the relay's ``ip:port`` and ``relay_vni`` the VNI (Geneve virtual network
identifier of the relay session).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from overlay_manager.core.identity import names_peer, peer_key, refers_to
from overlay_manager.core.json_fields import (
    UINT64_MAX,
    json_kind,
    parse_time,
    str_field,
    str_list_field,
    uint_field,
)

PATH_UNKNOWN = "unknown"
PATH_IDLE = "idle"
PATH_DIRECT = "direct"
PATH_DERP = "derp"
PATH_PEER_RELAY = "peer-relay"
PATH_OFFLINE = "offline"
PATH_SELF = "self"
RELAY_TAG = "tag:relay"
"""ACL tag the fleet gives every peer relay host (fleet file ``relays``)."""
PATHS = (PATH_UNKNOWN, PATH_IDLE, PATH_DIRECT, PATH_DERP, PATH_PEER_RELAY, PATH_OFFLINE)



@dataclass(frozen=True)
class PeerState:
    """One machine on the overlay as tailscaled reports it.

    Times are POSIX seconds (0.0 = never/unknown); byte counters since tailscaled started.
    """

    name: str                      # short name (HostName, or the first DNS label)
    dns_name: str                  # overlay FQDN without trailing dot ("" = unknown)
    addresses: Tuple[str, ...]     # overlay IPs, IPv4 first
    online: bool
    active: bool
    path: str                      # one of PATHS (or PATH_SELF for this machine)
    endpoint: str = ""             # "ip:port" when direct; the relay's "ip:port" when peer-relay
    relay_region: str = ""         # home DERP region code (the relay in use when path == derp)
    latency_ms: float = math.nan   # last measured RTT through the overlay; NaN = unknown
    last_handshake: float = 0.0
    last_seen: float = 0.0
    rx_bytes: int = 0
    tx_bytes: int = 0
    tags: Tuple[str, ...] = ()
    os: str = ""
    node_id: str = ""              # tailscaled's stable node id
    peer_relay: str = ""           # peer-relay: "ip:port" of the relay server in use; else ""
    relay_host: str = ""           # peer-relay: short name of the relay machine ("" = unknown)
    relay_vni: int = 0             # peer-relay: VNI of the relay session (0 = none/unknown)
    malformed: Tuple[str, ...] = ()  # fields tailscaled sent with a wrong type or out of range
    derp_region: str = ""          # derp: readable name of the region in use (with_region_names)

    def matches(self, query: str) -> bool:
        """True when query names this peer: short name, FQDN or overlay IP (core.identity.refers_to)."""
        return refers_to(query, self)

    @property
    def ipv4(self) -> str:
        """First IPv4 overlay address, or the first address, or ""."""
        for a in self.addresses:
            if ":" not in a:
                return a
        return self.addresses[0] if self.addresses else ""


@dataclass(frozen=True)
class Snapshot:
    """One read of tailscaled's status."""

    backend_state: str                     # "" = unknown
    self_peer: Optional[PeerState]
    peers: Tuple[PeerState, ...]           # sorted by name
    health: Tuple[str, ...] = ()
    magic_dns_suffix: str = ""
    control_reachable: bool = False        # Self.Online: in the control server's map poll
    version: str = ""
    malformed: Tuple[str, ...] = ()        # status-level fields with a wrong type ("" = none)

    def find(self, query: str) -> Optional[PeerState]:
        """The peer named by short name, FQDN or overlay IP (core.identity.refers_to); None when unknown."""
        test = names_peer(query)
        for p in self.peers:
            if test(p):
                return p
        return None


_BOOL_FIELDS = ("Online", "Active")
_STR_FIELDS = ("DNSName", "HostName", "CurAddr", "PeerRelay", "Relay", "OS", "ID", "LastHandshake", "LastSeen")
_LIST_FIELDS = ("TailscaleIPs", "Tags")
_COUNT_FIELDS = ("RxBytes", "TxBytes")


def malformed_fields(ps: Mapping[str, Any]) -> Tuple[str, ...]:
    """The fields of one ipnstate.PeerStatus dict with a wrong type or out of range, each as
    "Field: what is wrong (what is shown instead)"; () for a well-formed peer. Missing fields
    are not malformed (older or newer tailscaled versions leave some out)."""
    out: List[str] = []
    for k in _BOOL_FIELDS:
        v = ps.get(k)
        if v is not None and not isinstance(v, bool):
            out.append(f"{k} is {json_kind(v)}, expected true/false (taken as false)")
    for k in _STR_FIELDS:
        v = ps.get(k)
        if v is not None and not isinstance(v, str):
            out.append(f"{k} is {json_kind(v)}, expected a string (taken as empty)")
    for k in _LIST_FIELDS:
        v = ps.get(k)
        if v is not None and not isinstance(v, list):
            out.append(f"{k} is {json_kind(v)}, expected a list (taken as empty)")
    for k in _COUNT_FIELDS:
        v = ps.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            out.append(f"{k} is {json_kind(v)}, expected a byte count (shown as 0)")
        elif isinstance(v, float) and not math.isfinite(v):
            out.append(f"{k} = {v} is not a byte count (shown as 0)")
        elif v < 0:
            out.append(f"{k} = {v} is negative (shown as 0)")
        elif v > UINT64_MAX:
            out.append(f"{k} = {v:.3g} is above 2^64-1 (clamped to 2^64-1)")
    return tuple(out)


def status_malformed(status: Mapping[str, Any]) -> Tuple[str, ...]:
    """The top-level fields of a LocalAPI /status dict with a wrong type (see malformed_fields)."""
    out: List[str] = []
    for k, ok, want in (("BackendState", lambda v: isinstance(v, str), "a string"),
                        ("Self", lambda v: isinstance(v, dict), "an object"),
                        ("Peer", lambda v: isinstance(v, dict), "an object"),
                        ("Health", lambda v: isinstance(v, list), "a list"),
                        ("MagicDNSSuffix", lambda v: isinstance(v, str), "a string")):
        v = status.get(k)
        if v is not None and not ok(v):
            out.append(f"{k} is {json_kind(v)}, expected {want}")
    me = status.get("Self")
    if isinstance(me, dict):
        v = me.get("Online")
        if v is not None and not isinstance(v, bool):
            out.append(f"Self.Online is {json_kind(v)}, expected true/false")
    return tuple(out)


def relay_vni(peer_relay: str) -> int:
    """The VNI from ipnstate's PeerRelay (``"{ip}:{port}:vni:{vni}"``); 0 when there is none."""
    _head, sep, vni = peer_relay.partition(":vni:")
    return int(vni) if sep and vni.isdigit() and int(vni) <= 0xFFFFFFFF else 0


def classify_path(ps: Mapping[str, Any]) -> Tuple[str, str]:
    """Path of one ipnstate.PeerStatus dict -> (path, endpoint); see the module docstring.

    The endpoint is ``ip:port`` for direct (CurAddr) and for peer-relay (the relay server's,
    without PeerRelay's ``:vni:N`` part: see :func:`relay_vni`).
    """
    online = ps.get("Online")
    if online is False:
        return PATH_OFFLINE, ""
    cur = str_field(ps, "CurAddr")
    if cur:
        return PATH_DIRECT, cur
    relay = str_field(ps, "PeerRelay")
    if relay:
        return PATH_PEER_RELAY, relay_endpoint(relay)
    active = ps.get("Active")
    if active is True:
        return PATH_DERP, ""
    if active is False or online is True:
        return PATH_IDLE, ""
    return PATH_UNKNOWN, ""


def short_name(ps: Mapping[str, Any]) -> str:
    """The peer's short name: first label of DNSName (unique in the tailnet), else HostName."""
    dns = str_field(ps, "DNSName").rstrip(".")
    if dns:
        return dns.split(".", 1)[0]
    return str_field(ps, "HostName")


def _sort_addresses(addrs: Iterable[str]) -> Tuple[str, ...]:
    return tuple(sorted(addrs, key=lambda a: (":" in a, a)))


def parse_peer(ps: Mapping[str, Any], is_self: bool = False) -> PeerState:
    """One ipnstate.PeerStatus dict -> PeerState (lenient: missing fields -> unknown)."""
    if is_self:
        path, endpoint = PATH_SELF, ""
    else:
        path, endpoint = classify_path(ps)
    return PeerState(
        name=short_name(ps),
        dns_name=str_field(ps, "DNSName").rstrip("."),
        addresses=_sort_addresses(str_list_field(ps, "TailscaleIPs")),
        online=ps.get("Online") is True,
        active=ps.get("Active") is True,
        path=path,
        endpoint=endpoint,
        relay_region=str_field(ps, "Relay"),
        last_handshake=parse_time(ps.get("LastHandshake")),
        last_seen=parse_time(ps.get("LastSeen")),
        rx_bytes=uint_field(ps, "RxBytes"),
        tx_bytes=uint_field(ps, "TxBytes"),
        tags=str_list_field(ps, "Tags"),
        os=str_field(ps, "OS"),
        node_id=str_field(ps, "ID"),
        peer_relay=endpoint if path == PATH_PEER_RELAY else "",
        relay_vni=relay_vni(str_field(ps, "PeerRelay")) if path == PATH_PEER_RELAY else 0,
        malformed=malformed_fields(ps),
    )


def relay_endpoint(peer_relay: str) -> str:
    """The relay's ``ip:port`` from ipnstate's PeerRelay (``"{ip}:{port}:vni:{vni}"``).

    Returns "" for "" and the text unchanged when it has no ``:vni:`` part.
    """
    head, _sep, _vni = peer_relay.partition(":vni:")
    return head


def _addr_of(endpoint: str) -> str:
    """The address part of ``ip:port`` / ``[ip]:port`` ("" when there is none)."""
    host, sep, _port = endpoint.rpartition(":")
    if not sep:
        return ""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def relay_host_name(endpoint: str, peers: Iterable[Any]) -> str:
    """Short name of the tailnet machine that serves the peer relay at ``endpoint`` ("" = unknown).

    Args:
        endpoint: the relay's ``ip:port`` (see :func:`relay_endpoint`).
        peers: ipnstate.PeerStatus dicts (the status's ``Peer`` values).

    The machine whose direct UDP path (``CurAddr``; ``Addrs`` too, though tailscaled v1.102.5
    leaves it empty) has the relay's address: a relay server binds all interfaces of its machine.
    Otherwise the one peer tagged :data:`RELAY_TAG` (the fleet's relay hosts), if there is exactly
    one. Else unknown (e.g. several relays, none with a direct path from here).
    """
    addr = _addr_of(endpoint)
    if not addr:
        return ""
    tagged = []
    for ps in peers:
        if not isinstance(ps, Mapping):
            continue
        eps = list(str_list_field(ps, "Addrs")) + [str_field(ps, "CurAddr")]
        if any(_addr_of(e) == addr for e in eps):
            return short_name(ps)
        if RELAY_TAG in str_list_field(ps, "Tags"):
            tagged.append(short_name(ps))
    return tagged[0] if len(tagged) == 1 else ""


def parse_status(status: Mapping[str, Any], peers: Optional[Iterable[PeerState]] = None) -> Snapshot:
    """A LocalAPI /status dict -> Snapshot. Never raises on odd input.

    peers: this read's peers already parsed (the node's peer_rows.PeerRows stage, which reuses
    unchanged ones), sorted by name; None parses the ``Peer`` map here.
    """
    self_raw = status.get("Self")
    self_peer = parse_peer(self_raw, is_self=True) if isinstance(self_raw, dict) else None
    if peers is None:
        peers_raw = status.get("Peer")
        parsed: List[PeerState] = []
        if isinstance(peers_raw, dict):
            for ps in peers_raw.values():
                if isinstance(ps, dict):
                    peer = parse_peer(ps)
                    if peer.peer_relay:
                        peer = replace(peer, relay_host=relay_host_name(peer.peer_relay, peers_raw.values()))
                    parsed.append(peer)
        parsed.sort(key=lambda p: (p.name, p.dns_name))
        peers = parsed
    suffix = str_field(status, "MagicDNSSuffix")
    tailnet = status.get("CurrentTailnet")
    if not suffix and isinstance(tailnet, dict):
        suffix = str_field(tailnet, "MagicDNSSuffix")
    return Snapshot(
        backend_state=str_field(status, "BackendState"),
        self_peer=self_peer,
        peers=tuple(peers),
        health=str_list_field(status, "Health"),
        magic_dns_suffix=suffix,
        control_reachable=isinstance(self_raw, dict) and self_raw.get("Online") is True,
        version=str_field(status, "Version"),
        malformed=status_malformed(status),
    )


def with_latency(snapshot: Snapshot, latency_ms: Mapping[str, float]) -> Snapshot:
    """Copy of snapshot with latency_ms filled from a {peer key: ms} map (core.identity.peer_key)."""
    peers = []
    for p in snapshot.peers:  # copy only the peers whose latency differs (a few of hundreds)
        ms = latency_ms.get(peer_key(p), math.nan)
        same = ms == p.latency_ms or (math.isnan(ms) and math.isnan(p.latency_ms))
        peers.append(p if same else replace(p, latency_ms=ms))
    return replace(snapshot, peers=tuple(peers))


def derp_region_name(p: PeerState, names: Mapping[str, str]) -> str:
    """What ``derp_region`` of p must be: for a derp peer the readable name of its relay region
    (``names``: region code -> RegionName from the DERP map; the code itself when the map has no
    name), else ""."""
    return (names.get(p.relay_region) or p.relay_region) if p.path == PATH_DERP else ""


def with_region_names(snapshot: Snapshot, names: Mapping[str, str]) -> Snapshot:
    """Copy of snapshot with each derp peer's ``derp_region`` set to the readable name of its
    relay region (``names``: region code -> RegionName from the DERP map; the code itself when
    the map has no name) and every other peer's cleared. Unchanged peers stay the same objects."""
    peers = []
    for p in snapshot.peers:
        want = derp_region_name(p, names)
        peers.append(p if p.derp_region == want else replace(p, derp_region=want))
    return replace(snapshot, peers=tuple(peers))


def blind(snapshot: Snapshot, daemon_gone: bool) -> Snapshot:
    """The snapshot to present while tailscaled cannot be read: the last known peers (names and
    addresses stay useful), none online, path offline when tailscaled is not running at all (no
    overlay packet can flow) or unknown when it runs but does not answer usefully; no endpoint,
    no latency; backend state unknown, control server not reachable."""
    path = PATH_OFFLINE if daemon_gone else PATH_UNKNOWN
    peers = tuple(replace(p, online=False, active=False, path=path, endpoint="", latency_ms=math.nan,
                          peer_relay="", relay_host="", relay_vni=0, derp_region="")
                  for p in snapshot.peers)
    return replace(snapshot, backend_state="", peers=peers, control_reachable=False, health=())


def peer_fingerprint(p: PeerState) -> Tuple[Any, ...]:
    """Everything about a peer except measurements (byte counters, handshake and last-seen
    times, latency): what makes a change worth publishing at once."""
    return (p.name, p.dns_name, p.addresses, p.online, p.active, p.path, p.endpoint,
            p.relay_region, p.tags, p.os, p.node_id, p.peer_relay, p.relay_host, p.relay_vni,
            p.derp_region)


def same_but_measurements(a: Optional[Snapshot], b: Optional[Snapshot]) -> bool:
    """a and b agree on this machine and every peer in everything but measurements (peer_fingerprint).

    Cheap for the node's case: peer_rows.PeerRows reuses unchanged PeerState objects, so most
    peers are the same object and only the others are compared field by field.
    """
    if a is b:
        return True
    if a is None or b is None or len(a.peers) != len(b.peers):
        return False
    if a.self_peer is not b.self_peer and (a.self_peer is None or b.self_peer is None
                                           or peer_fingerprint(a.self_peer) != peer_fingerprint(b.self_peer)):
        return False
    return all(x is y or peer_fingerprint(x) == peer_fingerprint(y) for x, y in zip(a.peers, b.peers))


@dataclass(frozen=True)
class PathChangeEvent:
    """A peer's path changed between two snapshots ("" old_path: first time seen)."""

    peer: PeerState
    old_path: str
    new_path: str


def path_changes(old: Optional[Snapshot], new: Snapshot) -> List[PathChangeEvent]:
    """Every peer whose path differs between old and new (peers are matched by core.identity.peer_key),
    and every derp peer whose relay region changed (old and new path both derp: the peer
    re-homed to another DERP region).

    A peer that disappeared from the tailnet is reported as a change to offline.
    """
    key = peer_key
    before: Dict[str, PeerState] = {key(p): p for p in old.peers} if old else {}
    events: List[PathChangeEvent] = []
    seen = set()
    for p in new.peers:
        k = key(p)
        seen.add(k)
        prev = before.get(k)
        old_path = prev.path if prev else ""
        if old_path != p.path:
            events.append(PathChangeEvent(p, old_path, p.path))
        elif prev is not None and p.path == PATH_DERP and prev.relay_region != p.relay_region:
            events.append(PathChangeEvent(p, PATH_DERP, PATH_DERP))
    for k, prev in before.items():
        if k not in seen and prev.path != PATH_OFFLINE:
            events.append(PathChangeEvent(replace(prev, online=False, path=PATH_OFFLINE,
                                                  endpoint="", relay_vni=0), prev.path, PATH_OFFLINE))
    return events


def ping_path(result: Mapping[str, Any]) -> Tuple[str, str]:
    """An ipnstate.PingResult dict -> (path, endpoint or DERP region code) the ping used."""
    if str_field(result, "Err"):
        return PATH_UNKNOWN, ""
    if str_field(result, "Endpoint"):
        return PATH_DIRECT, str_field(result, "Endpoint")
    if str_field(result, "PeerRelay"):
        return PATH_PEER_RELAY, relay_endpoint(str_field(result, "PeerRelay"))
    if uint_field(result, "DERPRegionID") or str_field(result, "DERPRegionCode"):
        return PATH_DERP, str_field(result, "DERPRegionCode") or str(uint_field(result, "DERPRegionID"))
    return PATH_UNKNOWN, ""
