"""nftables rulesets for building routers (pure text generation, applied with ``nft -f``).

Interfaces inside a router namespace: ``wan`` (backbone side, the building's public address) and
``br0`` (the LAN bridge). Rules are written for LAN<->WAN forwarding only; bridged traffic inside
a building never reaches them because the lab sets ``net.bridge.bridge-nf-call-iptables=0`` in
routers.

How the RFC 4787 behaviours are built (UDP; TCP is plainly masqueraded):

mapping
  ``eim``   snat to WAN:port with port = jhash(internal addr . internal port): the same external
            port whatever the destination.
  ``adm``   port = jhash(internal addr . internal port . destination addr): a new port per
            destination address, the same for every port of that address.
  ``adpm``  ``masquerade fully-random``: a new random port per destination address and port.
filtering
  ``adpf``  only conntrack replies come in (Linux's default behaviour).
  ``adf``   a dynamic set remembers (external port, destination addr) of outbound packets; new
            inbound UDP from a remembered address to that port is DNATed to the internal endpoint
            (kept in a dynamic map external port -> internal addr . port).
  ``eif``   any new inbound UDP to a mapped external port is DNATed to its internal endpoint.

The input chain has policy drop and accepts only loopback, established/related and the LAN: without
it a peer's first hole-punching packet creates a conntrack entry on the router itself, the
outbound mapping then collides and gets a new port, and hole punching fails even between two
endpoint-independent NATs (seen in this lab; eduP2P's test suite applies the same filter).

Runtime actions live in the ``actions`` chain, jumped to first from ``forward``, so they also cut
flows that are already established.
"""
from __future__ import annotations

from typing import Sequence, Tuple

from overlay_manager.lab.campus.spec_model import NatKind

TABLE = "inet olab"
PORT_OFFSET = 20000
"""First external UDP port the hashed mappings use."""
PORT_SPAN = 40000
"""Number of external UDP ports the hashed mappings spread over (20000..59999)."""
FILTER_TIMEOUT_S = 180
"""Seconds an idle mapping stays open to inbound packets under eif/adf (like a UDP conntrack)."""


def _mapping_rule(kind: NatKind, wan_address: str) -> str:
    if kind.mapping == "eim":
        key = "ip saddr . udp sport"
    elif kind.mapping == "adm":
        key = "ip saddr . udp sport . ip daddr"
    else:
        return 'oifname "wan" meta l4proto udp masquerade fully-random'
    return (f'oifname "wan" meta l4proto udp snat ip to {wan_address} : '
            f"jhash {key} mod {PORT_SPAN} offset {PORT_OFFSET}")


# The router itself answers only its LAN and what it started (so a peer's hole-punch packet
# cannot create a conntrack entry on the router); `actions` is where runtime blocks go.
_INPUT_AND_ACTIONS = (
    "  chain input {",
    "    type filter hook input priority filter; policy drop;",
    '    iif "lo" accept',
    "    ct state established,related accept",
    '    iifname "br0" accept',
    "  }",
    "  chain actions {",
    "  }",
)


def public_ruleset(kind: NatKind) -> str:
    """Ruleset of a ``public`` router (a campus server network): no NAT, everything forwarded
    both ways; the router itself only answers its LAN."""
    return "\n".join([
        f"# overlay lab router: NAT kind {kind.name} (campus server network: routed, no NAT)",
        f"table {TABLE}",
        f"delete table {TABLE}",
        f"table {TABLE} {{",
        *_INPUT_AND_ACTIONS,
        "  chain forward {",
        "    type filter hook forward priority filter; policy accept;",
        "    jump actions",
        "  }",
        "}",
    ]) + "\n"


def router_ruleset(kind: NatKind, wan_address: str, control_address: str, stun_port: int,
                   udp_servers: Sequence[Tuple[str, int]] = ()) -> str:
    """The complete ruleset for one router (replaces any earlier ``inet olab`` table atomically).

    ``wan_address``: the router's backbone address (the building's public address);
    ``control_address``/``stun_port``: the STUN server that ``udp-blocked`` and ``udp-servers``
    still let through; ``udp_servers``: (address, UDP port) of the campus servers (peer relays)
    that ``udp-servers`` also lets through.
    """
    if kind.public:
        return public_ruleset(kind)
    tracked = kind.filtering in ("eif", "adf") and kind.udp == "open"
    lines = [
        f"# overlay lab router: NAT kind {kind.name} (mapping {kind.mapping}, filtering {kind.filtering}, "
        f"udp {kind.udp})",
        f"table {TABLE}",
        f"delete table {TABLE}",
        f"table {TABLE} {{",
    ]
    if tracked:
        lines += [
            "  # external UDP port -> internal address . port, learnt from outbound packets",
            "  map mapped {",
            "    type inet_service : ipv4_addr . inet_service",
            f"    flags dynamic,timeout; timeout {FILTER_TIMEOUT_S}s;",
            "  }",
        ]
    if tracked and kind.filtering == "adf":
        lines += [
            "  # (external UDP port, remote address) pairs the LAN has sent to",
            "  set contacted {",
            "    type inet_service . ipv4_addr",
            f"    flags dynamic,timeout; timeout {FILTER_TIMEOUT_S}s;",
            "  }",
        ]
    lines += [
        *_INPUT_AND_ACTIONS,
        "  chain forward {",
        "    type filter hook forward priority filter; policy drop;",
        "    jump actions",
        "    ct state invalid drop",
        "    ct state established,related accept",
    ]
    if tracked:
        lines.append('    iifname "wan" oifname "br0" ct status dnat accept')
    if kind.udp in ("stun-only", "servers"):
        lines.append(f'    iifname "br0" oifname "wan" ip daddr {control_address} udp dport {stun_port} accept')
    if kind.udp == "servers":
        for address, port in udp_servers:
            lines.append(f'    iifname "br0" oifname "wan" ip daddr {address} udp dport {port} accept')
    if kind.udp in ("stun-only", "none", "servers"):
        lines.append('    iifname "br0" oifname "wan" meta l4proto udp drop')
    lines += [
        '    iifname "br0" oifname "wan" accept',
        "  }",
        "  chain postrouting_nat {",
        "    type nat hook postrouting priority srcnat; policy accept;",
        "    " + _mapping_rule(kind, wan_address),
        '    oifname "wan" masquerade',
        "  }",
    ]
    if tracked:
        lines += [
            "  chain postrouting_track {",
            "    type filter hook postrouting priority srcnat + 10; policy accept;",
            '    oifname "wan" meta l4proto udp ct direction original '
            "update @mapped { udp sport : ct original ip saddr . ct original proto-src }",
        ]
        if kind.filtering == "adf":
            lines.append('    oifname "wan" meta l4proto udp ct direction original '
                         "update @contacted { udp sport . ip daddr }")
        lines += [
            "  }",
            "  chain prerouting_nat {",
            "    type nat hook prerouting priority dstnat; policy accept;",
        ]
        if kind.filtering == "adf":
            lines.append('    iifname "wan" meta l4proto udp ct state new udp dport . ip saddr @contacted '
                         "dnat ip to udp dport map @mapped")
        else:
            lines.append('    iifname "wan" meta l4proto udp ct state new dnat ip to udp dport map @mapped')
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def actions_ruleset(udp_blocked: bool = False, cut: bool = False,
                    udp_servers: Sequence[Tuple[str, int]] = ()) -> str:
    """Replace the router's runtime ``actions`` chain.

    ``udp_blocked``: drop all forwarded UDP both ways (direct WireGuard paths break; DERP over
    HTTPS still works) except to and from ``udp_servers`` ((address, UDP port) of the campus
    servers, e.g. STUN and the peer relays: the runtime form of ``udp-servers``). ``cut``: drop
    everything forwarded to or from the backbone.
    """
    lines = [f"flush chain {TABLE} actions"]
    if cut:
        lines += [f'add rule {TABLE} actions oifname "wan" drop comment "lab cut"',
                  f'add rule {TABLE} actions iifname "wan" drop comment "lab cut"']
    if udp_blocked:
        for address, port in udp_servers:
            lines += [f'add rule {TABLE} actions ip daddr {address} udp dport {port} accept comment "lab udp-servers"',
                      f'add rule {TABLE} actions ip saddr {address} udp sport {port} accept comment "lab udp-servers"']
    if udp_blocked:
        lines.append(f'add rule {TABLE} actions meta l4proto udp drop comment "lab block-udp"')
    return "\n".join(lines) + "\n"
