"""Benchmark of the overlay node (not a test): path-change latency in the lab, CPU and memory.

    source "$(bash scripts/build)/devel/setup.bash"
    sudo -E scripts/bench_node [--trials 3] [--cpu-seconds 60] [--peers 10,100,500,1000]
                               [--topic-peers 5] [--no-ipn-bus] [--subscribers] [--node-param KEY=VALUE ...]
                               [--skip-path|--skip-cpu]

1. Path-change latency (config/lab/two_buildings.yaml, a fresh lab run). robot.launch on alpha-robot1
   (master) and alpha-laptop, direct path proved with ~ping_peer, ICMP pings over the overlay from the
   laptop at 5 Hz the whole time. Per trial: UDP blocked at building b1, then unblocked. Inside the
   laptop's namespace two watchers run: one reads tailscaled's LocalAPI status at 50 Hz and prints
   the robot's path when it changes (classified exactly as the node does, peers.parse_status:
   derp = Active without CurAddr/PeerRelay); one subscribes to /alpha_laptop/overlay_manager/path_changes.
   Both stamp with time.time() (CLOCK_REALTIME of this machine), so
   ``t_ros - t_ts`` is the node's own latency and ``t_ts - t_block`` is tailscaled's.
2. CPU and memory. The real node (rosrun overlay_manager overlay_manager_node) against a fake
   tailscaled (overlay_manager/testing/tsfake.py) serving N peers cloned from test/data/status_direct.json and
   answering disco pings; own roscore. Both run in a private network namespace that has only
   loopback (plus the node's "overlay" address 100.64.0.1 on lo, so that preflight passes as on a
   real machine): nothing leaves this machine. Default node settings, iperf_server false.
   ``--topic-peers`` of the peers (default 5) carry a ROS topic to this machine, as in a fleet
   where a few robots stream to an operator: their overlay IPs are added to lo, one publisher
   per peer advertises itself on its peer's overlay IP and one subscriber on the node's machine
   listens, so the node's topic-link map finds those peers (and pings only them and the master).
   Their byte counters and LastWrite grow every 0.5 s as a real tailscaled's do while they
   stream. The fake serves tailscaled's IPN bus (watch-ipn-bus), as v1.102.5 does, unless
   ``--no-ipn-bus`` (then the node reads the status at poll_rate). ``--node-param`` sets one of
   the node's private parameters for the CPU runs (e.g. ``bus_poll_rate=1``).
   /proc/<pid>/stat and /proc/<pid>/status are sampled every second.

Writes artifacts/bench_node.json and prints a markdown table. Everything it starts is stopped by
pid; the lab run is torn down by Lab.down().

This module is the command line and the order of the runs; the rest lives in path.py (1.),
cpu.py (2., with the fake tailscaled and the topic publishers), ns.py (the helpers that run inside
a namespace: ``bench_node _watch-status`` etc.), report.py (summary and table) and common.py
(paths, progress lines, the children's environment).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from overlay_manager.lab.bench.node.common import REPO, say
from overlay_manager.lab.bench.node.cpu import cpu_bench
from overlay_manager.lab.bench.node.ns import HELPERS
from overlay_manager.lab.bench.node.path import path_bench
from overlay_manager.lab.bench.node.report import summarize_path, table

OUT = REPO / "artifacts" / "bench_node.json"


def main(argv: Optional[List[str]] = None) -> int:
    """scripts/bench_node entry point (and the in-namespace helpers, whose names start with _)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in HELPERS:
        return HELPERS[argv[0]](argv[1:])

    ap = argparse.ArgumentParser(prog="bench_node", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3, help="block/unblock cycles (default 3)")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for each path change")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds on a stable path before each action")
    ap.add_argument("--cpu-seconds", type=float, default=60.0, help="sampling window per peer count")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after the node is up before sampling")
    ap.add_argument("--peers", default="10,100,500,1000", help="peer counts for the CPU benchmark (comma list)")
    ap.add_argument("--node-param", action="append", default=[], metavar="KEY=VALUE",
                    help="a private parameter of the node for the CPU runs, e.g. bus_poll_rate=1 (repeatable)")
    ap.add_argument("--no-ipn-bus", action="store_true",
                    help="the fake tailscaled does not serve watch-ipn-bus (like tailscaled before the bus)")
    ap.add_argument("--topic-peers", type=int, default=5,
                    help="how many of the peers stream a topic to the node's machine (default 5)")
    ap.add_argument("--subscribers", action="store_true",
                    help="CPU runs: subscribe to ~peers, ~status and /diagnostics while sampling")
    ap.add_argument("--skip-path", action="store_true")
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        say("needs root (network namespaces, the lab)")
        return 2
    if not os.environ.get("ROS_PACKAGE_PATH") or subprocess.run(
            ["rospack", "find", "overlay_manager"], capture_output=True).returncode != 0:
        say('ROS env missing: source "$(bash scripts/build)/devel/setup.bash" first')
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks

    result: Dict[str, Any] = {"started": time.time(), "host": os.uname().nodename, "cpus": os.cpu_count(),
                              "loadavg_start": os.getloadavg()}
    try:
        lab_runs = sorted(n for n in os.listdir("/run/overlay-lab")) if os.path.isdir("/run/overlay-lab") else []
    except OSError:
        lab_runs = []
    result["other_lab_runs_at_start"] = lab_runs
    if lab_runs:
        say(f"note: other lab runs are up ({', '.join(lab_runs)}): they share the CPUs")
    out_path = Path(a.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["loadavg_end"] = os.getloadavg()
        out_path.write_text(json.dumps(result, indent=1, default=str) + "\n")

    rc = 0
    if not a.skip_path:
        p = path_bench(a.trials, a.timeout, a.settle)
        p["summary"] = summarize_path(p)
        result["path_change"] = p
        rc |= 1 if p["errors"] else 0
        save()
    if not a.skip_cpu:
        result["cpu"] = []
        for n in [int(x) for x in a.peers.split(",") if x.strip()]:
            try:
                result["cpu"].append(cpu_bench(n, a.cpu_seconds, a.warmup, a.topic_peers, not a.no_ipn_bus,
                                               a.node_param, a.subscribers))
            except Exception as exc:  # noqa: BLE001 - report it and go on with the next size
                say(f"[{n} peers] failed: {exc}")
                result["cpu"].append({"peers": n, "error": str(exc)})
                rc |= 1
            save()
    save()
    print(table(result))
    say(f"wrote {out_path}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
