"""Names and addresses of one lab run (pure functions; no system access).

Everything a run creates is scoped by its run id: namespaces are ``olab<run>-bb`` (backbone),
``olab<run>-ctl`` (control host), ``olab<run>-r-<building>`` (router) and ``olab<run>-h-<host>``;
interfaces live only inside those namespaces and have fixed short names (<= 15 characters), so
nothing is ever created in the host's own network namespace.

Address plan (only inside the namespaces; 10.231.0.0/16 is unlikely to clash with anything):

    backbone (campus "public" side)   10.231.0.0/24
      control host                    10.231.0.2
      router of building i (0-based)  10.231.0.(10+i)
    LAN of building i                 10.231.(10+i).0/24
      router (default gateway)        10.231.(10+i).1
      host j (0-based) in building i  10.231.(10+i).(10+j)
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import List, Optional, Tuple

from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.spec_model import LabSpec

NS_PREFIX = "olab"
"""Every lab namespace starts with this; ``lab down --all`` looks for it."""
RUN_ID_RE = re.compile(r"^[a-z0-9]{1,8}$")
NS_RE = re.compile(r"^olab([a-z0-9]{1,8})-(bb|ctl|r-[a-z0-9-]+|h-[a-z0-9-]+)$")
"""Matches exactly the namespace names a lab run creates; group 1 is the run id."""
IFNAME_MAX = 15
NET_PREFIX = "10.231"
LAN_PREFIXLEN = 24
CONTROL_ADDRESS = f"{NET_PREFIX}.0.2"
TUN_NAME = "tailscale0"
"""tailscaled's TUN device inside each host namespace."""
TAILSCALE_PORT = 41641


def new_run_id() -> str:
    """A fresh random run id (4 hex digits)."""
    return secrets.token_hex(2)


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if valid (1..8 of [a-z0-9]); LabError otherwise."""
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        raise LabError(f"run id {run_id!r} is invalid: 1..8 lowercase letters or digits")
    return run_id


def run_id_of_namespace(ns: str) -> Optional[str]:
    """The run id if ``ns`` is a lab namespace name, else None."""
    m = NS_RE.match(ns)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Endpoint:
    """One end of a link: an interface in a namespace."""

    ns: str
    ifname: str


@dataclass(frozen=True)
class Names:
    """All names and addresses of one run of one spec."""

    spec: LabSpec
    run_id: str

    def __post_init__(self) -> None:
        check_run_id(self.run_id)

    # --- namespaces ---------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        """Common prefix of this run's namespaces."""
        return f"{NS_PREFIX}{self.run_id}-"

    @property
    def backbone_ns(self) -> str:
        return f"{self.prefix}bb"

    @property
    def control_ns(self) -> str:
        return f"{self.prefix}ctl"

    def router_ns(self, building: str) -> str:
        return f"{self.prefix}r-{building}"

    def host_ns(self, host: str) -> str:
        return f"{self.prefix}h-{host}"

    def all_namespaces(self) -> List[str]:
        """Every namespace of the run, in creation order."""
        out = [self.backbone_ns, self.control_ns]
        for b in self.spec.buildings:
            out.append(self.router_ns(b.name))
            out += [self.host_ns(h.name) for h in b.hosts]
        return out

    def namespace_of(self, node: str) -> str:
        """Namespace of a host, a building's router, ``control`` or ``backbone``."""
        if node == "control":
            return self.control_ns
        if node == "backbone":
            return self.backbone_ns
        for b in self.spec.buildings:
            if b.name == node:
                return self.router_ns(node)
            if any(h.name == node for h in b.hosts):
                return self.host_ns(node)
        raise LabError(f"no host, building, 'control' or 'backbone' called {node!r} in spec "
                       f"{self.spec.source} (hosts: {', '.join(h.name for h in self.spec.hosts)})")

    # --- indices and addresses ----------------------------------------------------------
    def building_index(self, building: str) -> int:
        for i, b in enumerate(self.spec.buildings):
            if b.name == building:
                return i
        raise LabError(f"no building {building!r} in spec {self.spec.source}")

    def host_index(self, host: str) -> Tuple[int, int]:
        """(building index, index within the building) of a host."""
        for i, b in enumerate(self.spec.buildings):
            for j, h in enumerate(b.hosts):
                if h.name == host:
                    return i, j
        raise LabError(f"no host {host!r} in spec {self.spec.source}")

    @property
    def control_address(self) -> str:
        return CONTROL_ADDRESS

    def router_wan_address(self, building: str) -> str:
        return f"{NET_PREFIX}.0.{10 + self.building_index(building)}"

    def lan_cidr(self, building: str) -> str:
        return f"{NET_PREFIX}.{10 + self.building_index(building)}.0/{LAN_PREFIXLEN}"

    def router_lan_address(self, building: str) -> str:
        return f"{NET_PREFIX}.{10 + self.building_index(building)}.1"

    def host_address(self, host: str) -> str:
        """The host's LAN address (its underlay address, behind its building's NAT)."""
        i, j = self.host_index(host)
        return f"{NET_PREFIX}.{10 + i}.{10 + j}"

    @property
    def server_url(self) -> str:
        """Headscale's URL as every namespace reaches it (never 127.0.0.1)."""
        return f"https://{self.control_address}:{self.spec.control.port}"

    # --- links --------------------------------------------------------------------------
    def link_endpoints(self, link: str) -> Tuple[Endpoint, Endpoint]:
        """Both ends of a named link (``control``, a building's uplink, a host's LAN link)."""
        if link == "control":
            return Endpoint(self.control_ns, "eth0"), Endpoint(self.backbone_ns, "ctl")
        for i, b in enumerate(self.spec.buildings):
            if b.name == link:
                return Endpoint(self.router_ns(link), "wan"), Endpoint(self.backbone_ns, f"r{i}")
            for j, h in enumerate(b.hosts):
                if h.name == link:
                    return Endpoint(self.host_ns(link), "eth0"), Endpoint(self.router_ns(b.name), f"h{j}")
        raise LabError(f"no link {link!r} in spec {self.spec.source} "
                       f"(links: {', '.join(self.spec.link_names())})")
