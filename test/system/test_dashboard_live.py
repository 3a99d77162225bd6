"""The standalone dashboard shows a live lab correctly.

config/lab/two_buildings.yaml in a lab of this module's own; the real node via robot.launch on
robot1 (roscore) and laptop; ``rosrun overlay_manager dashboard --node /laptop/overlay_manager``
runs inside laptop's namespace with laptop's ROS env from overlay_env, on an Xvfb started here
(the client reaches it through the filesystem socket /tmp/.X11-unix/X<n>: abstract sockets are per
network namespace). The window writes what it shows to a JSON file (OVERLAY_DASHBOARD_DUMP); the
test clicks it with XTEST like an operator. A lab camera on robot1 streams to a subscriber on
laptop. Checks: robot1's row is direct (green), the node's status panel is filled (the NAT in plain
words once the node's netcheck is in), the Topics view shows the camera topic robot1 -> laptop on
the direct path (green) with a rate, Ping answers with a latency, blocking UDP at building b1 turns
the row derp (orange), logs the change and moves the camera topic to derp, Ping then goes through
DERP. Saves artifacts/dashboard_live.png.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

import pytest

from overlay_manager.core.ros_names import overlay_node
from overlay_manager.lab.campus import robots
from overlay_manager.view import text as fmt

REPO = Path(__file__).resolve().parents[2]
TWO_BUILDINGS = REPO / "config" / "lab" / "two_buildings.yaml"
ARTIFACT = REPO / "artifacts" / "dashboard_live.png"
ROBOT, LAPTOP = "alpha-robot1", "alpha-laptop"
N_LAPTOP = overlay_node(LAPTOP)
CAMERA = "/camera/image_raw"
CAMERA_HZ = 2.0  # 640x480 rgb8: about 15 Mbit/s, little enough for the DERP part of the test


def _topic(state: Optional[Dict[str, Any]], topic: str) -> Dict[str, Any]:
    return next((r for r in (state or {}).get("topics", []) if r["topic"] == topic), {})


def _row(state: Optional[Dict[str, Any]], name: str) -> Dict[str, Any]:
    return next((r for r in (state or {}).get("rows", []) if r["name"] == name), {})


def _short(state: Optional[Dict[str, Any]]) -> str:
    if not state:
        return "(no dump yet)"
    rows = [{k: r[k] for k in ("name", "online", "path", "where", "latency", "path_colour")} for r in state["rows"]]
    return json.dumps({"node": state["node"], "headline": state["headline"], "rows": rows,
                       "selected": state["selected_peer"], "last_result": state["last_result"],
                       "path_log": state["path_log"][:3], "topics": state.get("topics")})


class Dashboard:
    """The standalone dashboard process in laptop's namespace, read through its JSON dump."""

    def __init__(self, lab: Any, display: str, workdir: Path) -> None:
        self.lab, self.display = lab, display
        self.dump = workdir / "dashboard_state.json"
        self.log = Path(lab.host_dir(LAPTOP)) / "dashboard.log"
        runtime = workdir / "xdg_runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env = dict(robots.ros_env(lab, LAPTOP))
        env.update({"DISPLAY": display, "XDG_RUNTIME_DIR": str(runtime), "QT_X11_NO_MITSHM": "1",
                    "XDG_CONFIG_HOME": str(workdir / "config"), "OVERLAY_DASHBOARD_DUMP": str(self.dump)})
        line = (f"{robots.overlay_env_line(lab, LAPTOP)} && exec rosrun overlay_manager dashboard "
                f"--node {N_LAPTOP} --no-settings")
        self.proc = lab.popen(LAPTOP, ["bash", "-c", line], env=env, log=self.log)
        self.state: Optional[Dict[str, Any]] = None

    def read(self) -> Optional[Dict[str, Any]]:
        try:
            self.state = json.loads(self.dump.read_text())
        except (OSError, ValueError):
            pass
        return self.state

    def wait(self, what: str, pred: Callable[[Dict[str, Any]], bool], timeout: float) -> Dict[str, Any]:
        """Poll the dump until pred holds; fail naming what was awaited and what was last shown."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.read()
            if state is not None and pred(state):
                return state
            if self.proc.poll() is not None:
                pytest.fail(f"dashboard exited ({self.proc.returncode}) while waiting for {what}; "
                            f"log: {self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:g} s waiting for the dashboard to show {what}; "
                            f"last shown: {_short(state)}; log: {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-10:])
        except OSError:
            return "(no log)"

    def click(self, rect: list) -> None:
        """A left click in the middle of a screen rectangle [x, y, w, h] (XTEST)."""
        x, y, w, h = rect
        xtest_click(self.display, x + w // 2, y + h // 2)

    def stop(self) -> None:
        robots.stop(self.lab, self.proc)  # SIGINT to its group (the window closes), then SIGKILL


def xtest_click(display: str, x: int, y: int) -> None:
    """Move the pointer to (x, y) and click button 1, through libXtst (what xdotool does)."""
    x11, xtst = ctypes.CDLL("libX11.so.6"), ctypes.CDLL("libXtst.so.6")
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x11.XFlush.argtypes = x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    xtst.XTestFakeMotionEvent.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_ulong]
    xtst.XTestFakeButtonEvent.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_ulong]
    dpy = x11.XOpenDisplay(display.encode())
    assert dpy, f"cannot open X display {display}"
    try:
        xtst.XTestFakeMotionEvent(dpy, -1, x, y, 0)
        x11.XFlush(dpy)
        time.sleep(0.1)
        xtst.XTestFakeButtonEvent(dpy, 1, 1, 0)
        xtst.XTestFakeButtonEvent(dpy, 1, 0, 30)
        x11.XFlush(dpy)
    finally:
        x11.XCloseDisplay(dpy)


GRAB = textwrap.dedent("""
    import sys
    from python_qt_binding.QtWidgets import QApplication
    app = QApplication(sys.argv[:1])
    x, y, w, h = map(int, sys.argv[2:6])
    sys.exit(0 if app.primaryScreen().grabWindow(0, x, y, w, h).save(sys.argv[1]) else 1)
""")


def screenshot(display: str, rect: list, path: Path) -> None:
    """Save the screen area rect of the X display as PNG (as the X server shows it)."""
    path.parent.mkdir(exist_ok=True)
    env = dict(os.environ, DISPLAY=display, QT_X11_NO_MITSHM="1")
    res = subprocess.run(["/usr/bin/python3", "-c", GRAB, str(path), *map(str, rect)], env=env,
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 0 and path.is_file(), f"screen grab failed: {res.stderr[-1500:]}"


@pytest.fixture(scope="module")
def xvfb_display(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Xvfb in the host's namespace, no TCP; yields "unix:<n>" (the filesystem socket, which lab
    namespaces reach; libxcb falls back to it when the abstract socket is not in their netns)."""
    binary = shutil.which("Xvfb")
    if binary is None:
        pytest.skip("Xvfb not installed (Debian package xvfb)")
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([binary, "-displayfd", str(write_fd), "-screen", "0", "1280x900x24", "-nolisten", "tcp"],
                            pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as f:
            number = f.readline().strip()  # written once Xvfb listens (it exits on failure: EOF)
        assert number, f"Xvfb did not report a display: {proc.stderr.read().decode(errors='replace')[-500:]}"
        socket_path = Path(f"/tmp/.X11-unix/X{number}")
        assert socket_path.exists(), f"Xvfb :{number} has no filesystem socket {socket_path}"
        yield f"unix:{number}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.fixture(scope="module")
def live_lab(lab_factory: Callable[..., Any]) -> Iterator[Any]:
    """A two_buildings lab of this module with robot.launch on robot1 (master) and laptop, ICMP
    traffic laptop -> robot1 over the overlay (so tailscaled notices a broken direct path), and a
    lab camera on robot1 that a recorder on laptop subscribes to (a topic link robot1 -> laptop)."""
    lab = lab_factory(TWO_BUILDINGS)
    procs = []
    recorder = None
    try:
        robots.start_master_then(lab, ROBOT, [LAPTOP], procs, timeout=90)
        procs.append(lab.popen(LAPTOP, ["ping", "-n", "-i", "0.2", lab.overlay_ip(ROBOT)],
                               log=Path(lab.host_dir(LAPTOP)) / "overlay_ping.log"))
        procs.append(robots.start_camera(lab, ROBOT, CAMERA, CAMERA_HZ))
        recorder = robots.Recorder(lab, LAPTOP, image=CAMERA, name="camera_sink")
        recorder.wait("a first camera frame on laptop", lambda ev: ev.get("ev") == "frame", timeout=60)
        yield lab
    except Exception:
        robots.print_launch_logs(lab, (ROBOT, LAPTOP))
        raise
    finally:
        if recorder is not None:
            recorder.stop()
        for p in reversed(procs):
            robots.stop(lab, p)
        lab.down()  # this module's lab only; lab_factory's own down() at session end is a no-op then


def test_standalone_dashboard_shows_live_lab(live_lab: Any, xvfb_display: str, tmp_path: Path) -> None:
    lab = live_lab
    started = time.monotonic()
    dash = Dashboard(lab, xvfb_display, tmp_path)
    try:
        # 1. the table fills from the real node: robot1 online, direct over its NAT's public endpoint
        direct = dash.wait("robot1 online and direct (green) in the table",
                           lambda s: _row(s, ROBOT).get("path") == "direct", timeout=45)
        row = _row(direct, ROBOT)
        assert direct["node"] == N_LAPTOP
        assert row["online"] == "yes" and row["address"] == lab.overlay_ip(ROBOT), row
        assert row["path_colour"] == fmt.path_colour("direct") and row["row_tint"] == fmt.path_tint("direct"), row
        assert row["where"].startswith(lab.address("b1") + ":"), row  # b1's NAT, as seen from b2
        assert [r["name"] for r in direct["rows"]] == [ROBOT], direct["rows"]
        status = dash.wait("laptop's status panel", lambda s: f"{LAPTOP}.fleet.internal" in s["fields"]["self"]
                           and s["fields"]["nat"] not in ("", "-"), timeout=30)["fields"]
        assert "enrolled" in status["state"] and "reachable" in status["control"], status
        assert f"ROS_MASTER_URI=http://{ROBOT}.fleet.internal:11311" in status["ros"], status
        assert f"ROS_HOSTNAME={LAPTOP}.fleet.internal" in status["ros"], status
        assert direct["headline"].startswith("1 peer"), direct["headline"]

        # 1b. the Topics view: the camera crosses robot1 -> laptop on the direct path, with a rate
        cam = dash.wait(f"{CAMERA} robot1 -> laptop, direct, with a rate in the Topics view",
                        lambda s: _topic(s, CAMERA).get("path") == "direct"
                        and _topic(s, CAMERA).get("rate", "-") != "-", timeout=30)
        row = _topic(cam, CAMERA)
        assert (row["from"], row["to"]) == (ROBOT, LAPTOP), row
        assert row["path_colour"] == fmt.path_colour("direct"), row
        assert row["where"].startswith(lab.address("b1") + ":"), row
        assert row["rate"].endswith("bit/s"), row

        # 2. select robot1 and Ping: a latency over the direct path
        dash.click(direct["screen"]["rows"][ROBOT])
        selected = dash.wait("robot1 selected after a click on its row",
                             lambda s: s["selected_peer"] == ROBOT, timeout=10)
        dash.click(selected["screen"]["buttons"]["ping"])
        pinged = dash.wait("the ping result for robot1", lambda s: f"ping {ROBOT}:" in s["last_result"]
                           and "running" not in s["last_result"], timeout=20)
        assert "ms mean" in pinged["last_result"] and "path direct" in pinged["last_result"], pinged["last_result"]

        # 3. UDP blocked at building b1: the direct path breaks, the row turns derp (orange), the log says so
        lab.block_udp("b1")
        blocked_at = time.monotonic()
        derp = dash.wait("robot1's row to turn derp after UDP was blocked at b1",
                         lambda s: _row(s, ROBOT).get("path") == "derp", timeout=30)
        took = time.monotonic() - blocked_at
        row = _row(derp, ROBOT)
        assert row["online"] == "yes" and row["where"].startswith("DERP"), row
        assert row["path_colour"] == fmt.path_colour("derp") and row["row_tint"] == fmt.path_tint("derp"), row
        logged = dash.wait("'direct -> derp' in the path-change log",
                           lambda s: any(f"{ROBOT}  direct -> derp" in line for line in s["path_log"]), timeout=10)
        cam_derp = dash.wait(f"{CAMERA} on derp in the Topics view (map every 2 s)",
                             lambda s: _topic(s, CAMERA).get("path") == "derp", timeout=15)
        assert _topic(cam_derp, CAMERA)["path_colour"] == fmt.path_colour("derp"), _topic(cam_derp, CAMERA)
        logged = cam_derp

        # 4. Ping again: now relayed through DERP, still answered
        dash.click(logged["screen"]["buttons"]["ping"])
        relayed = dash.wait("the ping result through DERP",
                            lambda s: f"ping {ROBOT}:" in s["last_result"] and "derp" in s["last_result"],
                            timeout=25)
        assert "ms mean" in relayed["last_result"], relayed["last_result"]

        # 5. the NAT line shows what the node's netcheck (run at its start) found: laptop's building
        # b2 is an endpoint-independent NAT with UDP (b1's UDP block does not change it). When the
        # node's check failed, the line must say so (the node's own words), not "not checked yet".
        nat = dash.wait("laptop's NAT line from the node's netcheck",
                        lambda s: "not checked yet" not in s["fields"]["nat"], timeout=30)
        nat_seen = time.monotonic() - started
        nat_text = nat["fields"]["nat"]
        # b2's NAT lets UDP through; whether its mapping varies by destination needs two STUN
        # servers, and the lab has one (headscale's embedded DERP), so tailscale says "unknown"
        assert nat_text.startswith(("easy NAT (endpoint-independent mapping)",
                                    "UDP works; NAT mapping behaviour unknown")), nat["nat_detail"]

        time.sleep(1.2)  # one more table refresh and plot tick before the picture
        final = dash.wait("a dump after the DERP ping", lambda s: True, timeout=5)
        screenshot(xvfb_display.replace("unix", ""), final["screen"]["window"], ARTIFACT)
        assert ARTIFACT.stat().st_size > 20_000, ARTIFACT.stat().st_size
        print(f"dashboard live: direct -> derp shown {took:.1f} s after block_udp(b1); "
              f"{pinged['last_result']!r}; {relayed['last_result']!r}; NAT {nat['fields']['nat']!r} "
              f"shown {nat_seen:.0f} s after the dashboard started; screenshot {ARTIFACT}; "
              f"{time.monotonic() - started:.0f} s with the dashboard")
    finally:
        dash.stop()
        lab.unblock_udp("b1")
    assert dash.proc.returncode == 0, f"dashboard exit {dash.proc.returncode}: {dash.log_tail()}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v", "-s"]))
