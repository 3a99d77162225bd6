"""The network of a lab run: namespaces, bridges and veths, NAT routers, and runtime changes.

Built once by :meth:`Network.build` (pyroute2 for links and addresses, nftables for NAT, sysctl
per namespace); afterwards :meth:`Network.set_router_flags` blocks UDP or cuts a building off, and
:meth:`Network.impair` limits rate or drops packets on one link. Every change is recorded in the
run's state file so another process sees (and ``lab status`` reports) the same flags.
See core.py for the picture of the topology and naming.py for the address plan.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping, Optional

from overlay_manager.lab.campus import derpers, nft, relays, system
from overlay_manager.lab.campus import impair as impair_mod
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import RunLayout
from overlay_manager.lab.campus.spec_model import Impairment
from overlay_manager.lab.campus.state import RunState
from overlay_manager.lab.campus.system import Echo

NO_BRIDGE_NETFILTER = {"net.bridge.bridge-nf-call-iptables": "0", "net.bridge.bridge-nf-call-ip6tables": "0",
                       "net.bridge.bridge-nf-call-arptables": "0"}
"""Bridged traffic must not pass the router's nftables forward chain (br_netfilter is active)."""
RESOLV_CONF = ("# overlay lab: /etc/resolv.conf inside this namespace (no DNS server in the lab)\n"
               "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")


class Network:
    """Namespaces, links, NAT and impairments of one run.

    Args:
        layout: the run's paths and names.
        state: the run's state file (namespaces, router flags and impairments are recorded there).
        echo: receives one line per action (the equivalent ``ip``/``nft`` command).
    """

    def __init__(self, layout: RunLayout, state: RunState, echo: Echo) -> None:
        self.layout = layout
        self.state = state
        self.echo = echo
        self._netem: Optional[bool] = None

    # --- build ------------------------------------------------------------------------------
    def build(self) -> None:
        """Create every namespace, the backbone and LAN bridges, veths, NAT rules and the
        namespaces' own /etc/hosts and /etc/resolv.conf."""
        from pyroute2 import NetNS

        n = self.layout.names
        spec = self.layout.spec
        for ns in n.all_namespaces():
            self.state.record_namespace(ns)  # recorded first: a crash right after still leaves a trace
            system.create_ns(ns, self.echo)
        with NetNS(n.backbone_ns) as bb:
            self.echo(f"({n.backbone_ns}) ip link add br0 type bridge; ip link set br0 up")
            bb.link("add", ifname="br0", kind="bridge")
            br = bb.link_lookup(ifname="br0")[0]
            bb.link("set", index=br, state="up")
            self._veth(bb, n.backbone_ns, "ctl", br, n.control_ns, "eth0",
                       f"{n.control_address}/24", gateway=None)
            for i, b in enumerate(spec.buildings):
                self._veth(bb, n.backbone_ns, f"r{i}", br, n.router_ns(b.name), "wan",
                           f"{n.router_wan_address(b.name)}/24", gateway=None)
        self._sysctl(n.backbone_ns, NO_BRIDGE_NETFILTER)
        for b in spec.buildings:
            rns = n.router_ns(b.name)
            with NetNS(rns) as r:
                self.echo(f"({rns}) ip link add br0 type bridge; ip addr add "
                          f"{n.router_lan_address(b.name)}/24 dev br0; ip link set br0 up")
                r.link("add", ifname="br0", kind="bridge")
                rbr = r.link_lookup(ifname="br0")[0]
                r.addr("add", index=rbr, address=n.router_lan_address(b.name), prefixlen=24)
                r.link("set", index=rbr, state="up")
                for j, h in enumerate(b.hosts):
                    self._veth(r, rns, f"h{j}", rbr, n.host_ns(h.name), "eth0",
                               f"{n.host_address(h.name)}/24", gateway=n.router_lan_address(b.name))
            self._sysctl(rns, {"net.ipv4.ip_forward": "1", **NO_BRIDGE_NETFILTER})
            ruleset = nft.router_ruleset(b.nat, n.router_wan_address(b.name), n.control_address,
                                         spec.control.stun_port, relays.udp_servers(n) + derpers.stun_servers(n))
            self._nft(rns, ruleset, f"NAT {b.nat.name}")
        # campus server networks (public buildings) are routed on the backbone, not NATed
        for ns, building in [(n.control_ns, "")] + [(n.router_ns(b.name), b.name) for b in spec.buildings]:
            for cidr, via in relays.public_routes(n, building):
                self.echo(f"({ns}) ip route add {cidr} via {via}")
                with NetNS(ns) as r:
                    r.route("add", dst=cidr, gateway=via)
        # name resolution of every namespace that runs programs: its own files, never the host's
        system.write_etc(n.control_ns, "resolv.conf", RESOLV_CONF, self.echo)
        system.write_etc(n.control_ns, "hosts", f"127.0.0.1 localhost\n{n.control_address} control\n",
                         self.echo)
        for h in spec.hosts:
            ns = n.host_ns(h.name)
            system.write_etc(ns, "resolv.conf", RESOLV_CONF, self.echo)
            system.write_etc(ns, "hosts", f"# /etc/hosts of lab host {h.name} (namespace {ns})\n"
                             "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
                             f"{n.host_address(h.name)} {h.name}\n", self.echo)

    def _sysctl(self, ns: str, settings: Mapping[str, str]) -> None:
        args = [f"{k}={v}" for k, v in settings.items()]
        system.run(["sysctl", "-q", "-w", *args], ns, echo=self.echo)

    def _veth(self, ipr: Any, ns: str, ifname: str, bridge: int, peer_ns: str, peer_ifname: str,
              peer_cidr: str, gateway: Optional[str]) -> None:
        """veth ``ifname`` in ``ns`` (enslaved to ``bridge``) <-> ``peer_ifname`` in ``peer_ns``.

        ``ipr`` is the pyroute2 NetNS of ``ns``; ``peer_cidr`` is "address/prefixlen";
        ``gateway`` becomes the peer's default route when given.
        """
        from pyroute2 import NetNS

        self.echo(f"({ns}) ip link add {ifname} master br0 type veth peer {peer_ifname} netns {peer_ns}; "
                  f"({peer_ns}) ip addr add {peer_cidr} dev {peer_ifname}"
                  + (f"; ip route add default via {gateway}" if gateway else ""))
        ipr.link("add", ifname=ifname, kind="veth", peer={"ifname": peer_ifname, "net_ns_fd": peer_ns})
        idx = ipr.link_lookup(ifname=ifname)[0]
        ipr.link("set", index=idx, master=bridge, state="up")
        address, prefixlen = peer_cidr.split("/")
        with NetNS(peer_ns) as p:
            pidx = p.link_lookup(ifname=peer_ifname)[0]
            p.addr("add", index=pidx, address=address, prefixlen=int(prefixlen))
            p.link("set", index=pidx, state="up")
            if gateway:
                p.route("add", dst="default", gateway=gateway)

    def _nft(self, ns: str, ruleset: str, what: str) -> None:
        path = self.layout.workdir / "nft" / f"{ns}.nft"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ruleset)
        self.echo(f"({ns}) nft -f {path}  # {what}")
        system.run(["nft", "-f", "-"], ns, echo=self.echo, input=ruleset, quiet=True)

    # --- runtime actions --------------------------------------------------------------------
    def set_router_flags(self, building: str, **change: bool) -> None:
        """Update a building router's flags (``udp_blocked``, ``cut``, ``udp_servers_only``: UDP
        blocked except to STUN and the peer relays) and load its actions chain."""
        n = self.layout.names
        n.building_index(building)
        with self.state.locked() as st:
            flags = st.setdefault("routers", {}).setdefault(building, {"udp_blocked": False, "cut": False})
            flags.update(change)
            servers = ([(n.control_address, self.layout.spec.control.stun_port)] + relays.udp_servers(n)
                       + derpers.stun_servers(n))
            only = bool(flags.get("udp_servers_only"))
            ruleset = nft.actions_ruleset(udp_blocked=flags["udp_blocked"] or only, cut=flags["cut"],
                                          udp_servers=servers if only and not flags["udp_blocked"] else ())
        ns = self.layout.names.router_ns(building)
        self.echo(f"({ns}) router actions: udp_blocked={flags['udp_blocked']} cut={flags['cut']} "
                  f"udp_servers_only={bool(flags.get('udp_servers_only'))}")
        system.run(["nft", "-f", "-"], ns, echo=self.echo, input=ruleset, quiet=True)

    def netem_available(self) -> bool:
        """True when the kernel has tc netem (probed once on loopback in the backbone namespace)."""
        if self._netem is None:
            ns = self.layout.names.backbone_ns
            res = system.run(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms"], ns,
                             echo=self.echo, check=False, quiet=True)
            self._netem = res.returncode == 0
            if self._netem:
                system.run(["tc", "qdisc", "del", "dev", "lo", "root"], ns, echo=self.echo, check=False,
                           quiet=True)
            else:
                self.echo("tc netem is not available in this kernel: rate via tbf, loss via nftables, "
                          "no delay/jitter")
        return self._netem

    def impair(self, link: str, impairment: Optional[Impairment]) -> None:
        """Impair both ends of a link (None or an empty Impairment clears it).

        Links: ``control``, a building name (its uplink to the backbone), a host name (its LAN
        link). Values apply per direction, so delay_ms adds twice to the round trip. Uses tc netem
        when the kernel has it; otherwise tbf for rate and nftables for loss, and LabError for
        delay/jitter (see impair.py).
        """
        ends = self.layout.names.link_endpoints(link)
        clear = impairment is None or impairment.empty
        netem = False if clear else self.netem_available()
        if impairment is not None and not clear and not netem:
            reason = impair_mod.fallback_supported(impairment)
            if reason:
                raise LabError(f"cannot impair link {link}: {reason}")
        for end in ends:
            system.run(impair_mod.clear_qdisc_argv(end.ifname), end.ns, echo=self.echo, check=False,
                       quiet=True)
            system.run(["nft", "-f", "-"], end.ns, echo=self.echo, quiet=True,
                       input=impair_mod.loss_ruleset(end.ifname, 0))
            if impairment is None or clear:
                self.echo(f"({end.ns}) {end.ifname}: impairment cleared")
                continue
            if netem:
                system.run(impair_mod.netem_argv(end.ifname, impairment), end.ns, echo=self.echo)
                continue
            if impairment.rate_mbit:
                system.run(impair_mod.tbf_argv(end.ifname, impairment.rate_mbit), end.ns, echo=self.echo)
            if impairment.loss_pct:
                rules = impair_mod.loss_ruleset(end.ifname, impairment.loss_pct)
                self.echo(f"({end.ns}) nft: drop {impairment.loss_pct:g}% of packets arriving on {end.ifname}")
                system.run(["nft", "-f", "-"], end.ns, echo=self.echo, quiet=True, input=rules)
        with self.state.locked() as st:
            if impairment is None or clear:
                st.setdefault("impair", {}).pop(link, None)
            else:
                st.setdefault("impair", {})[link] = asdict(impairment)
