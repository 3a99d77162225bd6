"""What tailscaled sends with the wrong type or out of range is named (peer and field), not
passed off as something else; a peer-relay link's endpoint is the relay's ``ip:port`` with the
VNI in its own field. On recorded tailscaled JSON (test/data), edited as tailscaled would send it,
and the fake LocalAPI socket of testing/tsfake.py."""

from __future__ import annotations

import os

from overlay_manager.core import peers as P
from overlay_manager.core.config import apply_overrides, load_robot_config
from overlay_manager.core.json_fields import UINT64_MAX
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.monitor.readings import ERROR, WARN
from overlay_manager.tailscaled.localapi import LocalAPI
from overlay_manager.testing.tsfake import recorded

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "config", "robot.example.yaml")


def _peer(st: dict) -> dict:
    return next(iter(st["Peer"].values()))


def _monitor(fake, tmp_path) -> OverlayMonitor:
    cfg = load_robot_config(EXAMPLE)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    cfg = apply_overrides(cfg, {"hosts_file": str(hosts)}, "test")
    return OverlayMonitor(cfg, LocalAPI(fake.socket_path), env={"ROS_HOSTNAME": "robota.fleet.internal"})


# --- peer relay: endpoint = ip:port, VNI apart ---------------------------------------------

def test_peer_relay_endpoint_is_ip_port_and_vni_is_its_own_field() -> None:
    st = recorded("status_direct.json")
    p = _peer(st)
    p["CurAddr"], p["Active"], p["PeerRelay"] = "", True, "10.231.12.10:40000:vni:7"
    (peer,) = P.parse_status(st).peers
    assert peer.path == P.PATH_PEER_RELAY
    assert peer.endpoint == "10.231.12.10:40000" and peer.peer_relay == "10.231.12.10:40000"
    assert peer.relay_vni == 7 and peer.malformed == ()
    # the change event (~path_changes) carries the same ip:port and the VNI
    before = P.parse_status(recorded("status_direct.json"))
    (ev,) = P.path_changes(before, P.parse_status(st))
    assert (ev.old_path, ev.new_path, ev.peer.endpoint, ev.peer.relay_vni) == \
        ("direct", "peer-relay", "10.231.12.10:40000", 7)
    # a new relay session (another VNI) is a change worth publishing at once
    p["PeerRelay"] = "10.231.12.10:40000:vni:8"
    assert P.peer_fingerprint(P.parse_status(st).peers[0]) != P.peer_fingerprint(peer)
    # IPv6 relay, and a PeerRelay without the VNI part
    p["PeerRelay"] = "[2001:db8::1]:40000:vni:3"
    (v6,) = P.parse_status(st).peers
    assert (v6.endpoint, v6.relay_vni) == ("[2001:db8::1]:40000", 3)
    p["PeerRelay"] = "10.231.12.10:40000"
    (bare,) = P.parse_status(st).peers
    assert (bare.endpoint, bare.relay_vni) == ("10.231.12.10:40000", 0)
    # direct and derp peers have no VNI; going offline clears it
    assert P.parse_status(recorded("status_direct.json")).peers[0].relay_vni == 0
    assert P.blind(P.parse_status(st), daemon_gone=True).peers[0].relay_vni == 0


def test_ping_through_a_peer_relay_reports_ip_port() -> None:
    res = recorded("ping_direct.json")
    res["Endpoint"], res["PeerRelay"] = "", "10.231.12.10:40000:vni:1"
    assert P.ping_path(res) == (P.PATH_PEER_RELAY, "10.231.12.10:40000")


# --- malformed fields ------------------------------------------------------------------------

def test_wrong_types_are_named_per_field() -> None:
    st = recorded("status_direct.json")
    p = _peer(st)
    p.update({"Online": "true", "CurAddr": 5, "TailscaleIPs": "100.64.0.2", "RxBytes": "12",
              "TxBytes": -4})
    (peer,) = P.parse_status(st).peers
    text = " | ".join(peer.malformed)
    for field in ("Online is a string", "CurAddr is a number", "TailscaleIPs is a string",
                  "RxBytes is a string", "TxBytes = -4 is negative"):
        assert field in text, text
    st["Self"]["Online"] = "yes"
    st["Health"] = "all good"
    snap = P.parse_status(st)
    assert snap.malformed == ("Health is a string, expected a list",
                              "Self.Online is a string, expected true/false")
    assert P.parse_status(recorded("status_direct.json")).malformed == ()


def test_malformed_self_online_is_not_called_control_server_unreachable(fake_tailscaled, tmp_path) -> None:
    m = _monitor(fake_tailscaled, tmp_path)
    m.poll()
    fake_tailscaled.status["Self"]["Online"] = "true"  # a string where tailscaled sends a bool
    m.poll()
    overlay = m.diagnostics()[0]
    assert overlay.name == "overlay" and overlay.level == WARN, overlay
    assert "control server unreachable" not in overlay.message
    assert "malformed (Self.Online is a string" in overlay.message, overlay.message
    assert "tailscale version" in overlay.message and "restart" in overlay.message
    assert ("malformed", "Self.Online is a string, expected true/false") in overlay.values
    fake_tailscaled.status["BackendState"] = 3  # the backend state itself: ERROR, not "not enrolled"
    m.poll()
    overlay = m.diagnostics()[0]
    assert overlay.level == ERROR and "BackendState is a number" in overlay.message, overlay.message
    assert "not enrolled" not in overlay.message
    m.close()


def test_huge_counters_are_clamped_with_one_warning_per_peer_and_field(fake_tailscaled, tmp_path) -> None:
    m = _monitor(fake_tailscaled, tmp_path)
    m.poll()
    assert m.take_warnings() == []
    fake_tailscaled.mode = "huge"  # RxBytes 1e400, TxBytes 2^70 as literal JSON numbers
    m.poll()
    peer = m.find("robotb")
    assert not m.freshness().stale and peer.rx_bytes == 0 and peer.tx_bytes == UINT64_MAX
    warnings = m.take_warnings()
    assert len(warnings) == 2, warnings
    rx, tx = sorted(warnings)
    assert "peer robotb" in rx and "RxBytes = inf is not a byte count (shown as 0)" in rx, rx
    assert "peer robotb" in tx and "TxBytes = 1.18e+21 is above 2^64-1 (clamped" in tx, tx
    assert all("\n" not in w and "fix: check that tailscaled is a supported version" in w for w in warnings)
    m.poll()
    assert m.take_warnings() == [], "said once, not every poll"
    fake_tailscaled.mode = "good"
    m.poll()
    fake_tailscaled.mode = "huge"
    m.poll()
    assert len(m.take_warnings()) == 2, "said again when it comes back"
    m.close()
