"""The ``fleet`` command line: global options before or after the command, one function per
command, headscale needed only by the commands that run it, the systemd unit from its template
file. Runs scripts/fleet as a user would (real openssl; no headscale is started)."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from overlay_manager.cli import fleet as cli
from overlay_manager.fleet import headscale
from overlay_manager.fleet.model import FleetError
from overlay_manager.fleet.unit import render_unit, template_path

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
FLEET = {"fleet": "lab", "base_domain": "fleet.internal", "server": {"url": "https://10.231.0.2:8443"},
         "teams": {"alpha": {"robots": ["alpha-robot1"]}}}


@pytest.fixture
def fleet_dir(tmp_path: Path) -> Path:
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    return tmp_path


def fleet(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env: Dict[str, str] = {k: v for k, v in os.environ.items() if k != "HEADSCALE_BIN"}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "fleet"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def hide_headscale(d: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No headscale anywhere: no HEADSCALE_BIN, a PATH with only openssl, no .tools/bin."""
    bin_dir = d / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("openssl") or "/usr/bin/openssl", bin_dir / "openssl")
    monkeypatch.delenv("HEADSCALE_BIN", raising=False)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(headscale, "_checkout_headscale", lambda: None)


@pytest.mark.parametrize("argv", [
    ["-f", "fleet.yaml", "-d", "hs", "init"],         # before the command (as before)
    ["init", "-f", "fleet.yaml", "-d", "hs"],         # after it
    ["-f", "fleet.yaml", "init", "-d", "hs"],         # mixed
    ["init", "--fleet=fleet.yaml", "--deployment", "hs"],
])
def test_global_options_before_or_after_the_command(fleet_dir: Path, argv: List[str]) -> None:
    res = fleet(fleet_dir, *argv)
    assert res.returncode == 0, res.stderr
    assert (fleet_dir / "hs" / "deployment.json").is_file()
    assert "next: fleet -f fleet.yaml -d hs serve" in res.stdout


def test_option_after_the_command_wins_and_before_is_kept() -> None:
    p = cli._parser()
    a = p.parse_args(["-f", "a.yaml", "status", "-d", "x"])
    assert (a.fleet, a.deployment, a.headscale) == ("a.yaml", "x", None)
    a = p.parse_args(["-d", "x", "bundle", "alpha-robot1", "-f", "b.yaml", "--headscale", "/hs"])
    assert (a.fleet, a.deployment, a.headscale, a.host) == ("b.yaml", "x", "/hs", "alpha-robot1")
    a = p.parse_args(["rotate", "h"])
    assert (a.fleet, a.deployment) == ("fleet.yaml", "headscale")


def test_every_verb_has_its_own_function_and_help() -> None:
    names = [v.name for v in cli.VERBS]
    assert names == ["init", "serve", "policy", "bundle", "status", "revoke", "rotate", "renew-cert"]
    assert len({v.run for v in cli.VERBS}) == len(names)
    usage = cli._parser().format_help()
    for v in cli.VERBS:
        assert v.name in usage and v.help in usage


def test_init_runs_without_headscale(fleet_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new deployment never runs headscale: init works where none can be found."""
    hide_headscale(fleet_dir, monkeypatch)
    monkeypatch.chdir(fleet_dir)
    assert cli.run(["init"]) == 0
    assert (fleet_dir / "headscale" / "deployment.json").is_file()


@pytest.mark.parametrize("argv,needs", [
    (["serve"], "`fleet serve`"),
    (["status"], "`fleet status`"),
    (["revoke", "alpha-robot1"], "`fleet revoke`"),
    (["rotate", "alpha-robot1"], "`fleet rotate`"),
    (["bundle", "alpha-robot1"], "`fleet bundle` (it creates the pre-auth keys)"),
    (["policy"], "`fleet policy`"),
])
def test_commands_that_run_headscale_name_the_flag(fleet_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture, argv: List[str],
                                                   needs: str) -> None:
    hide_headscale(fleet_dir, monkeypatch)
    monkeypatch.chdir(fleet_dir)
    assert cli.main(["init"]) == 0
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fleet: error: {needs} needs the headscale binary")
    assert "--headscale PATH" in err and "HEADSCALE_BIN" in err and "Traceback" not in err
    # --policy --print needs no headscale
    assert cli.main(["policy", "--print"]) == 0


def test_bad_input_is_one_line_and_exit_2(fleet_dir: Path) -> None:
    fleet(fleet_dir, "init")
    for argv, words in ((["bundle", "--headscale", "/bin/true"], "give a HOST or --all"),
                        (["bundle", "zulu", "--headscale", "/bin/true"], "zulu"),
                        (["status", "-d", "nowhere"], "not a deployment directory"),
                        (["init", "-f", "missing.yaml"], "missing.yaml")):
        res = fleet(fleet_dir, *argv)
        assert res.returncode == 2 and res.stdout == "", (argv, res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert lines[0].startswith("fleet: error: ") and words in lines[0], (argv, res.stderr)
        assert len(lines) <= 2 and "Traceback" not in res.stderr, res.stderr


def test_serve_unit_comes_from_the_template(fleet_dir: Path) -> None:
    assert fleet(fleet_dir, "init", "-d", "my hs").returncode == 0
    res = fleet(fleet_dir, "serve", "--unit", "-d", "my hs", "--headscale", "/bin/true")
    assert res.returncode == 0, res.stderr
    tpl = template_path()
    assert tpl == REPO / "config" / "systemd" / "headscale.service.in"
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read_string(res.stdout)
    assert unit["Unit"]["Description"] == "Headscale control server of fleet lab"
    config = fleet_dir / "my hs" / "config.yaml"
    assert unit["Service"]["ExecStart"] == f'/bin/true serve --config "{config}"'
    assert unit["Service"]["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert "@" not in res.stdout.replace("@lab", "")


def test_template_with_an_unknown_field_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "headscale.service.in"
    bad.write_text("[Service]\nExecStart=@EXEC_START@ @OOPS@\n")
    with pytest.raises(FleetError, match="@OOPS@") as info:
        render_unit("lab", ["/bin/true"], bad)
    assert str(bad) in str(info.value)
    assert render_unit("lab", ["/x y/hs", "50%"]).count('ExecStart="/x y/hs" 50%%\n') == 1


@pytest.mark.parametrize("text,expected", [
    ("headscale version v0.29.0\ncommit: unknown\nbuilt with: go1.26.8 linux/amd64\n", ((0, 29, 0), False)),
    ("v0.22.3\n", ((0, 22, 3), False)),                               # releases before 0.26
    ("headscale version 0.29.1-beta.1\n", ((0, 29, 1), True)),
    ("headscale version v0.29.3-dirty\n", ((0, 29, 3), False)),        # a modified tree, not a pre-release
    ("headscale version dev\ncommit: unknown\nbuilt with: go1.26.8 linux/amd64\n", None),  # go build in the module
    ("", None),
])
def test_headscale_version_is_read_from_its_output(text: str, expected: object) -> None:
    assert headscale.parse_version(text) == expected


def fake_headscale(d: Path, output: str, status: int = 0) -> Path:
    exe = d / "headscale"
    exe.write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\nexit {status}\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize("output,status,problem", [
    ("headscale version v0.29.0", 0, None),
    ("headscale version v0.29.3", 0, None),
    ("headscale version v0.29.0-dirty", 0, None),
    ("headscale version v0.29.0-rc.1", 0, " is headscale v0.29.0 (a pre-release), which fleet does not support"),
    ("headscale version v0.28.1", 0, " is headscale v0.28.1, which fleet does not support"),
    ("headscale version v0.30.0", 0, " is headscale v0.30.0, which fleet does not support"),
    ("headscale version dev", 0, ": cannot tell its version: `headscale version` printed 'headscale version dev'"),
    ("unknown command", 1, ": cannot tell its version: `headscale version` printed 'unknown command', exit status 1"),
])
def test_version_problem_names_binary_version_and_range(tmp_path: Path, output: str, status: int,
                                                         problem: object) -> None:
    exe = fake_headscale(tmp_path, output, status)
    got = headscale.version_problem(exe)
    if problem is None:
        assert got is None
        return
    assert got is not None and got.startswith(f"{exe}{problem} (supported: >= 0.29.0, < 0.30.0; tested: v0.29.0)")
    assert "\n" not in got and "install headscale v0.29.0" in got


def test_unsupported_headscale_is_one_warning_line(fleet_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    """`fleet init` and a command that runs headscale warn once; the command still runs."""
    (fleet_dir / "bin").mkdir()
    exe = fake_headscale(fleet_dir / "bin", "headscale version v0.28.1")
    monkeypatch.chdir(fleet_dir)
    for argv in (["init", "--headscale", str(exe)], ["serve", "--unit", "--headscale", str(exe)]):
        assert cli.main(argv) == 0
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"fleet: warning: {exe} is headscale v0.28.1"), err
