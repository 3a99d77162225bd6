"""Fleet provisioning against a real headscale on loopback, with real tailscaled clients.

Topology (everything on 127.0.0.1, random free ports, one temp dir per run)::

    headscale (fleet init + serve_argv, TLS from the generated CA, embedded DERP/STUN)
        ^                         ^
        | https://127.0.0.1:P     |
    tailscaled "alpha-robot1"     tailscaled "stranger"  (--tun=userspace-networking, own
    (enrols from its bundle       (enrols with a key       statedir/socket/TS_LOGS_DIR,
     through overlay_manager's     made outside the         SSL_CERT_FILE=ca.crt)
     enrolment code)               fleet file)

Needs .tools/bin/{headscale,tailscale,tailscaled} (scripts/setup); no root, no namespaces.
Every process is started here and ended by its pid in a finally block.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import yaml

from overlay_manager.fleet import deploy as deploy_mod
from overlay_manager.fleet.bundle import read_key_record, write_bundle
from overlay_manager.fleet.config import load_fleet
from overlay_manager.fleet.deploy import Deployment, apply_policy, init_deployment
from overlay_manager.fleet.model import FleetConfig, FleetError
from overlay_manager.fleet.ops import fleet_status, revoke, rotate
from overlay_manager.system import (
    children,
    waiting,
)

REPO = Path(__file__).resolve().parents[2]

BIN = REPO / ".tools" / "bin"
HEADSCALE, TAILSCALE, TAILSCALED = BIN / "headscale", BIN / "tailscale", BIN / "tailscaled"
_missing = [str(p) for p in (HEADSCALE, TAILSCALE, TAILSCALED) if not os.access(p, os.X_OK)]
pytestmark = pytest.mark.skipif(bool(_missing), reason=f"needs {', '.join(_missing)} (run scripts/setup)")


def wait_for(what: str, check: Callable[[], Any], timeout: float, log: Optional[Path] = None) -> Any:
    """overlay_manager.system.waiting.wait_for every 0.2 s, with the tail of ``log`` as the last state."""
    def tail() -> str:
        if log is None or not log.exists():
            return "no log"
        return "\n--- " + str(log) + " (tail) ---\n" + waiting.tail(log, 25, sep="\n")
    return waiting.wait_for(what, check, timeout, interval=0.2, detail=tail)


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """End ``proc`` (started by this test) by its pid: SIGTERM, then SIGKILL (children.stop)."""
    children.stop(proc, timeout)


def loopback_fleet(path: Path, name: str, teams: Dict[str, Any]) -> Path:
    """Write a fleet file to ``path`` whose headscale serves on loopback only: HTTPS (TLS from the
    generated CA), gRPC and STUN on free ports, auth keys valid for an hour."""
    port, grpc, stun = free_port(), free_port(), free_port(socket.SOCK_DGRAM)
    path.write_text(yaml.safe_dump({
        "fleet": name,
        "base_domain": "fleet.internal",
        "server": {"url": f"https://127.0.0.1:{port}", "listen": f"127.0.0.1:{port}",
                   "grpc_listen": f"127.0.0.1:{grpc}",
                   "derp": {"stun_listen": f"127.0.0.1:{stun}"}},
        "keys": {"auth_key_expiry": "1h"},
        "teams": teams,
    }))
    return path


@dataclass
class Server:
    root: Path
    fleet_file: Path
    fleet: FleetConfig
    dep: Deployment
    log: Path
    procs: List[subprocess.Popen]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    root = Path(tempfile.mkdtemp(prefix="fleet-it-", dir="/tmp"))
    procs: List[subprocess.Popen] = []
    try:
        fleet_file = loopback_fleet(root / "fleet.yaml", "ittest", {
            "alpha": {"robots": ["alpha-robot1", "alpha-robot2"], "operators": ["alpha-op"]},
            "bravo": {"robots": ["bravo-robot1"]}})
        fleet = load_fleet(fleet_file)
        dep = init_deployment(fleet, root / "hs", headscale=str(HEADSCALE))
        log = root / "headscale.log"
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(dep.serve_argv(), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL))
        wait_for("headscale to answer on its unix socket", dep.cli().health, 30, log)
        yield Server(root, fleet_file, fleet, dep, log, procs)
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Tailscaled:
    dir: Path
    socket: Path
    proc: subprocess.Popen
    log: Path

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(TAILSCALE), f"--socket={self.socket}", *args], capture_output=True,
                              text=True, timeout=timeout, check=False)

    def status(self) -> Dict[str, Any]:
        out = self.cli("status", "--json")
        return json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}


def start_tailscaled(srv: Server, name: str) -> Tailscaled:
    d = srv.root / "ts" / name
    d.mkdir(parents=True)
    sock, log = d / "tailscaled.sock", d / "tailscaled.log"
    env = {**os.environ, "SSL_CERT_FILE": str(srv.dep.ca_cert), "TS_LOGS_DIR": str(d)}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(TAILSCALED), "--tun=userspace-networking", f"--statedir={d}",
                                 f"--socket={sock}", "--port=0"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    srv.procs.append(proc)
    ts = Tailscaled(d, sock, proc, log)
    wait_for(f"tailscaled {name} socket {sock}", lambda: ts.status().get("BackendState"), 20, log)
    return ts


def row(srv: Server, host: str) -> Any:
    return next(r for r in fleet_status(srv.dep, srv.fleet) if r.host == host)


def key_count(srv: Server) -> int:
    return len(srv.dep.cli().list_preauth_keys())


def run_fleet(srv: Server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/bin/python3", str(REPO / "scripts" / "fleet"), "-f", str(srv.fleet_file),
                           "-d", str(srv.dep.root), "--headscale", str(HEADSCALE), *args],
                          capture_output=True, text=True, timeout=60, check=False)


# --- tests (module order matters: they share one server) -----------------------------------

def test_init_is_idempotent(server: Server) -> None:
    files = ["config.yaml", "policy.hujson", "tls/ca.crt", "tls/ca.key", "tls/server.crt"]
    before = {f: (server.dep.root / f).read_bytes() for f in files}
    dep2 = init_deployment(server.fleet, server.dep.root, headscale=str(HEADSCALE))
    assert {f: (server.dep.root / f).read_bytes() for f in files} == before
    assert dep2.serve_argv() == server.dep.serve_argv()
    assert Deployment.open(server.dep.root).server_url == server.dep.server_url
    assert (server.dep.root / "tls" / "ca.key").stat().st_mode & 0o777 == 0o600
    assert server.dep.server_pid() == server.procs[0].pid


def test_bundle_files_and_idempotency(server: Server) -> None:
    out = server.root / "bundles" / "alpha-robot1"
    n0 = key_count(server)
    path = write_bundle(server.dep, server.fleet, "alpha-robot1", out,
                        overrides={"tailscale": {"cli": str(TAILSCALE), "up_timeout": 30.0}})
    assert path == out / "robot.yaml"
    key = (out / "auth.key").read_text().strip()
    assert key.startswith("hskey-auth-")
    assert (out / "auth.key").stat().st_mode & 0o777 == 0o600
    assert (out / "ca.crt").read_bytes() == server.dep.ca_cert.read_bytes()
    cfg = yaml.safe_load(path.read_text())
    assert cfg["hostname"] == "alpha-robot1" and cfg["master"] == "alpha-robot1"
    assert cfg["login_server"] == server.dep.server_url and cfg["base_domain"] == "fleet.internal"
    assert cfg["tags"] == ["tag:team-alpha", "tag:robot"]
    assert key not in path.read_text()
    assert key_count(server) == n0 + 1
    listed = {k.id: k for k in server.dep.cli().list_preauth_keys()}
    kid = read_key_record(server.dep, "alpha-robot1")[0]
    assert sorted(listed[kid].tags) == ["tag:robot", "tag:team-alpha"]

    write_bundle(server.dep, server.fleet, "alpha-robot1", out,
                 overrides={"tailscale": {"cli": str(TAILSCALE), "up_timeout": 30.0}})
    assert key_count(server) == n0 + 1, "bundle again must reuse the unused key"
    assert (out / "auth.key").read_text().strip() == key
    assert read_key_record(server.dep, "alpha-robot1")[0] == kid


def test_robot_yaml_loads_with_node_config_loader(server: Server) -> None:
    try:
        from overlay_manager.core.config import load_robot_config
    except ImportError as e:
        pytest.skip(f"overlay_manager.core.config not available: {e}")
    cfg = load_robot_config(str(server.root / "bundles" / "alpha-robot1" / "robot.yaml"))
    assert cfg.hostname == "alpha-robot1"
    assert Path(cfg.auth_key_file) == server.root / "bundles" / "alpha-robot1" / "auth.key"
    assert Path(cfg.ca_cert) == server.root / "bundles" / "alpha-robot1" / "ca.crt"


def test_cli_bundle_never_prints_the_key(server: Server) -> None:
    out = server.root / "bundles" / "alpha-robot2"
    res = run_fleet(server, "bundle", "alpha-robot2", "-o", str(out))
    assert res.returncode == 0, res.stderr
    key = (out / "auth.key").read_text().strip()
    assert key and key not in res.stdout + res.stderr
    assert key[:20] not in res.stdout + res.stderr
    bad = run_fleet(server, "bundle", "zulu")
    assert bad.returncode == 2 and bad.stderr.startswith("fleet: error: ") and "zulu" in bad.stderr


def test_enrol_from_bundle_and_status(server: Server) -> None:
    ts = start_tailscaled(server, "alpha-robot1")
    bundle = server.root / "bundles" / "alpha-robot1"
    try:
        from overlay_manager.core.config import load_robot_config
        from overlay_manager.tailscaled.enrolment import ensure_enrolled
        from overlay_manager.tailscaled.localapi import LocalAPI
    except ImportError:  # node code not there: enrol the way it would
        cfg = yaml.safe_load((bundle / "robot.yaml").read_text())
        res = ts.cli("up", f"--login-server={cfg['login_server']}", f"--auth-key=file:{bundle / 'auth.key'}",
                     f"--hostname={cfg['hostname']}", "--accept-dns=false", "--timeout=30s")
        assert res.returncode == 0, res.stderr
    else:
        cfg = load_robot_config(str(bundle / "robot.yaml"))
        # headscale 0.29 rejects `--advertise-tags` with any pre-auth key ("requested tags ... are
        # invalid or not permitted"): the node gets its tags from the key. robot.yaml's tags say
        # which tags the key gives; enrol without advertising them.
        cfg = dataclasses.replace(cfg, tags=())
        result = ensure_enrolled(LocalAPI(str(ts.socket)), cfg)
        assert result.action == "enrolled", result
    wait_for("tailscaled alpha-robot1 to be Running", lambda: ts.status().get("BackendState") == "Running",
             30, ts.log)
    r = wait_for("fleet status to show alpha-robot1 online", lambda: (x := row(server, "alpha-robot1")).state
                 == "online" and x, 20, server.log)
    assert r.team == "alpha" and r.role == "robot" and r.ip.startswith("100.")
    assert r.tags == ("tag:robot", "tag:team-alpha") and not r.problems
    assert ts.status()["Self"]["DNSName"].startswith("alpha-robot1.fleet.internal")
    res = run_fleet(server, "status", "--json")
    assert res.returncode == 0, res.stderr
    rows = {x["host"]: x for x in json.loads(res.stdout)}
    assert rows["alpha-robot1"]["state"] == "online"
    assert rows["bravo-robot1"]["state"] == "never-enrolled"
    assert any("no bundle yet" in p for p in rows["bravo-robot1"]["problems"])


def test_bundle_after_enrolment_converges(server: Server) -> None:
    n_keys, n_nodes = key_count(server), len(server.dep.cli().list_nodes())
    write_bundle(server.dep, server.fleet, "alpha-robot1", server.root / "bundles" / "alpha-robot1")
    assert key_count(server) == n_keys, "an enrolled host keeps its (used) key: no new key"
    assert len(server.dep.cli().list_nodes()) == n_nodes


def test_node_not_in_fleet_file_is_listed(server: Server) -> None:
    ts = start_tailscaled(server, "stranger")
    _, secret = server.dep.cli().create_preauth_key(["tag:robot"], 600)
    keyfile = ts.dir / "auth.key"
    fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret)
    res = ts.cli("up", f"--login-server={server.dep.server_url}", f"--auth-key=file:{keyfile}",
                 "--hostname=stranger", "--accept-dns=false", "--timeout=30s")
    assert res.returncode == 0, res.stderr
    r = wait_for("status to list 'stranger' as unknown",
                 lambda: next((x for x in fleet_status(server.dep, server.fleet) if x.host == "stranger"), None),
                 20, server.log)
    assert r.state == "unknown" and r.team == "" and "not in the fleet file" in r.problems[0]
    revoke(server.dep, None, "stranger", delete=True)
    stop(ts.proc)
    assert all(x.host != "stranger" for x in fleet_status(server.dep, server.fleet))


def test_policy_apply_check_swap_reload(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not apply_policy(server.dep, server.fleet).changed
    data = yaml.safe_load(server.fleet_file.read_text())
    data["teams"]["charlie"] = {"robots": ["charlie-robot1"]}
    server.fleet_file.write_text(yaml.safe_dump(data))
    fleet2 = load_fleet(server.fleet_file)
    res = apply_policy(server.dep, fleet2)
    assert res.changed and res.reloaded and res.checked == "server"
    assert "tag:team-charlie" in server.dep.policy_path.read_text()
    wait_for("headscale to log the policy reload", lambda: "Policy reload completed" in server.log.read_text(),
             10, server.log)
    assert not apply_policy(server.dep, fleet2).changed  # converged

    # a policy headscale rejects never replaces the one in force
    good = server.dep.policy_path.read_text()
    monkeypatch.setattr(deploy_mod, "render_policy", lambda f: '{"acls": [{"action": "accept", '
                        '"src": ["tag:nope"], "dst": ["*:*"]}]}\n')
    with pytest.raises(FleetError, match="old one stays in force") as info:
        apply_policy(server.dep, fleet2)
    assert "tag:nope" in str(info.value)
    assert server.dep.policy_path.read_text() == good
    assert not server.dep.policy_path.with_name("policy.hujson.new").exists()
    monkeypatch.undo()
    server.fleet = fleet2


def test_revoke_takes_it_off(server: Server) -> None:
    res = revoke(server.dep, server.fleet, "alpha-robot1")
    assert res.expired_nodes
    assert row(server, "alpha-robot1").state == "expired"
    again = revoke(server.dep, server.fleet, "alpha-robot1")
    assert not again.expired_nodes and not again.expired_keys  # idempotent
    ts_dir = server.root / "ts" / "alpha-robot1"
    ts = Tailscaled(ts_dir, ts_dir / "tailscaled.sock", server.procs[1], ts_dir / "tailscaled.log")
    st = wait_for("tailscaled alpha-robot1 to notice its node key expired (BackendState NeedsLogin)",
                  lambda: (x := ts.status()).get("BackendState") == "NeedsLogin" and x, 30, ts.log)
    print("tailscaled after revoke:", st.get("BackendState"), st.get("Health"))


def test_bundle_after_revoke_is_refused_with_rotate_hint(server: Server) -> None:
    """A bundle for a revoked host could never enrol (headscale spends its key on the expired
    node): `fleet bundle` refuses and points at `fleet rotate`, writing nothing."""
    out = server.root / "bundles" / "alpha-robot1-after-revoke"
    before = read_key_record(server.dep, "alpha-robot1")
    res = run_fleet(server, "bundle", "alpha-robot1", "-o", str(out))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith("fleet: error: ") and "fleet rotate alpha-robot1" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert not out.exists() and read_key_record(server.dep, "alpha-robot1") == before


def _reenrol(server: Server, out: Path) -> subprocess.CompletedProcess:
    ts_dir = server.root / "ts" / "alpha-robot1"
    ts = Tailscaled(ts_dir, ts_dir / "tailscaled.sock", server.procs[1], ts_dir / "tailscaled.log")
    return ts.cli("up", "--force-reauth", f"--login-server={server.dep.server_url}",
                  f"--auth-key=file:{out / 'auth.key'}", "--hostname=alpha-robot1", "--accept-dns=false",
                  "--timeout=30s")


def test_rotate_after_revoke_reenrols_as_fresh_node(server: Server) -> None:
    out = server.root / "bundles" / "alpha-robot1"
    old_id = read_key_record(server.dep, "alpha-robot1")[0]
    old_key = (out / "auth.key").read_text()
    old_node = row(server, "alpha-robot1").node_id
    rotate(server.dep, server.fleet, "alpha-robot1", out)
    new_id = read_key_record(server.dep, "alpha-robot1")[0]
    assert new_id != old_id and (out / "auth.key").read_text() != old_key
    assert (out / "auth.key").stat().st_mode & 0o777 == 0o600
    assert row(server, "alpha-robot1").state == "never-enrolled", "the expired node is deleted"
    res = _reenrol(server, out)
    assert res.returncode == 0, res.stderr + "\n".join(server.log.read_text().splitlines()[-20:])
    r = wait_for("alpha-robot1 online again after rotate",
                 lambda: (x := row(server, "alpha-robot1")).state == "online" and x, 20, server.log)
    assert r.node_id != old_node and not r.problems


def test_rotate_online_node_keeps_it(server: Server) -> None:
    out = server.root / "bundles" / "alpha-robot1"
    before = row(server, "alpha-robot1")
    n_nodes = len(server.dep.cli().list_nodes())
    rotate(server.dep, server.fleet, "alpha-robot1", out)
    assert read_key_record(server.dep, "alpha-robot1")[0] != before.key_id
    assert row(server, "alpha-robot1").state == "online"
    res = _reenrol(server, out)  # re-enrolling with the new key keeps the same node
    assert res.returncode == 0, res.stderr
    r = wait_for("alpha-robot1 online after re-enrolling with the rotated key",
                 lambda: (x := row(server, "alpha-robot1")).state == "online" and x, 20, server.log)
    assert r.node_id == before.node_id and len(server.dep.cli().list_nodes()) == n_nodes


def test_expired_bundle_key_is_reported_and_replaced(server: Server) -> None:
    write_bundle(server.dep, server.fleet, "bravo-robot1", server.root / "bundles" / "bravo-robot1")
    kid = read_key_record(server.dep, "bravo-robot1")[0]
    assert revoke(server.dep, server.fleet, "bravo-robot1").expired_keys == (kid,)
    r = row(server, "bravo-robot1")
    assert r.state == "never-enrolled" and any("expired" in p for p in r.problems)
    write_bundle(server.dep, server.fleet, "bravo-robot1", server.root / "bundles" / "bravo-robot1")
    assert read_key_record(server.dep, "bravo-robot1")[0] != kid


def test_unreachable_headscale_is_a_clear_error(server: Server, tmp_path: Path) -> None:
    dep = Deployment(root=tmp_path, fleet_name="x", server_url=server.dep.server_url,
                     base_domain="fleet.internal", ca_cert=None, headscale=str(HEADSCALE))
    (tmp_path / "config.yaml").write_text(server.dep.config_path.read_text().replace(
        str(server.dep.socket_path), str(tmp_path / "nothing.sock")))
    with pytest.raises(FleetError) as info:
        write_bundle(dep, server.fleet, "alpha-op", tmp_path / "b")
    assert info.value.host == "alpha-op" and "not running" in str(info.value)
