"""The node's reporting decisions, cycle by cycle, with its real message types and a fake tailscaled:
what publishes at once (path, online, status fields, faults) and what waits for publish_rate
(byte counters, latency); values that do not fit a field never stop publishing."""
import math
import os
import time

import pytest

from overlay_manager.core.config import apply_overrides, load_robot_config
from overlay_manager.core.levels import Level
from overlay_manager.core.peers import PathChangeEvent, PeerState
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.ros import node as N
from overlay_manager.ros.messages import path_change_msg, peer_msg, status_key
from overlay_manager.system.workers import Worker
from overlay_manager.tailscaled.localapi import LocalAPI
from overlay_manager.testing.tsfake import FakeTailscaled

rospy = pytest.importorskip("rospy")
msg = pytest.importorskip("overlay_manager.msg", reason="messages not built (scripts/build)")
HERE = os.path.dirname(os.path.abspath(__file__))

EXAMPLE = os.path.join(HERE, "..", "..", "config", "robot.example.yaml")


class FakePub:
    """Stands in for rospy.Publisher: keeps what was published, serialized like rospy does."""

    def __init__(self, topic, *_a, **_kw):
        self.topic, self.sent, self.unregistered = topic, [], False

    def unregister(self):
        self.unregistered = True

    def publish(self, m):
        import io
        m.serialize(io.BytesIO())  # a message that cannot be serialized raises here, as in rospy
        self.sent.append(m)


@pytest.fixture
def rig(request, monkeypatch, tmp_path):
    """(fake tailscaled, node with start=False); node settings from the test's indirect parameter."""
    monkeypatch.setattr(N.rospy, "Publisher", FakePub)
    monkeypatch.setattr(N.rospy, "Service", lambda *a, **k: None)
    monkeypatch.setattr(N.rospy.Time, "now", staticmethod(lambda: rospy.Time.from_sec(time.time())))
    fake = FakeTailscaled()
    cfg = apply_overrides(load_robot_config(EXAMPLE), {"hosts_file": str(tmp_path / "hosts"), "iperf_server": False,
                                                       **getattr(request, "param", {})}, "test")
    logged = []
    m = OverlayMonitor(cfg, LocalAPI(fake.socket_path), env={})
    n = N.OverlayNode(m, lambda level, text: logged.append((level, text)), start=False)
    n.logged = logged
    try:
        yield fake, n
    finally:
        m.close()
        fake.close()


def _cycle(n, periodic=False):
    """One poll and one report; returns what each publisher sent in the report."""
    before = {p.topic: len(p.sent) for p in (n.pub_peers, n.pub_status, n.pub_diag, n.pub_changes)}
    n._poll_cycle()
    n._next_periodic = 0.0 if periodic else math.inf
    n._report_cycle()
    return {p.topic: p.sent[before[p.topic]:] for p in (n.pub_peers, n.pub_status, n.pub_diag, n.pub_changes)}


def _peer(fake):
    return next(iter(fake.status["Peer"].values()))


def test_counters_wait_for_publish_rate_paths_publish_at_once(rig):
    fake, n = rig
    first = _cycle(n, periodic=True)
    assert len(first["~peers"]) == 1 and len(first["~status"]) == 1 and len(first["/diagnostics"]) == 1
    assert [c.new_path for c in first["~path_changes"]] == ["direct"]
    assert _cycle(n) == {"~peers": [], "~status": [], "/diagnostics": [], "~path_changes": []}
    _peer(fake)["RxBytes"] = 123456789
    assert _cycle(n)["~peers"] == []                      # counters: not at once
    later = _cycle(n, periodic=True)["~peers"]
    assert later[0].peers[0].rx_bytes == 123456789        # ... but at publish_rate
    _peer(fake)["CurAddr"] = ""
    out = _cycle(n)
    assert out["~peers"][0].peers[0].path == "derp" and out["~path_changes"][0].old_path == "direct"


def test_status_change_of_any_field_publishes_at_once(rig):
    fake, n = rig
    _cycle(n, periodic=True)
    fake.status["Health"] = ["a new health warning"]      # a field no hand-picked key listed
    out = _cycle(n)
    assert out["~status"] and out["~status"][0].health == ["a new health warning"] and out["/diagnostics"]
    fake.mode = "garbage"
    out = _cycle(n)
    st = out["~status"][0]
    assert st.stale and "broken answer" in st.error and not st.tailscaled_reachable and st.status_age >= 0
    assert out["~peers"][0].stale and out["~peers"][0].peers[0].path == "unknown"
    assert any("broken answer" in t for _, t in n.logged)
    assert _cycle(n)["~status"] == []                     # the same failure: nothing new
    fake.mode = "good"
    st = _cycle(n)["~status"][0]
    assert not st.stale and st.error == "" and st.enrolled


def test_a_failing_thread_is_a_fault_in_status_and_diagnostics(rig):
    fake, n = rig
    _cycle(n, periodic=True)

    def boom():
        raise OverflowError("cannot convert float infinity to integer")

    w = Worker("overlay-test", boom, math.inf, 5.0)
    w.join(2)
    n.workers.append(w)
    out = _cycle(n)
    st = out["~status"][0]
    assert st.faults == ["thread overlay-test: last cycle failed: "
                         "OverflowError: cannot convert float infinity to integer"]
    (threads,) = (s for s in out["/diagnostics"][0].status if s.name.endswith("node threads"))
    assert threads.level == Level.WARN and "overlay-test" in threads.message


@pytest.mark.parametrize("rig", [{"manage_hosts": True}], indirect=True)
def test_hosts_block_written_after_a_read_failure_on_diagnostics(rig, tmp_path):
    """manage_hosts: the monitor computes the entries, the node's overlay-hosts step writes them
    after a read; a hosts file that cannot be written is the overlay entry's WARN on /diagnostics
    until a write succeeds."""
    fake, n = rig
    hosts = tmp_path / "hosts"
    hosts.mkdir()                                         # cannot be replaced by a file

    def cycle():
        n._poll_cycle()
        n._hosts_cycle()
        out = _cycle(n, periodic=True)
        return next(s for s in out["/diagnostics"][0].status if s.name.endswith(": overlay"))

    overlay = cycle()
    assert overlay.level == 1 and overlay.message.startswith(f"{hosts}: cannot update"), overlay.message
    assert n.m.hosts_error == overlay.message
    hosts.rmdir()
    overlay = cycle()
    assert n.m.hosts_error == "" and not overlay.message.startswith(str(hosts))
    text = hosts.read_text()
    assert "100.64.0.2 robotb.fleet.internal robotb" in text and "127.0.1.1 robota.fleet.internal robota" in text


def test_unserializable_message_is_reported_not_fatal(rig):
    fake, n = rig
    _cycle(n, periodic=True)
    real = n.pub_peers.publish

    def broken(m):
        raise rospy.ROSSerializationException("field rx_bytes must be unsigned integer type")

    n.pub_peers.publish = broken
    out = _cycle(n, periodic=True)
    assert out["~status"][0].faults == ["cannot publish ~peers: ROSSerializationException: "
                                        "field rx_bytes must be unsigned integer type"]
    n.pub_peers.publish = real
    out = _cycle(n, periodic=True)
    assert out["~peers"] and out["~status"][0].faults == []


def test_peer_msg_clamps_what_does_not_fit():
    p = PeerState("x", "x.fleet.internal", ("100.64.0.9",), True, True, "direct", rx_bytes=2 ** 70,
                  tx_bytes=-4, last_handshake=1e300, last_seen=float("nan"))
    m = peer_msg(p)
    import io
    m.serialize(io.BytesIO())
    assert m.rx_bytes == 2 ** 64 - 1 and m.tx_bytes == 0 and m.last_handshake.to_sec() == 0


def test_path_change_msg_carries_the_peer_and_both_paths():
    p = PeerState(name="r2", dns_name="r2.fleet.internal", addresses=("100.64.0.7",), online=True, active=True,
                  path="peer-relay", endpoint="10.0.0.7:40000", relay_region="fra", relay_vni=7, derp_region="")
    m = path_change_msg(rospy.Time(5), PathChangeEvent(p, "derp", "peer-relay"))
    assert (m.header.stamp, m.peer, m.dns_name, m.old_path, m.new_path, m.endpoint, m.relay_region,
            m.relay_vni, m.derp_region) == (rospy.Time(5), "r2", "r2.fleet.internal", "derp", "peer-relay",
                                            "10.0.0.7:40000", "fra", 7, "")


def test_status_key_ignores_stamp_and_age_only():
    a, b = msg.OverlayStatus(), msg.OverlayStatus()
    a.status_age, b.status_age = math.nan, 12.5
    b.header.stamp = rospy.Time(100)
    a.nat.preferred_derp_latency_ms = b.nat.preferred_derp_latency_ms = math.nan
    assert status_key(a) == status_key(b)
    b.stale = True
    assert status_key(a) != status_key(b)


def test_relay_port_out_of_range_does_not_stop_status(rig):
    from overlay_manager.tailscaled.relay import RelayServerState
    fake, n = rig
    n.m.relay_state = RelayServerState(port=99999)  # what a garbled LocalAPI answer could give
    st = _cycle(n, periodic=True)["~status"][0]
    assert st.relay_port == 0 and st.faults == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_or_stuck_thread_is_an_error_naming_it(rig):
    import threading
    fake, n = rig
    _cycle(n, periodic=True)

    def die():
        raise SystemExit("killed")  # escapes the worker's catch: the thread ends

    release = threading.Event()
    dead = Worker("overlay-dead", die, 0.05, 5.0)
    stuck = Worker("overlay-stuck", lambda: release.wait(10), 0.05, 0.2)
    dead.join(2)
    time.sleep(0.4)
    n.workers += [dead, stuck]
    try:
        out = _cycle(n)
        st = out["~status"][0]
        assert any(f.startswith("thread overlay-dead died: SystemExit") for f in st.faults), st.faults
        assert any(f.startswith("thread overlay-stuck is stuck") for f in st.faults), st.faults
        (threads,) = (s for s in out["/diagnostics"][0].status if s.name.endswith("node threads"))
        assert threads.level == Level.ERROR and "overlay-dead" in threads.message and "overlay-stuck" in threads.message
    finally:
        release.set()
        stuck.stop()


def test_link_topics_carry_a_watched_peer_by_its_ros_name(rig):
    """~links/<ROS name of the peer>: created by overlay-links once the peer has a latency, only
    after the master answered; overlay-report publishes the very Peer message ~peers carries;
    a peer that leaves the tailnet loses its topic, unregistered one cycle later."""
    fake, n = rig
    p = _peer(fake)
    p["HostName"], p["DNSName"] = "alpha-robotb", "alpha-robotb.fleet.internal."
    links = n.peer_topics
    assert any(w.name == "overlay-links" for w in n.workers)
    links._ask_master = lambda: ""
    _cycle(n, periodic=True)
    links.cycle()
    assert links.publishers == {}                       # no latency yet: not watched
    assert n.m.ping("alpha-robotb", 1, 2.0).ok
    links._ask_master = lambda: "getPid at http://alpha-robot1.fleet.internal:11311: timed out"
    n._poll_cycle()
    links.cycle()
    links.cycle()
    assert links.publishers == {}                       # the master does not answer: nothing advertised
    assert [t for _, t in n.logged if "wait for the ROS master" in t] == [
        "overlay_manager: ~links/* topics wait for the ROS master: getPid at "
        "http://alpha-robot1.fleet.internal:11311: timed out"]
    links._ask_master = lambda: ""
    links.cycle()
    (pub, name), = links.publishers.values()
    assert name == pub.topic == "~links/alpha_robotb"
    out = _cycle(n, periodic=True)
    (sent,) = pub.sent
    assert sent is out["~peers"][0].peers[0] and sent.name == "alpha-robotb" and sent.latency_ms > 0
    _peer(fake)["RxBytes"] = 987654321
    assert _cycle(n)["~peers"] == [] and len(pub.sent) == 1      # counters: at publish_rate, like ~peers
    _cycle(n, periodic=True)
    assert pub.sent[-1].rx_bytes == 987654321
    fake.status["Peer"] = {}
    n._poll_cycle()
    links.cycle()
    assert links.publishers == {} and not pub.unregistered      # retired: no longer published ...
    _cycle(n, periodic=True)
    assert len(pub.sent) == 2
    links.cycle()
    assert pub.unregistered                                     # ... and unregistered a cycle later


@pytest.mark.parametrize("rig", [{"link_topics": "none"}, {"max_link_topics": 0}], indirect=True)
def test_no_link_topics_no_thread(rig):
    fake, n = rig
    assert not n.peer_topics.enabled and not any(w.name == "overlay-links" for w in n.workers)


def test_a_link_topic_that_cannot_be_advertised_is_retried_and_logged_once(rig):
    fake, n = rig
    links = n.peer_topics
    links._ask_master = lambda: ""
    n._poll_cycle()
    assert n.m.ping("robotb", 1, 2.0).ok
    n._poll_cycle()

    def refuse(name, *_a, **_kw):
        raise rospy.ROSException(f"cannot register {name}")

    links._make = refuse
    links.cycle()
    links.cycle()
    assert links.publishers == {}
    assert [t for _, t in n.logged if "cannot advertise" in t] == [
        "overlay_manager: cannot advertise ~links/robotb (peer robotb): cannot register ~links/robotb"]
    links._make = FakePub
    links.cycle()
    assert [name for _, name in links.publishers.values()] == ["~links/robotb"]
