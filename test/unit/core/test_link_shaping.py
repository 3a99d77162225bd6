"""Unit tests of what shaped streams give each topic link (overlay_manager.core.link_shaping); the
ROS side (following stream_state topics on a real master) is checked by the topic_links rostest."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from types import SimpleNamespace

from overlay_manager.core.link_shaping import (
    STREAM_STATE_TYPE,
    Shaping,
    StreamStateView,
    SubscriberShaping,
    annotate,
    current_views,
    shaping_of,
    states_to_follow,
    stream_state_topics,
    tier_topic,
)
from overlay_manager.core.topic_links import TopicLink

MSG = Path(__file__).resolve().parents[3] / "overlay_msgs" / "msg"


def entry(node: str, **kw: object) -> SimpleNamespace:
    """A StreamSubscriber-like entry."""
    base = dict(node=node, host="laptop", path="derp", budget_kbps=4000.0, observed_cap_kbps=math.nan,
                backlog_bytes=0, queue_delay_ms=math.nan, tier="fitted", wanted_tier="fitted",
                codec="zstd", codec_reason="", quality=0, rate_hz=1.5, bitrate_kbps=3900.0)
    base.update(kw)
    return SimpleNamespace(**base)


def state_msg(topic: str, *entries: SimpleNamespace, other_topics: tuple = (),
              fmt: str = "sensor_msgs/PointCloud2; zstd", reason: str = "path derp") -> SimpleNamespace:
    """A StreamState-like message."""
    return SimpleNamespace(topic=topic, other_topics=list(other_topics), format=fmt, reason=reason,
                           subscribers=list(entries))


def link(topic: str, pub: str, sub: str, pub_host: str = "robot1", sub_host: str = "laptop",
         local: bool = False) -> TopicLink:
    return TopicLink(topic, "overlay_manager/ShapedMessage", pub, pub_host, sub, sub_host, local,
                     "self" if local else "derp")


def test_subscriber_shaping_is_the_twin_of_stream_subscriber() -> None:
    """Same field names in the same order as StreamSubscriber.msg (the ROS side copies by name)."""
    names = []
    for line in (MSG / "StreamSubscriber.msg").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line.split()[1])
    assert [f.name for f in dataclasses.fields(SubscriberShaping)] == names
    # and TopicLink.msg carries it under shaping, with where it came from
    fields = re.findall(r"^(?!#)(\S+) (\w+)", (MSG / "TopicLink.msg").read_text(), re.M)
    assert fields[-4:] == [("string", "shaping_state"), ("string", "shaping_format"),
                           ("string", "shaping_reason"), ("StreamSubscriber", "shaping")]


def test_view_from_message() -> None:
    v = StreamStateView.from_message("/r/cam/link_aware/stream_state", "/r/cam", state_msg(
        "/r/cam/link_aware", entry("/viewer"), entry("", tier="full"), other_topics=("/r/cam/compressed", "")))
    assert v.topics == ("/r/cam/link_aware", "/r/cam/compressed")
    assert list(v.subscribers) == ["/viewer"]  # an entry without a node is left out
    assert v.subscribers["/viewer"] == SubscriberShaping(
        node="/viewer", host="laptop", path="derp", budget_kbps=4000.0, tier="fitted", wanted_tier="fitted",
        codec="zstd", rate_hz=1.5, bitrate_kbps=3900.0)
    # an empty StreamState.topic: the topic the state topic names
    assert StreamStateView.from_message("/r/p/shaped/stream_state", "/s", state_msg("")).topics == ("/r/p/shaped",)
    # missing fields keep their defaults (an older message)
    old = SubscriberShaping.from_fields(SimpleNamespace(node="/v", tier="fitted"))
    assert old.node == "/v" and math.isnan(old.rate_hz) and old.codec == ""


def test_stream_state_topics_by_name_and_type() -> None:
    pubs = {"/r/p/shaped/stream_state": ("/shaper",), "/r/p/shaped": ("/shaper",),
            "/x/stream_state": ("/other",), "/stream_state": ("/n",), "/idle/stream_state": ()}
    types = {"/r/p/shaped/stream_state": STREAM_STATE_TYPE, "/r/p/shaped": "overlay_manager/ShapedMessage",
             "/x/stream_state": "std_msgs/String", "/stream_state": STREAM_STATE_TYPE,
             "/idle/stream_state": STREAM_STATE_TYPE}
    assert stream_state_topics(pubs, types) == {"/r/p/shaped/stream_state": ("/shaper",)}
    assert tier_topic("/r/p/shaped/stream_state") == "/r/p/shaped"
    assert tier_topic("/stream_state") == "" and tier_topic("/r/p") == ""


def test_follow_only_streams_sent_across_this_machine() -> None:
    states = {"/r1/p/shaped/stream_state": ("/r1/shaper",),      # robot1 -> laptop (this machine)
              "/r2/p/shaped/stream_state": ("/r2/shaper",),      # robot2 -> robot3: neither end here
              "/r1/local/stream_state": ("/r1/local",),          # only local subscribers
              "/lap/cam/link_aware/stream_state": ("/lap/cam",),  # laptop -> robot1 (this machine sends)
              "/r3/cam/link_aware/stream_state": ("/r3/cam",),    # only the copy beside it is read here
              "/r4/q/shaped/stream_state": ("/r4/shaper",)}       # only its /rosout reaches this machine
    links = [link("/r1/p/shaped", "/r1/shaper", "/viewer"),
             link("/r2/p/shaped", "/r2/shaper", "/rec", "robot2", "robot3"),
             link("/r1/local/out", "/r1/local", "/r1/rec", "robot1", "robot1", local=True),
             link("/lap/cam/link_aware", "/lap/cam", "/r1/det", "laptop", "robot1"),
             link("/r3/cam/compressed", "/r3/cam", "/viewer", "robot3"),
             link("/rosout", "/r4/shaper", "/rosout", "robot4"),
             link("/r4/q", "/r4/driver", "/viewer", "robot4")]  # the raw input, from another node
    assert states_to_follow(states, links, "laptop", "/laptop/overlay_manager") == {
        "/r1/p/shaped/stream_state", "/lap/cam/link_aware/stream_state", "/r3/cam/link_aware/stream_state"}
    assert states_to_follow(states, links, "", "/laptop/overlay_manager") == frozenset()


def test_views_of_publishers_that_left_are_dropped() -> None:
    a = StreamStateView("/p/shaped/stream_state", "/shaper", ("/p/shaped",), "", "", {})
    b = StreamStateView("/p/shaped/stream_state", "/old_shaper", ("/p/shaped",), "", "", {})
    c = StreamStateView("/gone/stream_state", "/shaper", ("/gone",), "", "", {})
    assert current_views([c, b, a], {"/p/shaped/stream_state": ("/shaper",)}) == [a]


def test_annotate_matches_topic_publisher_and_subscriber() -> None:
    fitted = StreamStateView.from_message("/r/p/shaped/stream_state", "/shaper", state_msg(
        "/r/p/shaped", entry("/viewer"), entry("/rviz", rate_hz=0.5), reason="observed delivery"))
    full = StreamStateView.from_message("/r/p/shaped/full/stream_state", "/shaper", state_msg(
        "/r/p/shaped/full", entry("/direct_viewer", tier="full", wanted_tier="full", budget_kbps=math.nan,
                                  codec="zstd", rate_hz=10.0), reason="no budget"))
    cam = StreamStateView.from_message("/r/cam/link_aware/stream_state", "/cam", state_msg(
        "/r/cam/link_aware", entry("/viewer", tier="", codec="jpeg", quality=62, rate_hz=30.0),
        other_topics=("/r/cam/compressed",), fmt="rgb8; jpeg compressed bgr8"))
    links = [
        link("/r/p/shaped", "/shaper", "/viewer"),
        link("/r/p/shaped", "/shaper", "/rviz"),
        link("/r/p/shaped", "/shaper", "/new_viewer"),     # not listed (yet): no shaping
        link("/r/p/shaped", "/impostor", "/viewer"),       # another publisher of the topic
        link("/r/p/shaped/full", "/shaper", "/direct_viewer"),
        link("/r/p/shaped/full", "/shaper", "/viewer"),    # /viewer is in the fitted tier's state only
        link("/r/cam/compressed", "/cam", "/viewer"),      # the copy named in other_topics
        link("/r/cam/image_raw", "/cam", "/viewer"),       # the raw topic is not shaped
    ]
    out = annotate(links, [cam, fitted, full])
    assert [x.topic for x in out] == [x.topic for x in links]  # order kept
    got = [(x.shaping.state_topic, x.shaping.subscriber.tier, x.shaping.subscriber.rate_hz) if x.shaping else None
           for x in out]
    assert got == [
        ("/r/p/shaped/stream_state", "fitted", 1.5),
        ("/r/p/shaped/stream_state", "fitted", 0.5),
        None,
        None,
        ("/r/p/shaped/full/stream_state", "full", 10.0),
        None,
        ("/r/cam/link_aware/stream_state", "", 30.0),
        None,
    ]
    assert out[1].shaping == Shaping("/r/p/shaped/stream_state", "sensor_msgs/PointCloud2; zstd",
                                     "observed delivery", fitted.subscribers["/rviz"])
    assert out[6].shaping.format == "rgb8; jpeg compressed bgr8" and out[6].shaping.subscriber.quality == 62
    assert math.isnan(out[4].shaping.subscriber.budget_kbps)
    assert annotate(links, []) == links  # nothing known: every shaping None


def test_first_view_wins_when_two_name_one_connection() -> None:
    one = StreamStateView("/a/stream_state", "/p", ("/t",), "one", "", {"/s": SubscriberShaping(node="/s")})
    two = StreamStateView("/b/stream_state", "/p", ("/t",), "two", "", {"/s": SubscriberShaping(node="/s")})
    assert shaping_of([one, two])[("/t", "/p", "/s")].format == "one"
