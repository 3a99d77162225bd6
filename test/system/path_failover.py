"""A link's path failover while a camera streams, as the campus and relay system tests run it.

:func:`run_failover` records at one lab host (camera frames and its overlay node's ~peers and
~path_changes), waits for the first frame and for the peer's link on its normal path, breaks the
link (``break_link``), waits for the node to report derp and for a frame received over DERP,
restores the link and waits for the normal path again, keeping the stream going ``settle_s``
seconds at each phase. Every wait is bounded and names what it waits for; the link is restored
and the recorder stopped whatever happens. The :class:`FailoverRun` it returns has the phase
times and what was received, for each test to measure and assert on.

A plain module next to the tests: pytest puts this directory on ``sys.path`` (it has no
``__init__.py``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.core.stats import percentile
from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus.core import Lab

Event = Dict[str, Any]
Step = Tuple[str, Callable[[], None]]
"""(what it does, in words for wait messages; the call that does it)."""


def node(host: str) -> str:
    """The overlay node's name on ``host`` (robot.launch's namespace: ros_names.overlay_node)."""
    return overlay_node(host)


def peer_path(host: str, peer: str, path: str) -> Callable[[Event], bool]:
    """Recorder predicate: ``host``'s node lists ``peer`` on ``path`` in its ~peers."""
    return lambda ev: ev["ev"] == "peers" and ev["node"] == node(host) and ev["paths"].get(peer, [None])[0] == path


def is_frame(ev: Event) -> bool:
    """Recorder predicate: a camera frame arrived."""
    return ev["ev"] == "frame"


def frame_rate_hz(frames: List[Event], start: float, end: float) -> float:
    """Frames per second that arrived in [start, end), to 0.1 Hz (0.0 for an empty interval)."""
    n = len([f for f in frames if start <= f["t"] < end])
    return round(n / (end - start), 1) if end > start else 0.0


def longest_gap_s(frames: List[Event]) -> Optional[float]:
    """The largest interval (s, rounded to ms) between consecutive frames (None: under 2 frames)."""
    times = [f["t"] for f in frames]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return round(max(gaps), 3) if gaps else None


@dataclass
class FailoverRun:
    """One failover; times are time.monotonic() seconds (the recorder's clock)."""

    t_break: float      # the link was broken
    t_derp: float       # the node first reported derp after that
    t_restore: float    # the link was restored
    t_back: float       # the node first reported the normal path again after that
    t_end: float        # the recording ended
    frames: List[Event]   # frames received from settle_s before the break to t_end
    changes: List[Event]  # the node's ~path_changes events about the peer, whole recording

    @property
    def times(self) -> List[float]:
        """Arrival times of :attr:`frames`."""
        return [f["t"] for f in self.frames]

    def longest_gap_s(self) -> Optional[float]:
        """:func:`longest_gap_s` of :attr:`frames`."""
        return longest_gap_s(self.frames)

    def count(self, start: float, end: float) -> int:
        """Frames that arrived in [start, end)."""
        return len([f for f in self.frames if start <= f["t"] < end])

    def rate_hz(self, start: float, end: float) -> float:
        """:func:`frame_rate_hz` of :attr:`frames`."""
        return frame_rate_hz(self.frames, start, end)

    def derp_latency_p50_ms(self) -> Optional[float]:
        """Median latency (ms) of the frames that arrived while the node reported derp."""
        lat = [f["lat_ms"] for f in self.frames if self.t_derp <= f["t"] < self.t_restore and f["lat_ms"] is not None]
        return percentile(lat, 50)

    def path_changes(self) -> List[str]:
        """``old->new @+Ns`` for each change, N relative to the break."""
        return [f"{e['old']}->{e['new']} @{e['t'] - self.t_break:+.1f}s" for e in self.changes]

    def changes_to(self, path: str, since: float) -> List[Event]:
        """The changes to ``path`` at or after ``since``, in order."""
        return [e for e in self.changes if e["new"] == path and e["t"] >= since]

    def measured(self, back_key: str) -> Dict[str, Any]:
        """What every failover test reports: seconds to derp after the break (``to_derp_s``) and back
        after the restore (``back_key``), the longest frame gap, the median latency over DERP and
        the path changes."""
        return {"to_derp_s": round(self.t_derp - self.t_break, 2), back_key: round(self.t_back - self.t_restore, 2),
                "longest_gap_s": self.longest_gap_s(), "latency_derp_p50_ms": self.derp_latency_p50_ms(),
                "path_changes": self.path_changes()}

    def assert_switched_and_back(self, path: str, m: Dict[str, Any]) -> None:
        """Frames still arrived after the link was back, and the node's ~path_changes has the change
        ``path`` -> derp after the break and derp -> ``path`` after the restore (``m`` is printed
        on failure)."""
        assert self.times and self.times[-1] > self.t_back, m
        to_derp, back = self.changes_to("derp", self.t_break), self.changes_to(path, self.t_restore)
        assert to_derp and to_derp[0]["old"] == path, m["path_changes"]
        assert back and back[0]["old"] == "derp", m["path_changes"]


def run_failover(lab: Lab, host: str, peer: str, path: str, image: str, name: str,
                 break_link: Step, restore_link: Step, path_timeout: float, derp_timeout: float,
                 derp_frame_timeout: float, back_timeout: float, settle_s: float) -> FailoverRun:
    """Break and restore the link from ``host`` to ``peer`` while ``image`` streams to ``host``.

    Args:
        lab, host: where the recorder runs (``probe record``, logs named ``name``).
        peer: the other end, whose path ``host``'s node reports.
        path: the link's normal path (``direct``, ``peer-relay``), before and after.
        image: the image topic recorded.
        break_link, restore_link: (words, call) that break and restore the link.
        path_timeout: seconds to wait for ``path`` before breaking.
        derp_timeout: seconds after the break to wait for derp.
        derp_frame_timeout: seconds after derp to wait for a frame.
        back_timeout: seconds after the restore to wait for ``path``.
        settle_s: seconds the stream runs before the break and in each later phase.

    Raises:
        LabTimeout: a wait ran out (the message says which and what was seen).
    """
    rec = robots.Recorder(lab, host, image=image, nodes=[node(host)], name=name)
    broken = False
    where = f"{node(host)} ~peers: {peer}"
    try:
        rec.wait("the first camera frame", is_frame, timeout=60)
        rec.wait(f"{where} {path}", peer_path(host, peer, path), timeout=path_timeout)
        time.sleep(settle_s)
        t_break = time.monotonic()
        break_link[1]()
        broken = True
        t_derp = rec.wait(f"{where} derp after {break_link[0]}", peer_path(host, peer, "derp"),
                          timeout=derp_timeout, since=t_break)["t"]
        # the stream's backlog drains through DERP first: wait (bounded) for a frame that
        # arrived on the relayed path, then keep the DERP phase going a little longer
        rec.wait("a camera frame received over DERP", is_frame, timeout=derp_frame_timeout, since=t_derp)
        time.sleep(settle_s)
        t_restore = time.monotonic()
        restore_link[1]()
        broken = False
        t_back = rec.wait(f"{where} {path} after {restore_link[0]}", peer_path(host, peer, path),
                          timeout=back_timeout, since=t_restore)["t"]
        time.sleep(settle_s)
        t_end = time.monotonic()
    finally:
        if broken:
            restore_link[1]()
        rec.stop()
    return FailoverRun(t_break, t_derp, t_restore, t_back, t_end, frames=rec.frames(t_break - settle_s, t_end),
                       changes=[e for e in rec.events if e["ev"] == "change" and e["peer"] == peer])
