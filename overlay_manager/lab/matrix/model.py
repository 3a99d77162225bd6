"""The NAT-matrix model: which path tailscale should find for every pair of NAT kinds (pure).

Used by ``lab nat-matrix`` (run.py) to lay out the matrix lab (two buildings per NAT kind, one
host each) and to put the expected outcome beside each measured cell.

How the expectation is derived (A and B two hosts behind NATs; each knows the other's endpoint
as the STUN server saw it, ``E_B = IP_B:p_B``; both send disco pings to those endpoints at the
same time; one packet getting through is enough, because the receiver answers to the packet's
source through a mapping the sender's own NAT has just created):

A's packet to ``E_B`` reaches B when B's NAT accepts new inbound packets from ``IP_A:a`` at ``p_B``
(``a`` = whatever port A's NAT picked towards B):

* B filters endpoint-independently (``eif``): yes, ``p_B`` exists (B's STUN traffic created it).
* B filters address-dependently (``adf``): only if B has sent to ``IP_A`` *from* ``p_B``, i.e.
  B's mapping is endpoint-independent (``eim``). With ``adm``/``adpm`` B's packets to A leave from
  another port, so ``p_B`` has only contacted the STUN server.
* B filters address-and-port-dependently (``adpf``): only if B has sent from ``p_B`` to exactly
  ``IP_A:a``; B sends to ``E_A = IP_A:p_A``, so both mappings must be endpoint-independent
  (``p_B`` is B's port towards A, and ``a = p_A``).

direct = (A->B gets through) or (B->A gets through); ``udp-blocked`` and ``tcp-only`` have no UDP
path to the peer at all, so DERP. Consequence worth noting: endpoint-independent mapping with
address-dependent filtering is enough against *any* mapping (the peer's port does not matter to
``adf``), which is stricter-looking than "ADPM needs EIF on the other side" but follows from RFC
4787's definitions. tailscale v1.102 has no port prediction for hard NATs (it only adds
``public-ip:41641`` as a guess when netcheck says the mapping varies by destination, and netcheck
cannot tell with a single STUN server), so nothing beyond this reasoning is expected to help.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from overlay_manager.lab.campus.spec_model import FILTERINGS, MAPPINGS, NatKind, parse_nat_kind

KINDS: Tuple[str, ...] = tuple(f"{m}-{f}" for m in MAPPINGS for f in FILTERINGS) + ("udp-blocked", "tcp-only")
"""Every NAT kind of the matrix, in table order."""
RELAY_KINDS: Tuple[str, ...] = KINDS + ("udp-servers",)
"""The kinds of ``--relay``: plus the campus mode that lets UDP out only to STUN and the relay."""
TEAM = "matrix"
RELAY_BUILDING = "campus"
"""``public`` building (campus server network) of the relay host in ``--relay`` runs."""
RELAY_HOST = "relay"

NOTES: Dict[Tuple[str, str], str] = {}
"""Explanations of measured disagreements, keyed by (row kind, column kind); filled from runs."""


def building(kind: str, copy: int) -> str:
    """Building name of copy 0 or 1 of a NAT kind."""
    return f"{kind}-{'ab'[copy]}"


def host(kind: str, copy: int) -> str:
    """The one host in that building."""
    return f"h-{building(kind, copy)}"


def matrix_spec(relay: bool = False) -> Dict[str, Any]:
    """The lab spec: two buildings per NAT kind, one robot each, all in one team; with ``relay``
    also the ``udp-servers`` kind and a relay host (base station) in a ``public`` building."""
    kinds = RELAY_KINDS if relay else KINDS
    buildings = {building(k, c): {"nat": k, "hosts": {host(k, c): {"team": TEAM, "role": "robot"}}}
                 for k in kinds for c in (0, 1)}
    spec: Dict[str, Any] = {"name": "nat_matrix_relay" if relay else "nat_matrix", "buildings": buildings,
                            "teams": {TEAM: {"master": host(kinds[0], 0)}}}
    if relay:
        buildings[RELAY_BUILDING] = {"nat": "public",
                                     "hosts": {RELAY_HOST: {"team": TEAM, "role": "base_station"}}}
        spec["relays"] = {RELAY_HOST: {}}
    return spec


def _gets_through(src: NatKind, dst: NatKind) -> bool:
    """Does a hole-punching packet from behind ``src`` reach the host behind ``dst``?"""
    if dst.filtering == "eif":
        return True
    if dst.filtering == "adf":
        return dst.mapping == "eim"
    return dst.mapping == "eim" and src.mapping == "eim"


def expected(a: str, b: str) -> Tuple[str, str]:
    """Expected path between hosts behind NAT kinds ``a`` and ``b``, and the one-line reason."""
    ka, kb = parse_nat_kind(a), parse_nat_kind(b)
    for k, name in ((ka, a), (kb, b)):
        if k.udp != "open":
            return "derp", f"{name}: no UDP to the peer"
    ab, ba = _gets_through(ka, kb), _gets_through(kb, ka)
    if ab or ba:
        who = "both ways" if ab and ba else f"{a}->{b}" if ab else f"{b}->{a}"
        return "direct", f"first packet gets in: {who}"
    return "derp", "neither side's first packet passes the other NAT's filter"


def expected_with_relay(a: str, b: str) -> Tuple[str, str]:
    """Expected path with a peer relay on the campus server network that both may use.

    Tailscale prefers a direct path; otherwise both ends send UDP to the relay's address and port
    (a server with a public address: any NAT lets the replies back in), so peer-relay unless one
    side cannot send UDP to the relay at all (``udp-blocked``: only STUN; ``tcp-only``).
    """
    path, why = expected(a, b)
    if path == "direct":
        return path, why
    for k, name in ((parse_nat_kind(a), a), (parse_nat_kind(b), b)):
        if k.udp in ("stun-only", "none"):
            return "derp", f"{name}: no UDP to the relay"
    return "peer-relay", "no direct path; both send UDP to the relay's port"


def rule_of_thumb(a: str, b: str) -> str:
    """The common shorthand: hole punching fails when both sides have a port-changing (hard)
    mapping, or when one has and the other's filtering is not endpoint-independent."""
    ka, kb = parse_nat_kind(a), parse_nat_kind(b)
    if ka.udp != "open" or kb.udp != "open":
        return "derp"
    hard_a, hard_b = ka.mapping != "eim", kb.mapping != "eim"
    if hard_a and hard_b:
        return "derp"
    if (hard_a and kb.filtering != "eif") or (hard_b and ka.filtering != "eif"):
        return "derp"
    return "direct"


def why_not_rule_of_thumb(a: str, b: str, observed: str) -> str:
    """Why the measurement differs from the shorthand (from the model), or "" when it does not."""
    if rule_of_thumb(a, b) == observed:
        return ""
    if observed != "direct" or expected(a, b)[0] != "direct":
        return "differs from the shorthand and from the model: not explained"
    ka, kb = parse_nat_kind(a), parse_nat_kind(b)
    dst, dk = (b, kb) if _gets_through(ka, kb) else (a, ka)
    if dk.filtering == "eif":
        return (f"shorthand says derp; but {dst} filters endpoint-independently, so the peer's first packet "
                "to the port STUN saw gets in whatever port the peer's NAT picked")
    return (f"shorthand says derp; but {dst} maps endpoint-independently, so it sent to the peer's address "
            "from the port STUN saw, and address-dependent filtering does not check the peer's port")


def cells(kinds: Sequence[str] = KINDS) -> List[Tuple[str, str, str, str]]:
    """(row kind, column kind, host A, host B) for the upper triangle incl. the diagonal.

    Off-diagonal cells alternate between the two copies of each kind so that more pings can
    run at once (the copies are identical)."""
    out = []
    for i, a in enumerate(kinds):
        for j, b in enumerate(kinds):
            if j < i:
                continue
            if i == j:
                out.append((a, b, host(a, 0), host(b, 1)))
            else:
                c = (i + j) % 2
                out.append((a, b, host(a, c), host(b, 1 - c)))
    return out
