"""The statistics every measurement in the project reports: percentiles, rates, latencies.

One definition, used by the benchmarks (lab/bench/, lab/bench/node/), the demo, the ROS
probes and the system tests, so a "p99" means the same number everywhere:

* **Percentile** ``percentile(values, q)``: ``q`` in 0..100; the values are sorted and the
  percentile is read at rank ``(n - 1) * q / 100`` (0-based), interpolating linearly between the
  two neighbouring values. This is numpy's default ("linear", Hyndman and Fan type 7): p0 is the
  minimum, p100 the maximum, p50 the median. With fewer than 100 samples a p99 lies between the
  two largest values. ``None`` for no values.
* **Rate** ``rate_stats(times, seconds)``: ``rate_hz`` = arrivals in the window / window length;
  ``span_rate_hz`` = (n - 1) / (last - first arrival), which does not depend on where the window
  edges fall; ``max_gap_s`` = the longest time between two consecutive arrivals.
* **Latency** ``latency_stats(ms)``: p50, p99 and max of latencies in milliseconds.
* **Round trips in a window** ``window_stats(samples, t0, t1)``: the latency statistics of the
  messages sent between t0 and t1 out of [send time, round trip ms or None] samples, with how
  many were sent and answered and the share of the window the samples span.
* **Summary** ``summary(values)``: n, mean, min, median, max.

Pure Python (no numpy): the probes run inside lab hosts with only the ROS Python.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Optional, Sequence


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-th percentile (``q`` in 0..100) by linear interpolation (see the module doc);
    None when ``values`` is empty. ValueError for ``q`` outside 0..100."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q={q!r} is outside 0..100")
    xs = sorted(values)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100.0
    lo, hi = int(math.floor(k)), int(math.ceil(k))
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def rate_stats(times: Sequence[float], seconds: float) -> Dict[str, Any]:
    """Arrival times (seconds, ascending) in a window of ``seconds`` -> ``count``, ``seconds``,
    ``rate_hz`` (count / seconds), ``span_rate_hz`` ((count - 1) / (last - first)) and
    ``max_gap_s``; None where undefined (no window, fewer than two arrivals)."""
    gaps = [b - a for a, b in zip(times, times[1:])]
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {"count": len(times), "seconds": seconds, "rate_hz": len(times) / seconds if seconds else None,
            "span_rate_hz": (len(times) - 1) / span if span > 0 else None,
            "max_gap_s": max(gaps) if gaps else None}


def latency_stats(lat_ms: Sequence[float], name: str = "latency") -> Dict[str, Optional[float]]:
    """Latencies in milliseconds -> ``<name>_p50_ms``, ``<name>_p99_ms``, ``<name>_max_ms``
    (None when there are none)."""
    return {f"{name}_p50_ms": percentile(lat_ms, 50), f"{name}_p99_ms": percentile(lat_ms, 99),
            f"{name}_max_ms": max(lat_ms) if lat_ms else None}


def window_stats(samples: Sequence[Sequence[Any]], t0: float, t1: float) -> Dict[str, Any]:
    """The round trips of the messages sent between t0 and t1 (s, the samples' clock) out of
    ``samples`` = [send time s, round trip ms or None when no answer came], e.g. a Twist round
    trip taken over the window in which a viewer measured its streams: ``sent``, ``received``,
    ``rtt_p50_ms``/``rtt_p99_ms``/``rtt_max_ms`` and ``covered``, the share of [t0, t1] the
    samples inside span (below 1 when the samples start after t0 or end before t1)."""
    inside = [(t, rtt) for t, rtt in samples if t0 <= t <= t1]
    rtts = [rtt for _t, rtt in inside if rtt is not None]
    covered = 0.0
    if len(inside) > 1 and t1 > t0:
        covered = round(min(1.0, (inside[-1][0] - inside[0][0]) / (t1 - t0)), 3)
    return {"sent": len(inside), "received": len(rtts), **latency_stats(rtts, "rtt"), "covered": covered}


def summary(values: Sequence[float]) -> Dict[str, float]:
    """``n``, ``mean``, ``min``, ``median``, ``max`` of ``values``; only ``{"n": 0}`` when empty."""
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": statistics.mean(values), "min": min(values), "max": max(values),
            "median": statistics.median(values)}
