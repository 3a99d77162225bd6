"""Start the real overlay_manager node on lab hosts the way a user does, and query it.

    eval "$(rosrun overlay_manager overlay_env --config robot.yaml --enrol --write-hosts [--wait-master S])"
    exec roslaunch overlay_manager robot.launch config:=robot.yaml manage_hosts:=true

in the host's namespace, where /etc/hosts is the host's own /etc/netns file, so overlay names
resolve through the node's managed block (MagicDNS is off in the lab). Probes (probe.py) run in the
namespace too and return JSON.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from .errors import LabError

REPO = Path(__file__).resolve().parents[2]


def ros_env(lab: Any, host: str) -> Dict[str, str]:
    """Per-host ROS_HOME/ROS_LOG_DIR so hosts do not share logs or roscore state."""
    home = Path(lab.host_dir(host)) / "ros"
    home.mkdir(parents=True, exist_ok=True)
    return {"ROS_HOME": str(home), "ROS_LOG_DIR": str(home / "log"), "PYTHONUNBUFFERED": "1"}


def launch_command(config: Path, master: bool, wait_master_s: float = 90.0,
                   launch_args: Sequence[str] = ()) -> str:
    """The shell line a user types on that machine (see module doc)."""
    env_opts = "--enrol --write-hosts" + ("" if master else f" --wait-master {wait_master_s:.0f}")
    args = " ".join(shlex.quote(a) for a in launch_args)
    return (f'eval "$(rosrun overlay_manager overlay_env --config {shlex.quote(str(config))} {env_opts})" '
            f"&& exec roslaunch --wait overlay_manager robot.launch config:={shlex.quote(str(config))} "
            f"manage_hosts:=true {args}").strip()


def start_robot(lab: Any, host: str, master: bool, launch_args: Sequence[str] = (),
                wait_master_s: float = 90.0) -> subprocess.Popen:
    """roslaunch robot.launch on host (the master host also gets roscore from roslaunch)."""
    cfg = Path(lab.robot_yaml(host))
    line = launch_command(cfg, master, wait_master_s, launch_args)
    if master:
        line = line.replace("roslaunch --wait", "roslaunch")
    log = Path(lab.host_dir(host)) / "robot.launch.log"
    return lab.popen(host, ["bash", "-c", line], env=ros_env(lab, host), log=log)


def run_probe(lab: Any, host: str, args: Sequence[str], timeout: float = 60.0,
              env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """Run probe.py in host's namespace with the ROS env in overlay names; returns its JSON.

    Raises:
        LabError: the probe failed or printed no JSON (its error text is included).
    """
    cfg = Path(lab.robot_yaml(host))
    inner = (f'eval "$(rosrun overlay_manager overlay_env --config {shlex.quote(str(cfg))})" && '
             f"exec {shlex.quote(sys.executable if sys.executable.startswith('/usr/bin') else '/usr/bin/python3')} "
             f"-m overlay_manager.lab.probe " + " ".join(shlex.quote(a) for a in args))
    full_env = dict(ros_env(lab, host))
    full_env.update(env or {})
    res = lab.exec(host, ["bash", "-c", inner], env=full_env, timeout=timeout + 30, check=False, quiet=True)
    for line in reversed(res.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            if not data.get("ok"):
                raise LabError(f"probe {' '.join(args)} on {host}: {data.get('error')}")
            return data
    raise LabError(f"probe {' '.join(args)} on {host} printed no result (exit {res.returncode}): "
                   f"{res.stderr.strip()[-1500:]}")


def call(lab: Any, host: str, service: str, srv_type: str, timeout: float = 60.0, **fields: Any) -> Dict[str, Any]:
    """Call a ROS service from host; returns the response as a dict."""
    return run_probe(lab, host, ["call", service, srv_type, json.dumps(fields), "--timeout", str(timeout)],
                     timeout=timeout)["msg"]


def peers(lab: Any, host: str, min_peers: int = 0, where: str = "", timeout: float = 60.0,
          node: str = "/overlay_manager") -> Dict[str, Any]:
    """The latest ~peers of the node on host (waits for min_peers and the where expression)."""
    args = ["peers", "--node", node, "--min-peers", str(min_peers), "--timeout", str(timeout)]
    if where:
        args += ["--where", where]
    return run_probe(lab, host, args, timeout=timeout)["msg"]


def status(lab: Any, host: str, where: str = "", timeout: float = 60.0,
           node: str = "/overlay_manager") -> Dict[str, Any]:
    """The latest ~status of the node on host (waits for the where expression on dict m)."""
    args = ["status", "--node", node, "--timeout", str(timeout)]
    if where:
        args += ["--where", where]
    return run_probe(lab, host, args, timeout=timeout)["msg"]


def stop(lab: Any, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Stop a roslaunch started by start_robot (SIGINT to its group, then SIGKILL), by pid."""
    import os
    import signal
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)
