"""peer_rows.PeerRows: one row per peer, reused (same object, same bytes) while its status chunk and
outside values are unchanged, built again otherwise, dropped with its peer; rows equal what
parse_status gives without the stage."""

from __future__ import annotations

import copy
import math
from typing import List, Tuple

from overlay_manager.core import peers as P
from overlay_manager.monitor.diagnose import peer_diagnostic
from overlay_manager.monitor.peer_rows import PeerRows, plain_rows, rows_of
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
    """A stand-in for the node's message builders: (text, bytes) of a value, counting builds."""

    def __init__(self) -> None:
        self.built: List[str] = []

    def __call__(self, value: object) -> Tuple[str, bytes]:
        text = repr(value)
        self.built.append(text)
        return text, text.encode()


def read(stage: PeerRows, dec: StatusDecoder, st: dict, latency=None):
    """One status read as the node does it: decoded in pieces, then the stage."""
    doc = dec.decode(status_body(st).decode())
    return stage.update(doc["Peer"], NAMES, latency or {})


def test_unchanged_chunk_gives_the_same_row_object_and_the_same_bytes() -> None:
    stage, dec, wire = PeerRows(), StatusDecoder(), Wire()
    st = tailnet()
    first = read(stage, dec, st)
    assert stage.built == 4 and stage.parsed == 4
    b1 = [r.peer_wire(wire)[1] for r in first]
    second = read(stage, dec, st)
    assert dec.reused == 4 and stage.built == 0 and stage.parsed == 0
    assert second is first                                   # the same tuple: nothing to sort again
    assert [r.peer_wire(wire)[1] for r in second] == b1 and len(wire.built) == 4  # bytes built once per row
    assert all(r.peer_wire(wire)[1] is b for r, b in zip(second, b1))


def test_changed_chunk_gives_a_new_row_and_keeps_the_others() -> None:
    stage, dec, wire = PeerRows(), StatusDecoder(), Wire()
    st = tailnet()
    first = read(stage, dec, st)
    for r in first:
        r.peer_wire(wire)
    key = next(iter(st["Peer"]))
    st["Peer"][key]["RxBytes"] += 1000                       # traffic: the chunk's text changes
    second = read(stage, dec, st)
    assert stage.built == 1 and stage.parsed == 1
    by1, by2 = {r.key: r for r in first}, {r.key: r for r in second}
    assert by2[key] is not by1[key] and by2[key].state.rx_bytes == by1[key].state.rx_bytes + 1000
    assert all(by2[k] is by1[k] for k in by1 if k != key)
    assert by2[key].peer_wire(wire)[1] != by1[key].peer_wire(wire)[1] and len(wire.built) == 5


def test_removed_peer_drops_its_row() -> None:
    stage, dec = PeerRows(), StatusDecoder()
    st = tailnet()
    first = read(stage, dec, st)
    gone = next(iter(st["Peer"]))
    kept = copy.deepcopy(st)
    del kept["Peer"][gone]
    second = read(stage, dec, kept)
    assert [r.key for r in second] == [r.key for r in first if r.key != gone]
    assert stage.built == 0 and all(a is b for a, b in zip(second, first[1:]))
    third = read(stage, dec, st)                             # back again: a new row (the old one was dropped)
    assert third[0].key == gone and third[0] is not first[0] and stage.built == 1


def test_latency_change_updates_the_row_and_its_bytes_without_parsing_again() -> None:
    stage, dec, wire = PeerRows(), StatusDecoder(), Wire()
    st = tailnet()
    first = read(stage, dec, st)
    old = first[1].peer_wire(wire)[1]
    second = read(stage, dec, st, {"robot-001.fleet.internal": 2.5})
    assert stage.built == 1 and stage.parsed == 0
    assert second[1] is not first[1] and second[1].base is first[1].base and second[1].state.latency_ms == 2.5
    assert second[1].peer_wire(wire)[1] != old and b"latency_ms=2.5" in second[1].peer_wire(wire)[1]
    assert all(a is b for i, (a, b) in enumerate(zip(first, second)) if i != 1)
    assert read(stage, dec, st, {"robot-001.fleet.internal": 2.5})[1] is second[1]   # same value: reused
    assert math.isnan(read(stage, dec, st)[1].state.latency_ms)                      # measurement dropped


def test_path_change_updates_the_row_its_bytes_and_its_diagnostic() -> None:
    stage, dec, wire = PeerRows(), StatusDecoder(), Wire()
    st = tailnet()
    first = read(stage, dec, st)
    d1 = first[2].diagnostic_wire(frozenset(), "relayed", wire)
    key = first[2].key
    st["Peer"][key]["CurAddr"] = ""                          # direct -> derp (Active, no CurAddr)
    second = read(stage, dec, st)
    row = second[2]
    assert row is not first[2] and row.state.path == P.PATH_DERP and row.state.derp_region == "Lab region"
    assert row.peer_wire(wire)[1] != first[2].peer_wire(wire)[1]
    d2 = row.diagnostic_wire(frozenset(), "relayed", wire)
    assert d2 != d1 and row.diagnostic(frozenset(), "relayed").message == "relayed, region lab"


def test_diagnostic_rebuilt_only_when_required_or_nat_wording_change() -> None:
    (row,) = plain_rows([P.parse_status(recorded("status_direct.json")).peers[0]])
    wire = Wire()
    d = row.diagnostic(frozenset(), "why")
    assert row.diagnostic(frozenset({"someone"}), "why") is d             # not this peer
    w = row.diagnostic_wire(frozenset(), "why", wire)
    assert row.diagnostic_wire(frozenset(), "why", wire) is w and len(wire.built) == 1
    assert row.diagnostic(frozenset({row.state.name}), "why") is not d    # now required
    assert row.diagnostic_wire(frozenset({row.state.name}), "why", wire) is not w and len(wire.built) == 2
    assert row.diagnostic(frozenset(), "other") == peer_diagnostic(row.state, False, "other")


def test_equal_chunk_decoded_whole_reuses_the_row() -> None:
    stage = PeerRows()
    st = tailnet()
    first = stage.update(copy.deepcopy(st)["Peer"], NAMES, {})
    second = stage.update(copy.deepcopy(st)["Peer"], NAMES, {})   # equal objects, not the same ones
    assert second is first and stage.parsed == 0


def test_rows_equal_parse_status_with_relay_hosts_region_names_and_latency() -> None:
    st = tailnet(5)
    keys = list(st["Peer"])
    st["Peer"][keys[0]].update(CurAddr="", PeerRelay="192.0.2.9:40000:vni:7")        # peer-relay via robot-004
    st["Peer"][keys[4]].update(CurAddr="192.0.2.9:41641")
    st["Peer"][keys[1]].update(CurAddr="", Relay="fra")                              # derp, no name in the map
    st["Peer"][keys[2]].update(HostName="a-first", DNSName="a-first.fleet.internal.")  # sorts first
    st["Peer"][keys[3]]["Online"] = False
    latency = {"robot-004.fleet.internal": 1.25}
    stage = PeerRows()
    rows = stage.update(st["Peer"], NAMES, latency)
    want = P.with_latency(P.with_region_names(P.parse_status(st), NAMES), latency)
    assert tuple(r.state for r in rows) == want.peers
    assert P.parse_status(st, [r.state for r in rows]) == want
    by = {r.state.name: r.state for r in rows}
    assert by["robot-000"].relay_host == "robot-004" and by["robot-001"].derp_region == "fra"
    # the relay host comes from another peer's chunk: it changes the row, not only its own chunk
    st2 = copy.deepcopy(st)
    st2["Peer"][keys[4]]["CurAddr"] = "192.0.2.10:41641"
    rows2 = stage.update(st2["Peer"], NAMES, latency)
    assert {r.state.name: r.state for r in rows2}["robot-000"].relay_host == ""


def test_rows_of_falls_back_to_plain_rows() -> None:
    snap = P.parse_status(tailnet(3))
    rows = plain_rows(snap.peers)
    assert rows_of(rows, snap.peers) is rows
    made = rows_of((), snap.peers)
    assert [r.state for r in made] == list(snap.peers) and all(r.key == "" for r in made)
    other = P.with_latency(snap, {"robot-001.fleet.internal": 9.0})   # same length, one peer copied
    again = rows_of(rows, other.peers)
    assert again is not rows and [r.state for r in again] == list(other.peers)
    assert PeerRows().update(None, {}, {}) == () and PeerRows().update({"x": 3}, {}, {}) == ()


def test_with_latency_copies_only_changed_peers() -> None:
    snap = P.parse_status(tailnet(2))
    out = P.with_latency(snap, {"robot-000.fleet.internal": 1.5})
    by = {p.name: p for p in out.peers}
    assert by["robot-000"].latency_ms == 1.5
    assert by["robot-001"] is {p.name: p for p in snap.peers}["robot-001"]
    assert math.isnan(by["robot-001"].latency_ms)
    again = P.with_latency(out, {"robot-000.fleet.internal": 1.5})
    assert all(a is b for a, b in zip(again.peers, out.peers))


def test_seeded_sequences_of_reads_equal_parse_status_every_time() -> None:
    """Traffic, path changes, renames (also to a name another peer has), peers joining and leaving,
    map reordering, latency and region-name changes, decoded in pieces and whole: after every read
    the rows equal a parse without the stage, and unchanged peers keep their row object."""
    import random

    for seed in range(8):
        rnd = random.Random(seed)
        st = tailnet(12)
        stage, dec = PeerRows(), StatusDecoder()
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
                    latency[(p["DNSName"].rstrip(".") or p["HostName"])] = rnd.choice([1.0, 2.0, math.nan])
                elif what == 7:
                    names = rnd.choice([{}, dict(NAMES), {"lab": "Other"}])
                else:
                    peers[k].update(CurAddr="", PeerRelay="192.0.2.1:40000:vni:3")
            whole = rnd.random() < 0.2
            doc = copy.deepcopy(st) if whole else dec.decode(status_body(st).decode())
            rows = stage.update(doc["Peer"], names, latency)
            want = P.with_latency(P.with_region_names(P.parse_status(st), names), latency)
            assert tuple(r.state for r in rows) == want.peers, seed
            assert [r.key for r in rows] == [r.key for r in sorted(rows, key=lambda r: (r.state.name,
                                                                                        r.state.dns_name))]
            for r in rows:
                before = last.get(r.key)
                if before is not None and before.state == r.state and before.source == r.source:
                    assert r is before, seed             # unchanged input: the same row
            last = {r.key: r for r in rows}
