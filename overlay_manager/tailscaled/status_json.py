"""Decode tailscaled's /localapi/v0/status body again only where it changed.

At 500 peers the status is about 480 KB of JSON, read twice a second. Most peers are idle and
their JSON text is the same from one read to the next; decoding the whole body (``json.loads``,
about 4 ms here) and then comparing every peer's decoded object with the last one (about 2.5 ms)
was most of the node's CPU. tailscaled writes the status with Go's ``json.Encoder`` indented by
tabs, so each peer of the ``Peer`` map is a run of lines that starts with two tabs and a quote,
and nothing else in that map does (JSON strings cannot hold a raw newline). :class:`StatusDecoder`
cuts the map into one text per peer, reuses the decoded object of a peer whose text is the same
as last time, decodes the others and the rest of the document, and puts them together. The
result equals ``json.loads`` of the whole body; whatever does not have the expected shape (another
layout, a broken answer) is decoded whole, with json's own errors.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

PEER_MAP = '\n\t"Peer": {'
"""Where the peer map starts in tailscaled's indented status (a key of the top-level object)."""
PEER_START = '\n\t\t"'
"""Where each peer of the map starts (a key at depth two)."""
MAP_END = "\n\t}"
"""Where a value of the top-level object ends."""


class StatusDecoder:
    """Decodes status bodies one after another, reusing unchanged peers' objects.

    One reader at a time (the node's poll thread). The objects it returns for unchanged peers
    are the same objects it returned before: callers must not change them (core.peers.SnapshotBuilder
    keeps a peer's PeerState while its object is the same).
    """

    def __init__(self) -> None:
        # the peers of the last body, in order: each one's text in the map (from after its
        # indentation to its trailing comma) and (its key, its decoded object). tailscaled writes
        # the map sorted by key, so a peer keeps its place while the peers stay the same; after
        # a peer joins or leaves, the ones after it are decoded again once.
        self._chunks: List[str] = []
        self._decoded: List[Tuple[str, Any]] = []
        self.reused = 0  # peers reused by the last decode (for tests and benchmarks)

    def decode(self, text: str) -> Any:
        """json.loads(text), faster when the peers' text repeats. Raises what json.loads raises
        (a body that fails in pieces is decoded whole, so the error is json's for the body)."""
        try:
            doc = self._decode_parts(text)
        except (ValueError, RecursionError):
            doc = None
        if doc is None:
            self._chunks, self._decoded = [], []
            self.reused = 0
            return json.loads(text)
        return doc

    def _decode_parts(self, text: str) -> Optional[Dict[str, Any]]:
        """The decoded document, or None when text does not have tailscaled's indented layout."""
        start = text.find(PEER_MAP)
        if start < 0 or text.find(PEER_MAP, start + 1) >= 0:
            return None
        body_from = start + len(PEER_MAP)
        end = text.find(MAP_END, body_from)
        if text.startswith("}", body_from) or end < 0:
            return None  # "Peer": {} (nothing to reuse) or no end
        chunks = text[body_from:end].split(PEER_START)
        if chunks[0] != "":
            return None
        doc = json.loads(text[:body_from] + "}" + text[end + len(MAP_END):])
        if not isinstance(doc, dict) or doc.get("Peer") != {}:
            return None
        old_chunks, old_decoded = self._chunks, self._decoded
        n_old = len(old_chunks)
        decoded: List[Tuple[str, Any]] = []
        peers: Dict[str, Any] = {}
        reused = 0
        last = len(chunks) - 1
        for i in range(1, last + 1):
            chunk = chunks[i]
            if chunk.endswith(",") != (i < last):
                return None  # a comma missing between peers, or one after the last
            if i <= n_old and old_chunks[i - 1] == chunk:
                hit: Optional[Tuple[str, Any]] = old_decoded[i - 1]
                reused += 1
            else:
                hit = _decode_peer(chunk)
                if hit is None:
                    return None
            decoded.append(hit)
            peers[hit[0]] = hit[1]
        self._chunks, self._decoded = chunks[1:], decoded
        self.reused = reused
        doc["Peer"] = peers
        return doc


def _decode_peer(chunk: str) -> Optional[Tuple[str, Any]]:
    """'<key>": {...}[,]' (a peer of the map after its opening quote) -> (key, decoded object)."""
    colon = chunk.find('": ')
    if colon < 0:
        return None
    key = json.loads('"' + chunk[:colon] + '"')  # escapes decoded, control characters refused, as json does
    value = chunk[colon + 3:-1] if chunk.endswith(",") else chunk[colon + 3:]
    if not (value.startswith("{") and value.endswith("}")):
        return None
    return key, json.loads(value)
