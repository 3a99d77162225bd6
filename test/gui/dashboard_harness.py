"""Helpers and fixtures for the dashboard GUI tests: Xvfb, a roscore on a free loopback port, rospy, Qt.

Every process started here is ended by its own pid (process group for roscore, which starts
rosmaster and rosout as its children). Waits poll with bounded timeouts and say what they waited
for when they give up.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import xmlrpc.client
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

import pytest

from overlay_manager.system import waiting

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"


def wait_for(what: str, predicate: Callable[[], bool], timeout: float,
             describe: Optional[Callable[[], str]] = None, step: float = 0.02) -> None:
    """overlay_manager.system.waiting.wait_for that also processes Qt events (when an application
    exists) before each check; a timeout fails the test with what was waited for."""
    app = None
    if "python_qt_binding" in sys.modules:
        from python_qt_binding.QtWidgets import QApplication
        app = QApplication.instance()

    def check() -> bool:
        if app is not None:
            app.processEvents()
        return predicate()

    try:
        waiting.wait_for(what, check, timeout, interval=step, detail=describe)
    except waiting.WaitTimeout as exc:
        pytest.fail(str(exc))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, group: bool = False, sig: int = signal.SIGINT,
                 timeout: float = 10.0) -> None:
    """End a process we started (its group when group=True): sig, then SIGKILL after timeout."""
    if proc.poll() is not None:
        return
    kill = (lambda s: os.killpg(proc.pid, s)) if group else proc.send_signal
    kill(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill(signal.SIGKILL)
        proc.wait(5)


@pytest.fixture(scope="session")
def xvfb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start Xvfb on a display it picks itself (-displayfd); yields ":N" and sets DISPLAY."""
    binary = shutil.which("Xvfb")
    if binary is None:
        pytest.skip("Xvfb not installed (Debian package xvfb)")
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([binary, "-displayfd", str(write_fd), "-screen", "0", "1280x1024x24",
                             "-nolisten", "tcp"],
                            pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        number = f.readline().strip()  # Xvfb writes the display number once it listens
    if not number:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        stop_process(proc)
        pytest.fail(f"Xvfb did not report a display: {err[-500:]}")
    display = f":{number}"
    old = os.environ.get("DISPLAY")
    os.environ["DISPLAY"] = display
    os.environ.pop("WAYLAND_DISPLAY", None)
    runtime = tmp_path_factory.mktemp("xdg_runtime")
    runtime.chmod(0o700)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    yield display
    if old is None:
        os.environ.pop("DISPLAY", None)
    else:
        os.environ["DISPLAY"] = old
    stop_process(proc, sig=signal.SIGTERM)


@pytest.fixture(scope="session")
def ros_env(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    """Environment for ROS processes: a free loopback master port, ROS_HOME in a temp dir."""
    if shutil.which("roscore", path="/usr/bin:" + os.environ.get("PATH", "")) is None:
        pytest.skip("roscore not installed")
    home = tmp_path_factory.mktemp("ros_home")
    env = dict(os.environ)
    env.pop("ROS_HOSTNAME", None)
    env.update({
        "ROS_MASTER_URI": f"http://127.0.0.1:{free_port()}",
        "ROS_IP": "127.0.0.1",  # rospy then binds its servers to loopback only
        "ROS_HOME": str(home),
        "ROS_LOG_DIR": str(home / "log"),
        "PATH": "/usr/bin:/bin:" + env.get("PATH", ""),
        "PYTHONUNBUFFERED": "1",
    })
    return env


@pytest.fixture(scope="session")
def roscore(ros_env: Dict[str, str]) -> Iterator[str]:
    """A roscore of our own; yields its URI and points this process at it."""
    port = ros_env["ROS_MASTER_URI"].rsplit(":", 1)[1]
    log = open(Path(ros_env["ROS_HOME"]) / "roscore.out", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(["roscore", "-p", port], env=ros_env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    master = xmlrpc.client.ServerProxy(ros_env["ROS_MASTER_URI"])

    def up() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"roscore exited with {proc.returncode}; see {log.name}")
        try:
            return master.getPid("/test")[0] == 1
        except OSError:
            return False

    wait_for(f"roscore at {ros_env['ROS_MASTER_URI']}", up, 30)
    for key in ("ROS_MASTER_URI", "ROS_IP", "ROS_HOME", "ROS_LOG_DIR"):
        os.environ[key] = ros_env[key]
    os.environ.pop("ROS_HOSTNAME", None)
    yield ros_env["ROS_MASTER_URI"]
    stop_process(proc, group=True)
    log.close()


@pytest.fixture(scope="session")
def rospy_node(roscore: str) -> str:
    """rospy initialised in this process (once: rospy allows one init per process)."""
    import rospy
    rospy.init_node("dashboard_test", anonymous=True, disable_signals=True)
    return rospy.get_name()


@pytest.fixture(scope="session")
def qapp(xvfb: str):
    """The one QApplication of this process, on the Xvfb display."""
    from python_qt_binding.QtWidgets import QApplication
    app = QApplication.instance() or QApplication(["test_dashboard"])
    yield app


def start_fake_node(ros_env: Dict[str, str], ns: str = "") -> subprocess.Popen:
    """test/gui/fake_overlay_node.py as <ns>/overlay_manager (``/overlay_manager`` without ns),
    started and ready; stop it with :func:`stop_fake_node`."""
    args = ["__name:=overlay_manager"] + ([f"__ns:={ns}"] if ns else [])
    proc = subprocess.Popen(["/usr/bin/python3", str(Path(__file__).with_name("fake_overlay_node.py"))] + args,
                            env=ros_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until "ready" or the process exits (bounded by rospy)
    if line.strip() != "ready":
        stop_process(proc)
        rest = line + proc.stdout.read()
        pytest.fail(f"fake overlay node did not start: {rest[-2000:]}")
    return proc


@pytest.fixture(scope="module")
def fake_node(roscore: str, ros_env: Dict[str, str]) -> Iterator[subprocess.Popen]:
    """test/gui/fake_overlay_node.py as /overlay_manager; send commands with send_command()."""
    proc = start_fake_node(ros_env)
    yield proc
    stop_fake_node(proc)


def stop_fake_node(proc: subprocess.Popen) -> None:
    """Ask the fake node to quit (it unregisters its topics); by pid after 5 s."""
    if proc.stdin is not None and proc.poll() is None:
        proc.stdin.write("quit\n")
        proc.stdin.flush()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        stop_process(proc)


def send_command(proc: subprocess.Popen, command: str) -> str:
    """Send one stdin command to the fake node; returns its one-line answer."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()
