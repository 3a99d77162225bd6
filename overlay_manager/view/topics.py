"""Display of the Topics view and of stale nodes (pure: no Qt, no ROS; unit-tested on its own).

A topic link (overlay_manager/TopicLink) is one ROS topic connection between two machines with
the overlay path it crosses. The Topics view shows one row per link: topic, from, to, path (in
the path's colour), rate and, for a connection of a shaped stream, what the shaping gives that
subscriber (tier and codec, rate cap, budget: TopicLink.shaping_*). Functions read message fields
by name, so tests can pass any object with those attributes.
"""

from __future__ import annotations

import math
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
    ("tier", "Tier", "shaped streams: the tier this subscriber reads and what it is coded with (the "
                     "tooltip has the rest of the publisher's stream_state); empty = not shaped"),
    ("cap", "Rate cap", "shaped streams: the highest message rate this subscriber gets now"),
    ("budget", "Budget", "shaped streams: this subscriber's bitrate budget (its path's, lowered by "
                         "what its connection delivers); none = full rate"),
)


@dataclass(frozen=True)
class ShapingCells:
    """The Tier, Rate cap and Budget cells of a link (all "" for a link that is not shaped).
    Sort values: -1 for no value; a budget of "none" sorts above every number."""

    tier: str = ""
    tier_tip: str = ""
    cap: str = ""
    cap_sort: float = -1.0
    budget: str = ""
    budget_sort: float = -1.0


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
    shaping: ShapingCells = ShapingCells()


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


NO_BUDGET = "none"
"""Budget cell of a shaped subscriber without a budget (self and direct paths by default)."""


def shaping_cells(link: Any) -> ShapingCells:
    """What a shaped stream gives this link's subscriber (TopicLink.shaping_*), as cells:
    "fitted zstd" / "full h264" / "jpeg q62" (a stream without tiers), "(wants full)" when the
    subscriber reads another tier than its path calls for; "2.0 Hz"; "3.20 Mbit/s" or "none"."""
    state = getattr(link, "shaping_state", "")
    sub = getattr(link, "shaping", None)
    if not state or sub is None:
        return ShapingCells()
    codec = f"{sub.codec} q{sub.quality}" if sub.quality else sub.codec
    tier = " ".join(x for x in (sub.tier, codec) if x) or fmt.NO_VALUE
    if sub.wanted_tier and sub.tier and sub.wanted_tier != sub.tier:
        tier += f" (wants {sub.wanted_tier})"
    budget_kbps = sub.budget_kbps
    no_budget = fmt.is_nan(budget_kbps)
    details = [f"from {state}"]
    for label, value in (("format", getattr(link, "shaping_format", "")),
                         ("why this rate", getattr(link, "shaping_reason", "")),
                         ("codec", f"{sub.codec}" + (f" ({sub.codec_reason})" if sub.codec_reason else "")),
                         ("tier its path calls for", sub.wanted_tier),
                         ("stream bitrate", "" if fmt.is_nan(sub.bitrate_kbps)
                          else fmt.format_bitrate(sub.bitrate_kbps * 1000.0)),
                         ("paced at", "" if fmt.is_nan(getattr(sub, "pacing_kbps", math.nan))
                          else fmt.format_bitrate(sub.pacing_kbps * 1000.0)),
                         ("path as the publisher's machine sees it", sub.path)):
        if value:
            details.append(f"{label}: {value}")
    return ShapingCells(
        tier=tier, tier_tip="\n".join(details),
        cap=fmt.NO_VALUE if fmt.is_nan(sub.rate_hz) else f"{sub.rate_hz:.1f} Hz",
        cap_sort=-1.0 if fmt.is_nan(sub.rate_hz) else float(sub.rate_hz),
        budget=NO_BUDGET if no_budget else fmt.format_bitrate(budget_kbps * 1000.0),
        budget_sort=float("inf") if no_budget else float(budget_kbps))


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
        receiver_tip=f"{link.subscriber_node} on {machine_text(link.subscriber_host)}",
        shaping=shaping_cells(link))


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
