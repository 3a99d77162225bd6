"""Outages of relayed links measured on the ROS topics: a camera and a Twist round trip between two
lab hosts whose link is relayed (derp) while something fails (headscale stops, one region's
derper is killed) and comes back. Shared by the DERP region system test and ``scripts/bench derp``.

:func:`run_outage` records at the subscriber (``probe record``: one event per camera frame, the
node's ~peers and ~path_changes) and runs ``probe control`` (Twist sent at 20 Hz through the echo
on the publisher) across the whole window, does ``before_s`` of baseline, the break, ``outage_s``
with it broken, the restore and ``after_s`` more. Every wait is bounded; the restore runs and the
recorder stops whatever happens. :class:`Outage` holds the frame times and computes what the
reports use: the camera rate in every second, the longest gap, and the seconds from an event
until the camera is back at a given rate. Times are CLOCK_MONOTONIC seconds (time.monotonic() in
every namespace of the machine).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError

Step = Tuple[str, Callable[[], None]]
"""(what it does, in words; the call that does it)."""

TWIST_RATE_HZ = 20.0


def per_second_rates(times: List[float], start: float, end: float) -> List[int]:
    """Frames in each whole second [start + i, start + i + 1) before ``end`` (a list of counts = Hz)."""
    n = max(0, int(math.floor(end - start)))
    counts = [0] * n
    for t in times:
        i = int(math.floor(t - start))
        if 0 <= i < n and start <= t:
            counts[i] += 1
    return counts


def longest_gap(times: List[float], start: float, end: float) -> float:
    """The longest interval (s) without a frame in [start, end], the window edges included."""
    inside = sorted(t for t in times if start <= t <= end)
    edges = [start] + inside + [end]
    return max(b - a for a, b in zip(edges, edges[1:])) if end > start else 0.0


def recovery_s(times: List[float], event: float, end: float, min_hz: float, hold_s: int = 2,
               stall_s: float = 1.0) -> Optional[float]:
    """Seconds from ``event`` until the camera is back: the start of the first run of ``hold_s``
    whole seconds, each with at least ``min_hz`` frames (a sliding 1-s window, 0.1 s steps),
    that begins after the longest gap in [event, end] when that gap is ``stall_s`` or longer (so
    frames still draining right after the event do not count as "never stopped"). None when it
    never happens before ``end``; 0.0 when the camera neither stalled nor dropped below
    ``min_hz``."""
    ts = sorted(t for t in times if t >= event)
    edges = [event] + [t for t in ts if t <= end] + [end]
    gap, gap_end = max(((b - a, b) for a, b in zip(edges, edges[1:])), default=(0.0, event))
    start = gap_end - 1.0 if gap >= stall_s else event  # the first window may hold the gap's last second
    step = 0.1
    k = max(0, int(math.ceil((start - event) / step)))
    while event + k * step + hold_s <= end:
        t0 = event + k * step
        ok = all(sum(1 for t in ts if t0 + j <= t < t0 + j + 1) >= min_hz for j in range(hold_s))
        if ok:
            return round(k * step, 1)
        k += 1
    return None


@dataclass
class Outage:
    """One outage on the topics (times: time.monotonic() s)."""

    name: str
    t_start: float          # recording window start (baseline begins)
    t_break: float          # the failure was made
    t_restore: float        # it was undone
    t_end: float            # the window ended
    frames: List[float]     # arrival times of camera frames in the window
    twist: Dict[str, Any] = field(default_factory=dict)   # probe control's result over the window
    changes: List[Dict[str, Any]] = field(default_factory=list)  # the subscriber node's ~path_changes
    peers: List[Dict[str, Any]] = field(default_factory=list)    # its ~peers path events

    def rates(self) -> List[int]:
        """Camera frames received in each second of the window (Hz), from t_start."""
        return per_second_rates(self.frames, self.t_start, self.t_end)

    def baseline_hz(self) -> float:
        """Mean camera rate (Hz) before the break."""
        span = self.t_break - self.t_start
        return round(len([t for t in self.frames if t < self.t_break]) / span, 1) if span > 0 else 0.0

    def summary(self, min_hz: float) -> Dict[str, Any]:
        """What the test and the benchmark report: baseline rate, rates per second, the longest
        gaps during the outage and after the restore, the seconds until the camera is back at
        ``min_hz`` after the break and after the restore, and the Twist round trip."""
        tw = self.twist
        return {
            "baseline_hz": self.baseline_hz(),
            "outage_s": round(self.t_restore - self.t_break, 1),
            "rates_hz": self.rates(),
            "break_at_s": round(self.t_break - self.t_start, 1),
            "restore_at_s": round(self.t_restore - self.t_start, 1),
            "gap_after_break_s": round(longest_gap(self.frames, self.t_break, self.t_restore), 2),
            "gap_after_restore_s": round(longest_gap(self.frames, self.t_restore, self.t_end), 2),
            "resume_after_break_s": recovery_s(self.frames, self.t_break, self.t_restore, min_hz),
            "resume_after_restore_s": recovery_s(self.frames, self.t_restore, self.t_end, min_hz),
            # the same against half the baseline rate (a busy machine's baseline may be below min_hz)
            "resume_half_baseline_after_break_s": recovery_s(self.frames, self.t_break, self.t_restore,
                                                             0.5 * self.baseline_hz()),
            "zero_seconds_after_break": sum(1 for r in per_second_rates(self.frames, self.t_break, self.t_restore)
                                            if r == 0),
            "min_hz_after_10s_of_break": min(per_second_rates(self.frames, self.t_break + 10, self.t_restore) or [0]),
            "twist": {k: tw.get(k) for k in ("sent", "received", "rtt_p50_ms", "rtt_p99_ms", "rtt_max_ms")},
            "path_changes": [f"{e['node']}: {e['peer']} {e['old']}->{e['new']}"
                             + (f" ({e['derp_region']})" if e.get("derp_region") else "")
                             + f" @{e['t'] - self.t_break:+.1f}s" for e in self.changes],
        }


def run_outage(lab: Lab, sub: str, pub: str, nodes: Sequence[str], image: str, name: str, break_step: Step,
               restore_step: Step, before_s: float, outage_s: float, after_s: float,
               first_frame_timeout: float = 60.0) -> Outage:
    """Record the camera ``image`` at ``sub`` (and the ~peers/~path_changes of the overlay nodes
    ``nodes``) and run a Twist round trip from ``sub`` through the echo on ``pub`` while
    ``break_step`` .. ``restore_step`` happens.

    Raises:
        LabTimeout: no first frame within ``first_frame_timeout`` s.
        LabError: the recorder died.
    """
    rec = robots.Recorder(lab, sub, image=image, nodes=list(nodes), name=f"record-{name}")
    broken = False
    twist: Dict[str, Any] = {}
    errors: List[str] = []
    window = before_s + outage_s + after_s

    def control() -> None:
        try:
            twist.update(robots.run_probe(lab, sub, ["control", "--rate", str(TWIST_RATE_HZ), "--seconds",
                                                     str(window), "--timeout", "30"], timeout=window + 60))
        except LabError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=control, name=f"twist-{name}", daemon=True)
    try:
        rec.wait("the first camera frame", lambda ev: ev["ev"] == "frame", timeout=first_frame_timeout)
        thread.start()
        time.sleep(2.5)  # the control probe connects and warms up (1 s) before it measures
        t_start = time.monotonic()
        time.sleep(before_s)
        t_break = time.monotonic()
        lab.echo(f"outage {name}: {break_step[0]}")
        broken = True
        break_step[1]()
        time.sleep(max(0.0, t_break + outage_s - time.monotonic()))
        t_restore = time.monotonic()
        lab.echo(f"outage {name}: {restore_step[0]}")
        restore_step[1]()
        broken = False
        time.sleep(max(0.0, t_restore + after_s - time.monotonic()))
        t_end = time.monotonic()
        thread.join(timeout=window + 90)
    finally:
        if broken:
            restore_step[1]()
        rec.stop()
    if errors:
        twist["error"] = errors[0]
    frames = [e["t"] for e in rec.events if e["ev"] == "frame" and t_start <= e["t"] < t_end]
    return Outage(name, t_start, t_break, t_restore, t_end, frames, twist,
                  changes=[e for e in rec.events if e["ev"] == "change" and t_start <= e["t"]],
                  peers=[e for e in rec.events if e["ev"] == "peers" and t_start <= e["t"]])


def home_region(lab: Lab, host: str) -> str:
    """The DERP region code ``host``'s tailscaled has as its home (Self.Relay; "" = none)."""
    return str(lab.tailscale_status(host).get("Self", {}).get("Relay") or "")
