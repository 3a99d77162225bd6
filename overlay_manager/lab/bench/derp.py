"""Benchmark of the fleet's own DERP regions (scripts/bench_derp, not a test).

    sudo -E bash scripts/bench_derp capacity [--pairs 3] [--seconds 5] [--out artifacts]
    sudo -E bash scripts/bench_derp outage [--outage 60] [--kill 30] [--out artifacts]

``capacity`` (config/lab/derp_bench.yaml): relayed pairs a<i> (building north, symmetric NAT) ->
b<i> (south, symmetric NAT), every link derp, regions east and west on two campus server
networks. In one run, for 1..``--pairs`` concurrent pairs: every machine's home region pinned to
east (one region carries everything), then pairs spread over east and west (pair i on region
i mod 2). Per phase: iperf3 TCP a<i> -> b<i> over the overlay, all pairs at once (aggregate
Mbit/s), then one 320x240 rgb8 30 Hz camera stream per pair at once (each pair its own roscore on
a<i>; received Hz at b<i>). Homes are pinned with ``tailscale debug force-prefer-derp`` (then
``debug restun``) and checked in each host's status before measuring. Reports the two-region /
one-region ratio per pair count and, per phase, the CPU seconds of each derper and of all
tailscaleds and the machine's busy share during iperf3 (where it saturates).

``outage`` (config/lab/derp_campus.yaml, as the system test with the goal's durations): the camera
and a Twist round trip alpha-robot1 -> alpha-op1 over derp while headscale is down ``--outage``
seconds, then while the derper of alpha-op1's home region is down ``--kill`` seconds, first with
both ends homed on that region (the worst case: both re-home), then with them on different
regions. Per-second camera rates, gaps and the seconds until the camera is back at 25 Hz.

Writes ``<out>/bench_derp_<cmd>.json`` and prints a Markdown table. Absolute numbers depend on
what else runs on the machine's cores; ratios from one run are what to compare.
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.derp_outage import home_region, run_outage
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import REPO_ROOT
from overlay_manager.lab.campus.system import wait_for

BENCH_SPEC = REPO_ROOT / "config" / "lab" / "derp_bench.yaml"
CAMPUS_SPEC = REPO_ROOT / "config" / "lab" / "derp_campus.yaml"
REGION_IDS = {"east": 901, "west": 902}
DERPERS = {"east": "east-derp", "west": "west-derp"}
CAMERA_HZ_GOAL = 25.0


def pin_home(lab: Lab, hosts: Sequence[str], region: str, timeout: float = 40.0) -> None:
    """Make ``region`` the home DERP region of each of ``hosts`` (tailscale debug
    force-prefer-derp + restun) and wait until each one's status says so."""
    for h in hosts:
        lab.exec(h, ["tailscale", "debug", "force-prefer-derp", str(REGION_IDS[region])], quiet=True)
        lab.exec(h, ["tailscale", "debug", "restun"], quiet=True, check=False)
    for h in hosts:
        wait_for(f"{h} to home on region {region}", lambda h=h: home_region(lab, h) == region, timeout,
                 interval=0.5, detail=lambda h=h: f"home now {home_region(lab, h)!r}")


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far (/proc/<pid>/stat); 0 if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_sample(lab: Lab) -> Dict[str, float]:
    """CPU seconds so far: each derper (by region), all tailscaleds together, and the machine's
    busy and total time (/proc/stat, every core)."""
    out: Dict[str, float] = {}
    for region, host in DERPERS.items():
        proc = lab.procs.procs.get(f"derper:{host}")
        if proc is not None:
            out[f"derper_{region}"] = _proc_cpu_s(proc.pid)
    out["tailscaleds"] = sum(_proc_cpu_s(p.pid) for k, p in lab.procs.procs.items() if k.startswith("tailscaled:"))
    vals = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    out["machine_busy"], out["machine_total"] = (sum(vals) - idle) / tick, sum(vals) / tick
    return out


def cpu_delta(a: Dict[str, float], b: Dict[str, float]) -> Dict[str, float]:
    """CPU seconds used between two samples, and the machine's busy share (0..1) in that time."""
    out = {k: round(b[k] - a.get(k, 0.0), 2) for k in b if k not in ("machine_busy", "machine_total")}
    total = b["machine_total"] - a["machine_total"]
    out["machine_busy_share"] = round((b["machine_busy"] - a["machine_busy"]) / total, 2) if total > 0 else 0.0
    return out


def iperf_pairs(lab: Lab, pairs: Sequence[int], seconds: float) -> Dict[str, Any]:
    """iperf3 TCP a<i> -> b<i> for every pair at once; per-pair and aggregate Mbit/s."""
    results: Dict[int, float] = {}
    errors: List[str] = []

    def one(i: int) -> None:
        res = lab.exec(f"a{i}", ["iperf3", "-c", lab.overlay_ip(f"b{i}"), "-t", str(seconds), "-J"],
                       timeout=seconds + 30, check=False, quiet=True)
        try:
            results[i] = json.loads(res.stdout)["end"]["sum_received"]["bits_per_second"] / 1e6
        except (ValueError, KeyError, TypeError):
            errors.append(f"pair {i}: {res.stdout[-300:]} {res.stderr[-300:]}")

    threads = [threading.Thread(target=one, args=(i,)) for i in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    return {"per_pair_mbps": {str(i): round(v, 1) for i, v in sorted(results.items())},
            "aggregate_mbps": round(sum(results.values()), 1), "errors": errors}


def camera_pairs(lab: Lab, pairs: Sequence[int], seconds: float) -> Dict[str, Any]:
    """One 320x240 rgb8 30 Hz camera per pair (a<i> -> b<i>, roscore on a<i>), all at once:
    received Hz at each b<i>."""
    results: Dict[int, Any] = {}

    def one(i: int) -> None:
        try:
            rate = robots.run_probe(lab, f"b{i}", ["rate", "/camera/image_raw", "sensor_msgs/Image", "--seconds",
                                                   str(seconds), "--timeout", "30"], timeout=seconds + 60)
            results[i] = round(rate["rate_hz"], 1)
        except LabError as exc:
            results[i] = f"error: {exc}"[:200]

    threads = [threading.Thread(target=one, args=(i,)) for i in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 90)
    hz = [v for v in results.values() if isinstance(v, float)]
    return {"per_pair_hz": {str(i): v for i, v in sorted(results.items())},
            "total_hz": round(sum(hz), 1), "min_hz": min(hz) if hz else 0.0}


def capacity(args: argparse.Namespace) -> Dict[str, Any]:
    """The ``capacity`` run (see the module doc)."""
    out: Dict[str, Any] = {"pairs": args.pairs, "seconds": args.seconds, "phases": []}
    with Lab(BENCH_SPEC, workdir=Path(args.out) / "lab-derp-capacity") as lab:
        lab.start_derpers()
        hosts = [h for h in lab.hosts if h not in DERPERS.values()]
        lab.tailscale_up_all(timeout=90)
        procs: List[Any] = []
        try:
            for i in range(1, args.pairs + 1):
                procs.append(lab.popen(f"b{i}", ["iperf3", "-s", "-B", lab.overlay_ip(f"b{i}")]))
                procs.append(robots.start_robot(lab, f"a{i}", master=True))
            for i in range(1, args.pairs + 1):
                robots.peers(lab, f"a{i}", timeout=120, node=overlay_node(f"a{i}"))
                # b<i> runs no node: write its overlay-names block once, as overlay_env does at boot
                lab.exec(f"b{i}", ["bash", "-c", f"rosrun overlay_manager overlay_env --config "
                                                 f"{lab.robot_yaml(f'b{i}')} --write-hosts"], quiet=True)
                procs.append(robots.start_camera(lab, f"a{i}", "/camera/image_raw", 30.0, width=320, height=240))
            for layout in ("one", "two"):
                for n in range(1, args.pairs + 1):
                    pairs = list(range(1, n + 1))
                    for i in range(1, args.pairs + 1):
                        region = "east" if layout == "one" else ("east" if i % 2 else "west")
                        pin_home(lab, [f"a{i}", f"b{i}"], region)
                    for i in pairs:  # a first packet so every link is known to be derp
                        lab.ping(f"a{i}", f"b{i}", count=2, until_direct=False)
                    cpu0 = cpu_sample(lab)
                    ip = iperf_pairs(lab, pairs, args.seconds)
                    cpu1 = cpu_sample(lab)
                    cam = camera_pairs(lab, pairs, args.seconds)
                    phase = {"regions": 1 if layout == "one" else 2, "pairs": n, "iperf": ip, "camera": cam,
                             "cpu_s_during_iperf": cpu_delta(cpu0, cpu1),
                             "homes": {h: home_region(lab, h) for h in hosts}}
                    lab.echo(f"capacity: {json.dumps(phase)}")
                    out["phases"].append(phase)
        finally:
            for p in reversed(procs):
                robots.stop(lab, p)
    ratio = {}
    for n in range(1, args.pairs + 1):
        one = next(p for p in out["phases"] if p["regions"] == 1 and p["pairs"] == n)
        two = next(p for p in out["phases"] if p["regions"] == 2 and p["pairs"] == n)
        a, b = one["iperf"]["aggregate_mbps"], two["iperf"]["aggregate_mbps"]
        ratio[str(n)] = round(b / a, 2) if a else None
    out["two_over_one_region"] = ratio
    return out


def outage(args: argparse.Namespace) -> Dict[str, Any]:
    """The ``outage`` run (see the module doc)."""
    master, op = "alpha-robot1", "alpha-op1"
    nodes = [overlay_node(op), overlay_node(master)]
    out: Dict[str, Any] = {"outage_s": args.outage, "kill_s": args.kill}
    with Lab(CAMPUS_SPEC, workdir=Path(args.out) / "lab-derp-outage") as lab:
        lab.start_derpers()
        procs: List[Any] = []
        try:
            robots.start_master_then(lab, master, [op], procs)
            procs.append(robots.start_camera(lab, master, "/camera/image_raw", 30.0, width=320, height=240))
            procs.append(robots.start_echo(lab, master))
            run = run_outage(lab, op, master, nodes, "/camera/image_raw", "headscale",
                             ("headscale stopped", lab.headscale_stop), ("headscale started", lab.headscale_start),
                             before_s=10.0, outage_s=args.outage, after_s=10.0)
            out["headscale_down"] = run.summary(CAMERA_HZ_GOAL)
            lab.echo(f"outage: {json.dumps(out['headscale_down'])}")
            wait_for("headscale to answer", lambda: lab.deployment().cli().health(), 30)
            for case, homes in (("same_region", ("east", "east")), ("split_regions", ("west", "east"))):
                pin_home(lab, [master], homes[0])
                pin_home(lab, [op], homes[1])
                victim = DERPERS[homes[1]]
                run = run_outage(lab, op, master, nodes, "/camera/image_raw", f"kill-{case}",
                                 (f"derper {victim} killed", lambda v=victim: lab.stop_derper(v)),
                                 (f"derper {victim} started", lambda v=victim: lab.start_derper(v)),
                                 before_s=10.0, outage_s=args.kill, after_s=10.0)
                m = run.summary(CAMERA_HZ_GOAL)
                m["homes_before"] = {master: homes[0], op: homes[1]}
                m["homes_after"] = {master: home_region(lab, master), op: home_region(lab, op)}
                out[f"derper_killed_{case}"] = m
                lab.echo(f"outage: {case}: {json.dumps(m)}")
                for h in (master, op):  # unpin
                    lab.exec(h, ["tailscale", "debug", "force-prefer-derp", "0"], quiet=True)
        finally:
            for p in reversed(procs):
                robots.stop(lab, p)
    return out


def markdown(cmd: str, res: Dict[str, Any]) -> str:
    """A short Markdown summary of a result."""
    lines = []
    if cmd == "capacity":
        lines += ["| regions | pairs | aggregate iperf3 Mbit/s | per pair | camera Hz per pair | CPU s during iperf |",
                  "|---|---|---|---|---|---|"]
        for p in res["phases"]:
            lines.append(f"| {p['regions']} | {p['pairs']} | {p['iperf']['aggregate_mbps']} | "
                         f"{p['iperf']['per_pair_mbps']} | {p['camera']['per_pair_hz']} | "
                         f"{p['cpu_s_during_iperf']} |")
        lines.append(f"\ntwo regions / one region (aggregate): {res['two_over_one_region']}")
    else:
        lines += ["| scenario | baseline Hz | longest gap s | back at 25 Hz after s | min Hz from 10 s "
                  "| Twist p50/p99 ms |", "|---|---|---|---|---|---|"]
        for k, m in res.items():
            if isinstance(m, dict) and "rates_hz" in m:
                tw = m["twist"]
                p50 = f"{tw['rtt_p50_ms']:.0f}" if tw.get("rtt_p50_ms") is not None else "-"
                p99 = f"{tw['rtt_p99_ms']:.0f}" if tw.get("rtt_p99_ms") is not None else "-"
                lines.append(f"| {k} | {m['baseline_hz']} | {m['gap_after_break_s']} | {m['resume_after_break_s']} "
                             f"| {m['min_hz_after_10s_of_break']} | {p50}/{p99} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of scripts/bench_derp."""
    ap = argparse.ArgumentParser(prog="bench_derp", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capacity", help="relayed throughput and camera streams, one region vs two")
    c.add_argument("--pairs", type=int, default=3)
    c.add_argument("--seconds", type=float, default=5.0)
    o = sub.add_parser("outage", help="headscale down, a region's derper killed: the camera and Twist")
    o.add_argument("--outage", type=float, default=60.0, help="seconds headscale is down")
    o.add_argument("--kill", type=float, default=30.0, help="seconds a derper is down")
    for p in (c, o):
        p.add_argument("--out", default="artifacts")
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    res = capacity(args) if args.cmd == "capacity" else outage(args)
    res["wall_s"] = round(time.monotonic() - t0, 1)
    path = Path(args.out) / f"bench_derp_{args.cmd}.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(markdown(args.cmd, res))
    print(f"written: {path}")
    return 0

if __name__ == "__main__":
    import sys

    sys.exit(main())
