"""Display of the Topics view and of stale nodes (pure: no Qt, no ROS; unit-tested on its own).

A topic link (overlay_manager/TopicLink) is one ROS topic connection between two machines with
the overlay path it crosses. The Topics view shows one row per link: topic, from, to, path (in
the path's colour) and rate. Functions read message fields by name, so tests can pass any object
with those attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Tuple

from overlay_manager.core.peers import PATH_DERP
from overlay_manager.core.topic_links import shaped_tier
from overlay_manager.view import text as fmt

# (key, header, tooltip); keys are what snapshot() reports.
TOPIC_COLUMNS: Tuple[Tuple[str, str, str], ...] = (
    ("topic", "Topic", "resolved topic name; the tooltip has the message type"),
    ("from", "From", "publisher's machine (node in the tooltip)"),
    ("to", "To", "subscriber's machine (node in the tooltip)"),
    ("path", "Path", "overlay path between the two machines as the selected node's machine sees it; "
                     "unknown when neither end is that machine"),
    ("where", "Endpoint / relay", "UDP endpoint of a direct path, the relay, or the DERP region"),
    ("rate", "Rate", "data rate of this connection, from the publisher's byte counter"),
)


@dataclass(frozen=True)
class TopicRow:
    """The cell texts and tooltips of one Topics-view row."""

    topic: str
    sender: str
    receiver: str
    path: str
    where: str
    rate: str
    rate_sort: float
    topic_tip: str
    sender_tip: str
    receiver_tip: str


def machine_text(host: str) -> str:
    """A link end's machine: its short name, or "(not on the overlay)" when the node's host is
    not an overlay machine."""
    return host or "(not on the overlay)"


SHAPED_TIER_WORDS = {
    "fitted": "fitted to the subscribers' paths: zstd, rate within the path's budget, clouds reduced where allowed",
    "full": "full tier for paths without a budget: the messages as published, full rate",
}
"""What each tier of a shaped topic carries (docs/shaping.md), for the topic cell's tooltip."""


def topic_text(topic: str, msg_type: str) -> Tuple[str, str]:
    """(cell text, tooltip) of a link's topic: a tier of a shaped topic names its original topic
    and what the subscriber gets ("/r/points/shaped (shaped /r/points, fitted tier)"); any
    other topic is shown as it is, its type in the tooltip."""
    shaped = shaped_tier(topic, msg_type)
    if shaped is None:
        return topic, msg_type or "type unknown"
    original, tier = shaped
    return (f"{topic} (shaped {original}, {tier} tier)",
            f"{msg_type}: {original} {SHAPED_TIER_WORDS[tier]}; a viewer restores the type with unshape")


def topic_row(link: Any) -> TopicRow:
    """One TopicLink message -> the texts of its row."""
    rate = link.bytes_per_second
    where = ""
    if link.path == PATH_DERP:
        where = f"DERP {link.endpoint}" if link.endpoint else "DERP"
    elif link.endpoint:
        where = link.endpoint
    topic, topic_tip = topic_text(link.topic, link.type)
    return TopicRow(
        topic=topic, sender=machine_text(link.publisher_host),
        receiver=machine_text(link.subscriber_host), path=link.path, where=where,
        rate=fmt.format_rate(rate), rate_sort=-1.0 if fmt.is_nan(rate) else float(rate),
        topic_tip=topic_tip,
        sender_tip=f"{link.publisher_node} on {machine_text(link.publisher_host)}",
        receiver_tip=f"{link.subscriber_node} on {machine_text(link.subscriber_host)}")


def topic_rows(links: Iterable[Any]) -> List[TopicRow]:
    """Rows for the cross-machine links of a TopicLinkList (links inside one machine are left
    out: they cross no overlay path)."""
    return [topic_row(link) for link in links if not link.local]


def topics_headline(rows: List[TopicRow]) -> str:
    """"4 topic links: 3 direct, 1 derp" for the Topics tab's summary line."""
    counts: dict = {}
    for r in rows:
        counts[r.path] = counts.get(r.path, 0) + 1
    parts = [f"{n} {path}" for path, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    noun = "topic link" if len(rows) == 1 else "topic links"
    return f"{len(rows)} {noun}" + (": " + ", ".join(parts) if parts else "")


def reported_stale_text(node: str, status_age_s: Optional[float], error: str) -> str:
    """The headline when the node is alive but says it cannot read tailscaled (~status stale)."""
    since = "" if fmt.is_nan(status_age_s) else f" since {status_age_s:.0f} s"
    return (f"STALE{since}: {node} cannot read tailscaled ({error or 'no reason given'}); "
            f"the table shows the last state it knew")


def stale_text(node: str, age_s: Optional[float], stale_after_s: float) -> str:
    """The headline for a node that stopped publishing; "" when it is not stale (age_s None)."""
    if age_s is None:
        return ""
    return (f"STALE since {age_s:.0f} s: no ~peers/~status from {node} (more than "
            f"{stale_after_s:.0f} s without a message: stopped, or the master is unreachable); "
            f"the table shows its last state")
