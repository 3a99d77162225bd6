"""Path classification and status parsing against JSON recorded from a real tailscaled."""
import math

from overlay_manager.core import nat as N
from overlay_manager.core import peers as P
from overlay_manager.core.json_fields import parse_time
from overlay_manager.testing.tsfake import recorded


def _peer(status):
    return next(iter(status["Peer"].values()))


def test_idle_status_parses_self_and_peer():
    snap = P.parse_status(recorded("status_idle.json"))
    assert snap.backend_state == "Running"
    assert snap.control_reachable is True
    assert snap.self_peer.name == "robota"
    assert snap.self_peer.dns_name == "robota.fleet.internal"
    assert snap.self_peer.path == P.PATH_SELF
    assert snap.self_peer.addresses[0] == "100.64.0.1"
    (peer,) = snap.peers
    assert peer.name == "robotb" and peer.online
    assert peer.path == P.PATH_IDLE
    assert peer.relay_region == "lab"  # home region is set, yet the path is not derp
    assert math.isnan(peer.latency_ms)


def test_direct_status_has_endpoint():
    (peer,) = P.parse_status(recorded("status_direct.json")).peers
    assert peer.path == P.PATH_DIRECT
    assert peer.endpoint == "10.250.0.3:41641"


def test_active_without_curaddr_is_derp():
    st = recorded("status_direct.json")
    _peer(st)["CurAddr"] = ""
    _peer(st)["Active"] = True
    (peer,) = P.parse_status(st).peers
    assert peer.path == P.PATH_DERP and peer.endpoint == "" and peer.relay_region == "lab"


def test_peer_relay_offline_and_unknown():
    st = recorded("status_direct.json")
    _peer(st)["CurAddr"] = ""
    _peer(st)["PeerRelay"] = "10.0.0.9:7777:vni:3"
    assert P.parse_status(st).peers[0].path == P.PATH_PEER_RELAY
    _peer(st)["Online"] = False
    assert P.parse_status(st).peers[0].path == P.PATH_OFFLINE
    for k in ("Online", "Active", "CurAddr", "PeerRelay"):
        _peer(st).pop(k)
    assert P.parse_status(st).peers[0].path == P.PATH_UNKNOWN


def test_missing_and_odd_fields_do_not_raise():
    snap = P.parse_status({"Peer": {"x": {"DNSName": 5, "TailscaleIPs": "nope", "RxBytes": -3,
                                          "LastHandshake": "garbage", "NewField": {"a": 1}}}})
    (peer,) = snap.peers
    assert peer.name == "" and peer.addresses == () and peer.rx_bytes == 0 and peer.last_handshake == 0.0
    assert snap.self_peer is None and snap.backend_state == ""
    assert P.parse_status({}).peers == ()


def test_parse_time_handles_go_nanoseconds_and_zero():
    assert parse_time("0001-01-01T00:00:00Z") == 0.0
    assert abs(parse_time("2026-11-22T00:55:20.123456789Z") - 1795308920.123456) < 1e-3
    assert parse_time(None) == 0.0


def test_find_by_short_fqdn_ip():
    snap = P.parse_status(recorded("status_direct.json"))
    assert snap.find("robotb").name == "robotb"
    assert snap.find("robotb.fleet.internal.").name == "robotb"
    assert snap.find("100.64.0.2").name == "robotb"
    assert snap.find("nobody") is None


def test_path_changes_first_seen_change_and_gone():
    idle = P.parse_status(recorded("status_idle.json"))
    direct = P.parse_status(recorded("status_direct.json"))
    first = P.path_changes(None, idle)
    assert [(e.old_path, e.new_path) for e in first] == [("", "idle")]
    assert [(e.old_path, e.new_path) for e in P.path_changes(idle, direct)] == [("idle", "direct")]
    assert P.path_changes(direct, direct) == []
    gone = P.Snapshot("Running", direct.self_peer, ())
    assert [(e.old_path, e.new_path) for e in P.path_changes(direct, gone)] == [("direct", "offline")]


def test_ping_path():
    res = recorded("ping_direct.json")
    assert P.ping_path(res) == (P.PATH_DIRECT, "10.250.0.3:41641")
    res.update(Endpoint="", DERPRegionID=999, DERPRegionCode="lab")
    assert P.ping_path(res) == (P.PATH_DERP, "lab")
    assert P.ping_path({"Err": "timeout"}) == (P.PATH_UNKNOWN, "")


def test_netcheck_summary():
    regions = {999: "lab"}
    nat = N.parse_netcheck({"UDP": True, "MappingVariesByDestIP": False, "PreferredDERP": 999,
                            "RegionLatency": {"999": 1500000}}, regions)
    assert nat.known and nat.udp and not nat.hard_nat and nat.preferred_derp == "lab"
    assert abs(nat.preferred_derp_latency_ms - 1.5) < 1e-9
    assert "direct links are possible" in nat.summary
    hard = N.parse_netcheck({"UDP": True, "MappingVariesByDestIP": "true"}, regions)
    assert hard.hard_nat and "hard NAT" in hard.summary
    blocked = N.parse_netcheck({"UDP": False}, regions)
    assert not blocked.udp and blocked.summary.startswith("UDP blocked")
