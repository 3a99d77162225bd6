"""Fleet file (YAML) -> validated :class:`FleetConfig`.

The fleet file describes one overlay: its name and MagicDNS base domain, the Headscale control
server (URL, listen addresses, TLS, embedded DERP/STUN), key lifetimes and the teams with their
robots, base stations and operators. ``config/fleet.example.yaml`` is the commented reference.

Every problem is a :class:`FleetError` naming the file, the key (dotted path) and, where it is
about one machine, the host. Unknown keys are errors, so typos do not silently fall back to
defaults.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

#: Host roles, in the order they appear in a team.
ROLES: tuple[str, ...] = ("robot", "base_station", "operator")

#: Role -> role tag (an ACL tag that only labels the machine; access is granted by team tags).
ROLE_TAGS: dict[str, str] = {
    "robot": "tag:robot",
    "base_station": "tag:base-station",
    "operator": "tag:operator",
}

_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_DURATION_RE = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class FleetError(Exception):
    """A fleet file, deployment or headscale operation failed.

    The message names the file, the key and/or the host concerned. It never contains a
    pre-auth key.

    Attributes:
        file: the file concerned ("" if none).
        key: dotted path of the offending key in that file ("" if none).
        host: the host concerned ("" if none).
        reason: the bare reason without the location prefix.
    """

    def __init__(self, reason: str, *, file: str | Path = "", key: str = "", host: str = "") -> None:
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
    hosts: tuple[Host, ...]

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
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    names: tuple[str, ...] = ()
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
    extra_maps: tuple[Path, ...] = ()


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
    """

    path: str
    name: str
    base_domain: str
    server: ServerConfig
    keys: KeysConfig
    teams: dict[str, Team]
    log_level: str = "info"

    @property
    def hosts(self) -> dict[str, Host]:
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

    def host_tags(self, name: str) -> list[str]:
        """ACL tags for host ``name``: its team tag (machine or operator) and its role tag."""
        host = self.host(name)
        team = self.teams[host.team]
        team_tag = team.operator_tag if host.role == "operator" else team.machine_tag
        return [team_tag, ROLE_TAGS[host.role]]


def parse_duration(value: Any, *, file: str = "", key: str = "") -> int:
    """Seconds from ``value``: an int (seconds) or a string like "90s", "30m", "24h", "7d", "2w"."""
    if isinstance(value, bool):
        raise FleetError(f"expected a duration like '24h', got {value!r}", file=file, key=key)
    if isinstance(value, int):
        if value < 0:
            raise FleetError("duration must not be negative", file=file, key=key)
        return value
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m:
            return int(m.group(1)) * _DURATION_UNITS[m.group(2)]
    raise FleetError(f"expected a duration like '24h', '30m', '7d' or seconds, got {value!r}",
                     file=file, key=key)


def is_dns_label(name: str) -> bool:
    """True when ``name`` is a lowercase DNS label: [a-z0-9-], 1..63, no leading/trailing '-'."""
    return isinstance(name, str) and bool(_LABEL_RE.match(name))


def is_domain(name: str) -> bool:
    """True when ``name`` is dot-separated DNS labels (at least two), lowercase."""
    if not isinstance(name, str) or len(name) > 253:
        return False
    parts = name.split(".")
    return len(parts) >= 2 and all(is_dns_label(p) for p in parts)


class _Reader:
    """Typed access to a YAML mapping with errors naming file and dotted key."""

    def __init__(self, file: str) -> None:
        self.file = file

    def err(self, key: str, reason: str, host: str = "") -> FleetError:
        return FleetError(reason, file=self.file, key=key, host=host)

    def mapping(self, value: Any, key: str, allowed: set[str]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.err(key, f"expected a mapping, got {type(value).__name__}")
        for k in value:
            if not isinstance(k, str) or k not in allowed:
                where = f"{key}.{k}" if key else str(k)
                raise self.err(where, f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return value

    def string(self, m: dict[str, Any], name: str, key: str, default: str | None = None) -> str:
        v = m.get(name, default)
        if v is None:
            raise self.err(key, "required")
        if not isinstance(v, str):
            raise self.err(key, f"expected a string, got {v!r}")
        return v

    def integer(self, m: dict[str, Any], name: str, key: str, default: int, lo: int, hi: int) -> int:
        v = m.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.err(key, f"expected an integer in [{lo}, {hi}], got {v!r}")
        return v

    def boolean(self, m: dict[str, Any], name: str, key: str, default: bool) -> bool:
        v = m.get(name, default)
        if not isinstance(v, bool):
            raise self.err(key, f"expected true or false, got {v!r}")
        return v

    def hostport(self, m: dict[str, Any], name: str, key: str, default: str) -> str:
        v = self.string(m, name, key, default)
        host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise self.err(key, f"expected host:port, got {v!r}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if host:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                if not is_domain(host) and not is_dns_label(host):
                    raise self.err(key, f"bad host in {v!r}") from None
        return v

    def path(self, m: dict[str, Any], name: str, key: str, base: Path) -> Path | None:
        v = m.get(name)
        if v in (None, ""):
            return None
        if not isinstance(v, str):
            raise self.err(key, f"expected a file path, got {v!r}")
        p = Path(v).expanduser()
        return p if p.is_absolute() else (base / p).resolve()


def _load_server(r: _Reader, raw: Any, base: Path) -> ServerConfig:
    m = r.mapping(raw, "server", {"url", "listen", "grpc_listen", "metrics_listen", "tls", "derp",
                                  "prefixes"})
    url = r.string(m, "url", "server.url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise r.err("server.url", f"expected https://HOST:PORT (or http://), got {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise r.err("server.url", "must not have a path, query or fragment")
    try:
        _ = parts.port
    except ValueError:
        raise r.err("server.url", f"bad port in {url!r}") from None
    default_port = parts.port or (443 if parts.scheme == "https" else 80)
    listen = r.hostport(m, "listen", "server.listen", f"0.0.0.0:{default_port}")

    t = r.mapping(m.get("tls"), "server.tls", {"generate", "cert", "key", "ca", "names", "days"})
    names = t.get("names", [])
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise r.err("server.tls.names", "expected a list of DNS names or IP addresses")
    tls = TlsConfig(
        generate=r.boolean(t, "generate", "server.tls.generate", True),
        cert=r.path(t, "cert", "server.tls.cert", base),
        key=r.path(t, "key", "server.tls.key", base),
        ca=r.path(t, "ca", "server.tls.ca", base),
        names=tuple(names),
        days=r.integer(t, "days", "server.tls.days", 825, 1, 36500),
    )
    if parts.scheme == "https" and not tls.generate and (tls.cert is None or tls.key is None):
        raise r.err("server.tls", "with generate: false, give cert and key (PEM files)")
    if parts.scheme == "http" and (tls.cert or tls.key or tls.ca):
        raise r.err("server.tls", "cert/key/ca given but server.url is http://")

    d = r.mapping(m.get("derp"), "server.derp", {"embedded", "stun_listen", "region_id",
                                                 "region_code", "region_name", "ipv4",
                                                 "extra_maps"})
    extra = d.get("extra_maps", [])
    if not isinstance(extra, list) or not all(isinstance(x, str) and x for x in extra):
        raise r.err("server.derp.extra_maps", "expected a list of DERP map file paths")
    ipv4 = r.string(d, "ipv4", "server.derp.ipv4", "")
    if ipv4:
        try:
            ipaddress.IPv4Address(ipv4)
        except ValueError:
            raise r.err("server.derp.ipv4", f"expected an IPv4 address, got {ipv4!r}") from None
    derp = DerpConfig(
        embedded=r.boolean(d, "embedded", "server.derp.embedded", True),
        stun_listen=r.hostport(d, "stun_listen", "server.derp.stun_listen", "0.0.0.0:3478"),
        region_id=r.integer(d, "region_id", "server.derp.region_id", 999, 900, 999),
        region_code=r.string(d, "region_code", "server.derp.region_code", "fleet"),
        region_name=r.string(d, "region_name", "server.derp.region_name", "Fleet embedded DERP"),
        ipv4=ipv4,
        extra_maps=tuple(Path(x) if Path(x).is_absolute() else (base / x).resolve() for x in extra),
    )
    if not derp.embedded and not derp.extra_maps:
        raise r.err("server.derp", "embedded: false needs extra_maps (no public DERP map is used)")

    p = r.mapping(m.get("prefixes"), "server.prefixes", {"v4", "v6"})
    v4 = r.string(p, "v4", "server.prefixes.v4", "100.64.0.0/10")
    v6 = r.string(p, "v6", "server.prefixes.v6", "fd7a:115c:a1e0::/48")
    for k, v, ver in (("v4", v4, 4), ("v6", v6, 6)):
        try:
            if ipaddress.ip_network(v).version != ver:
                raise ValueError
        except ValueError:
            raise r.err(f"server.prefixes.{k}", f"expected an IPv{ver} prefix, got {v!r}") from None
    return ServerConfig(
        url=url.rstrip("/"),
        listen=listen,
        grpc_listen=r.hostport(m, "grpc_listen", "server.grpc_listen", "127.0.0.1:50443"),
        metrics_listen=(r.hostport(m, "metrics_listen", "server.metrics_listen", "")
                        if m.get("metrics_listen") else ""),
        tls=tls,
        derp=derp,
        prefixes_v4=v4,
        prefixes_v6=v6,
    )


def _host_entry(r: _Reader, raw: Any, key: str) -> tuple[str, int]:
    """(name, master_port) from a host entry: "name" or {name: ..., master_port: ...}."""
    if isinstance(raw, str):
        name, port = raw, 11311
    else:
        m = r.mapping(raw, key, {"name", "master_port"})
        name = r.string(m, "name", f"{key}.name")
        port = r.integer(m, "master_port", f"{key}.master_port", 11311, 1, 65535)
    if not is_dns_label(name):
        raise r.err(key, "not a valid DNS label: use a-z, 0-9 and '-', 1 to 63 characters, "
                         "not starting or ending with '-'", host=str(name))
    return name, port


def load_fleet_dict(data: Any, path: str = "<dict>", base: Path | None = None) -> FleetConfig:
    """Validate an already-parsed fleet file.

    Args:
        data: the parsed YAML document.
        path: file name used in error messages and stored in :attr:`FleetConfig.path`.
        base: directory relative paths (TLS files, DERP maps) are resolved against
            (default: the current directory).
    """
    r = _Reader(path)
    base = base or Path.cwd()
    m = r.mapping(data, "", {"fleet", "base_domain", "server", "keys", "teams", "hosts",
                             "log_level"})
    if not m:
        raise r.err("", "empty fleet file")

    name = r.string(m, "fleet", "fleet")
    if not is_dns_label(name):
        raise r.err("fleet", f"fleet name must be a DNS label, got {name!r}")
    base_domain = r.string(m, "base_domain", "base_domain").rstrip(".")
    if not is_domain(base_domain):
        raise r.err("base_domain", f"expected a domain like fleet.internal, got {base_domain!r}")

    server = _load_server(r, m.get("server"), base)
    shost = server.host.lower().rstrip(".")
    if shost == base_domain or shost.endswith("." + base_domain):
        raise r.err("base_domain",
                    f"base domain {base_domain!r} must differ from the server's domain "
                    f"({shost!r} in server.url): headscale refuses a server inside its MagicDNS "
                    "domain, because robots could no longer reach it")

    k = r.mapping(m.get("keys"), "keys", {"auth_key_expiry", "node_expiry", "reusable"})
    keys = KeysConfig(
        auth_key_expiry=parse_duration(k.get("auth_key_expiry", "24h"), file=path,
                                       key="keys.auth_key_expiry"),
        node_expiry=parse_duration(k.get("node_expiry", 0), file=path, key="keys.node_expiry"),
        reusable=r.boolean(k, "reusable", "keys.reusable", False),
    )
    if keys.auth_key_expiry < 60:
        raise r.err("keys.auth_key_expiry", "must be at least 1m")

    log_level = r.string(m, "log_level", "log_level", "info")
    if log_level not in ("trace", "debug", "info", "warn", "error"):
        raise r.err("log_level", "expected trace, debug, info, warn or error")

    # Collect hosts: from teams.<t>.{robots,base_stations,operators} and from hosts.<name>.
    raw_teams = m.get("teams")
    if not isinstance(raw_teams, dict) or not raw_teams:
        raise r.err("teams", "required: a mapping of team name -> {master, robots, "
                             "base_stations, operators}")
    members: dict[str, list[Host]] = {}
    masters: dict[str, str] = {}
    seen: dict[str, str] = {}

    def add(host: Host, key: str) -> None:
        if host.name in seen:
            raise r.err(key, f"duplicate host name (also at {seen[host.name]})", host=host.name)
        seen[host.name] = key
        members[host.team].append(host)

    for tname, traw in raw_teams.items():
        tkey = f"teams.{tname}"
        if not isinstance(tname, str) or not is_dns_label(tname):
            raise r.err(tkey, "team name must be a DNS label")
        tm = r.mapping(traw, tkey, {"master", "robots", "base_stations", "operators"})
        members[tname] = []
        if "master" in tm:
            masters[tname] = r.string(tm, "master", f"{tkey}.master")
        for role in ROLES:
            lst = tm.get(role + "s", [])
            if not isinstance(lst, list):
                raise r.err(f"{tkey}.{role}s", "expected a list of host names")
            for i, entry in enumerate(lst):
                hkey = f"{tkey}.{role}s[{i}]"
                hname, port = _host_entry(r, entry, hkey)
                add(Host(hname, tname, role, port), hkey)

    hosts_raw = r.mapping(m.get("hosts"), "hosts", set(m.get("hosts") or {}))
    for hname, hraw in hosts_raw.items():
        hkey = f"hosts.{hname}"
        if not is_dns_label(hname):
            raise r.err(hkey, "not a valid DNS label: use a-z, 0-9 and '-', 1 to 63 characters, "
                              "not starting or ending with '-'", host=str(hname))
        hm = r.mapping(hraw, hkey, {"team", "role", "master_port"})
        team = r.string(hm, "team", f"{hkey}.team")
        if team not in members:
            raise r.err(f"{hkey}.team", f"unknown team {team!r} (teams: {', '.join(members)})",
                        host=hname)
        role = r.string(hm, "role", f"{hkey}.role", "robot")
        if role not in ROLES:
            raise r.err(f"{hkey}.role", f"expected one of {', '.join(ROLES)}", host=hname)
        port = r.integer(hm, "master_port", f"{hkey}.master_port", 11311, 1, 65535)
        add(Host(hname, team, role, port), hkey)

    teams: dict[str, Team] = {}
    for tname, hosts in members.items():
        if not hosts:
            raise r.err(f"teams.{tname}", "team has no hosts")
        hosts.sort(key=lambda h: ROLES.index(h.role))
        master = masters.get(tname)
        if master is None:
            machines = [h for h in hosts if h.role != "operator"]
            if not machines:
                raise r.err(f"teams.{tname}.master", "required when a team has only operators")
            master = machines[0].name
        else:
            if master not in seen:
                raise r.err(f"teams.{tname}.master", f"unknown host {master!r}", host=master)
            if all(h.name != master for h in hosts):
                raise r.err(f"teams.{tname}.master", "host is not in this team", host=master)
        teams[tname] = Team(tname, master, tuple(hosts))

    return FleetConfig(path=path, name=name, base_domain=base_domain, server=server, keys=keys,
                       teams=teams, log_level=log_level)


def load_fleet(path: str | Path) -> FleetConfig:
    """Read and validate the fleet file at ``path``.

    Relative paths inside the file are relative to the file's directory.

    Raises:
        FleetError: unreadable file, bad YAML, or any invalid key (the error names file, key
            and host).
    """
    p = Path(path).expanduser().resolve()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise FleetError(f"cannot read: {e.strerror}", file=p) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FleetError(f"not valid YAML: {e}", file=p) from None
    return load_fleet_dict(data, str(p), p.parent)
