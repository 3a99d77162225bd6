"""The fleet's ACL policy enforced by real tailscaled in network namespaces (root only).

Topology (all names carry a per-run id R; nothing touches the host's own network)::

      ns fR-ctl  10.232.0.1   headscale (fleet init + serve_argv, TLS, embedded DERP/STUN)
           |
      ns fR-sw   bridge br0 (veth per namespace)
       |        |         |          |
    fR-a1      fR-a2     fR-op      fR-b1      fR-rl      tailscaled --tun=ts0 in each, enrolled
    alpha-     alpha-    alpha-op   bravo-     campus-    from its fleet bundle
    robot1     robot2    (operator) robot1     relay
    .11        .12       .13        .21        .31

campus-relay is an alpha base station and the fleet's peer relay for every team (the fleet
file's ``relays`` section); its relay server is turned on through the LocalAPI from its
bundle's ``relay`` key, as the node does.

Checks: alpha-robot1 opens TCP to alpha-robot2 (its team-mate); alpha-robot1, alpha-op and
bravo-robot1 cannot open TCP across teams; alpha-op reaches alpha-robot2; with the relay in the
fleet, bravo-robot1 sees the relay host and may ping it but opens no TCP connection to it, and
still sees no alpha machine. Processes are ended by pid and namespaces deleted in a finally
block.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
import yaml

from overlay_manager.cli import fleet as fleet_cli
from overlay_manager.core.config import load_robot_config
from overlay_manager.core.peers import parse_status
from overlay_manager.fleet.bundle import write_bundle
from overlay_manager.fleet.config import load_fleet
from overlay_manager.fleet.deploy import apply_policy, init_deployment
from overlay_manager.fleet.ops import fleet_status, sync_tags
from overlay_manager.system import children
from overlay_manager.system.waiting import wait_for
from overlay_manager.tailscaled.localapi import LocalAPI
from overlay_manager.tailscaled.relay import apply_relay, read_relay_state
from overlay_manager.tailscaled.status_json import StatusDecoder

REPO = Path(__file__).resolve().parents[2]

BIN = REPO / ".tools" / "bin"
HEADSCALE, TAILSCALE, TAILSCALED = BIN / "headscale", BIN / "tailscale", BIN / "tailscaled"
_missing = [str(p) for p in (HEADSCALE, TAILSCALE, TAILSCALED) if not os.access(p, os.X_OK)]
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, TUN)"),
    pytest.mark.skipif(bool(_missing), reason=f"needs {', '.join(_missing)} (run scripts/setup)"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2 (ip)"),
]

HOSTS = {"alpha-robot1": ("a1", "10.232.0.11"), "alpha-robot2": ("a2", "10.232.0.12"),
         "alpha-op": ("op", "10.232.0.13"), "bravo-robot1": ("b1", "10.232.0.21"),
         "campus-relay": ("rl", "10.232.0.31")}
CTL_IP = "10.232.0.1"
PORT = 7411  # TCP port of the test listeners (inside the overlay only)

LISTENER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept(); c.sendall(b"ok\\n"); c.close()
"""

CONNECT = """
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    print(c.recv(3).decode().strip() or "empty")
except OSError as e:
    print("fail:", e)
"""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    print("+", " ".join(argv))
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed: {res.stderr.strip()}")
    return res


class Net:
    def __init__(self) -> None:
        self.run = secrets.token_hex(3)
        self.ns: List[str] = []
        self.procs: List[subprocess.Popen] = []
        self.root = Path(tempfile.mkdtemp(prefix=f"fleet-acl-{self.run}-", dir="/tmp"))

    def name(self, short: str) -> str:
        return f"f{self.run}-{short}"

    def add_ns(self, short: str) -> str:
        ns = self.name(short)
        sh("ip", "netns", "add", ns)
        self.ns.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        return ns

    def popen(self, ns: str, argv: List[str], log: Path, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        print(f"+ [{ns}]", " ".join(argv))
        with open(log, "wb") as out:
            p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        self.procs.append(p)
        return p

    def connect(self, ns: str, ip: str, timeout: float = 3.0) -> str:
        res = sh("ip", "netns", "exec", ns, "/usr/bin/python3", "-c", CONNECT, ip, str(PORT), str(timeout))
        return res.stdout.strip()

    def close(self) -> None:
        for p in reversed(self.procs):
            children.stop(p, 10.0)  # SIGTERM, SIGKILL after 10 s, by pid
        for ns in reversed(self.ns):
            sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def net() -> Iterator[Dict[str, Any]]:
    n = Net()
    try:
        sw = n.add_ns("sw")
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        for short, ip in [("ctl", CTL_IP)] + [v for v in HOSTS.values()]:
            ns = n.add_ns(short)
            sh("ip", "-n", sw, "link", "add", f"v{short}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", sw, "link", "set", f"v{short}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

        fleet_file = n.root / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump({
            "fleet": "acltest", "base_domain": "fleet.internal",
            "server": {"url": f"https://{CTL_IP}:8443", "listen": f"{CTL_IP}:8443",
                       "derp": {"stun_listen": f"{CTL_IP}:3478", "ipv4": CTL_IP}},
            "teams": {"alpha": {"robots": ["alpha-robot1", "alpha-robot2"], "operators": ["alpha-op"],
                                "base_stations": ["campus-relay"]},
                      "bravo": {"robots": ["bravo-robot1"]}},
            "relays": {"campus-relay": {"port": 40000}},
        }))
        fleet = load_fleet(fleet_file)
        dep = init_deployment(fleet, n.root / "hs", headscale=str(HEADSCALE))
        hs_log = n.root / "headscale.log"
        n.popen(n.name("ctl"), dep.serve_argv(), hs_log)
        wait_for(f"headscale in {n.name('ctl')} to answer on its socket", dep.cli().health, 30)

        for host, (short, _) in HOSTS.items():
            b = n.root / "hosts" / host
            write_bundle(dep, fleet, host, b)
            n.popen(n.name(short), [str(TAILSCALED), "--tun=ts0", f"--statedir={b}/state",
                                    f"--socket={b}/tailscaled.sock", "--port=41641"],
                    b / "tailscaled.log", env={"SSL_CERT_FILE": str(b / "ca.crt"), "TS_LOGS_DIR": str(b)})
        for host in HOSTS:
            b = n.root / "hosts" / host
            wait_for(f"tailscaled socket of {host}", lambda b=b: (b / "tailscaled.sock").exists(), 20)
            res = wait_for(f"`tailscale up` of {host}", lambda b=b, host=host: (r := subprocess.run(
                [str(TAILSCALE), f"--socket={b}/tailscaled.sock", "up", f"--login-server={dep.server_url}",
                 f"--auth-key=file:{b}/auth.key", f"--hostname={host}", "--accept-dns=false", "--timeout=30s"],
                capture_output=True, text=True, timeout=60)).returncode == 0 and r or None, 40)
            assert res.returncode == 0

        rows = wait_for("all five hosts online", lambda: (rs := {r.host: r for r in fleet_status(dep, fleet)})
                        and all(rs[h].state == "online" for h in HOSTS) and rs, 30)
        ips = {h: rows[h].ip for h in HOSTS}
        for host, (short, _) in HOSTS.items():
            n.popen(n.name(short), ["/usr/bin/python3", "-c", LISTENER, str(PORT)],
                    n.root / "hosts" / host / "listener.log")
        for host, (short, _) in HOSTS.items():
            wait_for(f"listener of {host} (from itself)", lambda s=short, h=host: n.connect(n.name(s), ips[h]) == "ok",
                     10)
        relay_cfg = load_robot_config(str(n.root / "hosts" / "campus-relay" / "robot.yaml"))
        yield {"net": n, "ips": ips, "relay_cfg": relay_cfg, "dep": dep, "fleet_file": fleet_file,
               "relay_api": LocalAPI(str(n.root / "hosts" / "campus-relay" / "tailscaled.sock"))}
    finally:
        n.close()


def _from(net: Dict[str, Any], src: str, dst: str, timeout: float = 3.0) -> str:
    n: Net = net["net"]
    return n.connect(n.name(HOSTS[src][0]), net["ips"][dst], timeout)


def test_team_mates_reach_each_other(net: Dict[str, Any]) -> None:
    wait_for("alpha-robot1 -> alpha-robot2 TCP", lambda: _from(net, "alpha-robot1", "alpha-robot2") == "ok", 30)
    wait_for("alpha-robot2 -> alpha-robot1 TCP", lambda: _from(net, "alpha-robot2", "alpha-robot1") == "ok", 30)


def test_operator_reaches_own_team(net: Dict[str, Any]) -> None:
    wait_for("alpha-op -> alpha-robot2 TCP", lambda: _from(net, "alpha-op", "alpha-robot2") == "ok", 30)
    wait_for("alpha-robot1 -> alpha-op TCP (ROS callbacks)",
             lambda: _from(net, "alpha-robot1", "alpha-op") == "ok", 30)


@pytest.mark.parametrize("src,dst", [("alpha-robot1", "bravo-robot1"), ("bravo-robot1", "alpha-robot1"),
                                     ("alpha-op", "bravo-robot1"), ("bravo-robot1", "alpha-op")])
def test_no_tcp_across_teams(net: Dict[str, Any], src: str, dst: str) -> None:
    # same-team traffic works by now (positive control), so a failure here is the ACL
    wait_for("alpha-robot1 -> alpha-robot2 TCP", lambda: _from(net, "alpha-robot1", "alpha-robot2") == "ok", 30)
    out = _from(net, src, dst, timeout=3.0)
    print(f"{src} -> {dst}: {out}")
    assert out != "ok", f"{src} opened a TCP connection to {dst} across teams"
    # the policy also hides the other team: dst is not even a peer in src's netmap
    n: Net = net["net"]
    status = json.loads(sh(str(TAILSCALE), f"--socket={n.root}/hosts/{src}/tailscaled.sock", "status",
                           "--json").stdout)
    peers = {p.get("HostName") for p in (status.get("Peer") or {}).values()}
    assert dst not in peers, f"{dst} is visible to {src}: {sorted(peers)}"
    mates = [h for h in HOSTS if h != src and h.split("-")[0] == src.split("-")[0]]
    assert not mates or set(mates) <= peers, f"team-mates {mates} missing from {src}'s peers {sorted(peers)}"


MASTER_QUERY = """
import sys, xmlrpc.client, socket
socket.setdefaulttimeout(float(sys.argv[2]))
try:
    code, _, state = xmlrpc.client.ServerProxy(sys.argv[1]).getSystemState("/acl_probe")
    print("ok" if code == 1 else f"fail: code {code}")
except (OSError, xmlrpc.client.Error) as e:
    print("fail:", e)
"""


@pytest.mark.skipif(shutil.which("rosmaster") is None, reason="ROS not installed (scripts/setup)")
def test_team_mate_reaches_ros_master_other_team_cannot(net: Dict[str, Any]) -> None:
    """A real ROS master on alpha-robot2: alpha-robot1 queries it over the overlay, bravo-robot1
    cannot even open TCP to it."""
    n: Net = net["net"]
    ip = net["ips"]["alpha-robot2"]
    env = dict(os.environ, ROS_HOSTNAME=ip, ROS_HOME=str(n.root / "hosts" / "alpha-robot2" / "ros"))
    n.popen(n.name(HOSTS["alpha-robot2"][0]), ["rosmaster", "--core", "-p", "11311"],
            n.root / "hosts" / "alpha-robot2" / "rosmaster.log", env=env)
    uri = f"http://{ip}:11311/"

    def query(src: str) -> str:
        return sh("ip", "netns", "exec", n.name(HOSTS[src][0]), "/usr/bin/python3", "-c", MASTER_QUERY, uri, "3",
                  check=False).stdout.strip()

    wait_for(f"alpha-robot1 -> ROS master {uri} getSystemState", lambda: query("alpha-robot1") == "ok", 30)
    out = query("bravo-robot1")
    print(f"bravo-robot1 -> alpha-robot2's ROS master: {out}")
    assert out.startswith("fail"), f"bravo-robot1 reached alpha-robot2's ROS master: {out}"


PING = """
import subprocess, sys
r = subprocess.run(["ping", "-c", "1", "-W", sys.argv[2], sys.argv[1]], capture_output=True, text=True)
print("ok" if r.returncode == 0 else "fail")
"""


def test_status_decoder_recognises_a_real_tailscaleds_layout(net: Dict[str, Any]) -> None:
    """The node's status decoder cuts a real tailscaled's /status per peer (the layout it relies
    on to reuse unchanged peers) and gives exactly what json.loads gives."""
    api: LocalAPI = net["relay_api"]
    code, body = api._transport("GET", "/localapi/v0/status", None, 5.0)
    assert code == 200, body[:200]
    text = body.decode("utf-8")
    whole = json.loads(text)
    assert whole.get("Peer"), "the relay host should see peers"
    dec = StatusDecoder()
    assert dec.decode(text) == whole
    assert dec.decode(text) == whole and dec.reused == len(whole["Peer"]), (dec.reused, len(whole["Peer"]))
    snap = parse_status(api.status(decoder=dec))  # a fresh read through the client, decoded in pieces
    assert len(snap.peers) == len(whole["Peer"]), (len(snap.peers), len(whole["Peer"]))


def test_relay_server_on_off_through_localapi(net: Dict[str, Any]) -> None:
    """The bundle's relay key turns the real tailscaled's relay server on (prefs), idempotently,
    and off when the key is gone."""
    cfg = net["relay_cfg"]
    api: LocalAPI = net["relay_api"]
    assert cfg.relay is not None and cfg.relay.port == 40000
    first = apply_relay(api, cfg.relay)
    print(first.message)
    assert first.changed and first.active
    assert api.prefs().get("RelayServerPort") == 40000
    assert not apply_relay(api, cfg.relay).changed
    assert read_relay_state(api).port == 40000
    off = apply_relay(api, None)
    assert off.changed and not off.active and "RelayServerPort" not in api.prefs()
    assert read_relay_state(api).port is None
    assert apply_relay(api, cfg.relay).changed  # on again for the tests below


def test_relay_visible_to_other_team_but_closed(net: Dict[str, Any]) -> None:
    """bravo may use alpha's relay: it sees the relay host and may ping it, and cannot open TCP to
    it; the relay's own team reaches it as before; bravo still sees no alpha machine."""
    n: Net = net["net"]
    ip = net["ips"]["campus-relay"]
    wait_for("alpha-robot1 -> campus-relay TCP (own team)", lambda: _from(net, "alpha-robot1", "campus-relay") == "ok",
             30)

    def ping(src: str, dst_ip: str) -> str:
        return sh("ip", "netns", "exec", n.name(HOSTS[src][0]), "/usr/bin/python3", "-c", PING, dst_ip, "2",
                  check=False).stdout.strip()

    wait_for("bravo-robot1 -> campus-relay ICMP ping over the overlay", lambda: ping("bravo-robot1", ip) == "ok", 30)
    out = _from(net, "bravo-robot1", "campus-relay", timeout=3.0)
    print(f"bravo-robot1 -> campus-relay TCP: {out}")
    assert out != "ok", "bravo-robot1 opened a TCP connection to the relay host"
    assert ping("bravo-robot1", net["ips"]["alpha-robot1"]) == "fail"
    status = json.loads(sh(str(TAILSCALE), f"--socket={n.root}/hosts/bravo-robot1/tailscaled.sock", "status",
                           "--json").stdout)
    peers = {p.get("HostName") for p in (status.get("Peer") or {}).values()}
    assert peers == {"campus-relay"}, f"bravo-robot1 should see only the relay, sees {sorted(peers)}"


def test_policy_gives_an_enrolled_host_its_new_relay_tags(net: Dict[str, Any], capsys: Any) -> None:
    """An enrolled host that becomes a relay keeps its old tags on re-enrolment (headscale), so
    `fleet policy` sets the fleet file's tags after the new policy is in force; and back."""
    dep, path = net["dep"], net["fleet_file"]
    data = yaml.safe_load(path.read_text())
    data["relays"]["alpha-robot2"] = {}
    path2 = path.with_name("fleet-more-relays.yaml")
    path2.write_text(yaml.safe_dump(data))

    def tags() -> List[str]:
        return sorted(next(r for r in fleet_status(dep, load_fleet(path2)) if r.host == "alpha-robot2").tags)

    try:
        # what the admin runs: `fleet -f fleet.yaml -d DEPLOYMENT policy`
        assert fleet_cli.run(["-f", str(path2), "-d", str(dep.root), "--headscale", str(HEADSCALE), "policy"]) == 0
        out = capsys.readouterr().out
        print(out)
        assert "policy checked" in out
        assert "alpha-robot2: tags tag:robot, tag:team-alpha -> tag:relay, tag:relay-alpha-robot2" in out
        assert tags() == ["tag:relay", "tag:relay-alpha-robot2", "tag:robot", "tag:team-alpha"]
        assert sync_tags(dep, load_fleet(path2)) == []  # idempotent
    finally:
        fleet = load_fleet(path)
        apply_policy(dep, fleet)
        wait_for("alpha-robot2's tags back", lambda: sync_tags(dep, fleet) or True, 15)
    assert sorted(next(r for r in fleet_status(dep, fleet) if r.host == "alpha-robot2").tags) == \
        ["tag:robot", "tag:team-alpha"]
