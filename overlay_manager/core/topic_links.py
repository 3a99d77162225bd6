"""Topic links: which ROS topic connections cross which overlay path (pure: no ROS, no I/O).

Inputs are what the ROS graph APIs return (the same XML-RPC calls ``rosnode info`` makes):
- the master's ``getSystemState``: publishers and subscribers per topic;
- ``lookupNode``: each node's XML-RPC URI, whose host is the node's ROS_HOSTNAME (or ROS_IP);
- each publishing node's ``getBusInfo`` (its live connections: connection id, the subscriber's
  caller id, direction ``o``) and ``getBusStats`` (bytes sent per connection id).

Because ROS_HOSTNAME is an overlay name on every machine of the fleet, the host of a node's URI
names the machine it runs on: an overlay FQDN, a short name or an overlay IP matches a peer of
this machine's tailscaled; loopback and this machine's own names are this machine. Hosts that
are none of these can be mapped by ``aliases`` (e.g. a LAN address set as ROS_IP); all others
are "not an overlay machine" (host ""). No DNS lookups are made here.

The path of a link is the path of this machine's tailscaled to the far end when one end is this
machine. Between two other machines this machine cannot see the path: it is ``unknown`` (the
overlay node on either of those machines reports it in its own map).
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass
from typing import (
    Any,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from overlay_manager.core.identity import HostMatcher, is_loopback, normalise_host, short_label
from overlay_manager.core.link_shaping import Shaping
from overlay_manager.core.peers import (
    PATH_DERP,
    PATH_DIRECT,
    PATH_PEER_RELAY,
    PATH_SELF,
    PATH_UNKNOWN,
    PeerState,
    Snapshot,
)
from overlay_manager.core.validation.errors import ConfigError

Node = str       # a ROS caller id, e.g. "/camera"
Topic = str


@dataclass(frozen=True)
class SystemState:
    """The master's ``getSystemState``: topic -> nodes, plus topic -> type (``getTopicTypes``)."""

    publishers: Mapping[Topic, Tuple[Node, ...]]
    subscribers: Mapping[Topic, Tuple[Node, ...]]
    types: Mapping[Topic, str]

    @staticmethod
    def from_xmlrpc(state: Any, topic_types: Any = ()) -> "SystemState":
        """Parse the raw lists of getSystemState ([pubs, subs, services]) and getTopicTypes.

        Malformed entries are skipped (a misbehaving master must not break the map)."""
        def section(raw: Any) -> Dict[Topic, Tuple[Node, ...]]:
            out: Dict[Topic, Tuple[Node, ...]] = {}
            if not isinstance(raw, (list, tuple)):
                return out
            for entry in raw:
                if (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str)
                        and isinstance(entry[1], (list, tuple))):
                    out[entry[0]] = tuple(n for n in entry[1] if isinstance(n, str))
            return out

        pubs = section(state[0]) if isinstance(state, (list, tuple)) and len(state) > 0 else {}
        subs = section(state[1]) if isinstance(state, (list, tuple)) and len(state) > 1 else {}
        types: Dict[Topic, str] = {}
        for entry in topic_types or ():
            if isinstance(entry, (list, tuple)) and len(entry) == 2 and all(isinstance(x, str) for x in entry):
                types[entry[0]] = entry[1]
        return SystemState(pubs, subs, types)

    def cross_candidates(self) -> List[Tuple[Topic, Node, Node]]:
        """Every (topic, publisher, subscriber) pair the master knows, sorted (a node talking to
        itself is left out)."""
        out = []
        for topic, pubs in self.publishers.items():
            for sub in self.subscribers.get(topic, ()):
                out.extend((topic, pub, sub) for pub in pubs if pub != sub)
        return sorted(out)

    def publishing_nodes(self) -> List[Node]:
        """Nodes that publish at least one topic that another node subscribes to."""
        return sorted({pub for topic, pub, _ in self.cross_candidates()})

    def nodes(self) -> List[Node]:
        """Every node that publishes or subscribes."""
        names: Set[Node] = set()
        for section in (self.publishers, self.subscribers):
            for ns in section.values():
                names.update(ns)
        return sorted(names)


@dataclass(frozen=True)
class Connection:
    """One live outbound connection of a publisher, from its bus info and bus stats.

    bytes_sent is the publisher's counter for this connection (bytes since it opened); None when
    the node did not report stats for it.
    """

    topic: Topic
    publisher: Node
    subscriber: Node
    connection_id: int
    bytes_sent: Optional[int] = None


def connections_from_bus(publisher: Node, bus_info: Any, bus_stats: Any = None) -> List[Connection]:
    """A publisher's outbound connections from raw getBusInfo / getBusStats results.

    getBusInfo rows: [connection_id, destination_id, direction, transport, topic, connected, info];
    for a publisher's outbound rows (direction "o") destination_id is the subscriber's caller id.
    getBusStats: [publishStats, subscribeStats, serviceStats] with publishStats rows
    [topic, message_data_sent, [[connection_id, bytes_sent, num_sent, connected], ...]].
    Malformed rows are skipped.
    """
    sent: Dict[Tuple[Topic, int], int] = {}
    if isinstance(bus_stats, (list, tuple)) and bus_stats and isinstance(bus_stats[0], (list, tuple)):
        for row in bus_stats[0]:
            if not (isinstance(row, (list, tuple)) and len(row) >= 3 and isinstance(row[0], str)
                    and isinstance(row[2], (list, tuple))):
                continue
            for conn in row[2]:
                if (isinstance(conn, (list, tuple)) and len(conn) >= 2 and _is_int(conn[0])
                        and _is_int(conn[1])):
                    sent[(row[0], int(conn[0]))] = int(conn[1])
    out: List[Connection] = []
    if not isinstance(bus_info, (list, tuple)):
        return out
    for row in bus_info:
        if not (isinstance(row, (list, tuple)) and len(row) >= 5 and _is_int(row[0])
                and isinstance(row[1], str) and row[2] == "o" and isinstance(row[4], str)):
            continue
        if len(row) >= 6 and row[5] is False:
            continue  # closed connection
        cid = int(row[0])
        out.append(Connection(row[4], publisher, row[1], cid, sent.get((row[4], cid))))
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def uri_host(uri: str) -> str:
    """Host part of a node's XML-RPC URI ("http://robot1.fleet.internal:38211/" -> FQDN),
    lower case, without a trailing dot; "" when the URI has none."""
    try:
        host = urllib.parse.urlsplit(uri).hostname or ""
    except ValueError:
        return ""
    return normalise_host(host)


class MachineMap:
    """Host of a node URI -> short name of the machine it runs on, and the path there.

    The rules are core.identity's (:class:`~overlay_manager.core.identity.HostMatcher`), the same
    as the C++ encoder's ``subscriber_hosts``; test/data/host_matching_cases.yaml holds both to them.

    Args:
        snapshot: this machine's tailscaled view (None = not known yet).
        self_names: this machine's own names besides what the snapshot says (config hostname and
            overlay FQDN), so the map works before tailscaled answers.
        aliases: extra host -> short name entries (hosts that are not overlay names, e.g. a LAN
            address given as ROS_IP; ``~host_aliases``); looked up first.
    """

    def __init__(self, snapshot: Optional[Snapshot], self_names: Iterable[str] = (),
                 aliases: Optional[Mapping[str, str]] = None) -> None:
        """Index the snapshot's peers once (lookups are per link)."""
        self.self_peer = snapshot.self_peer if snapshot else None
        self.hosts = HostMatcher(snapshot.peers if snapshot else (), self.self_peer, self_names, aliases)
        self.self_name = self.hosts.self_name

    def machine(self, host: str) -> str:
        """Short machine name for a URI host; "" = not an overlay machine (or no host)."""
        return self.hosts.machine(host)

    def peer(self, name: str) -> Optional[PeerState]:
        """The peer with this short name (None for this machine or unknown machines)."""
        return self.hosts.by_name(name)

    def path(self, host: str) -> str:
        """Path from this machine to the machine ``host`` refers to: ``self`` for this machine
        (its names, loopback), the peer's path, else ``unknown`` (also for ""). The twin of the
        C++ ``pathOfHost``."""
        m = self.machine(host)
        if not m:
            return PATH_SELF if is_loopback(host) else PATH_UNKNOWN
        if m == self.self_name:
            return PATH_SELF
        p = self.peer(m)
        return p.path if p is not None and p.path else PATH_UNKNOWN


SHAPED_TYPE = "overlay_manager/ShapedMessage"
"""Message type of a shaped topic's tiers (the topic shaper, docs/shaping.md)."""


def shaped_tier(topic: str, msg_type: str) -> Optional[Tuple[str, str]]:
    """(original topic, tier) when ``topic`` is a tier of a shaped topic: ``X/shaped`` -> (X,
    "fitted"), the tier relayed subscribers read (zstd, rate fitted to their paths' budgets);
    ``X/shaped/full`` -> (X, "full"), the message as published for paths without a budget.
    None for any other topic or type."""
    if msg_type != SHAPED_TYPE:
        return None
    if topic.endswith("/shaped/full") and len(topic) > len("/shaped/full"):
        return topic[: -len("/shaped/full")], "full"
    if topic.endswith("/shaped") and len(topic) > len("/shaped"):
        return topic[: -len("/shaped")], "fitted"
    return None


@dataclass(frozen=True)
class TopicLink:
    """One topic connection between two nodes; the ROS-free twin of overlay_manager/TopicLink.

    Hosts are short machine names ("" = not an overlay machine). path is one of peers.PATHS,
    ``self`` for a connection inside one machine, ``unknown`` when this machine cannot see it.
    bytes_per_second is NaN until two samples of the publisher's counter exist. shaping is what
    a shaped stream gives this subscriber (``core.link_shaping``; None: not shaped, or not known).
    """

    topic: Topic
    type: str
    publisher_node: Node
    publisher_host: str
    subscriber_node: Node
    subscriber_host: str
    local: bool
    path: str
    endpoint: str = ""
    bytes_per_second: float = math.nan
    shaping: Optional[Shaping] = None

    def sort_key(self) -> Tuple[str, str, str, str, str]:
        """Order of TopicLinkList.links: topic, publisher host, subscriber host, then nodes."""
        return (self.topic, self.publisher_host, self.subscriber_host, self.publisher_node,
                self.subscriber_node)


def path_between(machines: MachineMap, a: str, b: str) -> Tuple[str, str]:
    """(path, endpoint) between machines a and b as this machine sees it.

    endpoint is "ip:port" for direct, the relay for peer-relay, the DERP region for derp.
    """
    me = machines.self_name
    if a and a == b:
        return PATH_SELF, ""
    if me and a == me:
        far = b
    elif me and b == me:
        far = a
    else:
        return PATH_UNKNOWN, ""
    p = machines.peer(far)
    if p is None:
        return PATH_UNKNOWN, ""
    if p.path in (PATH_DIRECT, PATH_PEER_RELAY):
        return p.path, p.endpoint
    if p.path == PATH_DERP:
        return p.path, p.relay_region
    return p.path, ""


def build_links(state: SystemState, uris: Mapping[Node, str],
                connections: Mapping[Node, Sequence[Connection]], machines: MachineMap,
                rates: Optional[Mapping[Tuple[Node, Topic, Node], float]] = None) -> List[TopicLink]:
    """Every topic connection, local ones included, sorted by TopicLink.sort_key.

    Args:
        state: the master's system state.
        uris: caller id -> XML-RPC URI (nodes missing here have host "").
        connections: publisher -> its live outbound connections, for publishers whose bus info
            answered. For a publisher missing here (dead, hung, timed out) every subscriber the
            master lists for its topics is taken as connected, with an unknown rate.
        machines: maps URI hosts to machines and knows the paths.
        rates: (publisher, topic, subscriber) -> bytes/s (see RateTracker).
    """
    rates = rates or {}
    pairs: Set[Tuple[Topic, Node, Node]] = set()
    for topic, pub, sub in state.cross_candidates():
        if pub in connections:
            continue
        pairs.add((topic, pub, sub))
    for pub, conns in connections.items():
        for c in conns:
            if c.subscriber != pub:
                pairs.add((c.topic, pub, c.subscriber))
    out = []
    for topic, pub, sub in pairs:
        ph = machines.machine(uri_host(uris.get(pub, "")))
        sh = machines.machine(uri_host(uris.get(sub, "")))
        local = bool(ph and ph == sh) or (
            not ph and not sh and uri_host(uris.get(pub, "")) != ""
            and uri_host(uris.get(pub, "")) == uri_host(uris.get(sub, "")))
        path, endpoint = (PATH_SELF, "") if local else path_between(machines, ph, sh)
        out.append(TopicLink(topic, state.types.get(topic, ""), pub, ph, sub, sh, local, path,
                             endpoint, rates.get((pub, topic, sub), math.nan)))
    out.sort(key=TopicLink.sort_key)
    return out


class RateTracker:
    """bytes/s per connection from successive samples of the publishers' byte counters.

    Not thread-safe: one builder thread owns it. Times are monotonic seconds.
    """

    def __init__(self) -> None:
        """No samples yet."""
        self._last: Dict[Tuple[Node, int], Tuple[float, int]] = {}

    def update(self, connections: Mapping[Node, Sequence[Connection]], now: float,
               read_at: Optional[Mapping[Node, float]] = None) -> Dict[Tuple[Node, Topic, Node], float]:
        """Record counters sampled at ``now`` (or, per publisher, at ``read_at[publisher]``: when its
        counters were read, so one slow publisher does not shorten the others' intervals); returns
        (publisher, topic, subscriber) -> bytes/s for connections seen in the previous sample too.
        Connections that went away are forgotten; publishers that did not answer this time keep
        their last counters."""
        rates: Dict[Tuple[Node, Topic, Node], float] = {}
        seen: Dict[Tuple[Node, int], Tuple[float, int]] = {}
        for pub, conns in connections.items():
            at = read_at.get(pub, now) if read_at else now
            for c in conns:
                if c.bytes_sent is None:
                    continue
                key = (pub, c.connection_id)
                prev = self._last.get(key)
                if prev is not None and at > prev[0] and c.bytes_sent >= prev[1]:
                    rates[(pub, c.topic, c.subscriber)] = (c.bytes_sent - prev[1]) / (at - prev[0])
                seen[key] = (at, c.bytes_sent)
        for key, value in self._last.items():
            if key[0] not in connections:
                seen[key] = value
        self._last = seen
        return rates


def filter_links(links: Iterable[TopicLink], topic: str = "", host: str = "",
                 include_local: bool = False) -> List[TopicLink]:
    """The links GetTopicLinks asks for: one topic ("" = all), one machine at either end (short
    or overlay name; "" = all), and connections inside one machine only when include_local."""
    short = short_label(host)
    out = []
    for link in links:
        if link.local and not include_local:
            continue
        if topic and link.topic != topic:
            continue
        if short and short not in (link.publisher_host.lower(), link.subscriber_host.lower()):
            continue
        out.append(link)
    return out


def peers_with_links(links: Iterable[TopicLink], self_name: str) -> FrozenSet[str]:
    """Short names of the machines that carry a ROS connection to or from this machine."""
    out: Set[str] = set()
    if not self_name:
        return frozenset()
    for link in links:
        if link.local:
            continue
        if link.publisher_host == self_name and link.subscriber_host:
            out.add(link.subscriber_host)
        elif link.subscriber_host == self_name and link.publisher_host:
            out.add(link.publisher_host)
    return frozenset(out)


def parse_host_aliases(value: Any, source: str) -> Dict[str, str]:
    """The ~host_aliases parameter: a mapping of URI host (as nodes advertise it, e.g. a LAN
    address set as ROS_IP) -> short machine name on the overlay.

    Raises:
        ConfigError: naming the parameter and the bad entry.
    """
    if value is None or value == "":
        return {}
    if not isinstance(value, dict):
        raise ConfigError(source, "host_aliases", f"must be a mapping host -> machine name, got "
                                                  f"{type(value).__name__}")
    out: Dict[str, str] = {}
    for host, machine in value.items():
        if not isinstance(host, str) or not host.strip() or not isinstance(machine, str) or not machine.strip():
            raise ConfigError(source, f"host_aliases.{host}",
                              f"must map a host name or address to a machine's short name, got {machine!r}")
        out[host.strip()] = short_label(machine)
    return out
