"""Robot config YAML -> validated RobotConfig. Every error names the file and the key.

The reference for every key is config/robot.example.yaml. Relative paths (auth_key_file,
ca_cert) are resolved against the config file's directory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
TAG = re.compile(r"^tag:[A-Za-z0-9][A-Za-z0-9_-]*$")


class ConfigError(ValueError):
    """A config file (or parameter) is wrong. str() names the file and the key."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        super().__init__(f"{source}: {key}: {problem}")
        self.source = source
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class TailscaleSettings:
    """How to reach tailscaled."""

    socket: str = "/var/run/tailscale/tailscaled.sock"  # LocalAPI unix socket
    cli: str = "tailscale"                                # CLI for `up` and `netcheck`
    accept_dns: bool = False                              # let tailscaled manage DNS
    up_timeout: float = 30.0                              # seconds for enrolment


@dataclass(frozen=True)
class NodeSettings:
    """Node behaviour; each key may be overridden by the node's ~private parameter of that name."""

    publish_rate: float = 1.0        # Hz, periodic republish of ~peers and ~status
    poll_rate: float = 4.0           # Hz, reads of tailscaled status
    ping_interval: float = 5.0       # s between disco pings to each watched peer; 0 = off
    watch_peers: Tuple[str, ...] = ()  # short names; () = every online peer
    manage_hosts: bool = False       # keep a managed overlay-names block in hosts_file
    hosts_file: str = "/etc/hosts"
    iperf_server: bool = True        # serve iperf3 on the overlay address
    iperf_port: int = 5201
    preflight_interval: float = 30.0  # s between preflight runs; 0 = at start and on demand only
    netcheck_interval: float = 60.0   # s between NAT checks (tailscale netcheck); 0 = at start only


@dataclass(frozen=True)
class RobotConfig:
    """One machine's overlay configuration."""

    source: str                      # the file it came from (for messages)
    hostname: str
    login_server: str
    base_domain: str
    master: str
    auth_key_file: str = ""
    tags: Tuple[str, ...] = ()
    ca_cert: str = ""
    master_port: int = 11311
    tailscale: TailscaleSettings = field(default_factory=TailscaleSettings)
    node: NodeSettings = field(default_factory=NodeSettings)

    @property
    def fqdn(self) -> str:
        """This machine's overlay name."""
        return f"{self.hostname}.{self.base_domain}"

    @property
    def master_fqdn(self) -> str:
        """The ROS master machine's overlay name."""
        return self.master if "." in self.master else f"{self.master}.{self.base_domain}"


def _type_name(t: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(t, str(t))


def _check(source: str, key: str, value: Any, want: Any) -> Any:
    """Value converted to type want, or ConfigError naming key."""
    if want is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if want is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if want in (bool, str) and isinstance(value, want):
        return value
    raise ConfigError(source, key, f"must be {_type_name(want)}, got {type(value).__name__} {value!r}")


def _section(source: str, prefix: str, raw: Any, cls: Any) -> Any:
    """Validate a nested mapping against a settings dataclass's fields."""
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(source, prefix, f"must be a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in fields(cls)}
    values: Dict[str, Any] = {}
    for key, value in raw.items():
        full = f"{prefix}.{key}"
        if key not in known:
            raise ConfigError(source, full, f"unknown key (known: {', '.join(sorted(known))})")
        default = getattr(cls(), key)
        if isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                raise ConfigError(source, full, "must be a list of strings")
            values[key] = tuple(value)
        else:
            values[key] = _check(source, full, value, type(default))
    obj = cls(**values)
    for f in fields(cls):
        v = getattr(obj, f.name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
            raise ConfigError(source, f"{prefix}.{f.name}", f"must not be negative, got {v}")
    return obj


_REQUIRED = ("hostname", "login_server", "base_domain", "master")
_OPTIONAL: Dict[str, Any] = {
    "auth_key_file": str, "tags": list, "ca_cert": str, "master_port": int,
    "tailscale": dict, "node": dict,
}


def parse_robot_config(raw: Any, source: str, base_dir: Optional[str] = None) -> RobotConfig:
    """Validate a loaded YAML mapping. base_dir resolves relative paths (default: source's dir)."""
    if not isinstance(raw, dict):
        raise ConfigError(source, "(top level)", "must be a mapping of keys to values")
    base = base_dir if base_dir is not None else os.path.dirname(os.path.abspath(source))
    for key in raw:
        if key not in _REQUIRED and key not in _OPTIONAL:
            known = ", ".join(list(_REQUIRED) + list(_OPTIONAL))
            raise ConfigError(source, str(key), f"unknown key (known: {known})")
    for key in _REQUIRED:
        if key not in raw or raw[key] in (None, ""):
            raise ConfigError(source, key, "missing (required)")
    hostname = _check(source, "hostname", raw["hostname"], str)
    if not DNS_LABEL.match(hostname):
        raise ConfigError(source, "hostname",
                          f"{hostname!r} is not a DNS label (lowercase a-z, 0-9, '-', at most 63)")
    login = _check(source, "login_server", raw["login_server"], str)
    if not re.match(r"^https?://[^/\s]+", login):
        raise ConfigError(source, "login_server", f"{login!r} is not an http(s) URL")
    base_domain = _check(source, "base_domain", raw["base_domain"], str).rstrip(".")
    if not all(DNS_LABEL.match(label) for label in base_domain.split(".")):
        raise ConfigError(source, "base_domain", f"{base_domain!r} is not a DNS domain")
    master = _check(source, "master", raw["master"], str).rstrip(".")
    if not all(DNS_LABEL.match(label) for label in master.split(".")):
        raise ConfigError(source, "master", f"{master!r} is not a short name or overlay name")
    tags: List[str] = []
    if raw.get("tags") is not None:
        if not isinstance(raw["tags"], list):
            raise ConfigError(source, "tags", "must be a list like [tag:robot]")
        for i, t in enumerate(raw["tags"]):
            if not isinstance(t, str) or not TAG.match(t):
                raise ConfigError(source, f"tags[{i}]", f"{t!r} is not an ACL tag like 'tag:robot'")
            tags.append(t)
    port = _check(source, "master_port", raw.get("master_port", 11311), int)
    if not 0 < port < 65536:
        raise ConfigError(source, "master_port", f"{port} is not a TCP port")

    def path(key: str) -> str:
        v = raw.get(key)
        if v in (None, ""):
            return ""
        v = _check(source, key, v, str)
        return v if os.path.isabs(v) else os.path.normpath(os.path.join(base, v))

    ts = _section(source, "tailscale", raw.get("tailscale"), TailscaleSettings)
    node = _section(source, "node", raw.get("node"), NodeSettings)
    if not 0 < node.iperf_port < 65536:
        raise ConfigError(source, "node.iperf_port", f"{node.iperf_port} is not a TCP port")
    if node.poll_rate <= 0:
        raise ConfigError(source, "node.poll_rate", "must be > 0")
    if node.publish_rate <= 0:
        raise ConfigError(source, "node.publish_rate", "must be > 0")
    return RobotConfig(
        source=source, hostname=hostname, login_server=login.rstrip("/"), base_domain=base_domain,
        master=master, auth_key_file=path("auth_key_file"), tags=tuple(tags),
        ca_cert=path("ca_cert"), master_port=port, tailscale=ts, node=node,
    )


def load_robot_config(path: str) -> RobotConfig:
    """Read and validate a robot config file."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(path, "(file)", "does not exist") from None
    except PermissionError:
        raise ConfigError(path, "(file)", "is not readable") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(file)"
        raise ConfigError(path, where, f"invalid YAML: {getattr(exc, 'problem', exc)}") from None
    return parse_robot_config(raw, path)


def apply_overrides(cfg: RobotConfig, overrides: Mapping[str, Any], source: str) -> RobotConfig:
    """New config with node settings replaced by overrides (e.g. ~private params), validated.

    Args:
        overrides: {node key: value}; keys must be NodeSettings fields.
        source: where the overrides came from, for error messages (e.g. "/overlay_manager params").
    """
    if not overrides:
        return cfg
    current = {f.name: getattr(cfg.node, f.name) for f in fields(NodeSettings)}
    merged = dict(current)
    for k, v in overrides.items():
        if isinstance(v, tuple):
            v = list(v)
        merged[k] = v
    as_yaml = {k: (list(v) if isinstance(v, tuple) else v) for k, v in merged.items()}
    node = _section(source, "node", as_yaml, NodeSettings)
    return replace(cfg, node=node)
