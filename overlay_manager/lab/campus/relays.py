"""Peer relays in the lab: relay hosts on a campus server network, as a campus would run them.

A relay host is a lab host named in the spec's ``relays`` section, normally in a ``public``
building (a campus server network: no NAT, routed on the backbone)::

                 olab<run>-bb (campus backbone)
        |                 |                       |
     r-campus (public)   r-sym1 (adpm NAT)      r-guest (udp-servers)
        |                 |                       |
     h-relay1            h-robot3               h-robot5
     10.231.(10+i).10    tailscaled             UDP out only to STUN and relay1:40000
     tailscaled with its relay server on UDP 40000

This module keeps what is particular to relays out of the lab's general parts:

- :func:`fleet_relays`: the lab fleet file's ``relays`` section (so ``fleet policy`` grants the
  relay capability and the relay hosts' bundles carry the ``relay`` key, as in production);
- :func:`udp_servers`: (address, port) of every relay, which ``udp-servers`` routers let through;
- :func:`public_routes`: routes to the LANs of ``public`` buildings (other routers and the
  control host reach relay hosts by their own addresses);
- :func:`enable_relays`: turns each relay host's relay server on from its bundle's robot.yaml,
  through the same LocalAPI call the node makes (:func:`overlay_manager.tailscaled.relay.apply_relay`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

from overlay_manager.core.config import load_robot_config
from overlay_manager.core.validation import ConfigError
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.naming import Names
from overlay_manager.lab.campus.spec_model import LabSpec
from overlay_manager.tailscaled.localapi import LocalAPI, TailscaleError
from overlay_manager.tailscaled.relay import RelayApplyResult, apply_relay


def fleet_relays(spec: LabSpec) -> Dict[str, Dict[str, Any]]:
    """The fleet file's ``relays`` mapping for the spec's relays ({} when there are none)."""
    out: Dict[str, Dict[str, Any]] = {}
    for host, rs in spec.relays.items():
        entry: Dict[str, Any] = {"port": rs.port}
        if rs.teams:
            entry["teams"] = list(rs.teams)
        out[host] = entry
    return out


def udp_servers(names: Names) -> List[Tuple[str, int]]:
    """(underlay address, UDP port) of every relay: what a ``udp-servers`` router forwards."""
    return [(names.host_address(host), rs.port) for host, rs in names.spec.relays.items()]


def public_routes(names: Names, building: str = "") -> List[Tuple[str, str]]:
    """(LAN CIDR, gateway) of every ``public`` building other than ``building``: the routes a
    router or the control host needs to reach hosts on a campus server network."""
    return [(names.lan_cidr(b.name), names.router_wan_address(b.name))
            for b in names.spec.buildings if b.nat.public and b.name != building]


def enable_relays(spec: LabSpec, robot_yaml: Callable[[str], Path], localapi: Callable[[str], LocalAPI],
                  echo: Callable[[str], None]) -> Dict[str, RelayApplyResult]:
    """Turn on the relay server of every relay host from its bundle's robot.yaml ``relay`` key.

    Args:
        spec: the lab spec.
        robot_yaml: host -> its bundle's robot.yaml.
        localapi: host -> its tailscaled's LocalAPI.
        echo: receives one line per host.

    Raises:
        LabError: a bundle without the ``relay`` key or tailscaled refusing the change (names
            the host).
    """
    done: Dict[str, RelayApplyResult] = {}
    for host in spec.relays:
        path = robot_yaml(host)
        try:
            cfg = load_robot_config(str(path))
        except ConfigError as exc:
            raise LabError(f"relay host {host}: bad bundle robot.yaml: {exc}") from None
        if cfg.relay is None:
            raise LabError(f"relay host {host}: {path} has no 'relay' key (the fleet's relays section "
                           "did not reach its bundle)")
        try:
            res = apply_relay(localapi(host), cfg.relay)
        except TailscaleError as exc:
            raise LabError(f"relay host {host}: cannot turn the peer relay server on: {exc}") from None
        echo(f"({host}) {res.message}")
        done[host] = res
    return done
