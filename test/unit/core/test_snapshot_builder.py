"""core.peers.SnapshotBuilder and PeerState: one object per peer from the status JSON to the published
messages. A peer whose chunk and outside values (relay host, DERP region name, latency) did not change
is the same object (so what was built from it is kept); a changed one is parsed again, once, with all
its values; a gone one is forgotten; nothing can be applied to a built peer afterwards."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
from typing import List, Tuple

import pytest

from overlay_manager.core import peers as P
from overlay_manager.core.identity import normalise_host, peer_key
from overlay_manager.monitor.diagnose import DiagnosticParts, peer_diagnostic
from overlay_manager.tailscaled.status_json import StatusDecoder
from overlay_manager.testing.tsfake import recorded, status_body

NAMES = {"lab": "Lab region"}


def tailnet(n: int = 4) -> dict:
    """The recorded status with n peers robot-000..: direct, with distinct names and addresses."""
    st = recorded("status_direct.json")
    (proto,) = st["Peer"].values()
    st["Peer"] = {}
    for i in range(n):
        ps = copy.deepcopy(proto)
        ps.update(HostName=f"robot-{i:03d}", DNSName=f"robot-{i:03d}.fleet.internal.",
                  TailscaleIPs=[f"100.64.1.{i}"], ID=str(100 + i), PublicKey=f"nodekey:{i:064x}")
        st["Peer"][f"nodekey:{i:064x}"] = ps
    return st


class Wire:
    """A stand-in for the node's message builders: (text, bytes) of a peer, counting builds."""

    def __init__(self) -> None:
        self.built: List[str] = []

    def __call__(self, value: object) -> Tuple[str, bytes]:
        text = repr(value)
        self.built.append(text)
        return text, text.encode()


def read(builder: P.SnapshotBuilder, dec: StatusDecoder, st: dict, latency=None) -> Tuple[P.PeerState, ...]:
    """One status read as the node does it: decoded in pieces, then the builder."""
    return builder.build(dec.decode(status_body(st).decode()), NAMES, latency or {}).peers


def direct(ms: float) -> P.Latency:
    """A ping answered on a direct path."""
    return P.Latency(ms, P.PATH_DIRECT)


def with_values(p: P.PeerState, **changes) -> P.PeerState:
    """A new PeerState with p's values and changes (the test's expectation; the code has no such copy)."""
    values = dict(zip(P._FIELDS, p.__reduce__()[1]))
    values.update(changes)
    return P.PeerState(**values)


def test_unchanged_chunk_gives_the_same_peer_and_the_same_bytes() -> None:
    builder, dec, wire = P.SnapshotBuilder(), StatusDecoder(), Wire()
    st = tailnet()
    first = read(builder, dec, st)
    assert builder.built == 4
    b1 = [p.derived(wire)[1] for p in first]
    second = read(builder, dec, st)
    assert dec.reused == 4 and builder.built == 0
    assert second is first                                   # the same tuple: nothing to sort again
    assert [p.derived(wire)[1] for p in second] == b1 and len(wire.built) == 4  # built once per peer
    assert all(p.derived(wire)[1] is b for p, b in zip(second, b1))


def test_changed_chunk_gives_a_new_peer_and_keeps_the_others() -> None:
    builder, dec, wire = P.SnapshotBuilder(), StatusDecoder(), Wire()
    st = tailnet()
    first = read(builder, dec, st)
    for p in first:
        p.derived(wire)
    st["Peer"]["nodekey:" + "0" * 64]["RxBytes"] += 1000      # traffic: robot-000's chunk text changes
    second = read(builder, dec, st)
    assert builder.built == 1
    assert second[0] is not first[0] and second[0].rx_bytes == first[0].rx_bytes + 1000
    assert all(a is b for a, b in zip(first[1:], second[1:]))
    assert second[0].derived(wire)[1] != first[0].derived(wire)[1] and len(wire.built) == 5


def test_removed_peer_is_forgotten() -> None:
    builder, dec = P.SnapshotBuilder(), StatusDecoder()
    st = tailnet()
    first = read(builder, dec, st)
    gone = next(iter(st["Peer"]))
    kept = copy.deepcopy(st)
    del kept["Peer"][gone]
    second = read(builder, dec, kept)
    assert [p.name for p in second] == [p.name for p in first[1:]]
    assert builder.built == 0 and all(a is b for a, b in zip(second, first[1:]))
    third = read(builder, dec, st)                           # back again: a new peer (the old one was forgotten)
    assert third[0].name == "robot-000" and third[0] is not first[0] and third[0] == first[0] and builder.built == 1


def test_latency_change_builds_the_peer_again_with_all_its_values() -> None:
    builder, dec, wire = P.SnapshotBuilder(), StatusDecoder(), Wire()
    st = tailnet()
    first = read(builder, dec, st)
    old = first[1].derived(wire)[1]
    second = read(builder, dec, st, {"101": direct(2.5)})
    assert builder.built == 1
    assert second[1] is not first[1] and second[1] == with_values(first[1], latency_ms=2.5)
    assert second[1].derived(wire)[1] != old and b"latency_ms=2.5" in second[1].derived(wire)[1]
    assert all(a is b for i, (a, b) in enumerate(zip(first, second)) if i != 1)
    assert read(builder, dec, st, {"101": direct(2.5)})[1] is second[1]   # same value: kept
    assert math.isnan(read(builder, dec, st)[1].latency_ms)                # measurement dropped


def test_a_latency_shows_only_on_the_path_it_was_measured_on() -> None:
    """A latency measured on the old path says nothing about the new one: a peer whose path
    changed is built without it in that very read (no second build, no copy afterwards)."""
    builder, dec = P.SnapshotBuilder(), StatusDecoder()
    st = tailnet()
    key = "nodekey:" + "0" * 64
    assert read(builder, dec, st, {"100": direct(1.0)})[0].latency_ms == 1.0
    st["Peer"][key]["CurAddr"] = ""                                          # direct -> derp
    moved = read(builder, dec, st, {"100": direct(1.0)})[0]
    assert moved.path == P.PATH_DERP and math.isnan(moved.latency_ms)
    on_derp = {"100": P.Latency(4.0, P.PATH_DERP, "lab")}                   # a ping on the new path
    assert read(builder, dec, st, on_derp)[0].latency_ms == 4.0
    st["Peer"][key]["Relay"] = "fra"                                         # re-homed: derp -> derp
    assert math.isnan(read(builder, dec, st, on_derp)[0].latency_ms)
    assert P.Latency(1.0, P.PATH_DIRECT, "lab").holds_for(P.PATH_DIRECT, "fra")   # the region matters on derp only
    assert not P.Latency(1.0, P.PATH_IDLE).holds_for(P.PATH_DIRECT, "")


def test_path_change_gives_a_new_peer_its_bytes_and_its_diagnostic() -> None:
    builder, dec, wire = P.SnapshotBuilder(), StatusDecoder(), Wire()
    st = tailnet()
    first = read(builder, dec, st)
    parts = DiagnosticParts([], first, frozenset(), "relayed")
    d1 = parts.peer_entry(first[2])
    st["Peer"]["nodekey:" + "2".rjust(64, "0")]["CurAddr"] = ""            # direct -> derp (Active, no CurAddr)
    second = read(builder, dec, st)
    p = second[2]
    assert p is not first[2] and p.path == P.PATH_DERP and p.derp_region == "Lab region"
    assert p.derived(wire)[1] != first[2].derived(wire)[1]
    d2 = DiagnosticParts([], second, frozenset(), "relayed").peer_entry(p)
    assert d2 != d1 and d2.message == "relayed, region lab"


def test_diagnostic_built_again_only_when_required_or_nat_wording_change() -> None:
    (p,) = P.parse_status(recorded("status_direct.json")).peers
    parts = DiagnosticParts([], (p,), frozenset(), "why")
    d = parts.peer_entry(p)
    assert parts._replace(required=frozenset({"someone"})).peer_entry(p) is d   # not this peer
    required = parts._replace(required=frozenset({peer_key(p)}))
    assert required.peer_entry(p) is not d and required.peer_entry(p) is required.peer_entry(p)
    assert parts._replace(derp_why="other").peer_entry(p) == peer_diagnostic(p, False, "other")
    assert parts.entries() == [parts.peer_entry(p)]


def test_equal_chunk_decoded_whole_keeps_the_peer() -> None:
    builder = P.SnapshotBuilder()
    st = tailnet()
    first = builder.build(copy.deepcopy(st), NAMES).peers
    second = builder.build(copy.deepcopy(st), NAMES).peers          # equal objects, not the same ones
    assert second is first and builder.built == 0


def test_relay_hosts_region_names_and_order() -> None:
    st = tailnet(5)
    keys = list(st["Peer"])
    st["Peer"][keys[0]].update(CurAddr="", PeerRelay="192.0.2.9:40000:vni:7")        # peer-relay via robot-004
    st["Peer"][keys[4]].update(CurAddr="192.0.2.9:41641")
    st["Peer"][keys[1]].update(CurAddr="", Relay="fra")                              # derp, no name in the map
    st["Peer"][keys[2]].update(HostName="a-first", DNSName="a-first.fleet.internal.")  # sorts first
    st["Peer"][keys[3]]["Online"] = False
    builder = P.SnapshotBuilder()
    snap = builder.build(st, NAMES)
    assert [p.name for p in snap.peers] == ["a-first", "robot-000", "robot-001", "robot-003", "robot-004"]
    by = {p.name: p for p in snap.peers}
    assert by["robot-000"].relay_host == "robot-004" and by["robot-000"].relay_vni == 7
    assert by["robot-001"].derp_region == "fra" and by["robot-000"].derp_region == ""
    assert snap == P.parse_status(st, NAMES)                                         # one implementation
    # the relay host comes from another peer's chunk: it changes the peer, not only its own chunk
    st2 = copy.deepcopy(st)
    st2["Peer"][keys[4]]["CurAddr"] = "192.0.2.10:41641"
    assert {p.name: p for p in builder.build(st2, NAMES).peers}["robot-000"].relay_host == ""
    assert {p.name: p for p in builder.build(st2, {"fra": "Frankfurt"}).peers}["robot-001"].derp_region == "Frankfurt"
    assert builder.build({"Peer": None}).peers == () and builder.build({"Peer": {"x": 3}}).peers == ()


def test_a_peer_cannot_be_changed_or_copied_with_a_change() -> None:
    """The rule is the structure: a value a peer shows is given when it is built, never after."""
    (p,) = P.parse_status(recorded("status_direct.json")).peers
    with pytest.raises(TypeError):
        dataclasses.replace(p, latency_ms=3.0)
    for field, value in (("latency_ms", 3.0), ("derp_region", "x"), ("relay_host", "r"), ("_derived", {})):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(p, field, value)
    with pytest.raises(AttributeError):
        del p.name
    with pytest.raises(AttributeError):
        p.extra = 1                                          # no __dict__ either
    assert not hasattr(P, "with_latency") and not hasattr(P, "with_region_names")
    assert math.isnan(p.latency_ms)


def test_derived_forms_are_kept_with_the_peer_and_not_with_its_copies() -> None:
    (p,) = P.parse_status(recorded("status_direct.json")).peers
    calls = []

    def make(peer, *args):
        calls.append(args)
        return (peer.name, args)

    assert p.derived(make) is p.derived(make) and calls == [()]
    kept = p.derived(make, True, "a")
    assert kept == ("robotb", (True, "a")) and p.derived(make, True, "a") is kept
    assert p.derived(make) is not None and calls == [(), (True, "a"), ()]   # other args: built again
    for twin in (copy.copy(p), copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert twin == p and hash(twin) == hash(p) and twin._derived is None
    assert repr(p).startswith("PeerState(name='robotb', ")
    assert p != ("robotb",)
    blind = p.without_path(P.PATH_OFFLINE)
    assert blind.without_path(P.PATH_OFFLINE) is blind and not blind.online and blind.endpoint == ""
    assert blind.name == p.name and blind.addresses == p.addresses and blind.rx_bytes == p.rx_bytes


def test_seeded_sequences_of_reads_equal_a_fresh_parse_every_time() -> None:
    """Traffic, path changes, renames (also to a name another peer has), peers joining and leaving,
    map reordering, latency and region-name changes, decoded in pieces and whole: after every read
    the peers equal a parse without anything kept (latency where the peer stayed on its path), and
    unchanged peers are the same objects."""
    import random

    for seed in range(8):
        rnd = random.Random(seed)
        st = tailnet(12)
        builder, dec = P.SnapshotBuilder(), StatusDecoder()
        latency: dict = {}
        names = dict(NAMES)
        last: dict = {}
        nxt = 100
        for _ in range(40):
            peers = st["Peer"]
            keys = list(peers)
            for _ in range(rnd.randint(0, 3)):
                k = rnd.choice(keys)
                what = rnd.randrange(9)
                if what == 0:
                    peers[k]["RxBytes"] += 1
                elif what == 1:
                    peers[k]["CurAddr"] = rnd.choice(["", "192.0.2.1:41641"])
                elif what == 2:
                    peers[k]["HostName"] = rnd.choice(["a", "zz", "robot-003"])
                    peers[k]["DNSName"] = peers[k]["HostName"] + ".fleet.internal."
                elif what == 3 and len(peers) > 2:
                    del peers[k]
                    keys.remove(k)
                elif what == 4:
                    nxt += 1
                    peers[f"nodekey:{nxt:064x}"] = dict(peers[keys[0]], ID=str(nxt), HostName=f"n{nxt}",
                                                        DNSName=f"n{nxt}.fleet.internal.")
                elif what == 5:
                    items = list(peers.items())
                    rnd.shuffle(items)
                    st["Peer"] = peers = dict(items)
                elif what == 6:
                    p = peers[k]
                    key = p.get("ID") or normalise_host(p["DNSName"] or p["HostName"])
                    on = rnd.choice([P.PATH_DIRECT, P.PATH_DERP, P.PATH_PEER_RELAY])
                    latency[key] = P.Latency(rnd.choice([1.0, 2.0]), on, rnd.choice(["lab", "fra"]))
                elif what == 7:
                    names = rnd.choice([{}, dict(NAMES), {"lab": "Other"}])
                else:
                    peers[k].update(CurAddr="", PeerRelay="192.0.2.1:40000:vni:3")
            whole = rnd.random() < 0.2
            doc = copy.deepcopy(st) if whole else dec.decode(status_body(st).decode())
            got = builder.build(doc, names, latency).peers
            want = []
            for p in P.parse_status(st, names).peers:
                m = latency.get(peer_key(p))
                shown = m.ms if m is not None and m.path == p.path and (
                    p.path != P.PATH_DERP or m.relay_region == p.relay_region) else math.nan
                want.append(with_values(p, latency_ms=shown))
            assert got == tuple(want), seed
            for p in got:
                before = last.get(peer_key(p))
                if before is not None and before == p:
                    assert p is before, seed             # nothing it shows changed: the same object
            last = {peer_key(p): p for p in got}


def test_the_monitor_builds_one_snapshot_per_read_and_carries_nothing_beside_it(fake_tailscaled, tmp_path) -> None:
    """OverlayMonitor.poll builds each read's snapshot once (the latency dropped by a path change
    is left out in that same build) and its Reading holds no second form of the peers."""
    import os

    from overlay_manager.core.config import load_robot_config
    from overlay_manager.monitor.overlay_monitor import OverlayMonitor
    from overlay_manager.monitor.readings import Reading
    from overlay_manager.tailscaled.localapi import LocalAPI

    cfg = load_robot_config(os.path.join(os.path.dirname(__file__), "..", "..", "..", "config", "robot.example.yaml"))
    m = OverlayMonitor(cfg, LocalAPI(fake_tailscaled.socket_path), env={})
    builds = []
    real = m._snapshots.build
    m._snapshots.build = lambda *a, **k: builds.append(1) or real(*a, **k)  # type: ignore[method-assign]
    try:
        assert [f.name for f in dataclasses.fields(Reading)] == ["snapshot", "error", "daemon_gone", "ok_at", "ok_wall"]
        m.poll()
        first = m.reading.snapshot.peers
        assert m.ping("robotb", 1, 1.0).ok
        m.poll()
        (measured,) = m.reading.snapshot.peers
        assert measured is not first[0] and measured.latency_ms > 0
        m.poll()
        assert m.reading.snapshot.peers[0] is measured                   # nothing changed: the same object
        next(iter(fake_tailscaled.status["Peer"].values()))["CurAddr"] = ""
        (ev,) = m.poll()
        (moved,) = m.reading.snapshot.peers
        assert ev.new_path == "derp" and moved is ev.peer and math.isnan(moved.latency_ms)
        assert len(builds) == 4                                          # one build per read
        parts = m.diagnostic_parts()
        assert parts.peers is m.reading.snapshot.peers                    # /diagnostics from the same objects
    finally:
        m.close()
