"""Link measurements against a peer's overlay address: iperf3 -J (TCP, UDP) and ICMP ping.

Like the IRIS-Lab thesis measurements: TCP throughput, UDP jitter and loss at a set bitrate, and
round-trip time. Parsing is pure (unit-tested on recorded output); running needs iperf3/ping.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional

from overlay_manager.system import children


class LinkError(Exception):
    """A measurement could not be made; says which tool and why."""


@dataclass(frozen=True)
class LinkResult:
    """One measure_link run. Units: Mbit/s, ms, percent."""

    tcp_throughput_mbps: float = math.nan
    udp_jitter_ms: float = math.nan
    udp_loss_percent: float = math.nan
    rtt_min_ms: float = math.nan
    rtt_mean_ms: float = math.nan
    rtt_max_ms: float = math.nan


def parse_iperf_tcp(report: Mapping[str, Any]) -> float:
    """iperf3 -J TCP report -> receiver throughput in Mbit/s."""
    _raise_iperf_error(report)
    try:
        return float(report["end"]["sum_received"]["bits_per_second"]) / 1e6
    except (KeyError, TypeError, ValueError):
        raise LinkError("iperf3 TCP report has no end.sum_received.bits_per_second") from None


def parse_iperf_udp(report: Mapping[str, Any]) -> "tuple[float, float]":
    """iperf3 -J -u report -> (jitter ms, loss percent)."""
    _raise_iperf_error(report)
    try:
        s = report["end"]["sum"]
        return float(s["jitter_ms"]), float(s["lost_percent"])
    except (KeyError, TypeError, ValueError):
        raise LinkError("iperf3 UDP report has no end.sum.jitter_ms/lost_percent") from None


def _raise_iperf_error(report: Mapping[str, Any]) -> None:
    err = report.get("error")
    if err:
        hint = ""
        if "refused" in str(err) or "unable to connect" in str(err):
            hint = " (is the peer's node running with iperf_server: true?)"
        raise LinkError(f"iperf3: {err}{hint}")


_RTT = re.compile(r"=\s*([\d.]+)/([\d.]+)/([\d.]+)/")


def parse_ping(output: str) -> "tuple[float, float, float]":
    """iputils ping summary -> (min, mean, max) ms."""
    m = _RTT.search(output)
    if not m:
        raise LinkError("ping got no replies")
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def run_iperf(ip: str, port: int, duration_s: float, udp_mbps: Optional[float] = None,
              timeout_s: Optional[float] = None) -> Mapping[str, Any]:
    """Run one iperf3 client test and return its JSON report."""
    argv: List[str] = ["iperf3", "-c", ip, "-p", str(port), "-J", "-t", f"{max(duration_s, 1):.0f}",
                       "--connect-timeout", "3000"]
    if udp_mbps is not None:
        argv += ["-u", "-b", f"{udp_mbps}M"]
    try:
        proc = children.run(argv, timeout_s=timeout_s or duration_s + 15)
    except FileNotFoundError:
        raise LinkError("iperf3 is not installed on this machine") from None
    except subprocess.TimeoutExpired:
        raise LinkError(f"iperf3 to {ip}:{port} did not finish in time") from None
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise LinkError(f"iperf3 to {ip}:{port} failed: {proc.stderr.strip()[-200:]}") from None
    return report


def run_ping(ip: str, count: int = 5, timeout_s: float = 10.0) -> "tuple[float, float, float]":
    """ICMP ping over the overlay -> (min, mean, max) ms."""
    argv = ["ping", "-n", "-q", "-c", str(count), "-i", "0.2", "-w", f"{timeout_s:.0f}", ip]
    try:
        proc = children.run(argv, timeout_s=timeout_s + 5)
    except FileNotFoundError:
        raise LinkError("ping is not installed on this machine") from None
    except subprocess.TimeoutExpired:
        raise LinkError(f"ping {ip} did not finish in time") from None
    return parse_ping(proc.stdout)


def measure(ip: str, port: int, duration_s: float, udp_mbps: float) -> LinkResult:
    """TCP throughput, UDP jitter/loss at udp_mbps, and ICMP RTT to ip (raises LinkError)."""
    tcp = parse_iperf_tcp(run_iperf(ip, port, duration_s))
    jitter, loss = parse_iperf_udp(run_iperf(ip, port, duration_s, udp_mbps))
    rmin, rmean, rmax = run_ping(ip)
    return LinkResult(tcp, jitter, loss, rmin, rmean, rmax)


def iperf_server_argv(bind_ip: str, port: int) -> List[str]:
    """iperf3 server bound to the overlay address only."""
    return ["iperf3", "-s", "-B", bind_ip, "-p", str(port)]
