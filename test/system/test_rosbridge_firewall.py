"""`overlay_env --rosbridge-firewall PORT` in network namespaces of this run, with real nft.

    ns LAN (a machine on the robot's LAN)          ns OVL (a peer on the overlay)
      lan-peer 10.77.<r>.2/24                         ovl-peer 100.127.<r>.2/24
           |  veth                                         |  veth
      lan0 10.77.<r>.1/24                             tailscale0 100.127.<r>.1/24  (named like
           +------------- ns ROBOT --------------------+        tailscaled's TUN)
             a TCP listener on 0.0.0.0:PORT (stands in for rosbridge_websocket, which listens on
             every interface whatever its ~address says)

Before: the port answers from the LAN, over the overlay interface and on loopback; the node's
check (sockets + firewall + the "rosbridge" diagnostic, run in ROBOT) says WARN "reachable
beyond the overlay". After the real command: no answer from the LAN (also not when the LAN
machine sends to the robot's overlay address), still an answer over tailscale0 and loopback;
the check says OK "restricted" as root and WARN "cannot tell" as an unprivileged user. A second
run keeps one table; `--rosbridge-firewall 0` opens the port again. The host's own ruleset is
compared before and after: only the run's namespaces are touched. Everything started is stopped
by pid and the namespaces are deleted, also when a check fails.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from overlay_manager.core.levels import Level
from overlay_manager.system.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
PY = "/usr/bin/python3"
PORT = 9090

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None,
    reason="needs root, nft and ip (network namespaces of this run)")

LISTENER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"rosbridge\\n"); c.close()
"""

CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.0) as c:
        sys.exit(0 if c.recv(16) == b"rosbridge\\n" else 3)
except OSError as exc:
    print(exc); sys.exit(1)
"""

CHECK = """
import json, sys
from overlay_manager.system import firewall
from overlay_manager.system import sockets
from overlay_manager.monitor.diagnose import rosbridge_diagnostic
from overlay_manager.monitor.readings import PortReading
port = int(sys.argv[2])
listeners, error = sockets.read_listeners()
mine = tuple(sockets.on_port(listeners, port))
r = firewall.read_restriction(port)
d = rosbridge_diagnostic(PortReading(port, mine, error, r), [sys.argv[3]])
print(json.dumps({"level": d.level, "message": d.message, "state": r.state}))
"""


def sh(*argv: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess:
    print("+", " ".join(argv))
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


class Net:
    """The three namespaces of one run and the listener in ROBOT."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.robot, self.lan, self.ovl = (f"omfw{tag}-{x}" for x in ("robot", "lan", "ovl"))
        r = int(tag[:2], 16) % 250 + 1
        self.robot_lan, self.lan_ip = f"10.77.{r}.1", f"10.77.{r}.2"
        self.robot_ovl, self.ovl_ip = f"100.127.{r}.1", f"100.127.{r}.2"
        self.namespaces: List[str] = []
        self.listener = None

    def ns(self, name: str, *argv: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", name, *argv, check=check, timeout=timeout)

    def up(self) -> None:
        for n in (self.robot, self.lan, self.ovl):
            sh("ip", "netns", "add", n)
            self.namespaces.append(n)
            self.ns(n, "ip", "link", "set", "lo", "up")
        for peer_ns, here, there, here_ip, there_ip in (
                (self.lan, "lan0", "lan-peer", self.robot_lan, self.lan_ip),
                (self.ovl, "tailscale0", "ovl-peer", self.robot_ovl, self.ovl_ip)):
            sh("ip", "link", "add", "omfw-tmp0", "netns", self.robot, "type", "veth", "peer", "name", there,
               "netns", peer_ns)
            self.ns(self.robot, "ip", "link", "set", "omfw-tmp0", "name", here)
            self.ns(self.robot, "ip", "addr", "add", f"{here_ip}/24", "dev", here)
            self.ns(self.robot, "ip", "link", "set", here, "up")
            self.ns(peer_ns, "ip", "addr", "add", f"{there_ip}/24", "dev", there)
            self.ns(peer_ns, "ip", "link", "set", there, "up")
        # the LAN machine can also send to the robot's overlay address through the robot's LAN port
        self.ns(self.lan, "ip", "route", "add", f"{self.robot_ovl}/32", "via", self.robot_lan)
        self.listener = subprocess.Popen(["ip", "netns", "exec", self.robot, PY, "-c", LISTENER, str(PORT)],
                                         stdout=subprocess.PIPE, text=True)
        assert self.listener.stdout.readline().strip() == "listening"

    def reaches(self, from_ns: str, address: str) -> bool:
        """A TCP connection from ``from_ns`` to address:PORT gets the listener's greeting."""
        return self.ns(from_ns, PY, "-c", CONNECT, address, str(PORT), check=False).returncode == 0

    def check(self, user: str = "") -> Dict[str, object]:
        """The node's check of the port, run in ROBOT (as ``user`` when given)."""
        prefix = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups"] if user else []
        out = self.ns(self.robot, *prefix, PY, "-c", CHECK, str(REPO), str(PORT), self.robot_ovl).stdout
        return json.loads(out)

    def overlay_env(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.ns(self.robot, PY, str(REPO / "scripts" / "overlay_env"), *args, check=check)

    def down(self) -> None:
        if self.listener is not None and self.listener.poll() is None:
            self.listener.kill()
            self.listener.wait(timeout=10)
        for n in self.namespaces:
            sh("ip", "netns", "del", n, check=False)


def host_ruleset() -> str:
    return sh("nft", "list", "ruleset").stdout


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    before = host_ruleset()
    n = Net()
    try:
        n.up()
        yield n
    finally:
        n.down()
        assert host_ruleset() == before, "the host's nftables ruleset changed"


def test_firewall_restricts_rosbridge_port_to_lo_and_overlay(net: Net) -> None:
    # before: every interface reaches the stand-in for rosbridge
    assert net.reaches(net.lan, net.robot_lan), "LAN peer should reach the port before the rule"
    assert net.reaches(net.lan, net.robot_ovl)
    assert net.reaches(net.ovl, net.robot_ovl)
    assert net.reaches(net.robot, "127.0.0.1")
    before = net.check()
    assert before["state"] == "missing" and before["level"] == Level.WARN, before
    assert "reachable beyond the overlay" in before["message"] and "0.0.0.0" in before["message"]

    out = net.overlay_env("--rosbridge-firewall", str(PORT))
    assert "accepted on lo and tailscale0 only" in out.stderr, out.stderr
    assert not net.reaches(net.lan, net.robot_lan), "LAN peer still reaches the port"
    assert not net.reaches(net.lan, net.robot_ovl), "LAN peer reaches the port through the overlay address"
    assert net.reaches(net.ovl, net.robot_ovl), "overlay peer lost the port"
    assert net.reaches(net.robot, "127.0.0.1"), "loopback lost the port"
    listing = net.ns(net.robot, "nft", "list", "table", "inet", "overlay_manager").stdout
    assert "tcp dport 9090 counter packets" in listing and "drop" in listing, listing

    after = net.check()
    assert after["state"] == "restricted" and after["level"] == Level.OK, after
    assert "restricted" in after["message"] and "tailscale0" in after["message"]
    unprivileged = net.check(user="nobody")
    assert unprivileged["state"] == "unknown" and unprivileged["level"] == Level.WARN, unprivileged
    assert "cannot tell" in unprivileged["message"] and "--rosbridge-firewall 9090" in unprivileged["message"]

    # idempotent: a second run replaces the table, it does not add a second one
    net.overlay_env("--rosbridge-firewall", str(PORT))
    tables = net.ns(net.robot, "nft", "list", "tables").stdout.split("\n")
    assert [t for t in tables if "overlay_manager" in t] == ["table inet overlay_manager"], tables
    assert not net.reaches(net.lan, net.robot_lan)

    # 0 removes it: the LAN reaches the port again
    net.overlay_env("--rosbridge-firewall", "0")
    wait_for("the LAN peer to reach the port again after --rosbridge-firewall 0",
             lambda: net.reaches(net.lan, net.robot_lan), timeout=10)
    assert net.check()["state"] == "missing"


def test_firewall_errors_name_the_fix(net: Net) -> None:
    bad = net.overlay_env("--rosbridge-firewall", "http", check=False)
    assert bad.returncode == 1 and "give a TCP port" in bad.stderr, bad.stderr
    bad = net.overlay_env("--rosbridge-firewall", "9090", "--overlay-interface", 'x" accept', check=False)
    assert bad.returncode == 1 and "not an interface name" in bad.stderr, bad.stderr
    # not root: nft refuses, and the message says what to do (nobody cannot read a devel space
    # under /root: the clone itself is its Python path)
    proc = net.ns(net.robot, "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env",
                  f"PYTHONPATH={REPO}", PY, str(REPO / "scripts" / "overlay_env"), "--rosbridge-firewall", "9090",
                  check=False)
    assert proc.returncode == 1 and "sudo" in proc.stderr, proc.stderr
    assert "overlay_manager" not in net.ns(net.robot, "nft", "list", "tables").stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
