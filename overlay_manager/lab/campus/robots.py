"""Start the real overlay_manager node on lab hosts the way a user does, and query it.

    ROS_ENV="$(rosrun overlay_manager overlay_env --config robot.yaml --enrol --write-hosts [--wait-master S])"
    eval "$ROS_ENV"
    exec roslaunch overlay_manager robot.launch config:=robot.yaml manage_hosts:=true iperf_server:=true

in the host's namespace, where /etc/hosts is the host's own /etc/netns file, so overlay names
resolve through the node's managed block (MagicDNS is off in the lab). Probes (probe/main.py) run in the
namespace too and return JSON.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.system import wait_for
from overlay_manager.system import children
from overlay_manager.system.waiting import tail

REPO = Path(__file__).resolve().parents[3]


def ros_env(lab: Lab, host: str) -> Dict[str, str]:
    """Per-host ROS_HOME/ROS_LOG_DIR so hosts do not share logs or roscore state."""
    home = Path(lab.host_dir(host)) / "ros"
    home.mkdir(parents=True, exist_ok=True)
    return {"ROS_HOME": str(home), "ROS_LOG_DIR": str(home / "log"), "PYTHONUNBUFFERED": "1"}


def launch_command(config: Path, master: bool, wait_master_s: float = 90.0,
                   launch_args: Sequence[str] = ()) -> str:
    """The shell line a user types on that machine (see module doc)."""
    env_opts = "--enrol --write-hosts" + ("" if master else f" --wait-master {wait_master_s:.0f}")
    args = " ".join(shlex.quote(a) for a in launch_args)
    # ROS_ENV=... && eval: a failing overlay_env stops here (a bare eval "$(...)" would go on)
    return (f'ROS_ENV="$(rosrun overlay_manager overlay_env --config {shlex.quote(str(config))} {env_opts})" '
            f'&& eval "$ROS_ENV" '
            f"&& exec roslaunch --wait overlay_manager robot.launch config:={shlex.quote(str(config))} "
            f"manage_hosts:=true iperf_server:=true {args}").strip()


def start_robot(lab: Lab, host: str, master: bool, launch_args: Sequence[str] = (),
                wait_master_s: float = 90.0) -> subprocess.Popen:
    """roslaunch robot.launch on host (the master host also gets roscore from roslaunch)."""
    cfg = Path(lab.robot_yaml(host))
    line = launch_command(cfg, master, wait_master_s, launch_args)
    if master:
        line = line.replace("roslaunch --wait", "roslaunch")
    log = Path(lab.host_dir(host)) / "robot.launch.log"
    return lab.popen(host, ["bash", "-c", line], env=ros_env(lab, host), log=log)


def _python() -> str:
    return sys.executable if sys.executable.startswith("/usr/bin") else "/usr/bin/python3"


_OVERLAY_ENV: List[str] = []   # the executable ``rosrun overlay_manager overlay_env`` runs, once found


def overlay_env_executable() -> str:
    """The file ``rosrun overlay_manager overlay_env`` executes (asked from rosrun itself, once per
    process), or "" when rosrun cannot say (callers then run rosrun each time). rosrun's own search
    costs about 2.5 s a call on 2 cores (catkin_find three times, a find over the package), and
    every probe and lab tool starts with overlay_env: the lab resolves it once, the robots' own
    start line (:func:`launch_command`) keeps rosrun as a user types it."""
    if not _OVERLAY_ENV:
        try:
            res = subprocess.run(["rosrun", "--prefix", "echo", "overlay_manager", "overlay_env"],
                                 capture_output=True, text=True, timeout=60, check=False)
            lines = res.stdout.strip().splitlines()
            found = lines[-1].strip() if res.returncode == 0 and lines else ""
        except (OSError, subprocess.TimeoutExpired):
            found = ""
        if not (found.startswith("/") and Path(found).is_file()):
            return ""
        _OVERLAY_ENV.append(found)
    return _OVERLAY_ENV[0]


def overlay_env_line(lab: Lab, host: str) -> str:
    """``eval "$(rosrun overlay_manager overlay_env --config ...)"`` (with the executable rosrun
    finds, :func:`overlay_env_executable`): the host's ROS env in overlay names."""
    exe = overlay_env_executable()
    cmd = shlex.quote(exe) if exe else "rosrun overlay_manager overlay_env"
    return f'eval "$({cmd} --config {shlex.quote(str(lab.robot_yaml(host)))})"'


def start_tool(lab: Lab, host: str, module_args: Sequence[str], name: str,
               env: Optional[Mapping[str, str]] = None) -> subprocess.Popen:
    """Start ``python3 -m overlay_manager.lab.<module_args>`` on host in the background with the
    host's ROS env from overlay_env (as a user starts a node there); log in host_dir/<name>.log.
    Stop it with :func:`stop` (by pid)."""
    line = (f"{overlay_env_line(lab, host)} && exec {shlex.quote(_python())} -m overlay_manager.lab."
            + " ".join(shlex.quote(a) for a in module_args))
    full_env = dict(ros_env(lab, host))
    full_env.update(env or {})
    return lab.popen(host, ["bash", "-c", line], env=full_env, log=Path(lab.host_dir(host)) / f"{name}.log")


def start_camera(lab: Lab, host: str, topic: str = "/camera/image_raw", rate_hz: float = 30.0,
                 width: int = 640, height: int = 480) -> subprocess.Popen:
    """The lab camera (width x height rgb8 sensor_msgs/Image at rate_hz, the real scene with each
    frame's index in header.frame_id: probe/rosnodes.py, probe/scene.py) on host."""
    return start_tool(lab, host, ["probe.rosnodes", "camera", "--topic", topic, "--rate", str(rate_hz),
                                  "--width", str(width), "--height", str(height)],
                      f"camera{topic.replace('/', '_')}")


def start_echo(lab: Lab, host: str) -> subprocess.Popen:
    """The Twist echo (/cmd_vel -> /cmd_vel_echo) on host."""
    return start_tool(lab, host, ["probe.rosnodes", "echo"], "twist_echo")


class Recorder:
    """``probe record`` running in the background on a lab host; its JSON lines are read from a
    file while it runs (``t`` values are CLOCK_MONOTONIC, comparable with time.monotonic()).

        rec = Recorder(lab, "alpha-laptop", image="/camera/image_raw", nodes=[overlay_node("alpha-laptop")])
        rec.wait("first frame", lambda ev: ev["ev"] == "frame", timeout=60)
        ...
        rec.stop(); rec.events
    """

    def __init__(self, lab: Lab, host: str, image: str = "", nodes: Sequence[str] = (), name: str = "record",
                 compressed: bool = False, twist_rate: float = 0.0) -> None:
        self.lab, self.host = lab, host
        self.path = Path(lab.host_dir(host)) / f"{name}.jsonl"
        self.path.write_text("")
        args = (["probe.main", "record"] + (["--image", image] if image else [])
                + (["--compressed"] if compressed else [])
                + (["--twist-rate", str(twist_rate)] if twist_rate > 0 else []))
        for n in nodes:
            args += ["--node", n]
        line = (f"{overlay_env_line(lab, host)} && exec {shlex.quote(_python())} -m overlay_manager.lab."
                + " ".join(shlex.quote(a) for a in args) + f" > {shlex.quote(str(self.path))}")
        self.proc = lab.popen(host, ["bash", "-c", line], env=ros_env(lab, host),
                              log=Path(lab.host_dir(host)) / f"{name}.log")
        self.events: List[Dict[str, Any]] = []
        self._offset = 0
        self._partial = ""

    def read(self) -> List[Dict[str, Any]]:
        """Read the lines written since the last call; returns the new events (all in .events)."""
        with open(self.path, encoding="utf-8") as f:
            f.seek(self._offset)
            chunk = f.read()
            self._offset = f.tell()
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        new = [json.loads(x) for x in lines if x.startswith("{")]
        self.events.extend(new)
        return new

    def wait(self, what: str, pred: Callable[[Dict[str, Any]], bool], timeout: float,
             since: float = 0.0) -> Dict[str, Any]:
        """The first event (with t >= since) satisfying pred; LabTimeout naming what (with the
        frame count and the last events) after ``timeout`` s, LabError when the recorder died."""
        def found() -> Optional[Dict[str, Any]]:
            self.read()
            for ev in self.events:
                if ev["t"] >= since and pred(ev):
                    return ev
            if self.proc.poll() is not None:
                raise LabError(f"recorder on {self.host} exited ({self.proc.returncode}) while waiting for {what}; "
                               f"log {self.proc_log_tail()}")
            return None

        def seen() -> str:
            last = [e for e in self.events if e["ev"] != "frame"][-5:]
            frames = [e for e in self.events if e["ev"] == "frame"]
            return f"{len(frames)} frames so far, last events: {json.dumps(last)[:1500]}"

        return wait_for(f"{what} on {self.host}", found, timeout, interval=0.1, detail=seen)

    def proc_log_tail(self) -> str:
        """The last 8 lines of the recorder's own log (its stderr)."""
        return tail(Path(self.lab.host_dir(self.host)) / f"{self.path.stem}.log", 8)

    def frames(self, start: float = 0.0, end: float = float("inf")) -> List[Dict[str, Any]]:
        """Frame events with start <= t < end."""
        self.read()
        return [e for e in self.events if e["ev"] == "frame" and start <= e["t"] < end]

    def stop(self) -> None:
        """Stop the recorder (SIGTERM to its process group, by pid) and read what is left."""
        children.stop(self.proc, 10.0, signal.SIGTERM)
        self.read()


def run_probe(lab: Lab, host: str, args: Sequence[str], timeout: float = 60.0,
              env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """Run probe/main.py in host's namespace with the ROS env in overlay names; returns its JSON.

    Raises:
        LabError: the probe failed or printed no JSON (its error text is included).
    """
    inner = (f"{overlay_env_line(lab, host)} && exec {shlex.quote(_python())} "
             f"-m overlay_manager.lab.probe.main " + " ".join(shlex.quote(a) for a in args))
    full_env = dict(ros_env(lab, host))
    full_env.update(env or {})
    res = lab.exec(host, ["bash", "-c", inner], env=full_env, timeout=timeout + 30, check=False, quiet=True)
    return json_result(res, f"probe {' '.join(args)} on {host}")


def json_result(res: subprocess.CompletedProcess, what: str) -> Dict[str, Any]:
    """The last JSON line a lab tool printed ({"ok": true, ...}); LabError naming what otherwise."""
    for line in reversed(res.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            if not data.get("ok"):
                raise LabError(f"{what}: {data.get('error')}")
            return data
    raise LabError(f"{what} printed no result (exit {res.returncode}): {res.stderr.strip()[-1500:]}")


def print_launch_logs(lab: Lab, hosts: Sequence[str], lines: int = 40, name: str = "robot.launch.log") -> None:
    """Print the tail of each host's log file (for a failing fixture's output)."""
    for h in hosts:
        log = Path(lab.host_dir(h)) / name
        if log.exists():
            print(f"---- {h} {name} (tail)\n" + tail(log, lines, sep="\n"))


def start_master_then(lab: Lab, master: str, others: Sequence[str], procs: list,
                      timeout: float = 120.0) -> None:
    """robot.launch on master (roscore there), wait for its ~peers; then on each of others and
    wait until each lists at least one peer. Started processes are appended to procs as they
    start, so the caller's finally can stop them (robots.stop) whatever fails."""
    procs.append(start_robot(lab, master, master=True))
    peers(lab, master, timeout=90, node=overlay_node(master))
    for h in others:
        procs.append(start_robot(lab, h, master=False))
    for h in others:
        peers(lab, h, min_peers=1, timeout=timeout, node=overlay_node(h))


@contextmanager
def processes(lab: Lab, log_hosts: Sequence[str] = (), log_lines: int = 40) -> Iterator[List[subprocess.Popen]]:
    """A list to append started ROS processes to; on leaving, each is stopped (:func:`stop`, by
    pid, in reverse order), and when the body raised, the robot.launch log tails of
    ``log_hosts`` are printed first (a failing fixture's output says why)::

        with robots.processes(lab, (ROBOT, LAPTOP)) as procs:
            robots.start_master_then(lab, ROBOT, [LAPTOP], procs)
            yield lab
    """
    procs: List[subprocess.Popen] = []
    try:
        yield procs
    except Exception:
        print_launch_logs(lab, log_hosts, lines=log_lines)
        raise
    finally:
        for p in reversed(procs):
            stop(lab, p)


def call(lab: Lab, host: str, service: str, srv_type: str, timeout: float = 60.0, **fields: Any) -> Dict[str, Any]:
    """Call a ROS service from host; returns the response as a dict."""
    return run_probe(lab, host, ["call", service, srv_type, json.dumps(fields), "--timeout", str(timeout)],
                     timeout=timeout)["msg"]


def peers(lab: Lab, host: str, min_peers: int = 0, where: str = "", timeout: float = 60.0,
          node: str = "/overlay_manager") -> Dict[str, Any]:
    """The latest ~peers of the node on host (waits for min_peers and the where expression)."""
    args = ["peers", "--node", node, "--min-peers", str(min_peers), "--timeout", str(timeout)]
    if where:
        args += ["--where", where]
    return run_probe(lab, host, args, timeout=timeout)["msg"]


def status(lab: Lab, host: str, where: str = "", timeout: float = 60.0,
           node: str = "/overlay_manager") -> Dict[str, Any]:
    """The latest ~status of the node on host (waits for the where expression on dict m)."""
    args = ["status", "--node", node, "--timeout", str(timeout)]
    if where:
        args += ["--where", where]
    return run_probe(lab, host, args, timeout=timeout)["msg"]


def stop(lab: Lab, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Stop a process started on a lab host (e.g. a roslaunch of start_robot), by pid: SIGINT
    to its process group (roslaunch then stops its nodes), SIGKILL after ``timeout`` seconds."""
    children.stop(proc, timeout, signal.SIGINT)
