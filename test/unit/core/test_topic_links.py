"""Unit tests of the topic-link mapping (overlay_manager.core.topic_links) and the graph reader's logic
with an injected XML-RPC call (the real calls are exercised by the topic_links rostest)."""

from __future__ import annotations

import math
import time

import pytest

from overlay_manager.core.peers import parse_status
from overlay_manager.core.topic_links import (
    Connection,
    MachineMap,
    RateTracker,
    SystemState,
    build_links,
    connections_from_bus,
    filter_links,
    peers_with_links,
    uri_host,
)
from overlay_manager.ros.graph_reader import GraphError, GraphReader, TopicMapper
from overlay_manager.testing.tsfake import recorded

# the recorded tailnet: this machine robota (100.64.0.1), peer robotb direct at 10.250.0.3:41641
SNAP = parse_status(recorded("status_direct.json"))

STATE = SystemState.from_xmlrpc(
    [[["/camera", ["/cam"]], ["/cmd_vel", ["/teleop"]], ["/rosout", ["/cam", "/teleop"]]],
     [["/camera", ["/viewer", "/recorder"]], ["/cmd_vel", ["/base"]], ["/rosout", ["/rosout"]]],
     []],
    [["/camera", "sensor_msgs/Image"], ["/cmd_vel", "geometry_msgs/Twist"]])
URIS = {
    "/cam": "http://robotb.fleet.internal:40001/",     # robotb by overlay FQDN
    "/viewer": "http://robota.fleet.internal:40002/",  # this machine
    "/recorder": "http://100.64.0.2:40003/",           # robotb by overlay IP
    "/teleop": "http://localhost:40004/",              # this machine by loopback
    "/base": "http://robotb:40005/",                   # robotb by short name
    "/rosout": "http://robota.fleet.internal:40006/",
}


def machines() -> MachineMap:
    return MachineMap(SNAP, ("robota", "robota.fleet.internal"))


def test_uri_host() -> None:
    assert uri_host("http://Robot1.Fleet.Internal.:1234/") == "robot1.fleet.internal"
    assert uri_host("http://[fd7a:115c:a1e0::2]:1/") == "fd7a:115c:a1e0::2"
    assert uri_host("") == ""
    assert uri_host("not a uri") == ""


def test_machine_map_names_ips_loopback_and_aliases() -> None:
    m = MachineMap(SNAP, ("robota",), aliases={"192.168.1.20": "robotb", "127.0.0.2": "robotb"})
    assert m.self_name == "robota"
    assert m.machine("robotb.fleet.internal") == "robotb"
    assert m.machine("ROBOTB") == "robotb"
    assert m.machine("100.64.0.2") == "robotb"
    assert m.machine("fd7a:115c:a1e0::2") == "robotb"
    assert m.machine("localhost") == "robota"
    assert m.machine("127.0.0.1") == "robota"
    assert m.machine("127.0.0.2") == "robotb"      # an alias wins over loopback
    assert m.machine("192.168.1.20") == "robotb"
    assert m.machine("100.64.0.1") == "robota"
    assert m.machine("printer.example.com") == ""
    assert m.machine("") == ""


def test_machine_map_before_tailscaled_answers() -> None:
    m = MachineMap(None, ("robota", "robota.fleet.internal"))
    assert m.self_name == "robota"
    assert m.machine("robota.fleet.internal") == "robota"
    assert m.machine("robotb.fleet.internal") == ""


def test_system_state_skips_garbage() -> None:
    s = SystemState.from_xmlrpc([[["/a", ["/p", 3]], "junk", ["/b"]], None], "junk")
    assert s.publishers == {"/a": ("/p",)}
    assert s.subscribers == {}
    assert s.types == {}
    assert SystemState.from_xmlrpc(None).nodes() == []


def test_connections_from_bus_rospy_shapes() -> None:
    info = [[1, "/viewer", "o", "TCPROS", "/camera", True, "TCPROS connection on port 1 to [...]"],
            [2, "/recorder", "o", "TCPROS", "/camera", True, ""],
            [3, "http://robota.fleet.internal:1/", "i", "TCPROS", "/tf", True, ""],  # inbound: skipped
            [4, "/gone", "o", "TCPROS", "/camera", False, ""],                       # closed: skipped
            ["x", "/bad", "o"]]
    stats = [[["/camera", 999, [[1, 5000, 10, True], [2, 7000, 10, True]]]], [], []]
    conns = connections_from_bus("/cam", info, stats)
    assert conns == [Connection("/camera", "/cam", "/viewer", 1, 5000),
                     Connection("/camera", "/cam", "/recorder", 2, 7000)]
    assert [c.bytes_sent for c in connections_from_bus("/cam", info, None)] == [None, None]
    assert connections_from_bus("/cam", "garbage", 42) == []


def test_build_links_hosts_paths_and_local() -> None:
    conns = {"/cam": [Connection("/camera", "/cam", "/viewer", 1, 10),
                      Connection("/camera", "/cam", "/recorder", 2, 10)]}
    links = build_links(STATE, URIS, conns, machines())
    by = {(link.topic, link.publisher_node, link.subscriber_node): link for link in links}
    viewer = by[("/camera", "/cam", "/viewer")]
    assert (viewer.publisher_host, viewer.subscriber_host, viewer.local) == ("robotb", "robota", False)
    assert (viewer.path, viewer.endpoint, viewer.type) == ("direct", "10.250.0.3:41641", "sensor_msgs/Image")
    assert math.isnan(viewer.bytes_per_second)
    recorder = by[("/camera", "/cam", "/recorder")]
    assert recorder.local and recorder.path == "self"        # both on robotb
    teleop = by[("/cmd_vel", "/teleop", "/base")]             # /teleop did not answer: master's view
    assert (teleop.publisher_host, teleop.subscriber_host, teleop.path) == ("robota", "robotb", "direct")
    assert ("/rosout", "/rosout", "/rosout") not in by         # a node talking to itself
    assert [link.sort_key() for link in links] == sorted(link.sort_key() for link in links)


def test_build_links_uses_live_connections_over_the_masters_list() -> None:
    # /cam answered and has no connection to /recorder (e.g. it cannot resolve /recorder's name)
    conns = {"/cam": [Connection("/camera", "/cam", "/viewer", 1, 10)]}
    links = build_links(STATE, URIS, conns, machines())
    assert ("/camera", "/recorder") not in {(link.topic, link.subscriber_node) for link in links}


def test_path_between_two_other_machines_is_unknown() -> None:
    state = SystemState({"/t": ("/p",)}, {"/t": ("/s",)}, {})
    uris = {"/p": "http://robotb:1/", "/s": "http://robotc.fleet.internal:2/"}
    (link,) = build_links(state, uris, {}, machines())
    assert (link.publisher_host, link.subscriber_host, link.path, link.local) == ("robotb", "", "unknown", False)


def test_derp_and_offline_paths() -> None:
    raw = recorded("status_direct.json")
    (peer,) = raw["Peer"].values()
    peer["CurAddr"] = ""
    peer["Relay"] = "lab"
    snap = parse_status(raw)
    state = SystemState({"/t": ("/p",)}, {"/t": ("/s",)}, {})
    uris = {"/p": "http://robotb:1/", "/s": "http://localhost:2/"}
    (link,) = build_links(state, uris, {}, MachineMap(snap, ("robota",)))
    assert (link.path, link.endpoint) == ("derp", "lab")
    peer["Online"] = False
    (link,) = build_links(state, uris, {}, MachineMap(parse_status(raw), ("robota",)))
    assert (link.path, link.endpoint) == ("offline", "")


def test_rate_tracker() -> None:
    rt = RateTracker()
    assert rt.update({"/cam": [Connection("/camera", "/cam", "/viewer", 1, 1000)]}, 10.0) == {}
    rates = rt.update({"/cam": [Connection("/camera", "/cam", "/viewer", 1, 5000)]}, 12.0)
    assert rates == {("/cam", "/camera", "/viewer"): 2000.0}
    # the publisher did not answer: its counters are kept for the next sample
    assert rt.update({}, 13.0) == {}
    rates = rt.update({"/cam": [Connection("/camera", "/cam", "/viewer", 1, 9000)]}, 14.0)
    assert rates == {("/cam", "/camera", "/viewer"): 2000.0}
    # a new connection with the same id and a lower counter (reconnect) gives no rate
    assert rt.update({"/cam": [Connection("/camera", "/cam", "/viewer", 1, 10)]}, 15.0) == {}


def test_rate_tracker_uses_when_each_publisher_was_read() -> None:
    """A read that ends late (another publisher timed out) does not shorten the interval of a
    publisher whose counters were read early: 2 kB/s stays 2 kB/s, not 4."""
    rt = RateTracker()
    rt.update({"/cam": [Connection("/camera", "/cam", "/viewer", 1, 1000)]}, 11.0, {"/cam": 10.0})
    rates = rt.update({"/cam": [Connection("/camera", "/cam", "/viewer", 1, 5000)]}, 12.0, {"/cam": 12.0})
    assert rates == {("/cam", "/camera", "/viewer"): 2000.0}   # ended at 11 s: (5000-1000)/(12-11) would be 4000


def test_filter_links_and_peers_with_links() -> None:
    links = build_links(STATE, URIS, {}, machines())
    cross = filter_links(links)
    assert cross and all(not link.local for link in cross)
    assert len(filter_links(links, include_local=True)) == len(links)
    assert {link.topic for link in filter_links(links, topic="/cmd_vel")} == {"/cmd_vel"}
    assert filter_links(links, host="robotb.fleet.internal") == filter_links(links, host="robotb")
    assert filter_links(links, host="nosuch") == []
    assert peers_with_links(links, "robota") == frozenset({"robotb"})
    assert peers_with_links(links, "") == frozenset()


class _FakeGraph:
    """XML-RPC stand-in: the master plus nodes; a node listed in ``hung`` sleeps past the timeout."""

    def __init__(self, hung: str = "") -> None:
        self.hung = hung
        self.bytes = 0

    def __call__(self, uri: str, timeout: float, method: str, *args: object) -> object:
        if uri == "http://master:11311/":
            if method == "getSystemState":
                return [[["/camera", ["/cam", "/dead"]]], [["/camera", ["/viewer"]]], []]
            if method == "getTopicTypes":
                return [["/camera", "sensor_msgs/Image"]]
            if method == "lookupNode":
                return URIS.get(str(args[1]), "http://robotb:9/")
        if uri == "http://robotb:9/":  # /dead: its host is up but nothing answers in time
            time.sleep(timeout)
            raise GraphError(f"{method} at {uri}: timed out")
        if method == "getBusInfo":
            return [[7, "/viewer", "o", "TCPROS", "/camera", True, ""]]
        if method == "getBusStats":
            self.bytes += 3000
            return [[["/camera", 0, [[7, self.bytes, 1, True]]]], [], []]
        raise GraphError(f"{method} at {uri}: no such method")


def test_mapper_with_a_hung_node_and_rates() -> None:
    graph = _FakeGraph()
    reader = GraphReader("http://master:11311/", "/test", timeout_s=0.3, call=graph)
    mapper = TopicMapper(reader, ("robota",))
    start = time.monotonic()
    links = mapper.build(SNAP)
    assert time.monotonic() - start < 1.5  # the hung node costs one timeout, not a stall
    by = {link.publisher_node: link for link in links}
    assert set(by) == {"/cam", "/dead"}
    assert by["/dead"].publisher_host == "robotb" and math.isnan(by["/dead"].bytes_per_second)
    assert math.isnan(by["/cam"].bytes_per_second)
    links = mapper.build(SNAP)
    rate = {link.publisher_node: link for link in links}["/cam"].bytes_per_second
    assert rate > 0 and mapper.built and mapper.error == ""
    reader.close()


def test_mapper_keeps_the_old_map_when_the_master_is_gone() -> None:
    graph = _FakeGraph()
    reader = GraphReader("http://master:11311/", "/test", timeout_s=0.3, call=graph)
    mapper = TopicMapper(reader, ("robota",))
    first = mapper.build(SNAP)
    reader.master_uri = "http://elsewhere:1/"
    assert mapper.build(SNAP) == first
    assert "elsewhere" in mapper.error
    reader.close()


def test_graph_reader_real_xmlrpc_timeout() -> None:
    """A listening socket that never answers: the real XML-RPC call gives up after its timeout."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        reader = GraphReader(f"http://127.0.0.1:{port}/", "/test", timeout_s=0.3)
        start = time.monotonic()
        with pytest.raises(GraphError, match=f"127.0.0.1:{port}"):
            reader.read()
        assert time.monotonic() - start < 2.0
        reader.close()
    finally:
        srv.close()


class _CountingGraph:
    """Master + nodes; counts calls per (uri, method). /far_pub on robotb publishes to /far_sub
    on robotc (not this machine); /cam on robotb publishes to /viewer here."""

    STATE = [[["/camera", ["/cam"]], ["/odom", ["/far_pub"]]],
             [["/camera", ["/viewer"]], ["/odom", ["/far_sub"]]], []]
    URIS = {"/cam": "http://robotb.fleet.internal:1/", "/viewer": "http://robota.fleet.internal:2/",
            "/far_pub": "http://robotb.fleet.internal:3/", "/far_sub": "http://robotc.fleet.internal:4/"}

    def __init__(self) -> None:
        self.calls: dict = {}
        self.fail_cam = False

    def __call__(self, uri: str, timeout: float, method: str, *args: object) -> object:
        self.calls[(uri, method)] = self.calls.get((uri, method), 0) + 1
        if uri == "http://master:11311/":
            return {"getSystemState": self.STATE, "getTopicTypes": [],
                    "lookupNode": self.URIS.get(str(args[-1]), "")}[method]
        if self.fail_cam and uri == self.URIS["/cam"]:
            raise GraphError(f"{method} at {uri}: connection refused")
        if method == "getBusInfo":
            return []
        return [[], [], []]

    def count(self, method: str, uri: str = "") -> int:
        return sum(n for (u, m), n in self.calls.items() if m == method and (not uri or u == uri))


def test_mapper_asks_only_publishers_crossing_this_machine_and_caches_uris() -> None:
    graph = _CountingGraph()
    mapper = TopicMapper(GraphReader("http://master:11311/", "/test", timeout_s=0.3, call=graph), ("robota",))
    links = {(link.topic, link.publisher_node): link for link in mapper.build(SNAP)}
    assert graph.count("getBusInfo", _CountingGraph.URIS["/cam"]) == 1
    assert graph.count("getBusInfo", _CountingGraph.URIS["/far_pub"]) == 0   # robotb -> robotc: not ours
    far = links[("/odom", "/far_pub")]
    assert (far.publisher_host, far.path) == ("robotb", "unknown") and math.isnan(far.bytes_per_second)
    assert graph.count("lookupNode") == 4
    mapper.build(SNAP)
    assert graph.count("lookupNode") == 4                                   # URIs kept
    graph.fail_cam = True
    mapper.build(SNAP)
    mapper.build(SNAP)
    assert graph.count("lookupNode") == 5                                   # /cam looked up again
    mapper.close()


def test_parse_host_aliases() -> None:
    from overlay_manager.core.topic_links import parse_host_aliases
    from overlay_manager.core.validation.errors import ConfigError

    assert parse_host_aliases(None, "p") == {}
    assert parse_host_aliases({"192.168.1.20": "robot1.fleet.internal", " lan-cam ": "robot2"}, "p") == {
        "192.168.1.20": "robot1", "lan-cam": "robot2"}
    with pytest.raises(ConfigError, match="/overlay_manager private parameters: host_aliases: must be a mapping"):
        parse_host_aliases(["robot1"], "/overlay_manager private parameters")
    with pytest.raises(ConfigError, match=r"host_aliases\.192\.168\.1\.20"):
        parse_host_aliases({"192.168.1.20": 7}, "p")


def test_shaped_tier_from_name_and_type() -> None:
    from overlay_manager.core.topic_links import SHAPED_TYPE, shaped_tier

    assert shaped_tier("/r1/points/shaped", SHAPED_TYPE) == ("/r1/points", "fitted")
    assert shaped_tier("/r1/points/shaped/full", SHAPED_TYPE) == ("/r1/points", "full")
    assert shaped_tier("/r1/points/shaped", "sensor_msgs/PointCloud2") is None
    assert shaped_tier("/r1/points/shaped/stream_state", SHAPED_TYPE) is None
    assert shaped_tier("/shaped", SHAPED_TYPE) is None
