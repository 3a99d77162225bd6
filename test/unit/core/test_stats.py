"""The one statistics definition (overlay_manager.core.stats): percentiles, rates, latencies, summaries."""
import math

import pytest

from overlay_manager.core.stats import latency_stats, percentile, rate_stats, summary, window_stats


def test_percentile_interpolates_linearly_between_ranks():
    xs = [10.0, 20.0, 30.0, 40.0]
    assert percentile(xs, 0) == 10.0
    assert percentile(xs, 100) == 40.0
    assert percentile(xs, 50) == pytest.approx(25.0)  # rank 1.5: halfway between 20 and 30
    assert percentile(xs, 99) == pytest.approx(30.0 + 10.0 * (3 * 0.99 - 2))


def test_percentile_matches_numpy_linear_definition():
    xs = [7.0, 1.0, 3.0, 9.0, 4.0, 4.0, 12.5]
    s = sorted(xs)
    for q in (0, 1, 25, 50, 75, 90, 99, 100):
        k = (len(s) - 1) * q / 100
        expected = s[math.floor(k)] + (s[math.ceil(k)] - s[math.floor(k)]) * (k - math.floor(k))
        assert percentile(xs, q) == pytest.approx(expected)
    assert percentile(xs, 50) == 4.0  # the median of an odd count is a sample


def test_percentile_edge_cases():
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError, match="outside 0..100"):
        percentile([1.0], 0.99 * 1000)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


def test_rate_stats_window_and_span():
    times = [0.0, 0.1, 0.2, 0.5, 0.6]
    r = rate_stats(times, 1.0)
    assert r["count"] == 5 and r["seconds"] == 1.0
    assert r["rate_hz"] == pytest.approx(5.0)
    assert r["span_rate_hz"] == pytest.approx(4 / 0.6)
    assert r["max_gap_s"] == pytest.approx(0.3)
    empty = rate_stats([], 2.0)
    assert empty["count"] == 0 and empty["rate_hz"] == 0.0
    assert empty["span_rate_hz"] is None and empty["max_gap_s"] is None
    assert rate_stats([1.0], 0.0)["rate_hz"] is None


def test_latency_stats_names_and_values():
    lat = [float(x) for x in range(1, 101)]
    out = latency_stats(lat, "rtt")
    assert set(out) == {"rtt_p50_ms", "rtt_p99_ms", "rtt_max_ms"}
    assert out["rtt_p50_ms"] == pytest.approx(50.5)
    assert out["rtt_p99_ms"] == pytest.approx(99.01)
    assert out["rtt_max_ms"] == 100.0
    assert latency_stats([]) == {"latency_p50_ms": None, "latency_p99_ms": None, "latency_max_ms": None}


def test_summary():
    assert summary([]) == {"n": 0}
    s = summary([3.0, 1.0, 2.0, 10.0])
    assert s == {"n": 4, "mean": 4.0, "min": 1.0, "max": 10.0, "median": 2.5}


def test_window_stats_takes_only_what_was_sent_in_the_window():
    # 50 Hz for 4 s from t=10; the first second's round trips are long (a queue filling), one lost
    samples = [[10.0 + i * 0.02, (300.0 if i < 50 else 20.0)] for i in range(200)]
    samples[120][1] = None
    whole = window_stats(samples, 0.0, 100.0)
    assert whole["sent"] == 200 and whole["received"] == 199 and whole["rtt_max_ms"] == 300.0
    later = window_stats(samples, 11.0, 13.99)
    assert later["sent"] == 150 and later["received"] == 149
    assert later["rtt_p99_ms"] == 20.0 and later["rtt_max_ms"] == 20.0
    assert later["covered"] == pytest.approx(2.98 / 2.99, abs=1e-3)
    # a window the samples only half span
    half = window_stats(samples, 12.0, 16.0)
    assert half["covered"] == pytest.approx(0.5, abs=0.01)
    empty = window_stats(samples, 20.0, 21.0)
    assert empty == {"sent": 0, "received": 0, "rtt_p50_ms": None, "rtt_p99_ms": None, "rtt_max_ms": None,
                     "covered": 0.0}
