"""`fleet renew-cert` against a real headscale with a real tailscaled enrolled through it:
the server certificate is re-issued from the fleet CA, headscale serves the new one after a
restart, and the machine (which trusts only the bundle's ca.crt) reconnects without any change
on it. Also `fleet status`'s expiry warning. Loopback only; every process started here is
ended by its pid (the shared server fixture of test_fleet_headscale)."""
from __future__ import annotations

import os
import socket
import ssl
import subprocess
from pathlib import Path

from test_fleet_headscale import (  # noqa: F401 - server is a pytest fixture used by name
    REPO,
    TAILSCALE,
    Server,
    pytestmark,
    run_fleet,
    server,
    start_tailscaled,
    stop,
    wait_for,
)

from overlay_manager.fleet import tls
from overlay_manager.fleet.bundle import write_bundle

HERE = Path(__file__).resolve().parent

HOST = "alpha-robot1"


def served_cert(srv: Server) -> bytes:
    """The certificate headscale presents on its HTTPS port (DER)."""
    host, port = srv.dep.server_url.split("//", 1)[1].rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(srv.dep.ca_cert))
    with ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=5),
                         server_hostname=host) as s:
        return s.getpeercert(binary_form=True)


def restart_headscale(srv: Server) -> None:
    old = srv.procs[0]
    stop(old)
    with open(srv.log, "ab") as out:
        srv.procs[0] = subprocess.Popen(srv.dep.serve_argv(), stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
    wait_for("headscale to answer again", srv.dep.cli().health, 30, srv.log)


def test_renew_cert_keeps_machines_connected(server: Server) -> None:  # noqa: F811 - the fixture
    ts = start_tailscaled(server, HOST)
    out = server.root / "bundles" / HOST
    config = write_bundle(server.dep, server.fleet, HOST, out, overrides={
        "tailscale": {"socket": str(ts.socket), "cli": str(TAILSCALE), "up_timeout": 30.0}})
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # the workspace's (devel space)
    enrol = subprocess.run(["/usr/bin/python3", str(REPO / "scripts" / "overlay_env"), "--config", str(config),
                            "--enrol"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert enrol.returncode == 0, enrol.stderr
    wait_for(f"{HOST} online at the control server",
             lambda: ts.status().get("Self", {}).get("Online") is True, 30, ts.log)

    before = served_cert(server)
    crt = server.dep.root / "tls" / "server.crt"
    assert before == ssl.PEM_cert_to_DER_cert(crt.read_text())
    ca = (server.dep.root / "tls" / "ca.crt").read_bytes()

    kept = run_fleet(server, "renew-cert")
    assert kept.returncode == 0 and "kept" in kept.stdout, kept.stdout + kept.stderr
    res = run_fleet(server, "renew-cert", "--force")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "re-issued from the fleet CA (asked)" in res.stdout and "restart headscale" in res.stdout, res.stdout
    assert (server.dep.root / "tls" / "ca.crt").read_bytes() == ca

    restart_headscale(server)
    after = served_cert(server)
    assert after != before and after == ssl.PEM_cert_to_DER_cert(crt.read_text()), \
        "headscale serves the renewed certificate"
    # the machine trusts only the bundle's ca.crt (SSL_CERT_FILE) and reconnects by itself
    wait_for(f"{HOST} online at the restarted control server",
             lambda: ts.status().get("Self", {}).get("Online") is True
             and ts.status().get("BackendState") == "Running", 60, ts.log)
    st = run_fleet(server, "status")
    assert st.returncode == 0 and "warning" not in st.stderr, st.stderr
    assert any(line.split()[:1] == [HOST] and " online " in f" {line} " for line in st.stdout.splitlines()), \
        st.stdout


def test_status_warns_about_a_certificate_that_ends_soon(server: Server, tmp_path: Path) -> None:  # noqa: F811
    """A server certificate with 10 days left (issued here from the deployment's CA, as
    `days: 10` would) makes `fleet status` print one warning line naming the file, the date and
    the command, and still the table."""
    t = server.dep.root / "tls"
    res = tls.ensure_server_cert(t, t / "ca.key", t / "ca.crt", [server.fleet.server.host], 10, force=True)
    st = run_fleet(server, "status")
    assert st.returncode == 0, st.stderr
    (line,) = (ln for ln in st.stderr.splitlines() if ln.startswith("fleet: warning: "))
    assert f"{t / 'server.crt'}: the server certificate expires on {res.not_after:%Y-%m-%d %H:%M} UTC" in line
    assert "renew-cert`, then restart headscale" in line and "HOST" in st.stdout
