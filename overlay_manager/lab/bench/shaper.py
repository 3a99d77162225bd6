"""What the topic shaper costs on the robot (not a test): CPU and memory of the ``topic_shaper``
process while it serves a real 355,755-point coloured cloud at 10 Hz (lab/probe/mix_data.py, from
opencv-doc's Aloe stereo pair) to one viewer, on one machine with a private roscore.

    bash scripts/bench_shaper [--seconds 30] [--modes derp,derp-decimate,direct] [--out artifacts]

The viewer (``unshape`` plus the mix's ``ages`` probe) runs as host 127.0.0.2, which a latched fake
``~peers`` names as the peer "laptop" on the mode's path, so the shaper shapes for it as for a
real relayed or direct viewer:

    derp            lossless: zstd, rate fitted to the derp budget (4000 kbit/s)
    derp-decimate   the same with ``lossy: decimate`` (lossy_below_hz 2)
    direct          no budget: every cloud compressed, the heaviest case

Per mode, after a warm-up: the shaper's CPU (utime + stime from /proc, in % of one core), its
resident memory (VmRSS) sampled every second (first, last, largest, slope in MB per minute, every
10th sample as a series), and
what the viewer got (rate, latency, newest-message age, bytes) and each tier's stream_state.
Writes ``<out>/bench_shaper.json`` and prints one line per mode. Processes are started and stopped by pid.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from overlay_manager.system import children
from overlay_manager.system.waiting import wait_for

MODES = {
    "derp": {"path": "derp", "params": []},
    "derp-decimate": {"path": "derp", "params": ["_lossy:=decimate", "_lossy_below_hz:=2"]},
    "direct": {"path": "direct", "params": []},
}
CLOUD = "/robot/points"
PEERS = "/bench_shaper/peers"
ROBOT_HOST, VIEWER_HOST = "127.0.0.1", "127.0.0.2"
WARMUP_S = 8.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    """utime + stime of `pid` in seconds (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def slope_per_min(ts: List[float], ys: List[float]) -> float:
    n = len(ts)
    if n < 2:
        return float("nan")
    mt, my = sum(ts) / n, sum(ys) / n
    den = sum((t - mt) ** 2 for t in ts)
    return 60.0 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / den if den else float("nan")


def peers(path: str) -> None:
    """The ``peers`` command: latch a PeerList naming this host's viewer 'laptop' on `path`."""
    import rospy

    from overlay_manager.msg import Peer, PeerList

    rospy.init_node("bench_shaper_peers", anonymous=True)
    msg = PeerList()
    msg.header.stamp = rospy.Time.now()
    msg.self_peer = Peer(name="robot", dns_name="robot.fleet.internal", addresses=["100.64.0.1"], online=True,
                         path=Peer.PATH_SELF)
    msg.peers = [Peer(name="laptop", dns_name="laptop.fleet.internal", addresses=[VIEWER_HOST], online=True,
                      active=True, path=path)]
    pub = rospy.Publisher(PEERS, PeerList, queue_size=1, latch=True)
    pub.publish(msg)
    rospy.spin()


def run_mode(name: str, seconds: float, env: Dict[str, str], out: Path) -> Dict[str, Any]:
    mode = MODES[name]
    robot = dict(env, ROS_HOSTNAME=ROBOT_HOST)
    viewer = dict(env, ROS_HOSTNAME=VIEWER_HOST)
    logs = out / f"bench_shaper_{name}"
    logs.mkdir(parents=True, exist_ok=True)
    procs = []

    def start(argv: List[str], e: Dict[str, str], log: str) -> subprocess.Popen:
        p = children.spawn(argv, env=e, stdout=open(logs / log, "w"), stderr=subprocess.STDOUT)
        procs.append(p)
        return p
    try:
        start([sys.executable, "-m", "overlay_manager.lab.bench.shaper", "peers", "--path", mode["path"]], robot,
              "peers.log")
        shaper = start(["rosrun", "overlay_manager", "topic_shaper", f"_topics:={CLOUD}", f"_peers_topic:={PEERS}",
                        "__name:=bench_topic_shaper"] + mode["params"], robot, "topic_shaper.log")
        start(["rosrun", "overlay_manager", "unshape", f"in:={CLOUD}/shaped", f"out:={CLOUD}_view",
               "__name:=bench_unshape"], viewer, "unshape.log")
        ages = subprocess.Popen([sys.executable, "-m", "overlay_manager.lab.probe.mix_nodes", "ages", "--topic",
                                 f"{CLOUD}_view", "--seconds", str(seconds + WARMUP_S), "--timeout", "60"],
                                env=viewer, stdout=subprocess.PIPE, stderr=open(logs / "ages.log", "w"), text=True)
        procs.append(ages)
        # the shaper's state says when the viewer is served; the warm-up then starts
        time.sleep(WARMUP_S)
        t0, c0 = time.monotonic(), proc_cpu_s(shaper.pid)
        ts, rss = [], []
        while time.monotonic() - t0 < seconds:
            ts.append(time.monotonic() - t0)
            rss.append(proc_rss_mb(shaper.pid))
            time.sleep(1.0)
        cpu = 100.0 * (proc_cpu_s(shaper.pid) - c0) / (time.monotonic() - t0)
        got_text, _ = ages.communicate(timeout=seconds + 120)
        got = json.loads(got_text.strip().splitlines()[-1]) if got_text.strip() else {}
        view = (got.get("topics") or {}).get(f"{CLOUD}_view", got)
        # each tier's stream_state (the viewer reads the full tier on a direct path)
        states = {}
        for tier, topic in (("fitted", f"{CLOUD}/shaped"), ("full", f"{CLOUD}/shaped/full")):
            try:
                text = subprocess.run(["rostopic", "echo", "-n1", f"{topic}/stream_state"], env=robot,
                                      capture_output=True, text=True, timeout=10).stdout
            except subprocess.TimeoutExpired:
                text = ""  # that tier never published a state
            states[tier] = {k.strip(): v.strip().strip('"') for k, _, v in
                            (line.partition(":") for line in text.splitlines()[:40])
                            if k.strip() in ("format", "rate_hz", "output_rate_hz", "bitrate_kbps", "frame_bytes",
                                             "encode_ms", "reason")}
        return {
            "mode": name, "path": mode["path"], "seconds": round(time.monotonic() - t0, 1),
            "cpu_percent_of_core": round(cpu, 2),
            "rss_mb": {"first": round(rss[0], 1), "last": round(rss[-1], 1), "max": round(max(rss), 1),
                       "slope_mb_per_min": round(slope_per_min(ts, rss), 3),
                       "series": [[round(t, 1), round(m, 1)] for t, m in zip(ts, rss)][::10]},
            "viewer": {k: view.get(k) for k in ("rate_hz", "latency_p50_ms", "latency_p99_ms", "age_p99_ms",
                                                "bytes_p50", "kbps")},
            "stream_state": states,
        }
    finally:
        for p in reversed(procs):
            children.stop(p)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_shaper", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    pp = sub.add_parser("peers", help="(internal) the fake ~peers")
    pp.add_argument("--path", required=True)
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per mode (after a warm-up)")
    ap.add_argument("--modes", default="derp,derp-decimate,direct", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--out", default="artifacts", help="folder for bench_shaper.json and the logs")
    args = ap.parse_args(argv)
    if args.cmd == "peers":
        peers(args.path)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown {bad} (known: {', '.join(MODES)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = dict(os.environ, ROS_MASTER_URI=f"http://127.0.0.1:{port}", ROS_HOSTNAME=ROBOT_HOST)
    core = children.spawn(["roscore", "-p", str(port)], env=env, stdout=open(out / "bench_shaper_roscore.log", "w"),
                          stderr=subprocess.STDOUT)
    results = []
    try:
        wait_for("roscore", lambda: subprocess.run(["rosparam", "get", "/run_id"], env=env, capture_output=True,
                                                   timeout=10).returncode == 0, 30.0, interval=0.5)
        pub = children.spawn([sys.executable, "-m", "overlay_manager.lab.probe.mix_nodes", "publish", "--ns",
                              "/robot", "--scan-hz", "0", "--grid-hz", "0"], env=env,
                             stdout=open(out / "bench_shaper_publish.log", "w"), stderr=subprocess.STDOUT)
        try:
            wait_for("the mix publisher's cloud", lambda: "points" in (out / "bench_shaper_publish.log").read_text(),
                     120.0, interval=0.5)
            load = os.getloadavg()
            for m in modes:
                r = run_mode(m, args.seconds, env, out)
                r["load_before"] = [round(x, 2) for x in load]
                r["load_after"] = [round(x, 2) for x in os.getloadavg()]
                results.append(r)
                print(f"[bench_shaper] {m}: CPU {r['cpu_percent_of_core']:.1f} % of a core, RSS "
                      f"{r['rss_mb']['first']}->{r['rss_mb']['last']} MB (max {r['rss_mb']['max']}, "
                      f"{r['rss_mb']['slope_mb_per_min']} MB/min), viewer {r['viewer']}, state {r['stream_state']}, "
                      f"load {r['load_before']} -> {r['load_after']}", flush=True)
                load = os.getloadavg()
        finally:
            children.stop(pub)
    finally:
        children.stop(core)
        (out / "bench_shaper.json").write_text(json.dumps({"results": results, "cpus": os.cpu_count()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
