"""Value types of the overlay monitor: what tailscaled last said, how fresh it is, and the
results of the monitor's checks and service calls. Plain frozen dataclasses, no ROS, no I/O.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Optional, Tuple

from overlay_manager.core.levels import ERROR, OK, WARN, Level
from overlay_manager.core.peers import PATH_UNKNOWN, PeerState, Snapshot
from overlay_manager.system import iperf
from overlay_manager.system.firewall import Restriction
from overlay_manager.system.sockets import Listener

OVERLAY_V4 = ipaddress.ip_network("100.64.0.0/10")
OVERLAY_V6 = ipaddress.ip_network("fd7a:115c:a1e0::/48")

__all__ = ["ERROR", "OK", "WARN", "Level"]  # the levels' home is core.levels; re-exported for the monitor's users

STATUS_TIMEOUT_S = 1.5
"""Seconds one status read may take. tailscaled answers /status in milliseconds; a hung daemon
must not hold the poll thread longer than this, so polling resumes soon after it answers again."""
HANG_REPORT_S = 0.75
"""A status read still unanswered after this many seconds is reported as tailscaled not
answering, before the read's own timeout expires."""


def is_overlay_address(addr: str) -> bool:
    """True for Tailscale's CGNAT v4 range and ULA v6 range."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return ip in OVERLAY_V4 if ip.version == 4 else ip in OVERLAY_V6


@dataclass(frozen=True)
class PingOutcome:
    """Result of ping_peer. Latencies in ms (NaN when none answered)."""

    ok: bool
    latency_min_ms: float = math.nan
    latency_mean_ms: float = math.nan
    latency_max_ms: float = math.nan
    received: int = 0
    path: str = PATH_UNKNOWN
    endpoint: str = ""
    message: str = ""


@dataclass(frozen=True)
class WaitResult:
    """Result of wait_for_peer. waited_s: seconds spent; peer: the last state seen (None = unknown)."""

    ok: bool
    peer: Optional[PeerState]
    waited_s: float
    message: str = ""


@dataclass(frozen=True)
class LinkMeasurement:
    """Result of measure_link: the measured values, the path at the end of the run, and why it
    failed ("" = ok)."""

    ok: bool
    result: iperf.LinkResult
    path: str
    message: str = ""


@dataclass(frozen=True)
class Reading:
    """What tailscaled last said, swapped whole by OverlayMonitor.poll.

    snapshot: what to present: the last status read; while tailscaled fails, its peers with path
        offline/unknown (see peers.blind); None until tailscaled first answered.
    error: why the last read failed ("" = it succeeded).
    daemon_gone: the last failure says tailscaled is not running (no socket, refused).
    ok_at: monotonic seconds of the last useful answer; NaN = never.
    ok_wall: POSIX seconds of the same moment; 0 = never.
    """

    snapshot: Optional[Snapshot] = None
    error: str = ""
    daemon_gone: bool = False
    ok_at: float = math.nan
    ok_wall: float = 0.0

    def freshness(self, now: float, started: Optional[float], stale_after_s: float,
                  socket_path: str) -> "Freshness":
        """Is this reading current at now (monotonic s)? started: when the read in progress
        began (None: none is running); stale_after_s: age at which an answer is too old;
        socket_path: tailscaled's socket, named in the error."""
        age = now - self.ok_at if not math.isnan(self.ok_at) else math.nan
        error = self.error
        if not error and started is not None and now - started > HANG_REPORT_S:
            error = (f"tailscaled at {socket_path} has not answered GET /localapi/v0/status "
                     f"for more than {HANG_REPORT_S:.1f} s")
        if not error and not math.isnan(age) and age > stale_after_s:
            error = f"tailscaled status not read for more than {stale_after_s:.1f} s"
        if not error and math.isnan(age):
            error = "tailscaled not read yet"
        return Freshness(bool(error), age, error)

    def freshness_changes_at(self, now: float, started: Optional[float], stale_after_s: float) -> float:
        """The monotonic time at which freshness(...) may change with no new read finishing: the
        read in progress turns into "not answering", or this answer grows older than
        stale_after_s. inf when neither can happen (already failing or never read)."""
        times = [math.inf]
        if not self.error and started is not None and now - started <= HANG_REPORT_S:
            times.append(started + HANG_REPORT_S)
        if not self.error and not math.isnan(self.ok_at) and now - self.ok_at <= stale_after_s:
            times.append(self.ok_at + stale_after_s)
        return min(times)


@dataclass(frozen=True)
class Freshness:
    """How current the presented status is at one moment.

    stale: not from a current read (an error, a hanging read, or no read for stale_after_s).
    age_s: seconds since tailscaled last answered usefully; NaN = never.
    error: why tailscaled cannot be read right now ("" = it answers); worded to stay the same
        while the condition lasts (no running counts), so change detection stays quiet.
    """

    stale: bool
    age_s: float
    error: str


@dataclass(frozen=True)
class Check:
    """One preflight check."""

    name: str
    ok: bool
    message: str
    hint: str = ""


@dataclass(frozen=True)
class Diagnostic:
    """One /diagnostics entry, ROS-free (level: core.levels.Level)."""

    level: Level
    name: str
    message: str
    values: Tuple[Tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PortReading:
    """Who can reach a local TCP port (rosbridge's websocket), as last read by the node.

    port: the port (node.rosbridge_port); listeners: the listening sockets on it;
    error: why /proc/net/tcp could not be read ("" = it was); restriction: what nftables says
    about the port, None when it was not asked (nothing listens beyond loopback).
    """

    port: int
    listeners: Tuple[Listener, ...] = ()
    error: str = ""
    restriction: Optional[Restriction] = None
