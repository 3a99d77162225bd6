"""peers.parse_status with a cache: unchanged peers are reused, changed ones parsed again, gone
ones forgotten; the result equals a parse without the cache. with_latency copies only the peers
whose latency changed."""

from __future__ import annotations

import copy
import math

from overlay_manager.core.identity import peer_key
from overlay_manager.core.peers import parse_status, with_latency
from overlay_manager.testing.tsfake import recorded


def two_peers() -> dict:
    st = recorded("status_direct.json")
    (key, proto), = st["Peer"].items()
    other = copy.deepcopy(proto)
    other.update(HostName="robotc", DNSName="robotc.fleet.internal.", TailscaleIPs=["100.64.0.3"], ID="9")
    st["Peer"] = {key: proto, "nodekey:other": other}
    return st


def test_cache_reuses_unchanged_peers() -> None:
    cache: dict = {}
    first = parse_status(two_peers(), cache)
    assert len(cache) == 2
    raw = two_peers()
    raw["Peer"]["nodekey:other"]["CurAddr"] = ""
    raw["Peer"]["nodekey:other"]["Active"] = True
    second = parse_status(raw, cache)
    assert second == parse_status(raw)                     # same result as without a cache
    b1 = {p.name: p for p in first.peers}
    b2 = {p.name: p for p in second.peers}
    assert b2["robotb"] is b1["robotb"]                     # unchanged: the same object
    assert b2["robotc"].path == "derp" and b1["robotc"].path == "direct"
    del raw["Peer"]["nodekey:other"]
    parse_status(raw, cache)
    assert list(cache) == [next(iter(raw["Peer"]))]


def test_with_latency_copies_only_changed_peers() -> None:
    snap = parse_status(two_peers())
    key = peer_key({p.name: p for p in snap.peers}["robotb"])  # its node id
    out = with_latency(snap, {key: 1.5})
    by = {p.name: p for p in out.peers}
    assert by["robotb"].latency_ms == 1.5
    assert by["robotc"] is {p.name: p for p in snap.peers}["robotc"]
    assert math.isnan(by["robotc"].latency_ms)
    again = with_latency(out, {key: 1.5})
    assert all(a is b for a, b in zip(again.peers, out.peers))
