"""A new lab's control server without ROS: `pip install` of this repository into a clean venv,
then the installed `fleet` takes a fleet file for three machines to a running headscale and three
bundles.

- The venv is made from /usr/bin/python3 without system site-packages, so neither rospy, genpy,
  catkin_pkg nor Debian's PyYAML and cryptography are there; pip fetches PyYAML and cryptography
  from the package registry and builds the package from a copy of this checkout (setup.py's plain
  setuptools branch: catkin_pkg is absent). Every command runs in a clean environment: the venv's
  bin, a directory holding only `headscale` (the real one of .tools/bin, found on PATH as a lab's
  would be) and /usr/bin:/bin; no PYTHONPATH, no ROS variables, HOME in the temp dir.
- Checks: `import rospy` fails there; the package, PyYAML and cryptography come from the venv;
  importing the `fleet` and `overlay_env` tools loads no ROS module; lab/ and testing/ are not
  installed; `overlay_env` prints overlay names from a robot config.
- `fleet init`, `fleet serve` in the background (ended by its pid in a finally block), `fleet
  bundle --all`: three bundles with robot.yaml, ca.crt and auth.key (0600; the keys are never
  printed, neither by fleet nor by this test), `fleet status` lists the three machines, `fleet
  serve --unit` reads its template from the venv's share/overlay_manager.
- The version check: a headscale that reports an unsupported version, or none, gets one
  `fleet: warning:` line naming the binary, the version found and the supported range; the real
  one gets none.

Needs .tools/bin/headscale (scripts/setup) and the package registry (pip); no root. About 30 s,
most of it pip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
import yaml
from test_fleet_headscale import HEADSCALE, REPO, loopback_fleet, stop, wait_for

from overlay_manager.fleet.headscale import TESTED_VERSION, supported_range

pytestmark = pytest.mark.skipif(not os.access(HEADSCALE, os.X_OK), reason=f"needs {HEADSCALE} (run scripts/setup)")

PYTHON = "/usr/bin/python3"
HOSTS = ("alpha-base", "alpha-robot1", "alpha-op")
TEAMS = {"alpha": {"master": "alpha-base", "base_stations": ["alpha-base"], "robots": ["alpha-robot1"],
                   "operators": ["alpha-op"]}}
# what the checkout holds that a fresh clone does not (top level) or that no install needs
_NOT_COPIED_AT_TOP = {".git", ".tools", ".build", "build", "artifacts", ".pytest_cache", ".ruff_cache"}
# modules that are ROS (or need it): none may be loaded by the fleet tool
ROS_MODULES = ("rospy", "genpy", "rosgraph", "roslib", "catkin_pkg", "std_msgs", "diagnostic_msgs",
               "overlay_manager.msg", "overlay_manager.srv")


class Venv:
    """The clean venv with the package installed, and a clean environment to run it in."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.dir = base / "venv"
        self.home = base / "home"
        self.tools = base / "tools"  # on PATH: only `headscale`

    @property
    def env(self) -> Dict[str, str]:
        env = {"PATH": f"{self.dir / 'bin'}:{self.tools}:/usr/bin:/bin", "HOME": str(self.home),
               "LANG": "C.UTF-8"}
        # how this machine reaches the package registry (pip's settings, proxies), nothing else
        env.update({k: v for k, v in os.environ.items()
                    if k.startswith("PIP_") or k.lower() in ("http_proxy", "https_proxy", "no_proxy")})
        return env

    def run(self, *argv: str, timeout: float = 60, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
        """argv (a venv tool by name, e.g. "fleet") in the clean environment."""
        return subprocess.run(list(argv), cwd=str(cwd or self.base), env=self.env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)

    def python(self, code: str) -> subprocess.CompletedProcess:
        return self.run(str(self.dir / "bin" / "python"), "-c", code)


def _ignore(top: Path):
    def ignore(directory: str, names: List[str]) -> List[str]:
        skip = [n for n in names if n == "__pycache__" or n.endswith(".egg-info")]
        if Path(directory) == top:
            skip += [n for n in names if n in _NOT_COPIED_AT_TOP]
        return skip
    return ignore


@pytest.fixture(scope="module")
def venv() -> Iterator[Venv]:
    """A venv from /usr/bin/python3 without system site-packages, with `pip install` of a copy of
    this checkout (pip builds in the source directory: the checkout itself stays untouched)."""
    base = Path(tempfile.mkdtemp(prefix="fleet-noros-", dir="/tmp"))
    try:
        v = Venv(base)
        v.home.mkdir()
        v.tools.mkdir()
        (v.tools / "headscale").symlink_to(HEADSCALE)
        src = base / "src"
        shutil.copytree(REPO, src, symlinks=True, ignore=_ignore(REPO))
        t0 = time.monotonic()
        made = subprocess.run([PYTHON, "-m", "venv", str(v.dir)], capture_output=True, text=True, timeout=120,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(v.home), "LANG": "C.UTF-8"}, check=False)
        assert made.returncode == 0, f"{PYTHON} -m venv failed (python3-venv, scripts/setup):\n{made.stderr}"
        pip = v.run(str(v.dir / "bin" / "pip"), "install", str(src), timeout=600)
        assert pip.returncode == 0, f"pip install {src} failed:\n{(pip.stdout + pip.stderr)[-4000:]}"
        print(f"venv + pip install: {time.monotonic() - t0:.1f} s")
        yield v
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_installed_without_ros(venv: Venv) -> None:
    out = venv.python("import rospy")
    assert out.returncode != 0 and "No module named 'rospy'" in out.stderr, out.stdout + out.stderr
    out = venv.python(
        "import sys, os, overlay_manager, yaml, cryptography\n"
        "import overlay_manager.cli.fleet, overlay_manager.cli.overlay_env\n"
        f"ros = {ROS_MODULES!r}\n"
        "print(sorted(m for m in sys.modules if any(m == r or m.startswith(r + '.') for r in ros)))\n"
        "for m in (overlay_manager, yaml, cryptography): print(os.path.dirname(m.__file__))\n"
        "for m in ('catkin_pkg', 'genpy', 'overlay_manager.lab', 'overlay_manager.testing'):\n"
        "    try:\n        __import__(m); print('importable', m)\n"
        "    except ImportError: pass\n")
    assert out.returncode == 0, out.stderr
    loaded, *places = out.stdout.splitlines()
    assert loaded == "[]", f"importing the fleet and overlay_env tools loaded ROS modules: {loaded}"
    site = str(venv.dir / "lib")
    assert all(p.startswith(site) for p in places[:3]), places  # not the checkout, not Debian's
    assert places[3:] == [], places[3:]
    for tool in ("fleet", "overlay_env"):
        assert (venv.dir / "bin" / tool).is_file(), f"pip installed no {tool} console script"
    # the files fleet reads (serve --unit, a derper host's bundle) come with the package
    out = venv.python("from overlay_manager.fleet import derp, unit\n"
                      "print(unit.template_path()); print(derp.template_path())")
    share = venv.dir / "share" / "overlay_manager" / "config" / "systemd"
    assert out.stdout.split() == [str(share / "headscale.service.in"), str(share / "derper.service.in")], \
        out.stdout + out.stderr


def test_overlay_env_runs_without_ros(venv: Venv) -> None:
    out = venv.run("overlay_env", "--config", str(REPO / "config" / "robot.example.yaml"))
    assert out.returncode == 0 and "export ROS_HOSTNAME=alpha-robot1.fleet.internal" in out.stdout, \
        out.stdout + out.stderr


def _bundle_files(bundles: Path, host: str) -> Tuple[Dict, bytes, str, int]:
    d = bundles / host
    robot = yaml.safe_load((d / "robot.yaml").read_text())
    return robot, (d / "ca.crt").read_bytes(), (d / "auth.key").read_text().strip(), \
        (d / "auth.key").stat().st_mode & 0o777


def test_fleet_file_to_three_bundles(venv: Venv) -> None:
    work = venv.base / "lab"
    work.mkdir()
    fleet_file = loopback_fleet(work / "fleet.yaml", "noros", TEAMS)
    fleet = ["fleet", "-f", str(fleet_file), "-d", str(work / "headscale")]

    init = venv.run(*fleet, "init", cwd=work)
    assert init.returncode == 0, init.stdout + init.stderr
    assert "fleet: warning" not in init.stderr, init.stderr  # the real headscale is a supported one
    unit = venv.run(*fleet, "serve", "--unit", cwd=work)
    assert unit.returncode == 0, unit.stderr
    assert f"ExecStart={venv.tools / 'headscale'} serve --config {work / 'headscale' / 'config.yaml'}" \
        in unit.stdout, unit.stdout

    log = work / "serve.log"
    with open(log, "wb") as out:
        serve = subprocess.Popen([*fleet, "serve"], cwd=str(work), env=venv.env, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for("headscale (fleet serve) to answer `fleet status`",
                 lambda: venv.run(*fleet, "status", cwd=work).returncode == 0, 30, log)
        res = venv.run(*fleet, "bundle", "--all", "-o", str(work / "bundles"), cwd=work)
        assert res.returncode == 0, res.stdout + res.stderr
        printed = res.stdout + res.stderr
        status = venv.run(*fleet, "status", "--json", cwd=work)
    finally:
        stop(serve)
    assert serve.returncode is not None

    bundles = work / "bundles"
    assert sorted(p.name for p in bundles.iterdir()) == sorted(HOSTS), printed
    ca = (work / "headscale" / "tls" / "ca.crt").read_bytes()
    for host in HOSTS:
        robot, ca_crt, key, mode = _bundle_files(bundles, host)
        assert robot["hostname"] == host and robot["base_domain"] == "fleet.internal", robot
        assert robot["login_server"] == yaml.safe_load(fleet_file.read_text())["server"]["url"], robot
        assert robot["master"] == "alpha-base", robot
        assert ca_crt == ca, f"{host}: ca.crt is not the fleet CA"
        is_key = key.startswith("hskey-auth-") and len(key) > 30
        leaked = key in printed or key in status.stdout + status.stderr or key[:24] in printed
        assert is_key, f"{host}: auth.key does not hold a headscale pre-auth key"  # the key is never shown
        assert not leaked, f"{host}: fleet printed the auth key"
        assert mode == 0o600, f"{host}: auth.key mode {mode:o}"
    assert status.returncode == 0, status.stderr
    rows = {r["host"]: r for r in json.loads(status.stdout)}
    assert sorted(rows) == sorted(HOSTS) and all(r["state"] == "never-enrolled" for r in rows.values()), rows


def _fake_headscale(venv: Venv, name: str, output: str) -> Path:
    exe = venv.base / "fakes" / name
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize("name,output,found", [
    ("headscale-0.28", "headscale version v0.28.1", " is headscale v0.28.1, which fleet does not support"),
    ("headscale-0.30", "headscale version v0.30.0", " is headscale v0.30.0, which fleet does not support"),
    ("headscale-dev", "headscale version dev", ": cannot tell its version: `headscale version` printed "
                                               "'headscale version dev'"),
])
def test_unsupported_headscale_version_is_one_line(venv: Venv, name: str, output: str, found: str) -> None:
    fake = _fake_headscale(venv, name, output)
    work = venv.base / f"version-{name}"
    work.mkdir()
    fleet_file = loopback_fleet(work / "fleet.yaml", "noros", TEAMS)
    fleet = ["fleet", "-f", str(fleet_file), "-d", str(work / "headscale"), "--headscale", str(fake)]
    want = f"fleet: warning: {fake}{found}"
    supported = f"(supported: {supported_range()})"
    for verb in (["init"], ["serve", "--unit"]):
        out = venv.run(*fleet, *verb, cwd=work)
        assert out.returncode == 0, out.stderr
        lines = out.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(want) and supported in lines[0] \
            and f"install headscale {TESTED_VERSION}" in lines[0], \
            f"fleet {' '.join(verb)}:\n{out.stderr}"
