"""What the benchmark measures on one path, as it is now (see run.py for the set-up).

From the laptop (client) to robot1 (server): ICMP ping RTT, iperf3 TCP throughput and UDP
jitter/loss at a set bitrate (1200-byte datagrams, which fit every tunnel MTU), and the ROS side:
the lab camera's delivered rate and latency (receive time - header.stamp, one clock) while a Twist
is sent at 50 Hz through the echo (probe.control_round_trip), plus the time from starting the
subscriber to its first frame. Percentiles and rates follow overlay_manager.core.stats.

The ROS side runs inside the laptop's namespace::

    python3 -m overlay_manager.lab.bench.measure _operator --prefix /bench/ts_direct [--seconds 5]
        [--t0 WALL_S] [--timeout 60] [--first-only]

and prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from overlay_manager.core.stats import latency_stats, rate_stats
from overlay_manager.lab.bench.paths import CONTROL_HZ, IPERF_PORT, LAPTOP, ROBOT, PathSetup, topic_prefix
from overlay_manager.lab.campus.core import Lab


class Measure:
    """Measurements of one bench run (``seconds`` per iperf3/camera test, UDP at ``udp_mbit``)."""

    def __init__(self, lab: Lab, paths: PathSetup, seconds: float, udp_mbit: float) -> None:
        self.lab = lab
        self.paths = paths
        self.seconds = seconds
        self.udp_mbit = udp_mbit

    def operator(self, path: str, host: str = LAPTOP, t0: float = 0.0, first_only: bool = False,
                 timeout: float = 60.0) -> Dict[str, Any]:
        """Run the operator side (module doc) on ``host``; its JSON (LabError when it failed).
        ``t0``: wall-clock time the first-frame time is counted from (0 = subscriber start)."""
        from overlay_manager.lab.campus import robots
        args = ["_operator", "--prefix", topic_prefix(path), "--seconds", f"{self.seconds:g}",
                "--t0", repr(t0), "--timeout", f"{timeout:g}"] + (["--first-only"] if first_only else [])
        res = self.lab.exec(host, self.paths.module_argv(path, host, "bench.measure", args),
                            env=robots.ros_env(self.lab, host), timeout=timeout + self.seconds + 60,
                            check=False, quiet=True)
        return robots.json_result(res, f"operator on {host} ({path})")

    def iperf(self, addr: str, udp: bool) -> Dict[str, Any]:
        """iperf3 from the laptop to ``addr`` for ``seconds``: TCP Mbit/s and retransmits, or UDP
        Mbit/s, jitter (ms) and loss (%); ``{"error": ...}`` when it failed."""
        argv = ["iperf3", "-c", addr, "-p", str(IPERF_PORT), "-t", f"{self.seconds:g}", "-J",
                "--connect-timeout", "5000"]
        if udp:
            argv += ["-u", "-b", f"{self.udp_mbit:g}M", "-l", "1200"]
        for _attempt in range(20):  # the server may still be closing the previous test (lossy links)
            res = self.lab.exec(LAPTOP, argv, timeout=self.seconds + 40, check=False, quiet=True)
            try:
                data = json.loads(res.stdout)
            except json.JSONDecodeError:
                return {"error": (res.stderr or res.stdout).strip()[-300:]}
            if "busy" not in str(data.get("error", "")):
                break
            time.sleep(1.0)
        if data.get("error"):
            return {"error": data["error"]}
        end = data["end"]
        if udp:
            s = end.get("sum", {})
            return {"udp_mbps": s.get("bits_per_second", 0) / 1e6, "udp_jitter_ms": s.get("jitter_ms"),
                    "udp_loss_pct": s.get("lost_percent")}
        return {"tcp_mbps": end["sum_received"]["bits_per_second"] / 1e6,
                "tcp_retransmits": end.get("sum_sent", {}).get("retransmits")}

    def ping(self, addr: str, count: int = 20) -> Dict[str, Any]:
        """ICMP ping from the laptop: mean RTT (ms) and loss (%) of ``count`` pings 50 ms apart."""
        res = self.lab.exec(LAPTOP, ["ping", "-n", "-q", "-c", str(count), "-i", "0.05", "-W", "2", addr],
                            timeout=count * 2 + 10, check=False, quiet=True)
        m = re.search(r"= ([0-9.]+)/([0-9.]+)/([0-9.]+)/([0-9.]+) ms", res.stdout)
        loss = re.search(r"([0-9.]+)% packet loss", res.stdout)
        return {"ping_rtt_ms": float(m.group(2)) if m else None,
                "ping_loss_pct": float(loss.group(1)) if loss else None}

    def ts_path(self) -> str:
        """The tailscale path laptop -> robot1 (``tailscale ping``): direct, derp, peer-relay or none."""
        return self.lab.ping(LAPTOP, ROBOT, count=2, timeout=30).path

    def measure(self, path: str, ros: bool = True) -> Dict[str, Any]:
        """All metrics of one path as it is now."""
        addr = self.paths.server_address(path)
        out: Dict[str, Any] = {}
        out.update(self.ping(addr))
        out.update(self.iperf(addr, udp=False))
        out.update(self.iperf(addr, udp=True))
        if ros:
            try:
                out.update({k: v for k, v in self.operator(path).items() if k != "ok"})
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                out["ros_error"] = str(exc)
        if path.startswith("ts-"):
            out["tailscale_path"] = self.ts_path()
        return out


# ================================================================================================
# the operator side, inside the laptop's namespace
# ================================================================================================
def _wait_master(timeout: float) -> None:
    """Wait up to ``timeout`` s until ROS_MASTER_URI accepts TCP (its name may resolve only after
    the node has written the overlay names into /etc/hosts)."""
    uri = os.environ.get("ROS_MASTER_URI", "")
    m = re.match(r"https?://([^:/]+):(\d+)", uri)
    if not m:
        raise RuntimeError(f"ROS_MASTER_URI {uri!r} is not http://host:port")
    host, port = m.group(1), int(m.group(2))
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 1.0).close()
            return
        except OSError as exc:
            last = str(exc)
            time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for the master {host}:{port}: {last}")


def operator_helper(prefix: str, seconds: float, t0: float, first_only: bool, timeout: float) -> int:
    """Subscribe to the camera, run the Twist round trip for ``seconds`` and report the camera
    over the same window; print one JSON line (exit 1 with ``{"ok": false}`` on a timeout)."""
    t_start = time.time()
    if t0 <= 0:
        t0 = t_start
    try:
        _wait_master(timeout)
    except RuntimeError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}), flush=True)
        return 1
    import threading

    import rospy
    from sensor_msgs.msg import Image

    from overlay_manager.lab.probe.main import control_round_trip

    rospy.init_node("bench_operator", anonymous=True, disable_signals=True)
    frames: List[Tuple[float, float, float]] = []
    """(receive CLOCK_MONOTONIC s, receive wall s, header.stamp wall s) per frame."""
    first = threading.Event()

    def on_image(m: Image) -> None:
        frames.append((time.monotonic(), time.time(), m.header.stamp.to_sec()))
        first.set()

    rospy.Subscriber(f"{prefix}/image", Image, on_image, queue_size=1, buff_size=2 ** 24)
    if not first.wait(timeout):
        print(json.dumps({"ok": False, "error": f"no frame on {prefix}/image within {timeout:g} s"}), flush=True)
        return 1
    out: Dict[str, Any] = {"ok": True, "first_frame_s": frames[0][1] - t0, "subscriber_start_s": t_start - t0}
    if first_only:
        print(json.dumps(out), flush=True)
        return 0
    ctl = control_round_trip(rospy, f"{prefix}/cmd_vel", f"{prefix}/cmd_vel_echo", CONTROL_HZ, seconds, timeout)
    if ctl is None:
        print(json.dumps({"ok": False, "error": f"no echo on {prefix}/cmd_vel_echo"}), flush=True)
        return 1
    window = [f for f in frames if ctl["t_start"] <= f[0] <= ctl["t_end"]]
    cam_rate = rate_stats([f[0] for f in window], ctl["t_end"] - ctl["t_start"])
    cam_lat = latency_stats([(wall - stamp) * 1000 for _, wall, stamp in window], "camera_latency")
    out.update({
        "camera_hz": cam_rate["rate_hz"], "camera_max_gap_s": cam_rate["max_gap_s"],
        "camera_latency_p50_ms": cam_lat["camera_latency_p50_ms"],
        "camera_latency_p99_ms": cam_lat["camera_latency_p99_ms"],
        "control_sent": ctl["sent"], "control_echoed": ctl["received"],
        "control_rtt_p50_ms": ctl["rtt_p50_ms"], "control_rtt_p99_ms": ctl["rtt_p99_ms"],
        "control_lost_pct": 100.0 * (ctl["sent"] - ctl["received"]) / ctl["sent"] if ctl["sent"] else None,
    })
    print(json.dumps(out), flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``_operator`` (module doc)."""
    ap = argparse.ArgumentParser(prog="bench_measure")
    ap.add_argument("cmd", choices=["_operator"])
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--t0", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--first-only", action="store_true")
    a = ap.parse_args(argv)
    return operator_helper(a.prefix, a.seconds, a.t0, a.first_only, a.timeout)


if __name__ == "__main__":
    sys.exit(main())
