"""Campus system tests: the real node via robot.launch on six lab hosts in five buildings.

One campus (config/lab/system_campus.yaml) is shared by the whole module to keep CI time low::

    b1 eim-adpf   robot1 (ROS master, camera 640x480 rgb8 30 Hz, Twist echo), robot2
    b2 eim-eif    laptop (operator: subscribes, sends Twist, records)
    sym1 adpm     robot3          sym2 adpm   robot4          guest udp-blocked   robot5

Every ROS client (camera, echo, probes) runs inside a lab host with the ROS env printed by
overlay_env, as a user would. Tests, in order (later ones change the network and restore it):

1. enrolment: every node's ~peers lists every host its ACLs let it see, with overlay name/addresses;
2. path matrix: for each pair the issue names, the node's ~ping_peer and ~peers path equals what
   `tailscale ping` proves and what RFC 4787 reasoning expects;
3. camera across buildings: >= 29 Hz on the direct robot1 -> laptop path; still flowing on the
   relayed robot5 -> laptop path, which the node reports as derp;
4. control: Twist at 50 Hz laptop -> robot1 -> laptop, round trip p50/p99 recorded;
5. failover: UDP blocked at b1 while the camera streams: derp within a bound, stream keeps going,
   direct again after unblocking, both changes on ~path_changes;
6. control plane down: headscale stopped: topics flow, ~status control_reachable false, /diagnostics
   WARN (never ERROR); started again: the warning clears;
7. negative control: ROS with LAN addresses cannot reach b1's master from b2 (but can from b1).

Measured numbers are printed (run pytest with -s to see them) and collected in MEASURED.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from overlay_manager.lab import robots, system
from overlay_manager.stats import percentile

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "config" / "lab" / "system_campus.yaml"
MASTER, LAPTOP = "robot1", "laptop"
OTHERS = ["robot2", "laptop", "robot3", "robot4", "robot5"]
CAMERA = "/camera/image_raw"

FAILOVER_BOUND_S = 15.0      # direct -> derp after UDP is blocked (measured: see MEASURED / -s output)
RECOVER_DIRECT_BOUND_S = 30.0
DERP_FRAME_BOUND_S = 30.0    # first raw frame over DERP after the switch (the direct backlog drains first)
CONTROL_DOWN_BOUND_S = 60.0  # ~status control_reachable false after headscale stops
CONTROL_UP_BOUND_S = 120.0   # the warning clears after headscale starts (tailscaled backs off)

MEASURED: Dict[str, Any] = {}


def node(host: str) -> str:
    """The overlay node of a host (robot.launch runs it as /<host>/overlay_manager)."""
    return f"/{host}/overlay_manager"


@pytest.fixture(scope="module")
def campus(lab_factory):
    """The campus up, robot.launch on every host (robot1 is the master), every node listing its
    peers; the camera and the Twist echo on robot1. All stopped by pid at the end."""
    lab = lab_factory(SPEC)
    t0 = time.monotonic()
    try:
        with robots.processes(lab, lab.hosts, log_lines=30) as procs:
            robots.start_master_then(lab, MASTER, [], procs)
            for h in OTHERS:
                procs.append(robots.start_robot(lab, h, master=False))
            want = {node(h): {o: "*" for o in lab.expected_peers(h)} for h in lab.hosts}
            robots.run_probe(lab, MASTER, ["nodes", json.dumps({"peers": want}), "--timeout", "120"], timeout=120)
            MEASURED["enrol_all_s"] = round(time.monotonic() - t0, 1)
            print(f"campus: {len(lab.hosts)} nodes up and listing their peers {MEASURED['enrol_all_s']} s after "
                  "the first robot.launch")
            procs.append(robots.start_camera(lab, MASTER))
            procs.append(robots.start_echo(lab, MASTER))
            yield lab
    finally:
        print("campus measurements: " + json.dumps(MEASURED))
        lab.down()  # now, not at session end: six idle tailscaleds would slow the other modules


# --- 1. enrolment ---------------------------------------------------------------------------

def test_enrolment_every_node_lists_its_visible_peers(campus):
    lab = campus
    want = {node(h): {o: "*" for o in lab.expected_peers(h)} for h in lab.hosts}
    res = robots.run_probe(lab, MASTER, ["nodes", json.dumps({"peers": want}), "--timeout", "30"], timeout=30)
    ips = {h: lab.overlay_ip(h) for h in lab.hosts}
    for h in lab.hosts:
        msg = res["peers"][node(h)]
        assert msg["self_peer"]["dns_name"] == f"{h}.fleet.internal"
        assert msg["self_peer"]["addresses"][0] == ips[h]
        listed = {p["name"]: p for p in msg["peers"]}
        # exactly the hosts the fleet ACLs let it see (operators do not see each other)
        assert set(listed) == lab.expected_peers(h), f"{h} lists {sorted(listed)}"
        for o, p in listed.items():
            assert p["dns_name"] == f"{o}.fleet.internal", p
            assert p["addresses"] and p["addresses"][0] == ips[o], p
            assert p["online"], p
    assert lab.expected_peers(LAPTOP) == {"robot1", "robot2", "robot3", "robot4", "robot5"}


# --- 2. path matrix ---------------------------------------------------------------------------

PAIRS = [
    # (from, to, expected path, why: RFC 4787 reasoning as in eduP2P's README / docs/lab.md)
    ("robot1", "laptop", "direct", "both NATs endpoint-independent mapping (eim-adpf vs eim-eif)"),
    ("laptop", "robot3", "direct", "EIM+EIF vs ADPM: the full-cone side lets the first packet in"),
    ("robot1", "robot3", "derp", "EIM+ADPF vs ADPM: the ADPM port is unpredictable, ADPF drops it"),
    ("robot3", "robot4", "derp", "ADPM on both sides: neither port is predictable"),
    ("robot5", "robot1", "derp", "udp-blocked: no UDP path at all"),
    ("laptop", "robot5", "derp", "udp-blocked with a full cone: still no UDP path"),
    ("robot1", "robot2", "direct", "two hosts in one building: over the LAN"),
]


@pytest.fixture(scope="module")
def path_matrix(campus):
    """Measure every pair: `tailscale ping` (the CLI) per pair in parallel threads until the path
    is proved, then one probe calling each node's ~ping_peer and reading its ~peers. The nodes ping
    only the machines that carry ROS topics to or from theirs (and the master's), so a pair without
    topics is idle until the CLI's pings punch its hole; the node is asked after that. {(a, b): {...}}"""
    lab = campus
    proved: Dict[Any, Any] = {}

    def cli(a: str, b: str, expect: str) -> None:
        proved[(a, b)] = lab.ping(a, b, count=10 if expect == "direct" else 6, until_direct=True)

    threads = [threading.Thread(target=cli, args=(a, b, e)) for a, b, e, _ in PAIRS]
    for t in threads:
        t.start()
    want: Dict[str, Dict[str, str]] = {}
    for a, b, e, _ in PAIRS:
        want.setdefault(node(a), {})[b] = e
    spec = {"ping": [[node(a), b] for a, b, _, _ in PAIRS], "ping_count": 3, "peers": want, "lenient": True}
    t0 = time.monotonic()
    for t in threads:
        t.join(60)
    res = robots.run_probe(lab, MASTER, ["nodes", json.dumps(spec), "--timeout", "20"], timeout=40)
    print(f"path matrix measured in {time.monotonic() - t0:.1f} s; unmet: {res['unmet']}")
    out = {}
    for a, b, e, why in PAIRS:
        ping = next(p for p in res["pings"] if p["node"] == node(a) and p["peer"] == b)
        peer = next((p for p in res["peers"][node(a)]["peers"] if p["name"] == b), None)
        out[(a, b)] = {"expected": e, "why": why, "cli": proved.get((a, b)), "ping_peer": ping, "peer": peer}
        cli_res = proved.get((a, b))
        print(f"  {a:>7} -> {b:<7} expected {e:<6} tailscale ping: {cli_res.path if cli_res else '?':<6} "
              f"node ping_peer: {ping['path']:<6} node ~peers: {peer['path'] if peer else '?':<6} ({why})")
    MEASURED["path_matrix"] = {f"{a}->{b}": v["peer"]["path"] if v["peer"] else None for (a, b), v in out.items()}
    return out


@pytest.mark.parametrize("a,b,expected", [(a, b, e) for a, b, e, _ in PAIRS], ids=[f"{a}-{b}" for a, b, _, _ in PAIRS])
def test_path_matrix_node_reports_the_proved_expected_path(path_matrix, a, b, expected):
    r = path_matrix[(a, b)]
    cli = r["cli"]
    assert cli is not None, "tailscale ping did not finish"
    assert cli.path == expected, f"tailscale ping {a} -> {b}: {cli.output[-600:]} ({r['why']})"
    assert r["ping_peer"]["ok"], r["ping_peer"]
    assert r["ping_peer"]["path"] == cli.path, (r["ping_peer"], cli.output[-300:])
    assert r["peer"] is not None and r["peer"]["path"] == cli.path, r["peer"]
    if expected == "direct":
        assert r["peer"]["endpoint"] and r["ping_peer"]["endpoint"], r
    else:
        assert r["peer"]["relay_region"], r["peer"]


# --- 3. camera across buildings ------------------------------------------------------------------

def test_camera_direct_at_least_29_hz(campus):
    lab = campus
    robots.run_probe(lab, LAPTOP, ["nodes", json.dumps({"ping": [[node(LAPTOP), MASTER]],
                                                        "peers": {node(LAPTOP): {MASTER: "direct"}}}),
                                   "--timeout", "30"], timeout=30)
    rate = robots.run_probe(lab, LAPTOP, ["rate", CAMERA, "sensor_msgs/Image", "--seconds", "5",
                                          "--timeout", "60"], timeout=90)
    MEASURED["camera_direct"] = {k: rate[k] for k in ("rate_hz", "span_rate_hz", "max_gap_s", "latency_p50_ms",
                                                      "latency_p99_ms")}
    print(f"camera robot1 -> laptop (direct): {json.dumps(MEASURED['camera_direct'])}")
    assert rate["rate_hz"] >= 29.0, rate


def test_camera_relayed_still_flows_and_node_reports_derp(campus):
    lab = campus
    topic = "/robot5/camera/image_raw"
    cam = robots.start_camera(lab, "robot5", topic=topic)
    try:
        rate = robots.run_probe(lab, LAPTOP, ["rate", topic, "sensor_msgs/Image", "--seconds", "5",
                                              "--timeout", "60"], timeout=90)
        res = robots.run_probe(lab, LAPTOP, ["nodes", json.dumps({"peers": {node(LAPTOP): {"robot5": "derp"}}}),
                                             "--timeout", "20"], timeout=30)
    finally:
        robots.stop(lab, cam)
    MEASURED["camera_derp"] = {k: rate[k] for k in ("rate_hz", "span_rate_hz", "max_gap_s", "latency_p50_ms",
                                                    "latency_p99_ms")}
    print(f"camera robot5 -> laptop (derp): {json.dumps(MEASURED['camera_derp'])}")
    assert rate["count"] > 0, rate
    assert not res["unmet"]


# --- 4. control ---------------------------------------------------------------------------------

def test_control_twist_round_trip(campus):
    lab = campus
    res = robots.run_probe(lab, LAPTOP, ["control", "--rate", "50", "--seconds", "5", "--timeout", "60"], timeout=90)
    MEASURED["control_direct"] = {k: res[k] for k in ("sent", "received", "rtt_p50_ms", "rtt_p99_ms", "rtt_max_ms")}
    print(f"Twist 50 Hz laptop -> robot1 -> laptop (direct): {json.dumps(MEASURED['control_direct'])}")
    assert res["received"] >= 0.95 * res["sent"], res
    assert res["rtt_p50_ms"] < 100, res


# --- 5. failover ----------------------------------------------------------------------------------

def _peer_path(host: str, peer: str, path: str):
    return lambda ev: ev["ev"] == "peers" and ev["node"] == node(host) and ev["paths"].get(peer, [None])[0] == path


def _phase_rate(frames: List[Dict[str, Any]], start: float, end: float) -> float:
    n = len([f for f in frames if start <= f["t"] < end])
    return round(n / (end - start), 1) if end > start else 0.0


def test_failover_udp_blocked_derp_and_back(campus):
    lab = campus
    rec = robots.Recorder(lab, LAPTOP, image=CAMERA, nodes=[node(LAPTOP)], name="failover")
    blocked = False
    try:
        rec.wait("the first camera frame", lambda ev: ev["ev"] == "frame", timeout=60)
        rec.wait(f"{node(LAPTOP)} ~peers: robot1 direct", _peer_path(LAPTOP, MASTER, "direct"), timeout=30)
        time.sleep(3)
        t_block = time.monotonic()
        lab.block_udp("b1")
        blocked = True
        ev = rec.wait(f"{node(LAPTOP)} ~peers: robot1 derp after blocking UDP at b1",
                      _peer_path(LAPTOP, MASTER, "derp"), timeout=FAILOVER_BOUND_S + 30, since=t_block)
        t_derp = ev["t"]
        # the raw stream's backlog drains through DERP first: wait (bounded) for a frame that
        # arrived on the relayed path, then keep the relayed phase going a little longer
        rec.wait("a camera frame received over DERP", lambda e: e["ev"] == "frame", timeout=DERP_FRAME_BOUND_S,
                 since=t_derp)
        time.sleep(3)
        t_unblock = time.monotonic()
        lab.unblock_udp("b1")
        blocked = False
        ev = rec.wait(f"{node(LAPTOP)} ~peers: robot1 direct after unblocking",
                      _peer_path(LAPTOP, MASTER, "direct"), timeout=RECOVER_DIRECT_BOUND_S + 30, since=t_unblock)
        t_direct = ev["t"]
        time.sleep(3)
        t_end = time.monotonic()
    finally:
        if blocked:
            lab.unblock_udp("b1")
        rec.stop()
    frames = rec.frames(t_block - 3, t_end)
    times = [f["t"] for f in frames]
    gaps = [b - a for a, b in zip(times, times[1:])]
    derp_lat = [f["lat_ms"] for f in frames if t_derp <= f["t"] < t_unblock and f["lat_ms"] is not None]
    changes = [e for e in rec.events if e["ev"] == "change" and e["peer"] == MASTER]
    m = {"to_derp_s": round(t_derp - t_block, 2), "to_direct_s": round(t_direct - t_unblock, 2),
         "longest_gap_s": round(max(gaps), 3) if gaps else None,
         "rate_direct_before_hz": _phase_rate(frames, t_block - 3, t_block),
         "rate_while_switching_hz": _phase_rate(frames, t_block, t_derp),
         "rate_derp_hz": _phase_rate(frames, t_derp, t_unblock),
         "rate_direct_after_hz": _phase_rate(frames, t_direct, t_end),
         "latency_derp_p50_ms": percentile(derp_lat, 50),
         "path_changes": [f"{e['old']}->{e['new']} @{e['t'] - t_block:+.1f}s" for e in changes]}
    MEASURED["failover"] = m
    print(f"failover (UDP blocked at b1, camera robot1 -> laptop): {json.dumps(m)}")
    assert m["to_derp_s"] <= FAILOVER_BOUND_S, m
    assert m["to_direct_s"] <= RECOVER_DIRECT_BOUND_S, m
    assert m["rate_derp_hz"] > 0, m                  # the subscriber kept receiving on the relay
    assert times and times[-1] > t_direct, m
    assert m["longest_gap_s"] < FAILOVER_BOUND_S, m
    to_derp = [e for e in changes if e["new"] == "derp" and e["t"] >= t_block]
    to_direct = [e for e in changes if e["new"] == "direct" and e["t"] >= t_unblock]
    assert to_derp and to_derp[0]["old"] == "direct", m["path_changes"]
    assert to_direct and to_direct[0]["old"] == "derp", m["path_changes"]


# --- 6. control plane down -------------------------------------------------------------------------

def _overlay_diag(host: str, pred):
    return lambda ev: ev["ev"] == "diag" and ev["node"] == node(host) and pred(ev)


def test_control_plane_down_warns_and_topics_keep_flowing(campus):
    lab = campus
    rec = robots.Recorder(lab, LAPTOP, image=CAMERA, nodes=[node(LAPTOP)], name="control_plane")
    started = True
    try:
        rec.wait("the first camera frame", lambda ev: ev["ev"] == "frame", timeout=60)
        rec.wait(f"{node(LAPTOP)} ~status control_reachable", lambda ev: ev["ev"] == "status"
                 and ev["node"] == node(LAPTOP) and ev["control_reachable"], timeout=30)
        t_stop = time.monotonic()
        lab.headscale_stop()
        started = False
        ev = rec.wait(f"{node(LAPTOP)} ~status control_reachable false after headscale stopped",
                      lambda ev: ev["ev"] == "status" and ev["node"] == node(LAPTOP) and not ev["control_reachable"],
                      timeout=CONTROL_DOWN_BOUND_S, since=t_stop)
        t_down = ev["t"]
        warn = rec.wait(f"{node(LAPTOP)} /diagnostics overlay WARN 'control server unreachable'",
                        _overlay_diag(LAPTOP, lambda e: "control server unreachable" in e["message"]),
                        timeout=15, since=t_stop)
        time.sleep(3)
        t_start = time.monotonic()
        lab.headscale_start()
        started = True
        ev = rec.wait(f"{node(LAPTOP)} ~status control_reachable again after headscale started",
                      lambda ev: ev["ev"] == "status" and ev["node"] == node(LAPTOP) and ev["control_reachable"],
                      timeout=CONTROL_UP_BOUND_S, since=t_start)
        t_up = ev["t"]
        clear = rec.wait(f"{node(LAPTOP)} /diagnostics overlay warning cleared",
                         _overlay_diag(LAPTOP, lambda e: "control server unreachable" not in e["message"]),
                         timeout=15, since=t_start)
        time.sleep(1)
        t_end = time.monotonic()
    finally:
        if not started:
            lab.headscale_start()
        rec.stop()
    frames = rec.frames(t_stop, t_end)
    times = [f["t"] for f in frames]
    gaps = [b - a for a, b in zip(times, times[1:])]
    diags = [e for e in rec.events if e["ev"] == "diag" and e["t"] >= t_stop]
    m = {"control_unreachable_after_s": round(t_down - t_stop, 2), "warn_after_s": round(warn["t"] - t_stop, 2),
         "recovered_after_s": round(t_up - t_start, 2), "warning_cleared_after_s": round(clear["t"] - t_start, 2),
         "camera_rate_while_down_hz": _phase_rate(frames, t_down, t_start),
         "longest_gap_s": round(max(gaps), 3) if gaps else None,
         "diagnostics": [f"{e['level']} {e['message']} @{e['t'] - t_stop:+.1f}s" for e in diags]}
    MEASURED["control_plane"] = m
    print(f"control plane down (headscale stopped, camera robot1 -> laptop direct): {json.dumps(m)}")
    assert warn["level"] == 1, warn                           # WARN
    assert all(e["level"] != 2 for e in diags), m["diagnostics"]  # never ERROR
    assert clear["level"] == 0, clear
    assert m["camera_rate_while_down_hz"] >= 25, m           # the direct link keeps carrying the topic
    assert m["longest_gap_s"] < 2.0, m


# --- 7. negative control ---------------------------------------------------------------------------

def test_negative_control_lan_ros_env_cannot_reach_other_building(campus):
    lab = campus
    master_lan = lab.address(MASTER)
    uri = f"http://{master_lan}:11311"

    def rostopic_list(host: str, env_line: str) -> Any:
        return lab.exec(host, ["bash", "-c", f"{env_line} && exec timeout 10 rostopic list"],
                        env=robots.ros_env(lab, host), timeout=30, check=False, quiet=True)

    lan = f"export ROS_MASTER_URI={uri} ROS_HOSTNAME={{}} && unset ROS_IP"
    same = rostopic_list("robot2", lan.format(lab.address("robot2")))
    assert same.returncode == 0 and CAMERA in same.stdout, f"same building must work: {same.stderr[-500:]}"
    other = rostopic_list(LAPTOP, lan.format(lab.address(LAPTOP)))
    assert other.returncode != 0, f"building 2 reached building 1's master without the overlay: {other.stdout}"
    assert not system.tcp_connect(lab.namespace(LAPTOP), master_lan, 11311, timeout=2.0)
    assert not system.tcp_connect(lab.namespace(LAPTOP), lab.address("b1"), 11311, timeout=2.0)
    via_overlay = rostopic_list(LAPTOP, robots.overlay_env_line(lab, LAPTOP))
    assert via_overlay.returncode == 0 and CAMERA in via_overlay.stdout, via_overlay.stderr[-500:]
    print(f"negative control: laptop -> {uri} without the overlay: exit {other.returncode} "
          f"({(other.stderr.strip().splitlines() or ['timeout'])[-1][:120]}); robot2 (same LAN) and laptop via "
          "the overlay list the topics")
