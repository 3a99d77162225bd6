"""The demo: a robot's camera across two buildings over the overlay, direct, then relayed.

    sudo bash scripts/demo            # setup + build + this module
    sudo /usr/bin/python3 -m overlay_manager.lab.demo [--spec config/lab/two_buildings.yaml]
                                                      [--live 20] [--blocked 30]

Steps (each narrated): a lab with two buildings behind NATs and Headscale; robot1 (building b1)
runs robot.launch as the ROS master (camera_topics:=/camera/image_raw: the link-aware encoder)
plus a 640x480 rgb8 camera at 30 Hz; the laptop (building b2) runs robot.launch and the decoder
of the link-aware stream; a live table of what the laptop's and robot1's overlay nodes report
(path, endpoint, latency) and, side by side, the rate and latency the laptop receives of the raw
topic and of the link-aware one; UDP blocked at b1's router: the path turns derp, the raw rate
drops while the link-aware stream keeps its rate at a lower JPEG quality; unblocked: direct again.
Everything is torn down at the end, also after Ctrl-C, SIGTERM or a failure (processes by pid, the run's namespaces).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..ros_names import overlay_node
from ..stats import percentile, summary
from . import robots
from .core import REPO_ROOT, Lab, missing_prerequisites
from .errors import LabError

ROBOT, LAPTOP = "alpha-robot1", "alpha-laptop"
CAMERA = "/camera/image_raw"
DECODED = "/camera/image_decoded"  # the link-aware <CAMERA>/compressed, decoded on the laptop
TICK_S = 2.0
NAME_W = max(len(ROBOT), len(LAPTOP))  # width of the live table's node and peer columns


def node(host: str) -> str:
    """The overlay node's name on ``host`` (robot.launch's namespace: ros_names.overlay_node)."""
    return overlay_node(host)


class PathSeen:
    """``until`` for Demo.live: notes when robot1's path on the laptop's node first shows ``path``
    (``after_s``: seconds after ``since``, a time.monotonic()) and is true once it has been shown
    for ``hold_s`` more seconds."""

    def __init__(self, path: str, since: float, hold_s: float) -> None:
        self.path, self.since, self.hold_s = path, since, hold_s
        self.after_s: Optional[float] = None

    def __call__(self, paths: Dict[str, Any]) -> bool:
        """paths: the laptop's node's view, peer -> (path, latency, via)."""
        if paths.get(ROBOT, [""])[0] == self.path and self.after_s is None:
            self.after_s = time.monotonic() - self.since
        return self.after_s is not None and time.monotonic() - self.since >= self.after_s + self.hold_s

    def seen_at(self) -> float:
        """time.monotonic() when the path was first shown; far in the future until then."""
        return self.since + (self.after_s if self.after_s is not None else 1e9)


class Demo:
    """The demo's steps; ``say`` prints narration, lab commands go to ``log``."""

    def __init__(self, spec: str, live_s: float, blocked_s: float, workdir: Path) -> None:
        self.spec, self.live_s, self.blocked_s, self.workdir = spec, live_s, blocked_s, workdir
        self.t0 = time.monotonic()
        self.log_path = workdir / "demo.log"
        self._log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in run()
        self.lab: Optional[Lab] = None
        self.rec: Optional[robots.Recorder] = None
        self.rec_la: Optional[robots.Recorder] = None  # the link-aware stream (decoded) on the laptop
        self.procs: List[subprocess.Popen] = []
        self.summary: Dict[str, Any] = {}

    def say(self, text: str) -> None:
        """A narration line on stdout, with the seconds since the demo started."""
        print(f"[demo {time.monotonic() - self.t0:5.1f}s] {text}", flush=True)

    def lab_echo(self, line: str) -> None:
        """The lab's echo: one command line into demo.log."""
        self._log.write(line + "\n")
        self._log.flush()

    # --- steps ------------------------------------------------------------------------------
    def run(self) -> None:
        """The steps, then the teardown whatever happened."""
        try:
            self._run()
        finally:
            self.teardown()
            self._log.close()

    def _run(self) -> None:
        """Steps 1 to 5 (6 is the teardown)."""
        self.say(f"1/6 building the campus lab from {self.spec}: a backbone, Headscale (control server "
                 "with its embedded DERP relay and STUN, TLS from a generated CA), building b1 and b2 "
                 "each behind its own NAT router, one network namespace per machine")
        self.lab = lab = Lab(self.spec, workdir=self.workdir / "lab", echo=self.lab_echo)
        lab.up()
        for b in lab.spec.buildings:
            self.say(f"    building {b.name}: NAT {b.nat.name}, public address {lab.address(b.name)}, hosts "
                     + ", ".join(f"{h.name} ({lab.address(h.name)})" for h in b.hosts))
        self.say(f"    Headscale at {lab.server_url}; lab commands are logged to {self.log_path}")

        self.say(f"2/6 {ROBOT} (b1): eval \"$(rosrun overlay_manager overlay_env --enrol --write-hosts)\" && "
                 f"roslaunch overlay_manager robot.launch camera_topics:={CAMERA}   (it is the ROS master; "
                 "camera_topics starts the link-aware encoder)")
        self.procs.append(robots.start_robot(lab, ROBOT, master=True, launch_args=[f"camera_topics:={CAMERA}"]))
        robots.peers(lab, ROBOT, timeout=90, node=node(ROBOT))
        self.say(f"    {ROBOT} enrolled as {ROBOT}.{lab.spec.control.base_domain} ({lab.overlay_ip(ROBOT)}); "
                 "starting its camera: 640x480 rgb8 sensor_msgs/Image at 30 Hz on /camera/image_raw "
                 "(textured: JPEG frames of about 30 KB, like a real camera)")
        self.procs.append(robots.start_tool(lab, ROBOT, ["rosnodes", "camera", "--topic", CAMERA,
                                                         "--pattern", "textured"], "camera"))
        self.say(f"    {LAPTOP} (b2): the same two commands, with --wait-master 90")
        self.procs.append(robots.start_robot(lab, LAPTOP, master=False))
        robots.peers(lab, LAPTOP, min_peers=1, timeout=120, node=node(LAPTOP))
        self.say(f"    {LAPTOP} enrolled as {LAPTOP}.{lab.spec.control.base_domain} ({lab.overlay_ip(LAPTOP)}); "
                 f"{time.monotonic() - self.t0:.0f} s since the start")
        self.say("    without the overlay the laptop could not reach robot1 at all: b1's NAT drops "
                 f"unsolicited connections to {lab.address(ROBOT)} (the system tests prove it)")

        self.say("3/6 the laptop subscribes to /camera/image_raw with the ROS env from overlay_env "
                 f"(ROS_MASTER_URI=http://{ROBOT}.{lab.spec.control.base_domain}:11311); live view of "
                 "both overlay nodes' ~peers and the frames the laptop receives:")
        self.rec = robots.Recorder(lab, LAPTOP, image=CAMERA, nodes=[node(LAPTOP), node(ROBOT)], name="demo")
        self.rec.wait("the first camera frame on the laptop", lambda ev: ev["ev"] == "frame", timeout=60)
        self.say(f"    and to the link-aware {CAMERA}/compressed through `rosrun overlay_manager compressed_decoder "
                 f"in:={CAMERA} out:={DECODED}` (JPEG, quality and rate fitted to the path)")
        self.procs.append(lab.popen(LAPTOP, ["bash", "-c", f"{robots.overlay_env_line(lab, LAPTOP)} && exec rosrun "
                                             f"overlay_manager compressed_decoder in:={CAMERA} out:={DECODED}"],
                                    env=robots.ros_env(lab, LAPTOP), log=Path(lab.host_dir(LAPTOP)) / "decoder.log"))
        self.rec_la = robots.Recorder(lab, LAPTOP, image=DECODED, name="demo_link_aware")
        self.rec_la.wait("the first link-aware frame on the laptop", lambda ev: ev["ev"] == "frame", timeout=60)
        self.rec.wait("robot1's path on the laptop's node", lambda ev: ev["ev"] == "peers"
                      and ev["node"] == node(LAPTOP) and ROBOT in ev["paths"], timeout=30)
        self.header()
        direct, direct_la = self.live(self.live_s)
        self.summary["direct_rate_hz"], self.summary["direct_link_aware_hz"] = direct, direct_la

        self.say("4/6 blocking UDP at building b1's router (nft: drop forwarded UDP both ways): "
                 "WireGuard over UDP is gone, tailscale falls back to the DERP relay over HTTPS")
        t_block = time.monotonic()
        lab.block_udp("b1")
        self.summary["blocked"] = True
        self.header()
        derp_seen = PathSeen("derp", t_block, hold_s=12)
        derp_rate, derp_la = self.live(self.blocked_s, until=derp_seen, rate_from=derp_seen.seen_at)
        self.summary["derp_rate_hz"], self.summary["derp_link_aware_hz"] = derp_rate, derp_la

        self.say("5/6 unblocking UDP at b1: tailscale finds the direct path again")
        t_unblock = time.monotonic()
        lab.unblock_udp("b1")
        self.summary["blocked"] = False
        self.header()
        direct_seen = PathSeen("direct", t_unblock, hold_s=6)
        self.live(20.0, until=direct_seen)
        self.rec.read()
        changes = [e for e in self.rec.events if e["ev"] == "change"
                   and e["node"] == node(LAPTOP) and e["peer"] == ROBOT and e["t"] >= t_block]
        self.say("    ~path_changes of the laptop's node for robot1 since the block: "
                 + "; ".join(f"{e['old']} -> {e['new']} at +{e['t'] - t_block:.1f} s" for e in changes))
        # exact times from the node's ~path_changes (the table above only samples every TICK_S)
        to_derp = [e["t"] - t_block for e in changes if e["new"] == "derp" and e["t"] < t_unblock]
        to_direct = [e["t"] - t_unblock for e in changes if e["new"] == "direct" and e["t"] >= t_unblock]
        self.summary["derp_after_s"] = to_derp[0] if to_derp else derp_seen.after_s
        self.summary["direct_again_after_s"] = to_direct[0] if to_direct else direct_seen.after_s
        s = self.summary
        self.say(f"    summary: raw camera on the laptop {s['direct_rate_hz']:.1f} Hz direct, "
                 f"{s['derp_rate_hz']:.1f} Hz relayed through DERP; link-aware {s['direct_link_aware_hz']:.1f} Hz "
                 f"direct, {s['derp_link_aware_hz']:.1f} Hz relayed (here both streams share the one relayed "
                 "tunnel and the raw one floods it; alone on derp the link-aware stream keeps 30 Hz, see "
                 "docs/bench.md); derp reported "
                 f"{_fmt_s(s.get('derp_after_s'))} after blocking UDP, direct again "
                 f"{_fmt_s(s.get('direct_again_after_s'))} after unblocking")

    def header(self) -> None:
        """The live table's column headings."""
        print(f"    {'time':>6}  {'node':<{NAME_W}} {'peer':<{NAME_W}} {'path':<7} {'via':<22} {'ping rtt':>9}   "
              "camera received on the laptop (last 2 s): raw | link-aware", flush=True)

    def live(self, seconds: float, until: Optional[Callable[[Dict[str, Any]], bool]] = None,
             rate_from: Optional[Callable[[], float]] = None) -> Tuple[float, float]:
        """Print the table every TICK_S for up to ``seconds`` (or until ``until(paths)``); returns
        the mean raw and link-aware camera rates over the ticks after ``rate_from()`` (default: all)."""
        assert self.rec is not None and self.rec_la is not None
        end = time.monotonic() + seconds
        rates: List[Tuple[float, float, float]] = []  # (time.monotonic(), raw Hz, link-aware Hz)

        def stream(rec: robots.Recorder, now: float) -> Tuple[float, str]:
            """Frames per second over the last TICK_S and the table cell saying it."""
            rec.read()
            frames = rec.frames(now - TICK_S, now)
            rate = len(frames) / TICK_S
            lats = [f["lat_ms"] for f in frames if f.get("lat_ms") is not None]
            return rate, (f"{rate:5.1f} Hz, latency {percentile(lats, 50):6.1f} ms" if lats else f"{rate:5.1f} Hz")

        while time.monotonic() < end:
            time.sleep(TICK_S)
            now = time.monotonic()
            rate, cam_raw = stream(self.rec, now)
            rate_la, cam_la = stream(self.rec_la, now)
            rates.append((now, rate, rate_la))
            cam = f"{cam_raw} | {cam_la}"
            views: Dict[str, Dict[str, Any]] = {}  # host -> its node's paths of each peer
            for who, peer in ((LAPTOP, ROBOT), (ROBOT, LAPTOP)):
                ev = next((e for e in reversed(self.rec.events) if e["ev"] == "peers" and e["node"] == node(who)
                           and peer in e["paths"]), None)
                path, lat, via = ev["paths"][peer] if ev else ("?", None, "")
                views[who] = ev["paths"] if ev else {}
                lat_s = f"{lat:6.2f} ms" if lat is not None else "       ?"
                print((f"    {now - self.t0:5.0f}s  {who:<{NAME_W}} {peer:<{NAME_W}} {path:<7} {via:<22} {lat_s:>9}   "
                       + (cam if who == LAPTOP else "")).rstrip(), flush=True)
            if until is not None and until(views.get(LAPTOP, {})):
                break
        start = rate_from() if rate_from else 0.0
        used = [r for r in rates if r[0] - TICK_S >= start] or rates
        raw, link_aware = (summary([r[i] for r in used])["mean"] if used else 0.0 for i in (1, 2))
        return raw, link_aware

    def teardown(self) -> None:
        """Always: stop the recorder and ROS processes by pid, unblock, take the lab down."""
        self.say("6/6 tearing down: ROS processes (by pid), tailscaled, Headscale, the run's namespaces")
        for rec in (self.rec, self.rec_la):
            if rec is not None:
                _quietly(rec.stop)
        if self.lab is not None:
            for p in reversed(self.procs):
                _quietly(lambda p=p: robots.stop(self.lab, p))
            _quietly(self.lab.down)
        self.say(f"done; logs kept in {self.workdir}")


def _fmt_s(v: Optional[float]) -> str:
    """Seconds for the summary line, "(not seen)" for None."""
    return f"{v:.1f} s" if v is not None else "(not seen)"


def _quietly(fn: Callable[[], Any]) -> None:
    """Run one teardown step; a failure is printed and the teardown goes on."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - teardown goes on; the problem is printed
        print(f"[demo] teardown problem: {exc}", file=sys.stderr, flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: exit 0 after a full run, 1 on a lab failure, 130 on Ctrl-C."""
    ap = argparse.ArgumentParser(prog="demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(REPO_ROOT / "config" / "lab" / "two_buildings.yaml"),
                    help="lab spec with alpha-robot1 and alpha-laptop in two buildings (default: %(default)s)")
    ap.add_argument("--live", type=float, default=20.0, help="seconds of live table before blocking UDP")
    ap.add_argument("--blocked", type=float, default=30.0, help="at most this many seconds with UDP blocked")
    args = ap.parse_args(argv)
    missing = missing_prerequisites()
    if missing:
        print("demo: the lab cannot run here, missing: " + "; ".join(missing), file=sys.stderr)
        return 1

    def on_term(_sig: int, _frame: Optional[FrameType]) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    workdir = Path(tempfile.mkdtemp(prefix="overlay-demo-"))
    demo = Demo(args.spec, args.live, args.blocked, workdir)
    try:
        demo.run()
    except KeyboardInterrupt:
        print("[demo] interrupted: torn down", file=sys.stderr)
        return 130
    except LabError as exc:
        print(f"[demo] failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
