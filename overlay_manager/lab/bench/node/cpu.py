"""Part 2 of the node benchmark: the node's CPU and memory with N peers (see main.py).

The real node against a fake tailscaled (overlay_manager/testing/tsfake.py) in a private network namespace
that has only loopback, with its own roscore; a few peers stream a ROS topic to the node's machine
(publishers on their overlay IPs added to lo). /proc/<pid>/stat and /status are sampled each second.
"""
from __future__ import annotations

import copy
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

from overlay_manager.core.stats import percentile, summary
from overlay_manager.lab.bench.node.common import PY, child_env, say, tail_lines


def fake_status(n: int) -> Dict[str, Any]:
    """test/data/status_direct.json with its one peer cloned into n peers (names robot-001...,
    distinct node keys, IDs, overlay IPs and direct endpoints)."""
    from overlay_manager.testing.tsfake import recorded

    st = recorded("status_direct.json")
    (_, proto), = st["Peer"].items()
    peers: Dict[str, Dict[str, Any]] = {}  # node key -> peer status
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
    """argv run inside network namespace ns (ip netns exec)."""
    return ["ip", "netns", "exec", ns, *argv]


def proc_sample(pid: int) -> Dict[str, float]:
    """CPU ticks (utime+stime of all threads) and VmRSS/VmHWM in KiB of pid."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    mem: Dict[str, float] = {}  # VmRSS / VmHWM (KiB), Threads
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


def node_settings(node_params: Sequence[str]) -> Dict[str, Any]:
    """The node settings a CPU run uses: NodeSettings' defaults, iperf_server and manage_hosts off
    (as the run's config and command line set them), then the --node-param overrides (as text)."""
    from overlay_manager.core.config import NodeSettings

    out: Dict[str, Any] = {k: getattr(NodeSettings(), k) for k in NodeSettings.__dataclass_fields__}
    out.update(iperf_server=False, manage_hosts=False)
    out.update(kv.split("=", 1) for kv in node_params if "=" in kv)
    return out


def cpu_bench(n_peers: int, seconds: float, warmup: float, topic_peers: int = 5,
              ipn_bus: bool = True, node_params: Sequence[str] = (), subscribers: bool = False) -> Dict[str, Any]:
    """Run the node against a fake tailscaled with n_peers peers, topic_peers of which stream a
    topic to this machine; sample the node's CPU and RSS. subscribers: one process subscribes to
    the node's ~peers, ~status and /diagnostics while it is sampled (as a dashboard and a
    diagnostic aggregator would), so every publish is serialized and sent."""
    from overlay_manager.testing.tsfake import FakeTailscaled

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
                           "settings": node_settings(node_params),
                           "status_json_bytes": len(json.dumps(status)), "topic_peers": topic_peers,
                           "ipn_bus": ipn_bus, "node_params": list(node_params), "subscribers": subscribers}
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
                                   f"{tail_lines(tmp / 'roscore.log', 10)}")
            time.sleep(0.3)
        topic_peers = min(topic_peers, n_peers)
        talker_ips = [p["TailscaleIPs"][0] for p in list(status["Peer"].values())[:topic_peers]]
        topics = [f"/bench/stream{i}" for i in range(len(talker_ips))]
        for i, ip in enumerate(talker_ips):  # each streaming robot advertises its own overlay IP
            subprocess.run(ns_argv(ns, ["ip", "addr", "add", f"{ip}/32", "dev", "lo"]), check=True)
            procs.append(subprocess.Popen(
                ns_argv(ns, [PY, "-m", "overlay_manager.lab.bench.node.main", "_talk", topics[i], "10"]),
                env=dict(env, ROS_HOSTNAME=ip, ROS_IP=ip), start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=open(tmp / f"talker{i}.log", "ab"), stderr=subprocess.STDOUT))
        if topics:
            procs.append(subprocess.Popen(
                ns_argv(ns, [PY, "-m", "overlay_manager.lab.bench.node.main", "_listen", *topics]), env=env,
                start_new_session=True, stdin=subprocess.DEVNULL, stdout=open(tmp / "listener.log", "ab"),
                stderr=subprocess.STDOUT))
        argv = ["rosrun", "overlay_manager", "overlay_manager_node", f"_config:={cfg}", "_iperf_server:=false",
                *[f"_{kv}".replace("=", ":=", 1) for kv in node_params]]
        say(f"[{n_peers} peers] {' '.join(argv)}")
        node = subprocess.Popen(ns_argv(ns, argv), env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=open(tmp / "node.log", "ab"), stderr=subprocess.STDOUT)
        procs.append(node)
        say(f"[{n_peers} peers] waiting up to 60 s for /overlay_manager/peers with {n_peers} peers")
        probe = subprocess.run(ns_argv(ns, [PY, "-m", "overlay_manager.lab.probe.main", "peers", "--node",
                                            "/overlay_manager", "--min-peers", str(n_peers), "--timeout", "60"]),
                               env=env, capture_output=True, text=True, timeout=120)
        last = (probe.stdout.strip().splitlines() or ["{}"])[-1]
        got = json.loads(last) if last.startswith("{") else {}
        if not got.get("ok"):
            raise RuntimeError(f"node did not publish {n_peers} peers: {last[:500]} {probe.stderr[-800:]}; "
                               f"node log: {tail_lines(tmp / 'node.log', 15)}")
        paths = {p["path"] for p in got["msg"]["peers"]}
        if topics:
            say(f"[{n_peers} peers] waiting up to 60 s for {len(topics)} topic links on /overlay_manager")
            wl = subprocess.run(ns_argv(ns, [PY, "-m", "overlay_manager.lab.bench.node.main", "_wait-links",
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

        if subscribers:
            topics_out = ["/overlay_manager/peers", "/overlay_manager/status", "/diagnostics"]
            say(f"[{n_peers} peers] subscribing to {', '.join(topics_out)} while sampling")
            procs.append(subprocess.Popen(
                ns_argv(ns, [PY, "-m", "overlay_manager.lab.bench.node.main", "_drain", *topics_out]), env=env,
                start_new_session=True, stdin=subprocess.DEVNULL, stdout=open(tmp / "drain.log", "ab"),
                stderr=subprocess.STDOUT))
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
                raise RuntimeError(f"node exited ({node.returncode}) during sampling: "
                                   f"{tail_lines(tmp / 'node.log', 15)}")
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
        res["logs_tail"] = {n: tail_lines(tmp / n, 8) for n in ("node.log",)}
        shutil.rmtree(tmp, ignore_errors=True)
    return res
