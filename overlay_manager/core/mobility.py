"""Movement and stalled paths, decided without I/O (monitor/path_guard.py does the I/O).

Why this exists: tailscale keeps sending over a UDP path (direct or through a peer relay) for
6.5 s after its last pong (``trustUDPAddrDuration`` in wgengine/magicsock) before it also tries
DERP, so a blocked or dead path stops the traffic for about 6.5-7 s. The node probes the paths
that carry traffic with disco pings; a probe unanswered for ``node.stall_after`` seconds means the
path stalled, and the node asks tailscaled to forget its paths (LocalAPI debug ``rebind``), which
makes it send over DERP and every candidate path at once. The same when this machine's own
network changes under it (a roam: default route, gateway or source address changed).

Words of ``PathChange.cause`` (msg/PathChange.msg):
- ``roam``: this machine's network changed (another building, access point, address);
- ``stall``: the old path stopped answering probes; for ``old_path`` peer-relay this is "the
  relay died", for direct "UDP got blocked" or "the peer's network changed";
- ``""``: tailscaled changed the path on its own (an upgrade its discovery found, or a change
  on the peer's side the node did not see).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

from overlay_manager.core.nat import NatInfo

CAUSE_ROAM = "roam"
CAUSE_STALL = "stall"
CAUSE_NONE = ""
CAUSES = (CAUSE_ROAM, CAUSE_STALL, CAUSE_NONE)

EPISODE_KEEP_S = 15.0
"""Seconds an episode (stall or roam) explains the path changes of its peer after it began."""


@dataclass(frozen=True)
class Underlay:
    """This machine's way out, as the kernel routes it: what a roam changes."""

    interface: str = ""   # interface of the IPv4 default route ("" = no default route)
    gateway: str = ""     # its gateway address
    address: str = ""     # the source address the kernel picks towards the gateway

    def describe(self) -> str:
        """One line for logs and diagnostics."""
        if not self.interface:
            return "no default route"
        return f"{self.address or '?'} on {self.interface} via {self.gateway or 'no gateway'}"


def parse_default_route(proc_net_route: str) -> Tuple[str, str]:
    """(interface, gateway) of the IPv4 default route with the lowest metric in the text of
    /proc/net/route; ("", "") when there is none. Tunnel interfaces of tailscale are skipped."""
    best: Optional[Tuple[int, str, str]] = None
    for line in proc_net_route.splitlines()[1:]:
        f = line.split()
        if len(f) < 8 or f[1] != "00000000" or f[7] != "00000000":
            continue
        try:
            flags, metric = int(f[3], 16), int(f[6])
            gw = bytes.fromhex(f[2])[::-1]
        except ValueError:
            continue
        if not flags & 0x1 or f[0].startswith("tailscale"):  # RTF_UP
            continue
        cand = (metric, f[0], ".".join(str(b) for b in gw))
        if best is None or cand < best:
            best = cand
    return (best[1], best[2]) if best else ("", "")


@dataclass(frozen=True)
class Episode:
    """A time the traffic to a peer stopped, as the node saw it (all times POSIX seconds)."""

    cause: str                 # CAUSE_STALL or CAUSE_ROAM
    stopped: float             # the last moment the path was known to work (its last answered probe)
    detected: float            # when the node noticed and asked tailscaled to re-evaluate
    resumed: float = 0.0       # the first answered probe afterwards (0 = not yet)
    action: str = ""           # what the node did ("rebind", "" = nothing: debug actions unavailable)


class StallTracker:
    """Per-peer probe outcomes -> stall episodes. One thread (overlay-guard) uses it.

    Args:
        stall_after_s: seconds without an answer (since the last answered probe) that make a stall.
        cooldown_s: shortest time between two re-evaluations asked of tailscaled.
    """

    def __init__(self, stall_after_s: float, cooldown_s: float = 2.0) -> None:
        self.stall_after_s = stall_after_s
        self.cooldown_s = cooldown_s
        self._last_ok: Dict[str, float] = {}      # peer key -> POSIX s of its last answered probe
        self._episodes: Dict[str, Episode] = {}   # peer key -> its latest episode
        self._last_action = -1e18                 # POSIX s of the last re-evaluation asked

    def answered(self, key: str, now: float) -> None:
        """A probe to peer key was answered at now; closes its open episode (resumed = now)."""
        self._last_ok[key] = now
        ep = self._episodes.get(key)
        if ep is not None and not ep.resumed:
            self._episodes[key] = Episode(ep.cause, ep.stopped, ep.detected, now, ep.action)

    def unanswered(self, key: str, sent: float, now: float) -> bool:
        """A probe sent at ``sent`` got no answer by now. True when this makes a new stall of
        peer key (no open episode, nothing answered for stall_after_s)."""
        last = self._last_ok.setdefault(key, sent)
        ep = self._episodes.get(key)
        if ep is not None and not ep.resumed:
            return False
        if now - last < self.stall_after_s:
            return False
        self._episodes[key] = Episode(CAUSE_STALL, last, now)
        return True

    def roamed(self, keys: List[str], last_seen: float, now: float) -> None:
        """This machine's network changed (noticed at now; it was last seen unchanged at
        last_seen): every listed peer's traffic stopped then."""
        for k in keys:
            self._episodes[k] = Episode(CAUSE_ROAM, max(last_seen, self._last_ok.get(k, last_seen)), now)

    def probe_timeout(self, key: str, now: float, floor_s: float = 0.1) -> float:
        """Seconds a probe sent now to peer key may wait for its answer: until the moment a
        stall would be declared (its last answer + stall_after_s), floor_s at least, so a path
        that died right after an answer is noticed stall_after_s after that answer, not a
        whole probe timeout later."""
        last = self._last_ok.get(key)
        ep = self._episodes.get(key)
        if last is None or (ep is not None and not ep.resumed):
            return self.stall_after_s
        return max(floor_s, min(self.stall_after_s, last + self.stall_after_s - now))

    def may_act(self, now: float) -> bool:
        """Whether a re-evaluation may be asked now (cooldown); if so, it counts as asked."""
        if now - self._last_action < self.cooldown_s:
            return False
        self._last_action = now
        return True

    def note_action(self, keys: List[str], action: str) -> None:
        """Record what the node did about the open episodes of keys."""
        for k in keys:
            ep = self._episodes.get(k)
            if ep is not None and not ep.resumed:
                self._episodes[k] = Episode(ep.cause, ep.stopped, ep.detected, ep.resumed, action)

    def forget(self, keep: List[str]) -> None:
        """Drop the state of peers not in keep (they left the tailnet or stopped carrying traffic)."""
        keep_set = set(keep)
        for d in (self._last_ok, self._episodes):
            for k in [k for k in d if k not in keep_set]:
                del d[k]

    def episodes(self, now: float) -> Dict[str, Episode]:
        """Episodes that began within EPISODE_KEEP_S of now (peer key -> episode): a copy."""
        return {k: e for k, e in self._episodes.items() if now - e.detected <= EPISODE_KEEP_S}


@dataclass(frozen=True)
class HomeCheck:
    """What the node found about this machine's home DERP region (POSIX s in ``since``)."""

    region: str = ""          # region code tailscaled uses as home ("" = unknown)
    ok: bool = True           # its derper accepted a TCP connection (or not checked)
    error: str = ""           # why not: "host:port: connection refused", ...
    since: float = 0.0        # when it was first found failing (0 = it works)
    action: str = ""          # what the node did about it, in words
    forced_region: str = ""   # region the node asked tailscaled to prefer ("" = none)


def pick_other_region(home: str, reachable: Dict[str, float]) -> str:
    """The region to prefer instead of a dead home: the reachable one (code -> connect time in
    seconds) that answered fastest, never home itself; "" when there is none."""
    others = sorted((t, code) for code, t in reachable.items() if code != home)
    return others[0][1] if others else ""


@dataclass(frozen=True)
class Explanation:
    """Why a path change happened, for PathChange.cause and its times (POSIX s; 0 = unknown)."""

    cause: str = CAUSE_NONE
    detail: str = ""
    stopped: float = 0.0
    resumed: float = 0.0


def explain(episode: Optional[Episode], previous_change: float, detail: str = "") -> Explanation:
    """The explanation of a peer's path change: its episode when that began after the peer's
    previous path change (POSIX s; 0 = none), else none (tailscaled changed it on its own)."""
    if episode is None or episode.detected < previous_change:
        return Explanation()
    what = detail or ("the old path stopped answering the node's probes" if episode.cause == CAUSE_STALL
                      else "this machine's network changed")
    if episode.action:
        what += f"; the node asked tailscaled to {episode.action}"
    return Explanation(episode.cause, what, episode.stopped, episode.resumed)


def completed(why: Explanation, episode: Optional[Episode], waited_s: float, hold_s: float) -> Optional[Explanation]:
    """A path change's explanation when the change may be published now, else None (wait): one
    without a cause, or whose traffic already resumed, at once; one whose stall or roam is still
    open waits until that episode resumes (then with its traffic_resumed) or hold_s passed."""
    if not why.cause or why.resumed:
        return why
    if episode is not None and episode.resumed and episode.stopped == why.stopped:
        return replace(why, resumed=episode.resumed)
    return why if waited_s >= hold_s else None


def actual_home(nat: NatInfo, self_relay: str, names: Dict[str, str]) -> NatInfo:
    """nat with preferred_derp replaced by the home region tailscaled actually uses (its own
    status: Self.Relay, magicsock's home with its hysteresis), when that is known; the network
    check's latency and name for that region are kept where it measured it."""
    if not self_relay or self_relay == nat.preferred_derp:
        return nat
    ms = next((m for c, _, m in nat.region_latency if c == self_relay), float("nan"))
    name = names.get(self_relay, "")
    label = f"{self_relay} ({name})" if name and name != self_relay else self_relay
    lat = "" if ms != ms else f" ({ms:.1f} ms)"
    summary = nat.summary.split("; home DERP ", 1)[0] + f"; home DERP {label}{lat}"
    return replace(nat, preferred_derp=self_relay, preferred_derp_latency_ms=ms, preferred_derp_name=name,
                   summary=summary)
