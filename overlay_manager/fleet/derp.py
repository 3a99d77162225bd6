"""The fleet file's ``derp_regions`` section: the fleet's own DERP regions, served by tailscale's
``derper`` on fleet machines, so relayed links do not depend on the control server.

DERP is tailscale's relay of last resort: WireGuard packets inside HTTPS (TCP) to a server both
peers reach. Headscale's embedded DERP stops with Headscale; with regions of its own the fleet
keeps its relayed links through a control-server outage, and relayed traffic spreads over
several machines instead of crossing one. Each machine picks its home region by latency
(netcheck); when a region's derper stops, its clients pick another region and their peers follow.

Example (see ``config/fleet.example.yaml``)::

    derp_regions:
      east:                          # region code: a DNS label, shown as the link's relay region
        id: 901                      # DERP region id, 900..999, unique (not the embedded one's)
        name: East campus            # readable name (default: the code)
        servers:                     # one or more derpers; several in one region are meshed
          - host: east-derp          # a fleet host (robot or base station) that runs derper
            address: 192.0.2.10      # IPv4 address every machine dials (TCP port, UDP stun_port)
            hostname: derp-east.campus.example   # TLS name (default: the address)
            port: 443                # DERP over HTTPS, TCP (default 443)
            stun_port: 3478          # STUN, UDP (default 3478)
            http_port: 3340          # derper's plain-HTTP listener; the node reads /debug/vars
                                     # there from 127.0.0.1 (default 3340; not to be opened)

What it makes (see :mod:`.deploy`, :mod:`.bundle`):

- the DERP map headscale serves (``derp/derpmap.yaml`` in the deployment, listed in headscale's
  ``derp.paths``), in headscale's YAML form of tailscale's ``tailcfg.DERPMap``;
- per server a certificate for its hostname and address from the fleet CA (``tls/``), which every
  machine trusts through the bundle's ``ca.crt``;
- in the server host's bundle: ``derper/`` with the certificate, a systemd unit made from
  ``config/systemd/derper.service.in`` and, for a meshed region, the mesh key (0600); its
  robot.yaml gets ``derper: {url: http://127.0.0.1:<http_port>}`` so its node reports the relay;
- policy: every derper host carries ``tag:derp`` (a label); every team may ping it (ICMP only),
  so headscale puts every machine into the derper host's network map. derper runs with
  ``--verify-clients``: it asks its host's own tailscaled whether a client's node key belongs to
  the tailnet, so nothing but the fleet's machines can relay through it.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from overlay_manager.core.config import DerperSettings
from overlay_manager.core.validation import MISSING, Reader, is_dns_label, is_domain, join_key, shorten

#: Label tag of every derper host (no rule grants anything to it but ICMP from the fleet).
DERP_TAG = "tag:derp"
#: DERP over HTTPS (TCP) port when the fleet file does not say.
DEFAULT_DERP_PORT = 443
#: STUN (UDP) port when the fleet file does not say.
DEFAULT_STUN_PORT = 3478
#: derper's plain-HTTP listener (debug endpoints from localhost) when the fleet file does not say.
DEFAULT_HTTP_PORT = 3340
#: Region ids a private DERP map may use (tailscale's own regions are below 900).
REGION_ID_RANGE = (900, 999)
#: Where derper keeps its private node key (systemd's StateDirectory=derper).
DERPER_STATE_FILE = "/var/lib/derper/derper.key"

_REGION_KEYS = ("id", "name", "servers")
_SERVER_KEYS = ("host", "address", "hostname", "port", "stun_port", "http_port")
_UNSAFE = re.compile(r"[^a-zA-Z0-9.-]")
_TEMPLATE_VAR = re.compile(r"@([A-Z_]+)@")
#: The derper unit's template in config/systemd/.
DERPER_TEMPLATE = "derper.service.in"


@dataclass(frozen=True)
class DerpServer:
    """One derper of a region.

    Attributes:
        host: short name of the fleet host that runs derper (and the tailscaled it verifies
            clients against).
        region: code of the region it serves.
        address: IPv4 address every machine dials (the DERP map's ``ipv4``).
        hostname: TLS name clients verify (the DERP map's ``hostname``); the address itself
            when the fleet file gives none (the certificate then carries it as an IP SAN).
        port: DERP over HTTPS, TCP port (1..65535).
        stun_port: STUN, UDP port (1..65535).
        http_port: derper's plain-HTTP listener; its debug endpoints (``/debug/vars``) answer
            only loopback and tailnet addresses.
    """

    host: str
    region: str
    address: str
    hostname: str
    port: int = DEFAULT_DERP_PORT
    stun_port: int = DEFAULT_STUN_PORT
    http_port: int = DEFAULT_HTTP_PORT

    @property
    def cert_stem(self) -> str:
        """File name stem derper looks for in ``--certdir`` (``<stem>.crt``/``<stem>.key``):
        the hostname without characters outside ``[a-zA-Z0-9.-]``, as derper computes it."""
        return _UNSAFE.sub("", self.hostname)

    @property
    def cert_names(self) -> List[str]:
        """Subject alternative names of its certificate: hostname and address."""
        return list(dict.fromkeys([self.hostname, self.address]))

    @property
    def debug_url(self) -> str:
        """Base URL of its debug endpoints as seen from the same machine."""
        return f"http://127.0.0.1:{self.http_port}"


@dataclass(frozen=True)
class DerpRegion:
    """One DERP region of the fleet.

    Attributes:
        code: short region code (a DNS label), e.g. ``east``; tailscale shows it as the relay
            region of a link.
        id: region id in the DERP map (900..999).
        name: readable region name.
        servers: its derpers, in file order; with more than one they mesh (a mesh key).
    """

    code: str
    id: int
    name: str
    servers: Tuple[DerpServer, ...]

    @property
    def meshed(self) -> bool:
        """True when the region has several servers that must forward to each other."""
        return len(self.servers) > 1


def parse_derp_regions(r: Reader, raw: Any, hosts: Mapping[str, Any],
                       embedded_id: Optional[int]) -> Dict[str, DerpRegion]:
    """Validate the ``derp_regions`` section.

    Args:
        r: the fleet file's reader (errors name its file).
        raw: the parsed section (None/missing = no regions): region code -> {id, name, servers}.
        hosts: the fleet's hosts by short name; each value has ``role``.
        embedded_id: region id of headscale's embedded DERP when it runs (None = off).

    Returns:
        Regions by code, in file order.

    Raises:
        ConfigError: naming the key (and the host) of the first problem.
    """
    section = r.mapping(raw, "derp_regions", what="a mapping of region code -> {id, name, servers}")
    out: Dict[str, DerpRegion] = {}
    ids: Dict[int, str] = {}
    endpoints: Dict[Tuple[str, int, str], str] = {}
    for code, entry in section.items():
        key = join_key("derp_regions", code)
        if not is_dns_label(code):
            raise r.error(key, "region code must be a DNS label (a-z, 0-9, '-'), e.g. east")
        m = r.mapping(entry, key, _REGION_KEYS, what="a mapping with id, name, servers")
        rid = r.integer(m.get("id", MISSING), f"{key}.id", lo=REGION_ID_RANGE[0], hi=REGION_ID_RANGE[1])
        if rid in ids:
            raise r.error(f"{key}.id", f"region id {rid} is already used by region {ids[rid]!r}")
        if embedded_id is not None and rid == embedded_id:
            raise r.error(f"{key}.id", f"region id {rid} is the embedded DERP's (server.derp.region_id): "
                                       "choose another id or set server.derp.embedded: false")
        ids[rid] = code
        name = r.string(m.get("name", MISSING), f"{key}.name", code, empty=False, max_len=128)
        raw_servers = m.get("servers", MISSING)
        if not isinstance(raw_servers, list) or not raw_servers:
            raise r.error(f"{key}.servers", "required: a non-empty list of {host, address, ...} "
                                            f"(got {shorten(None if raw_servers is MISSING else raw_servers)})")
        servers = []
        for i, s in enumerate(raw_servers):
            servers.append(_parse_server(r, s, f"{key}.servers[{i}]", code, hosts, endpoints))
        out[code] = DerpRegion(code=code, id=rid, name=name, servers=tuple(servers))
    return out


def _parse_server(r: Reader, raw: Any, key: str, region: str, hosts: Mapping[str, Any],
                  endpoints: Dict[Tuple[str, int, str], str]) -> DerpServer:
    m = r.mapping(raw, key, _SERVER_KEYS, what="a mapping with host, address, hostname, port, "
                                               "stun_port, http_port")
    host = r.string(m.get("host", MISSING), f"{key}.host", empty=False)
    h = hosts.get(host)
    if h is None:
        raise r.error(f"{key}.host", "not a host of the fleet: derper verifies clients through its "
                                     "host's own tailscaled, so list the machine in a team (e.g. as a "
                                     "base station) first", host=host)
    if h.role == "operator":
        raise r.error(f"{key}.host", "operators (laptops) cannot serve DERP: use a robot or a base "
                                     "station that stays on the campus network", host=host)
    address = r.string(m.get("address", MISSING), f"{key}.address", empty=False)
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        raise r.error(f"{key}.address", f"expected the IPv4 address machines dial, got {shorten(address)}",
                      host=host) from None
    if ip.is_unspecified or ip.is_loopback:
        raise r.error(f"{key}.address", f"{address} cannot be dialled from other machines", host=host)
    hostname = r.string(m.get("hostname", MISSING), f"{key}.hostname", address, empty=False,
                        max_len=253).lower().rstrip(".")
    if hostname != address and not is_domain(hostname, 1):
        raise r.error(f"{key}.hostname", f"{shorten(hostname)} is not a DNS name (or leave it out to "
                                         "use the address)", host=host)
    port = r.port(m.get("port", MISSING), f"{key}.port", DEFAULT_DERP_PORT)
    stun = r.port(m.get("stun_port", MISSING), f"{key}.stun_port", DEFAULT_STUN_PORT)
    http = r.port(m.get("http_port", MISSING), f"{key}.http_port", DEFAULT_HTTP_PORT)
    if http == port:
        raise r.error(f"{key}.http_port", f"must differ from port ({port}): derper serves HTTPS there",
                      host=host)
    for proto, p, what in (("tcp", port, "port"), ("udp", stun, "stun_port"), ("tcp", http, "http_port")):
        if (address, p, proto) in endpoints:
            raise r.error(f"{key}.{what}", f"{address}:{p}/{proto} is already used by "
                                           f"{endpoints[(address, p, proto)]}", host=host)
        endpoints[(address, p, proto)] = f"{key}.{what}"
    return DerpServer(host=host, region=region, address=address, hostname=hostname, port=port,
                      stun_port=stun, http_port=http)


def derp_servers(regions: Mapping[str, DerpRegion]) -> List[DerpServer]:
    """Every derper of the fleet, regions in file order."""
    return [s for reg in regions.values() for s in reg.servers]


def servers_on(regions: Mapping[str, DerpRegion], host: str) -> List[DerpServer]:
    """The derpers host ``host`` runs (normally zero or one)."""
    return [s for s in derp_servers(regions) if s.host == host]


def derp_tags(regions: Mapping[str, DerpRegion], host: str) -> List[str]:
    """Extra ACL tags of ``host``: ``[tag:derp]`` for a derper host, else []."""
    return [DERP_TAG] if servers_on(regions, host) else []


def derp_map(regions: Mapping[str, DerpRegion]) -> Dict[str, Any]:
    """The regions as headscale's DERP map file (``derp.paths``): tailscale's ``tailcfg.DERPMap``
    with lower-case keys, the form headscale's YAML loader reads."""
    out: Dict[str, Any] = {}
    for reg in regions.values():
        out[reg.id] = {
            "regionid": reg.id,
            "regioncode": reg.code,
            "regionname": reg.name,
            "nodes": [{"name": f"{reg.id}{chr(ord('a') + i)}" if i < 26 else f"{reg.id}-{i}",
                       "regionid": reg.id,
                       "hostname": s.hostname,
                       "ipv4": s.address,
                       "ipv6": "none",
                       "stunport": s.stun_port,
                       "stunonly": False,
                       "derpport": s.port}
                      for i, s in enumerate(reg.servers)],
        }
    return {"regions": out}


def render_derp_map(regions: Mapping[str, DerpRegion], source: str) -> str:
    """:func:`derp_map` as YAML text with a header naming ``source`` (the fleet file)."""
    import yaml

    header = (f"# DERP regions of the fleet, written by `fleet init`/`fleet policy` from {source}.\n"
              "# Do not edit: change derp_regions in the fleet file. headscale reads this file\n"
              "# (derp.paths) when it starts.\n")
    return header + yaml.safe_dump(derp_map(regions), sort_keys=False)


def derper_args(server: DerpServer, region: DerpRegion, *, certdir: str, socket: str,
                state_file: str = DERPER_STATE_FILE, mesh_key_file: str = "") -> List[str]:
    """derper's command-line arguments (without the binary) for ``server``.

    HTTPS (``--certmode manual``: ``<certdir>/<cert_stem>.crt``/``.key``) on all addresses at
    ``port``, STUN at ``stun_port``, the plain-HTTP listener at ``http_port``, clients verified
    through the tailscaled at ``socket``; in a meshed region the mesh key file and the other
    servers of the region (``--mesh-with hostname/address``: dial the address, verify the name).
    """
    args = ["-a", f":{server.port}", "-http-port", str(server.http_port),
            "-stun-port", str(server.stun_port), "-hostname", server.hostname,
            "-certmode", "manual", "-certdir", certdir, "-c", state_file,
            "--verify-clients", "--socket", socket]
    if region.meshed:
        args += ["-mesh-psk-file", mesh_key_file,
                 "-mesh-with", ",".join(f"{s.hostname}/{s.address}" for s in region.servers)]
    return args


def render_template(text: str, values: Mapping[str, str], source: str) -> str:
    """``text`` with every ``@NAME@`` replaced by ``values[NAME]``.

    Raises:
        KeyError: naming ``source`` and the placeholder the values do not have.
    """
    def sub(m: "re.Match[str]") -> str:
        try:
            return values[m.group(1)]
        except KeyError:
            raise KeyError(f"{source}: no value for placeholder @{m.group(1)}@") from None

    return _TEMPLATE_VAR.sub(sub, text)


def derper_unit(template: str, template_source: str, server: DerpServer, region: DerpRegion, *,
                fleet: str, derper_bin: str, certdir: str, socket: str, mesh_key_file: str = "") -> str:
    """The systemd unit of ``server`` from ``template`` (``config/systemd/derper.service.in``)."""
    args = derper_args(server, region, certdir=certdir, socket=socket, mesh_key_file=mesh_key_file)
    return render_template(template, {
        "FLEET": fleet, "REGION": region.code, "REGION_NAME": region.name, "HOST": server.host,
        "EXEC": " ".join(shlex.quote(a) for a in [derper_bin, *args]),
        "PORT": str(server.port), "STUN_PORT": str(server.stun_port), "HTTP_PORT": str(server.http_port),
    }, template_source)


def derper_settings(server: DerpServer) -> DerperSettings:
    """The robot config's ``derper`` section of a derper host, as the node reads it (the bundle
    writes its ``to_yaml()``): derper's debug listener on the same machine and its region."""
    return DerperSettings(url=server.debug_url, region=server.region)


def template_path() -> Path:
    """``config/systemd/derper.service.in`` of this package (source checkout or installed copy:
    :func:`overlay_manager.fleet.unit.template_path`)."""
    from overlay_manager.fleet.unit import template_path as find  # unit -> model -> derp: import here

    return find(name=DERPER_TEMPLATE)
