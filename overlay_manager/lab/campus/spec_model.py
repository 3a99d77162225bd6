"""The lab spec's data model: NAT kinds, impairments, hosts, buildings, control, relays, DERP
regions (frozen).

spec.py reads a spec file (or mapping) into these values; everything else in the lab (naming,
nft, network, control, the matrix model) works on them. NAT kinds follow RFC 4787 (see spec.py's
doc for the names).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Mapping, Tuple, Union

from overlay_manager.core.validation import shorten

MAPPINGS = ("eim", "adm", "adpm")
"""RFC 4787 mapping behaviours: endpoint-independent, address-dependent, address-and-port-dependent."""
FILTERINGS = ("eif", "adf", "adpf")
"""RFC 4787 filtering behaviours: endpoint-independent, address-dependent, address-and-port-dependent."""
UDP_POLICIES = ("open", "stun-only", "none", "servers")
"""Which UDP a router forwards from its LAN: all, only to the STUN server, none, only to the
STUN server and the peer relays' ports."""
PUBLIC = "public"
"""NAT kind of a campus server network: no NAT, hosts routed on the backbone."""
DEFAULT_RELAY_PORT = 40000


@dataclass(frozen=True)
class NatKind:
    """One router's behaviour: RFC 4787 mapping and filtering plus a UDP forwarding policy."""

    mapping: str
    """``eim`` | ``adm`` | ``adpm`` (how the external port is chosen)."""
    filtering: str
    """``eif`` | ``adf`` | ``adpf`` (which inbound packets reach a mapped port)."""
    udp: str = "open"
    """``open`` | ``stun-only`` (udp-blocked) | ``none`` (tcp-only) | ``servers`` (udp-servers)."""

    @property
    def public(self) -> bool:
        """No NAT at all: a campus server network routed on the backbone."""
        return self.mapping == PUBLIC

    @property
    def name(self) -> str:
        """Canonical name: ``eim-adpf``, ``udp-blocked``, ``tcp-only``, ``udp-servers`` or ``public``."""
        if self.public:
            return PUBLIC
        if self.udp == "servers":
            return "udp-servers"
        if self.udp == "stun-only":
            return "udp-blocked"
        if self.udp == "none":
            return "tcp-only"
        return f"{self.mapping}-{self.filtering}"


def nat_kind_names() -> List[str]:
    """Every accepted NAT kind name (canonical names and bare mappings)."""
    names = [f"{m}-{f}" for m in MAPPINGS for f in FILTERINGS]
    return names + list(MAPPINGS) + ["udp-blocked", "tcp-only", "udp-servers", PUBLIC]


def parse_nat_kind(text: str) -> NatKind:
    """Parse a NAT kind name; raises ValueError listing the valid names."""
    if text == "udp-blocked":
        return NatKind("eim", "adpf", "stun-only")
    if text == "tcp-only":
        return NatKind("eim", "adpf", "none")
    if text == "udp-servers":
        return NatKind("eim", "adpf", "servers")
    if text == PUBLIC:
        return NatKind(PUBLIC, PUBLIC, "open")
    if text in MAPPINGS:
        return NatKind(text, "adpf")
    mapping, _, filtering = text.partition("-")
    if mapping in MAPPINGS and filtering in FILTERINGS:
        return NatKind(mapping, filtering)
    raise ValueError(f"unknown NAT kind {shorten(text)}; valid: {', '.join(nat_kind_names())}")


@dataclass(frozen=True)
class Impairment:
    """tc netem settings for one link, applied to each direction (egress of both ends)."""

    delay_ms: float = 0.0
    """One-way added delay in milliseconds (RTT grows by twice this)."""
    jitter_ms: float = 0.0
    """Delay variation in milliseconds (needs delay_ms > 0)."""
    loss_pct: float = 0.0
    """Random packet loss per direction, percent (0..100)."""
    rate_mbit: float = 0.0
    """Rate limit per direction in Mbit/s (0 = unlimited)."""

    @property
    def empty(self) -> bool:
        """True when nothing is impaired."""
        return not (self.delay_ms or self.jitter_ms or self.loss_pct or self.rate_mbit)

    def netem_args(self) -> List[str]:
        """Arguments after ``tc qdisc replace dev X root netem``; [] when empty."""
        args: List[str] = []
        if self.delay_ms or self.jitter_ms:
            args += ["delay", f"{self.delay_ms:g}ms"]
            if self.jitter_ms:
                args += [f"{self.jitter_ms:g}ms"]
        if self.loss_pct:
            args += ["loss", f"{self.loss_pct:g}%"]
        if self.rate_mbit:
            args += ["rate", f"{self.rate_mbit:g}mbit"]
        return args


@dataclass(frozen=True)
class HostSpec:
    """A machine in a building (robot, base station, operator laptop)."""

    name: str
    """Short name: namespace suffix, tailscale hostname and fleet host name."""
    building: str
    team: str = "lab"
    """Fleet team the host belongs to (one ACL segment with its own ROS master)."""
    role: str = "robot"
    """Fleet role: ``robot`` | ``base_station`` | ``operator``."""


@dataclass(frozen=True)
class BuildingSpec:
    """A LAN behind one router namespace."""

    name: str
    nat: NatKind
    hosts: Tuple[HostSpec, ...]


@dataclass(frozen=True)
class ControlSpec:
    """The control host: Headscale with embedded DERP (HTTPS) and STUN."""

    port: int = 8443
    """TCP port of Headscale's HTTPS server (control protocol and DERP)."""
    stun_port: int = 3478
    """UDP port of the embedded STUN server."""
    base_domain: str = "fleet.internal"
    """MagicDNS base domain of the fleet."""


@dataclass(frozen=True)
class RelaySpec:
    """A lab host that serves a Tailscale peer relay (an entry of the fleet's ``relays``)."""

    host: str
    port: int = DEFAULT_RELAY_PORT
    """UDP port of the relay server."""
    teams: Tuple[str, ...] = ()
    """Teams that may use it (() = all)."""


@dataclass(frozen=True)
class DerpRegionSpec:
    """A DERP region of the lab fleet (an entry of the fleet's ``derp_regions``)."""

    code: str
    """Region code (a name), e.g. ``east``."""
    id: int
    """Region id, 900..999."""
    name: str
    """Readable region name."""
    servers: Tuple[str, ...]
    """Hosts that run derper for it (each in a ``public`` building, with its own tailscaled)."""


@dataclass(frozen=True)
class DerpSpec:
    """The lab's DERP setup: the fleet's own regions and whether headscale's embedded one runs."""

    embedded: bool = True
    """Run headscale's embedded DERP region (it stops with headscale)."""
    regions: Mapping[str, DerpRegionSpec] = field(default_factory=dict)
    """Regions by code, in spec order."""

    def servers(self) -> List[Tuple[str, DerpRegionSpec]]:
        """(host, region) of every derper, regions in spec order."""
        return [(h, r) for r in self.regions.values() for h in r.servers]


@dataclass(frozen=True)
class LabSpec:
    """A validated lab description."""

    name: str
    control: ControlSpec
    buildings: Tuple[BuildingSpec, ...]
    teams: Mapping[str, str] = field(default_factory=dict)
    """Team name -> its master host (the host running roscore), for every team of the hosts."""
    impair: Mapping[str, Impairment] = field(default_factory=dict)
    """Initial impairments by link name (building = its uplink, ``control``, host = its LAN link)."""
    source: str = "<dict>"
    """Where the spec came from (file path or ``<dict>``), for messages."""
    relays: Mapping[str, RelaySpec] = field(default_factory=dict)
    """Peer relays by host name."""
    derp: DerpSpec = field(default_factory=DerpSpec)
    """The fleet's own DERP regions (derper on lab hosts) and the embedded region on or off."""

    @property
    def hosts(self) -> Tuple[HostSpec, ...]:
        """All hosts in building order."""
        return tuple(h for b in self.buildings for h in b.hosts)

    def host(self, name: str) -> HostSpec:
        """The host called ``name``; KeyError if there is none."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def building(self, name: str) -> BuildingSpec:
        """The building called ``name``; KeyError if there is none."""
        for b in self.buildings:
            if b.name == name:
                return b
        raise KeyError(name)

    def link_names(self) -> List[str]:
        """Links that can be impaired: ``control``, each building (uplink), each host (LAN link)."""
        return ["control"] + [b.name for b in self.buildings] + [h.name for h in self.hosts]


SpecInput = Union[str, Path, Mapping[str, Any], LabSpec]
