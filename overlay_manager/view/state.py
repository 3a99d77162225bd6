"""State a front end's model keeps, e.g. the dashboard's (pure: no Qt, no ROS; unit-tested on its own).

- ``nodes_from_topics``: which overlay_manager nodes are on the ROS graph, from the master's
  published-topics list (a node is found by its ``~peers`` topic of type overlay_manager/PeerList).
- ``node_choices``: what the node selector lists and which node it shows, from the nodes found.
- ``HistoryStore``: per-peer history of latency and rx/tx rates for the small plots; rates come
  from tailscaled's byte counters between two PeerList messages.
- ``Freshness``: when the selected node last published, so a node that died is marked stale.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Iterable, List, Optional, Tuple

from overlay_manager.view.text import rate_from_counters

PEER_LIST_TYPE = "overlay_manager/PeerList"
PEERS_TOPIC = "peers"
DEFAULT_NODE = "/overlay_manager"


def normalise_node(name: str) -> str:
    """Node name as typed by a user -> absolute name without trailing slash ("" stays "")."""
    name = name.strip().rstrip("/")
    if not name:
        return ""
    return name if name.startswith("/") else "/" + name


def nodes_from_topics(topics: Iterable[Tuple[str, str]]) -> List[str]:
    """Names of overlay_manager nodes from (topic, type) pairs, sorted, the default node first.

    A node is the namespace of a ``.../peers`` topic of type overlay_manager/PeerList.
    """
    suffix = "/" + PEERS_TOPIC
    nodes = {topic[: -len(suffix)] for topic, msg_type in topics
             if msg_type == PEER_LIST_TYPE and topic.endswith(suffix) and len(topic) > len(suffix)}
    return sorted(nodes, key=lambda n: (n != DEFAULT_NODE, n))


def node_choices(found: List[str], current: str, user_picked: bool) -> Tuple[List[str], str]:
    """The node selector's items and the node to show, after discovery found ``found``.

    The list holds the nodes that exist. The shown node stays when it was found, or when the user
    picked it (a node that is not up yet, or has just died, stays selected; it is listed so the
    selector can show it). A node the dashboard chose itself (the default ``/overlay_manager``
    before anything was found, or a node that has gone away) gives way to the first found node;
    while nothing is found it stays (so the view says whom it is waiting for).

    Args:
        found: nodes on the graph (``nodes_from_topics``), in display order.
        current: the node shown now ("" = none).
        user_picked: the user chose ``current`` (command line, settings or the selector).
    Returns:
        (items, node to show); the node is in items unless it is "".
    """
    if not current or (current not in found and not user_picked and found):
        selected = found[0] if found else current
    else:
        selected = current
    items = list(found)
    if selected and selected not in items:
        items.append(selected)
    return items, selected


@dataclass(frozen=True)
class Sample:
    """One point of a peer's history. Times are POSIX seconds; NaN = not known at that time."""

    t: float
    latency_ms: float = math.nan
    rx_bytes_per_s: float = math.nan
    tx_bytes_per_s: float = math.nan


@dataclass
class _Counters:
    t: float
    rx_bytes: int
    tx_bytes: int


class HistoryStore:
    """Per-peer history of latency and rx/tx rates, bounded to ``max_samples`` per peer.

    Thread-safe: ROS callbacks add samples while the GUI thread reads snapshots.
    """

    def __init__(self, max_samples: int = 600) -> None:
        """Keep at most max_samples points per peer (600 = 10 min at the node's 1 Hz)."""
        self._max = max_samples
        self._lock = threading.Lock()
        self._samples: Dict[str, Deque[Sample]] = {}
        self._counters: Dict[str, _Counters] = {}
        self._rates: Dict[str, Tuple[Optional[float], Optional[float]]] = {}

    def clear(self) -> None:
        """Forget everything (another node was selected)."""
        with self._lock:
            self._samples.clear()
            self._counters.clear()
            self._rates.clear()

    def _append(self, peer: str, sample: Sample) -> None:
        buf = self._samples.get(peer)
        if buf is None:
            buf = self._samples[peer] = deque(maxlen=self._max)
        if buf and sample.t < buf[-1].t:
            return  # out of order (e.g. a latched message re-delivered): keep the plot monotonic
        buf.append(sample)

    def add_counters(self, peer: str, t: float, latency_ms: float, rx_bytes: int,
                     tx_bytes: int) -> Tuple[Optional[float], Optional[float]]:
        """Record one PeerList entry; returns the (rx, tx) byte rates since the previous one.

        A repeated stamp (the same message seen twice) adds nothing and returns the last rates.
        """
        with self._lock:
            prev = self._counters.get(peer)
            if prev is not None and t == prev.t:
                return self._rates.get(peer, (None, None))
            rx = tx = None
            if prev is not None:
                rx = rate_from_counters(prev.rx_bytes, prev.t, rx_bytes, t)
                tx = rate_from_counters(prev.tx_bytes, prev.t, tx_bytes, t)
            self._counters[peer] = _Counters(t, rx_bytes, tx_bytes)
            self._rates[peer] = (rx, tx)
            self._append(peer, Sample(t, latency_ms,
                                      math.nan if rx is None else rx,
                                      math.nan if tx is None else tx))
            return rx, tx

    def add_latency(self, peer: str, t: float, latency_ms: float) -> None:
        """Record a latency measured by an action (ping)."""
        with self._lock:
            self._append(peer, Sample(t, latency_ms))

    def rates(self, peer: str) -> Tuple[Optional[float], Optional[float]]:
        """Last (rx, tx) byte rates of a peer; None = not known yet."""
        with self._lock:
            return self._rates.get(peer, (None, None))

    def samples(self, peer: str) -> List[Sample]:
        """A copy of a peer's history, oldest first."""
        with self._lock:
            return list(self._samples.get(peer, ()))

    def peers(self) -> List[str]:
        """Peers with any history."""
        with self._lock:
            return sorted(self._samples)


STALE_PERIODS = 3.0       # a node is stale after this many of its publish periods without a message
MIN_STALE_AFTER_S = 3.0   # ... but never sooner than this many seconds
DEFAULT_PERIOD_S = 1.0    # publish period assumed before two messages arrived (node.publish_rate 1 Hz)


class Freshness:
    """When the selected node last spoke, to mark it stale when it stops (latched topics keep
    showing the last state of a dead node, all green).

    The node republishes ``~peers`` and ``~status`` every publish period, so the period is learnt
    from the gaps between messages (the shortest recent gap, as bursts on change only make gaps
    shorter). Times are monotonic seconds. Thread-safe: ROS callbacks note messages while the GUI
    thread asks.
    """

    def __init__(self, window: int = 8) -> None:
        """Learn the period from the last ``window`` gaps."""
        self._lock = threading.Lock()
        self._last: Optional[float] = None
        self._gaps: Deque[float] = deque(maxlen=window)

    def clear(self) -> None:
        """Forget everything (another node was selected)."""
        with self._lock:
            self._last = None
            self._gaps.clear()

    def note(self, now: float) -> None:
        """A message arrived at ``now``."""
        with self._lock:
            if self._last is not None and now - self._last > 0.05:  # ~peers and ~status come together
                self._gaps.append(now - self._last)
            if self._last is None or now - self._last > 0.05:
                self._last = now

    def period(self) -> float:
        """The node's publish period in seconds (DEFAULT_PERIOD_S until learnt)."""
        with self._lock:
            return min(self._gaps) if self._gaps else DEFAULT_PERIOD_S

    def stale_after(self) -> float:
        """Seconds of silence after which the node counts as stale."""
        return max(MIN_STALE_AFTER_S, STALE_PERIODS * self.period())

    def age(self, now: float) -> Optional[float]:
        """Seconds since the last message; None = nothing received yet."""
        with self._lock:
            return None if self._last is None else max(0.0, now - self._last)

    def stale(self, now: float) -> Optional[float]:
        """Seconds since the last message when the node is stale, else None."""
        age = self.age(now)
        return age if age is not None and age > self.stale_after() else None
