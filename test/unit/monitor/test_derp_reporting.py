"""Which DERP region a relayed link uses, by name (Peer.derp_region, PathChange when a peer
re-homes), the per-region latency of the NAT check, and the derper host's report (pure)."""

from __future__ import annotations

import math

from overlay_manager.core import nat as N
from overlay_manager.core import peers as P
from overlay_manager.core.config import DerperSettings
from overlay_manager.monitor.diagnose import derper_diagnostic
from overlay_manager.monitor.readings import ERROR, OK
from overlay_manager.tailscaled.derper import DerperState

DERP_MAP = {"Regions": {"901": {"RegionID": 901, "RegionCode": "east", "RegionName": "East campus"},
                        "902": {"RegionID": 902, "RegionCode": "west", "RegionName": ""}}}


def peer(name: str, path: str, region: str) -> dict:
    """A peer's ipnstate.PeerStatus on path (direct, derp or idle) with home region region."""
    return {"ID": name, "HostName": name, "DNSName": f"{name}.fleet.internal.", "TailscaleIPs": ["100.64.0.2"],
            "Online": True, "Active": path != P.PATH_IDLE, "Relay": region,
            "CurAddr": "192.0.2.1:41641" if path == P.PATH_DIRECT else ""}


def status(*peers: dict) -> dict:
    return {"BackendState": "Running", "Peer": {f"nodekey:{p['ID']}": p for p in peers}}


def test_region_names_from_the_derp_map() -> None:
    info = N.derp_region_names(DERP_MAP)
    assert info == {901: ("east", "East campus"), 902: ("west", "")}
    assert N.derp_regions(DERP_MAP) == {901: "east", 902: "west"}


def test_derp_region_named_only_on_derp_links() -> None:
    names = {"east": "East campus"}
    st = status(peer("a", P.PATH_DERP, "east"), peer("b", P.PATH_DIRECT, "east"), peer("c", P.PATH_DERP, "west"))
    builder = P.SnapshotBuilder()
    s = builder.build(st, names)
    assert [p.derp_region for p in s.peers] == ["East campus", "", "west"]  # no name: the code
    again = builder.build(st, dict(names))
    assert again.peers is s.peers  # unchanged peers keep their objects
    assert [p.derp_region for p in builder.build(st, {"east": "Campus"}).peers] == ["Campus", "", "west"]
    blinded = P.blind(s, daemon_gone=True)
    assert all(p.derp_region == "" for p in blinded.peers)
    assert P.peer_fingerprint(s.peers[0]) != P.peer_fingerprint(P.parse_status(st, {"east": "x"}).peers[0])


def test_rehome_within_derp_is_a_path_change() -> None:
    names = {"east": "East campus", "west": "West campus"}
    old = P.parse_status(status(peer("a", P.PATH_DERP, "east"), peer("b", P.PATH_DIRECT, "east")), names)
    new = P.parse_status(status(peer("a", P.PATH_DERP, "west"), peer("b", P.PATH_DIRECT, "west")), names)
    ev = P.path_changes(old, new)
    assert [(e.peer.name, e.old_path, e.new_path, e.peer.derp_region) for e in ev] == [
        ("a", "derp", "derp", "West campus")]  # b is direct: its home region does not matter
    assert P.path_changes(new, new) == []


def test_netcheck_lists_every_region_by_latency_and_names_home() -> None:
    report = {"UDP": True, "MappingVariesByDestIP": True, "PreferredDERP": 902,
              "RegionLatency": {"901": 3_500_000, "902": 1_200_000, "903": "bad"}}
    info = N.derp_region_names(DERP_MAP)
    codes = {rid: code for rid, (code, _) in info.items()}
    names = {901: "East campus", 902: "West campus"}
    nat = N.parse_netcheck(report, codes, names)
    assert nat.preferred_derp == "west" and nat.preferred_derp_name == "West campus"
    assert math.isclose(nat.preferred_derp_latency_ms, 1.2)
    assert [(c, n) for c, n, _ in nat.region_latency] == [("west", "West campus"), ("east", "East campus")]
    assert "home DERP west (West campus) (1.2 ms)" in nat.summary
    plain = N.parse_netcheck(report, codes)  # no names: as before
    assert plain.preferred_derp_name == "" and "home DERP west (1.2 ms)" in plain.summary


def test_derper_diagnostic() -> None:
    s = DerperSettings("http://127.0.0.1:3340", "east")
    assert derper_diagnostic(None, DerperState()) is None
    ok = derper_diagnostic(s, DerperState(listening=True, connections=3, home_connections=2, clients=3,
                                          bytes_received=10, bytes_sent=20, version="1.102.5"))
    assert ok is not None and ok.level == OK and ok.name == "DERP server"
    assert ("connections", "3") in ok.values and ("region", "east") in ok.values
    down = derper_diagnostic(s, DerperState(error="derper at http://127.0.0.1:3340 not answering: refused"))
    assert down is not None and down.level == ERROR and "not answering" in down.message


def test_dashboard_names_the_region_of_a_relayed_link() -> None:
    from types import SimpleNamespace

    from overlay_manager.view import text as fmt

    p = SimpleNamespace(path="derp", endpoint="", relay_region="east", derp_region="East campus")
    assert fmt.peer_where(p) == "DERP east (East campus)"
    same = SimpleNamespace(path="derp", endpoint="", relay_region="lab", derp_region="lab")
    assert fmt.peer_where(same) == "DERP lab"
    old = SimpleNamespace(path="derp", endpoint="", relay_region="lab")  # a node without the field
    assert fmt.peer_where(old) == "DERP lab"
    assert fmt.path_where("direct", "1.2.3.4:41641", "east", derp_region="") == "1.2.3.4:41641"
