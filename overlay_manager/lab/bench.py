"""The benchmark (scripts/bench, not a test): four paths between two buildings, side by side.

    source "$(bash scripts/build)/devel/setup.bash"
    sudo -E bash scripts/bench [--quick] [--out artifacts] [--seconds 5] [--udp-mbit 50]

One lab run (two buildings behind ``eim-adpf`` NATs, robot1 in b1 runs roscore via robot.launch;
laptop and laptop2 in b2)::

   laptop/laptop2 (b2 LAN) -- r-b2 NAT -- backbone -- r-b1 NAT -- robot1 (b1 LAN)
                                            |
                                control (headscale, DERP, STUN)

Paths, all from the laptop (client) to robot1 (server, publisher):

``underlay``   no overlay, no encryption. A NAT lets nothing in, so both routers get a "DMZ"
               (1:1 port forward) while this path is measured: new inbound TCP and ICMP (and UDP
               5201 for iperf3) to the building's public address go to its one host. The hosts put
               their building's public address on ``lo`` and ROS uses it as ROS_IP, so ROS works
               both ways (master callbacks, TCPROS) exactly as it would with two static public
               addresses. This is the best case an operator could configure by hand.
``wireguard``  plain WireGuard (wireguard-go + wg, userspace like tailscaled), 10.99.0.1 <->
               10.99.0.2. robot1 listens on UDP 51820 behind a port forward at r-b1; the laptop
               has robot1's public endpoint and a 5 s keepalive, so its own NAT needs no rule
               (replies match the mapping the laptop created). The classic road-warrior setup.
``ts-direct``  tailscale, hole-punched (proved by ``tailscale ping``), ROS with overlay names.
``ts-derp``    tailscale relayed through headscale's embedded DERP (UDP blocked at r-b1).

Per path: iperf3 TCP throughput and UDP jitter/loss at a set bitrate (1200-byte datagrams, which
fit every tunnel MTU), ICMP ping RTT, a 640x480 rgb8 30 Hz sensor_msgs/Image topic (delivered
rate, latency = receive time - header.stamp on the same clock) while a geometry_msgs/Twist is sent
at 50 Hz and echoed back (round trip p50/p99), and the time from starting the subscriber to its
first frame. For tailscale also the time from ``robot.launch`` on a never-enrolled laptop to the
first camera frame (enrolment + names + ROS), direct (laptop) and with UDP blocked (laptop2).
Impairment sweep on building b1's uplink: loss 0/1/5 % per direction and a 100 Mbit/s rate limit.
Delay and jitter need tc netem; on kernels without sch_netem (this workplace) they are skipped
and the report says so.

Writes artifacts/bench.json, artifacts/bench.md and artifacts/bench_*.png. Everything it starts
is stopped by pid; the lab run is torn down by Lab.down().
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
PY = "/usr/bin/python3"
SPEC: Dict[str, Any] = {
    "name": "bench",
    "buildings": {
        "b1": {"nat": "eim-adpf", "hosts": {"robot1": {"team": "alpha", "role": "robot"}}},
        "b2": {"nat": "eim-adpf", "hosts": {"laptop": {"team": "alpha", "role": "operator"},
                                            "laptop2": {"team": "alpha", "role": "operator"}}},
    },
    "teams": {"alpha": {"master": "robot1"}},
}
ROBOT, LAPTOP, LAPTOP2, B1, B2 = "robot1", "laptop", "laptop2", "b1", "b2"
PATHS = ("underlay", "wireguard", "ts-direct", "ts-derp")
WG_NET = {ROBOT: "10.99.0.1", LAPTOP: "10.99.0.2"}
WG_PORT = 51820
IPERF_PORT = 5201
IMAGE_W, IMAGE_H, IMAGE_HZ, CONTROL_HZ = 640, 480, 30.0, 50.0


def say(msg: str) -> None:
    """Progress on stderr."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def pct(values: Sequence[float], q: float) -> Optional[float]:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


# ================================================================================================
# ROS helpers that run inside a lab host's namespace: python3 -m overlay_manager.lab.bench _robot
# ================================================================================================
def robot_helper(prefix: str) -> int:
    """Camera publisher (640x480 rgb8, 30 Hz, stamp = now) and Twist echo; runs until killed."""
    import rospy
    from geometry_msgs.msg import Twist
    from sensor_msgs.msg import Image

    rospy.init_node("bench_robot", anonymous=True)
    pub = rospy.Publisher(f"{prefix}/image", Image, queue_size=1)
    echo = rospy.Publisher(f"{prefix}/cmd_vel_echo", Twist, queue_size=50, tcp_nodelay=True)
    rospy.Subscriber(f"{prefix}/cmd_vel", Twist, echo.publish, queue_size=50, tcp_nodelay=True)
    msg = Image(height=IMAGE_H, width=IMAGE_W, encoding="rgb8", step=IMAGE_W * 3,
                data=bytes(IMAGE_W * IMAGE_H * 3))
    msg.header.frame_id = "camera"
    rate = rospy.Rate(IMAGE_HZ)
    while not rospy.is_shutdown():
        msg.header.stamp = rospy.Time.now()
        pub.publish(msg)
        rate.sleep()
    return 0


def _wait_master(timeout: float) -> None:
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
    """Subscribe to the camera, send Twist at 50 Hz and time the echoes; print one JSON line."""
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
    from geometry_msgs.msg import Twist
    from sensor_msgs.msg import Image

    rospy.init_node("bench_operator", anonymous=True, disable_signals=True)
    frames: List[tuple] = []
    first = threading.Event()
    sent: Dict[int, float] = {}
    rtts: Dict[int, float] = {}
    echoed = threading.Event()

    def on_image(m: Any) -> None:
        frames.append((time.time(), m.header.stamp.to_sec(), len(m.data)))
        first.set()

    def on_echo(m: Any) -> None:
        seq = int(m.linear.x)
        if seq in sent and seq not in rtts:
            rtts[seq] = time.monotonic() - sent[seq]
        echoed.set()

    rospy.Subscriber(f"{prefix}/image", Image, on_image, queue_size=1, buff_size=2 ** 24)
    deadline = time.monotonic() + timeout
    if not first.wait(timeout):
        print(json.dumps({"ok": False, "error": f"no frame on {prefix}/image within {timeout:g} s"}), flush=True)
        return 1
    out: Dict[str, Any] = {"ok": True, "first_frame_s": frames[0][0] - t0,
                           "subscriber_start_s": t_start - t0}
    if first_only:
        print(json.dumps(out), flush=True)
        return 0
    pub = rospy.Publisher(f"{prefix}/cmd_vel", Twist, queue_size=50, tcp_nodelay=True)
    rospy.Subscriber(f"{prefix}/cmd_vel_echo", Twist, on_echo, queue_size=50, tcp_nodelay=True)
    seq = 0
    while not echoed.is_set():  # until both connections exist (bounded)
        if time.monotonic() > deadline:
            print(json.dumps({"ok": False, "error": f"no echo on {prefix}/cmd_vel_echo"}), flush=True)
            return 1
        seq += 1
        sent[seq] = time.monotonic()
        pub.publish(Twist())  # seq 0: warm-up, never timed
        time.sleep(0.1)
    sent.clear()
    start_wall, start_mono = time.time(), time.monotonic()
    period = 1.0 / CONTROL_HZ
    n = 0
    while True:
        now = time.monotonic()
        if now - start_mono >= seconds:
            break
        n += 1
        msg = Twist()
        msg.linear.x = float(n)
        sent[n] = time.monotonic()
        pub.publish(msg)
        time.sleep(max(0.0, start_mono + n * period - time.monotonic()))
    end_wall = time.time()
    time.sleep(1.0)  # late echoes
    window = [f for f in frames if start_wall <= f[0] <= end_wall]
    lat = [(r - s) * 1000 for r, s, _ in window]
    gaps = [b[0] - a[0] for a, b in zip(window, window[1:])]
    rt = [v * 1000 for v in rtts.values()]
    out.update({
        "camera_hz": len(window) / (end_wall - start_wall),
        "camera_latency_p50_ms": pct(lat, 0.5), "camera_latency_p99_ms": pct(lat, 0.99),
        "camera_max_gap_s": max(gaps) if gaps else None,
        "control_sent": len(sent), "control_echoed": len(rtts),
        "control_rtt_p50_ms": pct(rt, 0.5), "control_rtt_p99_ms": pct(rt, 0.99),
        "control_lost_pct": 100.0 * (len(sent) - len(rtts)) / len(sent) if sent else None,
    })
    print(json.dumps(out), flush=True)
    return 0


# ================================================================================================
# orchestration (root namespace)
# ================================================================================================
class Bench:
    """One benchmark run in a fresh lab; see the module doc."""

    def __init__(self, lab: Any, seconds: float, udp_mbit: float) -> None:
        self.lab = lab
        self.seconds = seconds
        self.udp_mbit = udp_mbit
        self.helpers: Dict[str, Any] = {}
        self.fw_handles: Dict[str, int] = {}

    # --- environment per path -------------------------------------------------------------
    def ros_setup(self, path: str, host: str) -> str:
        """Shell line that sets the ROS env of ``host`` for ``path``."""
        if path.startswith("ts-"):
            cfg = shlex.quote(str(self.lab.robot_yaml(host)))
            return f'eval "$(rosrun overlay_manager overlay_env --config {cfg})"'
        if path == "wireguard":
            master, ip = WG_NET[ROBOT], WG_NET[host]
        else:
            master, ip = self.lab.address(B1), self.lab.address(self.lab.spec.host(host).building)
        return f"unset ROS_HOSTNAME; export ROS_MASTER_URI=http://{master}:11311 ROS_IP={ip}"

    def server_address(self, path: str) -> str:
        """robot1's address on ``path`` (iperf3, ping)."""
        if path.startswith("ts-"):
            return self.lab.overlay_ip(ROBOT)
        return WG_NET[ROBOT] if path == "wireguard" else self.lab.address(B1)

    def helper_argv(self, path: str, host: str, args: str) -> List[str]:
        return ["bash", "-c", f"{self.ros_setup(path, host)} && exec {PY} -m overlay_manager.lab.bench {args}"]

    def start_robot_helper(self, path: str) -> None:
        from . import robots
        prefix = f"/bench/{path.replace('-', '_')}"
        self.helpers[path] = self.lab.popen(ROBOT, self.helper_argv(path, ROBOT, f"_robot --prefix {prefix}"),
                                            env=robots.ros_env(self.lab, ROBOT),
                                            log=Path(self.lab.host_dir(ROBOT)) / f"bench_robot_{path}.log")

    def stop_robot_helper(self, path: str) -> None:
        from . import robots
        proc = self.helpers.pop(path, None)
        if proc is not None:
            robots.stop(self.lab, proc)

    def operator(self, path: str, host: str = LAPTOP, t0: float = 0.0, first_only: bool = False,
                 timeout: float = 60.0) -> Dict[str, Any]:
        """Run the operator helper on ``host``; its JSON (LabError when it failed)."""
        from . import robots
        prefix = f"/bench/{path.replace('-', '_')}"
        args = (f"_operator --prefix {prefix} --seconds {self.seconds:g} --t0 {t0!r} --timeout {timeout:g}"
                + (" --first-only" if first_only else ""))
        res = self.lab.exec(host, self.helper_argv(path, host, args), env=robots.ros_env(self.lab, host),
                            timeout=timeout + self.seconds + 60, check=False, quiet=True)
        return robots.json_result(res, f"operator on {host} ({path})")

    # --- network measurements -------------------------------------------------------------
    def iperf(self, addr: str, udp: bool) -> Dict[str, Any]:
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
        res = self.lab.exec(LAPTOP, ["ping", "-n", "-q", "-c", str(count), "-i", "0.05", "-W", "2", addr],
                            timeout=count * 2 + 10, check=False, quiet=True)
        m = re.search(r"= ([0-9.]+)/([0-9.]+)/([0-9.]+)/([0-9.]+) ms", res.stdout)
        loss = re.search(r"([0-9.]+)% packet loss", res.stdout)
        return {"ping_rtt_ms": float(m.group(2)) if m else None,
                "ping_loss_pct": float(loss.group(1)) if loss else None}

    def ts_path(self) -> str:
        return self.lab.ping(LAPTOP, ROBOT, count=2, timeout=30).path

    def measure(self, path: str, ros: bool = True) -> Dict[str, Any]:
        """All metrics of one path as it is now."""
        addr = self.server_address(path)
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

    # --- path set-up ----------------------------------------------------------------------
    def dmz(self, building: str, host: str, udp_ports: Sequence[int], tcp_icmp: bool) -> None:
        """Port forward new inbound traffic at ``building``'s router to ``host`` (own nft table plus one
        accept rule for DNATed packets in the lab's forward chain, after its runtime actions)."""
        from . import system
        ns = self.lab.namespace(building)
        target = self.lab.address(host)
        rules = []
        if tcp_icmp:
            rules.append(f'iifname "wan" meta l4proto {{ tcp, icmp }} dnat ip to {target}')
        if udp_ports:
            rules.append(f'iifname "wan" udp dport {{ {", ".join(map(str, udp_ports))} }} dnat ip to {target}')
        text = ("table ip olab_bench\ndelete table ip olab_bench\ntable ip olab_bench {\n"
                "  chain prerouting { type nat hook prerouting priority dstnat - 5; policy accept;\n"
                + "".join(f"    {r}\n" for r in rules) + "  }\n}\n")
        say(f"({ns}) port forward to {host} {target}: " + "; ".join(rules))
        system.run(["nft", "-f", "-"], ns, echo=self.lab.echo, input=text, quiet=True)
        if building not in self.fw_handles:
            listing = system.run(["nft", "-a", "list", "chain", "inet", "olab", "forward"], ns,
                                 echo=self.lab.echo, quiet=True).stdout
            m = re.search(r"jump actions # handle (\d+)", listing)
            if not m:
                raise RuntimeError(f"no 'jump actions' rule in {ns}'s forward chain:\n{listing}")
            res = system.run(["nft", "--echo", "--handle", "add", "rule", "inet", "olab", "forward", "position",
                              m.group(1), "iifname", "wan", "ct", "status", "dnat", "accept",
                              "comment", '"bench port forward"'], ns, echo=self.lab.echo, quiet=True)
            self.fw_handles[building] = int(re.findall(r"# handle (\d+)", res.stdout)[-1])

    def undmz(self, building: str) -> None:
        from . import system
        ns = self.lab.namespace(building)
        system.run(["nft", "delete", "table", "ip", "olab_bench"], ns, echo=self.lab.echo, check=False, quiet=True)
        h = self.fw_handles.pop(building, None)
        if h is not None:
            system.run(["nft", "delete", "rule", "inet", "olab", "forward", "handle", str(h)], ns,
                       echo=self.lab.echo, check=False, quiet=True)
        system.run(["conntrack", "-F"], ns, echo=self.lab.echo, check=False, quiet=True)

    def lo_alias(self, host: str, add: bool) -> None:
        addr = self.lab.address(self.lab.spec.host(host).building)
        self.lab.exec(host, ["ip", "addr", "add" if add else "del", f"{addr}/32", "dev", "lo"], check=False)

    def wg_if(self, host: str) -> str:
        """WireGuard interface name of a host: unique per run and host, because wireguard-go's UAPI
        socket (/var/run/wireguard/<ifname>.sock, which ``wg`` talks to) is not per namespace."""
        return f"wg{self.lab.run_id}{(ROBOT, LAPTOP).index(host)}"

    def wireguard_up(self) -> None:
        from .system import wait_for
        keys = {}
        for h in (ROBOT, LAPTOP):
            priv = self.lab.exec(h, ["wg", "genkey"], quiet=True).stdout.strip()
            pub = self.lab.exec(h, ["wg", "pubkey"], input=priv + "\n", quiet=True).stdout.strip()
            kf = Path(self.lab.host_dir(h)) / "wg.key"
            kf.write_text(priv + "\n")
            kf.chmod(0o600)
            keys[h] = (kf, pub)
        for h in (ROBOT, LAPTOP):
            self.helpers[f"wg:{h}"] = self.lab.popen(h, ["wireguard-go", "-f", self.wg_if(h)],
                                                     log=Path(self.lab.host_dir(h)) / "wireguard-go.log")
        for h in (ROBOT, LAPTOP):
            wait_for(f"wireguard-go's {self.wg_if(h)} in {h}", lambda h=h: self.lab.exec(
                h, ["wg", "show", self.wg_if(h)], check=False, quiet=True).returncode == 0, 10)
        self.lab.exec(ROBOT, ["wg", "set", self.wg_if(ROBOT), "private-key", str(keys[ROBOT][0]),
                              "listen-port", str(WG_PORT),
                              "peer", keys[LAPTOP][1], "allowed-ips", f"{WG_NET[LAPTOP]}/32"])
        self.lab.exec(LAPTOP, ["wg", "set", self.wg_if(LAPTOP), "private-key", str(keys[LAPTOP][0]),
                               "peer", keys[ROBOT][1], "allowed-ips", f"{WG_NET[ROBOT]}/32",
                               "endpoint", f"{self.lab.address(B1)}:{WG_PORT}", "persistent-keepalive", "5"])
        for h in (ROBOT, LAPTOP):
            self.lab.exec(h, ["ip", "addr", "add", f"{WG_NET[h]}/24", "dev", self.wg_if(h)])
            self.lab.exec(h, ["ip", "link", "set", self.wg_if(h), "up"])
        wait_for("a WireGuard handshake laptop -> robot1", lambda: self.lab.exec(
            LAPTOP, ["ping", "-c", "1", "-W", "1", WG_NET[ROBOT]], check=False, quiet=True).returncode == 0, 20)

    def wireguard_down(self) -> None:
        from . import robots
        for h in (ROBOT, LAPTOP):
            proc = self.helpers.pop(f"wg:{h}", None)
            if proc is not None:
                robots.stop(self.lab, proc, timeout=5)
            self.lab.exec(h, ["ip", "link", "del", self.wg_if(h)], check=False, quiet=True)


def impairments(quick: bool) -> List[Dict[str, float]]:
    """The sweep: loss per direction (percent) and one rate limit, on building b1's uplink."""
    if quick:
        return [{"loss_pct": 0.0}, {"loss_pct": 5.0}]
    return [{"loss_pct": 0.0}, {"loss_pct": 1.0}, {"loss_pct": 5.0}, {"rate_mbit": 100.0}]


def imp_label(imp: Dict[str, float]) -> str:
    if imp.get("rate_mbit"):
        return f"rate {imp['rate_mbit']:g} Mbit/s"
    return f"loss {imp.get('loss_pct', 0):g}%"


def run(out_dir: Path, quick: bool = False, seconds: Optional[float] = None, udp_mbit: float = 50.0,
        run_id: Optional[str] = None) -> Dict[str, Any]:
    """The whole benchmark; returns the JSON data (also written to out_dir)."""
    from . import robots
    from .core import Lab
    from .spec import Impairment

    t_run = time.monotonic()
    seconds = seconds or (2.0 if quick else 5.0)
    sweep = impairments(quick)
    results: Dict[str, Dict[str, Any]] = {p: {} for p in PATHS}
    launch: Dict[str, Any] = {}
    lab = Lab(SPEC, run_id=run_id)
    procs: List[Any] = []
    bench = Bench(lab, seconds, udp_mbit)
    notes: List[str] = []
    try:
        lab.up()
        netem = lab.netem_available()
        if not netem:
            notes.append("this kernel has no sch_netem: delay and jitter cannot be emulated, so the sweep "
                         "covers loss (nftables) and rate (tbf) only")
        lab.popen(ROBOT, ["iperf3", "-s", "-p", str(IPERF_PORT)], log=Path(lab.host_dir(ROBOT)) / "iperf3.log")
        say("robot.launch on robot1 (master)")
        procs.append(robots.start_robot(lab, ROBOT, master=True))
        robots.peers(lab, ROBOT, timeout=90, node=f"/{ROBOT}/overlay_manager")
        bench.start_robot_helper("ts-direct")

        def cold_launch(host: str, path: str) -> Dict[str, Any]:
            say(f"robot.launch on never-enrolled {host}; timing its first frame ({path})")
            t0 = time.time()
            procs.append(robots.start_robot(lab, host, master=False))
            r = bench.operator(path, host=host, t0=t0, first_only=True, timeout=120)
            return {"launch_to_first_frame_s": r["first_frame_s"], "subscriber_start_s": r["subscriber_start_s"]}

        launch["ts-direct"] = cold_launch(LAPTOP, "ts-direct")
        from .system import wait_for
        wait_for("a direct path laptop -> robot1", lambda: bench.ts_path() == "direct", 60)

        def sweep_path(path: str, ros: bool = True) -> None:
            for imp in sweep:
                label = imp_label(imp)
                say(f"{path}: {label}")
                lab.impair(B1, Impairment(**imp) if any(imp.values()) else None)
                try:
                    results[path][label] = bench.measure(path, ros=ros)
                finally:
                    lab.impair(B1, None)
                say(f"{path} {label}: {json.dumps(results[path][label])}")

        sweep_path("ts-direct")
        # --- DERP
        bench.stop_robot_helper("ts-direct")
        lab.block_udp(B1)
        wait_for("the laptop -> robot1 path to turn derp", lambda: bench.ts_path() == "derp", 60)
        bench.start_robot_helper("ts-derp")
        launch["ts-derp"] = cold_launch(LAPTOP2, "ts-derp")
        sweep_path("ts-derp")
        bench.stop_robot_helper("ts-derp")
        lab.unblock_udp(B1)
        # --- plain WireGuard
        bench.dmz(B1, ROBOT, [WG_PORT], tcp_icmp=False)
        bench.wireguard_up()
        bench.start_robot_helper("wireguard")
        sweep_path("wireguard")
        bench.stop_robot_helper("wireguard")
        bench.wireguard_down()
        # --- underlay with port forwards (DMZ) in both buildings
        bench.dmz(B1, ROBOT, [IPERF_PORT], tcp_icmp=True)
        bench.dmz(B2, LAPTOP, [], tcp_icmp=True)
        for h in (ROBOT, LAPTOP):
            bench.lo_alias(h, True)
        try:
            bench.start_robot_helper("underlay")
            sweep_path("underlay")
            bench.stop_robot_helper("underlay")
        finally:
            for h in (ROBOT, LAPTOP):
                bench.lo_alias(h, False)
            bench.undmz(B1)
            bench.undmz(B2)
    finally:
        for p in [k for k in bench.helpers if not k.startswith("wg:")]:
            bench.stop_robot_helper(p)
        bench.wireguard_down()
        for p in reversed(procs):
            robots.stop(lab, p)
        lab.down()
    data = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "quick": quick, "seconds_per_test": seconds,
                     "udp_mbit": udp_mbit, "image": f"{IMAGE_W}x{IMAGE_H} rgb8 {IMAGE_HZ:g} Hz",
                     "control_hz": CONTROL_HZ, "cores": os.cpu_count(), "netem": netem,
                     "impairment_link": "b1 uplink (both directions)", "run_seconds": time.monotonic() - t_run,
                     "notes": notes},
            "sweep": [imp_label(i) for i in sweep], "paths": list(PATHS), "results": results, "launch": launch}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(data, indent=2) + "\n")
    (out_dir / "bench.md").write_text(render_markdown(data))
    plot(data, out_dir)
    return data


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


def _fmt(v: Any) -> str:
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
    lines = ["# Benchmark: underlay vs plain WireGuard vs tailscale direct vs tailscale via DERP", "",
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
               color=["#777", "#4a7", "#37c", "#c73"])
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point (scripts/bench) and the in-namespace helpers (_robot, _operator)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_robot"]:
        ap = argparse.ArgumentParser(prog="bench _robot")
        ap.add_argument("_robot")
        ap.add_argument("--prefix", required=True)
        a = ap.parse_args(argv)
        return robot_helper(a.prefix)
    if argv[:1] == ["_operator"]:
        ap = argparse.ArgumentParser(prog="bench _operator")
        ap.add_argument("_operator")
        ap.add_argument("--prefix", required=True)
        ap.add_argument("--seconds", type=float, default=5.0)
        ap.add_argument("--t0", type=float, default=0.0)
        ap.add_argument("--timeout", type=float, default=60.0)
        ap.add_argument("--first-only", action="store_true")
        a = ap.parse_args(argv)
        return operator_helper(a.prefix, a.seconds, a.t0, a.first_only, a.timeout)
    ap = argparse.ArgumentParser(prog="bench", description="underlay vs WireGuard vs tailscale direct vs "
                                 "DERP in the campus lab (root; a fresh lab run, ~6 min, --quick ~2.5 min)")
    ap.add_argument("--quick", action="store_true", help="2 s tests, loss 0 and 5 %% only")
    ap.add_argument("--seconds", type=float, default=None, help="per iperf3/camera test (default 5, quick 2)")
    ap.add_argument("--udp-mbit", type=float, default=50.0, help="iperf3 UDP bitrate (default 50)")
    ap.add_argument("--out", default=str(REPO / "artifacts"))
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--replot", metavar="JSON", help="only re-render bench.md and plots from a bench.json")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.replot:
        data = json.loads(Path(a.replot).read_text())
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.md").write_text(render_markdown(data))
        plot(data, out)
        print(render_markdown(data))
        return 0
    if os.geteuid() != 0:
        print("bench: needs root (network namespaces)", file=sys.stderr)
        return 2
    from .errors import LabError
    try:
        data = run(out, quick=a.quick, seconds=a.seconds, udp_mbit=a.udp_mbit, run_id=a.run_id)
    except LabError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    print(render_markdown(data))
    say(f"wrote {out / 'bench.json'}, bench.md, bench_paths.png, bench_sweep.png "
        f"({data['meta']['run_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
