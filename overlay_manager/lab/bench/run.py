"""The benchmark (scripts/bench, not a test): four paths between two buildings, side by side.

    source "$(bash scripts/build)/devel/setup.bash"
    sudo -E bash scripts/bench [--quick] [--out artifacts] [--seconds 5] [--udp-mbit 50]

One lab run (two buildings behind ``eim-adpf`` NATs, robot1 in b1 runs roscore via robot.launch;
laptop and laptop2 in b2)::

   laptop/laptop2 (b2 LAN) -- r-b2 NAT -- backbone -- r-b1 NAT -- robot1 (b1 LAN)
                                            |
                                control (headscale, DERP, STUN)

Paths, all from the laptop (client) to robot1 (server, publisher):

``underlay``   no overlay, no encryption. A NAT lets nothing in, so both routers get a "DMZ"
               (1:1 port forward) while this path is measured: new inbound TCP and ICMP (and UDP
               5201 for iperf3) to the building's public address go to its one host. The hosts put
               their building's public address on ``lo`` and ROS uses it as ROS_IP, so ROS works
               both ways (master callbacks, TCPROS) exactly as it would with two static public
               addresses. This is the best case an operator could configure by hand.
``wireguard``  plain WireGuard (wireguard-go + wg, userspace like tailscaled), 10.99.0.1 <->
               10.99.0.2. robot1 listens on UDP 51820 behind a port forward at r-b1; the laptop
               has robot1's public endpoint and a 5 s keepalive, so its own NAT needs no rule
               (replies match the mapping the laptop created). The classic road-warrior setup.
``ts-direct``  tailscale, hole-punched (proved by ``tailscale ping``), ROS with overlay names.
``ts-derp``    tailscale relayed through headscale's embedded DERP (UDP blocked at r-b1).
``ts-peer-relay`` tailscale through the fleet's peer relay relay1 on the campus server network
               (a ``public`` building): r-b1 lets UDP out only to STUN and the relay's port, as a
               campus that opens one UDP port on one server; its relay server is turned on from
               its bundle's ``relay`` key through the LocalAPI, as the node does.

Per path: iperf3 TCP throughput and UDP jitter/loss at a set bitrate (1200-byte datagrams, which
fit every tunnel MTU), ICMP ping RTT, a 640x480 rgb8 30 Hz sensor_msgs/Image topic (delivered
rate, latency = receive time - header.stamp on the same clock) while a geometry_msgs/Twist is sent
at 50 Hz and echoed back (round trip p50/p99), and the time from starting the subscriber to its
first frame. For tailscale also the time from ``robot.launch`` on a never-enrolled laptop to the
first camera frame (enrolment + names + ROS), direct (laptop), with UDP blocked (laptop2) and
through the relay (laptop3).
Impairment sweep on building b1's uplink: loss 0/1/5 % per direction and a 100 Mbit/s rate limit.
Delay and jitter need tc netem; on kernels without sch_netem (this workplace) they are skipped
and the report says so.

Writes artifacts/bench.json, artifacts/bench.md and artifacts/bench_*.png. Everything it starts
is stopped by pid; the lab run is torn down by Lab.down().

This module is the orchestration (one lab run, the order of paths, the sweep); the rest lives in
bench/paths.py (each path's set-up and ROS environment), bench/measure.py (the measurements),
bench/report.py (tables and plots) and overlay_manager/core/stats.py (percentiles and rates).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.lab.bench.measure import Measure
from overlay_manager.lab.bench.paths import (
    B1,
    B2,
    CONTROL_HZ,
    IMAGE_H,
    IMAGE_HZ,
    IMAGE_W,
    IPERF_PORT,
    LAPTOP,
    LAPTOP2,
    LAPTOP3,
    PATHS,
    RELAY,
    ROBOT,
    SPEC,
    WG_PORT,
    PathSetup,
    say,
)
from overlay_manager.lab.bench.report import plot, render_markdown, replot, write_report
from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import REPO_ROOT
from overlay_manager.lab.campus.spec_model import Impairment
from overlay_manager.lab.campus.system import wait_for


def impairments(quick: bool) -> List[Dict[str, float]]:
    """The sweep: loss per direction (percent) and one rate limit, on building b1's uplink."""
    if quick:
        return [{"loss_pct": 0.0}, {"loss_pct": 5.0}]
    return [{"loss_pct": 0.0}, {"loss_pct": 1.0}, {"loss_pct": 5.0}, {"rate_mbit": 100.0}]


def imp_label(imp: Dict[str, float]) -> str:
    """Column label of one sweep step ("loss 5%", "rate 100 Mbit/s")."""
    if imp.get("rate_mbit"):
        return f"rate {imp['rate_mbit']:g} Mbit/s"
    return f"loss {imp.get('loss_pct', 0):g}%"


def run(out_dir: Path, quick: bool = False, seconds: Optional[float] = None, udp_mbit: float = 50.0,
        run_id: Optional[str] = None) -> Dict[str, Any]:
    """The whole benchmark; returns the JSON data (also written to out_dir)."""
    t_run = time.monotonic()
    seconds = seconds or (2.0 if quick else 5.0)
    sweep = impairments(quick)
    results: Dict[str, Dict[str, Any]] = {p: {} for p in PATHS}
    launch: Dict[str, Any] = {}
    lab = Lab(SPEC, run_id=run_id)
    procs: List[subprocess.Popen] = []
    paths = PathSetup(lab)
    measure = Measure(lab, paths, seconds, udp_mbit)
    notes: List[str] = []
    try:
        lab.up()
        netem = lab.netem_available()
        if not netem:
            notes.append("this kernel has no sch_netem: delay and jitter cannot be emulated, so the sweep "
                         "covers loss (nftables) and rate (tbf) only")
        lab.popen(ROBOT, ["iperf3", "-s", "-p", str(IPERF_PORT)], log=Path(lab.host_dir(ROBOT)) / "iperf3.log")
        say("robot.launch on robot1 (master)")
        procs.append(robots.start_robot(lab, ROBOT, master=True))
        robots.peers(lab, ROBOT, timeout=90, node=overlay_node(ROBOT))
        paths.start_robot_helper("ts-direct")

        def cold_launch(host: str, path: str) -> Dict[str, Any]:
            say(f"robot.launch on never-enrolled {host}; timing its first frame ({path})")
            t0 = time.time()
            procs.append(robots.start_robot(lab, host, master=False))
            r = measure.operator(path, host=host, t0=t0, first_only=True, timeout=120)
            return {"launch_to_first_frame_s": r["first_frame_s"], "subscriber_start_s": r["subscriber_start_s"]}

        launch["ts-direct"] = cold_launch(LAPTOP, "ts-direct")
        wait_for("a direct path laptop -> robot1", lambda: measure.ts_path() == "direct", 60)

        def sweep_path(path: str, ros: bool = True) -> None:
            for imp in sweep:
                label = imp_label(imp)
                say(f"{path}: {label}")
                lab.impair(B1, Impairment(**imp) if any(imp.values()) else None)
                try:
                    results[path][label] = measure.measure(path, ros=ros)
                finally:
                    lab.impair(B1, None)
                say(f"{path} {label}: {json.dumps(results[path][label])}")

        def relayed_path(path: str, ts_path: str, host: str, timeout: float) -> None:
            """Once tailscale proves ``ts_path``: robot1's helper, ``host``'s cold launch, the sweep."""
            wait_for(f"the laptop -> robot1 path to turn {ts_path}", lambda: measure.ts_path() == ts_path, timeout)
            paths.start_robot_helper(path)
            launch[path] = cold_launch(host, path)
            sweep_path(path)
            paths.stop_robot_helper(path)

        sweep_path("ts-direct")
        # --- DERP
        paths.stop_robot_helper("ts-direct")
        lab.block_udp(B1)
        relayed_path("ts-derp", "derp", LAPTOP2, 60)
        # --- peer relay: UDP out of b1 only to the campus servers (STUN, the relay's port)
        say("relay1: enrol, relay server on from its bundle")
        lab.tailscale_up(RELAY)
        lab.enable_relays()
        lab.unblock_udp(B1)
        lab.udp_servers_only(B1)
        relayed_path("ts-peer-relay", "peer-relay", LAPTOP3, 90)
        lab.unblock_udp(B1)
        # --- plain WireGuard
        paths.dmz(B1, ROBOT, [WG_PORT], tcp_icmp=False)
        paths.wireguard_up()
        paths.start_robot_helper("wireguard")
        sweep_path("wireguard")
        paths.stop_robot_helper("wireguard")
        paths.wireguard_down()
        # --- underlay with port forwards (DMZ) in both buildings
        paths.dmz(B1, ROBOT, [IPERF_PORT], tcp_icmp=True)
        paths.dmz(B2, LAPTOP, [], tcp_icmp=True)
        for h in (ROBOT, LAPTOP):
            paths.lo_alias(h, True)
        try:
            paths.start_robot_helper("underlay")
            sweep_path("underlay")
            paths.stop_robot_helper("underlay")
        finally:
            for h in (ROBOT, LAPTOP):
                paths.lo_alias(h, False)
            paths.undmz(B1)
            paths.undmz(B2)
    finally:
        paths.stop_all()
        for p in reversed(procs):
            robots.stop(lab, p)
        lab.down()
    data = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "quick": quick, "seconds_per_test": seconds,
                     "udp_mbit": udp_mbit, "image": f"{IMAGE_W}x{IMAGE_H} rgb8 {IMAGE_HZ:g} Hz",
                     "control_hz": CONTROL_HZ, "cores": os.cpu_count(), "netem": netem,
                     "impairment_link": "b1 uplink (both directions)", "run_seconds": time.monotonic() - t_run,
                     "notes": notes},
            "sweep": [imp_label(i) for i in sweep], "paths": list(PATHS), "results": results, "launch": launch}
    write_report(out_dir, "bench", data, render_markdown, plot)
    return data


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point (scripts/bench)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="bench", description="underlay vs WireGuard vs tailscale direct vs "
                                 "DERP in the campus lab (root; a fresh lab run, ~6 min, --quick ~2.5 min)")
    ap.add_argument("--quick", action="store_true", help="2 s tests, loss 0 and 5 %% only")
    ap.add_argument("--seconds", type=float, default=None, help="per iperf3/camera test (default 5, quick 2)")
    ap.add_argument("--udp-mbit", type=float, default=50.0, help="iperf3 UDP bitrate (default 50)")
    ap.add_argument("--out", default=str(REPO_ROOT / "artifacts"))
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--replot", metavar="JSON", help="only re-render bench.md and plots from a bench.json")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.replot:
        return replot(Path(a.replot), out, "bench", render_markdown, plot)
    if os.geteuid() != 0:
        print("bench: needs root (network namespaces)", file=sys.stderr)
        return 2
    try:
        data = run(out, quick=a.quick, seconds=a.seconds, udp_mbit=a.udp_mbit, run_id=a.run_id)
    except LabError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    print(render_markdown(data))
    say(f"wrote {out / 'bench.json'}, bench.md, bench_paths.png, bench_sweep.png "
        f"({data['meta']['run_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
