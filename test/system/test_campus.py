"""Campus system tests: the real node via robot.launch on six lab hosts in five buildings.

One campus (config/lab/system_campus.yaml) is shared by the whole module to keep CI time low::

    b1 eim-adpf   alpha-robot1 (ROS master, camera 640x480 rgb8 30 Hz, Twist echo),
                  alpha-robot2 (robot.launch camera_topics:=..., the C++ link-aware encoder)
    b2 eim-eif    alpha-laptop (operator: subscribes, sends Twist, records)
    sym1 adpm     alpha-robot3    sym2 adpm   4th-robot       guest udp-blocked   guest-robot5

Host names are DNS names as real fleets use them (hyphens, a leading digit), which are not legal
ROS names: every node runs under ros_names.ros_namespace of its host (/alpha_robot1/...,
/h_4th_robot/...).

Every ROS client (camera, echo, probes) runs inside a lab host with the ROS env printed by
overlay_env, as a user would. Tests, in order (later ones change the network and restore it):

1. enrolment: every node's ~peers lists every host its ACLs let it see, with overlay name/addresses;
2. path matrix: for each pair of buildings, the node's ~ping_peer and ~peers path equals what
   `tailscale ping` proves and what RFC 4787 reasoning expects;
3. camera across buildings: >= 29 Hz on the direct robot1 -> laptop path (best of up to three
   5 s windows); still flowing on the relayed robot5 -> laptop path, which the node reports as derp;
4. control: Twist at 50 Hz laptop -> robot1 -> laptop, round trip p50/p99 recorded;
5. failover: UDP blocked at b1 while the camera streams: derp within a bound, stream keeps going,
   direct again after unblocking, both changes on ~path_changes;
6. control plane down: headscale stopped: topics flow, ~status control_reachable false, /diagnostics
   WARN (never ERROR); started again: the warning clears;
7. negative control: ROS with LAN addresses cannot reach b1's master from b2 (but can from b1);
8. roscpp on hyphenated hosts: the C++ encoder under robot.launch on alpha-robot2 stays up (same
   pid, no respawn) and serves the laptop; `rosbag record` of a node's ~peers writes a bag.

Measured numbers are printed (run pytest with -s to see them) and collected in MEASURED.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from path_failover import frame_rate_hz, is_frame, longest_gap_s, node, run_failover

from overlay_manager.core.levels import Level
from overlay_manager.core.ros_names import overlay_node, ros_namespace
from overlay_manager.lab.campus import robots, system
from overlay_manager.system.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "config" / "lab" / "system_campus.yaml"
MASTER, ROBOT2, LAPTOP = "alpha-robot1", "alpha-robot2", "alpha-laptop"
ROBOT3, ROBOT4, ROBOT5 = "alpha-robot3", "4th-robot", "guest-robot5"
OTHERS = [ROBOT2, LAPTOP, ROBOT3, ROBOT4, ROBOT5]
CAMERA = "/camera/image_raw"
ROBOT2_CAMERA = f"/{ros_namespace(ROBOT2)}/camera/image_raw"  # served link-aware by ROBOT2's robot.launch

FAILOVER_BOUND_S = 15.0      # direct -> derp after UDP is blocked (measured: see MEASURED / -s output)
STALL_BOUND_S = 3.0          # the same with the node's path guard (docs/node.md "Moving robots"): it notices
                             # the stall in node.stall_after (0.5 s) and tailscaled falls back at once;
                             # tailscale alone trusts the dead path 6.5 s (the node said derp after 4.6-5.5 s)
RECOVER_DIRECT_BOUND_S = 30.0
DERP_FRAME_BOUND_S = 30.0    # first raw frame over DERP after the switch (the direct backlog drains first)
CONTROL_DOWN_BOUND_S = 60.0  # ~status control_reachable false after headscale stops
CONTROL_UP_BOUND_S = 120.0   # the warning clears after headscale starts (tailscaled backs off)

MEASURED: Dict[str, Any] = {}


@pytest.fixture(scope="module")
def campus(lab_factory):
    """The campus up, robot.launch on every host (MASTER is the master; ROBOT2's also starts the
    C++ link-aware encoder for ROBOT2_CAMERA), every node listing its peers; the camera and the
    Twist echo on MASTER. All stopped by pid at the end."""
    lab = lab_factory(SPEC)
    t0 = time.monotonic()
    try:
        with robots.processes(lab, lab.hosts, log_lines=30) as procs:
            robots.start_master_then(lab, MASTER, [], procs)
            for h in OTHERS:
                args = [f"camera_topics:={ROBOT2_CAMERA}"] if h == ROBOT2 else []
                procs.append(robots.start_robot(lab, h, master=False, launch_args=args))
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
    assert lab.expected_peers(LAPTOP) == {MASTER, ROBOT2, ROBOT3, ROBOT4, ROBOT5}


# --- 2. path matrix ---------------------------------------------------------------------------

PAIRS = [
    # (from, to, expected path, why: RFC 4787 reasoning as in eduP2P's README / docs/lab.md)
    (MASTER, LAPTOP, "direct", "both NATs endpoint-independent mapping (eim-adpf vs eim-eif)"),
    (LAPTOP, ROBOT3, "direct", "EIM+EIF vs ADPM: the full-cone side lets the first packet in"),
    (MASTER, ROBOT3, "derp", "EIM+ADPF vs ADPM: the ADPM port is unpredictable, ADPF drops it"),
    (ROBOT3, ROBOT4, "derp", "ADPM on both sides: neither port is predictable"),
    (ROBOT5, MASTER, "derp", "udp-blocked: no UDP path at all"),
    (LAPTOP, ROBOT5, "derp", "udp-blocked with a full cone: still no UDP path"),
    (MASTER, ROBOT2, "direct", "two hosts in one building: over the LAN"),
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
        print(f"  {a:>12} -> {b:<12} expected {e:<6} tailscale ping: {cli_res.path if cli_res else '?':<6} "
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
    # the best of up to three 5 s windows: what is tested is that the direct path carries the
    # full 30 Hz raw stream (221 Mbit/s); on 2 shared cores one window can lose a few hundred ms
    # to a CPU stall of the publisher or wireguard-go (seen once: 28.2 Hz, one 0.4 s stall),
    # while a relayed or broken path stays far below in every window (DERP: about 3 Hz)
    windows = []
    for _ in range(3):
        rate = robots.run_probe(lab, LAPTOP, ["rate", CAMERA, "sensor_msgs/Image", "--seconds", "5",
                                              "--timeout", "60"], timeout=90)
        windows.append({k: rate[k] for k in ("rate_hz", "span_rate_hz", "max_gap_s", "latency_p50_ms",
                                             "latency_p99_ms")})
        if rate["rate_hz"] >= 29.0:
            break
    MEASURED["camera_direct"] = windows[-1]
    print(f"camera robot1 -> laptop (direct), {len(windows)} window(s): {json.dumps(windows)}")
    assert rate["rate_hz"] >= 29.0, windows


def test_camera_relayed_still_flows_and_node_reports_derp(campus):
    lab = campus
    topic = f"/{ros_namespace(ROBOT5)}/camera/image_raw"
    cam = robots.start_camera(lab, ROBOT5, topic=topic)
    try:
        rate = robots.run_probe(lab, LAPTOP, ["rate", topic, "sensor_msgs/Image", "--seconds", "5",
                                              "--timeout", "60"], timeout=90)
        res = robots.run_probe(lab, LAPTOP, ["nodes", json.dumps({"peers": {node(LAPTOP): {ROBOT5: "derp"}}}),
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

def test_failover_udp_blocked_derp_and_back(campus):
    lab = campus
    run = run_failover(lab, LAPTOP, MASTER, "direct", CAMERA, "failover",
                       break_link=("blocking UDP at b1", lambda: lab.block_udp("b1")),
                       restore_link=("unblocking", lambda: lab.unblock_udp("b1")),
                       path_timeout=30, derp_timeout=FAILOVER_BOUND_S + 30, derp_frame_timeout=DERP_FRAME_BOUND_S,
                       back_timeout=RECOVER_DIRECT_BOUND_S + 30, settle_s=3.0)
    m = run.measured("to_direct_s")
    m.update(rate_direct_before_hz=run.rate_hz(run.t_break - 3, run.t_break),
             rate_while_switching_hz=run.rate_hz(run.t_break, run.t_derp),
             rate_derp_hz=run.rate_hz(run.t_derp, run.t_restore),
             rate_direct_after_hz=run.rate_hz(run.t_back, run.t_end))
    MEASURED["failover"] = m
    print(f"failover (UDP blocked at b1, camera robot1 -> laptop): {json.dumps(m)}")
    assert m["to_derp_s"] <= STALL_BOUND_S, m
    assert m["to_direct_s"] <= RECOVER_DIRECT_BOUND_S, m
    assert m["rate_derp_hz"] > 0, m                  # the subscriber kept receiving on the relay
    assert m["longest_gap_s"] < FAILOVER_BOUND_S, m
    run.assert_switched_and_back("direct", m)


# --- 6. control plane down -------------------------------------------------------------------------

def _overlay_diag(host: str, pred):
    return lambda ev: ev["ev"] == "diag" and ev["node"] == node(host) and pred(ev)


def _control_reachable(host: str, reachable: bool):
    return lambda ev: ev["ev"] == "status" and ev["node"] == node(host) and bool(ev["control_reachable"]) == reachable


def _overlay_level(rec: robots.Recorder, host: str) -> Optional[int]:
    """The level of the latest /diagnostics overlay entry of host's node the recorder has seen."""
    rec.read()
    diags = [e for e in rec.events if e["ev"] == "diag" and e["node"] == node(host)]
    return diags[-1]["level"] if diags else None


def _control_change(rec: robots.Recorder, reachable: bool, since: float, timeout: float, after: str):
    """Wait for LAPTOP's ~status to say control_reachable ``reachable`` (within ``timeout`` s),
    then for its /diagnostics overlay entry to show the warning (unreachable) or clear it (within
    15 s), both after ``since``; returns (the status event's time, the diagnostics event)."""
    status = rec.wait(f"{node(LAPTOP)} ~status control_reachable {'again' if reachable else 'false'} after {after}",
                      _control_reachable(LAPTOP, reachable), timeout=timeout, since=since)
    what = "warning cleared" if reachable else "WARN 'control server unreachable'"
    diag = rec.wait(f"{node(LAPTOP)} /diagnostics overlay {what}",
                    _overlay_diag(LAPTOP, lambda e: ("control server unreachable" in e["message"]) != reachable),
                    timeout=15, since=since)
    return status["t"], diag


def test_control_plane_down_warns_and_topics_keep_flowing(campus):
    lab = campus
    rec = robots.Recorder(lab, LAPTOP, image=CAMERA, nodes=[node(LAPTOP)], name="control_plane")
    started = True
    try:
        rec.wait("the first camera frame", is_frame, timeout=60)
        rec.wait(f"{node(LAPTOP)} ~status control_reachable", _control_reachable(LAPTOP, True), timeout=30)
        # a preflight that ran while the failover test had UDP blocked (the master's XML-RPC did
        # not answer during the switch) stays on /diagnostics until the next one (every 30 s):
        # run the checks now, so the test starts from an OK overlay entry
        pre = robots.call(lab, LAPTOP, f"{node(LAPTOP)}/preflight", "overlay_manager/Preflight")
        wait_for(f"{node(LAPTOP)} /diagnostics overlay OK after ~preflight", lambda: _overlay_level(rec, LAPTOP) == 0,
                 15, interval=0.2, detail=lambda: f"level {_overlay_level(rec, LAPTOP)}; {json.dumps(pre)[:800]}")
        t_stop = time.monotonic()
        lab.headscale_stop()
        started = False
        t_down, warn = _control_change(rec, False, t_stop, CONTROL_DOWN_BOUND_S, "headscale stopped")
        time.sleep(3)
        t_start = time.monotonic()
        lab.headscale_start()
        started = True
        t_up, clear = _control_change(rec, True, t_start, CONTROL_UP_BOUND_S, "headscale started")
        time.sleep(1)
        t_end = time.monotonic()
    finally:
        if not started:
            lab.headscale_start()
        rec.stop()
    frames = rec.frames(t_stop, t_end)
    diags = [e for e in rec.events if e["ev"] == "diag" and e["t"] >= t_stop]
    m = {"control_unreachable_after_s": round(t_down - t_stop, 2), "warn_after_s": round(warn["t"] - t_stop, 2),
         "recovered_after_s": round(t_up - t_start, 2), "warning_cleared_after_s": round(clear["t"] - t_start, 2),
         "camera_rate_while_down_hz": frame_rate_hz(frames, t_down, t_start),
         "longest_gap_s": longest_gap_s(frames),
         "diagnostics": [f"{e['level']} {e['message']} @{e['t'] - t_stop:+.1f}s" for e in diags]}
    MEASURED["control_plane"] = m
    print(f"control plane down (headscale stopped, camera robot1 -> laptop direct): {json.dumps(m)}")
    assert warn["level"] == Level.WARN, warn                           # WARN
    assert all(e["level"] != Level.ERROR for e in diags), m["diagnostics"]  # never ERROR
    assert clear["level"] == Level.OK, clear
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
    same = rostopic_list(ROBOT2, lan.format(lab.address(ROBOT2)))
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


# --- 8. roscpp clients on hyphenated hosts ------------------------------------------------------

def _encoder_died(lab) -> List[str]:
    """Lines of ROBOT2's robot.launch log where roslaunch saw the encoder die (respawns)."""
    log = Path(lab.host_dir(ROBOT2)) / "robot.launch.log"
    return [ln for ln in log.read_text(errors="replace").splitlines()
            if "link_aware_camera" in ln and ("has died" in ln or "is invalid" in ln)]


def test_cpp_encoder_on_a_hyphenated_host_stays_up_and_serves_the_laptop(campus):
    lab = campus
    ns = ros_namespace(ROBOT2)
    assert ns != ROBOT2 and "-" in ROBOT2  # the host name itself is not a legal ROS name
    encoder = f"/{ns}/link_aware_camera"
    pid_before = robots.run_probe(lab, ROBOT2, ["pid", encoder, "--timeout", "30"], timeout=30)["pid"]
    t0 = time.monotonic()
    cam = robots.start_camera(lab, ROBOT2, topic=ROBOT2_CAMERA, rate_hz=10.0)
    try:
        rate = robots.run_probe(lab, LAPTOP, ["rate", f"{ROBOT2_CAMERA}/compressed", "sensor_msgs/CompressedImage",
                                              "--seconds", "4", "--timeout", "60"], timeout=90)
    finally:
        robots.stop(lab, cam)
    pid_after = robots.run_probe(lab, ROBOT2, ["pid", encoder, "--timeout", "30"], timeout=30)["pid"]
    held_s = time.monotonic() - t0
    MEASURED["encoder_hyphenated_host"] = {"pid_unchanged_for_s": round(held_s, 1), "rate_hz": rate["rate_hz"],
                                           "count": rate["count"]}
    print(f"C++ encoder {encoder} on {ROBOT2}: {json.dumps(MEASURED['encoder_hyphenated_host'])}")
    assert pid_after == pid_before, f"{encoder} was restarted ({pid_before} -> {pid_after}): {_encoder_died(lab)}"
    assert held_s >= 5.0  # longer than robot.launch's respawn delay for the encoder (5 s)
    assert not _encoder_died(lab), _encoder_died(lab)
    assert rate["count"] > 0, rate


def test_rosbag_record_of_peers_on_a_hyphenated_host_writes_a_bag(campus):
    import rosbag  # python3-rosbag: the `rosbag record` CLI runs its C++ recorder (roscpp)

    lab = campus
    bag = Path(lab.host_dir(ROBOT2)) / "peers.bag"
    topics = [f"{overlay_node(ROBOT2)}/peers", f"{overlay_node(ROBOT4)}/peers"]  # hyphen, leading digit
    line = (f"{robots.overlay_env_line(lab, ROBOT2)} && exec rosbag record --duration=8 -O {bag} "
            + " ".join(topics))
    res = lab.exec(ROBOT2, ["bash", "-c", line], env=robots.ros_env(lab, ROBOT2), timeout=60, check=False,
                   quiet=True)
    assert res.returncode == 0 and bag.exists(), f"rosbag record exited {res.returncode}: {res.stderr[-1500:]}"
    with rosbag.Bag(str(bag)) as b:
        counts = {t: b.get_message_count(t) for t in topics}
        first = next(b.read_messages(topics=[topics[0]])).message
    print(f"rosbag record on {ROBOT2}: {counts}")
    assert all(n >= 2 for n in counts.values()), counts
    assert first.self_peer.name == ROBOT2  # the original host name where a peer is shown
