"""The fleet file's ``relays`` section: which fleet machines serve Tailscale peer relays.

A peer relay is a tailnet machine that forwards WireGuard UDP between two other machines that
cannot reach each other directly (e.g. both behind symmetric NATs). Peers try it before falling
back to DERP (WireGuard inside TCP/TLS through the control server), and it carries several times
DERP's throughput from one UDP port a campus network team can open on one server. A relay only
ever sees ciphertext.

Example (see ``config/fleet.example.yaml``)::

    relays:
      campus-relay:                 # a host of the fleet (robot or base station)
        port: 40000                 # UDP port the relay server binds (default 40000)
        static_endpoints: []        # extra ip:port to advertise (port-forwarded relays)
        teams: [alpha, bravo]       # teams that may use it (default: all teams)

Policy (see :mod:`overlay_manager.fleet.policy`): every relay host carries ``tag:relay`` (a
label) and ``tag:relay-<host>``; a grant with the capability :data:`RELAY_CAP` lets the machines
and operators of the relay's teams use it. Teams other than the relay's own may only ping the
relay host (so that headscale puts it in their network map); they can open no connection to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Tuple

from overlay_manager.core.config import DEFAULT_RELAY_PORT, RelaySettings, parse_addr_port
from overlay_manager.core.peers import RELAY_TAG as PEERS_RELAY_TAG
from overlay_manager.core.validation import MISSING, Reader, join_key, shorten

#: Tailscale capability that grants the use of a peer relay (policy ``grants[].app``).
RELAY_CAP = "tailscale.com/cap/relay"
#: Role tag of every relay host (a label: no ACL rule grants anything to it; the node uses it
#: to name the relay of a peer-relay link).
RELAY_TAG = PEERS_RELAY_TAG
#: UDP port a relay binds when the fleet file does not say.
DEFAULT_PORT = DEFAULT_RELAY_PORT

_KEYS = ("port", "static_endpoints", "teams")


@dataclass(frozen=True)
class Relay:
    """One peer relay of the fleet.

    Attributes:
        host: short name of the fleet host that runs the relay server.
        port: UDP port the relay server binds on all interfaces (1..65535).
        static_endpoints: extra ``ip:port`` candidates the relay advertises (e.g. a port
            forward on a NAT in front of it); empty = only the addresses tailscaled discovers.
        teams: names of the teams whose machines and operators may use the relay.
    """

    host: str
    port: int = DEFAULT_PORT
    static_endpoints: Tuple[str, ...] = ()
    teams: Tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        """The per-relay ACL tag that scopes its grant: ``tag:relay-<host>``."""
        return f"tag:relay-{self.host}"


def parse_relays(r: Reader, raw: Any, hosts: Mapping[str, Any], teams: List[str]) -> Dict[str, Relay]:
    """Validate the ``relays`` section.

    Args:
        r: the fleet file's reader (errors name its file).
        raw: the parsed section (None/missing = no relays): a mapping host name -> settings (a
            mapping, or null for all defaults).
        hosts: the fleet's hosts by short name; each value has ``role`` and ``team``.
        teams: the fleet's team names in file order.

    Returns:
        Relays by host name, in file order.

    Raises:
        ConfigError: naming the key (and the host) of the first problem.
    """
    section = r.mapping(raw, "relays", what="a mapping of relay host -> {port, static_endpoints, teams}")
    out: Dict[str, Relay] = {}
    for name, entry in section.items():
        key = join_key("relays", name)
        host = hosts.get(name)
        if host is None:
            raise r.error(key, "not a host of the fleet: list the relay machine in a team (e.g. as "
                               "a base station) first", host=name)
        if host.role == "operator":
            raise r.error(key, "operators (laptops) cannot be relays: use a robot or a base station "
                               "that stays on the campus network", host=name)
        m = r.mapping(entry, key, _KEYS, what="a mapping with port, static_endpoints, teams")
        port = r.port(m.get("port", MISSING), f"{key}.port", DEFAULT_PORT)
        eps: List[str] = []
        for i, ep in enumerate(r.string_list(m.get("static_endpoints", MISSING),
                                             f"{key}.static_endpoints", [])):
            try:
                canon = parse_addr_port(ep)
            except ValueError as e:
                raise r.error(f"{key}.static_endpoints[{i}]", str(e), host=name) from None
            if canon not in eps:
                eps.append(canon)
        t_raw = m.get("teams", "all")
        if t_raw == "all" or t_raw is None:
            served = list(teams)
        elif isinstance(t_raw, list) and t_raw:
            served = []
            for i, t in enumerate(r.string_list(t_raw, f"{key}.teams")):
                if t not in teams:
                    raise r.error(f"{key}.teams[{i}]", f"unknown team {shorten(t)} (teams: "
                                                       f"{', '.join(teams)})", host=name)
                if t not in served:
                    served.append(t)
        else:
            raise r.error(f"{key}.teams", f"must be 'all' or a non-empty list of team names, got "
                                          f"{shorten(t_raw)}", host=name)
        out[name] = Relay(host=name, port=port, static_endpoints=tuple(sorted(eps)),
                          teams=tuple(served))
    return out


def relay_tags(relays: Mapping[str, Relay], host: str) -> List[str]:
    """Extra ACL tags of ``host``: ``[tag:relay, tag:relay-<host>]`` for a relay, else []."""
    relay = relays.get(host)
    return [RELAY_TAG, relay.tag] if relay else []


def relay_settings(relay: Relay) -> RelaySettings:
    """The robot config's ``relay`` section of a relay host, as the node reads it (the bundle
    writes its ``to_yaml()``): the port and the static endpoints (canonical, sorted)."""
    return RelaySettings(port=relay.port, static_endpoints=relay.static_endpoints)
