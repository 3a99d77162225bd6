"""robot.launch as a user starts it (roslaunch, which also starts roscore) with a config that sets
node keys, against the fake tailscaled; diagnostics.launch's diagnostic_aggregator next to it.

Checks: the config's settings take effect when no launch argument is given (manage_hosts writes
the block into the config's hosts_file; no ~param is set by the launch file); a launch argument,
when given, does override; the analyzers file the node's statuses under /Overlay/Machines and
/Overlay/Links with per-peer severity by role; a killed node turns stale in the aggregator and
is respawned by roslaunch (respawn, not required) while the rest of the launch keeps running.
"""
import os
import shutil
import signal
import subprocess
import sys
import time
import xmlrpc.client

import pytest
import yaml
from ros_graph import free_port, read_jsonl, ros_env, start, stop_all, wait

from overlay_manager.core.levels import Level
from overlay_manager.core.ros_names import overlay_node, ros_namespace
from overlay_manager.testing.tsfake import FakeTailscaled, write_robot_config

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(shutil.which("roslaunch") is None, reason="ROS not installed (scripts/setup)")
HAVE_AGGREGATOR = os.path.exists("/usr/lib/diagnostic_aggregator/aggregator_node") or bool(
    shutil.which("rospack") and subprocess.run(["rospack", "find", "diagnostic_aggregator"], capture_output=True,
                                               check=False).returncode == 0)
HOST = "alpha-robota"  # a DNS host name; not a legal ROS name: the node runs under its ROS namespace
NS = ros_namespace(HOST)  # alpha_robota, what overlay_env exports as OVERLAY_MANAGER_NS
NODE = overlay_node(HOST)
RESPAWN_DELAY_S = 15
MACHINE = f"/Overlay/Machines/{NS} overlay_manager: overlay"
LINK_B = f"/Overlay/Links/{NS} overlay_manager: peer robotb"
LINK_GHOST = f"/Overlay/Links/{NS} overlay_manager: peer ghost"
STALE = Level.STALE


class Launch:
    """roslaunch robot.launch (+ its roscore), diagnostics.launch and a recorder; stopped by pid."""

    def __init__(self, tmp, robot_args=(), monitor=True):
        self.tmp = tmp
        self.fake = FakeTailscaled()
        self.procs = []
        self.port = free_port()
        self.env = ros_env(self.port, tmp / "roshome", tmp / "roslog",
                           drop=("OVERLAY_MANAGER_HOST", "OVERLAY_MANAGER_NS", "OVERLAY_MANAGER_CONFIG"))
        # as after `eval "$(overlay_env)"` on host alpha-robota: robot.launch's ns comes from here
        self.env.update(OVERLAY_MANAGER_HOST=HOST, OVERLAY_MANAGER_NS=NS)
        self.hosts = tmp / "hosts"
        self.hosts.write_text("127.0.0.1 localhost\n")
        self.config = write_robot_config(
            tmp / "robot.yaml", self.fake.socket_path,
            {"manage_hosts": True, "hosts_file": str(self.hosts), "required_peers": ["ghost"], "ping_interval": 0,
             "netcheck_interval": 0, "preflight_interval": 0, "topic_links_interval": 0})
        self.record = tmp / "agg.jsonl"
        self.log = tmp / "robot.launch.log"
        self.robot = self._start(["roslaunch", "-p", str(self.port), "overlay_manager", "robot.launch",
                                  f"config:={self.config}", f"respawn_delay:={RESPAWN_DELAY_S}",
                                  *robot_args], self.log)
        wait(f"{NODE} registered with the master on port {self.port}", self.node_uri, 60, self.tail)
        if monitor:
            self._start(["roslaunch", "--wait", "overlay_manager", "diagnostics.launch", "gui:=false"],
                        tmp / "diagnostics.launch.log")
            self._start([sys.executable, os.path.join(HERE, "record_diag_agg.py"), str(self.record)],
                        tmp / "recorder.log")

    def _start(self, argv, log):
        return start(argv, self.env, log, self.procs)

    def master(self):
        return xmlrpc.client.ServerProxy(self.env["ROS_MASTER_URI"])

    def node_uri(self):
        try:
            code, _, uri = self.master().lookupNode("/test", NODE)
        except OSError:
            return ""
        return uri if code == 1 else ""

    def has_param(self, name):
        return self.master().hasParam("/test", name)[2]

    def tail(self):
        try:
            return self.log.read_text()[-2000:]
        except OSError:
            return ""

    def agg(self, since):
        """name -> last (level, message) seen by the recorder after `since`."""
        return {e["name"]: (e["level"], e["message"]) for e in read_jsonl(self.record) if e["t"] >= since}

    def wait_agg(self, since, what, pred, timeout):
        return wait(what, lambda: pred(self.agg(since)), timeout, lambda: f"{self.agg(since)}; {self.tail()}")

    def close(self):
        stop_all(self.procs, 15.0)
        self.fake.close()


def test_config_settings_apply_without_launch_args(tmp_path):
    launch = Launch(tmp_path, monitor=False)
    try:
        for key in ("manage_hosts", "hosts_file", "ping_interval", "iperf_server"):
            assert not launch.has_param(f"{NODE}/{key}"), f"robot.launch set ~{key} although no argument was given"
        assert launch.has_param(f"{NODE}/config")
        wait(f"the managed block in {launch.hosts} (config: node.manage_hosts true)",
             lambda: "100.64.0.2 robotb.fleet.internal robotb" in launch.hosts.read_text(), 30,
             lambda: launch.hosts.read_text() + launch.tail())
    finally:
        launch.close()


def test_launch_argument_overrides_when_given(tmp_path):
    launch = Launch(tmp_path, robot_args=("manage_hosts:=false",), monitor=False)
    try:
        assert launch.master().getParam("/test", f"{NODE}/manage_hosts")[2] is False
        # the node is up and publishing; give it a few poll periods to (not) write the block
        time.sleep(3)
        assert launch.hosts.read_text() == "127.0.0.1 localhost\n"
    finally:
        launch.close()


@pytest.mark.skipif(not HAVE_AGGREGATOR, reason="diagnostic_aggregator not installed (scripts/setup)")
def test_aggregator_files_statuses_and_shows_a_dead_node_stale_then_respawned(tmp_path):
    launch = Launch(tmp_path)
    try:
        t0 = time.time()
        launch.wait_agg(t0, "the overlay analyzers to file the node's statuses",
                        lambda a: MACHINE in a and LINK_B in a and LINK_GHOST in a, 60)
        a = launch.agg(t0)
        assert a[LINK_B][0] == 0 and a[LINK_GHOST][0] == 2, a  # direct peer OK, missing required peer ERROR
        assert not any(n.startswith("/Other") for n in a)
        code, _, uri = launch.master().lookupNode("/test", NODE)
        pid = xmlrpc.client.ServerProxy(uri).getPid("/test")[2]
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        launch.wait_agg(killed + 0.5, "the killed node's statuses to turn stale",
                        lambda a: a.get(LINK_B, (None,))[0] == STALE, RESPAWN_DELAY_S - 2)
        stale_s = time.time() - killed
        launch.wait_agg(killed + RESPAWN_DELAY_S, "the respawned node's statuses",
                        lambda a: a.get(LINK_B, (None,))[0] == 0, 45)
        print(f"killed node: stale in the aggregator after {stale_s:.1f} s; "
              f"back after {time.time() - killed:.1f} s (respawn_delay {RESPAWN_DELAY_S} s)")
        assert launch.robot.poll() is None, "the robot's launch must keep running"
    finally:
        launch.close()


def _has_bondpy() -> bool:
    return subprocess.run(["/usr/bin/python3", "-c", "import bondpy"], capture_output=True,
                          check=False).returncode == 0


@pytest.mark.skipif(not (HAVE_AGGREGATOR and _has_bondpy()),
                    reason="diagnostic_aggregator or python3-bondpy not installed (scripts/setup)")
def test_monitor_launch_adds_analyzers_to_a_running_aggregator(tmp_path):
    """aggregator:=false: the robot already runs an aggregator (here one without analyzers);
    diagnostics.launch adds ours to it (add_analyzers), and overlay statuses leave "Other"."""
    port = free_port()
    env = ros_env(port, tmp_path, tmp_path / "log")
    record = tmp_path / "agg.jsonl"
    procs = []

    def run(argv, name):
        start(argv, env, tmp_path / f"{name}.log", procs)

    try:
        run(["roscore", "-p", str(port)], "roscore")
        master = xmlrpc.client.ServerProxy(env["ROS_MASTER_URI"])

        def master_up():
            try:
                return master.getSystemState("/test")[0] == 1
            except OSError:
                return False

        wait(f"roscore on port {port}", master_up, 30, lambda: (tmp_path / "roscore.log").read_text()[-1000:])
        run(["rosrun", "diagnostic_aggregator", "aggregator_node", "__name:=diagnostic_aggregator"], "aggregator")
        run([sys.executable, os.path.join(HERE, "record_diag_agg.py"), str(record)], "recorder")
        run(["rostopic", "pub", "-r", "2", "/diagnostics", "diagnostic_msgs/DiagnosticArray",
             f"{{status: [{{level: 0, name: '{NS}/overlay_manager: peer robotb', message: direct}}, "
             f"{{level: 0, name: '{NS}/overlay_manager: overlay', message: enrolled}}]}}"], "publisher")
        run(["roslaunch", "--wait", "overlay_manager", "diagnostics.launch", "aggregator:=false", "gui:=false"],
            "diagnostics.launch")

        def filed():
            return {LINK_B, MACHINE} <= {e["name"] for e in read_jsonl(record)}

        wait("add_analyzers to file the statuses under /Overlay", filed, 60,
             lambda: (tmp_path / "diagnostics.launch.log").read_text()[-1500:])
    finally:
        stop_all(procs, 15.0)


def test_camera_params_file_reaches_each_stream(tmp_path):
    """robot.launch camera_params:=FILE loads the republisher's parameters (the shipped example):
    shared keys under the node, link_aware: and link_aware_h264: sections under each stream."""
    example = os.path.join(HERE, "..", "..", "config", "camera.example.yaml")
    env = dict(ros_env(free_port(), tmp_path), OVERLAY_MANAGER_NS=NS)
    out = subprocess.run(["roslaunch", "--dump-params", "overlay_manager", "robot.launch",
                          "camera_topics:=/camera/image_raw", f"camera_params:={os.path.abspath(example)}"],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    params = yaml.safe_load(out.stdout)
    node = f"/{NS}/link_aware_camera"
    assert params[f"{node}/images"] == "/camera/image_raw"
    assert params[f"{node}/max_rate"] == 30
    assert params[f"{node}/link_aware_h264/crf"] == 23
    assert params[f"{node}/link_aware_h264/video_budget_kbps_derp"] == 2400
    assert params[f"{node}/link_aware/budget_kbps_derp"] == 8000


def test_without_a_namespace_nothing_starts(tmp_path):
    """robot.launch started by hand without overlay_env (no OVERLAY_MANAGER_NS) and without ns:=
    stops at once with the fix on one line, before roscore or any node starts: no machine runs
    under a namespace another machine would also take."""
    fake = FakeTailscaled()
    try:
        port = free_port()
        env = ros_env(port, tmp_path / "roshome", tmp_path / "roslog",
                      drop=("OVERLAY_MANAGER_HOST", "OVERLAY_MANAGER_NS", "OVERLAY_MANAGER_CONFIG"))
        config = write_robot_config(tmp_path / "robot.yaml", fake.socket_path)
        t0 = time.monotonic()
        out = subprocess.run(["roslaunch", "-p", str(port), "overlay_manager", "robot.launch", f"config:={config}"],
                             capture_output=True, text=True, env=env, timeout=60, check=False)
        text = out.stdout + out.stderr
        assert out.returncode != 0, text[-2000:]
        (line,) = (x for x in text.splitlines() if "OVERLAY_MANAGER_NS" in x)
        assert 'ROS_ENV="$(rosrun overlay_manager overlay_env)" && eval "$ROS_ENV"' in line and "ns:=" in line
        assert "started roslaunch server" not in text and "auto-starting new master" not in text, text[-2000:]
        assert fake.requests == [], "the overlay node started"
        print(f"refused in {time.monotonic() - t0:.1f} s: {line.strip()}")
    finally:
        fake.close()
