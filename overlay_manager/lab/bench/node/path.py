"""Part 1 of the node benchmark: path-change latency in the lab (see main.py).

A fresh lab run of config/lab/two_buildings.yaml; UDP blocked and unblocked at building b1 while
two watchers in the laptop's namespace (bench_node_ns) report tailscaled's view and the node's
~path_changes. Everything started here is stopped by pid; the lab run is torn down by Lab.down().
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.lab.bench.node.common import PY, REPO, child_env, say, tail_lines

SPEC = REPO / "config" / "lab" / "two_buildings.yaml"
ROBOT, LAPTOP, BUILDING = "alpha-robot1", "alpha-laptop", "b1"
N_ROBOT, N_LAPTOP = overlay_node(ROBOT), overlay_node(LAPTOP)


class LineWatcher:
    """Reads JSON lines of a child process into a list (thread); waits for matching events."""

    def __init__(self, name: str, proc: subprocess.Popen) -> None:
        self.name, self.proc = name, proc
        self.events: List[Dict[str, Any]] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, name=f"read-{name}", daemon=True).start()

    def _read(self) -> None:
        """Reader thread: every JSON line of the child's stdout becomes an event (others are skipped)."""
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
        """The latest event matching pred so far (None: none yet); does not wait."""
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


def path_bench(trials: int, timeout: float, settle: float) -> Dict[str, Any]:
    """Block/unblock UDP at b1 ``trials`` times; latencies as seen from the laptop."""
    from overlay_manager.lab.campus import robots
    from overlay_manager.lab.campus.core import Lab

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
        st = lab.popen(LAPTOP, [PY, "-m", "overlay_manager.lab.bench.node.main", "_watch-status",
                                str(lab.socket_path(LAPTOP)), ROBOT, "--hz", "50"],
                       env=child_env(), stdout=subprocess.PIPE, stderr=open(hdir / "bench_status.err", "ab"))
        procs.append(st)
        cfg = lab.robot_yaml(LAPTOP)
        line = (f'eval "$(rosrun overlay_manager overlay_env --config {cfg})" && exec {PY} '
                f"-m overlay_manager.lab.bench.node.main _watch-changes {N_LAPTOP}/path_changes")
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
                say(f"---- {h} robot.launch.log (tail)\n{tail_lines(log)}")
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
