"""Display formatting for the front ends: the dashboard, or a web page (pure: no Qt, no ROS; unit-tested).

Words as everywhere in the package: path is one of direct | derp | peer-relay | idle | offline
(plus unknown and self). Rates are shown in bit/s, the unit iperf3 and operators use for links.
Functions that format a ROS message or service response read its fields by name, so tests can
pass any object with those attributes (e.g. ``types.SimpleNamespace``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from overlay_manager.core.levels import Level
from overlay_manager.core.peers import (
    PATH_DERP,
    PATH_DIRECT,
    PATH_IDLE,
    PATH_OFFLINE,
    PATH_PEER_RELAY,
    PATH_SELF,
    PATH_UNKNOWN,
)

# Strong colour per path: path cell background, history plot, path-change log text.
PATH_COLOURS = {
    PATH_DIRECT: "#2e7d32",      # green: full-speed WireGuard over UDP
    PATH_PEER_RELAY: "#1565c0",  # blue: relayed by a tailscale peer relay (UDP, usually fast)
    PATH_DERP: "#e65100",        # orange: relayed over HTTPS through DERP, far less throughput
    PATH_IDLE: "#757575",        # grey: online, no recent traffic, no path known yet
    PATH_OFFLINE: "#c62828",     # red: control server says offline
    PATH_UNKNOWN: "#9e9e9e",     # light grey: tailscaled did not say
    PATH_SELF: "#6a1b9a",        # purple: this machine
}
# Light tint per path: background of the rest of the row.
PATH_TINTS = {
    PATH_DIRECT: "#e8f5e9",
    PATH_PEER_RELAY: "#e3f2fd",
    PATH_DERP: "#fff3e0",
    PATH_IDLE: "#f5f5f5",
    PATH_OFFLINE: "#ffebee",
    PATH_UNKNOWN: "#fafafa",
    PATH_SELF: "#f3e5f5",
}
PATH_DESCRIPTIONS = {
    PATH_DIRECT: "direct WireGuard over UDP",
    PATH_PEER_RELAY: ("relayed through a fleet peer relay: one UDP hop through a relay machine, "
                      "near-direct throughput"),
    PATH_DERP: "relayed through a DERP server over HTTPS (much less throughput)",
    PATH_IDLE: "online, no recent traffic: no path known yet",
    PATH_OFFLINE: "the control server reports the peer offline",
    PATH_UNKNOWN: "tailscaled did not report a path",
    PATH_SELF: "this machine",
}

# Severity of status texts: the package's one level type (core.levels, diagnostic_msgs' values);
# "unknown" (not known yet, no current data) is STALE. With the colour the widget uses for each.
LEVEL_OK = Level.OK
LEVEL_WARN = Level.WARN
LEVEL_ERROR = Level.ERROR
LEVEL_UNKNOWN = Level.STALE
LEVEL_COLOURS = {
    LEVEL_OK: "#2e7d32",
    LEVEL_WARN: "#e65100",
    LEVEL_ERROR: "#c62828",
    LEVEL_UNKNOWN: "#757575",
}

NO_VALUE = "-"  # shown for an unknown number


@dataclass(frozen=True)
class Verdict:
    """A plain-words text with a severity level (one of the LEVEL_* constants: a core.levels.Level)."""

    text: str
    level: Level


def path_colour(path: str) -> str:
    """Strong ``#rrggbb`` colour for a path; unknown paths get the PATH_UNKNOWN colour."""
    return PATH_COLOURS.get(path, PATH_COLOURS[PATH_UNKNOWN])


def path_tint(path: str) -> str:
    """Light ``#rrggbb`` row tint for a path."""
    return PATH_TINTS.get(path, PATH_TINTS[PATH_UNKNOWN])


def path_description(path: str) -> str:
    """One sentence saying what a path means (for tooltips)."""
    return PATH_DESCRIPTIONS.get(path, f"unrecognised path {path!r}")


def path_where(path: str, endpoint: str, relay_region: str, relay_host: str = "", derp_region: str = "") -> str:
    """The "endpoint or relay region" column: where traffic to the peer goes now.

    direct: the UDP endpoint; peer-relay: "relay <host> <ip:port>" (the relay machine's short
    name when known, and its endpoint); derp: "DERP <region code> (<region name>)" (the name when
    the node reports one that differs from the code, e.g. "DERP east (East campus)"); otherwise
    the home region in brackets when known (it is not in use), else empty.
    """
    if path == PATH_PEER_RELAY and relay_host:
        return f"relay {relay_host} {endpoint}" if endpoint else f"relay {relay_host}"
    if path in (PATH_DIRECT, PATH_PEER_RELAY):
        return endpoint or NO_VALUE
    if path == PATH_DERP:
        name = f" ({derp_region})" if derp_region and derp_region != relay_region else ""
        return f"DERP {relay_region}{name}" if relay_region else (f"DERP {derp_region}" if derp_region else "DERP")
    return f"(home DERP {relay_region})" if relay_region else ""


def peer_where(peer: Any) -> str:
    """:func:`path_where` of a Peer message (peer-relay: its relay host and relay endpoint)."""
    relay_ep = getattr(peer, "peer_relay", "") or peer.endpoint
    if peer.path == PATH_PEER_RELAY:
        return path_where(peer.path, relay_ep, peer.relay_region, getattr(peer, "relay_host", ""))
    return path_where(peer.path, peer.endpoint, peer.relay_region, derp_region=getattr(peer, "derp_region", ""))


def is_nan(value: Optional[float]) -> bool:
    """True for None and NaN (the messages' "unknown")."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def format_latency(ms: Optional[float]) -> str:
    """Milliseconds -> "0.85 ms" / "12.3 ms" / "250 ms"; NaN/None -> "-"."""
    if is_nan(ms):
        return NO_VALUE
    assert ms is not None
    if ms < 10:
        return f"{ms:.2f} ms"
    if ms < 100:
        return f"{ms:.1f} ms"
    return f"{ms:.0f} ms"


def format_bitrate(bits_per_s: Optional[float]) -> str:
    """bit/s -> "950 bit/s", "12.3 kbit/s", "1.70 Gbit/s"; None/NaN -> "-"."""
    if is_nan(bits_per_s):
        return NO_VALUE
    assert bits_per_s is not None
    value = max(0.0, float(bits_per_s))
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if value >= scale:
            scaled = value / scale
            return f"{scaled:.2f} {unit}" if scaled < 10 else f"{scaled:.1f} {unit}"
    return f"{value:.0f} bit/s"


def format_rate(bytes_per_s: Optional[float]) -> str:
    """Byte rate (from tailscaled's byte counters) shown in bit/s; None/NaN -> "-"."""
    if is_nan(bytes_per_s):
        return NO_VALUE
    assert bytes_per_s is not None
    return format_bitrate(bytes_per_s * 8.0)


def format_mbps(mbps: Optional[float]) -> str:
    """Mbit/s (iperf3 results) -> the same units as format_bitrate."""
    if is_nan(mbps):
        return NO_VALUE
    assert mbps is not None
    return format_bitrate(mbps * 1e6)


def rate_from_counters(prev_bytes: int, prev_time: float, curr_bytes: int,
                       curr_time: float) -> Optional[float]:
    """Bytes per second between two byte-counter samples.

    None when the interval is not positive or the counter went backwards (tailscaled restarted
    and its counters began again at zero): no rate can be told from that pair.
    """
    dt = curr_time - prev_time
    if dt <= 0 or curr_bytes < prev_bytes:
        return None
    return (curr_bytes - prev_bytes) / dt


def format_age(stamp: float, now: Optional[float] = None) -> str:
    """POSIX time -> "never" (0), "just now", "42 s ago", "3 min ago", "2 h 5 min ago", "3 d ago"."""
    if stamp <= 0:
        return "never"
    if now is None:
        now = time.time()
    age = now - stamp
    if age < 1:
        return "just now"  # also a clock a little ahead of ours
    if age < 60:
        return f"{int(age)} s ago"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    if age < 86400:
        hours, minutes = int(age // 3600), int(age % 3600 // 60)
        return f"{hours} h {minutes} min ago" if minutes else f"{hours} h ago"
    return f"{int(age // 86400)} d ago"


def format_clock(stamp: float) -> str:
    """POSIX time -> local "HH:MM:SS" (path-change log); 0 -> "--:--:--"."""
    if stamp <= 0:
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(stamp))


def nat_summary(known: bool, udp: bool, hard_nat: bool, hard_nat_known: bool,
                preferred_derp: str = "", preferred_derp_latency_ms: float = math.nan) -> Verdict:
    """What this machine's NAT means for its links, in plain words (NatSummary fields)."""
    if not known:
        return Verdict("NAT not checked yet (tailscaled has not reported a network check)",
                       LEVEL_UNKNOWN)
    if not udp:
        text, level = "UDP blocked: every link will be relayed through DERP", LEVEL_ERROR
    elif hard_nat_known and hard_nat:
        text = ("hard NAT (mapping varies by destination): links to peers behind "
                "port-restricted or hard NATs will be relayed")
        level = LEVEL_WARN
    elif hard_nat_known:
        text, level = "easy NAT (endpoint-independent mapping): direct links are possible", LEVEL_OK
    else:
        text, level = "UDP works; NAT mapping behaviour unknown", LEVEL_UNKNOWN
    if preferred_derp:
        lat = "" if is_nan(preferred_derp_latency_ms) else f" ({format_latency(preferred_derp_latency_ms)})"
        text += f"; home DERP {preferred_derp}{lat}"
    return Verdict(text, level)


def nat_verdict(nat: Any) -> Verdict:
    """nat_summary from a NatSummary message; a failed check says so (the node's summary)."""
    summary = str(getattr(nat, "summary", "") or "")
    if not nat.known and summary.startswith("NAT check failed"):
        line = " ".join(summary.split())  # one line; the label's tooltip has the whole summary
        return Verdict(line if len(line) <= 110 else line[:107] + "...", LEVEL_WARN)
    return nat_summary(nat.known, nat.udp, nat.hard_nat, nat.hard_nat_known,
                       nat.preferred_derp, nat.preferred_derp_latency_ms)


def overlay_verdict(status: Any) -> Verdict:
    """One line for this machine's overlay state from an OverlayStatus message."""
    if not status.tailscaled_reachable:
        return Verdict("tailscaled not reachable: is the daemon running?", LEVEL_ERROR)
    if not status.enrolled:
        state = status.backend_state or "unknown state"
        return Verdict(f"not enrolled ({state})", LEVEL_ERROR)
    if not status.control_reachable:
        return Verdict("enrolled; control server not reachable (existing links keep working)",
                       LEVEL_WARN)
    if status.health:
        return Verdict(f"enrolled; {len(status.health)} health warning(s)", LEVEL_WARN)
    return Verdict("enrolled; control server reachable", LEVEL_OK)


def peer_counts(peers: Any) -> str:
    """"3 peers: 1 direct, 1 derp, 1 offline" from a list of Peer messages."""
    counts: dict = {}
    for p in peers:
        counts[p.path] = counts.get(p.path, 0) + 1
    order = [PATH_DIRECT, PATH_PEER_RELAY, PATH_DERP, PATH_IDLE, PATH_OFFLINE, PATH_UNKNOWN]
    order += sorted(k for k in counts if k not in order)
    parts = [f"{counts[k]} {k}" for k in order if counts.get(k)]
    noun = "peer" if len(peers) == 1 else "peers"
    return f"{len(peers)} {noun}" + (": " + ", ".join(parts) if parts else "")


def _via(path: str, endpoint: str) -> str:
    """"path direct via 10.0.0.2:41641" or "path derp via fra"."""
    if not path:
        return ""
    return f"path {path} via {endpoint}" if endpoint else f"path {path}"


def ping_text(peer: str, resp: Any) -> Verdict:
    """PingPeer response -> result line."""
    if not resp.ok:
        return Verdict(f"ping {peer}: failed: {resp.message or 'no answer'}", LEVEL_ERROR)
    text = (f"ping {peer}: {resp.received} answered, {format_latency(resp.latency_mean_ms)} mean "
            f"(min {format_latency(resp.latency_min_ms)}, max {format_latency(resp.latency_max_ms)})")
    via = _via(resp.path, resp.endpoint)
    return Verdict(text + (f", {via}" if via else ""),
                   LEVEL_WARN if resp.path == PATH_DERP else LEVEL_OK)


def measure_text(peer: str, resp: Any) -> Verdict:
    """MeasureLink response -> result line (iperf3 TCP throughput, UDP jitter/loss, RTT)."""
    if not resp.ok:
        return Verdict(f"measure {peer}: failed: {resp.message or 'no result'}", LEVEL_ERROR)
    text = (f"measure {peer}: TCP {format_mbps(resp.tcp_throughput_mbps)}; "
            f"UDP jitter {format_latency(resp.udp_jitter_ms)}, loss "
            f"{NO_VALUE if is_nan(resp.udp_loss_percent) else f'{resp.udp_loss_percent:.1f} %'}; "
            f"RTT {format_latency(resp.rtt_mean_ms)} (min {format_latency(resp.rtt_min_ms)}, "
            f"max {format_latency(resp.rtt_max_ms)})")
    if resp.path:
        text += f"; path {resp.path}"
    return Verdict(text, LEVEL_WARN if resp.path == PATH_DERP else LEVEL_OK)


def wait_text(peer: str, resp: Any, require_direct: bool = True) -> Verdict:
    """WaitForPeer response -> result line."""
    goal = "direct" if require_direct else "reachable"
    if not resp.ok:
        why = resp.message or "timed out"
        now = f" (path now {resp.peer.path})" if resp.peer.path else ""
        return Verdict(f"wait for {peer} {goal}: not {goal} after {resp.waited:.1f} s: {why}{now}",
                       LEVEL_ERROR)
    where = peer_where(resp.peer)
    return Verdict(f"wait for {peer} {goal}: {resp.peer.path} after {resp.waited:.1f} s"
                   + (f" ({where})" if where else ""), LEVEL_OK)


def path_change_text(change: Any) -> str:
    """PathChange message -> one log line, e.g. "12:01:03  robot2  derp -> direct  10.0.0.2:41641", with
    the cause when the node knew it: "12:01:09  robot2  direct -> derp  (via lab)  [stall, traffic
    stopped 0.71 s]"."""
    old = change.old_path or "new"
    where = path_where(change.new_path, change.endpoint, change.relay_region,
                       derp_region=getattr(change, "derp_region", ""))
    line = f"{format_clock(change.header.stamp.to_sec())}  {change.peer}  {old} -> {change.new_path}"
    line += f"  {where}" if where else ""
    cause = getattr(change, "cause", "")  # absent in messages recorded before the field existed
    if cause:
        stopped = getattr(change, "traffic_stopped", None)
        resumed = getattr(change, "traffic_resumed", None)
        t0 = stopped.to_sec() if stopped is not None else 0.0
        t1 = resumed.to_sec() if resumed is not None else 0.0
        line += f"  [{cause}" + (f", traffic stopped {t1 - t0:.2f} s" if t0 > 0 and t1 > t0 else "") + "]"
    return line


def split_csv(value: Any) -> Tuple[str, ...]:
    """Settings value -> tuple of non-empty strings (accepts a comma string, a list or None)."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v).strip() for v in value if str(v).strip())
    return tuple(v.strip() for v in str(value).split(",") if v.strip())
