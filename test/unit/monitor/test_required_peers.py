"""Per-peer severity follows roles: offline is ERROR only for required peers (node.required_peers
and the ROS master's machine); a closed operator laptop turns nothing red."""
import os

from overlay_manager.core.config import load_robot_config
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.monitor.readings import ERROR, OK
from overlay_manager.tailscaled.localapi import LocalAPI
from overlay_manager.testing.tsfake import write_robot_config

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def _monitor(fake, tmp_path, master="robota", **node):
    cfg_path = tmp_path / "robot.yaml"
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    write_robot_config(cfg_path, fake.socket_path, dict(hosts_file=str(hosts), netcheck_interval=0, **node),
                       master=master)
    return OverlayMonitor(load_robot_config(str(cfg_path)), LocalAPI(fake.socket_path))


def _diag(m):
    m.poll()
    return {d.name: d for d in m.diagnostics()}


def _offline(fake):
    next(iter(fake.status["Peer"].values()))["Online"] = False


def test_offline_peer_is_ok_unless_required(fake_tailscaled, tmp_path):
    m = _monitor(fake_tailscaled, tmp_path)
    _offline(fake_tailscaled)
    d = _diag(m)["peer robotb"]
    assert d.level == OK and d.message.startswith("offline")
    m.close()
    m = _monitor(fake_tailscaled, tmp_path, required_peers=["robotb"])
    d = _diag(m)["peer robotb"]
    assert d.level == ERROR and "required" in d.message
    m.close()


def test_master_machine_is_always_required(fake_tailscaled, tmp_path):
    m = _monitor(fake_tailscaled, tmp_path, master="robotb.fleet.internal")
    assert m.required_peers() == frozenset({"robotb.fleet.internal"})
    assert _diag(m)["peer robotb"].level == OK  # online and direct
    _offline(fake_tailscaled)
    assert _diag(m)["peer robotb"].level == ERROR
    m.close()


def test_required_peer_missing_from_tailnet_is_error(fake_tailscaled, tmp_path):
    m = _monitor(fake_tailscaled, tmp_path, required_peers=["base-station"])
    d = _diag(m)
    assert d["peer base-station"].level == ERROR and "not on the overlay" in d["peer base-station"].message
    assert d["peer robotb"].level == OK
    m.close()


def test_enrolment_error_is_an_error_on_the_overlay_entry(fake_tailscaled, tmp_path):
    m = _monitor(fake_tailscaled, tmp_path)
    assert _diag(m)["overlay"].level == OK
    m.enrol_error = "auth_key_file /x/auth.key has mode 0644: fix with `chmod 600 /x/auth.key`"
    d = _diag(m)["overlay"]
    assert d.level == ERROR and d.message.startswith("enrolment failed: auth_key_file") and "chmod 600" in d.message
    m.enrol_error = ""
    assert _diag(m)["overlay"].level == OK
    m.close()
