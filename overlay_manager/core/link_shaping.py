"""What a shaped stream decided for each subscriber, put on the topic links (pure: no ROS, no I/O).

Shaped streams (the link-aware camera transports, the topic shaper's ``TOPIC/shaped``) publish
per tier a latched ``overlay_manager/StreamState`` on ``<tier topic>/stream_state``: the tier's
output topic, the copies it also goes out on (``other_topics``), its format and reason, and one
``StreamSubscriber`` entry per subscribing node (tier, codec, quality, rate cap, budget, ...).
A topic link (``core.topic_links.TopicLink``) of such a stream gets its subscriber's entry when

- the link's topic is the state's ``topic`` or one of its ``other_topics``,
- the link's publisher is the node that publishes the stream_state (a stream publishes its tiers
  and their states from one process: one caller id), and
- the state lists the link's subscriber node.

Which stream_state topics the overlay node follows (:func:`states_to_follow`): those whose
stream goes across this machine's boundary (a cross-machine link of the tier topic, or of a copy
beside it, with one end on this machine): a stream nobody on another machine reads costs nothing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Protocol, Sequence, Set, Tuple, TypeVar


class LinkEnds(Protocol):
    """What this module reads of a topic link (``core.topic_links.TopicLink``, which imports this
    module for its ``shaping`` field)."""

    topic: str
    publisher_node: str
    publisher_host: str
    subscriber_node: str
    subscriber_host: str
    local: bool


LinkT = TypeVar("LinkT", bound=LinkEnds)

STREAM_STATE_TYPE = "overlay_manager/StreamState"
"""Message type of a shaped stream's stream_state topics."""
STREAM_STATE_SUFFIX = "/stream_state"
"""A stream_state topic is ``<tier topic>/stream_state``."""


@dataclass(frozen=True)
class SubscriberShaping:
    """One subscriber's entry in a stream_state: the ROS-free twin of overlay_manager/StreamSubscriber
    (same field names, same meanings and units: see StreamSubscriber.msg).

    path, backlog_bytes and queue_delay_ms are as the publisher's machine sees them; budget_kbps,
    observed_cap_kbps, queue_delay_ms and pacing_kbps are NaN for "none" / "not measured" / "not paced".
    """

    node: str = ""
    host: str = ""
    path: str = ""
    budget_kbps: float = math.nan
    observed_cap_kbps: float = math.nan
    backlog_bytes: int = 0
    queue_delay_ms: float = math.nan
    tier: str = ""
    wanted_tier: str = ""
    codec: str = ""
    codec_reason: str = ""
    quality: int = 0
    rate_hz: float = math.nan
    bitrate_kbps: float = math.nan
    pacing_kbps: float = math.nan

    @staticmethod
    def from_fields(entry: Any) -> "SubscriberShaping":
        """Copy the fields of anything that has them by name (a StreamSubscriber message); a
        missing field keeps its default."""
        return SubscriberShaping(**{f.name: getattr(entry, f.name, f.default)
                                    for f in dataclasses.fields(SubscriberShaping)})


@dataclass(frozen=True)
class Shaping:
    """What a shaped stream gives one subscriber, and where that was read (TopicLink.shaping_*).

    state_topic: the stream_state topic; format and reason: the tier's StreamState.format and
    .reason; subscriber: the subscriber's entry there.
    """

    state_topic: str
    format: str
    reason: str
    subscriber: SubscriberShaping


@dataclass(frozen=True)
class StreamStateView:
    """One stream_state message as received from one publisher.

    state_topic: where it was received; publisher: caller id of the node that sent it;
    topics: the topics its subscribers read (StreamState.topic and other_topics; the topic the
    state topic names when StreamState.topic is empty); format, reason: the tier's; subscribers:
    the entries by subscribing node.
    """

    state_topic: str
    publisher: str
    topics: Tuple[str, ...]
    format: str
    reason: str
    subscribers: Mapping[str, SubscriberShaping]

    @staticmethod
    def from_message(state_topic: str, publisher: str, msg: Any) -> "StreamStateView":
        """A StreamState message (anything with its fields by name) received on state_topic from
        publisher. Entries without a node are left out."""
        topics = [msg.topic or tier_topic(state_topic)]
        topics.extend(t for t in (getattr(msg, "other_topics", None) or ()) if t and t not in topics)
        subs: Dict[str, SubscriberShaping] = {}
        for entry in getattr(msg, "subscribers", None) or ():
            view = SubscriberShaping.from_fields(entry)
            if view.node:
                subs[view.node] = view
        return StreamStateView(state_topic, publisher, tuple(topics), getattr(msg, "format", ""),
                               getattr(msg, "reason", ""), subs)


def tier_topic(state_topic: str) -> str:
    """``/r/points/shaped/stream_state`` -> ``/r/points/shaped``; "" for a name that is not a
    stream_state topic."""
    if state_topic.endswith(STREAM_STATE_SUFFIX) and len(state_topic) > len(STREAM_STATE_SUFFIX):
        return state_topic[: -len(STREAM_STATE_SUFFIX)]
    return ""


def stream_state_topics(publishers: Mapping[str, Sequence[str]],
                        types: Mapping[str, str]) -> Dict[str, Tuple[str, ...]]:
    """stream_state topic -> its publishing nodes, from the master's system state
    (``SystemState.publishers`` and ``.types``): every ``*/stream_state`` topic of type
    overlay_manager/StreamState that has a publisher."""
    return {topic: tuple(nodes) for topic, nodes in publishers.items()
            if nodes and tier_topic(topic) and types.get(topic) == STREAM_STATE_TYPE}


def states_to_follow(state_topics: Mapping[str, Sequence[str]], links: Iterable[LinkEnds], self_name: str,
                     own_node: str) -> FrozenSet[str]:
    """The stream_state topics worth subscribing to: those whose publisher sends the stream's
    output across this machine's boundary (a link, not local, with exactly one end on machine
    ``self_name``, from that publisher, on the tier topic or on a sibling of it: the copies a
    stream names in other_topics, e.g. ``<image>/compressed`` beside ``<image>/link_aware``).
    Other topics of the publisher do not count (every node sends /rosout to the master's
    machine), nor links to ``own_node`` (this node). Empty when self_name is unknown.

    Args:
        state_topics: from :func:`stream_state_topics`.
        links: the topic-link map (local links included).
        self_name: this machine's short name.
        own_node: this node's caller id.
    """
    if not self_name:
        return frozenset()
    sent: Dict[str, Set[str]] = {}  # publisher -> topics it sends across this machine's boundary
    for link in links:
        if link.local or link.subscriber_node == own_node:
            continue
        if (link.publisher_host == self_name) != (link.subscriber_host == self_name):
            sent.setdefault(link.publisher_node, set()).add(link.topic)
    out: Set[str] = set()
    for state_topic, nodes in state_topics.items():
        tier = tier_topic(state_topic)
        for node in nodes:
            if any(t == tier or _parent(t) == _parent(tier) for t in sent.get(node, ())):
                out.add(state_topic)
                break
    return frozenset(out)


def _parent(name: str) -> str:
    """``/a/b/c`` -> ``/a/b``."""
    return name.rsplit("/", 1)[0]


def current_views(views: Iterable[StreamStateView],
                  state_topics: Mapping[str, Sequence[str]]) -> List[StreamStateView]:
    """The views whose publisher still publishes their stream_state topic (a latched message of a
    publisher that left, or of a node that was restarted under another name, is dropped), sorted by
    state topic then publisher."""
    return sorted((v for v in views if v.publisher in state_topics.get(v.state_topic, ())),
                  key=lambda v: (v.state_topic, v.publisher))


def shaping_of(views: Iterable[StreamStateView]) -> Dict[Tuple[str, str, str], Shaping]:
    """(topic, publisher node, subscriber node) -> what that subscriber gets, from every view.
    When two views name the same connection the first (in the order given) wins."""
    out: Dict[Tuple[str, str, str], Shaping] = {}
    for v in views:
        for topic in v.topics:
            for node, sub in v.subscribers.items():
                out.setdefault((topic, v.publisher, node), Shaping(v.state_topic, v.format, v.reason, sub))
    return out


def annotate(links: Iterable[LinkT], views: Sequence[StreamStateView]) -> List[LinkT]:
    """The links (dataclasses with a ``shaping`` field: ``core.topic_links.TopicLink``), each with
    ``shaping`` set from the views when one names its connection and None otherwise; order kept."""
    found = shaping_of(views)
    return [dataclasses.replace(link, shaping=found.get((link.topic, link.publisher_node,
                                                         link.subscriber_node)))
            for link in links]

