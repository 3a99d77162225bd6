"""A robot's sensor mix through one relayed 30 Mbit/s uplink (benchmark, not a test).

    bash scripts/bench_mix [--out artifacts] [--seconds 40] [--modes shaped,throttle,raw]
                           [--uplink-mbit 30] [--scene real|synthetic] [--viewers relayed,direct]
                           [--no-direct] [--pacing-factor F] [--camera-pacing-factor F]
    bash scripts/bench_mix --replot artifacts/bench_mix.json [--out DIR]

The campus of campus/robot_mix.py: alpha-robot1 (UDP blocked at its router, uplink tbf 30
Mbit/s) publishes an H.264 camera (the real video scene through the link-aware encoder), a 10 Hz
355,755-point coloured cloud, a 40 Hz 1282-beam scan and a 1 Hz 2564 x 2220 occupancy grid made
from a real stereo scene (probe/mix_data.py), and echoes Twist; ops-laptop in another building
(its link derp) and lab-laptop on the robot's LAN (direct) view the mix at the same time, while
ops-laptop runs a 50 Hz Twist round trip. One mode after the other (modes of campus/robot_mix.py: raw,
throttle = topic_tools throttle set by hand, shaped = the robot's topic shaper, the relayed
laptop taking ``<topic>/shaped``);
the direct laptop takes the raw topics in every mode. ``--viewers`` picks who views (``relayed``
alone is ``--no-direct``; ``direct`` alone keeps the Twist round trip from the relayed laptop), so
each path's goals can also be measured without the other viewer's load on the same cores.

Per mode and viewer, per topic (probe/mix_nodes.py ``ages``): rate, message latency p50/p99
(the age a message has when it arrives), the age of the newest message p50/p99 (sampled 20 times
a second: what "show the latest" shows), message size, payload rate, latency growth (last quarter
of the window minus the first: a growing queue) and a per-second series; the Twist round trip
p50/p99. Goals (the relayed viewer, :data:`GOALS`): Twist p99 <= 50 ms, camera >= 25 Hz, every
heavy topic's message age p99 <= 500 ms and no queue growth (<= 100 ms); the direct viewer: every
topic at its nominal rate (>= 90 %) with full content (the message size the robot publishes).

Writes out/bench_mix.json, bench_mix.md, bench_mix.png (bars per mode) and
bench_mix_series.png (latency over time per topic and mode). Needs root (network namespaces).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from overlay_manager.lab.bench.report import replot, write_report
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.robot_mix import (
    DIRECT,
    HEAVY,
    MODES,
    NOMINAL_HZ,
    RELAYED,
    ROBOT,
    SHAPER_PARAMS,
    SPEC,
    THROTTLE_HZ,
    UPLINK_MBIT,
    RobotMix,
    goal_rows,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
GOALS = {"rtt_p99_ms": 50.0, "camera_hz": 25.0, "latency_p99_ms": 500.0, "growth_ms": 100.0,
         "direct_rate_share": 0.9}
"""The mix goals: Twist round trip p99, camera rate, each heavy topic's message age p99 and
latency growth on the relayed viewer; the direct viewer's rate as a share of the nominal rate."""
NAMES = ("camera", *HEAVY)
SETTLE_S = 5.0
"""Pause between modes: the previous mode's queues on the way drain."""


def say(msg: str) -> None:
    """Progress on stderr."""
    print(f"[bench_mix] {msg}", file=sys.stderr, flush=True)


def load_average() -> List[float]:
    """The machine's 1/5/15-minute load averages (other work competes for the cores)."""
    return [round(x, 2) for x in os.getloadavg()]


def goal_check(mode_res: Dict[str, Any], published: Dict[str, Any]) -> Dict[str, Any]:
    """Each goal for one mode's result: {goal: True/False/None (not measured)} with the figures
    it was read from. ``published``: the mix publisher's start line (``bytes`` per heavy topic)."""
    rel = goal_rows(mode_res.get("relayed") or {}, NAMES)
    dire = goal_rows(mode_res.get("direct") or {}, NAMES)
    ctl = mode_res.get("control") or {}
    out: Dict[str, Any] = {}
    rtt = ctl.get("rtt_p99_ms")
    out["rtt_p99"] = None if rtt is None else rtt <= GOALS["rtt_p99_ms"]
    cam = rel["camera"].get("rate_hz")
    out["camera_rate"] = None if cam is None else cam >= GOALS["camera_hz"]
    lat = [rel[n].get("latency_p99_ms") for n in HEAVY]
    out["age_p99"] = None if any(v is None for v in lat) else all(v <= GOALS["latency_p99_ms"] for v in lat)
    growth = [rel[n].get("latency_growth_ms") for n in HEAVY]
    out["no_queue_growth"] = (None if any(v is None for v in growth)
                              else all(v <= GOALS["growth_ms"] for v in growth))
    if mode_res.get("direct") and not (mode_res.get("direct") or {}).get("error"):
        rates_ok = all((dire[n].get("rate_hz") or 0) >= GOALS["direct_rate_share"] * NOMINAL_HZ[n] for n in HEAVY)
        sizes = published.get("bytes") or {}
        full = all(dire[n].get("bytes_p50") == sizes.get(n) for n in HEAVY) if sizes else None
        out["direct_full_rate"], out["direct_full_content"] = rates_ok, full
    return out


def _camera_pacing(meta: Dict[str, Any]) -> str:
    """The camera's pacing_factor in a run's meta: set, its default, or not recorded (older runs)."""
    if "camera_pacing_factor" not in meta:
        return "not recorded"
    value = meta["camera_pacing_factor"]
    return "its default (0)" if value is None else f"{value:g}"


def run(out_dir: Path, seconds: float, modes: Sequence[str], uplink_mbit: float, scene: str, direct: bool,
        run_id: Optional[str] = None, pacing_factor: Optional[float] = None, relayed: bool = True,
        camera_pacing_factor: Optional[float] = None) -> Dict[str, Any]:
    """The whole benchmark; returns the JSON data (also written to out_dir). ``pacing_factor``: the
    shaper's and the camera's (None = their default), ``camera_pacing_factor`` the camera's alone
    (None = ``pacing_factor``); ``direct`` / ``relayed``: which viewers view."""
    t_run = time.monotonic()
    load_start = load_average()
    lab = Lab(SPEC, run_id=run_id)
    mix = RobotMix(lab, say=say, scene=scene, pacing_factor=pacing_factor, camera_pacing_factor=camera_pacing_factor)
    results: Dict[str, Any] = {}
    errors: List[str] = []
    setup: Dict[str, Any] = {}
    try:
        lab.up()
        setup = mix.start(uplink_mbit)
        setup["capacity"] = mix.capacity()
        say(f"TCP robot -> laptop before the mix flows (iperf3 -R, 5 s): {setup['capacity']}")
        for mode in modes:
            say(f"{mode}: " + (f"relayed viewer on {RELAYED}, " if relayed else "")
                + (f"direct viewer on {DIRECT}, " if direct else "") + f"Twist 50 Hz, {seconds:g} s")
            try:
                res = mix.measure(mode, seconds, direct=direct, relayed=relayed)
                res["load"] = load_average()
                results[mode] = res
                if relayed:
                    say(f"  {mode}: relayed {goal_rows(res.get('relayed') or {}, NAMES)}")
                if direct:
                    say(f"  {mode}: direct {goal_rows(res.get('direct') or {}, NAMES)}")
                say(f"  {mode}: Twist {res.get('control')}; goals {goal_check(res, mix.published)}")
            except LabError as exc:
                errors.append(f"{mode}: {exc}")
                say(f"{mode}: failed: {exc}")
            time.sleep(SETTLE_S)
    finally:
        mix.stop()
        lab.down()
    data = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds_per_mode": seconds, "uplink_mbit": uplink_mbit,
                     "cores": os.cpu_count(), "load_start": load_start, "load_end": load_average(),
                     "scene": scene, "published": mix.published, "camera_stream": mix.camera_stream,
                     "nominal_hz": NOMINAL_HZ, "throttle_hz": THROTTLE_HZ,
                     "shaper_params": dict(SHAPER_PARAMS, **({} if pacing_factor is None else
                                                             {"pacing_factor": pacing_factor})),
                     "camera_pacing_factor": mix.camera_pacing_factor,
                     "robot": ROBOT, "relayed": RELAYED, "relayed_viewer": relayed,
                     "direct": DIRECT if direct else None, "modes": [m for m in modes if m in results],
                     "goals": GOALS, "setup": setup, "run_seconds": round(time.monotonic() - t_run),
                     "errors": errors},
            "results": results}
    write_report(out_dir, "bench_mix", data, render_markdown, plot)
    return data


def _f(v: Optional[float], fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _verdict(v: Optional[bool]) -> str:
    return "-" if v is None else ("met" if v else "NOT met")


def render_markdown(data: Dict[str, Any]) -> str:
    """A row per mode, viewer and topic; the Twist round trip and the goals per mode."""
    m = data["meta"]
    pub = m.get("published") or {}
    sizes = pub.get("bytes") or {}
    lines = [f"Robot mix benchmark {m['date']}: {m['robot']} publishes the camera ({m.get('camera_stream')}), "
             f"points {m['nominal_hz']['points']:g} Hz ({_f(sizes.get('points'))} B), scan "
             f"{m['nominal_hz']['scan']:g} Hz ({_f(sizes.get('scan'))} B), map {m['nominal_hz']['map']:g} Hz "
             f"({_f(sizes.get('map'))} B) from {pub.get('source', m['scene'])}; "
             + (f"{m['relayed']} relayed through DERP" if m.get("relayed_viewer", True)
                else f"no relayed viewer ({m['relayed']} relayed through DERP sends the Twist)")
             + f" over one {m['uplink_mbit']:g} Mbit/s uplink (tbf), "
             + (f"{m['direct']} direct on the robot's LAN" if m.get("direct") else "no direct viewer") + "; "
             f"Twist 50 Hz from {m['relayed']}; {m['seconds_per_mode']:g} s per mode; "
             f"{m['cores']} cores, load average {m['load_start']} at the start, {m['load_end']} at the end "
             f"(a shared machine). TCP from the robot before the mix flows (iperf3, 5 s): "
             + (", ".join(f"{h} {v.get('tcp_mbps', v.get('error'))} Mbit/s"
                          for h, v in ((m.get("setup") or {}).get("capacity") or {}).items()) or "not measured")
             + ".", "",
             "| mode | viewer | topic | rate Hz | message age p50 / p99 ms | newest age p50 / p99 ms | "
             "latency growth ms | Mbit/s | message bytes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode in m["modes"]:
        res = data["results"][mode]
        for viewer in ("relayed", "direct"):
            if not res.get(viewer):
                continue
            if res[viewer].get("error"):
                lines.append(f"| {mode} | {viewer} | - | error: {res[viewer]['error'][:200]} | | | | | |")
                continue
            rows = goal_rows(res[viewer], NAMES)
            for n in NAMES:
                r = rows[n]
                lines.append(f"| {mode} | {viewer} | {(res['topics'] if viewer == 'relayed' else {}).get(n, n)} | "
                             f"{_f(r['rate_hz'], '{:.1f}')} | {_f(r['latency_p50_ms'])} / {_f(r['latency_p99_ms'])} | "
                             f"{_f(r['age_p50_ms'])} / {_f(r['age_p99_ms'])} | {_f(r['latency_growth_ms'])} | "
                             f"{_f((r['kbps'] or 0) / 1000, '{:.1f}')} | {_f(r['bytes_p50'])} |")
    lines += ["", "| mode | Twist RTT p50 / p99 / max ms | received / sent | load during | goals |",
              "|---|---|---|---|---|"]
    for mode in m["modes"]:
        res = data["results"][mode]
        c = res.get("control") or {}
        goals = goal_check(res, pub)
        lines.append(f"| {mode} | {_f(c.get('rtt_p50_ms'), '{:.1f}')} / {_f(c.get('rtt_p99_ms'), '{:.1f}')} / "
                     f"{_f(c.get('rtt_max_ms'), '{:.0f}')} | {c.get('received', '-')} / {c.get('sent', '-')}"
                     f"{' (' + c['error'][:120] + ')' if c.get('error') else ''} | {res.get('load')} | "
                     + ", ".join(f"{k} {_verdict(v)}" for k, v in goals.items()) + " |")
    g = m["goals"]
    lines += ["", f"Goals (relayed viewer): Twist RTT p99 <= {g['rtt_p99_ms']:g} ms, camera >= {g['camera_hz']:g} Hz, "
                  f"every heavy topic's message age p99 <= {g['latency_p99_ms']:g} ms and latency growth <= "
                  f"{g['growth_ms']:g} ms; direct viewer: >= {g['direct_rate_share'] * 100:g} % of the nominal rate "
                  "with the published message size. Message age = receive time - header.stamp; newest age = now - "
                  "the newest stamp received, sampled at 20 Hz (a 1 Hz map's is up to 1 s by its rate alone). "
                  f"Throttle rates (set by hand): {m['throttle_hz']}. Shaper settings: {m.get('shaper_params')}. "
                  f"Camera pacing_factor: {_camera_pacing(m)}."]
    for err in m.get("errors") or []:
        lines.append(f"\nNot measured: {err}")
    return "\n".join(lines) + "\n"


def plot(data: Dict[str, Any], out_dir: Path) -> None:
    """bench_mix.png: per topic, the relayed viewer's rate, message age p99 and newest age p99 by
    mode, and the Twist RTT p99; bench_mix_series.png: per topic, the relayed viewer's mean
    latency per second in each mode."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = data["meta"]
    modes = m["modes"]
    res = data["results"]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    width = 0.8 / max(1, len(modes))
    for ax, (key, title, log) in zip(axes, (("rate_hz", "relayed: rate (Hz)", True),
                                            ("latency_p99_ms", "relayed: message age p99 (ms)", True),
                                            ("age_p99_ms", "relayed: newest age p99 (ms)", True))):
        for i, mode in enumerate(modes):
            rows = goal_rows(res[mode].get("relayed") or {}, NAMES)
            vals = [rows[n].get(key) or 0.0 for n in NAMES]
            ax.bar([x + i * width for x in range(len(NAMES))], vals, width, label=mode)
        ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(NAMES))])
        ax.set_xticklabels(NAMES, fontsize=8)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
        if key == "latency_p99_ms":
            ax.axhline(m["goals"]["latency_p99_ms"], color="grey", linestyle=":", linewidth=1)
    ax = axes[3]
    ax.bar(range(len(modes)), [(res[mo].get("control") or {}).get("rtt_p99_ms") or 0.0 for mo in modes],
           color=[f"C{i}" for i in range(len(modes))])
    ax.set_xticks(range(len(modes)))
    ax.set_xticklabels(modes)
    ax.set_yscale("log")
    ax.axhline(m["goals"]["rtt_p99_ms"], color="grey", linestyle=":", linewidth=1)
    ax.set_title("Twist RTT p99 (ms)", fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"a robot's mix to a viewer relayed over one {m['uplink_mbit']:g} Mbit/s uplink (dotted: goals)")
    fig.tight_layout()
    fig.savefig(out_dir / "bench_mix.png", dpi=80)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(NAMES), figsize=(17, 3.8))
    for ax, n in zip(axes, NAMES):
        for i, mode in enumerate(modes):
            t = ((res[mode].get("relayed") or {}).get("topics") or {}).get(n) or {}
            series = t.get("series") or []
            ax.plot([s[0] for s in series], [s[2] if s[2] is not None else float("nan") for s in series],
                    marker=".", color=f"C{i}", label=f"{mode} latency")
            ax.plot([s[0] for s in series], [s[3] if s[3] is not None else float("nan") for s in series],
                    linestyle=":", color=f"C{i}", label=f"{mode} newest age (max)")
        ax.set_yscale("log")
        ax.set_title(f"relayed: {n} (ms per second)", fontsize=10)
        ax.set_xlabel("s")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "bench_mix_series.png", dpi=80)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point (see the module doc)."""
    ap = argparse.ArgumentParser(prog="bench_mix", description="a robot's sensor mix through one relayed uplink (root)")
    ap.add_argument("--out", default=str(REPO_ROOT / "artifacts"))
    ap.add_argument("--seconds", type=float, default=40.0,
                    help="measurement per mode (s); 40 s hold about 40 of the 1 Hz map's messages, so its p99 "
                         "is not its single worst one")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--uplink-mbit", type=float, default=UPLINK_MBIT)
    ap.add_argument("--scene", choices=["real", "synthetic"], default="real")
    ap.add_argument("--viewers", default="relayed,direct",
                    help="comma-separated, of relayed, direct: who views (default both at once)")
    ap.add_argument("--no-direct", action="store_true", help="no direct viewer (the relayed one alone)")
    ap.add_argument("--pacing-factor", type=float, default=None,
                    help="the shaper's and the camera's pacing_factor (default: theirs, 2.5 and 0; 0 = no pacing)")
    ap.add_argument("--camera-pacing-factor", type=float, default=None,
                    help="the camera's pacing_factor alone (default: --pacing-factor's, else its own, 0)")
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--replot", metavar="JSON", help="only re-render the table and plots from a bench_mix.json")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.replot:
        return replot(Path(a.replot), out, "bench_mix", render_markdown, plot)
    modes = [x.strip() for x in a.modes.split(",") if x.strip()]
    bad = [x for x in modes if x not in MODES]
    if bad:
        print(f"bench_mix: --modes {a.modes}: unknown {', '.join(bad)} (one of {', '.join(MODES)})", file=sys.stderr)
        return 2
    viewers = {x.strip() for x in a.viewers.split(",") if x.strip()}
    if not viewers or viewers - {"relayed", "direct"}:
        print(f"bench_mix: --viewers {a.viewers}: give relayed, direct or both", file=sys.stderr)
        return 2
    if a.no_direct:
        viewers.discard("direct")
        if not viewers:
            print("bench_mix: --no-direct with --viewers direct leaves no viewer", file=sys.stderr)
            return 2
    if os.geteuid() != 0:
        print("bench_mix: needs root (network namespaces)", file=sys.stderr)
        return 2
    try:
        data = run(out, a.seconds, modes, a.uplink_mbit, a.scene, "direct" in viewers, a.run_id, a.pacing_factor,
                   relayed="relayed" in viewers, camera_pacing_factor=a.camera_pacing_factor)
    except LabError as exc:
        print(f"bench_mix: error: {exc}", file=sys.stderr)
        return 1
    print(render_markdown(data))
    say(f"wrote {out / 'bench_mix.json'}, bench_mix.md, bench_mix.png, bench_mix_series.png "
        f"({data['meta']['run_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
