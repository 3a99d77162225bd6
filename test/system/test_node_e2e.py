"""End to end: the real node via robot.launch on two lab hosts in two buildings behind NATs.

robot1 (building b1, runs roscore) and laptop (building b2) each run tailscaled in their own
namespace, enrolled by the node's own tools against the lab's real headscale. Checks: each node's
~peers lists the other with its overlay name and addresses; the path reported is the path a
disco ping proves (direct: both NATs are endpoint-independent); services answer; the managed
/etc/hosts block is written without touching other lines; a ROS topic flows across buildings
using the overlay names from overlay_env.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.lab.campus import robots

ROBOT, LAPTOP = "alpha-robot1", "alpha-laptop"
N_ROBOT, N_LAPTOP = overlay_node(ROBOT), overlay_node(LAPTOP)


def test_each_node_lists_the_other_with_overlay_name(two_buildings_robots):
    lab = two_buildings_robots
    for host, other, node in ((ROBOT, LAPTOP, N_ROBOT), (LAPTOP, ROBOT, N_LAPTOP)):
        msg = robots.peers(lab, host, min_peers=1, node=node)
        assert msg["self_peer"]["dns_name"] == f"{host}.fleet.internal"
        names = {p["name"]: p for p in msg["peers"]}
        assert other in names, f"{host} does not list {other}: {json.dumps(msg)[:800]}"
        peer = names[other]
        assert peer["dns_name"] == f"{other}.fleet.internal"
        assert peer["online"] and peer["addresses"][0] == lab.overlay_ip(other)


def test_reported_path_is_the_proved_path(two_buildings_robots):
    lab = two_buildings_robots
    ping = robots.call(lab, LAPTOP, f"{N_LAPTOP}/ping_peer", "overlay_manager/PingPeer",
                       name=ROBOT, count=3, timeout=5.0)
    assert ping["ok"], ping["message"]
    # both buildings are endpoint-independent NATs: tailscale hole-punches a direct path
    deadline = time.monotonic() + 30
    while ping["path"] != "direct" and time.monotonic() < deadline:
        ping = robots.call(lab, LAPTOP, f"{N_LAPTOP}/ping_peer", "overlay_manager/PingPeer",
                           name=ROBOT, count=1, timeout=5.0)
    assert ping["path"] == "direct", f"disco ping path {ping}"
    proved = lab.ping(LAPTOP, ROBOT)  # `tailscale ping` (the CLI), independent of the node
    msg = robots.peers(lab, LAPTOP, min_peers=1, node=N_LAPTOP,
                       where=f"[p for p in m['peers'] if p['name']=='{ROBOT}' and p['path']=='direct'"
                             " and p['latency_ms'] is not None]")
    peer = next(p for p in msg["peers"] if p["name"] == ROBOT)
    assert peer["path"] == "direct" and peer["endpoint"], peer
    assert proved.path == "direct", proved.output
    assert peer["latency_ms"] is not None and peer["latency_ms"] > 0


def test_services_answer(two_buildings_robots):
    lab = two_buildings_robots
    got = robots.call(lab, LAPTOP, f"{N_LAPTOP}/get_peer", "overlay_manager/GetPeer", name=lab.overlay_ip(ROBOT))
    assert got["found"] and got["peer"]["name"] == ROBOT
    miss = robots.call(lab, LAPTOP, f"{N_LAPTOP}/get_peer", "overlay_manager/GetPeer", name="ghost")
    assert not miss["found"] and "ghost" in miss["message"]
    listed = robots.call(lab, LAPTOP, f"{N_LAPTOP}/list_peers", "overlay_manager/ListPeers",
                         online_only=True, tag="", path="")
    assert [p["name"] for p in listed["peers"]] == [ROBOT]
    env = robots.call(lab, LAPTOP, f"{N_LAPTOP}/get_ros_env", "overlay_manager/GetRosEnv")
    assert env["ok"] and env["ros_hostname"] == f"{LAPTOP}.fleet.internal"
    assert env["ros_master_uri"] == f"http://{ROBOT}.fleet.internal:11311"
    wait = robots.call(lab, LAPTOP, f"{N_LAPTOP}/wait_for_peer", "overlay_manager/WaitForPeer",
                       name=ROBOT, timeout=20.0, require_direct=True)
    assert wait["ok"], wait["message"]
    bad = robots.call(lab, LAPTOP, f"{N_LAPTOP}/ping_peer", "overlay_manager/PingPeer", name="ghost", count=1,
                      timeout=1.0)
    assert not bad["ok"] and "unknown peer" in bad["message"]
    link = robots.call(lab, LAPTOP, f"{N_LAPTOP}/measure_link", "overlay_manager/MeasureLink", timeout=90,
                       peer=ROBOT, duration=2.0, udp_bitrate=20.0)
    assert link["ok"], link["message"]
    assert link["tcp_throughput_mbps"] > 1 and link["rtt_mean_ms"] > 0 and link["path"] == "direct"
    print(f"measure_link laptop->robot1 direct: {link}")
    pre = robots.call(lab, LAPTOP, f"{N_LAPTOP}/preflight", "overlay_manager/Preflight")
    assert pre["ok"], pre["checks"]
    # NAT summary from a real netcheck against the lab's STUN: building b2 is an EIM NAT with UDP
    st = robots.status(lab, LAPTOP, node=N_LAPTOP, timeout=60, where="m['nat']['known']")
    assert st["nat"]["udp"] and not st["nat"]["hard_nat"], st["nat"]
    assert st["enrolled"] and st["control_reachable"] and st["ros_hostname"] == f"{LAPTOP}.fleet.internal"


def test_hosts_block_keeps_other_lines(two_buildings_robots):
    lab = two_buildings_robots
    text = lab.exec(LAPTOP, ["cat", "/etc/hosts"], quiet=True).stdout
    assert "# BEGIN overlay_manager" in text
    assert f"{lab.overlay_ip(ROBOT)} {ROBOT}.fleet.internal {ROBOT}" in text
    before_block = text.split("# BEGIN overlay_manager")[0]
    assert "localhost" in before_block  # what the lab put there first is still there


def test_topic_flows_across_buildings(two_buildings_robots):
    lab = two_buildings_robots
    pub = lab.popen(ROBOT, ["bash", "-c",
                            f'eval "$(rosrun overlay_manager overlay_env --config {lab.robot_yaml(ROBOT)})" && '
                            "exec rostopic pub -r 20 /e2e_chatter std_msgs/String 'data: hello'"],
                    env=robots.ros_env(lab, ROBOT), log=Path(lab.host_dir(ROBOT)) / "chatter.log")
    try:
        rate = robots.run_probe(lab, LAPTOP, ["rate", "/e2e_chatter", "std_msgs/String", "--seconds", "3",
                                              "--timeout", "60"], timeout=90)
        assert rate["rate_hz"] > 15, rate
    finally:
        robots.stop(lab, pub)


def test_restart_does_not_re_enrol_and_secrets_stay_out_of_logs(two_buildings_robots):
    lab = two_buildings_robots
    before = lab.tailscale_status(LAPTOP)["Self"]
    proc = robots.start_robot(lab, LAPTOP, master=False)  # a second start of the same machine's node
    try:
        msg = robots.peers(lab, LAPTOP, min_peers=1, node=N_LAPTOP, timeout=90)
        assert msg["self_peer"]["dns_name"] == f"{LAPTOP}.fleet.internal"
    finally:
        robots.stop(lab, proc)
    after = lab.tailscale_status(LAPTOP)["Self"]
    assert (after["ID"], after["DNSName"]) == (before["ID"], before["DNSName"])
    log = (Path(lab.host_dir(LAPTOP)) / "robot.launch.log").read_text()
    assert "already enrolled" in log
    secret = Path(lab.auth_key_path(LAPTOP)).read_text().strip()
    assert len(secret) > 10
    for host in (ROBOT, LAPTOP):
        for f in Path(lab.host_dir(host)).rglob("*.log"):
            assert secret not in f.read_text(errors="replace"), f"auth key leaked into {f}"
