"""Robot config YAML -> validated RobotConfig. Every error names the file and the key.

The reference for every key is config/robot.example.yaml. Relative paths (auth_key_file,
ca_cert) are resolved against the config file's directory. A section that another part of the
package writes (the fleet's bundles write ``relay`` and ``derper``) is written by its type's
``to_yaml()``, beside the parser that reads it back.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from overlay_manager.core.validation import (
    ACL_TAG,
    DNS_LABEL,
    MISSING,
    ConfigError,
    Reader,
    is_domain,
    load_yaml,
    lower_case_hint,
    require_file,
    shorten,
    type_name,
)

#: UDP port of a relay when the robot config does not say.
DEFAULT_RELAY_PORT = 40000


@dataclass(frozen=True)
class RelaySettings:
    """The robot config's ``relay`` section: serve a peer relay from this machine.

    Attributes:
        port: UDP port the relay server binds on all interfaces (1..65535).
        static_endpoints: extra ``ip:port`` candidates to advertise, canonical and sorted.
    """

    port: int = DEFAULT_RELAY_PORT
    static_endpoints: Tuple[str, ...] = ()

    def to_yaml(self) -> Dict[str, Any]:
        """The ``relay`` section that :func:`parse_relay_settings` reads back as this value."""
        return {"port": self.port, "static_endpoints": list(self.static_endpoints)}


def parse_addr_port(value: Any) -> str:
    """A literal ``ip:port`` (IPv6 in brackets) in canonical form; ValueError otherwise.

    Host names are refused: tailscaled advertises static endpoints as addresses.
    """
    if not isinstance(value, str):
        raise ValueError(f"expected 'ip:port', got {value!r}")
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected 'ip:port' with a port in 1..65535, got {value!r}")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        addr = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        raise ValueError(f"expected an IP address before the port (no host names), got {value!r}") \
            from None
    if addr.version == 6 and not bracketed:
        raise ValueError(f"write IPv6 endpoints as [addr]:port, got {value!r}")
    return f"[{addr}]:{int(port)}" if addr.version == 6 else f"{addr}:{int(port)}"


def parse_relay_settings(r: Reader, raw: Any) -> Optional[RelaySettings]:
    """The robot config's ``relay`` section -> RelaySettings; None when absent (relay server off).

    Args:
        r: the robot config's reader (errors name its file).
        raw: the section's value (MISSING or None = absent).

    Raises:
        ConfigError: naming the key (``relay.port``, ``relay.static_endpoints[i]``, ...).
    """
    if raw is None or raw is MISSING:
        return None
    m = r.mapping(raw, "relay", ("port", "static_endpoints"),
                  what="a mapping like {port: 40000, static_endpoints: []}")
    port = r.port(m.get("port", MISSING), "relay.port", DEFAULT_RELAY_PORT)
    eps = set()
    for i, ep in enumerate(r.string_list(m.get("static_endpoints", MISSING), "relay.static_endpoints", [])):
        try:
            eps.add(parse_addr_port(ep))
        except ValueError as exc:
            raise r.error(f"relay.static_endpoints[{i}]", str(exc)) from None
    return RelaySettings(port=port, static_endpoints=tuple(sorted(eps)))


@dataclass(frozen=True)
class DerperSettings:
    """The robot config's ``derper`` section: this machine runs a derper of the fleet.

    Attributes:
        url: base URL of derper's plain-HTTP listener on this machine (``http://127.0.0.1:PORT``).
        region: code of the DERP region it serves ("" = unknown).
    """

    url: str
    region: str = ""

    def to_yaml(self) -> Dict[str, Any]:
        """The ``derper`` section that :func:`parse_derper_settings` reads back as this value."""
        return {"url": self.url, "region": self.region}


def parse_derper_settings(r: Reader, raw: Any) -> Optional[DerperSettings]:
    """The robot config's ``derper`` section -> DerperSettings; None when absent.

    Raises:
        ConfigError: naming the key (``derper.url``, ``derper.region``).
    """
    if raw is None or raw is MISSING:
        return None
    m = r.mapping(raw, "derper", ("url", "region"), what="a mapping like {url: http://127.0.0.1:3340}")
    url = r.url(m.get("url", MISSING), "derper.url", schemes=("http",))
    host = urlsplit(url).hostname or ""
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise r.error("derper.url", f"{shorten(url)}: derper answers its debug pages on this machine only; "
                                    "use http://127.0.0.1:<http_port>")
    region = r.string(m.get("region", MISSING), "derper.region", "", max_len=63)
    return DerperSettings(url=url, region=region)



LINK_TOPIC_MODES = ("watched", "active", "none")
"""Values of node.link_topics (monitor/peer_topics.py says what each chooses)."""


def _limits(**kw: float) -> Dict[str, Any]:
    """Field metadata for a numeric setting's range: gt (exclusive low), ge, le."""
    return {"limits": kw}


@dataclass(frozen=True)
class TailscaleSettings:
    """How to reach tailscaled."""

    socket: str = "/var/run/tailscale/tailscaled.sock"  # LocalAPI unix socket
    cli: str = "tailscale"                                # CLI for `up` and `netcheck`
    accept_dns: bool = False                              # let tailscaled manage DNS
    up_timeout: float = field(default=30.0, metadata=_limits(gt=0, le=3600))  # seconds for enrolment


@dataclass(frozen=True)
class NodeSettings:
    """Node behaviour; each key may be overridden by the node's ~private parameter of that name."""

    publish_rate: float = field(default=1.0, metadata=_limits(gt=0, le=1000))  # Hz, ~peers/~status republish
    poll_rate: float = field(default=4.0, metadata=_limits(gt=0, le=1000))     # Hz, reads of tailscaled status
    # Hz, status reads while tailscaled's IPN bus is open (state and peer changes it reports are
    # read at once; paths are only in the status); 0 = always poll_rate
    bus_poll_rate: float = field(default=2.0, metadata=_limits(ge=0, le=1000))
    ping_interval: float = field(default=5.0, metadata=_limits(le=86400))  # s between disco pings; 0 = off
    # short names pinged besides the master's machine and the machines that carry ROS topics to or
    # from this one (from the topic-link map); with topic_links_interval 0: () = every online peer
    watch_peers: Tuple[str, ...] = ()
    # short names whose absence is an ERROR on /diagnostics (the master's machine always is); any
    # other peer that is offline is OK ("offline"), so a closed operator laptop turns nothing red
    required_peers: Tuple[str, ...] = ()
    manage_hosts: bool = False       # keep a managed overlay-names block in hosts_file
    hosts_file: str = "/etc/hosts"
    iperf_server: bool = False       # serve iperf3 on the overlay address (opt-in; needs iperf3)
    iperf_port: int = field(default=5201, metadata=_limits(ge=1, le=65535))
    # s between preflight runs; 0 = at start and on demand only
    preflight_interval: float = field(default=30.0, metadata=_limits(le=86400))
    # s between NAT checks (tailscale netcheck); 0 = at start only
    netcheck_interval: float = field(default=60.0, metadata=_limits(le=86400))
    # s between topic-link maps (~topic_links, which machines carry ROS connections); 0 = off
    topic_links_interval: float = field(default=5.0, metadata=_limits(le=86400))
    # TCP port of rosbridge's websocket on this machine (robot.launch rosbridge:=true passes it):
    # /diagnostics says when it is reachable beyond loopback and the overlay; 0 = not checked
    rosbridge_port: int = field(default=0, metadata=_limits(ge=0, le=65535))
    # which peers get a topic of their own, ~links/<ROS name of the peer> (overlay_manager/Peer, for
    # rqt_plot and PlotJuggler): "watched" (the peers with a measured latency: the ones the node
    # pings), "active" (those and every peer with recent traffic) or "none"
    link_topics: str = "watched"
    max_link_topics: int = field(default=16, metadata=_limits(ge=0, le=1000))  # at most this many
    # s between probes (disco pings) of the active peers on a direct or peer-relay path, to notice a
    # stalled path and ask tailscaled to re-evaluate (docs/node.md "Moving robots"); 0 = off
    guard_interval: float = field(default=0.2, metadata=_limits(le=86400))
    # s without an answer to those probes that make a stall (the node then asks tailscaled to rebind)
    stall_after: float = field(default=0.5, metadata=_limits(gt=0, le=60))
    # s between checks that the home DERP region's derper accepts connections (tailscaled's connection
    # to it in /proc/net/tcp; a TCP connect only when there is none); 0 = off
    home_check_interval: float = field(default=0.5, metadata=_limits(le=86400))


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
    relay: Optional[RelaySettings] = None  # serve a peer relay from this machine (None = no)
    derper: Optional[DerperSettings] = None  # this machine runs a fleet derper (None = no)

    @property
    def fqdn(self) -> str:
        """This machine's overlay name."""
        return f"{self.hostname}.{self.base_domain}"

    @property
    def master_fqdn(self) -> str:
        """The ROS master machine's overlay name."""
        return self.master if "." in self.master else f"{self.master}.{self.base_domain}"


def _section(source: str, prefix: str, raw: Any, cls: Any) -> Any:
    """Validate a nested mapping against a settings dataclass's fields.

    The field's default gives the type: bool, int, float (finite), str, or Tuple[str, ...]
    (a list of strings). Numbers must not be negative unless the field's metadata says
    otherwise (``_limits(gt=0, le=1000)``). Adding a key is adding a field.
    """
    r = Reader(source)
    known = {f.name: f for f in fields(cls)}
    data = r.mapping(raw, prefix, known)
    defaults = cls()
    values: Dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}.{key}"
        default = getattr(defaults, key)
        limits = dict(known[key].metadata.get("limits", {}))
        if isinstance(default, tuple):
            values[key] = tuple(r.string_list(value, full))
        elif isinstance(default, bool):
            values[key] = r.boolean(value, full)
        elif isinstance(default, int):
            values[key] = r.integer(value, full, lo=int(limits.get("ge", 0)),
                                    hi=None if "le" not in limits else int(limits["le"]))
        elif isinstance(default, float):
            gt = limits.get("gt")
            values[key] = r.number(value, full, lo=gt if gt is not None else limits.get("ge", 0.0),
                                   hi=limits.get("le"), lo_open=gt is not None)
        else:
            values[key] = r.string(value, full, max_len=4096)
    return cls(**values)


_REQUIRED = ("hostname", "login_server", "base_domain", "master")
_OPTIONAL = ("auth_key_file", "tags", "ca_cert", "master_port", "tailscale", "node", "relay",
             "derper")


def parse_robot_config(raw: Any, source: str, base_dir: Optional[str] = None) -> RobotConfig:
    """Validate a loaded YAML mapping. base_dir resolves relative paths (default: source's dir).

    Raises:
        ConfigError: naming source and the key, for any input.
    """
    r = Reader(source)
    if raw is None:
        raise r.error("(top level)", "the file is empty; see config/robot.example.yaml")
    data = r.mapping(raw, "", _REQUIRED + _OPTIONAL, what="a mapping of keys to values")
    base = base_dir if base_dir is not None else os.path.dirname(os.path.abspath(source))
    for key in _REQUIRED:
        if data.get(key) in (None, ""):
            raise r.error(key, "missing (required)")
    hostname = r.string(data["hostname"], "hostname")
    if not DNS_LABEL.match(hostname):
        raise r.error("hostname", f"{shorten(hostname)} is not a DNS label (lowercase a-z, 0-9, '-', at most 63)"
                      + lower_case_hint(hostname))
    login = r.url(data["login_server"], "login_server")
    base_domain = r.domain(data["base_domain"], "base_domain", min_labels=1)
    master = r.string(data["master"], "master").rstrip(".")
    if not is_domain(master, 1):
        raise r.error("master", f"{shorten(master)} is not a short name or overlay name")
    tags: List[str] = []
    if data.get("tags") is not None:
        if not isinstance(data["tags"], list):
            raise r.error("tags", f"must be a list like [tag:robot], got {type_name(data['tags'])}")
        for i, t in enumerate(data["tags"]):
            if not isinstance(t, str) or not ACL_TAG.match(t):
                raise r.error(f"tags[{i}]", f"{shorten(t)} is not an ACL tag like 'tag:robot'")
            tags.append(t)
    port = r.integer(data.get("master_port", 11311), "master_port")
    if not 0 < port < 65536:
        raise r.error("master_port", f"{port} is not a TCP port")
    ts = _section(source, "tailscale", data.get("tailscale"), TailscaleSettings)
    node = _check_node(source, _section(source, "node", data.get("node"), NodeSettings))
    return RobotConfig(
        source=source, hostname=hostname, login_server=login, base_domain=base_domain,
        master=master, auth_key_file=r.path(data.get("auth_key_file"), "auth_key_file", base),
        tags=tuple(tags), ca_cert=r.path(data.get("ca_cert"), "ca_cert", base), master_port=port,
        tailscale=ts, node=node, relay=parse_relay_settings(r, data.get("relay")),
        derper=parse_derper_settings(r, data.get("derper")),
    )


def _check_node(source: str, node: NodeSettings) -> NodeSettings:
    """Cross-field and range checks that the field types alone do not express."""
    if not 0 < node.iperf_port < 65536:
        raise ConfigError(source, "node.iperf_port", f"{node.iperf_port} is not a TCP port")
    if node.link_topics not in LINK_TOPIC_MODES:
        raise ConfigError(source, "node.link_topics", f"{shorten(node.link_topics)} is not one of "
                          + ", ".join(LINK_TOPIC_MODES))
    return node


def load_robot_config(path: str) -> RobotConfig:
    """Read and validate a robot config file.

    Raises:
        ConfigError: naming the file and key for any problem: missing, a directory, unreadable,
            not UTF-8, bad YAML, duplicate keys, too deep, or any invalid value.
    """
    return parse_robot_config(load_yaml(path), path)


def require_config_file(cfg: RobotConfig, key: str) -> str:
    """The path in ``cfg``'s file-valued ``key`` (``ca_cert``, ``auth_key_file``) after checking
    that it exists and is a readable regular file; ConfigError naming the config file and key.

    Files are checked where they are used (enrolment, CA install), not at load time: a robot
    that is already enrolled never reads its key file, and its bundle may have deleted it.
    """
    path = getattr(cfg, key)
    if not path:
        raise ConfigError(cfg.source, key, "not set")
    require_file(cfg.source, key, path)
    return str(path)


def override_master(cfg: RobotConfig, value: Any, source: str) -> RobotConfig:
    """New config whose ``master`` is ``value`` (e.g. the node's ``~master`` parameter), validated
    like the file's key; "" or None keeps the file's. ConfigError names ``source`` and ``master``."""
    if value in (None, ""):
        return cfg
    master = Reader(source).string(value, "master").rstrip(".")
    if not is_domain(master, 1):
        raise ConfigError(source, "master", f"{shorten(master)} is not a short name or overlay name")
    return replace(cfg, master=master)


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
    node = _check_node(source, _section(source, "node", as_yaml, NodeSettings))
    return replace(cfg, node=node)
