"""Boot, and tailscaled restarts and upgrades, with the shipped units on two lab machines behind
NATs, without systemd (systemd is not PID 1 here): each unit's own command line runs in its
host's namespace the way systemd would run it.

::

    robot1 (b1, ROS master)                         laptop (b2, master = robot1)
      overlay-env      root    once                   overlay-env      root    once
      overlay-upkeep   root    loop                   overlay-upkeep   root    loop
      overlay-manager  nobody  roslaunch robot.launch overlay-manager  nobody  roslaunch --wait
                               + roscore + bringup:                            robot.launch
                               /boot_local 50 Hz pub -> sub (loopback)

Command lines: ExecStart of config/systemd/<unit> ($$ -> $), environment = the unit's
Environment= plus, for the bringup, the EnvironmentFile overlay-env wrote (read as systemd reads
it) and ROS_IP dropped (UnsetEnvironment=). The bringup's User= is emulated with setpriv as uid
65534 (nobody), keeping only CAP_DAC_READ_SEARCH so it can read the build under root's home; it
cannot write /etc/hosts and tailscaled gives it read-only LocalAPI access, as for a real `ros`
user. Paths systemd would use (/run, /var/lib, /var/log) are moved into each host's lab directory.

Checks:
- boot: both enrol, the EnvironmentFiles hold the overlay names; the laptop's bringup (master on
  robot1) is started first and waits (roslaunch --wait) instead of failing, then comes up when
  robot1's master does; the nodes see each other; the hosts blocks are kept by the root upkeep.
- tailscaled restarts: what systemd would stop with tailscaled is read from the units' dependency
  graph (overlay_manager.lab.campus.units.stopped_with; nothing for the shipped units); tailscaled on
  robot1 gets SIGTERM (systemctl's stop) and is started again with the drop-in's environment, twice
  at once (`systemctl restart`) and once after 5 s (an upgrade: dpkg stops it, unpacks, starts it).
  The bringup's command line keeps running throughout. Measured and printed per run: the largest
  gap of robot1's local 50 Hz topic (must stay < LOCAL_GAP_LIMIT_S; the old units' propagated
  restart gave about 4 s) and the node's recovery (from tailscaled started to its overlay
  diagnostic back at the level it had before). During the upgrade window overlay-env's command
  (a boot with tailscaled down) still writes the names from the config and exits 0.
- the baseline: the same restart with a drop-in that makes the bringup Require tailscaled (the
  graph now says systemd restarts the bringup with it, and the emulation does): the local topic
  stops for more than a second, so the check above would notice a regression.
- overlay-env's command with a broken config fails and writes no file.
Everything started here is stopped by pid.
"""
from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import yaml

from overlay_manager.core.ros_names import overlay_node, ros_namespace
from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus import units as unitfiles
from overlay_manager.system import waiting

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "config" / "systemd"
TWO_BUILDINGS = REPO / "config" / "lab" / "two_buildings.yaml"
BRINGUP_LAUNCH = Path(__file__).resolve().parent / "boot_bringup.launch"
ROBOT, LAPTOP = "alpha-robot1", "alpha-laptop"
RUN_ENV = "/run/overlay_manager/ros.env"
ENV_UNIT, UPKEEP_UNIT, BRINGUP_UNIT, TAILSCALED = ("overlay-env.service", "overlay-upkeep.service",
                                                   "overlay-manager.service", "tailscaled.service")
NOBODY = 65534
AS_USER = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
           "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", "--"]
"""User= emulated: uid/gid nobody; CAP_DAC_READ_SEARCH only, to read the build under /root."""
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOCAL_GAP_LIMIT_S = 0.5
"""Largest gap allowed on robot1's local 50 Hz topic across a tailscaled restart: the 20 ms period
plus scheduling noise on 2 busy cores (test_split_horizon saw up to 0.13 s); the old units'
propagated restart stopped it for about 4 s."""
UPGRADE_DOWN_S = 5.0
RUNS = (("restart", 0.0), ("restart", 0.0), ("upgrade", UPGRADE_DOWN_S))
RECOVERY_TIMEOUT_S = 60.0


def _units(extra: Optional[Dict[str, str]] = None, tmp: Optional[Path] = None) -> Dict[str, unitfiles.Unit]:
    """The shipped units (plus a stand-in tailscaled.service and extra drop-ins written to tmp)."""
    dirs = [UNITS]
    if extra:
        assert tmp is not None
        for rel, text in extra.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        dirs.insert(0, tmp)
    units = unitfiles.load_units(dirs)
    units.setdefault(TAILSCALED, unitfiles.Unit(TAILSCALED, unitfiles.parse_unit_text(
        "[Unit]\nDescription=stand-in for the tailscale package's unit\n")))
    return units


def _base_env(lab, host: str, unit: unitfiles.Unit) -> Dict[str, str]:
    """What systemd gives a unit's process here: its PATH (after the lab host's bin, where its
    `tailscale` is), the ROS package paths of this build (ROS_SETUP="" stands for sourcing them)
    and the unit's Environment= lines."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("ROS_", "CMAKE_PREFIX_PATH", "LD_LIBRARY_PATH", "PKG_CONFIG_PATH", "PYTHONPATH"))
           and k not in ("ROS_HOSTNAME", "ROS_MASTER_URI", "ROS_IP", "ROS_HOME", "ROS_LOG_DIR")}
    env.update(unitfiles.unit_environment(unit), PATH=f"{Path(lab.host_dir(host)) / 'bin'}:{SYSTEMD_PATH}",
               ROS_SETUP="", LANG="C.UTF-8")
    return env


def _host_paths(lab, host: str) -> Tuple[Path, Path]:
    """(EnvironmentFile, bringup's ROS_HOME) of host; ROS_HOME owned by nobody (StateDirectory=)."""
    d = Path(lab.host_dir(host))
    home = d / "ros-bringup"
    (home / "log").mkdir(parents=True, exist_ok=True)
    for p in (home, home / "log"):
        os.chown(p, NOBODY, NOBODY)
    return d / "run" / "ros.env", home


def run_overlay_env_unit(lab, units, host: str, config: Path, env_file: Path, retry: str = "60"):
    script = unitfiles.exec_start(units[ENV_UNIT]).replace(RUN_ENV, str(env_file))
    env = dict(_base_env(lab, host, units[ENV_UNIT]), ROS_HOME=str(Path(lab.host_dir(host)) / "ros"),
               OVERLAY_MANAGER_CONFIG=str(config), OVERLAY_ENV_RETRY=retry)
    return lab.exec(host, ["bash", "-c", script], env=env, timeout=180, check=False)


def start_upkeep_unit(lab, units, host: str):
    env = dict(_base_env(lab, host, units[UPKEEP_UNIT]), ROS_HOME=str(Path(lab.host_dir(host)) / "ros"),
               OVERLAY_MANAGER_CONFIG=str(lab.robot_yaml(host)), OVERLAY_UPKEEP_INTERVAL="5")
    return lab.popen(host, ["bash", "-c", unitfiles.exec_start(units[UPKEEP_UNIT])], env=env,
                     log=Path(lab.host_dir(host)) / "overlay-upkeep.log")


def start_bringup_unit(lab, units, host: str, launch_args: str = "", extra_env: Optional[Dict[str, str]] = None):
    env_file, home = _host_paths(lab, host)
    env = _base_env(lab, host, units[BRINGUP_UNIT])
    env.update(unitfiles.read_environment_file(env_file))
    env.update(ROS_HOME=str(home), ROS_LOG_DIR=str(home / "log"), HOME=str(home),
               OVERLAY_MANAGER_CONFIG=str(lab.robot_yaml(host)), LAUNCH_ARGS=launch_args, **(extra_env or {}))
    env.pop("ROS_IP", None)  # UnsetEnvironment=ROS_IP
    argv = AS_USER + ["bash", "-c", unitfiles.exec_start(units[BRINGUP_UNIT])]
    return lab.popen(host, argv, env=env, log=Path(lab.host_dir(host)) / "robot.launch.log")


def _arrivals(path: Path) -> List[Tuple[float, int]]:
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((float(parts[0]), int(parts[1])))
    return out


def _largest_gap(times: List[float], start: float, end: float) -> float:
    """Largest interval between consecutive arrivals in [start, end], counting the edges."""
    inside = [t for t in times if start <= t <= end]
    points = [start] + inside + [end]
    return max(b - a for a, b in zip(points, points[1:]))


def _wait(what: str, cond, timeout: float, detail=lambda: "") -> None:
    waiting.wait_for(what, cond, timeout, interval=0.1, detail=detail, error=AssertionError)


class Booted:
    """The module's lab: units, EnvironmentFiles, the gap file and the processes per unit."""

    def __init__(self, lab, units) -> None:
        self.lab, self.units = lab, units
        self.files = {h: _host_paths(lab, h)[0] for h in (ROBOT, LAPTOP)}
        self.gap_out = Path(lab.host_dir(ROBOT)) / "boot_local.txt"
        self.procs: Dict[Tuple[str, str], object] = {}
        self.laptop_waited = False   # the laptop's bringup was still running while it had no master

    def start_robot_bringup(self):
        self.gap_out.write_text("")
        os.chown(self.gap_out, NOBODY, NOBODY)
        self.procs[(ROBOT, BRINGUP_UNIT)] = start_bringup_unit(
            self.lab, self.units, ROBOT, f"bringup:={BRINGUP_LAUNCH}",
            {"OVERLAY_TEST_GAP_OUT": str(self.gap_out)})

    def tailscaled_pid(self, host: str) -> int:
        return int(self.lab.state()["processes"][f"tailscaled:{host}"]["pid"])


@pytest.fixture(scope="module")
def booted(lab_factory):
    lab = lab_factory(TWO_BUILDINGS)
    units = _units()
    b = Booted(lab, units)
    try:
        with robots.processes(lab, (ROBOT, LAPTOP)) as procs:
            for host in (ROBOT, LAPTOP):
                b.files[host].parent.mkdir(parents=True, exist_ok=True)
                res = run_overlay_env_unit(lab, units, host, Path(lab.robot_yaml(host)), b.files[host])
                assert res.returncode == 0, f"overlay-env on {host}: {res.stderr}"
                procs.append(start_upkeep_unit(lab, units, host))
                b.procs[(host, UPKEEP_UNIT)] = procs[-1]
            # the laptop's master is robot1, not up yet: roslaunch --wait waits instead of failing
            b.procs[(LAPTOP, BRINGUP_UNIT)] = start_bringup_unit(lab, units, LAPTOP)
            procs.append(b.procs[(LAPTOP, BRINGUP_UNIT)])
            log = Path(lab.host_dir(LAPTOP)) / "robot.launch.log"
            _wait("the laptop's roslaunch to say it waits for the master",
                  lambda: "will wait for it to start" in log.read_text(errors="replace"), 60,
                  lambda: log.read_text(errors="replace")[-1000:])
            time.sleep(3.0)
            b.laptop_waited = b.procs[(LAPTOP, BRINGUP_UNIT)].poll() is None
            b.start_robot_bringup()
            procs.append(b.procs[(ROBOT, BRINGUP_UNIT)])
            robots.peers(lab, ROBOT, timeout=90, node=overlay_node(ROBOT))
            robots.peers(lab, LAPTOP, min_peers=1, timeout=120, node=overlay_node(LAPTOP))
            yield b
    finally:
        lab.down()  # now, not at session end


def test_environment_file_has_overlay_names_and_address(booted):
    lab = booted.lab
    for host in (ROBOT, LAPTOP):
        env = unitfiles.read_environment_file(booted.files[host])
        assert env == {"ROS_HOSTNAME": f"{host}.fleet.internal",
                       "ROS_MASTER_URI": f"http://{ROBOT}.fleet.internal:11311",
                       "OVERLAY_MANAGER_HOST": host, "OVERLAY_MANAGER_NS": ros_namespace(host),
                       "OVERLAY_MANAGER_ADDRESS": lab.overlay_ip(host),
                       "OVERLAY_MANAGER_MASTER_LOCAL": "true" if host == ROBOT else "false"}, \
            booted.files[host].read_text()
        text = booted.files[host].read_text()
        assert "export" not in text and "unset" not in text


def test_remote_master_bringup_waited_then_started(booted):
    assert booted.laptop_waited, "the laptop's bringup exited while robot1's master was not up"
    log = (Path(booted.lab.host_dir(LAPTOP)) / "robot.launch.log").read_text(errors="replace")
    assert "master has started, initiating launch" in log


def test_nodes_started_by_the_unit_see_each_other_unprivileged(booted):
    lab = booted.lab
    msg = robots.peers(lab, LAPTOP, min_peers=1, node=overlay_node(LAPTOP))
    assert msg["self_peer"]["dns_name"] == f"{LAPTOP}.fleet.internal"
    assert [p["name"] for p in msg["peers"]] == [ROBOT]
    env = robots.call(lab, LAPTOP, f"{overlay_node(LAPTOP)}/get_ros_env", "overlay_manager/GetRosEnv")
    assert env["ok"] and env["ros_hostname"] == f"{LAPTOP}.fleet.internal"
    assert env["ros_master_uri"] == f"http://{ROBOT}.fleet.internal:11311"
    # every process of the bringup runs as nobody; the root upkeep keeps the hosts blocks
    for host in (ROBOT, LAPTOP):
        root = booted.procs[(host, BRINGUP_UNIT)].pid
        uids = {_uid(p) for p in _descendants(root)}
        assert uids == {NOBODY}, (host, uids)
    res = lab.exec(LAPTOP, ["getent", "ahostsv4", f"{ROBOT}.fleet.internal"], check=False, quiet=True)
    assert lab.overlay_ip(ROBOT) in res.stdout


def _descendants(pid: int) -> List[int]:
    """pid and every process below it (from /proc)."""
    children: Dict[int, List[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def _restart_like_systemd(b: Booted, units, down_s: float, during_down=None) -> Dict[str, float]:
    """Stop tailscaled on robot1 the way systemctl does (SIGTERM, by pid) together with every unit
    the graph says goes with it, wait down_s (call during_down meanwhile), start them again
    (tailscaled with the drop-in's environment). Returns monotonic times: stop, start, answering."""
    lab = b.lab
    with_it = unitfiles.stopped_with(units, TAILSCALED)
    unknown = with_it - {ENV_UNIT, UPKEEP_UNIT, BRINGUP_UNIT}
    assert not unknown, f"the graph stops units this emulation does not run: {unknown}"
    drop_in = unitfiles.unit_environment(units[TAILSCALED])
    ts_env = {k: v for k, v in drop_in.items() if k != "SSL_CERT_FILE"}  # the lab's CA stands in for
    ts_env["SSL_CERT_FILE"] = str(lab.layout.ca_cert_path(ROBOT))       # /etc/overlay_manager/ca.crt
    pid = b.tailscaled_pid(ROBOT)
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"tailscaled")
    t = {"stop": time.monotonic()}
    if BRINGUP_UNIT in with_it:   # systemd stops dependents first (KillSignal=SIGINT)
        robots.stop(lab, b.procs[(ROBOT, BRINGUP_UNIT)])
    if UPKEEP_UNIT in with_it:
        robots.stop(lab, b.procs[(ROBOT, UPKEEP_UNIT)])
    lab.stop_tailscaled(ROBOT)     # SIGTERM by pid, as systemctl stop
    if during_down is not None:
        during_down()
    time.sleep(max(0.0, t["stop"] + down_s - time.monotonic()))
    t["start"] = time.monotonic()
    lab.start_tailscaled(ROBOT, ts_env)
    lab.wait_tailscaled(ROBOT)
    t["answering"] = time.monotonic()
    if ENV_UNIT in with_it:
        res = run_overlay_env_unit(lab, units, ROBOT, Path(lab.robot_yaml(ROBOT)), b.files[ROBOT])
        assert res.returncode == 0, res.stderr
    if UPKEEP_UNIT in with_it:
        b.procs[(ROBOT, UPKEEP_UNIT)] = start_upkeep_unit(lab, units, ROBOT)
    if BRINGUP_UNIT in with_it:
        b.start_robot_bringup()
    return t


def _recovery(rec, baseline_level: int, t_stop: float, t_start: float) -> Tuple[Optional[float], bool]:
    """(seconds from tailscaled started to the node's overlay diagnostic back at baseline_level,
    whether the node reported a worse level after the stop); None when it never left it."""
    diags = [e for e in rec.events if e["ev"] == "diag" and e["t"] >= t_stop]
    degraded = [e for e in diags if e["level"] != baseline_level]
    if not degraded:
        return None, False
    back = [e for e in diags if e["t"] > degraded[0]["t"] and e["level"] == baseline_level]
    return (back[0]["t"] - t_start if back else float("inf")), True


def _one_restart(b: Booted, units, kind: str, down_s: float, rec, during_down=None) -> Dict[str, object]:
    node = overlay_node(ROBOT)
    rec.read()
    level = [e for e in rec.events if e["ev"] == "diag"][-1]["level"]
    launch_pid = b.procs[(ROBOT, BRINGUP_UNIT)].pid
    t = _restart_like_systemd(b, units, down_s, during_down)

    def recovered() -> bool:
        rec.read()
        back, degraded = _recovery(rec, level, t["stop"], t["start"])
        if not degraded:  # never noticed (a very quick restart): settled once 10 s have passed
            return time.monotonic() > t["answering"] + 10.0
        return back != float("inf")
    _wait(f"{node}'s overlay diagnostic back at level {level} after tailscaled's {kind}",
          recovered, RECOVERY_TIMEOUT_S,
          lambda: str([e for e in rec.events if e["ev"] == "diag"][-4:])[:1500])
    back, _ = _recovery(rec, level, t["stop"], t["start"])
    time.sleep(2.0)
    t_end = time.monotonic()
    arrivals = _arrivals(b.gap_out)
    window = (t["stop"] - 1.0, t_end)
    seqs = [s for tt, s in arrivals if window[0] <= tt <= window[1]]
    lost = (max(seqs) - min(seqs) + 1 - len(set(seqs))) if seqs else -1
    worst = [e for e in rec.events if e["ev"] == "diag" and t["stop"] <= e["t"] <= t_end]
    return {"kind": kind, "down_s": t["start"] - t["stop"], "answering_s": t["answering"] - t["start"],
            "gap_s": _largest_gap([tt for tt, _ in arrivals], *window),
            "quiet_gap_s": _largest_gap([tt for tt, _ in arrivals], t["stop"] - 3.0, t["stop"]),
            "recovery_s": back, "messages": len(seqs), "lost": lost,
            "seq_restarted": bool(seqs) and min(seqs) < 10,
            "reported": sorted({(e["level"], e["message"][:60]) for e in worst if e["level"] != level}),
            "same_launch": b.procs[(ROBOT, BRINGUP_UNIT)].pid == launch_pid
            and b.procs[(ROBOT, BRINGUP_UNIT)].poll() is None}


def _print_runs(title: str, runs: List[Dict[str, object]]) -> None:
    print(f"\n{title}")
    for i, r in enumerate(runs, 1):
        rec = "not degraded" if r["recovery_s"] is None else f"{r['recovery_s']:.2f} s"
        print(f"  run {i} ({r['kind']}, tailscaled down {r['down_s']:.1f} s, LocalAPI answering "
              f"{r['answering_s']:.1f} s after its start): local topic largest gap {r['gap_s'] * 1000:.0f} ms "
              f"({r['messages']} messages, {r['lost']} lost; 3 s before the stop: {r['quiet_gap_s'] * 1000:.0f} ms), "
              f"node recovery {rec} after tailscaled started; reported meanwhile: {r['reported'][:4]}")


def test_tailscaled_restarts_and_upgrade_never_stop_the_ros_stack(booted):
    b = booted
    units = _units()
    assert unitfiles.stopped_with(units, TAILSCALED) == set(), "the shipped units propagate a tailscaled restart"
    rec = robots.Recorder(b.lab, ROBOT, nodes=[overlay_node(ROBOT)], name="boot_record")
    offline_env = Path(b.lab.host_dir(ROBOT)) / "run" / "offline.env"
    offline: Dict[str, object] = {}

    def boot_while_down() -> None:   # a boot with tailscaled down: overlay-env still succeeds
        res = run_overlay_env_unit(b.lab, units, ROBOT, Path(b.lab.robot_yaml(ROBOT)), offline_env, retry="2")
        offline.update(rc=res.returncode, stderr=res.stderr)

    runs: List[Dict[str, object]] = []
    try:
        rec.wait("robot1's overlay diagnostic", lambda e: e["ev"] == "diag", 60)
        _wait("100 local messages on robot1", lambda: len(_arrivals(b.gap_out)) >= 100, 60,
              lambda: f"{len(_arrivals(b.gap_out))} so far")
        for kind, down_s in RUNS:
            runs.append(_one_restart(b, units, kind, down_s, rec, boot_while_down if kind == "upgrade" else None))
    finally:
        rec.stop()
        _print_runs("tailscaled on robot1 stopped (SIGTERM) and started again while the bringup runs "
                    "(2 shared cores, other work running):", runs)
    for r in runs:
        assert r["same_launch"], f"the bringup's roslaunch did not survive run {r}"
        assert not r["seq_restarted"] and r["lost"] == 0, r
        assert r["gap_s"] < LOCAL_GAP_LIMIT_S, f"local gap {r['gap_s']:.3f} s in {r['kind']}"
        assert r["recovery_s"] is None or r["recovery_s"] < RECOVERY_TIMEOUT_S
    upgrade = runs[-1]
    assert upgrade["recovery_s"] is not None and upgrade["reported"], \
        "tailscaled was down 5 s and the node never reported it"
    assert offline["rc"] == 0 and "going on without tailscaled" in str(offline["stderr"]), offline
    env = unitfiles.read_environment_file(offline_env)
    assert env["ROS_HOSTNAME"] == f"{ROBOT}.fleet.internal" and "OVERLAY_MANAGER_ADDRESS" not in env
    # the root upkeep kept the hosts block through it all
    res = b.lab.exec(ROBOT, ["getent", "ahostsv4", f"{LAPTOP}.fleet.internal"], check=False, quiet=True)
    assert b.lab.overlay_ip(LAPTOP) in res.stdout


def test_baseline_a_propagating_unit_graph_stops_the_local_topic(booted, tmp_path):
    """With a drop-in ``Requires=tailscaled.service`` on the bringup (what the first release's
    chain amounted to), systemd would restart the bringup with tailscaled: the emulation does,
    and the local topic stops for more than a second. The check above would see that."""
    b = booted
    units = _units({f"{BRINGUP_UNIT}.d/requires.conf": "[Unit]\nRequires=tailscaled.service\n"}, tmp_path)
    assert unitfiles.stopped_with(units, TAILSCALED) == {BRINGUP_UNIT}
    old = _arrivals(b.gap_out)
    t = _restart_like_systemd(b, units, 0.0)
    _wait("the restarted bringup's local subscriber to receive 50 messages",
          lambda: len(_arrivals(b.gap_out)) >= 50, 120, lambda: f"{len(_arrivals(b.gap_out))} so far")
    arrivals = old + _arrivals(b.gap_out)
    gap = _largest_gap([tt for tt, _ in arrivals], t["stop"] - 1.0, time.monotonic())
    print(f"\nbaseline, bringup restarted with tailscaled (Requires=): local topic largest gap {gap:.2f} s")
    assert gap > 1.0, "the propagated restart did not stop the local topic: the test would not notice"


def test_overlay_env_unit_fails_on_a_broken_config_and_writes_nothing(booted):
    lab = booted.lab
    bad = Path(lab.host_dir(LAPTOP)) / "broken.yaml"
    data = yaml.safe_load(Path(lab.robot_yaml(LAPTOP)).read_text())
    data["master_port"] = "eleven"
    bad.write_text(yaml.safe_dump(data))
    target = Path(lab.host_dir(LAPTOP)) / "run" / "broken.env"
    res = run_overlay_env_unit(lab, booted.units, LAPTOP, bad, target)
    assert res.returncode == 2 and "master_port" in res.stderr, shlex.quote(res.stderr)
    assert not target.exists()

