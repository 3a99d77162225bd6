"""The node's guard against stalled paths, roams and a dead home DERP region (the I/O side of
core/mobility.py; docs/node.md "Moving robots" says what it does and what it costs).

Threads: :meth:`PathGuard.tick` runs on overlay-guard (every node.guard_interval s) and
:meth:`PathGuard.check_home` on overlay-home (every node.home_check_interval s); each keeps its own
state. What the reporting and poll threads read (:attr:`PathGuard.episodes`,
:attr:`PathGuard.home`, :attr:`PathGuard.notes`) is an immutable value swapped in by one
assignment, so nobody waits for a LocalAPI call or a TCP connect.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

from overlay_manager.core.identity import peer_key
from overlay_manager.core.mobility import (
    Episode,
    HomeCheck,
    StallTracker,
    Underlay,
    parse_default_route,
    pick_other_region,
)
from overlay_manager.core.peers import PATH_DERP, PATH_DIRECT, PATH_PEER_RELAY, PeerState
from overlay_manager.system.sockets import established_remotes
from overlay_manager.tailscaled.localapi import (
    DebugUnsupported,
    LocalAPI,
    TailscaleError,
    debug_actions_supported,
)

UPGRADE_PROBE_S = 1.0
"""Seconds between probes of an active peer on DERP: a disco ping from the LocalAPI pings every
candidate path of the peer at once (not rate-limited like tailscaled's own discovery), so a
direct path that works again is found within about this long."""
FAST_UPGRADE_S = 5.0
"""Seconds after a stall or roam during which its peer is probed every guard_interval, even on
DERP (a direct path is usually back within this long: UDP unblocked, a roam's new address)."""
HOME_CONNECT_TIMEOUT_S = 1.0
"""Seconds a TCP connect to a derper may take before the region counts as not answering."""
DERP_MAP_EVERY_S = 60.0
"""Seconds between reads of the DERP map by the home check."""


def read_underlay(route_file: str = "/proc/net/route") -> Underlay:
    """This machine's IPv4 default route and the source address towards its gateway (a UDP
    socket's connect sends nothing). Never raises: unreadable -> Underlay()."""
    try:
        with open(route_file, encoding="ascii", errors="replace") as f:
            iface, gw = parse_default_route(f.read())
    except OSError:
        return Underlay()
    if not iface:
        return Underlay()
    addr = ""
    if gw and gw != "0.0.0.0":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.connect((gw, 9))
            addr = s.getsockname()[0]
        except OSError:
            pass
        finally:
            s.close()
    return Underlay(iface, gw, addr)


def derp_nodes(derp_map: Dict[str, Any]) -> Dict[str, Tuple[int, List[Tuple[str, int]]]]:
    """Region code -> (region id, [(host, port) of its derpers]) from tailcfg.DERPMap JSON."""
    out: Dict[str, Tuple[int, List[Tuple[str, int]]]] = {}
    regions = derp_map.get("Regions") if isinstance(derp_map, dict) else None
    for key, r in (regions.items() if isinstance(regions, dict) else ()):
        if not isinstance(r, dict):
            continue
        try:
            rid = int(r.get("RegionID") or key)
        except (TypeError, ValueError):
            continue
        code = str(r.get("RegionCode") or rid)
        nodes = []
        for n in r.get("Nodes") or ():
            if not isinstance(n, dict) or n.get("STUNOnly"):
                continue
            host = str(n.get("IPv4") or n.get("HostName") or "")
            port = n.get("DERPPort") or 443
            if host and isinstance(port, int) and 0 < port < 65536:
                nodes.append((host, port))
        out[code] = (rid, nodes)
    return out


def tcp_connect(host: str, port: int, timeout_s: float) -> Tuple[float, str]:
    """Seconds a TCP connect took, or (-1, why it failed)."""
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return time.monotonic() - t0, ""
    except OSError as exc:
        return -1.0, f"{host}:{port}: {exc.strerror or exc}"


class PathGuard:
    """Probes the paths that carry traffic, notices stalls and roams and asks tailscaled to
    re-evaluate; checks the home DERP region.

    Args:
        api: LocalAPI client.
        snapshot: returns the presented status (OverlayMonitor.snapshot).
        targets: returns the peers worth probing (the watched ones).
        stall_after_s: seconds without a probe answer that make a stall (node.stall_after).
        wall: POSIX clock (tests inject a fake); underlay: reads the underlay (tests inject).
    """

    def __init__(self, api: LocalAPI, snapshot: Callable[[], Any], targets: Callable[[], List[PeerState]],
                 stall_after_s: float, wall: Callable[[], float] = time.time,
                 underlay: Callable[[], Underlay] = read_underlay) -> None:
        self.api = api
        self._snapshot = snapshot
        self._targets = targets
        self.wall = wall
        self._read_underlay = underlay
        self.stall_after_s = stall_after_s
        self.tracker = StallTracker(stall_after_s)       # overlay-guard only
        self._underlay: Optional[Underlay] = None         # overlay-guard only
        self._underlay_at = 0.0                           # overlay-guard only: when last read
        self._last_derp_probe: Dict[str, float] = {}      # overlay-guard only
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="overlay-guard")
        self._unsupported: Dict[str, str] = {}            # action -> why not (both threads; dict ops only)
        self._derp: Dict[str, Tuple[int, List[Tuple[str, int]]]] = {}  # overlay-home only
        self._derp_read_at = -1e18                        # overlay-home only
        self._dead_home = ""                              # overlay-home only: region forced away from
        self._resolved: Dict[str, str] = {}               # overlay-home only: derper host -> IPv4
        # overlay-home only: () -> (remote IPv4, port) of this namespace's established TCP connections
        self._established: Callable[[], List[Tuple[str, int]]] = established_remotes
        # read by other threads, replaced whole:
        self.episodes: Dict[str, Episode] = {}
        self.home = HomeCheck()
        self.underlay = Underlay()
        self.actions = 0        # debug actions asked of tailscaled (monotonic count)
        self.probes = 0         # disco pings sent by the guard

    # ----- debug actions --------------------------------------------------------------------
    def _debug(self, action: str, body: bytes = b"") -> str:
        """Ask tailscaled for a debug action; "" when done, else why not (never raises)."""
        if action in self._unsupported:
            return self._unsupported[action]
        snap = self._snapshot()
        why = debug_actions_supported(getattr(snap, "version", "") if snap is not None else "")
        if why:
            return why
        try:
            self.api.debug_action(action, body, timeout=2.0)
        except DebugUnsupported as exc:
            self._unsupported[action] = str(exc)
            return str(exc)
        except TailscaleError as exc:
            return str(exc)
        self.actions += 1
        return ""

    # ----- overlay-guard ----------------------------------------------------------------------
    def tick(self) -> List[str]:
        """One round: read the underlay, probe the active peers, act on stalls and roams.
        Returns log lines (what was noticed and done). Blocks up to stall_after_s on pings."""
        lines: List[str] = []
        now = self.wall()
        targets = [p for p in self._targets() if p.active and p.ipv4]
        keys = [peer_key(p) for p in targets]
        self._look_at_underlay(keys, lines)
        probe = []
        for p, k in zip(targets, keys):
            if p.path in (PATH_DIRECT, PATH_PEER_RELAY) or self._recent(k, now):
                probe.append((p, k))
            elif p.path == PATH_DERP and now - self._last_derp_probe.get(k, -1e18) >= UPGRADE_PROBE_S:
                self._last_derp_probe[k] = now
                probe.append((p, k))
        stalled: List[Tuple[PeerState, str]] = []
        roamed = False
        if probe:
            sent = self.wall()
            futures = [(p, k, self._pool.submit(self._ping, p.ipv4, self.tracker.probe_timeout(k, sent)))
                       for p, k in probe]
            for p, k, f in futures:
                ok = f.result()
                t = self.wall()
                if ok:
                    self.tracker.answered(k, t)
                elif p.path in (PATH_DIRECT, PATH_PEER_RELAY) and self.tracker.unanswered(k, sent, t):
                    stalled.append((p, k))
            # the network may have changed while the probes waited: a roam, not a stall
            roamed = self._look_at_underlay(keys, lines)
        if stalled and not roamed:
            names = ", ".join(f"{p.name} ({p.path})" for p, _ in stalled)
            if self.tracker.may_act(self.wall()):
                why = self._debug("rebind")
                self.tracker.note_action([k for _, k in stalled], "" if why else "rebind")
                lines.append(f"path stalled (no answer for {self.stall_after_s:.2f} s): {names}; "
                             + ("asked tailscaled to re-evaluate its paths (rebind)" if not why
                                else f"cannot ask tailscaled to re-evaluate: {why}"))
            else:
                lines.append(f"path stalled: {names}; re-evaluation asked less than "
                             f"{self.tracker.cooldown_s:.0f} s ago")
        self.tracker.forget(keys)
        self.episodes = self.tracker.episodes(self.wall())
        return lines

    def _look_at_underlay(self, keys: List[str], lines: List[str]) -> bool:
        """Read the underlay; when it changed since the last look, a roam: every active peer's
        traffic stopped, rebind and restun asked. Returns whether it changed."""
        now = self.wall()
        u = self._read_underlay()
        old, old_at = self._underlay, self._underlay_at
        self._underlay, self._underlay_at, self.underlay = u, now, u
        if old is None or u == old:
            return False
        self.tracker.roamed(keys, old_at, now)
        done = self._debug("rebind") if keys else ""
        self.tracker.note_action(keys, "rebind" if not done and keys else "")
        what = ""
        if keys:
            what = (f"; asked tailscaled to re-evaluate its paths (rebind) for {len(keys)} active peer(s)"
                    if not done else f"; cannot ask tailscaled to re-evaluate: {done}")
        lines.append(f"this machine's network changed: {old.describe()} -> {u.describe()}{what}")
        self._debug("restun")
        return True

    def _recent(self, key: str, now: float) -> bool:
        """Whether peer key's traffic stopped less than FAST_UPGRADE_S ago or has not resumed:
        it is probed every tick, so that tailscaled tries the new candidate paths (a roamed
        peer's new address) at that rate, not once a second."""
        ep = self.episodes.get(key)
        return ep is not None and (not ep.resumed or now - ep.detected < FAST_UPGRADE_S)

    def _ping(self, ip: str, timeout_s: float) -> bool:
        """One disco ping; True when answered within timeout_s (never raises)."""
        self.probes += 1
        try:
            res = self.api.ping(ip, "disco", timeout=timeout_s)
        except Exception:  # noqa: BLE001 - TailscaleError or garbage: an unanswered probe either way
            return False
        return isinstance(res, dict) and not res.get("Err")

    # ----- overlay-home -----------------------------------------------------------------------
    def check_home(self) -> List[str]:
        """Is the home region's derper accepting connections? While tailscaled holds a TCP
        connection to it (/proc/net/tcp) it is; otherwise the node tries a TCP connect. If that
        fails, and another region accepts one,
        ask tailscaled to prefer that one (force-prefer-derp + restun); release the preference
        when the old home answers again. Returns log lines."""
        lines: List[str] = []
        now = self.wall()
        if now - self._derp_read_at >= DERP_MAP_EVERY_S or not self._derp:
            try:
                self._derp = derp_nodes(self.api.derp_map())
                self._derp_read_at = now
                self._resolved = {}
            except TailscaleError as exc:
                if not self._derp:
                    self.home = HomeCheck(error=f"cannot read the DERP map: {exc}", ok=True)
                    return lines
        snap = self._snapshot()
        me = getattr(snap, "self_peer", None) if snap is not None else None
        home = me.relay_region if me is not None else ""
        if self._dead_home:
            _, err = self._region_answers(self._dead_home)
            if not err:
                why = self._debug("force-prefer-derp", b"0")
                lines.append(f"DERP region {self._dead_home} answers again; "
                             + ("stopped preferring another region (force-prefer-derp 0)" if not why
                                else f"cannot stop preferring another region: {why}"))
                self._dead_home = ""
        if not home or not self._derp.get(home, (0, []))[1]:  # unknown, or no derper address to check
            self.home = HomeCheck(region=home, forced_region=self.home.forced_region if self._dead_home else "")
            return lines
        if self._connected_to(home):  # tailscaled holds its home connection: nothing to ask the derper
            took, err = 0.0, ""
        else:
            took, err = self._region_answers(home)
        if not err:
            prev = self.home
            self.home = HomeCheck(region=home, forced_region=prev.forced_region if self._dead_home else "",
                                  action=prev.action if self._dead_home else "")
            return lines
        prev = self.home
        since = prev.since if prev.region == home and prev.since else now
        reachable = {}
        for code in self._derp:
            if code != home:
                t, e = self._region_answers(code)
                if not e:
                    reachable[code] = t
        other = pick_other_region(home, reachable)
        if not other and "refused" not in err.lower():
            # nothing answers and nothing refuses: this machine's own network is out (a roam, a
            # link down), not the home region; the stall guard and tailscaled deal with that
            self.home = HomeCheck(region=home, error=f"no derper reachable ({err})")
            return lines
        action = "no other region answers: nothing to move to"
        forced = ""
        if other and prev.region == home and prev.forced_region == other:
            action, forced = prev.action, other  # asked already: tailscaled is moving
        elif other:
            rid = self._derp[other][0]
            why = self._debug("force-prefer-derp", str(rid).encode("ascii"))
            if not why:
                # force-prefer-derp holds for every later network check, which takes seconds
                # when UDP is blocked; pick-new-derp moves home now (to another region: the one
                # asked when there are two, else any, which the check then corrects)
                moved = self._debug("pick-new-derp")
                self._debug("restun")
                action = (f"asked tailscaled to prefer region {other} (force-prefer-derp {rid}, "
                          + ("pick-new-derp, " if not moved else "") + "restun)")
                forced = other
                self._dead_home = home
            else:
                action = f"cannot ask tailscaled to prefer region {other}: {why}"
        if prev.region != home or not prev.since or prev.action != action:
            lines.append(f"home DERP region {home} refuses connections ({err}); {action}")
        self.home = HomeCheck(home, False, err, since, action, forced)
        return lines

    def _connected_to(self, code: str) -> bool:
        """Whether this network namespace has an ESTABLISHED TCP connection to one of region
        code's derpers (tailscaled's home connection: a sock_diag dump, no packet sent). A host
        name without an IPv4 address in the DERP map is resolved (bounded by the resolver)."""
        _, nodes = self._derp.get(code, (0, []))
        try:
            remotes = set(self._established())
        except OSError:
            return False
        for host, port in nodes:
            ip = self._resolved.get(host)
            if ip is None:
                try:
                    ip = socket.gethostbyname(host)
                except OSError:
                    ip = ""
                self._resolved[host] = ip
            if (ip, port) in remotes:
                return True
        return False

    def _region_answers(self, code: str) -> Tuple[float, str]:
        """(connect seconds, "") when one of region code's derpers accepts a TCP connection,
        else (-1, the last error)."""
        _, nodes = self._derp.get(code, (0, []))
        err = f"region {code} lists no derper"
        for host, port in nodes:
            took, err = tcp_connect(host, port, HOME_CONNECT_TIMEOUT_S)
            if not err:
                return took, ""
        return -1.0, err

    def close(self) -> None:
        """Stop the probe pool (running pings end within stall_after_s)."""
        self._pool.shutdown(wait=False)
