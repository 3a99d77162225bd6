"""A value per immutable source object, built again only for sources not seen last time.

The node's parser and monitor reuse a PeerState object for as long as nothing about that peer
changed, so "the same object as last time" is the cheapest test of "unchanged": a 500-peer report
then costs a dictionary lookup per peer instead of hashing or comparing 500 dataclasses. Used for
the per-peer diagnostic entries and for the per-peer messages and their serialized bytes.
"""

from __future__ import annotations

from typing import Callable, Dict, Generic, Hashable, Iterable, List, Tuple, TypeVar

S = TypeVar("S")
V = TypeVar("V")


class IdentityMemo(Generic[S, V]):
    """build(source) per source, reused while the same object comes again with the same ``extra``.

    Sources are matched by identity (``is``), never by equality; the memo holds the sources it
    saw last time (so their ids cannot be reused) and forgets those not given again. One caller
    at a time.
    """

    def __init__(self) -> None:
        self._memo: Dict[int, Tuple[S, Hashable, V]] = {}

    def map(self, sources: Iterable[S], build: Callable[[S], V],
            extra: Callable[[S], Hashable] = lambda _s: None) -> List[V]:
        """The values for sources, in order. extra(source): anything else the value depends on
        (compared with ==); build runs for new sources and for those whose extra changed."""
        old = self._memo
        new: Dict[int, Tuple[S, Hashable, V]] = {}
        out: List[V] = []
        for s in sources:
            key = extra(s)
            hit = old.get(id(s))
            if hit is None or hit[0] is not s or hit[1] != key:
                hit = (s, key, build(s))
            new[id(s)] = hit
            out.append(hit[2])
        self._memo = new
        return out
