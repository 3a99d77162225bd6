"""Benchmark of the overlay node (not a test): path-change latency in the lab, CPU and memory.

    source "$(bash scripts/build)/devel/setup.bash"
    sudo -E scripts/bench_node [--trials 3] [--cpu-seconds 60] [--peers 10,100,500,1000]
                               [--topic-peers 5] [--no-ipn-bus] [--node-param KEY=VALUE ...]
                               [--skip-path|--skip-cpu]

1. Path-change latency (config/lab/two_buildings.yaml, a fresh lab run). robot.launch on robot1
   (master) and laptop, direct path proved with ~ping_peer, ICMP pings over the overlay from the
   laptop at 5 Hz the whole time. Per trial: UDP blocked at building b1, then unblocked. Inside the
   laptop's namespace two watchers run: one reads tailscaled's LocalAPI status at 50 Hz and prints
   the robot1 path when it changes (classified exactly as the node does, peers.parse_status:
   derp = Active without CurAddr/PeerRelay); one subscribes to /laptop/overlay_manager/path_changes.
   Both stamp with time.time() (CLOCK_REALTIME of this machine), so
   ``t_ros - t_ts`` is the node's own latency and ``t_ts - t_block`` is tailscaled's.
2. CPU and memory. The real node (rosrun overlay_manager overlay_manager_node) against a fake
   tailscaled (test/unit/tsfake.py) serving N peers cloned from test/data/status_direct.json and
   answering disco pings; own roscore. Both run in a private network namespace that has only
   loopback (plus the node's "overlay" address 100.64.0.1 on lo, so that preflight passes as on a
   real machine): nothing leaves this machine. Default node settings, iperf_server false.
   ``--topic-peers`` of the peers (default 5) carry a ROS topic to this machine, as in a fleet
   where a few robots stream to an operator: their overlay IPs are added to lo, one publisher
   per peer advertises itself on its peer's overlay IP and one subscriber on the node's machine
   listens, so the node's topic-link map finds those peers (and pings only them and the master).
   Their byte counters and LastWrite grow every 0.5 s as a real tailscaled's do while they
   stream. The fake serves tailscaled's IPN bus (watch-ipn-bus), as v1.102.5 does, unless
   ``--no-ipn-bus`` (then the node reads the status at poll_rate). ``--node-param`` sets one of
   the node's private parameters for the CPU runs (e.g. ``bus_poll_rate=1``).
   /proc/<pid>/stat and /proc/<pid>/status are sampled every second.

Writes artifacts/bench_node.json and prints a markdown table. Everything it starts is stopped by
pid; the lab run is torn down by Lab.down().
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..stats import percentile, summary
from ..waiting import tail

REPO = Path(__file__).resolve().parents[2]
PY = "/usr/bin/python3"
SPEC = REPO / "config" / "lab" / "two_buildings.yaml"
ROBOT, LAPTOP, BUILDING = "robot1", "laptop", "b1"
N_ROBOT, N_LAPTOP = f"/{ROBOT}/overlay_manager", f"/{LAPTOP}/overlay_manager"
OUT = REPO / "artifacts" / "bench_node.json"
TARGET_NODE_LATENCY_S = 2.0


def say(msg: str) -> None:
    """Progress line on stderr (stdout carries the table)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def child_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Our environment with this clone first on PYTHONPATH (generated messages still come from
    the devel space: overlay_manager/__init__.py extends its __path__)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


# ================================================================================================
# helpers that run inside a lab host's namespace (python3 -m overlay_manager.lab.bench_node _...)
# ================================================================================================
def _emit(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def watch_status(socket_path: str, peer: str, hz: float) -> int:
    """Print {"t", "path", "cur_addr"} whenever the peer's path in tailscaled's status changes.

    ``t`` is the midpoint of the LocalAPI request (time.time()). Runs until killed.
    """
    from overlay_manager.peers import parse_status
    from overlay_manager.tailscale import LocalAPI, TailscaleError

    api = LocalAPI(socket_path, timeout=2.0)
    period = 1.0 / hz
    last: Optional[str] = None
    n = 0
    _emit({"ready": True, "t": time.time()})
    while True:
        t0 = time.time()
        try:
            raw = api.status()
            t1 = time.time()
            snap = parse_status(raw)
            p = snap.find(peer)
            path = p.path if p else "absent"
            cur = ""
            for v in (raw.get("Peer") or {}).values():
                if v.get("HostName") == peer:
                    cur = v.get("CurAddr") or ""
        except TailscaleError as exc:
            t1, path, cur = time.time(), "error", str(exc)[:200]
        n += 1
        if path != last:
            _emit({"t": (t0 + t1) / 2, "req_s": t1 - t0, "path": path, "cur_addr": cur, "polls": n})
            last = path
        time.sleep(max(0.0, period - (time.time() - t0)))


def watch_changes(topic: str) -> int:
    """Print every PathChange on topic with its arrival time (time.time()). Runs until killed."""
    import rospy

    from overlay_manager.msg import PathChange

    rospy.init_node("bench_path_changes", anonymous=True, disable_signals=True)

    def cb(m: Any) -> None:
        _emit({"t": time.time(), "stamp": m.header.stamp.to_sec(), "peer": m.peer,
               "old_path": m.old_path, "new_path": m.new_path, "endpoint": m.endpoint})

    sub = rospy.Subscriber(topic, PathChange, cb, queue_size=100)
    deadline = time.monotonic() + 60
    while sub.get_num_connections() == 0:
        if time.monotonic() > deadline:
            _emit({"ready": False, "error": f"no publisher of {topic} connected within 60 s"})
            return 1
        time.sleep(0.05)
    _emit({"ready": True, "t": time.time()})
    while True:
        time.sleep(1.0)


def topic_talk(topic: str, hz: float) -> int:
    """Publish std_msgs/String (200 bytes) on topic at hz until killed (a robot's stream)."""
    import rospy
    from std_msgs.msg import String

    rospy.init_node("bench_talker", anonymous=True)  # rospy's SIGINT handler ends the loop
    pub = rospy.Publisher(topic, String, queue_size=10)
    while not rospy.is_shutdown():
        pub.publish(String(data="x" * 200))
        time.sleep(1.0 / hz)
    return 0


def topic_listen(topics: Sequence[str]) -> int:
    """Subscribe to every topic until killed (the operator's machine)."""
    import rospy
    from std_msgs.msg import String

    rospy.init_node("bench_listener", anonymous=True)  # rospy's SIGINT handler ends the loop
    subs = [rospy.Subscriber(t, String, lambda _m: None, queue_size=1) for t in topics]
    while subs and not rospy.is_shutdown():
        time.sleep(0.2)
    return 0


def wait_links(node: str, n: int, timeout: float) -> int:
    """Print {"ok", "links"} once node's ~get_topic_links lists n cross-machine links (or on timeout)."""
    import rospy

    from overlay_manager.srv import GetTopicLinks

    rospy.init_node("bench_wait_links", anonymous=True, disable_signals=True)
    deadline = time.monotonic() + timeout
    links: List[Any] = []
    while time.monotonic() < deadline:
        try:
            rospy.wait_for_service(f"{node}/get_topic_links", timeout=max(0.1, deadline - time.monotonic()))
            links = list(rospy.ServiceProxy(f"{node}/get_topic_links", GetTopicLinks)().links)
        except (rospy.ROSException, rospy.ServiceException, OSError):
            links = []
        if len(links) >= n:
            break
        time.sleep(0.5)
    _emit({"ok": len(links) >= n, "links": [[x.topic, x.publisher_host, x.subscriber_host, x.path]
                                             for x in links]})
    return 0 if len(links) >= n else 1


# ================================================================================================
# 1. path-change latency in the lab
# ================================================================================================
class LineWatcher:
    """Reads JSON lines of a child process into a list (thread); waits for matching events."""

    def __init__(self, name: str, proc: subprocess.Popen) -> None:
        self.name, self.proc = name, proc
        self.events: List[Dict[str, Any]] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, name=f"read-{name}", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            try:
                obj = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                continue
            with self.cond:
                self.events.append(obj)
                self.cond.notify_all()

    def last(self, pred: Callable[[Dict[str, Any]], bool] = lambda e: True) -> Optional[Dict[str, Any]]:
        with self.cond:
            for e in reversed(self.events):
                if pred(e):
                    return e
        return None

    def wait(self, what: str, pred: Callable[[Dict[str, Any]], bool], timeout: float,
             state: Callable[[], str] = lambda: "") -> Dict[str, Any]:
        """First event (in arrival order) matching pred; TimeoutError saying what was awaited."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for e in self.events:
                    if pred(e):
                        return e
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) while waiting for {what}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                                       + (f" (last seen: {state()})" if state() else ""))
                self.cond.wait(min(left, 0.5))


def _tail(path: Path, n: int = 30) -> str:
    """The last ``n`` lines of a log, one per line (overlay_manager.waiting.tail)."""
    return tail(path, n, sep="\n")


def path_bench(trials: int, timeout: float, settle: float) -> Dict[str, Any]:
    """Block/unblock UDP at b1 ``trials`` times; latencies as seen from the laptop."""
    from . import Lab, robots

    out: Dict[str, Any] = {"spec": str(SPEC.relative_to(REPO)), "observer": LAPTOP, "peer": ROBOT,
                           "blocked_building": BUILDING, "status_poll_hz": 50.0,
                           "traffic": "ICMP ping 5 Hz over the overlay",
                           "trials": [], "errors": []}
    lab = Lab(SPEC)
    procs: List[subprocess.Popen] = []
    watchers: List[LineWatcher] = []
    try:
        say(f"lab up (run {lab.run_id}) from {SPEC}")
        lab.up()
        out["run_id"] = lab.run_id
        say(f"robot.launch on robot1 (master), then laptop; waiting for {N_ROBOT}/peers and "
            f"{N_LAPTOP}/peers listing robot1 (90 s / 120 s)")
        robots.start_master_then(lab, ROBOT, [LAPTOP], procs)

        say("waiting up to 60 s for a direct path (laptop ~ping_peer robot1)")
        deadline = time.monotonic() + 60
        ping: Dict[str, Any] = {}
        while time.monotonic() < deadline:
            ping = robots.call(lab, LAPTOP, f"{N_LAPTOP}/ping_peer", "overlay_manager/PingPeer",
                               name=ROBOT, count=1, timeout=5.0)
            if ping.get("path") == "direct":
                break
            time.sleep(0.5)
        if ping.get("path") != "direct":
            raise TimeoutError(f"timed out after 60 s waiting for a direct laptop->robot1 path: {ping}")
        out["initial_ping"] = ping

        hdir = Path(lab.host_dir(LAPTOP))
        traffic = lab.popen(LAPTOP, ["ping", "-q", "-i", "0.2", lab.overlay_ip(ROBOT)], log=hdir / "bench_ping.log")
        procs.append(traffic)
        st = lab.popen(LAPTOP, [PY, "-m", "overlay_manager.lab.bench_node", "_watch-status",
                                str(lab.socket_path(LAPTOP)), ROBOT, "--hz", "50"],
                       env=child_env(), stdout=subprocess.PIPE, stderr=open(hdir / "bench_status.err", "ab"))
        procs.append(st)
        cfg = lab.robot_yaml(LAPTOP)
        line = (f'eval "$(rosrun overlay_manager overlay_env --config {cfg})" && exec {PY} '
                f"-m overlay_manager.lab.bench_node _watch-changes {N_LAPTOP}/path_changes")
        ch = lab.popen(LAPTOP, ["bash", "-c", line], env=child_env(robots.ros_env(lab, LAPTOP)),
                       stdout=subprocess.PIPE, stderr=open(hdir / "bench_changes.err", "ab"))
        procs.append(ch)
        ws, wc = LineWatcher("status watcher", st), LineWatcher("path_changes subscriber", ch)
        watchers += [ws, wc]
        ws.wait("the LocalAPI status watcher to start", lambda e: "ready" in e, 30)
        r = wc.wait(f"the {N_LAPTOP}/path_changes subscriber to connect", lambda e: "ready" in e, 70)
        if not r.get("ready"):
            raise RuntimeError(r.get("error"))

        def status_now() -> str:
            e = ws.last(lambda e: "path" in e)
            return f"status path {e['path']} since {time.time() - e['t']:.1f} s ago" if e else "no status yet"

        for i in range(trials):
            trial: Dict[str, Any] = {"trial": i + 1}
            for phase, new_path, action in (("block", "derp", lab.block_udp), ("unblock", "direct", lab.unblock_udp)):
                want_before = "direct" if phase == "block" else "derp"
                ws.wait(f"status to show robot1 {want_before} before the {phase}",
                        lambda e, w=want_before: e.get("path") == w and e is ws.last(lambda x: "path" in x),
                        timeout, status_now)
                time.sleep(settle)
                t_before = time.time()
                action(BUILDING)
                t_act = time.time()
                say(f"trial {i + 1}: {phase} udp at {BUILDING} (nft took {t_act - t_before:.3f} s); waiting up to "
                    f"{timeout:.0f} s for laptop's status and ~path_changes to show robot1 {new_path}")
                rec: Dict[str, Any] = {"t_action": t_act, "t_action_start": t_before}
                try:
                    ts = ws.wait(f"laptop's tailscaled status to show robot1 {new_path} after the {phase}",
                                 lambda e, t=t_before, p=new_path: e.get("path") == p and e["t"] >= t,
                                 timeout, status_now)
                    rec["t_ts"] = ts["t"]
                    rec["tailscaled_s"] = ts["t"] - t_act
                    ros = wc.wait(f"{N_LAPTOP}/path_changes with peer {ROBOT} new_path {new_path} after the {phase}",
                                  lambda e, t=t_before, p=new_path: e.get("peer") == ROBOT and e.get("new_path") == p
                                  and e["t"] >= t, timeout,
                                  lambda: json.dumps(wc.last(lambda e: "peer" in e)) + "; " + status_now())
                    rec.update(t_ros=ros["t"], stamp=ros["stamp"], old_path=ros["old_path"],
                               node_latency_s=ros["t"] - ts["t"], node_stamp_latency_s=ros["stamp"] - ts["t"],
                               transport_s=ros["t"] - ros["stamp"])
                    say(f"trial {i + 1} {phase}: tailscaled {rec['tailscaled_s']:.2f} s after the {phase}, "
                        f"node +{rec['node_latency_s']:.3f} s")
                except (TimeoutError, RuntimeError) as exc:
                    rec["error"] = str(exc)
                    out["errors"].append(f"trial {i + 1} {phase}: {exc}")
                    say(f"trial {i + 1} {phase}: {exc}")
                trial[phase] = rec
                if "error" in rec and phase == "block":
                    lab.unblock_udp(BUILDING)
                    break
            out["trials"].append(trial)
        out["status_transitions"] = [e for e in ws.events if "path" in e]
        out["path_changes"] = [e for e in wc.events if "peer" in e]
    except BaseException as exc:
        out["errors"].append(f"{type(exc).__name__}: {exc}")
        for h in (ROBOT, LAPTOP):
            log = Path(lab.host_dir(h)) / "robot.launch.log"
            if log.exists():
                say(f"---- {h} robot.launch.log (tail)\n{_tail(log)}")
        if not isinstance(exc, Exception):
            raise
    finally:
        for p in reversed(procs):
            try:
                robots.stop(lab, p, timeout=10)
            except Exception as exc:  # noqa: BLE001 - stop the rest, the lab's down() is the backstop
                say(f"stopping pid {p.pid}: {exc}")
        say(f"lab down (run {lab.run_id})")
        lab.down()
    return out


# ================================================================================================
# 2. CPU and memory with N peers (fake tailscaled, loopback-only namespace)
# ================================================================================================
def fake_status(n: int) -> Dict[str, Any]:
    """test/data/status_direct.json with its one peer cloned into n peers (names robot-001...,
    distinct node keys, IDs, overlay IPs and direct endpoints)."""
    sys.path.insert(0, str(REPO / "test" / "unit"))
    from tsfake import recorded  # type: ignore[import-not-found]

    st = recorded("status_direct.json")
    (_, proto), = st["Peer"].items()
    peers = {}
    for i in range(n):
        p = copy.deepcopy(proto)
        k = i + 2
        name = f"robot-{i + 1:03d}"
        key = f"nodekey:{k:064x}"
        v4, v6 = f"100.64.{k // 256}.{k % 256}", f"fd7a:115c:a1e0::{k:x}"
        p.update(ID=str(k), NodeID=k, PublicKey=key, HostName=name, DNSName=f"{name}.fleet.internal.",
                 TailscaleIPs=[v4, v6], AllowedIPs=[f"{v4}/32", f"{v6}/128"],
                 CurAddr=f"10.250.{k // 256}.{k % 256}:41641",
                 PeerAPIURL=[f"http://{v4}:46590", f"http://[{v6}]:47166"])
        peers[key] = p
    st["Peer"] = peers
    return st


def fake_ping_for(status: Dict[str, Any]) -> Callable[[str], Dict[str, Any]]:
    """ip -> a direct disco pong from that peer (like tailscaled's PingResult)."""
    by_ip = {ip: p for p in status["Peer"].values() for ip in p["TailscaleIPs"]}

    def pong(ip: str) -> Dict[str, Any]:
        p = by_ip.get(ip)
        if p is None:
            return {"IP": ip, "Err": "no matching peer"}
        return {"IP": ip, "NodeIP": ip, "NodeName": p["HostName"], "Err": "", "LatencySeconds": 0.0012,
                "Endpoint": p["CurAddr"], "PeerRelay": "", "DERPRegionID": 0, "DERPRegionCode": ""}
    return pong


def ns_argv(ns: str, argv: Sequence[str]) -> List[str]:
    return ["ip", "netns", "exec", ns, *argv]


def proc_sample(pid: int) -> Dict[str, float]:
    """CPU ticks (utime+stime of all threads) and VmRSS/VmHWM in KiB of pid."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    mem = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "Threads:")):
                k, v = line.split(":", 1)
                mem[k] = float(v.split()[0])
    return {"t": time.monotonic(), "ticks": ticks, "rss_kib": mem.get("VmRSS", math.nan),
            "hwm_kib": mem.get("VmHWM", math.nan), "threads": mem.get("Threads", math.nan)}


def _stop_group(proc: subprocess.Popen, what: str, grace: float = 10.0) -> None:
    """SIGINT to the group led by proc (by pid), SIGKILL after grace."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGINT, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            say(f"{what} (pid {proc.pid}) still running after {sig.name}")


def cpu_bench(n_peers: int, seconds: float, warmup: float, topic_peers: int = 5,
              ipn_bus: bool = True, node_params: Sequence[str] = ()) -> Dict[str, Any]:
    """Run the node against a fake tailscaled with n_peers peers, topic_peers of which stream a
    topic to this machine; sample the node's CPU and RSS."""
    sys.path.insert(0, str(REPO / "test" / "unit"))
    from tsfake import FakeTailscaled  # type: ignore[import-not-found]

    status = fake_status(n_peers)
    ns = f"ombench-{os.getpid()}-{n_peers}"
    tmp = Path(tempfile.mkdtemp(prefix="bench-node-"))
    etc = Path("/etc/netns") / ns
    port = 11311  # the namespace is new: every port is free
    fake = FakeTailscaled(status=status, ping_for=fake_ping_for(status), record_requests=False,
                          ipn_bus=ipn_bus)
    streaming = threading.Event()  # set while the topic peers' counters grow
    procs: List[subprocess.Popen] = []
    res: Dict[str, Any] = {"peers": n_peers, "seconds": seconds, "warmup_s": warmup, "namespace": ns,
                           "settings": {"poll_rate": 4.0, "publish_rate": 1.0, "ping_interval": 5.0,
                                        "preflight_interval": 30.0, "netcheck_interval": 60.0,
                                        "iperf_server": False, "manage_hosts": False},
                           "status_json_bytes": len(json.dumps(status)), "topic_peers": topic_peers,
                           "ipn_bus": ipn_bus, "node_params": list(node_params)}
    created = False
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        created = True
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n100.64.0.1 robota.fleet.internal robota\n")
        (etc / "resolv.conf").write_text("# overlay_manager bench: no DNS in this namespace\n")
        subprocess.run(ns_argv(ns, ["ip", "link", "set", "lo", "up"]), check=True)
        subprocess.run(ns_argv(ns, ["ip", "addr", "add", "100.64.0.1/32", "dev", "lo"]), check=True)
        cfg = tmp / "robot.yaml"
        cfg.write_text(
            "# robot config of the CPU benchmark: tailscaled is a fake on a unix socket\n"
            "hostname: robota\nlogin_server: http://10.250.0.1:8080\nbase_domain: fleet.internal\n"
            f"master: robota\nmaster_port: {port}\n"
            f"tailscale:\n  socket: {fake.socket_path}\n  cli: /bin/false\n")
        env = child_env({"ROS_MASTER_URI": f"http://robota.fleet.internal:{port}",
                         "ROS_HOSTNAME": "robota.fleet.internal", "ROS_HOME": str(tmp / "ros"),
                         "ROS_LOG_DIR": str(tmp / "ros" / "log")})
        env.pop("ROS_IP", None)
        say(f"[{n_peers} peers] roscore -p {port} in namespace {ns} (loopback only)")
        core = subprocess.Popen(ns_argv(ns, ["roscore", "-p", str(port)]), env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=open(tmp / "roscore.log", "ab"),
                                stderr=subprocess.STDOUT)
        procs.append(core)
        say(f"[{n_peers} peers] waiting up to 30 s for the ROS master on port {port}")
        deadline = time.monotonic() + 30
        check = [PY, "-c", "import rosgraph,sys; sys.exit(0 if rosgraph.Master('/bench').is_online() else 1)"]
        while subprocess.run(ns_argv(ns, check), env=env, capture_output=True).returncode != 0:
            if core.poll() is not None or time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for roscore on port {port} in {ns}: "
                                   f"{_tail(tmp / 'roscore.log', 10)}")
            time.sleep(0.3)
        topic_peers = min(topic_peers, n_peers)
        talker_ips = [p["TailscaleIPs"][0] for p in list(status["Peer"].values())[:topic_peers]]
        topics = [f"/bench/stream{i}" for i in range(len(talker_ips))]
        for i, ip in enumerate(talker_ips):  # each streaming robot advertises its own overlay IP
            subprocess.run(ns_argv(ns, ["ip", "addr", "add", f"{ip}/32", "dev", "lo"]), check=True)
            procs.append(subprocess.Popen(
                ns_argv(ns, [PY, "-m", "overlay_manager.lab.bench_node", "_talk", topics[i], "10"]),
                env=dict(env, ROS_HOSTNAME=ip, ROS_IP=ip), start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=open(tmp / f"talker{i}.log", "ab"), stderr=subprocess.STDOUT))
        if topics:
            procs.append(subprocess.Popen(
                ns_argv(ns, [PY, "-m", "overlay_manager.lab.bench_node", "_listen", *topics]), env=env,
                start_new_session=True, stdin=subprocess.DEVNULL, stdout=open(tmp / "listener.log", "ab"),
                stderr=subprocess.STDOUT))
        argv = ["rosrun", "overlay_manager", "overlay_manager_node", f"_config:={cfg}", "_iperf_server:=false",
                *[f"_{kv}".replace("=", ":=", 1) for kv in node_params]]
        say(f"[{n_peers} peers] {' '.join(argv)}")
        node = subprocess.Popen(ns_argv(ns, argv), env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=open(tmp / "node.log", "ab"), stderr=subprocess.STDOUT)
        procs.append(node)
        say(f"[{n_peers} peers] waiting up to 60 s for /overlay_manager/peers with {n_peers} peers")
        probe = subprocess.run(ns_argv(ns, [PY, "-m", "overlay_manager.lab.probe", "peers", "--node",
                                            "/overlay_manager", "--min-peers", str(n_peers), "--timeout", "60"]),
                               env=env, capture_output=True, text=True, timeout=120)
        last = (probe.stdout.strip().splitlines() or ["{}"])[-1]
        got = json.loads(last) if last.startswith("{") else {}
        if not got.get("ok"):
            raise RuntimeError(f"node did not publish {n_peers} peers: {last[:500]} {probe.stderr[-800:]}; "
                               f"node log: {_tail(tmp / 'node.log', 15)}")
        paths = {p["path"] for p in got["msg"]["peers"]}
        if topics:
            say(f"[{n_peers} peers] waiting up to 60 s for {len(topics)} topic links on /overlay_manager")
            wl = subprocess.run(ns_argv(ns, [PY, "-m", "overlay_manager.lab.bench_node", "_wait-links",
                                             "/overlay_manager", str(len(topics)), "60"]),
                                env=env, capture_output=True, text=True, timeout=120)
            last = (wl.stdout.strip().splitlines() or ["{}"])[-1]
            res["topic_links"] = json.loads(last).get("links") if last.startswith("{") else last
            if wl.returncode != 0:
                raise RuntimeError(f"node did not map {len(topics)} topic links: {last[:500]} {wl.stderr[-500:]}")
        with open(f"/proc/{node.pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode()
        if "overlay_manager_node" not in cmd:
            raise RuntimeError(f"pid {node.pid} is not the node: {cmd}")
        say(f"[{n_peers} peers] node pid {node.pid} publishes {len(got['msg']['peers'])} peers ({paths}); "
            f"warm-up {warmup:.0f} s, then sampling for {seconds:.0f} s")
        streamers = list(status["Peer"].values())[:topic_peers]

        def grow() -> None:  # as tailscaled's counters grow while those peers stream to us
            while streaming.wait(0.5) and not fake._closing.is_set():
                with fake._lock:
                    for p in streamers:
                        p["RxBytes"] = int(p.get("RxBytes") or 0) + 10_000
                        p["TxBytes"] = int(p.get("TxBytes") or 0) + 500
                        p["LastWrite"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())

        streaming.set()
        threading.Thread(target=grow, name="bench-counters", daemon=True).start()
        time.sleep(warmup)
        with fake._lock:
            counts0 = dict(fake.counts)
        samples = [proc_sample(node.pid)]
        end = samples[0]["t"] + seconds
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            if node.poll() is not None:
                raise RuntimeError(f"node exited ({node.returncode}) during sampling: {_tail(tmp / 'node.log', 15)}")
            samples.append(proc_sample(node.pid))
        with fake._lock:
            counts1 = dict(fake.counts)
        hz = os.sysconf("SC_CLK_TCK")
        wall = samples[-1]["t"] - samples[0]["t"]
        per_s = [100.0 * (b["ticks"] - a["ticks"]) / hz / (b["t"] - a["t"]) for a, b in zip(samples, samples[1:])]
        req = {k: (counts1.get(k, 0) - counts0.get(k, 0)) / wall for k in counts1}
        res.update(
            pid=node.pid, wall_s=wall, samples=len(samples),
            cpu_mean_pct=100.0 * (samples[-1]["ticks"] - samples[0]["ticks"]) / hz / wall,
            cpu_max_1s_pct=max(per_s) if per_s else math.nan,
            cpu_p50_1s_pct=percentile(per_s, 50) if per_s else math.nan,
            rss_max_mib=max(s["rss_kib"] for s in samples) / 1024.0,
            rss_mean_mib=summary([s["rss_kib"] for s in samples])["mean"] / 1024.0,
            rss_first_mib=samples[0]["rss_kib"] / 1024.0, rss_last_mib=samples[-1]["rss_kib"] / 1024.0,
            vm_hwm_mib=samples[-1]["hwm_kib"] / 1024.0, threads=samples[-1]["threads"],
            localapi_requests_per_s=req, peer_paths=sorted(paths))
        say(f"[{n_peers} peers] cpu {res['cpu_mean_pct']:.1f} % of one core, max RSS {res['rss_max_mib']:.1f} MiB")
    finally:
        for p in reversed(procs):
            _stop_group(p, "node" if p is not procs[0] else "roscore")
        if created:
            subprocess.run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(etc, ignore_errors=True)
        streaming.clear()
        fake.close()
        res["logs_tail"] = {n: _tail(tmp / n, 8) for n in ("node.log",)}
        shutil.rmtree(tmp, ignore_errors=True)
    return res


# ================================================================================================
# report
# ================================================================================================
def summarize_path(p: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for phase in ("block", "unblock"):
        recs = [t[phase] for t in p.get("trials", []) if phase in t and "node_latency_s" in t[phase]]
        out[phase] = {"node_latency_s": summary([r["node_latency_s"] for r in recs]),
                      "node_stamp_latency_s": summary([r["node_stamp_latency_s"] for r in recs]),
                      "tailscaled_s": summary([r["tailscaled_s"] for r in recs])}
    return out


def table(result: Dict[str, Any]) -> str:
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
                         f"{c['wall_s']:.0f} s, defaults (poll 4 Hz, 2 Hz with the bus, publish 1 Hz, "
                         f"ping 5 s) | CPU mean {c['cpu_mean_pct']:.1f} % "
                         f"of one core (1-s max {c['cpu_max_1s_pct']:.0f} %), RSS max {c['rss_max_mib']:.1f} MiB |")
        else:
            lines.append(f"| node CPU / RSS | {c['peers']} peers | error: {c.get('error', '?')[:200]} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """scripts/bench_node entry point (and the in-namespace helpers, whose names start with _)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_watch-status":
        ap = argparse.ArgumentParser(prog="bench_node _watch-status")
        ap.add_argument("socket")
        ap.add_argument("peer")
        ap.add_argument("--hz", type=float, default=50.0)
        a = ap.parse_args(argv[1:])
        return watch_status(a.socket, a.peer, a.hz)
    if argv and argv[0] == "_watch-changes":
        return watch_changes(argv[1])
    if argv and argv[0] == "_talk":
        return topic_talk(argv[1], float(argv[2]))
    if argv and argv[0] == "_listen":
        return topic_listen(argv[1:])
    if argv and argv[0] == "_wait-links":
        return wait_links(argv[1], int(argv[2]), float(argv[3]))

    ap = argparse.ArgumentParser(prog="bench_node", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3, help="block/unblock cycles (default 3)")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for each path change")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds on a stable path before each action")
    ap.add_argument("--cpu-seconds", type=float, default=60.0, help="sampling window per peer count")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after the node is up before sampling")
    ap.add_argument("--peers", default="10,100,500,1000", help="peer counts for the CPU benchmark (comma list)")
    ap.add_argument("--node-param", action="append", default=[], metavar="KEY=VALUE",
                    help="a private parameter of the node for the CPU runs, e.g. bus_poll_rate=1 (repeatable)")
    ap.add_argument("--no-ipn-bus", action="store_true",
                    help="the fake tailscaled does not serve watch-ipn-bus (like tailscaled before the bus)")
    ap.add_argument("--topic-peers", type=int, default=5,
                    help="how many of the peers stream a topic to the node's machine (default 5)")
    ap.add_argument("--skip-path", action="store_true")
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        say("needs root (network namespaces, the lab)")
        return 2
    if not os.environ.get("ROS_PACKAGE_PATH") or subprocess.run(
            ["rospack", "find", "overlay_manager"], capture_output=True).returncode != 0:
        say('ROS env missing: source "$(bash scripts/build)/devel/setup.bash" first')
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks

    result: Dict[str, Any] = {"started": time.time(), "host": os.uname().nodename, "cpus": os.cpu_count(),
                              "loadavg_start": os.getloadavg()}
    try:
        lab_runs = sorted(n for n in os.listdir("/run/overlay-lab")) if os.path.isdir("/run/overlay-lab") else []
    except OSError:
        lab_runs = []
    result["other_lab_runs_at_start"] = lab_runs
    if lab_runs:
        say(f"note: other lab runs are up ({', '.join(lab_runs)}): they share the CPUs")
    out_path = Path(a.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["loadavg_end"] = os.getloadavg()
        out_path.write_text(json.dumps(result, indent=1, default=str) + "\n")

    rc = 0
    if not a.skip_path:
        p = path_bench(a.trials, a.timeout, a.settle)
        p["summary"] = summarize_path(p)
        result["path_change"] = p
        rc |= 1 if p["errors"] else 0
        save()
    if not a.skip_cpu:
        result["cpu"] = []
        for n in [int(x) for x in a.peers.split(",") if x.strip()]:
            try:
                result["cpu"].append(cpu_bench(n, a.cpu_seconds, a.warmup, a.topic_peers, not a.no_ipn_bus,
                                               a.node_param))
            except Exception as exc:  # noqa: BLE001 - report it and go on with the next size
                say(f"[{n} peers] failed: {exc}")
                result["cpu"].append({"peers": n, "error": str(exc)})
                rc |= 1
            save()
    save()
    print(table(result))
    say(f"wrote {out_path}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
