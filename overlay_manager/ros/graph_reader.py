"""Reads the ROS graph over XML-RPC with bounded timeouts and builds the topic-link map.

The calls are the ones ``rosnode info`` makes: the master's ``getSystemState``,
``getTopicTypes`` and ``lookupNode`` (once per node: URIs are kept until the node disappears or
stops answering), and ``getBusInfo`` and ``getBusStats`` of the publishers whose connections
cross this machine's boundary (a publisher here with a subscriber elsewhere, or one elsewhere with
a subscriber here). Links between two other machines come from the master's state alone (their
own overlay nodes measure them), so the work of one overlay node does not grow with the size of
the fleet's graph. Every call has a socket timeout, and the nodes are asked in parallel by a small
pool, so a dead or hung node costs at most one timeout and never stalls the map: its links are
still listed (from the master's view) with an unknown rate.

Threads: ``TopicMapper.build`` runs on the caller's thread (the node runs it on its own
topic-link thread, never under a lock that publishing needs) and uses its own worker pool for the
per-node calls. ``TopicMapper.links`` may be read from any thread.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import xmlrpc.client
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from overlay_manager.core.peers import Snapshot
from overlay_manager.core.topic_links import (
    Connection,
    MachineMap,
    RateTracker,
    SystemState,
    TopicLink,
    build_links,
    connections_from_bus,
    uri_host,
)

Relevant = Callable[[str, Sequence[str]], bool]
"""(publisher URI, its subscribers' URIs) -> ask this publisher for its bus info and stats?"""


class GraphError(Exception):
    """The ROS master did not answer (or answered an error); the message names the master URI."""


class _TimeoutTransport(xmlrpc.client.Transport):
    """xmlrpc.client transport whose connections time out after ``timeout`` seconds."""

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._timeout = timeout

    def make_connection(self, host: Any) -> http.client.HTTPConnection:  # noqa: D102 - xmlrpc API
        conn = super().make_connection(host)
        conn.timeout = self._timeout
        return conn


def _proxy(uri: str, timeout: float) -> xmlrpc.client.ServerProxy:
    return xmlrpc.client.ServerProxy(uri, transport=_TimeoutTransport(timeout), allow_none=True)


def _call(uri: str, timeout: float, method: str, *args: Any) -> Any:
    """One ROS XML-RPC call -> its value; raises GraphError on any failure (code != 1,
    connection error, timeout, garbage)."""
    try:
        result = getattr(_proxy(uri, timeout), method)(*args)
    except (OSError, socket.timeout, xmlrpc.client.Error, http.client.HTTPException, ValueError) as exc:
        raise GraphError(f"{method} at {uri}: {exc or type(exc).__name__}") from None
    if not (isinstance(result, (list, tuple)) and len(result) == 3):
        raise GraphError(f"{method} at {uri}: unexpected answer")
    code, message, value = result
    if code != 1:
        raise GraphError(f"{method} at {uri}: {message}")
    return value


def master_error(master_uri: str, caller_id: str, timeout_s: float) -> str:
    """"" when the ROS master answers ``getPid`` within timeout_s seconds, else why not (asked
    before a call rospy would retry without a timeout, e.g. registering a publisher)."""
    try:
        _call(master_uri, timeout_s, "getPid", caller_id)
    except GraphError as exc:
        return str(exc)
    return ""


@dataclass
class GraphSample:
    """One read of the graph. ``node_errors`` says which publishers did not answer and why;
    ``read_at``: when each publisher's counters were read (monotonic s), ``monotonic``: when the
    read ended (a slow publisher delays the end, not the others' counters)."""

    state: SystemState
    uris: Dict[str, str]
    connections: Dict[str, List[Connection]]
    node_errors: Dict[str, str] = field(default_factory=dict)
    monotonic: float = 0.0
    read_at: Dict[str, float] = field(default_factory=dict)


class GraphReader:
    """Reads the system state from the master and the bus info of publishing nodes.

    Args:
        master_uri: the ROS master's XML-RPC URI (ROS_MASTER_URI).
        caller_id: our caller id (sent with every call, as the API wants).
        timeout_s: socket timeout of each call in seconds.
        workers: how many nodes are asked at once.
        call: replaces the XML-RPC call (uri, timeout, method, *args) -> value (tests).
    """

    def __init__(self, master_uri: str, caller_id: str, timeout_s: float = 1.0, workers: int = 8,
                 call: Optional[Callable[..., Any]] = None) -> None:
        """Nothing is called until read()."""
        self.master_uri = master_uri
        self.caller_id = caller_id
        self.timeout_s = timeout_s
        self._call = call or _call
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="overlay-graph")
        self._uris: Dict[str, str] = {}   # caller id -> XML-RPC URI (read()'s thread only)

    def read(self, relevant: Optional[Relevant] = None) -> GraphSample:
        """Ask the master, then (in parallel) every publisher with a subscriber for which
        ``relevant(publisher URI, subscriber URIs)`` holds (None: every one).

        Raises:
            GraphError: when the master does not answer (nothing can be said then).
        """
        raw_state = self._call(self.master_uri, self.timeout_s, "getSystemState", self.caller_id)
        try:
            raw_types = self._call(self.master_uri, self.timeout_s, "getTopicTypes", self.caller_id)
        except GraphError:
            raw_types = ()
        state = SystemState.from_xmlrpc(raw_state, raw_types)
        nodes = state.nodes()
        publishers = set(state.publishing_nodes())
        known = {n: self._uris[n] for n in nodes if n in self._uris}
        new = [n for n in nodes if n not in known]
        for name, uri in zip(new, self._pool.map(self._lookup, new)):
            if uri:
                known[name] = uri
        self._uris = dict(known)  # nodes that left the graph are forgotten
        uris = known
        subscribers: Dict[str, Set[str]] = {}
        for _topic, pub, sub in state.cross_candidates():
            subscribers.setdefault(pub, set()).add(uris.get(sub, ""))
        asked = [(n, uris[n]) for n in sorted(publishers) if n in uris
                 and (relevant is None or relevant(uris[n], sorted(subscribers.get(n, ()))))]
        connections: Dict[str, List[Connection]] = {}
        read_at: Dict[str, float] = {}
        errors: Dict[str, str] = {n: "not known to the master" for n in publishers if n not in uris}
        for (name, _), (outcome, at) in zip(asked, self._pool.map(self._bus, asked)):
            if isinstance(outcome, str):
                errors[name] = outcome
                self._uris.pop(name, None)  # look it up again: it may have restarted elsewhere
            else:
                connections[name] = outcome
                read_at[name] = at
        return GraphSample(state, uris, connections, errors, time.monotonic(), read_at)

    def _lookup(self, name: str) -> str:
        try:
            uri = self._call(self.master_uri, self.timeout_s, "lookupNode", self.caller_id, name)
        except GraphError:
            return ""
        return uri if isinstance(uri, str) else ""

    def _bus(self, item: Tuple[str, str]) -> Tuple[Any, float]:
        """(a publisher's connections, or the error text when it did not answer; monotonic time
        its byte counters were read)."""
        name, uri = item
        try:
            info = self._call(uri, self.timeout_s, "getBusInfo", self.caller_id)
        except GraphError as exc:
            return str(exc), time.monotonic()
        try:
            stats = self._call(uri, self.timeout_s, "getBusStats", self.caller_id)
        except GraphError:
            stats = None
        return connections_from_bus(name, info, stats), time.monotonic()

    def close(self) -> None:
        """Stop the worker pool (calls in flight end by their timeout)."""
        self._pool.shutdown(wait=False)


class TopicMapper:
    """Keeps the latest topic-link map: read the graph, map hosts to machines, compute rates.

    Args:
        reader: a GraphReader.
        self_names: this machine's config hostname and overlay FQDN.
        aliases: URI host -> machine short name for hosts that are not overlay names.
    """

    def __init__(self, reader: GraphReader, self_names: Sequence[str] = (),
                 aliases: Optional[Mapping[str, str]] = None) -> None:
        """No map until the first build()."""
        self.reader = reader
        self.self_names = tuple(self_names)
        self.aliases = dict(aliases or {})
        self._rates = RateTracker()
        self._lock = threading.Lock()          # guards _links, _state, _error and _built (plain values)
        self._build_lock = threading.Lock()    # one build at a time (the rate tracker is not shared)
        self._links: List[TopicLink] = []
        self._state: Optional[SystemState] = None
        self._error = ""
        self._built = False

    def build(self, snapshot: Optional[Snapshot]) -> List[TopicLink]:
        """Read the graph now and replace the map; on a master error keep the old map and
        remember the error (see ``error``). Returns the new (or kept) map, local links included."""
        with self._build_lock:
            machines = MachineMap(snapshot, self.self_names, self.aliases)
            me = machines.self_name

            def crosses_here(pub_uri: str, sub_uris: Sequence[str]) -> bool:
                """A connection of this publisher has exactly one end on this machine."""
                pub = machines.machine(uri_host(pub_uri))
                subs = {machines.machine(uri_host(u)) for u in sub_uris}
                return (pub == me and any(s != me for s in subs)) or (pub != me and me in subs)

            try:
                sample = self.reader.read(crosses_here if me else None)
            except GraphError as exc:
                with self._lock:
                    self._error = str(exc)
                    return list(self._links)
            rates = self._rates.update(sample.connections, sample.monotonic, sample.read_at)
            links = build_links(sample.state, sample.uris, sample.connections, machines, rates)
            with self._lock:
                self._links, self._state, self._error, self._built = links, sample.state, "", True
            return links

    def links(self) -> List[TopicLink]:
        """The latest map (local links included; empty before the first build)."""
        with self._lock:
            return list(self._links)

    @property
    def state(self) -> Optional[SystemState]:
        """The master's system state of the latest successful build (None before one)."""
        with self._lock:
            return self._state

    @property
    def error(self) -> str:
        """Why the last build failed ("" = it worked)."""
        with self._lock:
            return self._error

    @property
    def built(self) -> bool:
        """True once a build has succeeded."""
        with self._lock:
            return self._built

    def close(self) -> None:
        """Stop the reader's pool."""
        self.reader.close()
