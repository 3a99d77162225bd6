"""Which peers get a topic of their own, ``~links/<ROS name of the peer>`` (pure: no ROS, no I/O).

``~peers`` carries every peer in one array indexed by position, which rqt_plot and PlotJuggler
cannot follow by name: "latency to alpha-robot1" is ``peers[3]`` until a peer joins before it. So
the node also publishes a few peers' ``Peer`` messages on topics named after the peer
(``/alpha_laptop/overlay_manager/links/alpha_robot1``; the ROS side is ros/peer_topics.py). Each
such topic is a registration with the ROS master and a publish per report, so they are few and
chosen here:

- ``node.link_topics``: ``watched`` (default) chooses the peers with a measured latency, i.e. the
  ones the node pings (the master's machine, the machines carrying ROS topics to or from this one,
  ``node.watch_peers``) and any peer pinged through ``~ping_peer``; ``active`` chooses those and
  every peer tailscaled exchanged traffic with recently (``Peer.active``); ``none`` chooses none.
- ``node.max_link_topics`` caps them. With more candidates than places, peers with a latency come
  first, then by name; a peer that has a topic keeps it while it stays a candidate (another peer
  appearing never takes its place).
- A peer that stops being a candidate keeps its topic for ``LINGER_S`` (a path change drops its
  latency until the next ping answers: its plot must not end there); a peer that leaves the
  tailnet view loses it at once.
- Topic names: ``links/`` + core.ros_names.ros_namespace of the peer's host name
  (``alpha-robot1`` -> ``links/alpha_robot1``). Two peers with one host name (a re-enrolled machine
  next to its old node): the one chosen first has the name, the other no topic.

Cost: one pass over the peers per plan (an attribute test each; keys are computed only for
candidates and for peers that have a topic), so the 500-peer status path gains nothing per peer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from overlay_manager.core.config import LINK_TOPIC_MODES
from overlay_manager.core.identity import peer_key
from overlay_manager.core.peers import PeerState
from overlay_manager.core.ros_names import ros_namespace

WATCHED, ACTIVE, NONE = LINK_TOPIC_MODES
PREFIX = "links/"
"""Topic names are this, relative to the node's private namespace, plus the peer's ROS name."""
LINGER_S = 60.0
"""Seconds a peer keeps its topic after it stops being a candidate (several ping intervals)."""


@dataclass(frozen=True)
class PeerTopic:
    """One per-peer topic: key (core.identity.peer_key of the peer), name (relative to the node,
    ``links/alpha_robot1``) and host (the peer's host name as shown, ``alpha-robot1``)."""

    key: str
    name: str
    host: str


@dataclass(frozen=True)
class TopicPlan:
    """The topics to have now (peer key -> topic) and, for each, when (monotonic s) its peer was
    last a candidate (for LINGER_S)."""

    topics: Mapping[str, PeerTopic]
    chosen_at: Mapping[str, float]


EMPTY = TopicPlan({}, {})


def topic_name(peer: PeerState) -> Optional[str]:
    """``links/<ROS name>`` of peer's host name (its short name, else its overlay name); None when
    it has neither."""
    try:
        return PREFIX + ros_namespace(peer.name or peer.dns_name)
    except ValueError:
        return None


def plan_topics(peers: Sequence[PeerState], mode: str, cap: int, last: TopicPlan, now: float,
                linger_s: float = LINGER_S) -> TopicPlan:
    """The topics for peers (a Snapshot's peers) after last (the plan in force).

    Args:
        mode: one of LINK_TOPIC_MODES (an unknown word chooses nothing).
        cap: most topics at once (node.max_link_topics).
        now: monotonic seconds.
    """
    if mode not in (WATCHED, ACTIVE) or cap <= 0:
        return EMPTY
    current = last.topics
    present: Dict[str, PeerState] = {}
    candidates: List[Tuple[int, str, str, PeerState]] = []   # (rank, name, key, peer)
    active = mode == ACTIVE
    for p in peers:
        ms = p.latency_ms
        if ms != ms and not (active and p.active):  # NaN: no latency measured
            if current:
                key = p.node_id or peer_key(p)
                if key in current:
                    present[key] = p
            continue
        key = p.node_id or peer_key(p)
        present[key] = p
        candidates.append((0 if ms == ms else 1, p.name, key, p))
    chosen = {c[2] for c in candidates}
    topics: Dict[str, PeerTopic] = {}
    chosen_at: Dict[str, float] = {}
    names = set()

    def take(key: str, p: PeerState, at: float) -> None:
        name = topic_name(p)
        if name is None or name in names or len(topics) >= cap:
            return
        names.add(name)
        old = current.get(key)
        topics[key] = old if old is not None and old.name == name and old.host == p.name \
            else PeerTopic(key, name, p.name)
        chosen_at[key] = at

    for key in current:  # the topics in force first, in their order: no churn
        p = present.get(key)
        if p is None:
            continue  # left the tailnet view
        if key in chosen:
            take(key, p, now)
        elif now - last.chosen_at.get(key, now) <= linger_s:
            take(key, p, last.chosen_at.get(key, now))
    for _rank, _name, key, p in sorted(candidates, key=lambda c: c[:3]):
        if key not in topics:
            take(key, p, now)
    return TopicPlan(topics, chosen_at)
