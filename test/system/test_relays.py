"""Peer relays in the campus lab: the real node via robot.launch on two robots behind symmetric
NATs and on the fleet's relay host (config/lab/relay_campus.yaml)::

    campus (public, campus server network)   relay1: base station, fleet relay on UDP 40000
    sym1 (adpm-adpf)                          robot3: ROS master, camera 640x480 rgb8 30 Hz
    sym2 (adpm-adpf)                          robot4: subscriber

Symmetric NATs on both sides: hole punching cannot work, so robot3 <-> robot4 is derp until
relay1's node turns its relay server on from the bundle's ``relay`` key. Tests, in order (the
module shares one lab; later tests build on earlier ones):

1. derp baseline: robot3 <-> robot4 is derp (node and ``tailscale ping`` agree); iperf3 through
   the node's ~measure_link;
2. relay1's node turns the relay server on: its ~status says relay_active on UDP 40000 and its
   /diagnostics has an OK "peer relay" entry; the link becomes peer-relay in robot3's ~peers
   (relay_host relay1), the same as ``tailscale ping`` says; iperf3 at least 3x the derp figure of
   this run; relay1 reports the session;
3. the camera over the relay: rate and latency at robot4;
4. failover: relay1's tailscaled stopped while the camera streams: derp, frames keep coming;
   started again: peer-relay again; both changes on ~path_changes.

Measured numbers are printed (pytest -s) and collected in MEASURED.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from path_failover import node, run_failover

from overlay_manager.core.levels import Level
from overlay_manager.lab.campus import robots

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "config" / "lab" / "relay_campus.yaml"
MASTER, SUB, RELAY = "robot3", "robot4", "relay1"
CAMERA = "/camera/image_raw"
RELAY_PORT = 40000

TO_PEER_RELAY_BOUND_S = 60.0   # derp -> peer-relay after the relay server is on
TO_DERP_BOUND_S = 30.0         # peer-relay -> derp after the relay's tailscaled stops
DERP_FRAME_BOUND_S = 30.0      # first frame over DERP after the switch (the relayed backlog drains first)
MEASURED: Dict[str, Any] = {}


def _peers_where(lab: Any, host: str, peer: str, path: str, timeout: float) -> Dict[str, Any]:
    """Ping ``peer`` from ``host``'s node, then wait until its ~peers shows ``path``; the peer entry."""
    res = robots.run_probe(lab, host, ["nodes", json.dumps({"ping": [[node(host), peer]],
                                                            "peers": {node(host): {peer: path}}}),
                                       "--timeout", str(timeout)], timeout=timeout + 30)
    return next(p for p in res["peers"][node(host)]["peers"] if p["name"] == peer)


def _measure(lab: Any, src: str, dst: str, runs: int = 2) -> Dict[str, Any]:
    """iperf3 (3 s TCP) + ping from src's node to dst's iperf3 server, over the overlay: the best
    of ``runs`` (the same for every path, so a moment of load on the 2 shared cores does not
    decide the comparison)."""
    results = [robots.call(lab, src, f"{node(src)}/measure_link", "overlay_manager/MeasureLink", timeout=60,
                           peer=dst, duration=3.0, udp_bitrate=10.0) for _ in range(runs)]
    ok = [r for r in results if r["ok"]] or results
    return max(ok, key=lambda r: r["tcp_throughput_mbps"])


@pytest.fixture(scope="module")
def campus(lab_factory):
    """The relay campus up; robot.launch on robot3 (master) and robot4; relay1's tailscaled runs,
    its node is started by the tests. Everything stopped by pid at the end."""
    lab = lab_factory(SPEC)
    procs: List[Any] = []
    try:
        robots.start_master_then(lab, MASTER, [SUB], procs)
        procs.append(robots.start_camera(lab, MASTER))
        yield lab, procs
    except Exception:
        robots.print_launch_logs(lab, lab.hosts, lines=30)
        raise
    finally:
        for p in reversed(procs):
            robots.stop(lab, p)
        print("relay measurements: " + json.dumps(MEASURED))
        lab.down()


def test_derp_without_relay(campus):
    lab, _ = campus
    peer = _peers_where(lab, MASTER, SUB, "derp", timeout=60)
    cli = lab.ping(MASTER, SUB, count=5, until_direct=False)
    m = _measure(lab, MASTER, SUB)
    MEASURED["derp"] = {"tcp_mbps": round(m["tcp_throughput_mbps"], 1), "rtt_ms": round(m["rtt_mean_ms"], 2),
                        "path": m["path"], "cli": cli.path}
    print(f"robot3 -> robot4 without relay: {json.dumps(MEASURED['derp'])}")
    assert peer["path"] == "derp" and cli.path == "derp", (peer, cli.output)
    assert m["ok"] and m["path"] == "derp", m


def test_relay_on_link_becomes_peer_relay_several_times_derp(campus):
    lab, procs = campus
    t0 = time.monotonic()
    procs.append(robots.start_robot(lab, RELAY, master=False))
    st = robots.status(lab, RELAY, where=f"m['relay_active'] and m['relay_port'] == {RELAY_PORT}",
                       timeout=120, node=node(RELAY))
    assert st["relay_summary"].startswith(f"relays on UDP {RELAY_PORT}"), st
    peer = _peers_where(lab, MASTER, SUB, "peer-relay", timeout=TO_PEER_RELAY_BOUND_S)
    MEASURED["relay_on_to_peer_relay_s"] = round(time.monotonic() - t0, 1)
    relay_ip = lab.address(RELAY)
    assert peer["peer_relay"] == f"{relay_ip}:{RELAY_PORT}", peer
    # endpoint is the relay's ip:port as documented (tailscale's ":vni:N" goes to relay_vni)
    assert peer["endpoint"] == f"{relay_ip}:{RELAY_PORT}" and peer["relay_vni"] > 0, peer
    assert peer["relay_host"] == RELAY, peer
    cli = lab.ping(MASTER, SUB, count=5, until_direct=False)
    assert cli.path == "peer-relay" and cli.via.startswith(f"{relay_ip}:{RELAY_PORT}"), cli.output
    m = _measure(lab, MASTER, SUB)
    derp = MEASURED["derp"]["tcp_mbps"]
    MEASURED["peer_relay"] = {"tcp_mbps": round(m["tcp_throughput_mbps"], 1), "rtt_ms": round(m["rtt_mean_ms"], 2),
                              "path": m["path"], "x_derp": round(m["tcp_throughput_mbps"] / derp, 1)}
    print(f"robot3 -> robot4 through relay1: {json.dumps(MEASURED['peer_relay'])} "
          f"({MEASURED['relay_on_to_peer_relay_s']} s after relay1's robot.launch)")
    assert m["ok"] and m["path"] == "peer-relay", m
    assert m["tcp_throughput_mbps"] >= 3 * derp, MEASURED
    # the relay host reports the session it carries
    st = robots.status(lab, RELAY, where="m['relay_sessions'] >= 1", timeout=30, node=node(RELAY))
    MEASURED["relay_status"] = st["relay_summary"]
    diag = robots.run_probe(lab, RELAY, ["collect", "/diagnostics", "diagnostic_msgs/DiagnosticArray",
                                         "--seconds", "3"], timeout=30)
    entries = [s for msg in diag["msgs"] for s in msg["status"]
               if s["name"] == f"{node(RELAY).lstrip('/')}: peer relay"]
    assert entries and entries[-1]["level"] == Level.OK and f"UDP {RELAY_PORT}" in entries[-1]["message"], entries[-1:]


def test_camera_over_the_relay(campus):
    lab, _ = campus
    rate = robots.run_probe(lab, SUB, ["rate", CAMERA, "sensor_msgs/Image", "--seconds", "5",
                                       "--timeout", "60"], timeout=90)
    MEASURED["camera_peer_relay"] = {k: rate[k] for k in ("rate_hz", "span_rate_hz", "max_gap_s",
                                                          "latency_p50_ms", "latency_p99_ms")}
    print(f"camera robot3 -> robot4 (peer-relay): {json.dumps(MEASURED['camera_peer_relay'])}")
    assert rate["count"] > 0, rate
    assert rate["rate_hz"] >= 20.0, rate


def test_failover_relay_down_derp_and_back(campus):
    lab, _ = campus
    run = run_failover(lab, SUB, MASTER, "peer-relay", CAMERA, "relay_failover",
                       break_link=("relay1's tailscaled stopped", lambda: lab.stop_tailscaled(RELAY)),
                       restore_link=("relay1's tailscaled started", lambda: lab.start_tailscaled(RELAY)),
                       path_timeout=60, derp_timeout=TO_DERP_BOUND_S + 30, derp_frame_timeout=DERP_FRAME_BOUND_S,
                       back_timeout=TO_PEER_RELAY_BOUND_S + 30, settle_s=2.0)
    m = run.measured("to_peer_relay_s")
    m["frames_while_derp"] = run.count(run.t_derp, run.t_restore)
    MEASURED["failover"] = m
    print(f"failover (relay1's tailscaled stopped and started, camera robot3 -> robot4): {json.dumps(m)}")
    assert m["to_derp_s"] <= TO_DERP_BOUND_S, m
    assert m["to_peer_relay_s"] <= TO_PEER_RELAY_BOUND_S, m
    assert m["frames_while_derp"] > 0, m          # the topic kept flowing on DERP
    run.assert_switched_and_back("peer-relay", m)
