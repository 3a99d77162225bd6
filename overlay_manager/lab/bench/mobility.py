"""Benchmark of robots that move (scripts/bench_mobility, not a test).

    sudo -E bash scripts/bench_mobility [--scenario NAME]... [--runs N] [--flaps 100] [--out artifacts]

Campus config/lab/mobility_campus.yaml: alpha-robot1 (b1, eim-adpf; ROS master, the lab camera
640x480 rgb8 30 Hz served by robot.launch's link-aware encoder as H.264, a Twist echo),
alpha-laptop (b3, eim-adpf; views the H.264 stream and runs a 50 Hz Twist round trip laptop ->
robot -> laptop), relay1 (public; the fleet's peer relay), alpha-robot2 (b2, adm-eif; where
robot1 roams). Live traffic runs throughout; each scenario is one campus action, measured
(mobility_report.py) from that action's ActionLog time:

=================  =======================================================================
direct-derp        UDP blocked at b1 (robot1 <-> laptop direct -> derp); then unblocked
relay-derp         b1's UDP limited to the campus servers (peer-relay via relay1), then
                   relay1's tailscaled killed (kill -9): peer-relay -> derp
derp-relay         right after relay-derp: relay1's tailscaled started again: derp -> peer-relay
                   (``peers_s`` = the time to upgrade)
move               robot1 roams to b2 (new address, gateway and NAT kind): ~peers right = the
                   laptop's node lists robot1 direct at b2's public address
move-back          robot1 roams home to b1
flaps              ``--flaps`` one-second carrier losses of robot1's LAN link, one every 2 s: after
                   the last one direct within 5 s, the topics at full rate, the nodes' memory and
                   threads before and after (one run)
derp-home-blocked  config/lab/derp_campus.yaml (own lab): robot1 behind a symmetric NAT whose UDP
                   is blocked, regions east and west; the derper of robot1's home region killed
                   (kill -9, host up): camera and Twist gaps, the seconds until each is back
derp-home-open     the same with UDP available
=================  =======================================================================

Writes ``<out>/bench_mobility.json`` (every run: its action record, gaps, ~peers times, the
recorder's path changes) and prints the summary table (p50 / p95 / max over the runs).
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.core.stats import latency_stats
from overlay_manager.lab.bench.mobility_report import (
    back_after,
    connections_before_after,
    first_after,
    longest_gap_after,
    markdown,
    peer_is,
    ping_reply_times,
    summarise,
)
from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.derp_outage import home_region, per_second_rates
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import REPO_ROOT
from overlay_manager.lab.campus.system import wait_for

SPEC = REPO_ROOT / "config" / "lab" / "mobility_campus.yaml"
DERP_SPEC = REPO_ROOT / "config" / "lab" / "derp_campus.yaml"
ROBOT, LAPTOP, RELAY, OTHER = "alpha-robot1", "alpha-laptop", "relay1", "alpha-robot2"
HOME, AWAY = "b1", "b2"
RAW = "/camera/image_raw"
H264 = RAW + "/link_aware_h264"
TWIST_HZ = 50.0
SCENARIOS = ("direct-derp", "relay-derp", "derp-relay", "move", "move-back", "flaps",
             "derp-home-blocked", "derp-home-open")
CAMPUS_SCENARIOS = SCENARIOS[:6]


def say(msg: str) -> None:
    """Progress line on stderr (stdout carries the table)."""
    import sys
    print(f"[bench_mobility] {msg}", file=sys.stderr, flush=True)


class Traffic:
    """Live ROS traffic on a lab campus and its observers.

    ``robot`` runs robot.launch as the ROS master with the camera served link-aware (H.264 where
    the encoder publishes it), the lab camera and the Twist echo; ``viewer`` runs robot.launch,
    a recorder of the camera stream and of both nodes' ~peers (``rec``), and a recorder on the
    robot of the robot's node (``rec_robot``). Everything is stopped by pid in :meth:`stop`.
    """

    def __init__(self, lab: Lab, robot: str, viewer: str) -> None:
        self.lab, self.robot, self.viewer = lab, robot, viewer
        self.procs: List[Any] = []
        self.rec: Optional[robots.Recorder] = None
        self.rec_robot: Optional[robots.Recorder] = None
        self.stream = RAW
        self.ping_log: Optional[Path] = None

    def start_overlay_ping(self) -> None:
        """A 100 Hz ICMP echo from the viewer to the robot's overlay address (``ping -D``, its
        replies' wall-clock times go to a log file): the overlay's own gaps, without TCP."""
        self.ping_log = Path(self.lab.host_dir(self.viewer)) / "overlay-ping.log"
        self.procs.append(self.lab.popen(self.viewer, ["ping", "-D", "-n", "-i", "0.01", "-W", "1",
                                                       self.lab.overlay_ip(self.robot)], log=self.ping_log))

    def overlay_replies(self, wall_minus_mono: float) -> List[float]:
        """Monotonic times of the overlay ping's replies so far (empty without the ping)."""
        if self.ping_log is None or not self.ping_log.exists():
            return []
        return ping_reply_times(self.ping_log.read_text(errors="replace").splitlines(), wall_minus_mono)

    def start(self) -> None:
        """robot.launch on both (robot first: the master), camera and echo, then the recorders."""
        lab = self.lab
        self.procs.append(robots.start_robot(lab, self.robot, True, [f"camera_topics:={RAW}"]))
        robots.peers(lab, self.robot, timeout=90, node=overlay_node(self.robot))
        self.procs.append(robots.start_robot(lab, self.viewer, False))
        robots.peers(lab, self.viewer, min_peers=1, timeout=120, node=overlay_node(self.viewer))
        self.procs.append(robots.start_camera(lab, self.robot, RAW, 30.0))
        self.procs.append(robots.start_echo(lab, self.robot))
        topics = robots.run_probe(lab, self.viewer, ["topics", "--wait-for", H264, "--timeout", "20"],
                                  timeout=40).get("topics", {})
        self.stream = H264 if H264 in topics else RAW
        say(f"camera stream measured: {self.stream}")
        self.rec = robots.Recorder(lab, self.viewer, image=self.stream, nodes=[overlay_node(self.viewer)],
                                   name="mobility-record", compressed=self.stream != RAW, twist_rate=TWIST_HZ)
        self.rec_robot = robots.Recorder(lab, self.robot, nodes=[overlay_node(self.robot)], name="mobility-robot")
        self.rec.wait("the first camera message", lambda e: e["ev"] == "frame", timeout=90)
        self.rec.wait("the first Twist echo", lambda e: e["ev"] == "echo", timeout=60)
        self.start_overlay_ping()

    def stop(self) -> None:
        """Stop the recorders and everything started, by pid."""
        for r in (self.rec, self.rec_robot):
            if r is not None:
                r.stop()
        for p in reversed(self.procs):
            try:
                robots.stop(self.lab, p, timeout=10)
            except Exception as exc:  # noqa: BLE001 - stop the rest; the lab's down() is the backstop
                say(f"stopping pid {p.pid}: {exc}")

    def node_pid(self, host: str) -> int:
        """The pid of the overlay node on ``host`` (its getPid)."""
        return int(robots.run_probe(self.lab, host, ["pid", overlay_node(host)], timeout=40)["pid"])

    def wait_path(self, path: str, timeout: float, endpoint_host: str = "") -> float:
        """Wait until the viewer's node lists the robot on ``path``; returns when (monotonic)."""
        assert self.rec is not None
        pred = peer_is(overlay_node(self.viewer), self.robot, path, endpoint_host)

        def now_ok() -> Optional[float]:
            self.rec.read()
            last = [e for e in self.rec.events if e["ev"] == "peers" and e["node"] == overlay_node(self.viewer)]
            return last[-1]["t"] if last and pred(last[-1]) else None

        def seen() -> str:
            last = [e for e in self.rec.events if e["ev"] == "peers"][-1:]
            return f"last ~peers: {json.dumps(last)[:400]}"

        if now_ok() is None:  # a disco ping makes the path show (idle links have none)
            try:
                robots.call(self.lab, self.viewer, f"{overlay_node(self.viewer)}/ping_peer",
                            "overlay_manager/PingPeer", name=self.robot, count=1, timeout=5.0)
            except LabError:
                pass
        return wait_for(f"{overlay_node(self.viewer)} ~peers: {self.robot} {path}"
                        + (f" at {endpoint_host}" if endpoint_host else ""), now_ok, timeout, 0.3, seen)

    def wait_flowing(self, timeout: float, min_share: float = 0.5) -> None:
        """Wait until the camera and the Twist echoes arrived at ``min_share`` of their rates in
        the last second (a previous event may have left a stream stopped)."""
        assert self.rec is not None
        rec = self.rec

        def flowing() -> bool:
            rec.read()
            now = time.monotonic()
            frames = sum(1 for e in rec.events[-200:] if e["ev"] == "frame" and e["t"] >= now - 1.0)
            echoes = sum(1 for e in rec.events[-200:] if e["ev"] == "echo" and e["t"] >= now - 1.0)
            return frames >= 30 * min_share and echoes >= TWIST_HZ * min_share

        def seen() -> str:
            now = time.monotonic()
            last = {k: max((e["t"] for e in rec.events if e["ev"] == k), default=None) for k in ("frame", "echo")}
            return ", ".join(f"last {k} {now - t:.1f} s ago" if t else f"no {k} yet" for k, t in last.items())

        wait_for("the camera and the Twist round trip to flow at half rate or more", flowing, timeout, 0.3, seen)

    def event(self, name: str, action: Callable[[], Dict[str, Any]], expect: str, endpoint_host: str = "",
              robot_expect: str = "", before_s: float = 3.0, window_s: float = 15.0) -> Dict[str, Any]:
        """Run ``action`` under live traffic and measure it (see mobility_report.py).

        ``expect``/``endpoint_host``: the viewer node's ~peers entry for the robot that counts as
        right afterwards ("" = none is waited for); ``robot_expect``: the robot node's path for
        the viewer likewise.
        The Twist round trip runs all the time (the recorder's ``echo`` events); the event looks at
        ``before_s`` s before the action and ``window_s`` s after it.
        """
        assert self.rec is not None and self.rec_robot is not None
        errors: List[str] = []
        self.wait_flowing(90.0)
        time.sleep(before_s)
        rec = action()
        t_act = rec["t_mono"]
        t_end = t_act + window_s
        vnode, rnode = overlay_node(self.viewer), overlay_node(self.robot)
        pred = peer_is(vnode, self.robot, expect, endpoint_host)
        rpred = peer_is(rnode, self.viewer, robot_expect) if robot_expect else None
        ok = None
        try:
            if expect:
                ok = self.rec.wait(f"{vnode} ~peers: {self.robot} {expect}", pred,
                                   timeout=max(0.5, t_end - time.monotonic()), since=t_act)
        except LabError as exc:
            errors.append(str(exc).splitlines()[0][:300])
        time.sleep(max(0.0, t_end + 1.0 - time.monotonic()))  # + 1 s: the recorder's lines arrive
        self.rec.read()
        self.rec_robot.read()
        frames = [e["t"] for e in self.rec.events if e["ev"] == "frame"]
        echoes = [e for e in self.rec.events if e["ev"] == "echo"]
        echo_t = [e["t"] for e in echoes]
        rtts = [e["rtt_ms"] for e in echoes if t_act - before_s <= e["t"] < t_end]
        rok = first_after(self.rec_robot.events, t_act, rpred) if rpred else None
        pings = self.overlay_replies(rec["t_wall"] - rec["t_mono"])
        out: Dict[str, Any] = {
            "scenario": name, "action": rec, "stream": self.stream,
            "camera_gap_s": longest_gap_after(frames, t_act, t_end),
            "camera_back_s": back_after(frames, t_act, t_end),
            "twist_gap_s": longest_gap_after(echo_t, t_act, t_end),
            "twist_back_s": back_after(echo_t, t_act, t_end),
            "overlay_gap_s": longest_gap_after(pings, t_act, t_end) if pings else None,
            "twist": {"echoes": len(rtts), "expected": int((window_s + before_s) * TWIST_HZ),
                      **latency_stats(rtts, "rtt")},
            "peers_s": round(ok["t"] - t_act, 2) if ok else None,
            "robot_peers_s": round(rok["t"] - t_act, 2) if rok else None,
            "camera_rates_hz": per_second_rates(frames, t_act - before_s, t_end),
            "changes": [f"{e['node']}: {e['peer']} {e['old']}->{e['new']} @{e['t'] - t_act:+.2f}s"
                        for e in self.rec.events + self.rec_robot.events
                        if e["ev"] == "change" and t_act - 1 <= e["t"] <= t_end],
        }
        same = connections_before_after(self.rec.events, t_act, t_end)
        out["same_connections"] = same
        out["connections"] = [e["connections"] for e in self.rec.events if e["ev"] == "conns" and e["t"] <= t_end][-1:]
        if errors:
            out["error"] = "; ".join(errors)
        say(f"{name}: Twist gap {out['twist_gap_s']} s, camera gap {out['camera_gap_s']} s, overlay (ICMP) gap "
            f"{out['overlay_gap_s']} s, ~peers right "
            f"{out['peers_s']} s (robot {out['robot_peers_s']} s), same connections {out['same_connections']}"
            + (f"; {out['error']}" if errors else ""))
        return out


def proc_usage(pid: int) -> Dict[str, Any]:
    """RSS (KiB) and thread count of a process from /proc/<pid>/status."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return {"rss_kib": int(fields.get("VmRSS", "0 kB").split()[0]), "threads": int(fields.get("Threads", "0"))}


def campus(args: argparse.Namespace, wanted: Sequence[str]) -> Dict[str, List[Dict[str, Any]]]:
    """The scenarios on config/lab/mobility_campus.yaml, ``args.runs`` times each (flaps once)."""
    res: Dict[str, List[Dict[str, Any]]] = {k: [] for k in wanted}
    with Lab(SPEC, workdir=Path(args.out) / "lab-mobility") as lab:
        lab.tailscale_up_all([RELAY, OTHER])
        lab.enable_relays()
        tr = Traffic(lab, ROBOT, LAPTOP)
        try:
            tr.start()
            wan = {b: lab.address(b) for b in (HOME, AWAY)}
            for i in range(args.runs):
                say(f"round {i + 1}/{args.runs}")
                if "direct-derp" in wanted:
                    tr.wait_path("direct", 60)
                    res["direct-derp"].append(tr.event("direct-derp", lambda: lab.block_udp(HOME), "derp",
                                                       robot_expect="derp"))
                    lab.unblock_udp(HOME)
                if "relay-derp" in wanted or "derp-relay" in wanted:
                    tr.wait_path("direct", 60)
                    lab.udp_servers_only(HOME)
                    tr.wait_path("peer-relay", 120)
                    if "relay-derp" in wanted:
                        res["relay-derp"].append(tr.event("relay-derp", lambda: lab.kill_tailscaled(RELAY), "derp",
                                                          robot_expect="derp"))
                    else:
                        lab.kill_tailscaled(RELAY)
                        tr.wait_path("derp", 30)
                    if "derp-relay" in wanted:
                        res["derp-relay"].append(tr.event("derp-relay", lambda: lab.restore_tailscaled(RELAY),
                                                          "peer-relay", robot_expect="peer-relay",
                                                          window_s=args.relay_window))
                    else:
                        lab.restore_tailscaled(RELAY)
                    lab.unblock_udp(HOME)
                if "move" in wanted or "move-back" in wanted:
                    tr.wait_path("direct", 60)
                    r = tr.event("move", lambda: lab.move(ROBOT, AWAY), "direct", endpoint_host=wan[AWAY],
                                 robot_expect="direct")
                    if "move" in wanted:
                        res["move"].append(r)
                    r = tr.event("move-back", lambda: lab.move_home(ROBOT), "direct", endpoint_host=wan[HOME],
                                 robot_expect="direct")
                    if "move-back" in wanted:
                        res["move-back"].append(r)
            if "flaps" in wanted:
                res["flaps"].append(flaps(lab, tr, args.flaps))
        except BaseException as exc:
            record_failure(lab, [ROBOT, LAPTOP], wanted, res, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            tr.stop()
    return res


def record_failure(lab: Lab, hosts: List[str], wanted: Sequence[str], res: Dict[str, List[Dict[str, Any]]],
                   exc: BaseException) -> None:
    """A scenario run that stopped on `exc`: says so, prints the hosts' launch logs and records the
    error as one result of every wanted scenario (the report shows it instead of a gap)."""
    say(f"failed: {type(exc).__name__}: {exc}")
    robots.print_launch_logs(lab, hosts)
    for k in wanted:
        res[k].append({"scenario": k, "error": f"{type(exc).__name__}: {exc}"})


def flaps(lab: Lab, tr: Traffic, count: int) -> Dict[str, Any]:
    """``count`` one-second carrier losses of the robot's LAN link, one every 2 s, under traffic."""
    tr.wait_path("direct", 60)
    pids = {h: tr.node_pid(h) for h in (ROBOT, LAPTOP)}
    before = {h: proc_usage(p) for h, p in pids.items()}
    holder: Dict[str, Any] = {}
    series: List[Dict[str, Any]] = []   # the nodes' RSS and threads every 10 s while it flaps
    done = threading.Event()
    t_start = time.monotonic()

    def sample() -> None:
        while not done.wait(10.0):
            try:
                series.append({"t_s": round(time.monotonic() - t_start, 1),
                               **{h: proc_usage(p) for h, p in pids.items()}})
            except OSError as exc:  # a node gone: the series ends, the report says why
                series.append({"t_s": round(time.monotonic() - t_start, 1), "error": str(exc)})
                return

    sampler = threading.Thread(target=sample, name="flaps-usage", daemon=True)
    sampler.start()

    def action() -> Dict[str, Any]:
        recs = lab.flap(ROBOT, "link", count, 2.0, 1.0)
        holder["records"] = recs
        return recs[0]

    try:
        r = tr.event("flaps", action, "", robot_expect="", window_s=2.0 * count + 10.0)
    finally:
        done.set()
        sampler.join(timeout=5.0)
    recs = holder.get("records", [])
    t_last = recs[-1]["t_mono"] if recs else r["action"]["t_mono"]
    assert tr.rec is not None
    back = first_after(tr.rec.events, t_last, peer_is(overlay_node(LAPTOP), ROBOT, "direct"))
    last_peers = [e for e in tr.rec.events if e["ev"] == "peers" and e["node"] == overlay_node(LAPTOP)
                  and e["t"] <= t_last]
    frames = [e["t"] for e in tr.rec.events if e["ev"] == "frame"]
    r.update({
        "flaps": count, "actions": len(recs),
        "direct_after_last_s": (0.0 if last_peers and peer_is(overlay_node(LAPTOP), ROBOT, "direct")(last_peers[-1])
                                else round(back["t"] - t_last, 2) if back else None),
        "camera_hz_5_to_10_s_after_last": round(len([t for t in frames if t_last + 5 <= t < t_last + 10]) / 5.0, 1),
        "usage_before": before, "usage_after": {h: proc_usage(p) for h, p in pids.items()},
        "usage_series": series,
    })
    keys = ("direct_after_last_s", "camera_hz_5_to_10_s_after_last", "usage_before", "usage_after")
    say(f"flaps: {json.dumps({k: r[k] for k in keys})}")
    return r


def derp_home(args: argparse.Namespace, wanted: Sequence[str]) -> Dict[str, List[Dict[str, Any]]]:
    """The home-derper scenarios on config/lab/derp_campus.yaml (own lab)."""
    robot, op = "alpha-robot1", "alpha-op1"
    derpers = {"east": "east-derp", "west": "west-derp"}
    res: Dict[str, List[Dict[str, Any]]] = {k: [] for k in wanted}
    with Lab(DERP_SPEC, workdir=Path(args.out) / "lab-mobility-derp") as lab:
        lab.start_derpers()
        tr = Traffic(lab, robot, op)
        try:
            tr.start()
            for i in range(args.runs):
                for name in wanted:
                    blocked = name == "derp-home-blocked"
                    tr.wait_path("derp", 60)
                    if blocked:
                        lab.block_udp("north")
                    time.sleep(3.0)
                    region = home_region(lab, robot)
                    victim = derpers.get(region)
                    if victim is None:
                        raise LabError(f"{robot}'s home region is {region!r}, not one of {sorted(derpers)}")
                    r = tr.event(name, lambda v=victim: lab.kill_derper(v), "derp", window_s=args.derp_window)
                    r["home_before"], r["home_after"] = region, home_region(lab, robot)
                    r["op_home_after"] = home_region(lab, op)
                    res[name].append(r)
                    lab.start_derper(victim)
                    if blocked:
                        lab.unblock_udp("north")
                    say(f"{name} run {i + 1}: home {region} -> {r['home_after']}, camera back "
                        f"{r['camera_back_s']} s, Twist back {r['twist_back_s']} s")
        except BaseException as exc:
            record_failure(lab, [robot, op], wanted, res, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            tr.stop()
    return res


def roam_spec(machines: int) -> Dict[str, Any]:
    """Two buildings (eim-adpf, adm-eif) with ``machines`` hosts split between them."""
    half = (machines + 1) // 2
    names = [f"m{i + 1:02d}" for i in range(machines)]
    return {"name": "roam_fleet", "buildings": {
        "ra": {"nat": "eim-adpf", "hosts": {n: {"team": "alpha", "role": "robot"} for n in names[:half]}},
        "rb": {"nat": "adm-eif", "hosts": {n: {"team": "alpha", "role": "robot"} for n in names[half:]}}}}


def headscale_roam(args: argparse.Namespace) -> Dict[str, Any]:
    """headscale's CPU while ``args.machines`` enrolled machines each roam to the other building
    and back, one move every ``args.period`` s per machine (staggered evenly), for ``args.seconds``
    s; against the same window with nobody moving. CPU from /proc (user + system seconds)."""
    from overlay_manager.lab.bench.derp import _proc_cpu_s

    spec = roam_spec(args.machines)
    out: Dict[str, Any] = {"machines": args.machines, "period_s": args.period, "seconds": args.seconds,
                           "traffic": "none besides tailscale's own (idle links)"}
    with Lab(spec, workdir=Path(args.out) / "lab-roam") as lab:
        t0 = time.monotonic()
        lab.tailscale_up_all(timeout=180)
        out["enrol_s"] = round(time.monotonic() - t0, 1)
        hs = lab.procs.procs["headscale"].pid
        hosts = list(lab.hosts)
        other = {h: ("rb" if lab.spec.host(h).building == "ra" else "ra") for h in hosts}
        time.sleep(10.0)  # enrolment's map updates settle

        def sample() -> Dict[str, float]:
            busy_total = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            return {"headscale": _proc_cpu_s(hs),
                    "tailscaleds": sum(_proc_cpu_s(p.pid) for k, p in lab.procs.procs.items()
                                       if k.startswith("tailscaled:")),
                    "busy": (sum(busy_total) - busy_total[3] - busy_total[4]) / 100.0,
                    "total": sum(busy_total) / 100.0, "t": time.monotonic()}

        def window(a: Dict[str, float], b: Dict[str, float]) -> Dict[str, Any]:
            wall = b["t"] - a["t"]
            return {"wall_s": round(wall, 1),
                    "headscale_pct_of_one_core": round(100.0 * (b["headscale"] - a["headscale"]) / wall, 1),
                    "tailscaleds_pct_of_one_core": round(100.0 * (b["tailscaleds"] - a["tailscaleds"]) / wall, 1),
                    "machine_busy_pct": round(100.0 * (b["busy"] - a["busy"]) / max(1e-9, b["total"] - a["total"]), 1)}

        say(f"idle window {args.seconds:.0f} s ({len(hosts)} machines enrolled)")
        a = sample()
        time.sleep(args.seconds)
        out["idle"] = window(a, sample())
        say(f"idle: {out['idle']}")
        moves: List[Dict[str, Any]] = []
        errors: List[str] = []
        step = args.period / len(hosts)
        say(f"roaming window {args.seconds:.0f} s: each machine moves every {args.period:g} s (one move every "
            f"{step:.2f} s)")
        a = sample()
        t_start = time.monotonic()
        k = 0
        while time.monotonic() - t_start < args.seconds:
            due = t_start + k * step
            time.sleep(max(0.0, due - time.monotonic()))
            h = hosts[k % len(hosts)]
            try:
                where = lab.where(h).building
                moves.append(lab.move(h, other[h] if where == lab.spec.host(h).building else lab.spec.host(h).building))
            except LabError as exc:
                errors.append(f"{h}: {exc}")
            k += 1
        out["roaming"] = window(a, sample())
        out["moves"] = len(moves)
        out["move_duration_ms_p50"] = round(1000 * sorted(m["done_mono"] - m["t_mono"] for m in moves)[len(moves) // 2],
                                            1) if moves else None
        out["late_moves"] = sum(1 for i, m in enumerate(moves) if m["t_mono"] - (t_start + i * step) > step)
        out["errors"] = errors[:10]
        say(f"roaming: {out['roaming']}, {len(moves)} moves")
        # every machine still online and seeing the others after the roaming
        time.sleep(5.0)
        st = lab.tailscale_status(hosts[0])
        out["online_peers_seen_by_first"] = sum(1 for p in (st.get("Peer") or {}).values() if p.get("Online"))
    out["load_average_end"] = Path("/proc/loadavg").read_text().split()[:3]
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of scripts/bench_mobility."""
    ap = argparse.ArgumentParser(prog="bench_mobility", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", action="append", choices=SCENARIOS,
                    help="a scenario to run (repeat); default: all")
    ap.add_argument("--runs", type=int, default=3, help="runs of each scenario (flaps: once)")
    ap.add_argument("--flaps", type=int, default=100, help="one-second flaps in the flaps scenario")
    ap.add_argument("--relay-window", type=float, default=60.0, help="seconds derp-relay waits for the relay")
    ap.add_argument("--derp-window", type=float, default=30.0, help="seconds after a derper is killed")
    ap.add_argument("--out", default="artifacts")
    ap.add_argument("--headscale-roam", action="store_true",
                    help="instead: headscale's CPU while --machines roam every --period s for --seconds")
    ap.add_argument("--machines", type=int, default=20)
    ap.add_argument("--period", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    if args.headscale_roam:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        res = headscale_roam(args)
        path = Path(args.out) / "bench_mobility_headscale.json"
        path.write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))
        print(f"written: {path}")
        return 0
    wanted = args.scenario or list(SCENARIOS)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    runs: Dict[str, List[Dict[str, Any]]] = {}
    if any(s in CAMPUS_SCENARIOS for s in wanted):
        runs.update(campus(args, [s for s in wanted if s in CAMPUS_SCENARIOS]))
    if any(s not in CAMPUS_SCENARIOS for s in wanted):
        runs.update(derp_home(args, [s for s in wanted if s not in CAMPUS_SCENARIOS]))
    summary = {k: summarise(v) for k, v in runs.items()}
    uptime = Path("/proc/loadavg").read_text().split()[:3]
    res = {"scenarios": wanted, "runs_each": args.runs, "summary": summary, "runs": runs,
           "wall_s": round(time.monotonic() - t0, 1), "load_average_end": uptime}
    path = Path(args.out) / "bench_mobility.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(markdown(summary))
    print(f"load average at the end: {' '.join(uptime)}; written: {path}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
