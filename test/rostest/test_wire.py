"""Messages serialized once per element (ros/wire.py, kept with each PeerState: core.peers) are the
same bytes on the wire as genpy's, and the node's report builders reuse what did not change."""
import io
import math
import os

import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from genpy import SerializationError
from rospy.msg import serialize_message

from overlay_manager.core.identity import peer_key
from overlay_manager.core.levels import Level
from overlay_manager.core.peers import PATH_DIRECT, Latency, PeerState, SnapshotBuilder, same_but_measurements
from overlay_manager.msg import Peer, PeerList
from overlay_manager.ros import wire

rospy = pytest.importorskip("rospy")
msg = pytest.importorskip("overlay_manager.msg", reason="messages not built (scripts/build)")

HERE = os.path.dirname(os.path.abspath(__file__))


def _plain_bytes(m):
    b = io.BytesIO()
    m.serialize(b)
    return b.getvalue()


def _peer(i, **kw):
    base = dict(name=f"robot-{i:03d}", dns_name=f"robot-{i:03d}.fleet.internal", addresses=(f"100.64.0.{i}",),
                online=True, active=i % 2 == 0, path="direct", endpoint=f"10.0.0.{i}:41641",
                rx_bytes=1000 * i, tx_bytes=7 * i, tags=("tag:robot",), os="linux")
    base.update(kw)
    return PeerState(**base)


def test_cached_peer_list_is_byte_identical_and_decodes_with_the_stock_class():
    from overlay_manager.ros.messages import CachedPeerList, peer_msg, peer_wire
    peers = [_peer(i) for i in range(1, 40)]
    pl = CachedPeerList()
    pl.header.stamp = rospy.Time(12, 34)
    pl.header.frame_id = "x"
    pl.stale = True
    pl.self_peer = peer_msg(_peer(200, path="self"))
    built = [p.derived(peer_wire) for p in peers]
    pl.peers = [m for m, _ in built]
    pl.set_tail(len(built), b"".join(b for _, b in built))
    plain = PeerList(header=pl.header, stale=True, self_peer=pl.self_peer, peers=[peer_msg(p) for p in peers])
    assert _plain_bytes(pl) == _plain_bytes(plain)
    back = PeerList()
    back.deserialize(_plain_bytes(pl))
    assert [p.name for p in back.peers] == [p.name for p in peers] and back.peers[5].rx_bytes == 6000
    assert back.stale and back.self_peer.path == "self" and back.header.frame_id == "x"
    # rospy's own framing (length prefix, header seq) around it
    b1, b2 = io.BytesIO(), io.BytesIO()
    serialize_message(b1, 7, pl)
    serialize_message(b2, 7, plain)
    assert b1.getvalue() == b2.getvalue()
    assert pl._type == PeerList._type and pl._md5sum == PeerList._md5sum and isinstance(pl, PeerList)


def test_empty_array_and_no_tail_serialize_like_the_stock_class():
    C = wire.cached_tail_class(DiagnosticArray, "status")
    a = C()
    assert _plain_bytes(a) == _plain_bytes(DiagnosticArray())
    a.set_tail(0, b"")
    assert _plain_bytes(a) == _plain_bytes(DiagnosticArray())
    a = C(status=[DiagnosticStatus(name="x", values=[KeyValue("k", "v")])])  # no set_tail: genpy's way
    assert _plain_bytes(a) == _plain_bytes(DiagnosticArray(status=a.status))


def test_only_a_last_array_of_messages_can_be_cached():
    with pytest.raises(ValueError, match="header"):
        wire.cached_tail_class(DiagnosticArray, "header")
    with pytest.raises(ValueError, match="peers"):
        wire.cached_tail_class(Peer, "peers")
    with pytest.raises(ValueError, match="tags"):
        wire.cached_tail_class(Peer, "tags")  # an array, but of strings (and not the last field)


def test_peers_keep_their_bytes_while_unchanged_and_get_genpy_bytes_on_a_change():
    """The builder with the node's real message builder: an unchanged chunk keeps its PeerState and
    its bytes object; a latency or path change gives a new PeerState whose bytes are genpy's."""
    from overlay_manager.ros.messages import peer_msg, peer_wire
    from overlay_manager.testing.tsfake import recorded

    st = recorded("status_direct.json")
    (key,) = st["Peer"]
    builder = SnapshotBuilder()
    (p1,) = builder.build(st).peers
    m1, b1 = p1.derived(peer_wire)
    assert b1 == _plain_bytes(peer_msg(p1))
    (p2,) = builder.build(st).peers
    assert p2 is p1 and p2.derived(peer_wire)[1] is b1 and p2.derived(peer_wire)[0] is m1
    measured = {peer_key(p1): Latency(4.5, PATH_DIRECT)}
    (p3,) = builder.build(st, latency=measured).peers                      # latency measured
    m3, b3 = p3.derived(peer_wire)
    assert p3 is not p1 and m3.latency_ms == 4.5 and b3 != b1 and b3 == _plain_bytes(peer_msg(p3))
    st["Peer"][key] = dict(st["Peer"][key], CurAddr="")                     # direct -> derp
    (p4,) = builder.build(st, latency=measured).peers
    m4, b4 = p4.derived(peer_wire)
    assert m4.path == "derp" and math.isnan(m4.latency_ms) and b4 != b3 and b4 == _plain_bytes(peer_msg(p4))


def test_report_messages_reuse_unchanged_peers_and_diagnostics(monkeypatch):
    """Through the node's builders: a peer whose PeerState is the same object keeps its message;
    a changed one is rebuilt; the bytes always equal a fresh genpy serialization."""
    from overlay_manager.core.config import load_robot_config
    from overlay_manager.monitor.overlay_monitor import OverlayMonitor
    from overlay_manager.ros.messages import ReportMessages
    from overlay_manager.tailscaled.localapi import LocalAPI
    from overlay_manager.testing.tsfake import FakeTailscaled

    fake = FakeTailscaled()
    try:
        cfg = load_robot_config(os.path.join(HERE, "..", "..", "config", "robot.example.yaml"))
        m = OverlayMonitor(cfg, LocalAPI(fake.socket_path), env={})
        rm = ReportMessages(m, "robota/overlay_manager")
        m.poll()
        fresh = m.freshness()
        pl1 = rm.peer_list(m.reading, fresh, rospy.Time(1))
        d1 = rm.diagnostics(rospy.Time(1), m.diagnostic_parts(), [], [])
        first = m.reading.snapshot
        m.poll()                                   # same answer: the same PeerState objects
        pl2 = rm.peer_list(m.reading, m.freshness(), rospy.Time(2))
        d2 = rm.diagnostics(rospy.Time(2), m.diagnostic_parts(), [], [])
        assert pl2.peers[0] is pl1.peers[0]
        peer_entries = [s for s in d2.status if ": peer " in s.name]
        assert peer_entries and peer_entries[0] is next(s for s in d1.status if s.name == peer_entries[0].name)
        assert same_but_measurements(first, m.reading.snapshot)
        next(iter(fake.status["Peer"].values()))["CurAddr"] = ""   # the path changes to derp
        m.poll()
        pl3 = rm.peer_list(m.reading, m.freshness(), rospy.Time(3))
        d3 = rm.diagnostics(rospy.Time(3), m.diagnostic_parts(), [], [])
        assert pl3.peers[0] is not pl1.peers[0] and pl3.peers[0].path == "derp"
        assert not same_but_measurements(first, m.reading.snapshot)
        assert any(s.level == Level.WARN and "DERP" in s.message for s in d3.status)
        for built, stock in ((pl3, PeerList(header=pl3.header, stale=pl3.stale, self_peer=pl3.self_peer,
                                            peers=list(pl3.peers))),
                             (d3, DiagnosticArray(header=d3.header, status=list(d3.status)))):
            assert _plain_bytes(built) == _plain_bytes(stock)
        m.close()
    finally:
        fake.close()


def test_a_value_that_cannot_be_serialized_still_raises_at_publish():
    """A peer does not hide a bad value: building its bytes raises, the message falls back to genpy,
    whose publish raises (the node reports that as a publish fault)."""
    from overlay_manager.ros.messages import CachedPeerList

    bad = Peer(name="x", latency_ms=math.nan)
    bad.rx_bytes = -1                           # does not fit uint64
    p = _peer(1)
    with pytest.raises(SerializationError):
        p.derived(lambda _p: (bad, wire.to_bytes(bad)))
    pl = CachedPeerList(peers=[bad])
    with pytest.raises(SerializationError):
        _plain_bytes(pl)
