"""Fleet file (YAML) -> validated :class:`FleetConfig`.

The fleet file describes one overlay: its name and MagicDNS base domain, the Headscale control
server (URL, listen addresses, TLS, embedded DERP/STUN), key lifetimes and the teams with their
robots, base stations and operators. ``config/fleet.example.yaml`` is the commented reference.

Every problem in the file is a :class:`~overlay_manager.validation.ConfigError` naming the file,
the key (dotted path) and, where it is about one machine, the host. Unknown and duplicate keys
are errors, so typos do not silently fall back to defaults. :class:`FleetError` is for what goes
wrong later (deployment, headscale, a host name given on the command line).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union
from urllib.parse import urlsplit

from ..validation import (
    MISSING,
    ConfigError,
    Reader,
    is_dns_label,
    is_domain,
    join_key,
    load_yaml,
    shorten,
    type_name,
)
from .relays import Relay, parse_relays, relay_tags

#: Host roles, in the order they appear in a team.
ROLES: Tuple[str, ...] = ("robot", "base_station", "operator")

#: Role -> role tag (an ACL tag that only labels the machine; access is granted by team tags).
ROLE_TAGS: Dict[str, str] = {
    "robot": "tag:robot",
    "base_station": "tag:base-station",
    "operator": "tag:operator",
}

_DURATION_RE = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


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
        days: validity of the generated CA and server certificate, in days.
    """

    generate: bool = True
    cert: Optional[Path] = None
    key: Optional[Path] = None
    ca: Optional[Path] = None
    names: Tuple[str, ...] = ()
    days: int = 825


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
    """

    path: str
    name: str
    base_domain: str
    server: ServerConfig
    keys: KeysConfig
    teams: Dict[str, Team]
    log_level: str = "info"
    relays: Dict[str, Relay] = field(default_factory=dict)

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
        for a relay host, ``tag:relay`` and ``tag:relay-<name>``."""
        host = self.host(name)
        team = self.teams[host.team]
        team_tag = team.operator_tag if host.role == "operator" else team.machine_tag
        return [team_tag, ROLE_TAGS[host.role]] + relay_tags(self.relays, host.name)


def parse_duration(value: Any, *, file: str = "", key: str = "") -> int:
    """Seconds from ``value``: an int (seconds) or a string like "90s", "30m", "24h", "7d", "2w".

    Raises:
        ConfigError: naming ``file`` and ``key``.
    """
    if isinstance(value, bool):
        raise ConfigError(file, key, f"expected a duration like '24h', got {shorten(value)}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(file, key, "duration must not be negative")
        if value > _MAX_DURATION_S:
            raise ConfigError(file, key, f"duration {shorten(value)} s is longer than 100 years")
        return value
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m and len(m.group(1)) <= 12:
            seconds = int(m.group(1)) * _DURATION_UNITS[m.group(2)]
            if seconds <= _MAX_DURATION_S:
                return seconds
    raise ConfigError(file, key, f"expected a duration like '24h', '30m', '7d' or seconds, got {shorten(value)}")


_MAX_DURATION_S = 100 * 365 * 86400
_LABEL_HINT = "not a valid DNS label: use a-z, 0-9 and '-', 1 to 63 characters, not starting or ending with '-'"


def _load_server(r: Reader, raw: Any, base: Path) -> ServerConfig:
    m = r.mapping(raw, "server", {"url", "listen", "grpc_listen", "metrics_listen", "tls", "derp",
                                  "prefixes"})
    url = r.url(m.get("url", MISSING), "server.url")
    parts = urlsplit(url)
    default_port = parts.port or (443 if parts.scheme == "https" else 80)
    listen = r.hostport(m.get("listen", MISSING), "server.listen", f"0.0.0.0:{default_port}")

    t = r.mapping(m.get("tls"), "server.tls", {"generate", "cert", "key", "ca", "names", "days"})
    names = r.string_list(t.get("names", MISSING), "server.tls.names", [])
    for i, n in enumerate(names):
        if not _is_san(n):
            raise r.error(f"server.tls.names[{i}]", f"{shorten(n)} is not a DNS name or IP address")

    def path(name: str) -> Optional[Path]:
        p = r.path(t.get(name), f"server.tls.{name}", base)
        return Path(p) if p else None

    tls = TlsConfig(
        generate=r.boolean(t.get("generate", MISSING), "server.tls.generate", True),
        cert=path("cert"),
        key=path("key"),
        ca=path("ca"),
        names=tuple(names),
        days=r.integer(t.get("days", MISSING), "server.tls.days", 825, lo=1, hi=36500),
    )
    if parts.scheme == "https" and not tls.generate and (tls.cert is None or tls.key is None):
        raise r.error("server.tls", "with generate: false, give cert and key (PEM files)")
    if parts.scheme == "http" and (tls.cert or tls.key or tls.ca):
        raise r.error("server.tls", "cert/key/ca given but server.url is http://")

    d = r.mapping(m.get("derp"), "server.derp", {"embedded", "stun_listen", "region_id",
                                                 "region_code", "region_name", "ipv4",
                                                 "extra_maps"})
    extra = r.string_list(d.get("extra_maps", MISSING), "server.derp.extra_maps", [])
    ipv4 = r.string(d.get("ipv4", MISSING), "server.derp.ipv4", "")
    if ipv4:
        try:
            ipaddress.IPv4Address(ipv4)
        except ValueError:
            raise r.error("server.derp.ipv4", f"expected an IPv4 address, got {shorten(ipv4)}") from None
    derp = DerpConfig(
        embedded=r.boolean(d.get("embedded", MISSING), "server.derp.embedded", True),
        stun_listen=r.hostport(d.get("stun_listen", MISSING), "server.derp.stun_listen", "0.0.0.0:3478"),
        region_id=r.integer(d.get("region_id", MISSING), "server.derp.region_id", 999, lo=900, hi=999),
        region_code=r.string(d.get("region_code", MISSING), "server.derp.region_code", "fleet",
                             empty=False, max_len=32),
        region_name=r.string(d.get("region_name", MISSING), "server.derp.region_name",
                             "Fleet embedded DERP", empty=False, max_len=128),
        ipv4=ipv4,
        extra_maps=tuple(Path(r.path(x, f"server.derp.extra_maps[{i}]", base)) for i, x in enumerate(extra)),
    )
    if not derp.embedded and not derp.extra_maps:
        raise r.error("server.derp", "embedded: false needs extra_maps (no public DERP map is used)")

    p = r.mapping(m.get("prefixes"), "server.prefixes", {"v4", "v6"})
    v4 = r.string(p.get("v4", MISSING), "server.prefixes.v4", "100.64.0.0/10")
    v6 = r.string(p.get("v6", MISSING), "server.prefixes.v6", "fd7a:115c:a1e0::/48")
    for k, v, ver in (("v4", v4, 4), ("v6", v6, 6)):
        try:
            if ipaddress.ip_network(v).version != ver:
                raise ValueError
        except ValueError:
            raise r.error(f"server.prefixes.{k}", f"expected an IPv{ver} prefix, got {shorten(v)}") from None
    metrics = m.get("metrics_listen")
    return ServerConfig(
        url=url,
        listen=listen,
        grpc_listen=r.hostport(m.get("grpc_listen", MISSING), "server.grpc_listen", "127.0.0.1:50443"),
        metrics_listen=r.hostport(metrics, "server.metrics_listen") if metrics else "",
        tls=tls,
        derp=derp,
        prefixes_v4=v4,
        prefixes_v6=v6,
    )


def _is_san(name: str) -> bool:
    """True for a certificate subject alternative name: an IP address or a DNS name."""
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return is_domain(name.lower().rstrip(".").replace("*.", "", 1), 1)


def _host_entry(r: Reader, raw: Any, key: str) -> Tuple[str, int]:
    """(name, master_port) from a host entry: "name" or {name: ..., master_port: ...}."""
    if isinstance(raw, str):
        name, port = raw, 11311
    else:
        m = r.mapping(raw, key, {"name", "master_port"}, what="a host name or {name, master_port}")
        name = r.string(m.get("name", MISSING), f"{key}.name")
        port = r.port(m.get("master_port", MISSING), f"{key}.master_port", 11311)
    if not is_dns_label(name):
        raise r.error(key, _LABEL_HINT, host=name)
    return name, port


def load_fleet_dict(data: Any, path: str = "<dict>", base: Optional[Path] = None) -> FleetConfig:
    """Validate an already-parsed fleet file.

    Args:
        data: the parsed YAML document.
        path: file name used in error messages and stored in :attr:`FleetConfig.path`.
        base: directory relative paths (TLS files, DERP maps) are resolved against
            (default: the current directory).

    Raises:
        ConfigError: naming ``path``, the key and (where it is about one machine) the host.
    """
    r = Reader(path)
    base = base or Path.cwd()
    m = r.mapping(data, "", {"fleet", "base_domain", "server", "keys", "teams", "hosts",
                             "log_level", "relays"}, what="a mapping (see config/fleet.example.yaml)")
    if not m:
        raise r.error("(top level)", "empty fleet file")

    name = r.string(m.get("fleet", MISSING), "fleet")
    if not is_dns_label(name):
        raise r.error("fleet", f"fleet name must be a DNS label, got {shorten(name)}")
    base_domain = r.string(m.get("base_domain", MISSING), "base_domain").rstrip(".")
    if not is_domain(base_domain):
        raise r.error("base_domain", f"expected a domain like fleet.internal, got {shorten(base_domain)}")

    server = _load_server(r, m.get("server", MISSING), base)
    shost = server.host.lower().rstrip(".")
    if shost == base_domain or shost.endswith("." + base_domain):
        raise r.error("base_domain",
                      f"base domain {base_domain!r} must differ from the server's domain "
                      f"({shost!r} in server.url): headscale refuses a server inside its MagicDNS "
                      "domain, because robots could no longer reach it")

    k = r.mapping(m.get("keys"), "keys", {"auth_key_expiry", "node_expiry", "reusable"})
    keys = KeysConfig(
        auth_key_expiry=parse_duration(k.get("auth_key_expiry", "24h"), file=path,
                                       key="keys.auth_key_expiry"),
        node_expiry=parse_duration(k.get("node_expiry", 0), file=path, key="keys.node_expiry"),
        reusable=r.boolean(k.get("reusable", MISSING), "keys.reusable", False),
    )
    if keys.auth_key_expiry < 60:
        raise r.error("keys.auth_key_expiry", "must be at least 1m")

    log_level = r.choice(m.get("log_level", MISSING), "log_level",
                         ("trace", "debug", "info", "warn", "error"), "info")

    # Collect hosts: from teams.<t>.{robots,base_stations,operators} and from hosts.<name>.
    raw_teams = m.get("teams")
    if not isinstance(raw_teams, dict) or not raw_teams:
        raise r.error("teams", "required: a mapping of team name -> {master, robots, "
                               f"base_stations, operators}}, got {type_name(raw_teams)}")
    r.mapping(raw_teams, "teams")  # string keys only
    members: Dict[str, List[Host]] = {}
    masters: Dict[str, str] = {}
    seen: Dict[str, str] = {}

    def add(host: Host, key: str) -> None:
        if host.name in seen:
            raise r.error(key, f"duplicate host name (also at {seen[host.name]})", host=host.name)
        seen[host.name] = key
        members[host.team].append(host)

    for tname, traw in raw_teams.items():
        tkey = f"teams.{tname}"
        if not is_dns_label(tname):
            raise r.error(join_key("teams", tname), "team name must be a DNS label")
        tm = r.mapping(traw, tkey, {"master", "robots", "base_stations", "operators"})
        members[tname] = []
        if "master" in tm:
            masters[tname] = r.string(tm["master"], f"{tkey}.master")
        for role in ROLES:
            lst = tm.get(role + "s", [])
            if lst is None:
                lst = []
            if not isinstance(lst, list):
                raise r.error(f"{tkey}.{role}s", f"expected a list of host names, got {type_name(lst)}")
            for i, entry in enumerate(lst):
                hkey = f"{tkey}.{role}s[{i}]"
                hname, port = _host_entry(r, entry, hkey)
                add(Host(hname, tname, role, port), hkey)

    hosts_raw = r.mapping(m.get("hosts"), "hosts", what="a mapping of host name -> {team, role, master_port}")
    for hname, hraw in hosts_raw.items():
        hkey = join_key("hosts", hname)
        if not is_dns_label(hname):
            raise r.error(hkey, _LABEL_HINT, host=hname)
        hm = r.mapping(hraw, hkey, {"team", "role", "master_port"})
        team = r.string(hm.get("team", MISSING), f"{hkey}.team")
        if team not in members:
            raise r.error(f"{hkey}.team", f"unknown team {shorten(team)} (teams: {', '.join(members)})",
                          host=hname)
        role = r.string(hm.get("role", MISSING), f"{hkey}.role", "robot")
        if role not in ROLES:
            raise r.error(f"{hkey}.role", f"expected one of {', '.join(ROLES)}, got {shorten(role)}", host=hname)
        port = r.port(hm.get("master_port", MISSING), f"{hkey}.master_port", 11311)
        add(Host(hname, team, role, port), hkey)

    teams: Dict[str, Team] = {}
    for tname, hosts in members.items():
        if not hosts:
            raise r.error(f"teams.{tname}", "team has no hosts")
        hosts.sort(key=lambda h: ROLES.index(h.role))
        master = masters.get(tname)
        if master is None:
            machines = [h for h in hosts if h.role != "operator"]
            if not machines:
                raise r.error(f"teams.{tname}.master", "required when a team has only operators")
            master = machines[0].name
        else:
            if master not in seen:
                raise r.error(f"teams.{tname}.master", f"unknown host {shorten(master)}", host=master)
            if all(h.name != master for h in hosts):
                raise r.error(f"teams.{tname}.master", "host is not in this team", host=master)
        teams[tname] = Team(tname, master, tuple(hosts))

    relays = parse_relays(r, m.get("relays"), {h.name: h for t in teams.values() for h in t.hosts},
                          list(teams))
    return FleetConfig(path=path, name=name, base_domain=base_domain, server=server, keys=keys,
                       teams=teams, log_level=log_level, relays=relays)


def load_fleet(path: Union[str, Path]) -> FleetConfig:
    """Read and validate the fleet file at ``path``.

    Relative paths inside the file are relative to the file's directory.

    Raises:
        ConfigError: missing, unreadable, binary or not a file, bad YAML, duplicate keys, or
            any invalid key (the error names file, key and host).
    """
    p = Path(path).expanduser().resolve()
    data = load_yaml(p)
    return load_fleet_dict(data, str(p), p.parent)
