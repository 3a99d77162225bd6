"""`overlay_env --write-hosts` against a fake tailscaled: split horizon, any bytes, clear errors."""
import time

from overlay_manager.cli.overlay_env import main

OUTSIDE = b"127.0.0.1\tlocalhost\r\n# caf\xe9 \xff not UTF-8\r\n"


def _config(tmp_path, socket_path, hosts):
    cfg = tmp_path / "robot.yaml"
    cfg.write_text(f"hostname: robota\nlogin_server: https://10.99.0.2:8443\nbase_domain: fleet.internal\n"
                   f"master: robota\ntailscale:\n  socket: {socket_path}\n"
                   f"node:\n  manage_hosts: true\n  hosts_file: {hosts}\n")
    return str(cfg)


def test_write_hosts_split_horizon_keeps_latin1_and_crlf(fake_tailscaled, tmp_path, capsys):
    hosts = tmp_path / "hosts"
    hosts.write_bytes(OUTSIDE)
    cfg = _config(tmp_path, fake_tailscaled.socket_path, hosts)
    assert main(["--config", cfg, "--write-hosts"]) == 0
    out, err = capsys.readouterr()
    assert "export ROS_HOSTNAME=robota.fleet.internal" in out
    assert "robota.fleet.internal, robota -> loopback" in err
    data = hosts.read_bytes()
    assert data.startswith(OUTSIDE)
    block = data[len(OUTSIDE):].split(b"\r\n")
    assert block[1] == b"127.0.1.1 robota.fleet.internal robota"
    assert b"100.64.0.2 robotb.fleet.internal robotb" in block
    assert b"100.64.0.1" not in data
    assert main(["--config", cfg, "--write-hosts"]) == 0 and hosts.read_bytes() == data  # idempotent


def test_write_hosts_unbalanced_block_is_one_clear_line(fake_tailscaled, tmp_path, capsys):
    hosts = tmp_path / "hosts"
    hosts.write_bytes(OUTSIDE + b"# BEGIN overlay_manager managed block: do not edit, rewritten on every peer change\n")
    before = hosts.read_bytes()
    t0 = time.monotonic()
    assert main(["--config", _config(tmp_path, fake_tailscaled.socket_path, hosts), "--write-hosts",
                 "--retry", "30"]) == 1
    assert time.monotonic() - t0 < 5   # not retried: the file needs a person, not time
    err = capsys.readouterr().err
    assert err.count("markers are unbalanced") == 1 and "retrying" not in err
    assert f"{hosts}: overlay_manager block markers are unbalanced" in err and "Traceback" not in err
    assert hosts.read_bytes() == before


def test_write_hosts_keeps_the_block_while_tailscaled_is_not_running(fake_tailscaled, tmp_path, capsys):
    hosts = tmp_path / "hosts"
    hosts.write_bytes(OUTSIDE)
    cfg = _config(tmp_path, fake_tailscaled.socket_path, hosts)
    assert main(["--config", cfg, "--write-hosts"]) == 0
    before = hosts.read_bytes()
    fake_tailscaled.status = dict(fake_tailscaled.status, BackendState="Starting", Peer={})
    assert main(["--config", cfg, "--write-hosts"]) == 0
    assert hosts.read_bytes() == before and "kept the managed block" in capsys.readouterr().err
    # a first start without any block still writes this machine's own names (roslaunch needs them)
    fresh = tmp_path / "fresh"
    fresh.write_bytes(OUTSIDE)
    assert main(["--config", _config(tmp_path, fake_tailscaled.socket_path, fresh), "--write-hosts"]) == 0
    assert b"127.0.1.1 robota.fleet.internal robota" in fresh.read_bytes()
