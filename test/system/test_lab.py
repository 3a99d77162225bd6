"""System tests of the campus lab itself (root; skipped with a reason otherwise).

Covers: bring-up with headscale through the fleet code, enrolment with ``tailscale up``, the
path `tailscale ping` proves for NAT pairs (eim<->eim direct, eim-adpf<->adpm derp, two hosts in
one building direct), runtime actions (block/unblock UDP, cut, headscale stop/start,
impairment), the negative control (no TCP from building 2 to building 1's LAN without the
overlay; with it, yes), the host's network state being byte-identical after up/down, and
``lab down`` removing leftovers after a crash.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from overlay_manager.lab.campus import system
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.layout import RUN_ROOT
from overlay_manager.lab.campus.spec_model import Impairment

REPO = Path(__file__).resolve().parents[2]

PATHS_SPEC = {
    "name": "paths",
    "buildings": {
        "b1": {"nat": "eim-adpf", "hosts": {"robot1": {"team": "alpha"}, "robot2": {"team": "alpha"}}},
        "b2": {"nat": "eim-adpf", "hosts": {"laptop": {"team": "alpha", "role": "operator"}}},
        "b3": {"nat": "adpm", "hosts": {"robot3": {"team": "alpha"}}},
    },
}
SMALL_SPEC = {"name": "small", "buildings": {"b1": {"nat": "eim", "hosts": ["r1"]},
                                            "b2": {"nat": "eim", "hosts": {"op": {"role": "operator"}}}}}
LISTEN_PORT = 7411


@pytest.fixture(scope="module")
def lab(lab_factory: Callable[..., Lab]) -> Iterator[Lab]:
    """Three buildings (eim, eim, adpm), four hosts, all enrolled with `tailscale up`; down at the
    end of the module (not of the session: its idle daemons would share the cores with the
    modules after this one)."""
    t0 = time.monotonic()
    lab = lab_factory(PATHS_SPEC, enrol=True, robot_overrides={"node": {"manage_hosts": True}})
    print(f"paths lab up and enrolled in {time.monotonic() - t0:.1f} s")
    try:
        yield lab
    finally:
        lab.down()  # lab_factory's own down() at session end is a no-op then


@pytest.fixture
def listener(lab: Lab) -> Iterator[int]:
    """A TCP listener on 0.0.0.0:LISTEN_PORT inside robot1's namespace (accepts in a thread)."""
    ns = lab.namespace("robot1")

    def make() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", LISTEN_PORT))
        s.listen(8)
        return s

    srv = system.ns_call(ns, make)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield LISTEN_PORT
    stop.set()
    t.join(timeout=2)
    srv.close()


def test_enrolled_hosts_see_their_peers(lab: Lab) -> None:
    for h in lab.hosts:
        st = lab.tailscale_status(h)
        assert st["BackendState"] == "Running", h
        peers = {p["HostName"] for p in (st.get("Peer") or {}).values()}
        assert lab.expected_peers(h) <= peers, (h, peers)
        assert lab.overlay_ip(h).startswith("100.")


def test_eim_to_eim_is_direct(lab: Lab) -> None:
    r = lab.ping("laptop", "robot1")
    assert r.path == "direct", r.output
    # the endpoint is building 1's public (router) address: hole punched through both NATs
    assert r.via.startswith(lab.address("b1") + ":"), r.output


def test_same_building_is_direct_over_the_lan(lab: Lab) -> None:
    r = lab.ping("robot2", "robot1")
    assert r.path == "direct", r.output
    assert r.via.startswith(lab.address("robot1") + ":"), r.output


def test_eim_adpf_to_adpm_is_derp(lab: Lab) -> None:
    r = lab.ping("robot1", "robot3", count=10)
    assert r.path == "derp", r.output
    assert r.via == "fleet"


def test_block_udp_turns_direct_into_derp_and_back(lab: Lab) -> None:
    assert lab.ping("laptop", "robot1").path == "direct"
    lab.block_udp("b1")
    try:
        r = lab.ping("laptop", "robot1", count=5, until_direct=False)
        assert r.path == "derp", r.output
    finally:
        lab.unblock_udp("b1")
    t0 = time.monotonic()
    r = lab.ping("laptop", "robot1", count=20)
    assert r.path == "direct", r.output
    print(f"direct again {time.monotonic() - t0:.1f} s after unblocking")


def test_negative_control_no_tcp_across_buildings_without_overlay(lab: Lab, listener: int) -> None:
    robot1_lan = lab.address("robot1")
    assert system.tcp_connect(lab.namespace("robot1"), robot1_lan, listener), "listener not up"
    assert system.tcp_connect(lab.namespace("robot2"), robot1_lan, listener), "same LAN must work"
    laptop_ns = lab.namespace("laptop")
    assert not system.tcp_connect(laptop_ns, robot1_lan, listener, timeout=2.0)
    assert not system.tcp_connect(laptop_ns, lab.address("b1"), listener, timeout=2.0)
    # ... and through the overlay it works (operator -> team machine is allowed by the ACLs)
    assert system.tcp_connect(laptop_ns, lab.overlay_ip("robot1"), listener, timeout=5.0)


def test_cut_building(lab: Lab) -> None:
    op_ns = lab.namespace("laptop")
    assert system.tcp_connect(op_ns, lab.names.control_address, lab.spec.control.port)
    lab.cut("b2")
    try:
        assert not system.tcp_connect(op_ns, lab.names.control_address, lab.spec.control.port, timeout=1.0)
    finally:
        lab.uncut("b2")
    assert system.tcp_connect(op_ns, lab.names.control_address, lab.spec.control.port)


def test_headscale_stop_keeps_links_and_start_restores(lab: Lab) -> None:
    assert lab.ping("laptop", "robot1", count=20).path == "direct"  # a live direct link first
    target = lab.overlay_ip("robot1")
    lab.headscale_stop()
    try:
        assert not lab.headscale_running()
        assert not system.tcp_connect(lab.namespace("laptop"), lab.names.control_address,
                                      lab.spec.control.port, timeout=1.0)
        system.wait_for(f"ICMP over the overlay laptop -> robot1 ({target}) with headscale stopped",
                        lambda: lab.exec("laptop", ["ping", "-c", "1", "-W", "1", target], check=False,
                                         quiet=True).returncode == 0, timeout=15.0, interval=0.2)
    finally:
        lab.headscale_start()
    assert lab.headscale_running()
    assert lab.deployment().cli().health()


def test_impair_loss_on_a_host_link(lab: Lab) -> None:
    gw = lab.names.router_lan_address("b2")
    lab.impair("laptop", Impairment(loss_pct=100))
    try:
        res = lab.exec("laptop", ["ping", "-c", "2", "-i", "0.2", "-W", "1", gw], check=False)
        assert res.returncode != 0
    finally:
        lab.impair("laptop", None)
    res = lab.exec("laptop", ["ping", "-c", "2", "-i", "0.2", "-W", "1", gw], check=False)
    assert res.returncode == 0, res.stdout


def test_exec_sees_own_etc_files_and_tailscale_wrapper(lab: Lab) -> None:
    hosts = lab.exec("robot1", ["cat", "/etc/hosts"]).stdout
    assert f"{lab.address('robot1')} robot1" in hosts
    assert "nameserver 127.0.0.1" in lab.exec("robot1", ["cat", "/etc/resolv.conf"]).stdout
    ip = lab.exec("robot1", ["tailscale", "ip", "-4"]).stdout.strip()
    assert ip == lab.overlay_ip("robot1")
    robot_yaml = lab.robot_yaml("robot1").read_text()
    assert str(lab.socket_path("robot1")) in robot_yaml
    assert "manage_hosts: true" in robot_yaml
    assert (lab.auth_key_path("robot1").stat().st_mode & 0o777) == 0o600


def test_host_network_untouched_by_up_and_down(lab_required: None,
                                               host_network_snapshot: Callable[[], dict]) -> None:
    before = host_network_snapshot()
    with Lab(SMALL_SPEC) as small:
        small.tailscale_up("r1")
        small.tailscale_up("op")
        small.wait_enrolled()
        assert small.ping("op", "r1").path == "direct"
        during = host_network_snapshot()
        ns = small.names.all_namespaces()
    after = host_network_snapshot()
    for key in before:
        assert before[key] == after[key], f"{key} changed by lab up/down"
    # even while the lab ran, the host's own resolver files, routes and firewall were untouched
    for key in ("/etc/resolv.conf", "/etc/hosts", "ip route show table all", "nft list ruleset"):
        assert before[key] == during[key], f"{key} changed while the lab was up"
    assert not [n for n in ns if system.ns_exists(n)]


def test_lab_down_removes_leftovers_after_a_crash(lab_required: None) -> None:
    run_id = "crash" + os.urandom(1).hex()
    code = (
        "import sys, os, signal\n"
        "from overlay_manager.lab.campus.core import Lab\n"
        f"lab = Lab({SMALL_SPEC!r}, run_id={run_id!r})\n"
        "lab.up()\n"
        "print('UP', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)  # crash: no teardown at all\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert "UP" in proc.stdout
    prefix = f"olab{run_id}-"
    leftovers = [n for n in system.list_namespaces() if n.startswith(prefix)]
    assert len(leftovers) == 6, leftovers  # bb, ctl, 2 routers, 2 hosts
    daemons = [p for n in leftovers for p in system.pids_in_ns(n)]
    assert daemons, "tailscaled/headscale should have survived the crash"
    down = subprocess.run([str(REPO / "scripts" / "lab"), "down", "--run-id", run_id],
                          capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert "ip netns del" in down.stderr  # every command is printed
    assert not [n for n in system.list_namespaces() if n.startswith(prefix)]
    assert not [p for p in daemons if Path(f"/proc/{p}").exists() and _not_zombie(p)]
    assert not (RUN_ROOT / run_id).exists()
    assert not (Path("/etc/netns").exists() and [d for d in os.listdir("/etc/netns") if d.startswith(prefix)])


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
