"""Values that do not fit a message field are clamped or unknown, never fatal; the documented
path rule for CurAddr without Active; change keys that ignore counters (recorded JSON)."""
import json
import math
from dataclasses import replace

from overlay_manager.core import json_fields as J
from overlay_manager.core import nat as N
from overlay_manager.core import peers as P
from overlay_manager.core.identity import peer_key
from overlay_manager.testing.tsfake import huge_status, recorded


def _peer(status):
    return next(iter(status["Peer"].values()))


def test_curaddr_without_active_is_direct_not_idle():
    # tailscale status would print this peer as "idle": it shows Active first. tailscaled sets
    # CurAddr only while it sends there without DERP, so the path is direct; active says idle.
    st = recorded("status_direct.json")
    _peer(st)["Active"] = False
    assert _peer(st)["CurAddr"]
    (peer,) = P.parse_status(st).peers
    assert peer.path == P.PATH_DIRECT and not peer.active and peer.endpoint == _peer(st)["CurAddr"]


def test_huge_counters_from_real_json_text():
    snap = P.parse_status(json.loads(huge_status(recorded("status_direct.json"))))
    (peer,) = snap.peers
    assert peer.rx_bytes == 0 and peer.tx_bytes == J.UINT64_MAX


def test_clamp_uint64_table():
    cases = [(1e400, 0), (-1e400, 0), (math.nan, 0), (-5, 0), (True, 0), ("7", 0), (None, 0),
             (2 ** 64, J.UINT64_MAX), (2 ** 64 - 1, J.UINT64_MAX), (1e30, J.UINT64_MAX), (12.9, 12), (3, 3)]
    for value, want in cases:
        assert J.clamp_uint64(value) == want, value


def test_latency_and_times_out_of_range_are_unknown():
    assert math.isnan(J.finite_ms(1e400, 1000.0)) and math.isnan(J.finite_ms(-1, 1.0))
    assert math.isnan(J.finite_ms(1e308, 1e10)) and J.finite_ms(0.002, 1000.0) == 2.0
    assert J.parse_time("9999-12-31T23:59:59Z") == 0.0           # beyond uint32 ROS time
    assert J.parse_time("2026-11-22T00:44:10.574675235Z") > 0
    nat = N.parse_netcheck({"UDP": True, "PreferredDERP": 1e400, "RegionLatency": {"1": 1e400}}, {})
    assert math.isnan(nat.preferred_derp_latency_ms) and nat.known
    assert N.derp_regions({"Regions": {"1": {"RegionID": 1e400}, "2": {"RegionID": 2, "RegionCode": "x"}}}) == {2: "x"}


def test_strings_that_are_not_utf8_are_replaced():
    st = recorded("status_direct.json")
    _peer(st)["OS"] = "linux\ud800"
    _peer(st)["Tags"] = ["tag:\udcff"]
    (peer,) = P.parse_status(st).peers
    peer.os.encode("utf-8")
    peer.tags[0].encode("utf-8")


def test_same_but_measurements_ignores_counters_and_latency_only():
    a = P.parse_status(recorded("status_direct.json"))
    st = recorded("status_direct.json")
    _peer(st)["RxBytes"] = 10 ** 9
    _peer(st)["LastHandshake"] = "2026-11-22T01:00:00Z"
    builder = P.SnapshotBuilder()
    builder.build(st)
    b = builder.build(st, latency={peer_key(a.peers[0]): P.Latency(3.0, P.PATH_DIRECT)})
    assert b.peers[0].latency_ms == 3.0
    assert P.same_but_measurements(a, b) and P.same_but_measurements(b, a)
    _peer(st)["CurAddr"] = ""
    assert not P.same_but_measurements(a, P.parse_status(st))
    assert P.same_but_measurements(None, None)
    assert not P.same_but_measurements(a, None) and not P.same_but_measurements(None, a)
    fewer = replace(a, peers=a.peers[1:])
    assert not P.same_but_measurements(a, fewer)
    renamed = replace(a, self_peer=P.parse_peer(dict(st["Self"], HostName="other", DNSName=""), is_self=True))
    assert not P.same_but_measurements(a, renamed)


def test_blind_keeps_names_and_drops_paths():
    snap = P.parse_status(recorded("status_direct.json"))
    gone = P.blind(snap, daemon_gone=True)
    (peer,) = gone.peers
    assert peer.path == P.PATH_OFFLINE and not peer.online and peer.endpoint == "" and peer.addresses
    assert P.blind(snap, daemon_gone=False).peers[0].path == P.PATH_UNKNOWN
    assert gone.self_peer == snap.self_peer and gone.backend_state == "" and not gone.control_reachable
