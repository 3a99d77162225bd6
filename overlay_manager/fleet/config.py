"""Fleet file (YAML) -> validated :class:`FleetConfig`.

The fleet file describes one overlay: its name and MagicDNS base domain, the Headscale control
server (URL, listen addresses, TLS, embedded DERP/STUN), key lifetimes and the teams with their
robots, base stations and operators. ``config/fleet.example.yaml`` is the commented reference.

Every problem in the file is a :class:`~overlay_manager.core.validation.ConfigError` naming the file,
the key (dotted path) and, where it is about one machine, the host. Unknown and duplicate keys
are errors, so typos do not silently fall back to defaults. :class:`FleetError` is for what goes
wrong later (deployment, headscale, a host name given on the command line).

This module reads the top level (fleet name, base domain, keys, log level) and puts the file
together; the sections have their own modules: ``server`` in :mod:`.server`, ``teams`` and
``hosts`` in :mod:`.teams`, ``relays`` in :mod:`.relays`, ``derp_regions`` in :mod:`.derp`. The
values are in :mod:`.model`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional, Union

from overlay_manager.core.validation import MISSING, ConfigError, Reader, is_dns_label, is_domain, load_yaml, shorten
from overlay_manager.fleet.derp import parse_derp_regions
from overlay_manager.fleet.model import (
    FleetConfig,
    KeysConfig,
)
from overlay_manager.fleet.relays import parse_relays
from overlay_manager.fleet.server import load_server
from overlay_manager.fleet.teams import load_teams

_DURATION_RE = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_MAX_DURATION_S = 100 * 365 * 86400


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
                             "log_level", "relays", "derp_regions"}, what="a mapping (see config/fleet.example.yaml)")
    if not m:
        raise r.error("(top level)", "empty fleet file")

    name = r.string(m.get("fleet", MISSING), "fleet")
    if not is_dns_label(name):
        raise r.error("fleet", f"fleet name must be a DNS label, got {shorten(name)}")
    base_domain = r.string(m.get("base_domain", MISSING), "base_domain").rstrip(".")
    if not is_domain(base_domain):
        raise r.error("base_domain", f"expected a domain like fleet.internal, got {shorten(base_domain)}")

    server = load_server(r, m.get("server", MISSING), base)
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

    teams = load_teams(r, m.get("teams"), m.get("hosts"))
    all_hosts = {h.name: h for t in teams.values() for h in t.hosts}
    relays = parse_relays(r, m.get("relays"), all_hosts, list(teams))
    regions = parse_derp_regions(r, m.get("derp_regions"), all_hosts,
                                 server.derp.region_id if server.derp.embedded else None)
    if not server.derp.embedded and not server.derp.extra_maps and not regions:
        raise r.error("server.derp", "embedded: false needs derp_regions or extra_maps (no public DERP "
                                     "map is used, so machines would have no relay at all)")
    if regions and not (server.url.startswith("https://") and server.tls.generate):
        raise r.error("derp_regions", "the fleet CA signs the derpers' certificates: needs an https "
                                      "server.url with server.tls.generate: true")
    return FleetConfig(path=path, name=name, base_domain=base_domain, server=server, keys=keys,
                       teams=teams, log_level=log_level, relays=relays, derp_regions=regions)


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
