"""overlay_env at boot without tailscaled (--offline-ok) and the root upkeep loop (--watch),
against a fake tailscaled that goes away and comes back."""
import threading
import time

import pytest

from overlay_manager.cli.overlay_env import keep_in_step, main
from overlay_manager.core.config import load_robot_config
from overlay_manager.core.ros_env import compute_env
from overlay_manager.system.hosts import BEGIN, LOOPBACK
from overlay_manager.testing.tsfake import FakeTailscaled, write_robot_config

OUTSIDE = b"127.0.0.1 localhost\n"


def _setup(tmp_path, socket_path, **top):
    hosts = tmp_path / "hosts"
    hosts.write_bytes(OUTSIDE)
    cfg = write_robot_config(tmp_path / "robot.yaml", socket_path, {"hosts_file": str(hosts)}, **top)
    return str(cfg), hosts


def test_offline_ok_writes_names_from_the_config_and_own_names(tmp_path, capsys):
    cfg, hosts = _setup(tmp_path, str(tmp_path / "no-tailscaled.sock"))
    target = tmp_path / "run" / "ros.env"
    args = ["--config", cfg, "--enrol", "--write-hosts", "--env-file", str(target)]
    assert main(args) == 1 and not target.exists(), "without --offline-ok a dead tailscaled fails the start"
    assert hosts.read_bytes() == OUTSIDE
    capsys.readouterr()
    assert main(args + ["--offline-ok"]) == 0
    err = capsys.readouterr().err
    assert "no-tailscaled.sock" in err and "going on without tailscaled" in err
    text = target.read_text()
    assert "ROS_HOSTNAME=robota.fleet.internal\n" in text and "OVERLAY_MANAGER_MASTER_LOCAL=true\n" in text
    assert "OVERLAY_MANAGER_ADDRESS" not in text, "no address is known without tailscaled"
    assert f"{LOOPBACK} robota.fleet.internal robota".encode() in hosts.read_bytes()
    assert hosts.read_bytes().startswith(OUTSIDE)


def test_offline_ok_keeps_the_block_of_an_earlier_boot(tmp_path, fake_tailscaled):
    cfg, hosts = _setup(tmp_path, fake_tailscaled.socket_path)
    assert main(["--config", cfg, "--write-hosts"]) == 0
    with_peers = hosts.read_bytes()
    assert b"robotb" in with_peers
    fake_tailscaled.stop()
    assert main(["--config", cfg, "--write-hosts", "--offline-ok", "--env-file", str(tmp_path / "e")]) == 0
    assert hosts.read_bytes() == with_peers


def test_master_local_follows_the_config(tmp_path):
    cfg, _ = _setup(tmp_path, "/nonexistent.sock", master="robotb")
    env = compute_env(load_robot_config(cfg))
    assert not env.master_local and ("OVERLAY_MANAGER_MASTER_LOCAL", "false") in env.variables()
    cfg, _ = _setup(tmp_path, "/nonexistent.sock", master="robota.fleet.internal")
    assert compute_env(load_robot_config(cfg)).master_local


def test_watch_needs_steps_and_runs_alone(capsys):
    for argv in (["--watch", "5"], ["--watch", "5", "--write-hosts", "--env-file", "x"]):
        with pytest.raises(SystemExit) as exc:
            main(["--config", "/nonexistent.yaml"] + argv)
        assert exc.value.code == 2
    assert "--watch" in capsys.readouterr().err


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_watch_keeps_the_block_through_a_tailscaled_restart(tmp_path, capsys):
    fake = FakeTailscaled(ipn_bus=True)
    stop = threading.Event()
    try:
        cfg_path, hosts = _setup(tmp_path, fake.socket_path)
        cfg = load_robot_config(cfg_path)
        loop = threading.Thread(target=keep_in_step, args=(cfg, False, True, 30.0, stop), daemon=True)
        loop.start()
        _wait(lambda: b"robotb" in hosts.read_bytes())
        block = hosts.read_bytes()
        fake.stop()                       # tailscaled gone (a restart or an upgrade)
        time.sleep(1.5)
        assert hosts.read_bytes() == block and loop.is_alive()
        # back, with a new peer: the bus reconnects and wakes the loop long before the 30 s interval
        peers = fake.status["Peer"]
        key, peer = next(iter(peers.items()))
        fake.status = dict(fake.status, Peer=dict(peers, newkey=dict(peer, HostName="robotc",
                                                                      DNSName="robotc.fleet.internal.",
                                                                      TailscaleIPs=["100.64.0.9"])))
        t0 = time.monotonic()
        fake.start()
        _wait(lambda: b"100.64.0.9 robotc.fleet.internal robotc" in hosts.read_bytes())
        assert time.monotonic() - t0 < 10
        assert hosts.read_bytes().count(BEGIN) == 1
    finally:
        stop.set()
        fake.close()
    loop.join(5)
    assert not loop.is_alive(), "the loop ends when stop is set"
    err = capsys.readouterr().err
    assert "Traceback" not in err


def test_watch_enrols_only_when_tailscaled_needs_a_login(tmp_path, capsys):
    """Right after a restart tailscaled is in NoState with its login intact: no `tailscale up`
    then; NeedsLogin (a fresh or logged-out tailscaled): enrol, and retry after ENROL_RETRY_S."""
    fake = FakeTailscaled()
    argv_log = tmp_path / "argv"
    cli = tmp_path / "tailscale"
    cli.write_text(f"#!/bin/sh\necho up >> {argv_log}\nexit 1\n")
    cli.chmod(0o755)
    key = tmp_path / "auth.key"
    key.write_text("hskey-auth-NOT-A-REAL-KEY\n")
    key.chmod(0o600)
    stop = threading.Event()
    try:
        fake.status = dict(fake.status, BackendState="NoState", Peer={})
        fake.prefs = {"ControlURL": "", "LoggedOut": False}
        cfg_path, hosts = _setup(tmp_path, fake.socket_path, auth_key_file="auth.key",
                                 tailscale={"socket": fake.socket_path, "cli": str(cli), "up_timeout": 2.0})
        loop = threading.Thread(target=keep_in_step, args=(load_robot_config(cfg_path), True, True, 0.2, stop),
                                daemon=True)
        loop.start()
        time.sleep(1.5)
        assert not argv_log.exists(), "tailscale up was run while tailscaled was only starting"
        assert f"{LOOPBACK} robota.fleet.internal robota".encode() in hosts.read_bytes()
        fake.status = dict(fake.status, BackendState="NeedsLogin")
        _wait(argv_log.exists)
        _wait(lambda: "enrolment failed" in capsys.readouterr().err)
        time.sleep(1.0)
        assert argv_log.read_text().count("up") == 1, "an enrolment error is retried after ENROL_RETRY_S only"
    finally:
        stop.set()
        fake.close()
    loop.join(5)
    assert "hskey-auth" not in capsys.readouterr().err
