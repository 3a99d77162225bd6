"""The validated fleet file as values: :class:`FleetConfig` and the parts it is made of.

Every value here is frozen and built only by the loader (:mod:`overlay_manager.fleet.config`),
so code that holds a :class:`FleetConfig` may trust it. :class:`FleetError` is for what goes
wrong after loading (deployment, headscale, a host name given on the command line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union
from urllib.parse import urlsplit

from overlay_manager.fleet.derp import DerpRegion, derp_tags
from overlay_manager.fleet.relays import Relay, relay_tags

#: Host roles, in the order they appear in a team.
ROLES: Tuple[str, ...] = ("robot", "base_station", "operator")

#: Role -> role tag (an ACL tag that only labels the machine; access is granted by team tags).
ROLE_TAGS: Dict[str, str] = {
    "robot": "tag:robot",
    "base_station": "tag:base-station",
    "operator": "tag:operator",
}


class FleetError(Exception):
    """A deployment or headscale operation failed (problems in the fleet file are ConfigError).

    The message names the file, the key and/or the host concerned. It never contains a
    pre-auth key.

    Attributes:
        file: the file concerned ("" if none).
        key: dotted path of the offending key in that file ("" if none).
        host: the host concerned ("" if none).
        reason: the bare reason without the location prefix.
    """

    def __init__(self, reason: str, *, file: Union[str, Path] = "", key: str = "", host: str = "") -> None:
        self.file = str(file)
        self.key = key
        self.host = host
        self.reason = reason
        where = []
        if self.file:
            where.append(self.file)
        if key:
            where.append(f"key '{key}'")
        if host:
            where.append(f"host '{host}'")
        super().__init__(f"{': '.join(where)}: {reason}" if where else reason)


@dataclass(frozen=True)
class Host:
    """One machine of the fleet.

    Attributes:
        name: short name, a DNS label; the overlay name is ``<name>.<base_domain>``.
        team: the team it belongs to.
        role: one of :data:`ROLES`.
        master_port: ROS master XML-RPC port this host's ROS_MASTER_URI uses.
    """

    name: str
    team: str
    role: str
    master_port: int = 11311


@dataclass(frozen=True)
class Team:
    """A team: one ACL segment with its own ROS master.

    Attributes:
        name: team name, a DNS label; its tags are ``tag:team-<name>`` (robots, base stations)
            and ``tag:ops-<name>`` (operators).
        master: short name of the team's host that runs roscore.
        hosts: the team's hosts, robots first, then base stations, then operators.
    """

    name: str
    master: str
    hosts: Tuple[Host, ...]

    @property
    def machine_tag(self) -> str:
        """ACL tag carried by this team's robots and base stations."""
        return f"tag:team-{self.name}"

    @property
    def operator_tag(self) -> str:
        """ACL tag carried by this team's operators."""
        return f"tag:ops-{self.name}"


@dataclass(frozen=True)
class TlsConfig:
    """TLS of the control server.

    Attributes:
        generate: True = generate a private CA and a server certificate at ``init``.
        cert: server certificate file (PEM) when not generated; absolute path.
        key: server private key file (PEM) when not generated; absolute path.
        ca: CA certificate robots trust (PEM) when not generated; absolute path, or None to
            use the system trust store on the robots.
        names: extra subject alternative names (DNS names or IP addresses) for the generated
            certificate; the server URL's host is always included.
        days: validity of the generated server certificate, in days (re-issued by ``fleet
            renew-cert``, or by ``fleet init`` within 30 days of its expiry).
        ca_days: validity of the generated CA, in days (robots trust it; it is never replaced
            by the fleet tool on its own).
    """

    generate: bool = True
    cert: Optional[Path] = None
    key: Optional[Path] = None
    ca: Optional[Path] = None
    names: Tuple[str, ...] = ()
    days: int = 825
    ca_days: int = 3650


SERVER_CERT_DAYS = TlsConfig.days
"""Default validity of the generated server certificate (days): 825, the longest a publicly
trusted TLS server certificate could have; short enough that a leaked key stops working."""
CA_DAYS = TlsConfig.ca_days
"""Default validity of the generated fleet CA (days): 10 years, longer than a robot's service
life, because replacing it means a new ca.crt on every robot."""


@dataclass(frozen=True)
class DerpConfig:
    """Embedded DERP relay and STUN server of Headscale.

    Attributes:
        embedded: run the embedded DERP relay (over the server's HTTPS port) and STUN.
        stun_listen: STUN UDP listen address ``host:port``.
        region_id: DERP region id of the embedded relay.
        region_code: short DERP region code (shown by tailscale as the relay region).
        region_name: human-readable region name.
        ipv4: public IPv4 address of the relay announced in the DERP map ("" = resolve the
            server URL's host).
        extra_maps: extra DERP map files (YAML/JSON, headscale's ``derp.paths``), absolute.
            The fleet's own regions (``derp_regions``) are added to headscale's paths too.
    """

    embedded: bool = True
    stun_listen: str = "0.0.0.0:3478"
    region_id: int = 999
    region_code: str = "fleet"
    region_name: str = "Fleet embedded DERP"
    ipv4: str = ""
    extra_maps: Tuple[Path, ...] = ()


@dataclass(frozen=True)
class ServerConfig:
    """The Headscale control server.

    Attributes:
        url: URL every machine reaches the server at (headscale ``server_url``).
        listen: HTTP(S) listen address ``host:port`` (``listen_addr``).
        grpc_listen: gRPC listen address (``grpc_listen_addr``); the fleet tool itself talks
            to headscale over its unix socket.
        metrics_listen: Prometheus metrics/debug listen address (``metrics_listen_addr``);
            "" (the default) = off.
        tls: see :class:`TlsConfig`.
        derp: see :class:`DerpConfig`.
        prefixes_v4: overlay IPv4 prefix.
        prefixes_v6: overlay IPv6 prefix.
    """

    url: str
    listen: str
    grpc_listen: str = "127.0.0.1:50443"
    metrics_listen: str = ""
    tls: TlsConfig = field(default_factory=TlsConfig)
    derp: DerpConfig = field(default_factory=DerpConfig)
    prefixes_v4: str = "100.64.0.0/10"
    prefixes_v6: str = "fd7a:115c:a1e0::/48"

    @property
    def host(self) -> str:
        """Host part of :attr:`url` (name or IP address, no brackets)."""
        return urlsplit(self.url).hostname or ""


@dataclass(frozen=True)
class KeysConfig:
    """Key lifetimes, all in seconds.

    Attributes:
        auth_key_expiry: lifetime of a pre-auth key written into a bundle.
        node_expiry: lifetime of an enrolled node's key (0 = never expires).
        reusable: pre-auth keys may enrol more than once (default single-use).
    """

    auth_key_expiry: int = 24 * 3600
    node_expiry: int = 0
    reusable: bool = False


@dataclass(frozen=True)
class FleetConfig:
    """A validated fleet file.

    Attributes:
        path: the fleet file (absolute) or "<dict>" when built from a mapping.
        name: fleet name, a DNS label; also the headscale user that owns the fleet's tags.
        base_domain: MagicDNS base domain; overlay name = ``<host>.<base_domain>``.
        server: see :class:`ServerConfig`.
        keys: see :class:`KeysConfig`.
        teams: teams by name, in file order.
        log_level: headscale log level.
        relays: peer relays by host name (the ``relays`` section; see fleet/relays.py).
        derp_regions: the fleet's own DERP regions by code (the ``derp_regions`` section; see
            fleet/derp.py).
    """

    path: str
    name: str
    base_domain: str
    server: ServerConfig
    keys: KeysConfig
    teams: Dict[str, Team]
    log_level: str = "info"
    relays: Dict[str, Relay] = field(default_factory=dict)
    derp_regions: Dict[str, DerpRegion] = field(default_factory=dict)

    @property
    def hosts(self) -> Dict[str, Host]:
        """Every host by short name, teams in file order."""
        return {h.name: h for t in self.teams.values() for h in t.hosts}

    def host(self, name: str) -> Host:
        """The host called ``name``; FleetError naming it when it is not in the fleet file."""
        try:
            return self.hosts[name]
        except KeyError:
            raise FleetError("not in the fleet file (known hosts: "
                             f"{', '.join(sorted(self.hosts)) or 'none'})",
                             file=self.path, host=name) from None

    def host_tags(self, name: str) -> List[str]:
        """ACL tags for host ``name``: its team tag (machine or operator), its role tag and,
        for a relay host, ``tag:relay`` and ``tag:relay-<name>``; for a derper host, ``tag:derp``."""
        host = self.host(name)
        team = self.teams[host.team]
        team_tag = team.operator_tag if host.role == "operator" else team.machine_tag
        return ([team_tag, ROLE_TAGS[host.role]] + relay_tags(self.relays, host.name)
                + derp_tags(self.derp_regions, host.name))
