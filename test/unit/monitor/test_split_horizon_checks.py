"""Split horizon in the node's logic: the hosts block (entries from the monitor, written by the
node's overlay-hosts step through ManagedHosts) and the own-name preflight check."""
import os

from overlay_manager.core.config import apply_overrides, load_robot_config
from overlay_manager.monitor import overlay_monitor as M
from overlay_manager.system import probes
from overlay_manager.system.hosts import ManagedHosts
from overlay_manager.tailscaled.localapi import LocalAPI

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "config", "robot.example.yaml")
OWN = "robota.fleet.internal"  # the fake tailscaled's own machine (100.64.0.1)


def _monitor(fake, tmp_path):
    cfg = load_robot_config(EXAMPLE)
    cfg = apply_overrides(cfg, dict(hosts_file=str(tmp_path / "hosts"), manage_hosts=True), "test")
    return M.OverlayMonitor(cfg, LocalAPI(fake.socket_path), env={"ROS_HOSTNAME": OWN})


def _resolves(fake, tmp_path, monkeypatch, answers):
    monkeypatch.setattr(probes, "resolve", lambda name: tuple(answers.get(name, [])))
    monkeypatch.setattr(probes, "tcp_answers", lambda *a, **k: False)
    m = _monitor(fake, tmp_path)
    try:
        m.poll()
        return {c.name: c for c in m.preflight()}["ros_hostname_resolves"]
    finally:
        m.close()


def test_own_name_on_loopback_or_own_overlay_address_passes(fake_tailscaled, tmp_path, monkeypatch):
    for addrs in (["127.0.1.1"], ["127.0.0.1"], ["100.64.0.1"], ["127.0.1.1", "100.64.0.1"]):
        c = _resolves(fake_tailscaled, tmp_path, monkeypatch, {OWN: addrs})
        assert c.ok, (addrs, c.message)


def test_own_name_elsewhere_or_nowhere_fails_with_a_hint(fake_tailscaled, tmp_path, monkeypatch):
    c = _resolves(fake_tailscaled, tmp_path, monkeypatch, {OWN: ["100.64.0.9"]})
    assert not c.ok and "100.64.0.9" in c.message and "loopback" in c.message and c.hint
    c = _resolves(fake_tailscaled, tmp_path, monkeypatch, {OWN: ["127.0.1.1", "100.64.0.2"]})
    assert not c.ok
    c = _resolves(fake_tailscaled, tmp_path, monkeypatch, {})
    assert not c.ok and "does not resolve" in c.message


def _poll_and_write(m, kept):
    """One poll, then what the node's overlay-hosts step does with the reading."""
    m.poll()
    entries = m.hosts_entries()
    if entries is not None:
        m.hosts_error = kept.write(entries)


def test_hosts_block_written_by_the_node_logic_is_split_horizon(fake_tailscaled, tmp_path):
    m = _monitor(fake_tailscaled, tmp_path)
    try:
        _poll_and_write(m, ManagedHosts(str(tmp_path / "hosts")))
        assert m.hosts_error == ""
    finally:
        m.close()
    lines = (tmp_path / "hosts").read_bytes().splitlines()
    assert b" 100.64.0.1 " not in b" ".join(lines)
    # tailscaled's own names first, then the config's (alpha-robot1: the example config's hostname)
    assert lines[1:3] == [b"127.0.1.1 robota.fleet.internal robota alpha-robot1.fleet.internal alpha-robot1",
                          b"100.64.0.2 robotb.fleet.internal robotb"]


def test_hosts_block_kept_while_tailscaled_is_not_running(fake_tailscaled, tmp_path):
    """A restarting or logged-out tailscaled lists no peers: the block must not lose them."""
    m = _monitor(fake_tailscaled, tmp_path)
    kept = ManagedHosts(str(tmp_path / "hosts"))
    try:
        _poll_and_write(m, kept)
        before = (tmp_path / "hosts").read_bytes()
        fake_tailscaled.status = dict(fake_tailscaled.status, BackendState="Starting", Peer={})
        assert m.poll() is not None and m.hosts_entries() is None
        _poll_and_write(m, kept)
        assert (tmp_path / "hosts").read_bytes() == before
    finally:
        m.close()
