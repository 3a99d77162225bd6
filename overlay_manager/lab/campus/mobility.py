"""Robots that move: a host roams to another building's LAN, links flap on a schedule, and every
action is logged with its times so a gap in the traffic can be attributed to it.

A roam moves the host's LAN link the way a robot changes Wi-Fi network: its veth's router end
(the "access point") leaves the current building's bridge (the host's ``eth0`` loses carrier),
joins the other building's bridge, and the host takes an address of that building's LAN with
the building's router as its default gateway (what DHCP would give it). Its overlay address,
names and ROS connections stay; its underlay address, gateway and NAT kind change::

    before                                     after ``move(robot, "b2")``
    r-b1: br0 -- h0 ====== eth0 (robot)         r-b2: br0 -- v<k> ====== eth0 (robot)
          10.231.10.1      10.231.10.10               10.231.11.1        10.231.11.<100+k>

``k`` is the host's index in the spec, so a visitor never takes an address of the building's own
hosts (``10+j``). Moving home gives the link back its home name (``h<j>``) and address.

Pure parts (tested without root): :func:`roam_plan`, :func:`flap_schedule`, :class:`ActionLog`'s
records. The rest runs ``ip`` in the run's namespaces only.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from overlay_manager.lab.campus import system
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.naming import LAN_PREFIXLEN, NET_PREFIX, Names
from overlay_manager.lab.campus.state import RunState
from overlay_manager.lab.campus.system import Echo

VISITOR_HOST_OFFSET = 100
"""A visiting host's address in a building's LAN is ``.<100 + its index in the spec>``."""
HOST_IFNAME = "eth0"
"""The host's LAN interface (inside its namespace); it never changes name or namespace."""


@dataclass(frozen=True)
class Attachment:
    """Where a host's LAN link is plugged in: the building, the router-side veth's name, and the
    host's address and gateway there."""

    building: str
    ifname: str       # the veth end inside the building's router namespace, enslaved to br0
    address: str      # the host's LAN address in that building
    gateway: str      # the building router's LAN address (the host's default route)

    @property
    def cidr(self) -> str:
        """``address/prefixlen``."""
        return f"{self.address}/{LAN_PREFIXLEN}"


def home_attachment(names: Names, host: str) -> Attachment:
    """Where the spec puts ``host``: its building, router end ``h<j>``, address ``.10+j``."""
    i, j = names.host_index(host)
    building = names.spec.buildings[i].name
    return Attachment(building, f"h{j}", names.host_address(host), names.router_lan_address(building))


def visitor_attachment(names: Names, host: str, building: str) -> Attachment:
    """``host`` plugged into ``building`` (not its own): router end ``v<k>``, address
    ``.<100+k>`` of that LAN, ``k`` = the host's index among all hosts of the spec."""
    hosts = [h.name for h in names.spec.hosts]
    if host not in hosts:
        raise LabError(f"no host {host!r} in spec {names.spec.source}")
    k = hosts.index(host)
    if VISITOR_HOST_OFFSET + k > 254:
        raise LabError(f"host {host} is number {k} of the spec: too many hosts for visitor addresses")
    i = names.building_index(building)
    return Attachment(building, f"v{k}", f"{NET_PREFIX}.{10 + i}.{VISITOR_HOST_OFFSET + k}",
                      names.router_lan_address(building))


def attachment(names: Names, host: str, building: str) -> Attachment:
    """``host`` plugged into ``building``: its home attachment there, a visitor's elsewhere."""
    home = home_attachment(names, host)
    if building == home.building:
        return home
    return visitor_attachment(names, host, building)


@dataclass(frozen=True)
class RoamPlan:
    """What :meth:`Mobility.move` does, in order (pure data; :func:`roam_plan` makes it)."""

    host: str
    host_ns: str
    old: Attachment
    new: Attachment
    old_router_ns: str
    new_router_ns: str
    transit_ifname: str   # the router end's name while it moves (``m<k>``: unique in the run)

    def commands(self) -> List[Tuple[str, List[str]]]:
        """(namespace, ``ip`` argv) in order: the router end leaves the old building (the host's
        eth0 loses carrier), joins the new one's bridge, then the host takes the new address
        and default route (its old address goes: DHCP on a new network)."""
        o, n = self.old, self.new
        return [
            # down, and a name no router uses (neither h<j> nor v<k> may exist in the target)
            (self.old_router_ns, ["ip", "link", "set", "dev", o.ifname, "down", "name", self.transit_ifname]),
            (self.old_router_ns, ["ip", "link", "set", "dev", self.transit_ifname, "netns", self.new_router_ns]),
            (self.new_router_ns, ["ip", "link", "set", "dev", self.transit_ifname, "name", n.ifname]),
            (self.new_router_ns, ["ip", "link", "set", "dev", n.ifname, "master", "br0", "up"]),
            (self.host_ns, ["ip", "-4", "addr", "flush", "dev", HOST_IFNAME, "scope", "global"]),
            (self.host_ns, ["ip", "addr", "add", n.cidr, "dev", HOST_IFNAME]),
            (self.host_ns, ["ip", "route", "replace", "default", "via", n.gateway, "dev", HOST_IFNAME]),
        ]


def roam_plan(names: Names, host: str, current: Attachment, to_building: str) -> RoamPlan:
    """The plan to move ``host`` from ``current`` to ``to_building`` (LabError: already there)."""
    if current.building == to_building:
        raise LabError(f"host {host} is already in building {to_building}")
    new = attachment(names, host, to_building)
    k = [h.name for h in names.spec.hosts].index(host)
    return RoamPlan(host, names.host_ns(host), current, new, names.router_ns(current.building),
                    names.router_ns(to_building), f"m{k}")


def flap_schedule(count: int, period_s: float, down_s: float) -> List[Tuple[float, str]]:
    """``count`` flaps, one every ``period_s`` seconds, each down for ``down_s`` seconds:
    [(offset s from the start, "down" | "up")], sorted. LabError when a flap would not be up
    again before the next one starts."""
    if count < 1 or period_s <= 0 or down_s <= 0:
        raise LabError(f"flap schedule: count {count} must be >= 1, period {period_s} s and down "
                       f"{down_s} s > 0")
    if down_s >= period_s:
        raise LabError(f"flap schedule: down time {down_s} s must be shorter than the period {period_s} s")
    out: List[Tuple[float, str]] = []
    for i in range(count):
        out += [(round(i * period_s, 6), "down"), (round(i * period_s + down_s, 6), "up")]
    return out


class ActionLog:
    """Every campus action with its times: ``t_mono`` (CLOCK_MONOTONIC s, the clock of every
    namespace and of the probes' events) and ``t_wall`` (Unix time) when it started, ``done_mono``
    when it finished. Kept in memory and appended to ``path`` (JSON lines) when given, so actions
    run from another process (the ``lab`` command) can be attributed too."""

    def __init__(self, path: Optional[Path] = None) -> None:
        self.path = path
        self.records: List[Dict[str, Any]] = []

    def run(self, action: str, target: str, fn: Callable[[], Any], **detail: Any) -> Dict[str, Any]:
        """Run ``fn`` and record it (also when it raises: ``error`` then)."""
        rec: Dict[str, Any] = {"action": action, "target": target, "t_mono": time.monotonic(),
                               "t_wall": time.time(), **detail}
        try:
            fn()
        except BaseException as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            rec["done_mono"] = time.monotonic()
            self.records.append(rec)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
        return rec

    def since(self, t_mono: float) -> List[Dict[str, Any]]:
        """Records that started at or after ``t_mono``."""
        return [r for r in self.records if r["t_mono"] >= t_mono]


def read_actions(path: Path) -> List[Dict[str, Any]]:
    """The records of an action log file (missing file: none)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Mobility:
    """Roams and flaps of one run; where each host is plugged in lives in the run's state
    (``roam``: host -> Attachment fields) so the ``lab`` command and tests agree.

    Args:
        names: the run's names and addresses.
        state: the run's state file.
        echo: receives one line per command, with its namespace.
        log: the run's action log.
    """

    def __init__(self, names: Names, state: RunState, echo: Echo, log: ActionLog) -> None:
        self.names, self.state, self.echo, self.log = names, state, echo, log

    def where(self, host: str) -> Attachment:
        """Where ``host`` is plugged in now."""
        rec = self.state.read().get("roam", {}).get(host)
        return Attachment(**rec) if rec else home_attachment(self.names, host)

    def move(self, host: str, building: str, handover_s: float = 0.0) -> Dict[str, Any]:
        """Move ``host``'s LAN link to ``building`` (its home building: back home); the link is
        without carrier for ``handover_s`` seconds between leaving and joining (a Wi-Fi
        handover). Returns the action record (times, old and new attachment)."""
        plan = roam_plan(self.names, host, self.where(host), building)
        cmds = plan.commands()

        def do() -> None:
            for ns, argv in cmds[:2]:
                system.run(argv, ns, echo=self.echo)
            if handover_s > 0:
                time.sleep(handover_s)
            for ns, argv in cmds[2:]:
                system.run(argv, ns, echo=self.echo)
            with self.state.locked() as st:
                roam = st.setdefault("roam", {})
                if building == home_attachment(self.names, host).building:
                    roam.pop(host, None)
                else:
                    roam[host] = asdict(plan.new)

        return self.log.run("move", host, do, from_building=plan.old.building, to_building=building,
                            old_address=plan.old.address, new_address=plan.new.address,
                            handover_s=handover_s)

    def link_down(self, host: str) -> Dict[str, Any]:
        """Take the router end of ``host``'s LAN link down (the access point vanishes: the
        host's eth0 loses carrier, its address and routes stay)."""
        a = self.where(host)
        ns = self.names.router_ns(a.building)
        return self.log.run("link-down", host, lambda: system.run(
            ["ip", "link", "set", "dev", a.ifname, "down"], ns, echo=self.echo))

    def link_up(self, host: str) -> Dict[str, Any]:
        """Undo :meth:`link_down` (and make sure the host's default route is there again)."""
        a = self.where(host)
        ns = self.names.router_ns(a.building)

        def do() -> None:
            system.run(["ip", "link", "set", "dev", a.ifname, "up"], ns, echo=self.echo)
            system.run(["ip", "route", "replace", "default", "via", a.gateway, "dev", HOST_IFNAME],
                       self.names.host_ns(host), echo=self.echo)

        return self.log.run("link-up", host, do)


def run_schedule(schedule: Sequence[Tuple[float, str]], actions: Mapping[str, Callable[[], Any]],
                 stop: Optional[Callable[[], bool]] = None) -> float:
    """Run ``actions[name]`` at each (offset, name) of ``schedule`` measured from now
    (CLOCK_MONOTONIC, absolute deadlines: a slow action does not shift the later ones); returns
    the start time. ``stop()`` true ends it early (the caller restores what needs it)."""
    t0 = time.monotonic()
    for offset, name in schedule:
        if stop is not None and stop():
            break
        delay = t0 + offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        actions[name]()
    return t0
