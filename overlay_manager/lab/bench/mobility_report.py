"""What the mobility benchmark measures per event and how it summarises runs (pure; no ROS, no lab).

An event is one campus action (mobility.py's ActionLog record: ``t_mono``) under live traffic.
Per event, from the laptop's recorder (camera frames, the nodes' ~peers, the camera's connection
ids) and the Twist round trip (probe control: echo gaps, connection ids):

``camera_gap_s``   the longest interval between consecutive camera messages that ends after the
                   action (the interval the action falls into counts: the stream's stop).
``twist_gap_s``    the same for the echoes of the 50 Hz Twist round trip.
``overlay_gap_s``  the same for the replies of a 100 Hz ICMP echo laptop -> robot over the overlay
                   (``ping -D -i 0.01`` to the robot's overlay address): when the overlay itself
                   carried packets again, without TCP's retransmission schedule on top.
``peers_s``        seconds from the action until the node's ~peers shows the expected path (and
                   endpoint address, where one is expected); None = not within the window.
``same_connections`` True when the ROS connections (ids rospy gives each new connection) of the
                   camera subscriber and the Twist publisher/subscriber are the same before and
                   after: nothing was re-established.

Times are CLOCK_MONOTONIC seconds, the same clock in every namespace.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Sequence

from overlay_manager.core.stats import percentile

Event = Dict[str, Any]

_PING_REPLY = re.compile(r"^\[(\d+\.\d+)\] \d+ bytes from .*icmp_seq=(\d+)")


def ping_reply_times(lines: Sequence[str], wall_minus_mono: float) -> List[float]:
    """The CLOCK_MONOTONIC times (s) of the echo replies in ``ping -D`` output lines: ``-D``
    prints the wall-clock time of each reply; ``wall_minus_mono`` (s) is the wall clock minus the
    monotonic clock at one moment (an action record's ``t_wall - t_mono``). Other lines (no
    answer, statistics) are skipped."""
    out: List[float] = []
    for line in lines:
        m = _PING_REPLY.match(line.strip())
        if m:
            out.append(float(m.group(1)) - wall_minus_mono)
    return out


def longest_gap_after(times: Sequence[float], t_action: float, t_end: float) -> Optional[float]:
    """The longest interval between consecutive ``times`` (sorted arrivals) that ends after
    ``t_action``, with ``t_end`` as a last edge (a stream still stopped at the end counts up to
    it). None without any arrival before ``t_action`` (nothing to measure a gap from)."""
    before = [t for t in times if t <= t_action]
    if not before:
        return None
    edges = [before[-1]] + [t for t in times if t_action < t <= t_end] + [t_end]
    return round(max(b - a for a, b in zip(edges, edges[1:])), 3)


def gap_from_list(gaps: Sequence[Sequence[float]], t_action: float, t_end: float) -> float:
    """The longest of the control probe's ``echo_gaps`` ([start, length]) that ends after
    ``t_action`` and starts before ``t_end``; 0.0 when none (every echo within 0.1 s)."""
    hit = [g for a, g in gaps if a + g > t_action and a < t_end]
    return round(max(hit), 3) if hit else 0.0


def gap_end_after(gaps: Sequence[Sequence[float]], t_action: float, t_end: float) -> Optional[float]:
    """Seconds from ``t_action`` until the end of the longest of ``echo_gaps`` that ends after it
    (when the round trip came back); 0.0 when there was no gap, None when the longest gap ran
    to ``t_end`` or past it (not back within the window)."""
    hit = [(g, a + g) for a, g in gaps if a + g > t_action and a < t_end]
    if not hit:
        return 0.0
    g, end = max(hit)
    return None if end >= t_end else round(end - t_action, 2)


def back_after(times: Sequence[float], t_action: float, t_end: float, stall_s: float = 1.0) -> Optional[float]:
    """Seconds from ``t_action`` to the first message after the stream's longest stop in
    [t_action, t_end] (0.0 if it never stopped for ``stall_s``); None when it was still stopped at
    ``t_end``."""
    edges = [t_action] + [t for t in times if t_action < t <= t_end] + [t_end]
    gap, end = max(((b - a, b) for a, b in zip(edges, edges[1:])), default=(0.0, t_action))
    if gap < stall_s:
        return 0.0
    return None if end >= t_end else round(end - t_action, 2)


def first_after(events: Sequence[Event], since: float, pred: Callable[[Event], bool]) -> Optional[Event]:
    """The first event at or after ``since`` that satisfies ``pred``."""
    for ev in events:
        if ev["t"] >= since and pred(ev):
            return ev
    return None


def peer_is(node: str, peer: str, path: str, endpoint_host: str = "") -> Callable[[Event], bool]:
    """Recorder predicate: ``node``'s ~peers lists ``peer`` on ``path`` (and, when given, with an
    endpoint on ``endpoint_host``: its ``host:port`` for direct paths)."""
    def pred(ev: Event) -> bool:
        if ev.get("ev") != "peers" or ev.get("node") != node:
            return False
        entry = ev["paths"].get(peer)
        if not entry or entry[0] != path:
            return False
        return not endpoint_host or str(entry[2] or "").split(":")[0] == endpoint_host
    return pred


def connections_before_after(events: Sequence[Event], t_action: float, t_end: float) -> Optional[bool]:
    """From the recorder's ``conns`` events: the camera's connection ids at ``t_end`` equal those
    before ``t_action`` (None: no ids known before the action)."""
    before = [e for e in events if e.get("ev") == "conns" and e["t"] <= t_action]
    if not before:
        return None
    after = [e for e in events if e.get("ev") == "conns" and e["t"] <= t_end]
    return after[-1]["connections"] == before[-1]["connections"]


def summarise(runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Runs of one scenario -> count, p50/p95/max of each gap and ``peers_s`` (None values are
    counted as ``missing``), runs with the same connections, errors."""
    out: Dict[str, Any] = {"runs": len(runs), "errors": [r["error"] for r in runs if r.get("error")]}
    for key in ("twist_gap_s", "camera_gap_s", "overlay_gap_s", "peers_s", "robot_peers_s", "camera_back_s",
                "twist_back_s"):
        vals = [r[key] for r in runs if r.get(key) is not None]
        out[key] = {"p50": _r(percentile(vals, 50)), "p95": _r(percentile(vals, 95)),
                    "max": _r(max(vals)) if vals else None, "missing": len(runs) - len(vals)}
    same = [r.get("same_connections") for r in runs]
    out["same_connections"] = f"{sum(1 for s in same if s)}/{len(runs)}"
    return out


def _r(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 2)


def markdown(summary: Dict[str, Dict[str, Any]]) -> str:
    """The summary table (one row per scenario)."""
    def cell(s: Dict[str, Any], key: str) -> str:
        d = s.get(key) or {}
        if d.get("p50") is None:
            return "-" + (f" ({d.get('missing')} missing)" if d.get("missing") else "")
        txt = f"{d['p50']} / {d['p95']} / {d['max']}"
        return txt + (f" ({d['missing']} missing)" if d.get("missing") else "")

    lines = ["| scenario | runs | Twist gap s p50 / p95 / max | camera gap s p50 / p95 / max "
             "| overlay (ICMP) gap s p50 / p95 / max "
             "| laptop ~peers right s p50 / p95 / max | robot ~peers right s | same ROS connections | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['runs']} | {cell(s, 'twist_gap_s')} | {cell(s, 'camera_gap_s')} | "
                     f"{cell(s, 'overlay_gap_s')} | "
                     f"{cell(s, 'peers_s')} | {cell(s, 'robot_peers_s')} | {s['same_connections']} | "
                     f"{len(s['errors'])} |")
    return "\n".join(lines)

