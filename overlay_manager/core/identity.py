"""One identity for a peer and one rule for "does this host name or address mean that machine" (pure).

Every lookup of a peer goes through here: the monitor's find (services ``~get_peer``,
``~ping_peer``, ...), watched and required peers, path changes, latency, and the topic-link map.
The C++ encoder's ``subscriber_hosts`` applies the same rules; ``test/data/host_matching_cases.yaml``
runs against both (test/unit/core/test_identity.py, test/cpp/test_host_matching.cpp).

Peer key (:func:`peer_key`): what stays the same for one machine while it exists in the tailnet:
tailscaled's stable node id (ipnstate ``ID``), else its overlay name (DNS name), else its short
name. A machine renamed in the control server keeps its node id, so its latency and path history
follow it.

Host rules (:func:`normalise_host`, :func:`refers_to`, :class:`HostMatcher`):

- case does not matter, a trailing dot does not matter, IPv6 may be written in any form (and in
  URI brackets): ``Robot1.Fleet.Internal.`` = ``robot1.fleet.internal``;
  ``[FD7A:115C:A1E0::0002]`` = ``fd7a:115c:a1e0::2``;
- a host names a peer when it equals the peer's overlay name (FQDN), its short name or one of
  its overlay addresses. An FQDN whose first label is the short name of a peer with no known
  overlay name also names it (older tailscaled, or a self entry before MagicDNS is set). A
  hyphenated name is one label: ``alpha-robot1`` never names ``alpha`` or ``robot1``;
- loopback (``localhost``, ``localhost.localdomain``, ``ip6-localhost``, ``ip6-loopback``,
  127.0.0.0/8, ``::1``) is this machine, unless a peer has that address (test set-ups give
  machines 127.0.0.x addresses);
- order of a lookup (:meth:`HostMatcher.machine`): ``aliases`` (hosts that are no overlay name,
  e.g. a LAN address set as ROS_IP; the encoder's and the node's ``~host_aliases``), then this
  machine's own names and addresses, then the peers, then loopback; else not an overlay machine.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Set

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
"""Host names that mean this machine (with 127.0.0.0/8 and ::1); the same set in C++."""


def normalise_host(text: str) -> str:
    """A host name or address in the form every comparison uses: stripped, lower case, no
    trailing dot, URI brackets removed from IPv6, addresses in their compressed form
    ("" for "")."""
    h = (text or "").strip().rstrip(".").lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if ":" in h or (h[:1].isdigit() and h.replace(".", "").isdigit()):
        try:
            return ipaddress.ip_address(h).compressed
        except ValueError:
            return h
    return h


def is_address(host: str) -> bool:
    """True for an IPv4 or IPv6 address (any case, brackets allowed)."""
    try:
        ipaddress.ip_address(normalise_host(host))
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """True for a name in :data:`LOOPBACK_NAMES`, 127.0.0.0/8 and ::1."""
    h = normalise_host(host)
    if h in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def short_label(host: str) -> str:
    """The first label of a host name ("alpha-robot1.fleet.internal" -> "alpha-robot1"); an
    address is returned whole (normalised)."""
    h = normalise_host(host)
    return h if is_address(h) else h.split(".", 1)[0]


def peer_key(peer: Any) -> str:
    """The one key of a peer (a PeerState or a Peer message): node id, else DNS name, else short
    name. The same machine keeps its key when it is renamed (the node id does not change)."""
    node_id = getattr(peer, "node_id", "") or ""
    if node_id:
        return node_id
    return key_of("", getattr(peer, "dns_name", "") or "", getattr(peer, "name", "") or "")


def key_of(node_id: str, dns_name: str, name: str) -> str:
    """:func:`peer_key` from its parts, for a peer that is not built yet (read from its status JSON)."""
    return node_id or normalise_host(dns_name) or normalise_host(name)


def _names(peer: Any) -> Set[str]:
    """Every normalised host that names the peer exactly (FQDN, short name, addresses)."""
    out = {normalise_host(peer.dns_name), normalise_host(peer.name)}
    out.update(normalise_host(a) for a in peer.addresses)
    out.discard("")
    return out


def refers_to(host: str, peer: Any) -> bool:
    """Whether ``host`` (a name or address) names ``peer`` (see the module docstring)."""
    return names_peer(host)(peer)


def names_peer(host: str) -> Callable[[Any], bool]:
    """:func:`refers_to` with ``host`` fixed, normalised once: for scanning many peers."""
    h = normalise_host(host)
    if not h:
        return lambda _peer: False
    if is_address(h):  # addresses are compared only with addresses (parsed only here)
        v6 = ":" in h
        # IPv4 text is canonical as tailscaled writes it; IPv6 may be spelt another way: parse it
        return lambda peer: any(a == h or (v6 and ":" in a and normalise_host(a) == h) for a in peer.addresses)
    label = h.split(".", 1)[0] if "." in h else ""

    def test(peer: Any) -> bool:
        name = normalise_host(peer.name)
        if h == name or h == normalise_host(peer.dns_name):
            return True
        return bool(label) and not peer.dns_name and bool(name) and label == name
    return test


class HostMatcher:
    """Which machine a host name or address refers to, for one set of peers (indexed once).

    Args:
        peers: the tailnet's other machines (PeerState or Peer messages: name, dns_name,
            addresses). When two peers claim one host the first in this order wins.
        self_peer: this machine as tailscaled reports it (None = not known yet).
        self_names: this machine's other names (config hostname and overlay name), so lookups
            work before tailscaled answers.
        aliases: host -> short machine name for hosts that are no overlay name (``~host_aliases``);
            looked up first.
    """

    def __init__(self, peers: Iterable[Any], self_peer: Optional[Any] = None, self_names: Iterable[str] = (),
                 aliases: Optional[Mapping[str, str]] = None) -> None:
        """Index the peers' names and addresses."""
        self.self_peer = self_peer
        names = [n for n in self_names if n]
        if self_peer is not None and self_peer.name:
            self.self_name = self_peer.name
        else:
            self.self_name = short_label(names[0]) if names else ""
        self._self: Set[str] = {normalise_host(n) for n in names}
        if self_peer is not None:
            self._self.update(_names(self_peer))
        self._self.discard("")
        self._exact: Dict[str, Any] = {}
        self._by_label: Dict[str, Any] = {}   # short name -> peer, for peers without an overlay name
        for p in peers:
            for k in _names(p):
                self._exact.setdefault(k, p)
            if not p.dns_name and p.name:
                self._by_label.setdefault(normalise_host(p.name), p)
        self._aliases = {normalise_host(k): short_label(v) for k, v in (aliases or {}).items()}

    def is_self(self, host: str) -> bool:
        """Whether host is one of this machine's own names or addresses (loopback not counted)."""
        h = normalise_host(host)
        return bool(h) and (h in self._self or (
            "." in h and not is_address(h) and self.self_peer is not None and not self.self_peer.dns_name
            and h.split(".", 1)[0] == normalise_host(self.self_peer.name)))

    def peer(self, host: str) -> Optional[Any]:
        """The peer ``host`` names (:func:`refers_to`); None when none does."""
        h = normalise_host(host)
        if not h:
            return None
        p = self._exact.get(h)
        if p is None and "." in h and not is_address(h):
            p = self._by_label.get(h.split(".", 1)[0])
        return p

    def alias(self, host: str) -> str:
        """The machine ``~host_aliases`` gives for host ("" = none)."""
        return self._aliases.get(normalise_host(host), "")

    def machine(self, host: str) -> str:
        """Short name of the machine host refers to; "" = not an overlay machine (or no host).

        Order: aliases, this machine, peers, loopback (this machine)."""
        h = normalise_host(host)
        if not h:
            return ""
        if h in self._aliases:
            return self._aliases[h]
        if self.is_self(h):
            return self.self_name
        p = self.peer(h)
        if p is not None:
            return p.name
        return self.self_name if is_loopback(h) else ""

    def by_name(self, name: str) -> Optional[Any]:
        """The peer with this short name (None for this machine and unknown names)."""
        h = normalise_host(name)
        return self._exact.get(h) if h and "." not in h and not is_address(h) else None
