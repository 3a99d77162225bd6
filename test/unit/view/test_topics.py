"""Unit tests of the dashboard's Topics-view rows and stale-node detection (pure parts)."""

from __future__ import annotations

import math
from types import SimpleNamespace

from overlay_manager.view import text as fmt
from overlay_manager.view.state import MIN_STALE_AFTER_S, Freshness
from overlay_manager.view.topics import (
    NO_BUDGET,
    ShapingCells,
    reported_stale_text,
    stale_text,
    topic_row,
    topic_rows,
    topics_headline,
)


def link(**kw: object) -> SimpleNamespace:
    base = dict(topic="/cam", type="sensor_msgs/Image", publisher_node="/robot1/cam",
                publisher_host="robot1", subscriber_node="/viewer", subscriber_host="laptop",
                local=False, path="direct", endpoint="192.0.2.1:41641", bytes_per_second=1e6)
    base.update(kw)
    return SimpleNamespace(**base)


def test_topic_row_texts() -> None:
    r = topic_row(link())
    assert (r.topic, r.sender, r.receiver, r.path, r.where, r.rate) == (
        "/cam", "robot1", "laptop", "direct", "192.0.2.1:41641", "8.00 Mbit/s")
    assert r.sender_tip == "/robot1/cam on robot1" and r.topic_tip == "sensor_msgs/Image"
    derp = topic_row(link(path="derp", endpoint="lab", bytes_per_second=math.nan, publisher_host=""))
    assert (derp.where, derp.rate, derp.rate_sort, derp.sender) == ("DERP lab", fmt.NO_VALUE, -1.0,
                                                                     "(not on the overlay)")
    assert topic_row(link(path="unknown", endpoint="")).where == ""


def test_shaped_topic_tiers_say_what_the_subscriber_gets() -> None:
    fitted = topic_row(link(topic="/robot1/points/shaped", type="overlay_manager/ShapedMessage", path="derp"))
    assert fitted.topic == "/robot1/points/shaped (shaped /robot1/points, fitted tier)"
    assert "zstd" in fitted.topic_tip and "unshape" in fitted.topic_tip
    full = topic_row(link(topic="/robot1/points/shaped/full", type="overlay_manager/ShapedMessage"))
    assert full.topic == "/robot1/points/shaped/full (shaped /robot1/points, full tier)"
    assert "as published" in full.topic_tip
    # the name alone, or the type alone, is not a shaped topic
    assert topic_row(link(topic="/robot1/points/shaped", type="sensor_msgs/PointCloud2")).topic == \
        "/robot1/points/shaped"
    assert topic_row(link(topic="/shaped", type="overlay_manager/ShapedMessage")).topic == "/shaped"


def shaping(**kw: object) -> SimpleNamespace:
    """A StreamSubscriber-like entry of a relayed subscriber of a shaped cloud."""
    base = dict(node="/viewer", host="laptop", path="derp", budget_kbps=4000.0, observed_cap_kbps=math.nan,
                backlog_bytes=0, queue_delay_ms=math.nan, tier="fitted", wanted_tier="fitted", codec="zstd",
                codec_reason="", quality=0, rate_hz=1.5, bitrate_kbps=3900.0)
    base.update(kw)
    return SimpleNamespace(**base)


def test_shaping_cells_say_tier_rate_cap_and_budget() -> None:
    r = topic_row(link(topic="/robot1/points/shaped", type="overlay_manager/ShapedMessage", path="derp",
                       shaping_state="/robot1/points/shaped/stream_state",
                       shaping_format="sensor_msgs/PointCloud2; zstd; decimate 1/5; 7.12:1",
                       shaping_reason="path derp", shaping=shaping()))
    c = r.shaping
    assert (c.tier, c.cap, c.budget) == ("fitted zstd", "1.5 Hz", "4.00 Mbit/s")
    assert (c.cap_sort, c.budget_sort) == (1.5, 4000.0)
    assert c.tier_tip.splitlines()[:3] == ["from /robot1/points/shaped/stream_state",
                                           "format: sensor_msgs/PointCloud2; zstd; decimate 1/5; 7.12:1",
                                           "why this rate: path derp"]
    assert "stream bitrate: 3.90 Mbit/s" in c.tier_tip and "path as the publisher's machine sees it: derp" in c.tier_tip
    # a camera without tiers on a direct path: codec and quality, no budget (sorts above every number)
    cam = topic_row(link(topic="/robot1/cam/link_aware", shaping_state="/robot1/cam/link_aware/stream_state",
                         shaping=shaping(tier="", wanted_tier="", codec="jpeg", quality=62, rate_hz=30.0,
                                         budget_kbps=math.nan, bitrate_kbps=math.nan))).shaping
    assert (cam.tier, cam.cap, cam.budget, cam.budget_sort) == ("jpeg q62", "30.0 Hz", NO_BUDGET, math.inf)
    assert "stream bitrate" not in cam.tier_tip
    # a subscriber that cannot follow the directory stays on the fitted tier
    stuck = topic_row(link(shaping_state="/s/stream_state", shaping=shaping(wanted_tier="full", rate_hz=math.nan)))
    assert (stuck.shaping.tier, stuck.shaping.cap, stuck.shaping.cap_sort) == ("fitted zstd (wants full)",
                                                                               fmt.NO_VALUE, -1.0)


def test_links_without_shaping_have_empty_cells() -> None:
    assert topic_row(link()).shaping == ShapingCells()  # an object without the fields (older links)
    unshaped = link(shaping_state="", shaping=shaping(rate_hz=math.nan, budget_kbps=math.nan))
    assert topic_row(unshaped).shaping == ShapingCells()
    assert (ShapingCells().tier, ShapingCells().cap, ShapingCells().budget) == ("", "", "")


def test_topic_rows_leave_local_links_out_and_headline() -> None:
    rows = topic_rows([link(), link(local=True, path="self"), link(path="derp", endpoint="lab")])
    assert [r.path for r in rows] == ["direct", "derp"]
    assert topics_headline(rows) == "2 topic links: 1 derp, 1 direct"
    assert topics_headline(rows[:1]) == "1 topic link: 1 direct"
    assert topics_headline([]) == "0 topic links"


def test_freshness_learns_the_period_and_marks_stale() -> None:
    f = Freshness()
    assert f.age(5.0) is None and f.stale(100.0) is None     # nothing received: not "stale"
    for t in (0.0, 0.01, 2.0, 2.02, 4.0):                     # ~peers and ~status every 2 s
        f.note(t)
    assert f.period() == 2.0
    assert f.stale_after() == 6.0
    assert f.stale(9.9) is None
    assert f.stale(10.5) == 6.5
    f.clear()
    assert f.stale(1000.0) is None


def test_freshness_minimum() -> None:
    f = Freshness()
    for t in (0.0, 0.5, 1.0):
        f.note(t)
    assert f.stale_after() == MIN_STALE_AFTER_S
    assert f.stale(1.0 + MIN_STALE_AFTER_S - 0.1) is None
    assert f.stale(1.0 + MIN_STALE_AFTER_S + 0.1) is not None


def test_stale_text() -> None:
    assert stale_text("/n", None, 3.0) == ""
    text = stale_text("/robot1/overlay_manager", 12.4, 3.0)
    assert text.startswith("STALE since 12 s") and "/robot1/overlay_manager" in text


def test_reported_stale_text() -> None:
    text = reported_stale_text("/n", 7.2, "tailscaled is not reachable")
    assert text.startswith("STALE since 7 s: /n cannot read tailscaled (tailscaled is not reachable)")
    assert reported_stale_text("/n", math.nan, "").startswith("STALE: /n cannot read tailscaled (no reason")
