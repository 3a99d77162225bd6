"""The benchmark's report: bench.md (tables) and bench_paths.png / bench_sweep.png (plots).

Pure rendering of the JSON that run.py writes (``bench --replot bench.json`` re-renders without
a lab). Main table: every metric per path without impairment, with its ratio to the underlay;
then the launch-to-first-frame times and one table per metric over the impairment sweep.
``write_report`` and ``replot`` write any lab benchmark's files (run.py, camera.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

METRICS = [  # key, label, unit, higher is better
    ("tcp_mbps", "TCP throughput", "Mbit/s", True),
    ("udp_jitter_ms", "UDP jitter", "ms", False),
    ("udp_loss_pct", "UDP loss", "%", False),
    ("ping_rtt_ms", "ping RTT", "ms", False),
    ("camera_hz", "camera delivered rate", "Hz", True),
    ("camera_latency_p50_ms", "camera latency p50", "ms", False),
    ("camera_latency_p99_ms", "camera latency p99", "ms", False),
    ("control_rtt_p50_ms", "control RTT p50", "ms", False),
    ("control_rtt_p99_ms", "control RTT p99", "ms", False),
    ("first_frame_s", "subscriber start to first frame", "s", False),
]


def _fmt(v: Optional[Union[str, float]]) -> str:
    """A number with 3 significant digits (no decimals from 100 up); "-" for None."""
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def render_markdown(data: Dict[str, Any]) -> str:
    """Main table (no impairment) with ratios to the underlay, launch times, sweep tables."""
    res, paths, sweep = data["results"], data["paths"], data["sweep"]
    base = sweep[0]
    m = data["meta"]
    lines = ["# Benchmark: underlay vs plain WireGuard vs tailscale direct, via DERP and via a peer relay", "",
             f"{m['date']}, {m['cores']} cores, {m['seconds_per_test']:g} s per test, UDP at {m['udp_mbit']:g} Mbit/s "
             f"(1200-byte datagrams), camera {m['image']}, control Twist at {m['control_hz']:g} Hz echoed "
             f"(measured while the camera streams); full run {m['run_seconds']:.0f} s.", "",
             "## No impairment (ratio to underlay in brackets)", "",
             "| metric | " + " | ".join(paths) + " |", "|---|" + "---|" * len(paths)]
    for key, label, unit, _ in METRICS:
        row = [f"{label} ({unit})"]
        u = res.get("underlay", {}).get(base, {}).get(key)
        for p in paths:
            v = res.get(p, {}).get(base, {}).get(key)
            cell = _fmt(v)
            if p != "underlay" and isinstance(v, (int, float)) and isinstance(u, (int, float)) and u:
                cell += f" ({v / u:.2g}x)"
            row.append(cell)
        lines.append("| " + " | ".join(row) + " |")
    row = ["robot.launch (never enrolled) to first frame (s)"]
    for p in paths:
        v = data["launch"].get(p, {}).get("launch_to_first_frame_s")
        row.append(_fmt(v) if v is not None else "n/a")
    lines.append("| " + " | ".join(row) + " |")
    row = ["tailscale path seen"] + [res.get(p, {}).get(base, {}).get("tailscale_path", "-") for p in paths]
    lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"## Impairment sweep on {m['impairment_link']}", ""]
    for key, label, unit, _ in METRICS[:5] + METRICS[7:9]:
        lines += [f"{label} ({unit}):", "", "| impairment | " + " | ".join(paths) + " |",
                  "|---|" + "---|" * len(paths)]
        for s in sweep:
            lines.append("| " + " | ".join([s] + [_fmt(res.get(p, {}).get(s, {}).get(key)) for p in paths]) + " |")
        lines.append("")
    errors = [f"{p} {s}: {r[k]}" for p in paths for s, r in res.get(p, {}).items() for k in r if k.endswith("error")]
    if errors or m["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in m["notes"] + errors] + [""]
    return "\n".join(lines)


def plot(data: Dict[str, Any], out_dir: Path) -> List[Path]:
    """bench_paths.png (each metric per path, no impairment) and bench_sweep.png (per impairment)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res, paths, sweep = data["results"], data["paths"], data["sweep"]
    written = []
    fig, axes = plt.subplots(2, 5, figsize=(22, 8))
    for ax, (key, label, unit, _) in zip(axes.flat, METRICS):
        vals = [res.get(p, {}).get(sweep[0], {}).get(key) for p in paths]
        ax.bar(paths, [v if isinstance(v, (int, float)) else 0 for v in vals],
               color=["#777", "#4a7", "#37c", "#c73", "#1565c0"][:len(paths)])
        ax.set_title(f"{label} ({unit})", fontsize=10)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle("overlay_manager bench: paths, no impairment")
    fig.tight_layout()
    p1 = out_dir / "bench_paths.png"
    fig.savefig(p1, dpi=80)
    plt.close(fig)
    written.append(p1)
    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    shown = [m for m in METRICS if m[0] in ("tcp_mbps", "udp_jitter_ms", "udp_loss_pct", "ping_rtt_ms",
                                            "camera_hz", "camera_latency_p50_ms", "control_rtt_p50_ms",
                                            "control_rtt_p99_ms")]
    for ax, (key, label, unit, _) in zip(axes.flat, shown):
        for p in paths:
            ys = [res.get(p, {}).get(s, {}).get(key) for s in sweep]
            ax.plot(range(len(sweep)), [y if isinstance(y, (int, float)) else float("nan") for y in ys],
                    marker="o", label=p)
        ax.set_xticks(range(len(sweep)))
        ax.set_xticklabels(sweep, rotation=20, fontsize=8)
        ax.set_title(f"{label} ({unit})", fontsize=10)
        if key in ("tcp_mbps", "control_rtt_p99_ms", "control_rtt_p50_ms", "ping_rtt_ms"):
            ax.set_yscale("log")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("overlay_manager bench: per impairment on b1's uplink (delay needs netem: "
                 + ("available" if data["meta"]["netem"] else "not in this kernel") + ")")
    fig.tight_layout()
    p2 = out_dir / "bench_sweep.png"
    fig.savefig(p2, dpi=80)
    plt.close(fig)
    written.append(p2)
    return written


def write_report(out_dir: Path, stem: str, data: Dict[str, Any], render: Callable[[Dict[str, Any]], str],
                 plot_to: Callable[[Dict[str, Any], Path], Any], with_json: bool = True) -> str:
    """Write a benchmark's results into ``out_dir`` (created if needed): ``<stem>.json`` (unless
    ``with_json`` is false, as when re-rendering that JSON), ``<stem>.md`` from ``render(data)`` and
    the plots ``plot_to(data, out_dir)`` draws. Returns the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if with_json:
        (out_dir / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")
    markdown = render(data)
    (out_dir / f"{stem}.md").write_text(markdown)
    plot_to(data, out_dir)
    return markdown


def replot(json_path: Path, out_dir: Path, stem: str, render: Callable[[Dict[str, Any]], str],
           plot_to: Callable[[Dict[str, Any], Path], Any]) -> int:
    """A benchmark's ``--replot JSON``: ``<stem>.md`` and the plots again from a saved run (no lab),
    the markdown printed. Returns the exit code (0)."""
    print(write_report(out_dir, stem, json.loads(json_path.read_text()), render, plot_to, with_json=False))
    return 0
