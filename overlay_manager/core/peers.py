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
import operator
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple, TypeVar

from overlay_manager.core.identity import key_of, names_peer, peer_key, refers_to
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



_FIELDS = ("name", "dns_name", "addresses", "online", "active", "path", "endpoint", "relay_region", "latency_ms",
           "last_handshake", "last_seen", "rx_bytes", "tx_bytes", "tags", "os", "node_id", "peer_relay",
           "relay_host", "relay_vni", "malformed", "derp_region")
_values = operator.attrgetter(*_FIELDS)
W = TypeVar("W")


class PeerState:
    """One machine on the overlay as the node shows it, like tailscale's ipnstate.PeerStatus: what
    tailscaled said about it plus what the node adds (the latency of its pings, the relay
    machine's name, the DERP region's readable name). One object per peer carries it from the
    status JSON to the published messages (:class:`SnapshotBuilder` builds it, ``Snapshot.peers``
    holds it, the node's messages are built from it and kept with it: :meth:`derived`).

    Immutable, and not a dataclass: a built peer cannot be changed or copied with a change
    (assignment raises AttributeError, ``dataclasses.replace`` TypeError). Every value it shows
    is an argument of its construction, so a peer whose inputs did not change stays the same
    object from read to read, and what was built from it stays valid.

    Times are POSIX seconds (0.0 = never/unknown); byte counters since tailscaled started.
    """

    name: str                      # short name (HostName, or the first DNS label)
    dns_name: str                  # overlay FQDN without trailing dot ("" = unknown)
    addresses: Tuple[str, ...]     # overlay IPs, IPv4 first
    online: bool
    active: bool
    path: str                      # one of PATHS (or PATH_SELF for this machine)
    endpoint: str                  # "ip:port" when direct; the relay's "ip:port" when peer-relay
    relay_region: str              # home DERP region code (the relay in use when path == derp)
    latency_ms: float              # last measured RTT through the overlay; NaN = unknown
    last_handshake: float
    last_seen: float
    rx_bytes: int
    tx_bytes: int
    tags: Tuple[str, ...]
    os: str
    node_id: str                   # tailscaled's stable node id
    peer_relay: str                # peer-relay: "ip:port" of the relay server in use; else ""
    relay_host: str                # peer-relay: short name of the relay machine ("" = unknown)
    relay_vni: int                 # peer-relay: VNI of the relay session (0 = none/unknown)
    malformed: Tuple[str, ...]     # fields tailscaled sent with a wrong type or out of range
    derp_region: str               # derp: readable name of the region in use (from the DERP map)

    __slots__ = _FIELDS + ("_derived",)

    def __init__(self, name: str, dns_name: str, addresses: Tuple[str, ...], online: bool, active: bool,
                 path: str, endpoint: str = "", relay_region: str = "", latency_ms: float = math.nan,
                 last_handshake: float = 0.0, last_seen: float = 0.0, rx_bytes: int = 0, tx_bytes: int = 0,
                 tags: Tuple[str, ...] = (), os: str = "", node_id: str = "", peer_relay: str = "",
                 relay_host: str = "", relay_vni: int = 0, malformed: Tuple[str, ...] = (),
                 derp_region: str = "") -> None:
        put = object.__setattr__
        if latency_ms != latency_ms:  # any NaN is math.nan: equal peers compare and hash equal
            latency_ms = math.nan
        for k, v in zip(_FIELDS, (name, dns_name, addresses, online, active, path, endpoint, relay_region,
                                  latency_ms, last_handshake, last_seen, rx_bytes, tx_bytes, tags, os, node_id,
                                  peer_relay, relay_host, relay_vni, malformed, derp_region)):
            put(self, k, v)
        put(self, "_derived", None)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"PeerState is immutable (cannot set {key}): what a peer shows is given when "
                             "it is built (core.peers.SnapshotBuilder)")

    def __delattr__(self, key: str) -> None:
        raise AttributeError(f"PeerState is immutable (cannot delete {key})")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not PeerState:
            return NotImplemented
        return self is other or _values(self) == _values(other)

    def __hash__(self) -> int:
        return hash(_values(self))

    def __repr__(self) -> str:
        return "PeerState(" + ", ".join(f"{k}={v!r}" for k, v in zip(_FIELDS, _values(self))) + ")"

    def __reduce__(self) -> Tuple[Any, ...]:
        return PeerState, _values(self)

    def derived(self, make: Callable[..., W], *args: Any) -> W:
        """make(self, *args), kept with this peer: built on the first call and again only when
        args differ (==) from the last call with the same make (one function object per form:
        the node's ``Peer`` message and bytes, the /diagnostics entry, its message and bytes).
        Filled by one thread (the node's overlay-report); make must not depend on anything but
        the peer and args."""
        memo = self._derived
        if memo is None:
            memo = {}
            object.__setattr__(self, "_derived", memo)
        hit = memo.get(make)
        if hit is not None and hit[0] == args:
            return hit[1]
        value = make(self, *args)
        memo[make] = (args, value)
        return value

    def without_path(self, path: str) -> "PeerState":
        """This peer as shown when no path to it is known (path offline or unknown: tailscaled
        cannot be read, or the peer left the tailnet view): not online, not active, no endpoint,
        relay, DERP region name or latency; names, addresses, home region, counters and times
        kept. self when it is that already."""
        if (not self.online and not self.active and self.path == path and not self.endpoint
                and math.isnan(self.latency_ms) and not self.peer_relay and not self.relay_host
                and not self.relay_vni and not self.derp_region):
            return self
        return PeerState(self.name, self.dns_name, self.addresses, False, False, path, "", self.relay_region,
                         math.nan, self.last_handshake, self.last_seen, self.rx_bytes, self.tx_bytes, self.tags,
                         self.os, self.node_id, malformed=self.malformed)

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
    """One read of tailscaled's status, like ipnstate.Status: one PeerState per peer (SnapshotBuilder)."""

    backend_state: str                     # "" = unknown
    self_peer: Optional[PeerState]
    peers: Tuple[PeerState, ...]           # sorted by name, then DNS name
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


def parse_peer(ps: Mapping[str, Any], is_self: bool = False, relay_host: str = "", derp_region: str = "",
               latency_ms: float = math.nan) -> PeerState:
    """One ipnstate.PeerStatus dict -> PeerState (lenient: missing fields -> unknown), with the
    values the node adds from outside the dict (see :class:`SnapshotBuilder`)."""
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
        latency_ms=latency_ms,
        last_handshake=parse_time(ps.get("LastHandshake")),
        last_seen=parse_time(ps.get("LastSeen")),
        rx_bytes=uint_field(ps, "RxBytes"),
        tx_bytes=uint_field(ps, "TxBytes"),
        tags=str_list_field(ps, "Tags"),
        os=str_field(ps, "OS"),
        node_id=str_field(ps, "ID"),
        peer_relay=endpoint if path == PATH_PEER_RELAY else "",
        relay_host=relay_host,
        relay_vni=relay_vni(str_field(ps, "PeerRelay")) if path == PATH_PEER_RELAY else 0,
        malformed=malformed_fields(ps),
        derp_region=derp_region,
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


def derp_region_name(path: str, relay_region: str, names: Mapping[str, str]) -> str:
    """What ``derp_region`` of a peer on path with home region relay_region is: for a derp peer
    the readable name of its relay region (``names``: region code -> RegionName from the DERP
    map; the code itself when the map has no name), else ""."""
    return (names.get(relay_region) or relay_region) if path == PATH_DERP else ""


def _same_ms(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


class Latency(NamedTuple):
    """One round trip the node measured to a peer (a disco ping) and the path it took then: the
    peer's path and home DERP region as shown when the ping was sent. A peer shows it only while
    it is on that path (a latency measured on the old path says nothing about the new one)."""

    ms: float
    path: str
    relay_region: str = ""

    def holds_for(self, path: str, relay_region: str) -> bool:
        """Whether this latency belongs to a peer now on path with home region relay_region (the
        same path; for derp also the same region)."""
        return self.path == path and (path != PATH_DERP or self.relay_region == relay_region)


_NONE: Mapping[str, Any] = {}


class SnapshotBuilder:
    """tailscaled's status, one read after another -> :class:`Snapshot`, keeping each peer that
    did not change as the same :class:`PeerState` object (pure; one caller at a time: the node's
    overlay-poll thread).

    A peer shows its own chunk of the status's ``Peer`` map (its decoded ipnstate.PeerStatus) and
    three values from outside it, all arguments of :meth:`build`:

    - relay_host (peer-relay peers): the relay machine's short name, found among the other
      chunks (:func:`relay_host_name`);
    - derp_region (derp peers): the readable name of its region (region_names, from the DERP map);
    - latency_ms: the node's last ping (latency, by core.identity.peer_key), shown only while
      the peer is on the path the ping took (:meth:`Latency.holds_for`).

    A peer is kept when its chunk is the same object as last time (tailscaled.status_json's
    decoder gives the same object for unchanged text; an equal one is enough when the body was
    decoded whole) and the three values are equal (NaN equal to NaN); otherwise it is parsed
    again, once, with all its values (:func:`parse_peer`). A peer gone from the map is forgotten.
    Peers come sorted by name, then DNS name (ties in the map's order); when every peer was kept
    in the same order the very same tuple is returned, and a peer built again under its old name
    takes its predecessor's place without sorting again.
    """

    def __init__(self) -> None:
        self._known: Dict[str, Tuple[Any, PeerState]] = {}  # status key -> (its chunk, its peer)
        self._order: List[str] = []                  # the status keys of the last build, map order
        self._sorted: Tuple[PeerState, ...] = ()     # the last build's peers, sorted
        self._place: Dict[str, int] = {}             # status key -> index in _sorted
        self._names: Mapping[str, str] = _NONE       # region_names of the last build
        self._latency: Dict[str, Latency] = {}       # latency of the last build
        self.built = 0                               # peers parsed by the last build (tests, benchmarks)

    def build(self, status: Mapping[str, Any], region_names: Mapping[str, str] = _NONE,
              latency: Mapping[str, Latency] = _NONE) -> Snapshot:
        """The Snapshot of one LocalAPI /status dict; never raises on odd input.

        Args:
            status: the decoded status (``Peer``: status key -> ipnstate.PeerStatus; anything but
                a dict means no peers, values that are not dicts are skipped).
            region_names: DERP region code -> readable name.
            latency: peer key (core.identity.peer_key) -> the last ping's round trip.
        """
        chunks = status.get("Peer")
        old = self._known
        # nothing from outside the chunks changed: a peer whose chunk is the same object is kept
        # after one lookup (peer-relay peers still look up their relay host)
        fast = (region_names is self._names or region_names == self._names) and latency == self._latency
        known: Dict[str, Tuple[Any, PeerState]] = {}
        order: List[str] = []
        fresh: List[str] = []
        if isinstance(chunks, dict):
            for key, src in chunks.items():
                hit = old.get(key)
                if fast and hit is not None and hit[0] is src and not hit[1].peer_relay:
                    known[key] = hit
                    order.append(key)
                    continue
                if not isinstance(src, dict):
                    continue
                peer = self._peer(src, hit, chunks, region_names, latency)
                if hit is None or peer is not hit[1]:
                    fresh.append(key)
                known[key] = (src, peer)
                order.append(key)
        self._sorted = self._sort(order, known, fresh)
        self._known, self._order = known, order
        self._names, self._latency = region_names, dict(latency)
        self.built = len(fresh)
        return _snapshot(status, self._sorted)

    @staticmethod
    def _peer(src: Mapping[str, Any], hit: Optional[Tuple[Any, PeerState]], chunks: Mapping[str, Any],
              names: Mapping[str, str], latency: Mapping[str, Latency]) -> PeerState:
        """The peer of chunk src: hit's peer when nothing it shows changed, else parsed with
        everything it shows."""
        prev = hit[1] if hit is not None else None
        same = prev is not None and (hit[0] is src or hit[0] == src)
        if same:
            path, region, relay, key = prev.path, prev.relay_region, prev.peer_relay, peer_key(prev)
        else:
            path, endpoint = classify_path(src)
            region = str_field(src, "Relay")
            relay = endpoint if path == PATH_PEER_RELAY else ""
            key = key_of(str_field(src, "ID"), str_field(src, "DNSName"), short_name(src))
        relay_host = relay_host_name(relay, chunks.values()) if relay else ""
        derp = derp_region_name(path, region, names)
        measured = latency.get(key)
        ms = measured.ms if measured is not None and measured.holds_for(path, region) else math.nan
        if same and prev.relay_host == relay_host and prev.derp_region == derp and _same_ms(prev.latency_ms, ms):
            return prev
        return parse_peer(src, relay_host=relay_host, derp_region=derp, latency_ms=ms)

    def _sort(self, order: List[str], known: Dict[str, Tuple[Any, PeerState]],
              fresh: List[str]) -> Tuple[PeerState, ...]:
        """The peers of order sorted by name, then DNS name (ties in the map's order). Peers built
        again under the same key and name are put in their predecessor's place."""
        if order == self._order:
            if not fresh:
                return self._sorted
            old = self._known
            if all(old[k][1].name == known[k][1].name and old[k][1].dns_name == known[k][1].dns_name for k in fresh):
                out = list(self._sorted)
                for k in fresh:
                    out[self._place[k]] = known[k][1]
                return tuple(out)
        keys = sorted(order, key=lambda k: (known[k][1].name, known[k][1].dns_name))
        self._place = {k: i for i, k in enumerate(keys)}
        return tuple(known[k][1] for k in keys)


def _snapshot(status: Mapping[str, Any], peers: Tuple[PeerState, ...]) -> Snapshot:
    """The Snapshot of status with its peers already built."""
    self_raw = status.get("Self")
    self_peer = parse_peer(self_raw, is_self=True) if isinstance(self_raw, dict) else None
    suffix = str_field(status, "MagicDNSSuffix")
    tailnet = status.get("CurrentTailnet")
    if not suffix and isinstance(tailnet, dict):
        suffix = str_field(tailnet, "MagicDNSSuffix")
    return Snapshot(
        backend_state=str_field(status, "BackendState"),
        self_peer=self_peer,
        peers=peers,
        health=str_list_field(status, "Health"),
        magic_dns_suffix=suffix,
        control_reachable=isinstance(self_raw, dict) and self_raw.get("Online") is True,
        version=str_field(status, "Version"),
        malformed=status_malformed(status),
    )


def parse_status(status: Mapping[str, Any], region_names: Mapping[str, str] = _NONE) -> Snapshot:
    """A LocalAPI /status dict -> Snapshot, read once (a new :class:`SnapshotBuilder`: no
    latency, nothing kept). Never raises on odd input."""
    return SnapshotBuilder().build(status, region_names)


def blind(snapshot: Snapshot, daemon_gone: bool) -> Snapshot:
    """The snapshot to present while tailscaled cannot be read: the last known peers (names and
    addresses stay useful), none online, path offline when tailscaled is not running at all (no
    overlay packet can flow) or unknown when it runs but does not answer usefully
    (PeerState.without_path); backend state unknown, control server not reachable."""
    path = PATH_OFFLINE if daemon_gone else PATH_UNKNOWN
    peers = tuple(p.without_path(path) for p in snapshot.peers)
    return replace(snapshot, backend_state="", peers=peers, control_reachable=False, health=())


def peer_fingerprint(p: PeerState) -> Tuple[Any, ...]:
    """Everything about a peer except measurements (byte counters, handshake and last-seen
    times, latency): what makes a change worth publishing at once."""
    return (p.name, p.dns_name, p.addresses, p.online, p.active, p.path, p.endpoint,
            p.relay_region, p.tags, p.os, p.node_id, p.peer_relay, p.relay_host, p.relay_vni,
            p.derp_region)


def same_but_measurements(a: Optional[Snapshot], b: Optional[Snapshot]) -> bool:
    """a and b agree on this machine and every peer in everything but measurements (peer_fingerprint).

    Cheap for the node's case: SnapshotBuilder keeps unchanged peers as the same objects, so only
    the others are compared field by field.
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
            events.append(PathChangeEvent(prev.without_path(PATH_OFFLINE), prev.path, PATH_OFFLINE))
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
