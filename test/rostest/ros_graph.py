"""Helpers of the rostest-level tests that run a ROS graph of their own on loopback.

- :func:`free_port`: a loopback TCP port for a roscore of the test's own;
- :func:`ros_env`: the environment its processes run with (that master, ROS_IP 127.0.0.1,
  ROS_HOME and logs in the test's temporary directory, Debian's ROS Python first on PATH);
- :func:`wait`: a bounded poll whose timeout fails the test and says what it waited for;
- :func:`start`: a process of the graph, in its own process group, output to a log file;
- :func:`read_jsonl`: what a recorder process has written so far (one JSON object a line);
- :func:`stop_all`: stops what a test started, by pid, last started first.

A plain module next to the tests: pytest puts this directory on ``sys.path`` (it has no
``__init__.py``), so the tests and conftest.py import it by name.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TypeVar, Union

from overlay_manager.system import children, waiting

T = TypeVar("T")

ROS_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
"""Put first on PATH: ROS 1 runs under /usr/bin/python3, not a python3 that happens to be first."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ros_env(port: int, home: Union[str, Path], log_dir: Optional[Union[str, Path]] = None,
            drop: Iterable[str] = ()) -> Dict[str, str]:
    """This process's environment for the nodes of a graph whose master is on 127.0.0.1:``port``.

    Args:
        port: the roscore's TCP port on loopback.
        home: ROS_HOME (roslaunch and rosout write there instead of ~/.ros).
        log_dir: ROS_LOG_DIR when given (else ROS's default under ROS_HOME).
        drop: more variables to remove (ROS_HOSTNAME is always removed: ROS_IP names the node).
    """
    env = dict(os.environ, ROS_MASTER_URI=f"http://127.0.0.1:{port}", ROS_IP="127.0.0.1", ROS_HOME=str(home))
    if log_dir is not None:
        env["ROS_LOG_DIR"] = str(log_dir)
    for key in ("ROS_HOSTNAME", *drop):
        env.pop(key, None)
    env["PATH"] = ROS_PATH + ":" + env.get("PATH", "")
    return env


def wait(what: str, check: Callable[[], Optional[T]], timeout: float,
         detail: Optional[Callable[[], str]] = None, interval: float = 0.1) -> T:
    """:func:`overlay_manager.system.waiting.wait_for` every ``interval`` seconds; a timeout (``timeout``
    seconds) fails the test with an AssertionError naming ``what`` and ``detail()``."""
    return waiting.wait_for(what, check, timeout, interval=interval, detail=detail, error=AssertionError)


def start(argv: Sequence[str], env: Mapping[str, str], log: Union[str, Path],
          procs: List[subprocess.Popen]) -> subprocess.Popen:
    """Start ``argv`` with ``env``, stdout and stderr to ``log``, leading its own process group
    (so :func:`stop_all` reaches its children); appended to ``procs``, returned."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen(list(argv), env=dict(env), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    procs.append(proc)
    return proc


def read_jsonl(path: Union[str, Path]) -> List[Dict[str, Any]]:
    """The JSON objects in a file a recorder appends to, one a line, in order; a line that does
    not parse (the one being written) is left out, and a file not created yet has none."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def stop_all(procs: Sequence[subprocess.Popen], grace_s: float = 15.0) -> None:
    """Stop the processes in reverse start order: SIGINT to each one's process group (roslaunch
    then stops its nodes, roscore its master), SIGKILL after ``grace_s`` seconds."""
    for proc in reversed(procs):
        children.stop(proc, grace_s, signal.SIGINT)
