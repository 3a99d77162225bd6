"""monitor/path_guard.py against a scripted LocalAPI: a stalled path makes one rebind, a roam a
rebind and a re-STUN, a dead home region a forced other region (released when it answers again);
tailscaled without the debug actions, or too old, is left alone and the node says so."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

import pytest

from overlay_manager.core.levels import ERROR, OK
from overlay_manager.core.mobility import CAUSE_ROAM, CAUSE_STALL, Underlay
from overlay_manager.core.peers import PeerState
from overlay_manager.monitor.diagnose import mobility_diagnostic
from overlay_manager.monitor.path_guard import PathGuard, derp_nodes
from overlay_manager.system.sockets import established_remotes
from overlay_manager.tailscaled.localapi import (
    DebugUnsupported,
    LocalAPI,
    debug_actions_supported,
    tailscale_version,
)


class ScriptedAPI:
    """ping answers as ``answers[ip]`` says (True/False); debug actions are recorded."""

    def __init__(self, derp_map=None, unsupported=()):
        self.answers = {}
        self.actions = []
        self.derp = derp_map or {}
        self.unsupported = set(unsupported)

    def ping(self, ip, ping_type="disco", timeout=5.0):
        return {} if self.answers.get(ip, True) else {"Err": "timeout"}

    def debug_action(self, action, body=b"", timeout=None):
        self.actions.append((action, body))
        if action in self.unsupported:
            raise DebugUnsupported(action, "unknown action")

    def derp_map(self):
        return self.derp


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def peer(name, path, ip, active=True):
    return PeerState(name, f"{name}.fleet.internal", (ip,), True, active, path, relay_region="lab")


def guard(api, peers, version="1.102.5-t", underlay=None, home="", clock=None):
    snap = SimpleNamespace(version=version, self_peer=SimpleNamespace(relay_region=home), peers=peers)
    box = {"u": underlay or Underlay("eth0", "10.1.0.1", "10.1.0.5")}
    g = PathGuard(api, lambda: snap, lambda: list(peers), stall_after_s=0.5, wall=clock or Clock(),
                  underlay=lambda: box["u"])
    return g, box, snap


def test_a_stalled_direct_path_makes_one_rebind_and_an_episode():
    api, clock = ScriptedAPI(), Clock()
    peers = [peer("robot", "direct", "100.64.0.2"), peer("idle", "direct", "100.64.0.3", active=False)]
    g, _, _ = guard(api, peers, clock=clock)
    assert g.tick() == [] and api.actions == []
    api.answers["100.64.0.2"] = False
    clock.t += 0.2
    assert g.tick() == []                       # 0.2 s without an answer: not yet
    clock.t += 0.4
    lines = g.tick()
    assert api.actions == [("rebind", b"")]
    assert "robot (direct)" in lines[0] and "rebind" in lines[0]
    ep = next(iter(g.episodes.values()))
    assert (ep.cause, ep.stopped, ep.action, ep.resumed) == (CAUSE_STALL, 1000.0, "rebind", 0.0)
    clock.t += 0.5
    assert g.tick() == [] and len(api.actions) == 1   # the same stall: no second rebind
    api.answers["100.64.0.2"] = True
    clock.t += 0.2
    g.tick()
    assert next(iter(g.episodes.values())).resumed == clock.t
    assert g.probes == 5                        # one per tick; the idle peer is never probed


def test_derp_peers_are_probed_once_a_second_and_never_stall():
    api, clock = ScriptedAPI(), Clock()
    g, _, _ = guard(api, [peer("robot", "derp", "100.64.0.2")], clock=clock)
    api.answers["100.64.0.2"] = False
    for _ in range(10):
        g.tick()
        clock.t += 0.2
    assert g.probes == 2 and api.actions == []


def test_without_the_debug_action_the_node_says_so_and_asks_once():
    api, clock = ScriptedAPI(unsupported={"rebind"}), Clock()
    g, _, _ = guard(api, [peer("robot", "peer-relay", "100.64.0.2"), peer("b", "direct", "100.64.0.4")],
                    clock=clock)
    g.tick()
    api.answers["100.64.0.2"] = api.answers["100.64.0.4"] = False
    clock.t += 0.6
    lines = g.tick()
    assert "cannot ask tailscaled to re-evaluate" in lines[0] and "unknown action" in lines[0]
    assert next(iter(g.episodes.values())).action == ""
    api.answers["100.64.0.2"] = api.answers["100.64.0.4"] = True
    g.tick()
    api.answers["100.64.0.2"] = False
    clock.t += 5.0
    g.tick()
    clock.t += 0.6
    g.tick()
    assert api.actions == [("rebind", b"")]     # not asked again: tailscaled said it has none


def test_an_old_tailscaled_is_not_asked():
    api, clock = ScriptedAPI(), Clock()
    g, _, _ = guard(api, [peer("robot", "direct", "100.64.0.2")], version="1.60.1-t", clock=clock)
    g.tick()
    api.answers["100.64.0.2"] = False
    clock.t += 0.6
    lines = g.tick()
    assert api.actions == [] and "older than 1.80" in lines[0]


def test_a_roam_rebinds_and_restuns():
    api, clock = ScriptedAPI(), Clock()
    g, box, _ = guard(api, [peer("robot", "direct", "100.64.0.2")], clock=clock)
    g.tick()
    clock.t += 0.2
    box["u"] = Underlay("eth0", "10.2.0.1", "10.2.0.7")
    lines = g.tick()
    assert [a for a, _ in api.actions] == ["rebind", "restun"]
    assert "10.1.0.5 on eth0 via 10.1.0.1 -> 10.2.0.7 on eth0 via 10.2.0.1" in lines[0]
    ep = next(iter(g.episodes.values()))
    assert ep.cause == CAUSE_ROAM and ep.stopped == 1000.0 and ep.resumed == clock.t


def test_versions():
    assert tailscale_version("1.102.5-t0123-gabc") == (1, 102)
    assert tailscale_version("garbage") is None
    assert debug_actions_supported("1.102.5") == ""
    assert "not known" in debug_actions_supported("")


def test_debug_action_of_a_tailscaled_without_it(fake_tailscaled):
    with pytest.raises(DebugUnsupported, match="rebind"):
        LocalAPI(fake_tailscaled.socket_path).debug_action("rebind")
    assert fake_tailscaled.counts.get("POST /localapi/v0/debug") == 1


@pytest.fixture
def listener():
    """A TCP port that accepts (a live derper) and one that refuses (a dead one)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()  # nothing listens there now: connection refused
    stop = threading.Event()

    def accept():
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = s.accept()
                c.close()
            except OSError:
                pass
    th = threading.Thread(target=accept, daemon=True)
    th.start()
    yield s.getsockname()[1], dead_port
    stop.set()
    th.join()
    s.close()


def two_regions(home_port, other_port):
    return {"Regions": {
        "901": {"RegionID": 901, "RegionCode": "north", "Nodes": [{"IPv4": "127.0.0.1", "DERPPort": home_port}]},
        "902": {"RegionID": 902, "RegionCode": "south", "Nodes": [{"HostName": "127.0.0.1", "DERPPort": other_port},
                                                                 {"HostName": "stun", "STUNOnly": True}]}}}


def test_derp_nodes():
    assert derp_nodes(two_regions(1, 2)) == {"north": (901, [("127.0.0.1", 1)]), "south": (902, [("127.0.0.1", 2)])}
    assert derp_nodes({"Regions": {"3": {"Nodes": [{"HostName": "h"}]}}}) == {"3": (3, [("h", 443)])}
    assert derp_nodes({"Regions": "garbage"}) == {}


def test_a_dead_home_region_is_an_error_and_another_region_is_preferred(listener):
    live, dead = listener
    api = ScriptedAPI(two_regions(dead, live))
    g, _, snap = guard(api, [], home="north")
    lines = g.check_home()
    assert api.actions == [("force-prefer-derp", b"902"), ("pick-new-derp", b""), ("restun", b"")]
    assert "home DERP region north refuses connections" in lines[0] and "prefer region south" in lines[0]
    assert g.check_home() == [] and len(api.actions) == 3   # still north, asked already: not again
    d = mobility_diagnostic(g.home, 0, g.actions, "x")
    assert d.level == ERROR and "refuses connections" in d.message and "force-prefer-derp 902" in d.message
    # tailscaled moved home; the old region still dead: nothing more to do
    snap.self_peer.relay_region = "south"
    assert g.check_home() == [] and len(api.actions) == 3
    d = mobility_diagnostic(g.home, 0, g.actions, "x")
    assert d.level == OK and g.home.forced_region == "south"
    # the old home answers again: stop forcing
    api.derp = two_regions(live, live)
    g._derp_read_at = -1e18
    lines = g.check_home()
    assert api.actions[-1] == ("force-prefer-derp", b"0") and "answers again" in lines[0]


def test_a_live_home_region_is_ok(listener):
    live, dead = listener
    api = ScriptedAPI(two_regions(live, dead))
    g, _, _ = guard(api, [], home="north")
    assert g.check_home() == [] and api.actions == []
    assert mobility_diagnostic(g.home, 0, 0, "x").level == OK


def test_a_home_region_without_derper_addresses_is_not_an_error():
    api = ScriptedAPI({"Regions": {"999": {"RegionID": 999, "RegionCode": "lab"}}})
    g, _, _ = guard(api, [], home="lab")
    assert g.check_home() == [] and g.home.ok and api.actions == []


def test_a_roam_while_the_probes_wait_is_a_roam_not_a_stall():
    api, clock = ScriptedAPI(), Clock()
    g, box, _ = guard(api, [peer("robot", "direct", "100.64.0.2")], clock=clock)
    g.tick()
    reads = []

    def moving():
        reads.append(1)
        return Underlay("eth0", "10.1.0.1", "10.1.0.5") if len(reads) == 1 else Underlay("eth0", "10.2.0.1", "10.2.0.7")
    g._read_underlay = moving
    api.answers["100.64.0.2"] = False
    clock.t += 0.6
    lines = g.tick()
    assert [a for a, _ in api.actions] == ["rebind", "restun"]          # one rebind: the roam's
    assert len(lines) == 1 and "network changed" in lines[0]
    assert next(iter(g.episodes.values())).cause == CAUSE_ROAM


def test_tailscaleds_own_connection_to_the_home_derper_means_it_works(tmp_path, listener):
    _, dead = listener
    api = ScriptedAPI(two_regions(dead, dead))
    g, _, _ = guard(api, [], home="north")
    tcp = tmp_path / "tcp"
    tcp.write_text("  sl  local_address rem_address   st\n"
                   f"   0: 0100007F:B3C2 0100007F:{dead:04X} 01 00000000:00000000\n")
    g._established = lambda: established_remotes(str(tcp))
    assert g.check_home() == [] and g.home.ok and api.actions == []   # no connect tried: it would be refused
    tcp.write_text("  sl  local_address rem_address   st\n")
    assert "refuses connections" in g.check_home()[0]                 # no connection: connect, refused


def test_no_derper_reachable_at_all_is_this_machines_network_not_a_dead_home(monkeypatch):
    import overlay_manager.monitor.path_guard as pg
    monkeypatch.setattr(pg, "tcp_connect", lambda host, port, timeout_s: (-1.0, f"{host}:{port}: Network unreachable"))
    api = ScriptedAPI({"Regions": {
        "901": {"RegionID": 901, "RegionCode": "north", "Nodes": [{"IPv4": "192.0.2.1", "DERPPort": 9}]},
        "902": {"RegionID": 902, "RegionCode": "south", "Nodes": [{"IPv4": "192.0.2.2", "DERPPort": 9}]}}})
    g, _, _ = guard(api, [], home="north")
    assert g.check_home() == [] and api.actions == []
    d = mobility_diagnostic(g.home, 0, 0, "x")
    assert d.level == OK and "no derper reachable" in d.message


def test_after_a_stall_its_peer_is_probed_every_tick_for_a_while_even_on_derp():
    api, clock = ScriptedAPI(), Clock()
    peers = [peer("robot", "direct", "100.64.0.2")]
    g, _, _ = guard(api, peers, clock=clock)
    g.tick()
    api.answers["100.64.0.2"] = False
    clock.t += 0.6
    g.tick()                                     # the stall
    peers[0] = peer("robot", "derp", "100.64.0.2")
    api.answers["100.64.0.2"] = True
    n = g.probes
    for _ in range(10):                          # 2 s on derp, resumed: every tick
        clock.t += 0.2
        g.tick()
    assert g.probes - n == 10
    clock.t += 5.0
    n = g.probes
    for _ in range(10):                          # later: once a second
        clock.t += 0.2
        g.tick()
    assert g.probes - n == 2
