"""The demo: a robot's camera across two buildings over the overlay, direct, then relayed.

    sudo bash scripts/demo            # setup + build + this module
    sudo /usr/bin/python3 -m overlay_manager.lab.demo.run [--spec config/lab/two_buildings.yaml]
                                                      [--live 20] [--blocked 30] [--video FILE]

Steps (each narrated): a lab with two buildings behind NATs and Headscale; robot1 (building b1)
runs robot.launch as the ROS master (camera_topics:=/camera/image_raw: the link-aware encoder)
plus the lab camera playing a real scene (opencv-doc's vtest.avi, or ``--video FILE``: any video
OpenCV reads; 640x480 rgb8, 30 Hz, frame index in header.frame_id);
the laptop (building b2) runs robot.launch; a live table of what the laptop's and robot1's
overlay nodes report (path, endpoint, latency) and the rate and latency of the raw camera the
laptop receives; UDP blocked at b1's router: the path turns derp and the raw rate drops; then
on the relayed path each stream alone (raw, link-aware JPEG, link-aware H.264 where the encoder
publishes it), so none floods the tunnel for the other: rate, latency, bitrate and PSNR against
the source frame (probe quality); unblocked: direct again.
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
from typing import Any, Callable, Dict, List, Optional

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.core.stats import percentile, summary
from overlay_manager.lab.campus import camera_streams, robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import REPO_ROOT, missing_prerequisites
from overlay_manager.lab.probe.scene import DEFAULT_VIDEO, scene_label

ROBOT, LAPTOP = "alpha-robot1", "alpha-laptop"
CAMERA = "/camera/image_raw"
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

    def __init__(self, spec: str, live_s: float, blocked_s: float, workdir: Path, stream_s: float = 8.0,
                 video: str = "") -> None:
        self.spec, self.live_s, self.blocked_s, self.workdir = spec, live_s, blocked_s, workdir
        self.stream_s = stream_s
        self.video = video  # the file the camera plays ("" = the default scene)
        self.t0 = time.monotonic()
        self.log_path = workdir / "demo.log"
        self._log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in run()
        self.lab: Optional[Lab] = None
        self.rec: Optional[robots.Recorder] = None  # the overlay nodes' views (paths, changes)
        self.rec_raw: Optional[robots.Recorder] = None  # the raw camera frames on the laptop
        self.streams: Dict[str, str] = {}  # kind -> topic of the camera's streams
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
        scene = scene_label(self.video) if self.video else f"{DEFAULT_VIDEO.name}, pedestrians"
        self.say(f"    {ROBOT} enrolled as {ROBOT}.{lab.spec.control.base_domain} ({lab.overlay_ip(ROBOT)}); "
                 f"starting its camera: a real scene ({scene}) as 640x480 rgb8 "
                 f"sensor_msgs/Image at 30 Hz on {CAMERA}, each frame's index in header.frame_id")
        self.procs.append(robots.start_tool(lab, ROBOT, ["probe.rosnodes", "camera", "--topic", CAMERA,
                                                         *camera_streams.video_args(self.video)], "camera"))
        self.say(f"    {LAPTOP} (b2): the same two commands, with --wait-master 90")
        self.procs.append(robots.start_robot(lab, LAPTOP, master=False))
        robots.peers(lab, LAPTOP, min_peers=1, timeout=120, node=node(LAPTOP))
        self.say(f"    {LAPTOP} enrolled as {LAPTOP}.{lab.spec.control.base_domain} ({lab.overlay_ip(LAPTOP)}); "
                 f"{time.monotonic() - self.t0:.0f} s since the start")
        self.say("    without the overlay the laptop could not reach robot1 at all: b1's NAT drops "
                 f"unsolicited connections to {lab.address(ROBOT)} (the system tests prove it)")

        self.say(f"3/6 the laptop subscribes to {CAMERA} with the ROS env from overlay_env "
                 f"(ROS_MASTER_URI=http://{ROBOT}.{lab.spec.control.base_domain}:11311); live view of "
                 "both overlay nodes' ~peers and the frames the laptop receives:")
        self.rec = robots.Recorder(lab, LAPTOP, nodes=[node(LAPTOP), node(ROBOT)], name="demo")
        self.rec_raw = robots.Recorder(lab, LAPTOP, image=CAMERA, name="demo_raw")
        self.rec_raw.wait("the first camera frame on the laptop", lambda ev: ev["ev"] == "frame", timeout=60)
        self.rec.wait("robot1's path on the laptop's node", lambda ev: ev["ev"] == "peers"
                      and ev["node"] == node(LAPTOP) and ROBOT in ev["paths"], timeout=30)
        self.header()
        self.summary["direct_rate_hz"] = self.live(self.live_s)

        self.say("4/6 blocking UDP at building b1's router (nft: drop forwarded UDP both ways): "
                 "WireGuard over UDP is gone, tailscale falls back to the DERP relay over HTTPS")
        t_block = time.monotonic()
        lab.block_udp("b1")
        self.summary["blocked"] = True
        self.header()
        derp_seen = PathSeen("derp", t_block, hold_s=6)
        self.live(self.blocked_s, until=derp_seen)
        self.rec_raw.stop()  # unsubscribed: from here each stream has the relayed tunnel to itself
        self.rec_raw = None
        self.streams = camera_streams.detect_streams(lab, LAPTOP, CAMERA, wait_s=2.0)
        kinds = [k for k in ("raw", "jpeg", "h264") if k in self.streams]
        self.say(f"    on the relayed path, each stream alone for {self.stream_s:g} s (the others unsubscribed, so "
                 "none floods the tunnel); rate, latency (receive time - header.stamp), bitrate received, PSNR "
                 "of each decoded picture against its source frame:")
        self.summary["derp"] = {}
        for kind in kinds:
            q = camera_streams.quality(lab, LAPTOP, [(kind, self.streams[kind])], self.stream_s, video=self.video)
            row = q["streams"][self.streams[kind]]
            self.summary["derp"][kind] = row
            print(f"      {camera_streams.KIND_LABELS[kind]:<17} {self.streams[kind]:<34} {stream_cells(row)}",
                  flush=True)
        if "h264" not in kinds:
            self.say("    (no link-aware H.264 stream here: this encoder publishes JPEG only)")

        self.say("5/6 unblocking UDP at b1: tailscale finds the direct path again")
        t_unblock = time.monotonic()
        lab.unblock_udp("b1")
        self.summary["blocked"] = False
        self.rec_raw = robots.Recorder(lab, LAPTOP, image=CAMERA, name="demo_raw_again")
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
        relayed = "; ".join(f"{camera_streams.KIND_LABELS[k]} {stream_cells(r, short=True)}"
                            for k, r in s["derp"].items())
        self.say(f"    summary: raw camera on the laptop {s['direct_rate_hz']:.1f} Hz direct; relayed through DERP, "
                 f"each stream alone: {relayed}; derp reported {_fmt_s(s.get('derp_after_s'))} after blocking UDP, "
                 f"direct again {_fmt_s(s.get('direct_again_after_s'))} after unblocking")

    def header(self) -> None:
        """The live table's column headings."""
        print(f"    {'time':>6}  {'node':<{NAME_W}} {'peer':<{NAME_W}} {'path':<7} {'via':<22} {'ping rtt':>9}   "
              "raw camera received on the laptop (last 2 s)", flush=True)

    def live(self, seconds: float, until: Optional[Callable[[Dict[str, Any]], bool]] = None) -> float:
        """Print the table every TICK_S for up to ``seconds`` (or until ``until(paths)``); returns
        the mean raw camera rate over the ticks."""
        assert self.rec is not None and self.rec_raw is not None
        end = time.monotonic() + seconds
        rates: List[float] = []

        while time.monotonic() < end:
            time.sleep(TICK_S)
            now = time.monotonic()
            self.rec.read()
            self.rec_raw.read()
            frames = self.rec_raw.frames(now - TICK_S, now)
            rate = len(frames) / TICK_S
            lats = [f["lat_ms"] for f in frames if f.get("lat_ms") is not None]
            cam = f"{rate:5.1f} Hz, latency {percentile(lats, 50):6.1f} ms" if lats else f"{rate:5.1f} Hz"
            rates.append(rate)
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
        return summary(rates)["mean"] if rates else 0.0

    def teardown(self) -> None:
        """Always: stop the recorder and ROS processes by pid, unblock, take the lab down."""
        self.say("6/6 tearing down: ROS processes (by pid), tailscaled, Headscale, the run's namespaces")
        for rec in (self.rec, self.rec_raw):
            if rec is not None:
                _quietly(rec.stop)
        if self.lab is not None:
            for p in reversed(self.procs):
                _quietly(lambda p=p: robots.stop(self.lab, p))
            _quietly(self.lab.down)
        self.say(f"done; logs kept in {self.workdir}")


def stream_cells(row: Dict[str, Any], short: bool = False) -> str:
    """One stream's rate, latency, bitrate and PSNR as the demo prints them (a quality probe's row)."""
    def num(v: Optional[float], fmt: str) -> str:
        return "?" if v is None else fmt.format(v)

    p = row.get("psnr_mean")
    psnr_s = "PSNR lossless" if p is not None and p >= 99 else f"PSNR {num(p, '{:.1f}')} dB"
    if short:
        return (f"{num(row.get('rate_hz'), '{:.1f}')} Hz, {num(row.get('latency_p50_ms'), '{:.0f}')} ms, "
                f"{num((row.get('kbps') or 0) / 1000, '{:.1f}')} Mbit/s, {psnr_s}")
    return (f"{num(row.get('rate_hz'), '{:5.1f}')} Hz, latency p50 {num(row.get('latency_p50_ms'), '{:5.0f}')} ms / "
            f"p99 {num(row.get('latency_p99_ms'), '{:5.0f}')} ms, {num((row.get('kbps') or 0) / 1000, '{:6.1f}')} "
            f"Mbit/s, {psnr_s}")


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
    ap.add_argument("--blocked", type=float, default=30.0, help="at most this many seconds waiting for derp")
    ap.add_argument("--stream", type=float, default=8.0, help="seconds each stream is measured alone on derp")
    camera_streams.add_video_argument(ap)
    args = ap.parse_args(argv)
    video = camera_streams.bench_video("demo", args.video)
    if video is None:
        return 2
    missing = missing_prerequisites()
    if missing:
        print("demo: the lab cannot run here, missing: " + "; ".join(missing), file=sys.stderr)
        return 1

    def on_term(_sig: int, _frame: Optional[FrameType]) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    workdir = Path(tempfile.mkdtemp(prefix="overlay-demo-"))
    demo = Demo(args.spec, args.live, args.blocked, workdir, args.stream, video)
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
