"""OverlayMonitor against a fake tailscaled: services logic, diagnostics, hosts, errors."""
import math
import os
import shutil

from overlay_manager.core.config import apply_overrides, load_robot_config
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.monitor.readings import ERROR, OK, WARN
from overlay_manager.system import iperf
from overlay_manager.tailscaled.localapi import LocalAPI

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
EXAMPLE = os.path.join(ROOT, "config", "robot.example.yaml")


def _monitor(fake, tmp_path, **node):
    cfg = load_robot_config(EXAMPLE)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    cfg = apply_overrides(cfg, dict(hosts_file=str(hosts), **node), "test")
    return OverlayMonitor(cfg, LocalAPI(fake.socket_path), env={"ROS_HOSTNAME": "robota.fleet.internal"})


def _peer(fake):
    return next(iter(fake.status["Peer"].values()))


def test_poll_changes_and_services(fake_tailscaled, tmp_path):
    m = _monitor(fake_tailscaled, tmp_path)
    ev = m.poll()
    assert [(e.peer.name, e.old_path, e.new_path) for e in ev] == [("robotb", "", "direct")]
    assert m.poll() == []
    _peer(fake_tailscaled)["CurAddr"] = ""
    assert [(e.old_path, e.new_path) for e in m.poll()] == [("direct", "derp")]
    assert [p.name for p in m.list_peers(path="derp")] == ["robotb"]
    assert m.list_peers(path="direct") == [] and m.list_peers(tag="tag:none") == []
    assert m.find("100.64.0.2").name == "robotb"
    m.close()


def test_ping_records_latency_and_unknown_peer(fake_tailscaled, tmp_path):
    m = _monitor(fake_tailscaled, tmp_path)
    m.poll()
    out = m.ping("robotb", 2, 1.0)
    assert out.ok and out.received == 2 and out.path == "direct" and out.latency_mean_ms > 0
    m.poll()
    assert not math.isnan(m.find("robotb").latency_ms)
    _peer(fake_tailscaled)["CurAddr"] = ""  # path changes to derp: the direct-path latency is dropped
    m.poll()
    assert m.find("robotb").path == "derp" and math.isnan(m.find("robotb").latency_ms)
    bad = m.ping("ghost")
    assert not bad.ok and "unknown peer" in bad.message
    fake_tailscaled.ping = {"Err": "timeout", "IP": "100.64.0.2"}
    timeout = m.ping("robotb", 1, 0.5)
    assert not timeout.ok and "no answer" in timeout.message
    m.close()


def test_wait_for_peer_direct_and_timeout(fake_tailscaled, tmp_path):
    m = _monitor(fake_tailscaled, tmp_path)
    m.poll()
    r = m.wait_for_peer("robotb", 2.0, True)
    assert r.ok and r.peer.name == "robotb" and r.waited_s < 2.0
    fake_tailscaled.ping = dict(fake_tailscaled.ping, Endpoint="", DERPRegionID=999, DERPRegionCode="lab")
    r = m.wait_for_peer("robotb", 0.6, True)
    assert not r.ok and "not direct" in r.message and r.waited_s >= 0.6
    r = m.wait_for_peer("ghost", 0.3, False)
    assert not r.ok and "ghost" in r.message
    m.close()


def test_diagnostics_levels(fake_tailscaled, tmp_path):
    m = _monitor(fake_tailscaled, tmp_path)
    m.poll()
    d = {x.name: x for x in m.diagnostics()}
    assert d["overlay"].level == OK and d["peer robotb"].level == OK
    _peer(fake_tailscaled)["CurAddr"] = ""
    fake_tailscaled.status["Self"]["Online"] = False
    m.poll()
    d = {x.name: x for x in m.diagnostics()}
    assert d["overlay"].level == WARN and "control server unreachable" in d["overlay"].message
    assert d["peer robotb"].level == WARN and "relayed" in d["peer robotb"].message
    _peer(fake_tailscaled)["Online"] = False
    m.poll()
    assert {x.name: x for x in m.diagnostics()}["peer robotb"].level == OK  # not a required peer
    m.cfg = apply_overrides(m.cfg, {"required_peers": ["robotb"]}, "test")
    assert {x.name: x for x in m.diagnostics()}["peer robotb"].level == ERROR
    m.close()


def test_tailscaled_gone_is_error_and_peers_go_offline(fake_tailscaled, tmp_path):
    m = _monitor(fake_tailscaled, tmp_path)
    m.poll()
    m.api.socket_path = str(tmp_path / "gone.sock")
    ev = m.poll()
    assert [(e.old_path, e.new_path) for e in ev] == [("direct", "offline")]
    (diag,) = m.diagnostics()
    assert diag.level == ERROR and "tailscaled" in diag.message
    m.close()


def test_manage_hosts_entries_computed_not_written(fake_tailscaled, tmp_path):
    """The monitor computes the hosts block's entries; it never writes the file (the node does)."""
    m = _monitor(fake_tailscaled, tmp_path, manage_hosts=True)
    assert m.hosts_entries() is None                      # nothing read yet
    m.poll()
    assert (tmp_path / "hosts").read_text() == "127.0.0.1 localhost\n"
    # split horizon: this machine (robota) -> loopback, the other machine -> its overlay address
    entries = m.hosts_entries()
    assert ("100.64.0.2", ("robotb.fleet.internal", "robotb")) in entries
    assert entries[0][0] == "127.0.1.1" and entries[0][1][:2] == ("robota.fleet.internal", "robota")
    assert not [e for e in entries if e[0] == "100.64.0.1"]
    m.close()
    off = _monitor(fake_tailscaled, tmp_path)              # node.manage_hosts false
    off.poll()
    assert off.snapshot is not None and off.hosts_entries() is None
    off.close()


def test_measure_link_unknown_peer_is_clean_failure(fake_tailscaled, tmp_path, monkeypatch):
    m = _monitor(fake_tailscaled, tmp_path)
    m.poll()
    r = m.measure_link("ghost", 1, 1)
    assert not r.ok and "unknown peer" in r.message
    if shutil.which("iperf3"):
        # 100.64.0.2 is not reachable here: with a default route iperf3 3.12 waits for the SYN's
        # answer whatever --connect-timeout says, until run_iperf's bound (duration + 15 s) kills
        # it. The same path with a 2 s bound: the real iperf3 is started, killed, and reported.
        real_run_iperf = iperf.run_iperf

        def bounded(ip, port, duration_s, udp_mbps=None, timeout_s=None):
            return real_run_iperf(ip, port, duration_s, udp_mbps, timeout_s=min(timeout_s or 2.0, 2.0))

        monkeypatch.setattr(iperf, "run_iperf", bounded)
        r = m.measure_link("robotb", 1, 1)
        assert not r.ok and r.message.startswith("robotb: "), r.message
    m.close()


def test_rosbridge_entry_from_real_listening_sockets(fake_tailscaled, tmp_path):
    """node.rosbridge_port: the monitor reads this namespace's listening sockets; a loopback-only
    listener is OK without asking nftables; 0 = no entry."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        m = _monitor(fake_tailscaled, tmp_path, rosbridge_port=port)
        m.poll()
        assert not [d for d in m.diagnostics() if d.name == "rosbridge"]  # not read yet: no entry
        r = m.refresh_rosbridge()
        assert [x.address for x in r.listeners] == ["127.0.0.1"] and r.restriction is None
        (d,) = (d for d in m.diagnostics() if d.name == "rosbridge")
        assert d.level == OK and "loopback/overlay addresses only" in d.message
    r = m.refresh_rosbridge()  # closed: nothing listens any more
    (d,) = (d for d in m.diagnostics() if d.name == "rosbridge")
    assert r.listeners == () and d.level == WARN and "nothing listens" in d.message
    m.close()
    off = _monitor(fake_tailscaled, tmp_path)
    off.poll()
    assert not [d for d in off.diagnostics() if d.name == "rosbridge"]
    off.close()
