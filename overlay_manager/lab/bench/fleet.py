"""Fleet camera benchmark (not a test): four robots' cameras through one relayed 30 Mbit/s uplink.

    sudo bash scripts/bench_fleet [--out artifacts] [--seconds 10]
         [--uplink-mbit 30] [--budget-kbps 6000] [--episode-mbit 5] [--episode-s 5] [--no-episode]
         [--pacing-factor F] [--no-guard] [--video FILE]
    bash scripts/bench_fleet --replot artifacts/bench_fleet.json

The campus of campus/fleet_camera.py: alpha-robot1..4 in one building whose router drops UDP (every
link to the laptop relayed through DERP) behind a tbf uplink, each playing the real scene
(640x480 rgb8 30 Hz) into its own link-aware encoder and echoing Twist; ops-laptop in another
building watches all four streams in one viewer (probe quality) while a 50 Hz Twist round trip
runs to each robot (taken over the viewer's window: campus/fleet_camera.py). The same run
measures, one kind after the other (the others unsubscribed):
raw rgb8, the link-aware JPEG stream and, where the encoder publishes it, link-aware H.264.
Per stream: delivered rate, PSNR against the source frame (mean, p5, min), latency p50/p99
(receive time - header.stamp), bitrate (payload bytes received); per robot: Twist RTT p50/p99
and the encoder's CPU (its processes' utime + stime over the seconds it worked, % of one core).

Congestion episode (last): the best kind streams for 22 s; 9 s in, the uplink drops to
``--episode-mbit`` for ``--episode-s`` (5 s), then back. Reported per stream: mean PSNR before the
episode, the lowest PSNR during it and after it (frames sent from 1 s after the limit is lifted,
the encoder's reaction time), rate, latency p99 and bitrate during it, frames and undecodable
messages; the check: no decoded frame sent after the episode more than :data:`EPISODE_MARGIN_DB`
below the stream's mean before it.

Every camera plays opencv-doc's vtest.avi (a pedestrian street) by default; ``--video FILE`` plays
another real scene (any video OpenCV reads; its first 300 frames, scaled to 640x480, looping), the
PSNR's reference too; the file is checked (its first frame must decode) before the lab comes up.

Writes out/bench_fleet.json, bench_fleet.md, bench_fleet.png, bench_fleet_episode.png. About 2 min.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from overlay_manager.core.stats import percentile
from overlay_manager.lab.bench.report import replot, write_report
from overlay_manager.lab.campus import camera_streams
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.fleet_camera import (
    BUDGET_KBPS,
    LAPTOP,
    ROBOT_BUILDING,
    ROBOTS,
    SPEC,
    UPLINK_MBIT,
    FleetCamera,
)
from overlay_manager.lab.campus.spec_model import Impairment

REPO_ROOT = Path(__file__).resolve().parents[3]
GOALS = {"rate_hz": 29.0, "psnr_mean": 38.0, "latency_p99_ms": 100.0, "rtt_p99_ms": 50.0}
"""The fleet goals for the H.264 stream (each stream / each robot)."""
EPISODE_MARGIN_DB = 4.0
EPISODE_AT_S, EPISODE_S, EPISODE_SETTLE_S, EPISODE_RUN_S = 9.0, 5.0, 1.0, 22.0


def say(msg: str) -> None:
    """Progress on stderr."""
    print(f"[bench_fleet] {msg}", file=sys.stderr, flush=True)


def load_average() -> List[float]:
    """The machine's 1/5/15-minute load averages (other work competes for the cores)."""
    return [round(x, 2) for x in os.getloadavg()]


def episode_check(frames: Sequence[Sequence[Any]], t_congest: float, t_restore: float,
                  settle_s: float = EPISODE_SETTLE_S, margin_db: float = EPISODE_MARGIN_DB,
                  since: float = -1e18) -> Dict[str, Any]:
    """One stream's frames ``[t, index, latency_ms, bytes, psnr]`` (``t``: receive time) around an
    episode in which the link was congested from ``t_congest`` to ``t_restore`` (CLOCK_MONOTONIC
    s): the mean PSNR before (from ``since``, the measurement window's start: the first pictures
    after subscribing come at the encoder's start-up quality), the lowest during and after (from
    ``t_restore + settle_s``), frame counts and ``ok``: no decoded frame after the episode below
    mean - ``margin_db`` (None when there was no PSNR before or after). Before, during and after go
    by the time a frame was sent (receive time - latency): a frame encoded during the episode that
    waited in the congested link's queue and arrives after it is part of the episode. Rate, latency
    and bitrate during go by receive time (what the viewer saw meanwhile)."""
    def ps(lo: float, hi: float) -> List[float]:
        return [f[4] for f in frames if lo <= f[0] - f[2] / 1000.0 < hi and f[4] is not None]

    before, during = ps(since, t_congest), ps(t_congest, t_restore + settle_s)
    after = ps(t_restore + settle_s, 1e18)
    mean = sum(before) / len(before) if before else None
    low_after = min(after) if after else None
    in_episode = [f for f in frames if t_congest <= f[0] < t_restore]
    span = max(1e-9, t_restore - t_congest)
    rate_during = len(in_episode) / span
    return {"psnr_mean_before": None if mean is None else round(mean, 2),
            "psnr_min_during": min(during) if during else None, "psnr_min_after": low_after,
            "psnr_p5_after": percentile(after, 5), "frames_before": len(before), "frames_after": len(after),
            "rate_hz_during": round(rate_during, 1),
            "latency_p99_ms_during": percentile([f[2] for f in in_episode], 99),
            "kbps_during": round(sum(f[3] for f in in_episode) * 8 / 1000 / span),
            "ok": None if mean is None or low_after is None else low_after >= mean - margin_db}


def run(out_dir: Path, seconds: float, uplink_mbit: float, budget_kbps: float, episode_mbit: Optional[float],
        run_id: Optional[str] = None, episode_s: float = EPISODE_S,
        pacing_factor: Optional[float] = None, guard: bool = True, video: str = "") -> Dict[str, Any]:
    """The whole benchmark; returns the JSON data (also written to out_dir). ``pacing_factor``: the
    encoders' (None = their default, 0: unpaced); ``guard`` False: every node without its path guard
    and home check (``node.guard_interval: 0``, ``node.home_check_interval: 0``); ``video``: the
    file the cameras play ("" = the default scene)."""
    t_run = time.monotonic()
    load_start = load_average()
    lab = Lab(SPEC, run_id=run_id,
              robot_overrides=None if guard else {"node": {"guard_interval": 0, "home_check_interval": 0}})
    fc = FleetCamera(lab, say=say, video=video)
    results: Dict[str, Any] = {}
    errors: List[str] = []
    episode: Dict[str, Any] = {}
    kinds: List[str] = []
    try:
        lab.up()
        results["setup"] = fc.start(uplink_mbit, budget_kbps, pacing_factor)
        kinds = fc.kinds()
        for kind in kinds:
            say(f"{kind}: four streams in one viewer, Twist to each robot, {seconds:g} s")
            try:
                res = fc.measure(kind, seconds, psnr_every=1)
                res.pop("quality", None)
                results[kind] = res
                for r in ROBOTS:
                    say(f"  {r}: {res['streams'][r]} | Twist {res['control'].get(r)} | "
                        f"encoder CPU {res['encoder_cpu_pct'][r]}")
            except LabError as exc:
                errors.append(f"{kind}: {exc}")
                say(f"{kind}: failed: {exc}")
        if episode_mbit:
            best = fc.best_kind()
            marks: Dict[str, float] = {}

            def congest() -> None:
                time.sleep(EPISODE_AT_S)
                marks["t_congest"] = time.monotonic()
                lab.impair(ROBOT_BUILDING, Impairment(rate_mbit=episode_mbit))
                time.sleep(episode_s)
                lab.impair(ROBOT_BUILDING, Impairment(rate_mbit=uplink_mbit))
                marks["t_restore"] = time.monotonic()

            say(f"congestion episode on {best}: uplink {uplink_mbit:g} -> {episode_mbit:g} Mbit/s for {episode_s:g} s")
            try:
                res = fc.measure(best, EPISODE_RUN_S - EPISODE_S + episode_s, psnr_every=1, control=False, frames=True,
                                 during=congest)
                q = res["quality"]["streams"]
                episode = {"kind": best, "episode_mbit": episode_mbit, "episode_s": episode_s,
                           "t_start": res["quality"]["t_start"],
                           **marks, "streams": {}}
                for r in ROBOTS:
                    frames = q[fc.streams[r][best]].get("frames") or []
                    episode["streams"][r] = {**episode_check(frames, marks["t_congest"], marks["t_restore"],
                                                             since=res["quality"]["t_start"]),
                                             "undecodable": res["streams"][r]["undecodable"],
                                             "series": [[round(f[0] - res["quality"]["t_start"], 3), f[4],
                                                         round(f[2], 1)] for f in frames if f[4] is not None]}
                    say(f"  {r}: {({k: v for k, v in episode['streams'][r].items() if k != 'series'})}")
            except (LabError, KeyError) as exc:
                errors.append(f"episode: {exc}")
                say(f"episode: failed: {exc}")
    finally:
        fc.stop()
        lab.down()
    data = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds_per_kind": seconds,
                     "uplink_mbit": uplink_mbit, "budget_kbps": budget_kbps, "pacing_factor": pacing_factor,
                     "guard": guard, "cores": os.cpu_count(),
                     "load_start": load_start, "load_end": load_average(),
                     "image": camera_streams.scene_image(video), "control_hz": 50,
                     "robots": list(ROBOTS), "viewer": LAPTOP, "kinds": kinds, "goals": GOALS,
                     "episode_margin_db": EPISODE_MARGIN_DB, "run_seconds": round(time.monotonic() - t_run),
                     "errors": errors},
            "results": results, "episode": episode}
    write_report(out_dir, "bench_fleet", data, render_markdown, plot)
    return data


def _f(v: Optional[float], fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _psnr(v: Optional[float]) -> str:
    return "lossless" if v is not None and v >= 99 else _f(v, "{:.1f}")


def goal_check(res: Dict[str, Any]) -> Dict[str, bool]:
    """Each goal of :data:`GOALS` met by every stream / robot of one kind's results."""
    s, c = list(res["streams"].values()), list(res["control"].values())

    def all_ok(rows: List[Dict[str, Any]], key: str, low_is_good: bool) -> bool:
        vals = [r.get(key) for r in rows]
        if any(v is None for v in vals):
            return False
        return all((v <= GOALS[key]) if low_is_good else (v >= GOALS[key]) for v in vals)

    return {"rate_hz": all_ok(s, "rate_hz", False), "psnr_mean": all_ok(s, "psnr_mean", False),
            "latency_p99_ms": all_ok(s, "latency_p99_ms", True), "rtt_p99_ms": all_ok(c, "rtt_p99_ms", True)}


def render_markdown(data: Dict[str, Any]) -> str:
    """A row per kind and robot; the goal check per kind; the congestion episode."""
    m = data["meta"]
    lines = [f"Fleet camera benchmark {m['date']}: {len(m['robots'])} robots, {m['image']}, each through its own "
             f"link-aware encoder (JPEG budget {m['budget_kbps'] / 1000:g} Mbit/s on derp; H.264 its own "
             f"video_budget_kbps_derp, default 2.4 Mbit/s), all relayed through DERP "
             f"(UDP blocked at the robots' router) over one {m['uplink_mbit']:g} Mbit/s uplink (tbf); one viewer "
             f"on {m['viewer']} for all streams; Twist {m['control_hz']} Hz to each robot at the same time; "
             f"{m['seconds_per_kind']:g} s per kind; {m['cores']} cores, load average {m['load_start']} at the "
             f"start, {m['load_end']} at the end.", "",
             "| stream | robot | rate Hz | PSNR (YUV 4:2:0) mean / p5 dB | latency p50 / p99 ms | Mbit/s "
             "| Twist RTT p50 / p99 ms | encoder CPU % |", "|---|---|---|---|---|---|---|---|"]
    for kind in m["kinds"]:
        res = data["results"].get(kind)
        if not res:
            continue
        for r in m["robots"]:
            s, c = res["streams"][r], res["control"].get(r) or {}
            lines.append(f"| {camera_streams.KIND_LABELS.get(kind, kind)} | {r} | {_f(s.get('rate_hz'), '{:.1f}')} | "
                         f"{_psnr(s.get('psnr_mean'))} / {_psnr(s.get('psnr_p5'))} | "
                         f"{_f(s.get('latency_p50_ms'))} / {_f(s.get('latency_p99_ms'))} | "
                         f"{_f((s.get('kbps') or 0) / 1000, '{:.2f}')} | "
                         f"{_f(c.get('rtt_p50_ms'), '{:.1f}')} / {_f(c.get('rtt_p99_ms'), '{:.1f}')} | "
                         f"{_f(res['encoder_cpu_pct'].get(r), '{:.1f}')} |")
    lines.append("")
    cpu = {k: data["results"][k].get("receiver_cpu_pct") for k in m["kinds"] if data["results"].get(k)}
    if any(v is not None for v in cpu.values()):
        lines += ["The viewer's own CPU (receiving, decoding and PSNR of all four streams, % of one core): "
                  + ", ".join(f"{camera_streams.KIND_LABELS.get(k, k)} {v}" for k, v in cpu.items()) + ".", ""]
    for kind in m["kinds"]:
        res = data["results"].get(kind)
        if res and kind != "raw":
            ok = goal_check(res)
            lines.append(f"Goals for {camera_streams.KIND_LABELS.get(kind, kind)} (every stream / robot): "
                         + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in ok.items())
                         + f" (rate >= {GOALS['rate_hz']:g} Hz, PSNR >= {GOALS['psnr_mean']:g} dB, latency p99 <= "
                           f"{GOALS['latency_p99_ms']:g} ms, Twist RTT p99 <= {GOALS['rtt_p99_ms']:g} ms).")
    ep = data.get("episode") or {}
    if ep.get("streams"):
        lines += ["", f"Congestion episode ({camera_streams.KIND_LABELS.get(ep['kind'], ep['kind'])}): uplink "
                      f"{m['uplink_mbit']:g} -> {ep['episode_mbit']:g} Mbit/s for "
                      f"{ep.get('episode_s', EPISODE_S):g} s; PSNR after = frames sent from {EPISODE_SETTLE_S:g} s "
                      "after the limit is lifted; check: no frame after it more than "
                      f"{m['episode_margin_db']:g} dB below the mean before.", "",
                  "| robot | PSNR (YUV 4:2:0) mean before | min during | min / p5 after | rate during Hz "
                  "| latency p99 during ms | Mbit/s during | undecodable | check |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r, e in ep["streams"].items():
            lines.append(f"| {r} | {_psnr(e['psnr_mean_before'])} | {_psnr(e['psnr_min_during'])} | "
                         f"{_psnr(e['psnr_min_after'])} / {_psnr(e['psnr_p5_after'])} | {e['rate_hz_during']} | "
                         f"{_f(e.get('latency_p99_ms_during'), '{:.0f}')} | "
                         f"{_f((e.get('kbps_during') or 0) / 1000, '{:.2f}')} | {e['undecodable']} | "
                         f"{'ok' if e['ok'] else ('-' if e['ok'] is None else 'FAILED')} |")
    for err in m.get("errors") or []:
        lines.append(f"\nNot measured: {err}")
    return "\n".join(lines) + "\n"


def plot(data: Dict[str, Any], out_dir: Path) -> None:
    """bench_fleet.png: per kind, bars per robot for rate, PSNR, latency p50/p99, bitrate, Twist
    RTT p50/p99, encoder CPU; bench_fleet_episode.png: PSNR over time in the congestion episode."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = data["meta"]
    kinds = [k for k in m["kinds"] if data["results"].get(k)]
    robots_ = m["robots"]
    metrics = (("rate_hz", "delivered rate (Hz)", "s", False, GOALS["rate_hz"]),
               ("psnr_mean", "PSNR mean (dB)", "s", False, GOALS["psnr_mean"]),
               ("latency_p50_ms", "latency p50 (ms)", "s", True, None),
               ("latency_p99_ms", "latency p99 (ms)", "s", True, GOALS["latency_p99_ms"]),
               ("kbps", "bitrate (Mbit/s)", "s", False, None),
               ("rtt_p50_ms", "Twist RTT p50 (ms)", "c", True, None),
               ("rtt_p99_ms", "Twist RTT p99 (ms)", "c", True, GOALS["rtt_p99_ms"]),
               ("cpu", "encoder CPU (% of a core)", "e", False, None))
    fig, axes = plt.subplots(2, 4, figsize=(17, 7))
    width = 0.8 / max(1, len(robots_))
    for ax, (key, title, src, log, goal) in zip(axes.flat, metrics):
        for i, r in enumerate(robots_):
            vals = []
            for k in kinds:
                res = data["results"][k]
                if src == "s":
                    v = res["streams"][r].get(key)
                    if key == "kbps" and v is not None:
                        v = v / 1000.0
                    if key == "psnr_mean" and v is not None:
                        v = min(v, 60.0)  # lossless raw shown at 60
                elif src == "c":
                    v = (res["control"].get(r) or {}).get(key)
                else:
                    v = res["encoder_cpu_pct"].get(r)
                vals.append(v if v is not None else 0.0)
            ax.bar([x + i * width for x in range(len(kinds))], vals, width, label=r)
        ax.set_xticks([x + width * (len(robots_) - 1) / 2 for x in range(len(kinds))])
        ax.set_xticklabels([camera_streams.KIND_LABELS.get(k, k) for k in kinds], fontsize=8)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
        if goal is not None:
            ax.axhline(goal, color="grey", linestyle=":", linewidth=1)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"4 cameras through one relayed {m['uplink_mbit']:g} Mbit/s uplink, one viewer (dotted: goals; "
                 "raw PSNR is lossless, drawn at 60 dB)")
    fig.tight_layout()
    fig.savefig(out_dir / "bench_fleet.png", dpi=80)
    plt.close(fig)
    ep = data.get("episode") or {}
    if ep.get("streams"):
        fig, ax = plt.subplots(figsize=(10, 4))
        for r, e in ep["streams"].items():
            xs = [p[0] for p in e.get("series", [])]
            ax.plot(xs, [p[1] for p in e.get("series", [])], ".", markersize=3, label=r)
        ax.axvspan(ep["t_congest"] - ep["t_start"], ep["t_restore"] - ep["t_start"], color="red", alpha=0.12,
                   label=f"uplink {ep['episode_mbit']:g} Mbit/s")
        ax.set_xlabel("s")
        ax.set_ylabel("PSNR (dB)")
        ax.set_title(f"congestion episode, {camera_streams.KIND_LABELS.get(ep['kind'], ep['kind'])}: per-frame PSNR")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "bench_fleet_episode.png", dpi=80)
        plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point (see the module doc)."""
    ap = argparse.ArgumentParser(prog="bench_fleet", description="four cameras through one relayed uplink (root)")
    ap.add_argument("--out", default=str(REPO_ROOT / "artifacts"))
    ap.add_argument("--seconds", type=float, default=10.0, help="measurement per stream kind")
    ap.add_argument("--uplink-mbit", type=float, default=UPLINK_MBIT)
    ap.add_argument("--budget-kbps", type=float, default=BUDGET_KBPS, help="each encoder's budget on derp")
    ap.add_argument("--episode-mbit", type=float, default=5.0,
                    help="uplink during the congestion episode (Mbit/s; 5: below what four H.264 streams send)")
    ap.add_argument("--episode-s", type=float, default=EPISODE_S,
                    help="how long the congestion episode lasts (s; long ones show a link that stays congested)")
    ap.add_argument("--no-episode", action="store_true")
    ap.add_argument("--pacing-factor", type=float, default=None,
                    help="the encoders' pacing_factor (default: theirs, 0 = no pacing; e.g. 2.5: paced)")
    ap.add_argument("--no-guard", action="store_true",
                    help="every node without its path guard and home check (node.guard_interval and "
                         "node.home_check_interval 0): what they cost the streams")
    camera_streams.add_video_argument(ap, "every camera")
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--replot", metavar="JSON", help="only re-render the table and plots from a bench_fleet.json")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.replot:
        return replot(Path(a.replot), out, "bench_fleet", render_markdown, plot)
    video = camera_streams.bench_video("bench_fleet", a.video)
    if video is None:
        return 2
    if os.geteuid() != 0:
        print("bench_fleet: needs root (network namespaces)", file=sys.stderr)
        return 2
    try:
        data = run(out, a.seconds, a.uplink_mbit, a.budget_kbps, None if a.no_episode else a.episode_mbit, a.run_id,
                   a.episode_s, a.pacing_factor, guard=not a.no_guard, video=video)
    except LabError as exc:
        print(f"bench_fleet: error: {exc}", file=sys.stderr)
        return 1
    print(render_markdown(data))
    say(f"wrote {out / 'bench_fleet.json'}, bench_fleet.md, bench_fleet.png ({data['meta']['run_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
