"""The package works from a catkin install space, as on a robot that installed it (not from the
source checkout): `make install` of the package, then with only the install
space's setup.bash sourced (clean environment): rosmsg show, rossrv show, overlay_env --help,
roslaunch --files robot.launch, the dashboard import, and the source-checkout tools are absent.
Under scripts/test it installs from scripts/build's workspace (seconds); alone it builds a fresh
workspace first (2-4 minutes on 2 cores: the C++ nodelets are compiled again)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("catkin_make") is None or shutil.which("rosmsg") is None,
                                reason="catkin_make/rosmsg not installed (scripts/setup)")

CLEAN_ENV = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"}


def run(cmd: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """bash -c cmd in a clean environment (no devel space, no source tree on any path)."""
    env = dict(CLEAN_ENV, HOME=str(cwd), ROS_HOME=str(cwd / "roshome"))
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def built_workspace():
    """The catkin workspace this test run's devel space belongs to (scripts/build's), if its
    src/overlay_manager is this checkout: installing from its build directory reuses the compiled
    objects (seconds instead of minutes on 2 cores)."""
    for prefix in os.environ.get("CMAKE_PREFIX_PATH", "").split(":"):
        ws = Path(prefix).parent
        if (prefix.rstrip("/").endswith("/devel") and (ws / "build" / "CMakeCache.txt").is_file()
                and (ws / "src" / "overlay_manager").resolve() == ROOT):
            return ws
    return None


@pytest.fixture(scope="module")
def install(tmp_path_factory):
    """overlay_manager installed (`make install`), yields the install prefix: from the workspace
    the devel space came from when there is one, else a fresh workspace (catkin_make install)."""
    ws = built_workspace()
    if ws is not None:
        shutil.rmtree(ws / "install", ignore_errors=True)  # only what this install puts there
        # and only this checkout's Python: setuptools' build directory keeps every module an earlier
        # build of another checkout put there (moved or no longer installed ones too)
        shutil.rmtree(ws / "build" / "overlay_manager" / "lib", ignore_errors=True)
        proc = run(f"cmake --build {ws / 'build'} --target install", ws, timeout=900)
    else:
        ws = tmp_path_factory.mktemp("install_ws")
        (ws / "src").mkdir()
        (ws / "src" / "overlay_manager").symlink_to(ROOT)
        proc = run("catkin_make install -DPYTHON_EXECUTABLE=/usr/bin/python3 -DCATKIN_ENABLE_TESTING=OFF "
                   "-DCMAKE_BUILD_TYPE=Release", ws, timeout=900)
    assert proc.returncode == 0, f"install into {ws} failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    yield ws / "install"


def in_install(install: Path, cmd: str) -> subprocess.CompletedProcess:
    """cmd with only the install space sourced, run outside the source tree."""
    return run(f"set -e; source {install}/setup.bash; {cmd}", install.parent)


def test_rosmsg_and_rossrv_show(install):
    out = in_install(install, "rosmsg show overlay_manager/Peer; rossrv show overlay_manager/GetRosEnv")
    assert out.returncode == 0, out.stderr
    assert "string dns_name" in out.stdout and "string ros_master_uri" in out.stdout
    assert (install / "share" / "overlay_manager" / "msg" / "Peer.msg").is_file()


def test_package_and_tools_come_from_the_install_space(install):
    out = in_install(install, "rospack find overlay_manager; "
                              "python3 -c 'import overlay_manager, overlay_manager.msg as m; "
                              "print(overlay_manager.__file__); print(m.Peer._type)'")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == str(install / "share" / "overlay_manager")
    assert lines[1].startswith(str(install)) and lines[2] == "overlay_manager/Peer"


def test_overlay_env_help_and_env_file(install):
    out = in_install(install, "rosrun overlay_manager overlay_env --help")
    assert out.returncode == 0 and "--env-file" in out.stdout, out.stdout + out.stderr
    example = install / "share" / "overlay_manager" / "config" / "robot.example.yaml"
    out = in_install(install, f"rosrun overlay_manager overlay_env --config {example}")
    assert out.returncode == 0 and "export ROS_HOSTNAME=alpha-robot1.fleet.internal" in out.stdout, out.stderr


def test_roslaunch_files_robot_launch(install):
    out = in_install(install, "roslaunch --files overlay_manager robot.launch config:=/nonexistent.yaml ns:=robot1")
    assert out.returncode == 0, out.stderr
    assert str(install / "share" / "overlay_manager" / "launch" / "robot.launch") in out.stdout
    out = in_install(install, "roslaunch --files overlay_manager diagnostics.launch gui:=false")
    assert out.returncode == 0 and "diagnostics.launch" in out.stdout, out.stderr
    share = install / "share" / "overlay_manager" / "config"
    for f in ("analyzers.yaml", "systemd/overlay-env.service", "systemd/overlay-upkeep.service",
              "systemd/overlay-manager.service",
              "systemd/overlay-manager.env", "systemd/tailscaled.service.d/overlay_manager.conf"):
        assert (share / f).is_file(), f"{f} is not installed"


def test_dashboard_imports_with_its_ui_file(install):
    out = in_install(install, "python3 -c 'import overlay_manager.dashboard.widget as w, os; "
                              "print(w.UI_FILE); print(os.path.isfile(w.UI_FILE))'")
    if "No module named 'python_qt_binding'" in out.stderr:
        pytest.skip("python_qt_binding not installed")
    assert out.returncode == 0, out.stderr
    ui, exists = out.stdout.split()
    assert ui.startswith(str(install)) and exists == "True"


def test_source_checkout_tools_are_not_installed(install):
    bin_dir = install / "lib" / "overlay_manager"
    installed = sorted(p.name for p in bin_dir.iterdir() if p.is_file() and os.access(p, os.X_OK))
    for tool in ("overlay_manager_node", "overlay_env", "fleet", "dashboard"):
        assert tool in installed
    for tool in ("lab", "bench_node", "bench", "demo", "setup", "test", "build"):
        assert tool not in installed, f"{tool} needs a source checkout but is installed"
    out = in_install(install, "rosrun overlay_manager fleet --help")
    assert out.returncode == 0 and "bundle" in out.stdout, out.stderr


def test_installed_fleet_reads_its_unit_template(install):
    """`fleet serve --unit` reads config/systemd/headscale.service.in from the install space, and a
    derper host's bundle derper.service.in."""
    out = in_install(install, "python3 -c 'from overlay_manager.fleet.unit import template_path, render_unit; "
                              "print(template_path()); print(render_unit(\"lab\", [\"/usr/bin/headscale\"]))'")
    assert out.returncode == 0, out.stderr
    path = out.stdout.splitlines()[0]
    assert path == str(install / "share" / "overlay_manager" / "config" / "systemd" / "headscale.service.in")
    assert "ExecStart=/usr/bin/headscale" in out.stdout and "fleet lab" in out.stdout
    out = in_install(install, "python3 -c 'from overlay_manager.fleet.derp import template_path; "
                              "print(template_path())'")
    assert out.returncode == 0 and out.stdout.strip() == str(Path(path).with_name("derper.service.in")), \
        out.stdout + out.stderr


def test_installed_fleet_never_looks_next_to_its_files(install):
    """fleet finds headscale through --headscale, $HEADSCALE_BIN or PATH, not a .tools next to it."""
    if shutil.which("headscale", path=CLEAN_ENV["PATH"]):
        pytest.skip("a headscale on the clean PATH would be found legitimately")
    out = in_install(install, "python3 -c 'from overlay_manager.fleet.headscale import find_headscale; "
                              "print(find_headscale())'")
    assert out.returncode != 0 and "headscale binary (v0.29), which was not found" in out.stderr \
        and "--headscale PATH" in out.stderr, out.stdout + out.stderr
    fake = install.parent / "bin" / "headscale"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    out = in_install(install, f"PATH={fake.parent}:$PATH python3 -c 'from overlay_manager.fleet.headscale "
                              "import find_headscale; print(find_headscale())'")
    assert out.returncode == 0 and out.stdout.strip() == str(fake), out.stderr


def test_installed_python_is_the_product_without_lab_or_fakes(install):
    """Robots get the layers (core, system, tailscaled, monitor, ros, cli), the fleet tool and the
    dashboard; the lab and the test fakes stay in the clone (setup.py)."""
    out = in_install(install, "python3 -c 'import overlay_manager, os; "
                              "print(os.path.dirname(overlay_manager.__file__))'")
    assert out.returncode == 0, out.stderr
    pkg = Path(out.stdout.strip())
    assert str(pkg).startswith(str(install)), pkg
    installed = sorted(p.name for p in pkg.iterdir() if p.is_dir() and p.name != "__pycache__")
    for layer in ("core", "system", "tailscaled", "monitor", "ros", "cli", "fleet", "dashboard"):
        assert layer in installed, f"{layer} not installed to {pkg}: {installed}"
    assert "lab" not in installed and "testing" not in installed, installed
    out = in_install(install, "python3 -c 'import overlay_manager.lab'")
    assert out.returncode != 0 and "No module named 'overlay_manager.lab'" in out.stderr, out.stderr
    # the node's entry point imports from the installed layers alone
    out = in_install(install, "python3 -c 'import overlay_manager.ros.main, overlay_manager.cli.overlay_env'")
    assert out.returncode == 0, out.stderr
