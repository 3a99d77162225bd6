"""The node benchmark's report: per-phase summaries and the markdown table bench_node prints."""
from __future__ import annotations

from typing import Any, Dict

from overlay_manager.core.stats import summary

TARGET_NODE_LATENCY_S = 1.0
"""Seconds from tailscaled showing a path change to the node publishing it on ~path_changes."""


def summarize_path(p: Dict[str, Any]) -> Dict[str, Any]:
    """Per phase (block, unblock), summaries (overlay_manager.core.stats.summary, seconds) over the
    complete trials of path_bench's result: the node's latency behind tailscaled by arrival time
    and by header stamp, and tailscaled's own time after the action."""
    out: Dict[str, Dict[str, Any]] = {}
    for phase in ("block", "unblock"):
        recs = [t[phase] for t in p.get("trials", []) if phase in t and "node_latency_s" in t[phase]]
        out[phase] = {"node_latency_s": summary([r["node_latency_s"] for r in recs]),
                      "node_stamp_latency_s": summary([r["node_stamp_latency_s"] for r in recs]),
                      "tailscaled_s": summary([r["tailscaled_s"] for r in recs])}
    return out


def table(result: Dict[str, Any]) -> str:
    """The markdown table bench_node prints: path-change latencies against the node's target,
    errors, and CPU / RSS per peer count (or the error of that run)."""
    lines = ["| measurement | condition | result |", "|---|---|---|"]
    p = result.get("path_change")
    if p:
        s = p["summary"]
        for phase, label in (("block", "direct -> derp (UDP blocked at b1)"),
                             ("unblock", "derp -> direct (UDP unblocked)")):
            n, t = s[phase]["node_latency_s"], s[phase]["tailscaled_s"]
            if n.get("n"):
                ok = "meets" if n["max"] < TARGET_NODE_LATENCY_S else "MISSES"
                lines.append(f"| node latency t_ros - t_ts | {label}, n={n['n']} | mean {n['mean']:.3f} s, "
                             f"max {n['max']:.3f} s ({ok} < {TARGET_NODE_LATENCY_S:.0f} s) |")
                lines.append(f"| tailscaled t_ts - t_action | {label}, n={t['n']} | mean {t['mean']:.2f} s, "
                             f"min {t['min']:.2f} s, max {t['max']:.2f} s |")
            else:
                lines.append(f"| path change | {label} | no complete trial |")
        for e in p.get("errors", []):
            lines.append(f"| path change error | | {e[:200]} |")
    for c in result.get("cpu", []):
        if "cpu_mean_pct" in c:
            lines.append(f"| node CPU / RSS | {c['peers']} peers ({c.get('topic_peers', 0)} streaming to this "
                         f"machine), fake tailscaled {'with' if c.get('ipn_bus') else 'without'} IPN bus, "
                         f"{'subscribers on ~peers, ~status, /diagnostics, ' if c.get('subscribers') else ''}"
                         f"{c['wall_s']:.0f} s, {_settings(c.get('settings', {}))} | "
                         f"CPU mean {c['cpu_mean_pct']:.1f} % "
                         f"of one core (1-s max {c['cpu_max_1s_pct']:.0f} %), RSS max {c['rss_max_mib']:.1f} MiB |")
        else:
            lines.append(f"| node CPU / RSS | {c['peers']} peers | error: {c.get('error', '?')[:200]} |")
    return "\n".join(lines)


def _settings(st: Dict[str, Any]) -> str:
    """The node settings that set its CPU, in words (from the run's recorded settings)."""
    names = (("poll_rate", "poll {} Hz"), ("bus_poll_rate", "{} Hz with the bus"), ("publish_rate", "publish {} Hz"),
             ("ping_interval", "ping {} s"), ("topic_links_interval", "topic links {} s"))
    return ", ".join(fmt.format(st[k]) for k, fmt in names if k in st) or "settings not recorded"
