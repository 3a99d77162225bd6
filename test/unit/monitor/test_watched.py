"""Which peers the node disco-pings: the ones that matter (topic links, watch_peers, the master),
not every peer of the fleet."""

from __future__ import annotations

import copy
import os

from overlay_manager.core.config import apply_overrides, load_robot_config, override_master
from overlay_manager.core.topic_links import MachineMap, SystemState, build_links, peers_with_links
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.tailscaled.localapi import LocalAPI
from overlay_manager.testing.tsfake import FakeTailscaled, recorded

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "config", "robot.example.yaml")


def fleet_status(names):
    """The recorded status with its one peer cloned into the given names (all online, direct)."""
    st = recorded("status_direct.json")
    (_, proto), = st["Peer"].items()
    peers = {}
    for i, name in enumerate(names):
        p = copy.deepcopy(proto)
        k = i + 2
        p.update(ID=str(k), PublicKey=f"nodekey:{k:064x}", HostName=name, DNSName=f"{name}.fleet.internal.",
                 TailscaleIPs=[f"100.64.0.{k}"])
        peers[p["PublicKey"]] = p
    st["Peer"] = peers
    return st


def monitor(fake, **node):
    cfg = override_master(apply_overrides(load_robot_config(EXAMPLE), node, "test"), "robot1", "test")
    m = OverlayMonitor(cfg, LocalAPI(fake.socket_path))
    m.poll()
    return m


def names(peers):
    return sorted(p.name for p in peers)


def test_without_a_topic_map_every_online_peer_or_watch_peers():
    fake = FakeTailscaled(status=fleet_status(["robot1", "robot2", "robot3", "laptop"]))
    try:
        assert names(monitor(fake).watched()) == ["laptop", "robot1", "robot2", "robot3"]
        assert names(monitor(fake, watch_peers=["robot3"]).watched()) == ["robot3"]
    finally:
        fake.close()


def test_with_a_topic_map_only_linked_peers_watch_peers_and_the_master():
    fake = FakeTailscaled(status=fleet_status([f"robot{i}" for i in range(1, 40)] + ["laptop"]))
    try:
        m = monitor(fake, watch_peers=["robot7"])
        m.set_topic_peers(frozenset())
        assert names(m.watched()) == ["robot1", "robot7"]          # the master's machine + watch_peers
        # laptop views robot5's camera from this machine (robota); robot9 <-> robot8 is not ours
        state = SystemState({"/cam": ("/robot5/cam",), "/odom": ("/robot9/odom",)},
                            {"/cam": ("/viewer",), "/odom": ("/robot8/nav",)}, {})
        uris = {"/robot5/cam": "http://robot5.fleet.internal:1/", "/viewer": "http://robota.fleet.internal:2/",
                "/robot9/odom": "http://robot9:3/", "/robot8/nav": "http://robot8:4/"}
        links = build_links(state, uris, {}, MachineMap(m.snapshot, ("robota",)))
        m.set_topic_peers(peers_with_links(links, "robota"))
        assert names(m.watched()) == ["robot1", "robot5", "robot7"]
    finally:
        fake.close()


def test_offline_peers_are_never_pinged():
    st = fleet_status(["robot1", "robot2"])
    for p in st["Peer"].values():
        if p["HostName"] == "robot2":
            p["Online"] = False
    fake = FakeTailscaled(status=st)
    try:
        m = monitor(fake)
        m.set_topic_peers(frozenset({"robot2"}))
        assert names(m.watched()) == ["robot1"]
    finally:
        fake.close()
