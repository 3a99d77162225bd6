"""The node's fast path at hundreds of peers: one row per peer, built once per changed status chunk.

At 500 peers tailscaled's status is read twice a second and ``~peers`` and ``/diagnostics`` go
out every second, yet only the few peers that carry traffic change between two reads. This
stage is the one place where that is exploited (pure: no ROS, no I/O).

Contract of :class:`PeerRows` (the overlay-poll thread calls :meth:`PeerRows.update` once per
status read):

- Input: the status's decoded ``Peer`` map (status key -> the peer's decoded JSON object, as
  ``status_json.StatusDecoder`` returns it: the *same object* as last read when the peer's JSON
  text did not change), the DERP region names and the latency map.
- A row is keyed by the peer's status key. The row of the last read is reused as it is (the
  same :class:`PeerRow` object, so the same ``PeerState`` object) when its chunk is unchanged
  (the same decoded object, or an equal one when the body had to be decoded whole) and the
  values it took from outside its chunk are equal: the relay host's name (peer-relay peers
  only: it comes from the other peers), the readable DERP region name (derp peers only) and
  the latency (NaN equal to NaN). A changed chunk is parsed again; a changed outside value only
  re-applies it to the parsed state. A peer no longer in the map loses its row.
- Rows come sorted as ``Snapshot.peers`` (by name, then DNS name; ties in the map's order);
  when every row was reused and the map's order is the same, the very same tuple is returned,
  and a row built again for a peer that kept its name takes its predecessor's place unsorted.

What a row holds, built at most once per row (by the overlay-report thread, on first use):
its ``Peer`` message and serialized bytes (:meth:`PeerRow.peer_wire`), and its /diagnostics
entry (:meth:`PeerRow.diagnostic`) with its ``DiagnosticStatus`` and bytes
(:meth:`PeerRow.diagnostic_wire`). The diagnostic entry also depends on whether the peer is
required and on the NAT's DERP wording (the only report inputs that change without a status
chunk changing); it is built again, on the same row, only when those differ from last time (the
required set is compared by identity first: OverlayMonitor.required_peers keeps one per config).
The message builders are given by the caller (node_messages.py) and must be the same objects
from call to call for their result to be reused.

Every per-peer value the node shows is applied here, never by a ``dataclasses.replace`` of
``Snapshot.peers`` afterwards: such a copy would be missing from the rows' bytes, and the
reporting thread's identity tests (peers.same_topology) would compare it field by field.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, NamedTuple, Optional, Sequence, Tuple, TypeVar

from overlay_manager.core.peers import PeerState, derp_region_name, parse_peer, relay_host_name
from overlay_manager.monitor.diagnose import peer_diagnostic
from overlay_manager.monitor.readings import Diagnostic

W = TypeVar("W")


class PeerRow:
    """One peer as the node reports it: its state and, built on first use, its wire forms.

    key: the peer's key in the status's ``Peer`` map ("" for rows not built from a status read);
    source: the decoded JSON object it was parsed from (None likewise); base: the state parsed
    from it alone; state: base with the relay host, DERP region name and latency applied (what
    ``Snapshot.peers`` holds). Never changed after construction except for its caches, which
    only the overlay-report thread fills.
    """

    __slots__ = ("key", "source", "base", "state", "_peer_wire", "_diag", "_diag_wire")

    def __init__(self, key: str, source: Optional[Mapping[str, Any]], base: PeerState, state: PeerState) -> None:
        self.key = key
        self.source = source
        self.base = base
        self.state = state
        self._peer_wire: Optional[Tuple[Callable[..., Any], Any]] = None
        self._diag: Optional[Tuple[bool, str, Diagnostic, FrozenSet[str]]] = None
        self._diag_wire: Optional[Tuple[Callable[..., Any], Diagnostic, Any]] = None

    def peer_wire(self, make: Callable[[PeerState], W]) -> W:
        """make(state), e.g. (Peer message, its bytes); built once per row (and per make)."""
        w = self._peer_wire
        if w is None or w[0] is not make:
            w = (make, make(self.state))
            self._peer_wire = w
        return w[1]

    def diagnostic(self, required: FrozenSet[str], derp_why: str) -> Diagnostic:
        """The peer's /diagnostics entry (diagnose.peer_diagnostic). required: lower-case short
        names of the required peers; derp_why: diagnose.derp_reason of the NAT check. Built again
        only when this peer's required flag or derp_why differ from the last call."""
        d = self._diag
        if d is not None and d[3] is required and d[1] == derp_why:
            return d[2]
        flag = self.state.name.lower() in required
        if d is None or d[0] != flag or d[1] != derp_why:
            d = (flag, derp_why, peer_diagnostic(self.state, flag, derp_why), required)
        else:
            d = (flag, derp_why, d[2], required)
        self._diag = d
        return d[2]

    def diagnostic_wire(self, required: FrozenSet[str], derp_why: str, make: Callable[[Diagnostic], W]) -> W:
        """make(diagnostic(required, derp_why)), e.g. (DiagnosticStatus, its bytes); built again
        only when the entry was built again (or make is another object)."""
        diag = self.diagnostic(required, derp_why)
        w = self._diag_wire
        if w is None or w[0] is not make or w[1] is not diag:
            w = (make, diag, make(diag))
            self._diag_wire = w
        return w[2]


def _same_ms(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def plain_rows(states: Sequence[PeerState]) -> Tuple[PeerRow, ...]:
    """Rows for states that do not come from a status read (the blinded peers while tailscaled
    cannot be read, or a reading built by hand): nothing reused, caches filled on first use."""
    return tuple(PeerRow("", None, p, p) for p in states)


def rows_of(rows: Sequence[PeerRow], peers: Sequence[PeerState]) -> Sequence[PeerRow]:
    """rows when they are the rows of peers, the same states in the same order (as the monitor's
    readings keep them), else :func:`plain_rows` of peers."""
    if len(rows) == len(peers) and all(r.state is p for r, p in zip(rows, peers)):
        return rows
    return plain_rows(peers)


class PeerRows:
    """The stage: status chunks -> rows, reusing the rows of unchanged chunks (see the module
    docstring for the contract). One caller at a time (the overlay-poll thread)."""

    def __init__(self) -> None:
        self._rows: Dict[str, PeerRow] = {}
        self._order: List[PeerRow] = []           # the last rows in the map's order
        self._sorted: Tuple[PeerRow, ...] = ()    # the same, sorted as Snapshot.peers
        self._place: Dict[str, int] = {}          # status key -> index in _sorted
        self._names: Mapping[str, str] = {}       # region_names of the last update
        self._latency: Dict[str, float] = {}      # latency_ms of the last update
        self.built = 0                            # rows built by the last update (tests, benchmarks)
        self.parsed = 0                           # chunks parsed by the last update

    def update(self, chunks: Any, region_names: Mapping[str, str],
               latency_ms: Mapping[str, float]) -> Tuple[PeerRow, ...]:
        """The rows for this read.

        Args:
            chunks: the status's ``Peer`` value (status key -> decoded ipnstate.PeerStatus);
                anything but a dict means no peers, values that are not dicts are skipped.
            region_names: DERP region code -> readable name (peers.derp_region_name).
            latency_ms: node key (dns_name or name) -> last measured RTT in ms.
        """
        old = self._rows
        # nothing from outside the chunks changed: a row whose chunk is the same object is
        # reused after one lookup (peer-relay rows still look up their relay host)
        outside_same = (region_names is self._names or region_names == self._names) and \
            _same_latency(latency_ms, self._latency)
        rows: Dict[str, PeerRow] = {}
        order: List[PeerRow] = []
        fresh: List[PeerRow] = []
        parsed = 0
        if isinstance(chunks, dict):
            for key, src in chunks.items():
                hit = old.get(key)
                if outside_same and hit is not None and hit.source is src and not hit.base.peer_relay:
                    rows[key] = hit
                    order.append(hit)
                    continue
                if not isinstance(src, dict):
                    continue
                if hit is not None and (hit.source is src or hit.source == src):
                    base = hit.base
                else:
                    base = parse_peer(src)
                    parsed += 1
                relay_host = relay_host_name(base.peer_relay, chunks.values()) if base.peer_relay else ""
                derp = derp_region_name(base, region_names)
                ms = latency_ms.get(base.dns_name or base.name, math.nan)
                if (hit is None or hit.base is not base or hit.state.relay_host != relay_host
                        or hit.state.derp_region != derp or not _same_ms(hit.state.latency_ms, ms)):
                    state = base
                    if relay_host or derp or not math.isnan(ms):
                        state = replace(base, relay_host=relay_host, derp_region=derp, latency_ms=ms)
                    hit = PeerRow(key, src if hit is None or hit.base is not base else hit.source, base, state)
                    fresh.append(hit)
                rows[key] = hit
                order.append(hit)
        self._sorted = self._sort(order, rows, fresh)
        self._rows, self._order = rows, order
        self._names, self._latency = region_names, dict(latency_ms)
        self.built, self.parsed = len(fresh), parsed
        return self._sorted

    def _sort(self, order: List[PeerRow], rows: Dict[str, PeerRow], fresh: List[PeerRow]) -> Tuple[PeerRow, ...]:
        """order sorted as Snapshot.peers (by name, then DNS name; ties in the map's order).
        Rows that only replace a row of the same key and name are put in its place."""
        old_order, old_rows = self._order, self._rows
        new_ids = {id(r) for r in fresh}
        if len(order) == len(old_order) and all(
                a is b or (a.key == b.key and id(a) in new_ids) for a, b in zip(order, old_order)):
            if not fresh:
                return self._sorted
            if all(old_rows[r.key].state.name == r.state.name and old_rows[r.key].state.dns_name == r.state.dns_name
                   for r in fresh):
                out = list(self._sorted)
                for r in fresh:
                    out[self._place[r.key]] = r
                return tuple(out)
        out_t = tuple(sorted(order, key=lambda r: (r.state.name, r.state.dns_name)))
        self._place = {r.key: i for i, r in enumerate(out_t)}
        return out_t


def _same_latency(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    """a and b hold the same keys and equal values (NaN equal to NaN)."""
    return len(a) == len(b) and all(k in b and _same_ms(v, b[k]) for k, v in a.items())


class DiagnosticParts(NamedTuple):
    """/diagnostics as the monitor states it: the entries about this machine (head, in order),
    then one per peer row (built with required and derp_why, see PeerRow.diagnostic)."""

    head: List[Diagnostic]
    rows: Sequence[PeerRow]
    required: FrozenSet[str]
    derp_why: str

    def entries(self) -> List[Diagnostic]:
        """Every entry, in order."""
        return self.head + [r.diagnostic(self.required, self.derp_why) for r in self.rows]
