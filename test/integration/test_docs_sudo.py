"""Every root command the docs and the product's fix hints print works as printed: typed by an
ordinary user whose package is built in a catkin workspace, through sudo.

sudo resets the environment: ROS_PACKAGE_PATH, CMAKE_PREFIX_PATH and PYTHONPATH are dropped and
PATH becomes sudo's secure_path, so a form that works from a root shell (or on Debian, where
rosrun is /usr/bin/rosrun) fails for the user the docs speak to. This test

- collects every root command of README.md and docs/*.md (code blocks and inline code) and of the
  fix hints (``up_failure_fix``, ``firewall.fix``): each is the one form of
  ``overlay_manager.core.commands``, and no doc prints ``sudo rosrun overlay_manager`` or
  ``sudo overlay_env``;
- makes a throwaway user with a sudoers rule and a catkin workspace in a temp dir whose src links
  this checkout, configured and built as that user (cmake and the Python messages: what rosrun and
  the Python tools use; the C++ nodes play no part in these commands);
- runs every collected command as that user, in a login shell with the workspace sourced, with
  ``--help`` appended (argparse answers before anything changes), and checks overlay_env's help
  came back; runs the form once for real (``--env-file`` into a directory only root may write:
  the file must be root's, from the user's config); and checks that the old ``sudo rosrun
  overlay_manager overlay_env --help`` fails in the same set-up, so the test would notice.

The user, its sudoers file and the temp dir are removed afterwards, also when a step fails.
Needs root (useradd, /etc/sudoers.d) and sudo; about 20 s (the workspace build is most of it).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from overlay_manager.core.commands import OVERLAY_ENV_AS_ROOT, overlay_env_as_root
from overlay_manager.system import firewall
from overlay_manager.tailscaled.localapi import (
    ENROL_CERTIFICATE,
    ENROL_KEY_REJECTED,
    EnrolRequest,
    up_failure_fix,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
EXAMPLE = ROOT / "config" / "robot.example.yaml"
CLEAN_PATH = "/usr/bin:/bin"  # Debian's python3 and catkin first: never a pyenv python3

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: it creates a user and a sudoers rule"),
]

# a root command of the wrong form: sudo [options] [env VAR=...] rosrun overlay_manager | overlay_env
WRONG = re.compile(r"\bsudo(?:\s+-\S+)*(?:\s+env(?:\s+\S+=\S*)*)?\s+(?:rosrun\s+overlay_manager\b|\S*overlay_env\b)")


def doc_text(path: Path) -> str:
    """A doc's text with shell line continuations joined (a command split over lines is one line)."""
    return re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))


def command_args(text: str, start: int) -> str:
    """The arguments of the command that continues at text[start]: up to the end of the line, a
    backtick (end of inline code), an unquoted ')', ';', '|', '&' or a ' #' comment."""
    out, quote = [], ""
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "\"'":
            quote = c
        elif c in "\n`);|&" or (c == "#" and text[i - 1].isspace()):
            break
        out.append(c)
    return "".join(out).strip()


def documented_root_commands() -> Dict[str, List[str]]:
    """command line -> where it is printed ('docs/x.md', 'fix hint ...'), for every root command."""
    found: Dict[str, List[str]] = {}
    for doc in DOCS:
        text = doc_text(doc)
        for m in re.finditer(re.escape(OVERLAY_ENV_AS_ROOT), text):
            args = command_args(text, m.end())
            if "..." in args:
                continue  # a shape (`overlay_env ...`), not a command to paste
            found.setdefault(overlay_env_as_root(args), []).append(str(doc.relative_to(ROOT)))
    request = EnrolRequest(login_server="https://hs.example:8443", hostname="robot1",
                           auth_key_file="/etc/overlay_manager/auth.key", tags=[])
    hints = [("fix hint: rejected key", up_failure_fix(ENROL_KEY_REJECTED, request, config="/etc/x/robot.yaml")),
             ("fix hint: certificate", up_failure_fix(ENROL_CERTIFICATE, request, config="/etc/x/robot.yaml")),
             ("fix hint: rosbridge port", firewall.fix(9090))]
    for name, hint in hints:
        spans = [s for s in re.findall(r"`([^`]+)`", hint) if s.startswith(OVERLAY_ENV_AS_ROOT)]
        assert spans, f"{name} prints no root command in the form {OVERLAY_ENV_AS_ROOT!r}: {hint}"
        for s in spans:
            found.setdefault(s, []).append(name)
    return found


def test_no_doc_prints_a_root_command_of_another_form():
    wrong = [f"{doc.relative_to(ROOT)}: {m.group(0)!r}" for doc in DOCS
             for m in WRONG.finditer(doc_text(doc))]
    assert not wrong, ("root commands that fail through sudo for a workspace-built package (use "
                       f"{OVERLAY_ENV_AS_ROOT!r}):\n" + "\n".join(wrong))


def test_the_docs_print_root_commands():
    found = documented_root_commands()
    where = {w.split(":")[0] for ws in found.values() for w in ws}
    assert len(found) >= 8 and {"README.md", "docs/install.md", "docs/node.md"} <= where, found


# ----- a user, a workspace, sudo ---------------------------------------------------------------

def _run(argv: List[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """argv in its own process group, killed as a group when it outlives timeout."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(killed after {timeout:.0f} s)"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class User:
    """A throwaway login user with a home in a temp dir and a passwordless sudoers rule."""

    def __init__(self, base: Path) -> None:
        self.name = f"omdocs{os.getpid() % 1000000}"
        self.home = base / "home"
        self.sudoers = Path("/etc/sudoers.d") / f"overlay_manager_docs_{self.name}"  # no '.': sudo skips those

    def create(self) -> None:
        proc = _run(["useradd", "--no-create-home", "--home-dir", str(self.home), "--shell", "/bin/bash",
                     self.name], 30)
        assert proc.returncode == 0, f"useradd {self.name}: {proc.stderr}"
        self.home.mkdir(parents=True)
        shutil.chown(str(self.home), self.name, self.name)
        self.sudoers.write_text(f"{self.name} ALL=(root) NOPASSWD: ALL\n")
        self.sudoers.chmod(0o440)
        check = _run(["visudo", "-cf", str(self.sudoers)], 30)
        assert check.returncode == 0, f"visudo refuses {self.sudoers}: {check.stdout}{check.stderr}"

    def remove(self) -> None:
        self.sudoers.unlink(missing_ok=True)
        try:
            pwd.getpwnam(self.name)
        except KeyError:
            return
        _run(["userdel", self.name], 30)

    def shell(self, script: str, timeout: float) -> subprocess.CompletedProcess:
        """script in this user's login shell (bash -l), with a clean environment like a fresh login."""
        env = ["env", "-i", f"HOME={self.home}", f"USER={self.name}", f"LOGNAME={self.name}",
               f"PATH={CLEAN_PATH}", "LANG=C.UTF-8", "SHELL=/bin/bash"]
        return _run(["sudo", "-u", self.name, *env, "bash", "-lc", script], timeout, cwd=str(self.home))


@pytest.fixture(scope="module")
def user_ws() -> Iterator[Tuple[User, Path]]:
    """(user, its workspace): src/overlay_manager -> this checkout, configured and built as the user."""
    if shutil.which("sudo") is None or shutil.which("visudo") is None:
        pytest.fail("sudo is not installed (scripts/setup installs it: apt-get install sudo)")
    if shutil.which("catkin_make") is None or shutil.which("rosrun") is None:
        pytest.fail("catkin_make/rosrun not installed (scripts/setup)")
    base = Path(tempfile.mkdtemp(prefix="overlay_manager_docs_sudo_"))
    base.chmod(0o755)  # the user must reach its home inside
    user = User(base)
    try:
        user.create()
        ws = user.home / "ws"
        build = user.shell(
            f"mkdir -p ws/src && ln -s {ROOT} ws/src/overlay_manager && cd ws && "
            "catkin_make -DPYTHON_EXECUTABLE=/usr/bin/python3 -DCATKIN_ENABLE_TESTING=OFF "
            "overlay_manager_generate_messages_py", 300)
        assert build.returncode == 0, f"catkin_make as {user.name} failed:\n{(build.stdout + build.stderr)[-3000:]}"
        yield user, ws
    finally:
        user.remove()
        shutil.rmtree(base, ignore_errors=True)


def as_user(user: User, ws: Path, command: str, config: Path = EXAMPLE) -> subprocess.CompletedProcess:
    """command typed by the user in a shell with the workspace sourced and OVERLAY_MANAGER_CONFIG set."""
    return user.shell(f"source {ws}/devel/setup.bash && export OVERLAY_MANAGER_CONFIG={config} && "
                      f"cd && {command}", 60)


def test_every_documented_root_command_runs_through_sudo(user_ws):
    user, ws = user_ws
    commands = documented_root_commands()
    script = "".join(f"echo '=== {i}'; {cmd} --help 2>&1; echo \"=== rc $?\"\n"
                     for i, cmd in enumerate(commands))
    proc = as_user(user, ws, f"\n{script}")
    outputs = re.split(r"^=== (\d+)\n", proc.stdout, flags=re.M)[1:]
    results = {int(outputs[i]): outputs[i + 1] for i in range(0, len(outputs), 2)}
    failed = []
    for i, (cmd, where) in enumerate(commands.items()):
        out = results.get(i, "")
        if "=== rc 0" not in out or "usage: overlay_env" not in out:
            failed.append(f"{cmd} --help  ({', '.join(sorted(set(where)))}):\n    {out.strip()[-600:]}")
    assert not failed, (f"as {user.name} through sudo:\n" + "\n".join(failed)
                        + f"\nstderr: {proc.stderr[-1000:]}")


def test_the_form_runs_overlay_env_as_root_with_the_users_config(user_ws):
    user, ws = user_ws
    only_root = user.home.parent / "root_only"
    only_root.mkdir(mode=0o700)
    target = only_root / "ros.env"
    proc = as_user(user, ws, overlay_env_as_root(f'--config "$OVERLAY_MANAGER_CONFIG" --env-file {target}'))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert target.stat().st_uid == 0, "written by root"
    assert "ROS_HOSTNAME=alpha-robot1.fleet.internal" in target.read_text(), "from the user's config"


def test_plain_sudo_rosrun_fails_for_a_workspace_package(user_ws):
    """The form the docs used to print: sudo drops ROS_PACKAGE_PATH, rospack finds no package."""
    user, ws = user_ws
    assert as_user(user, ws, "rosrun overlay_manager overlay_env --help").returncode == 0, "as the user it works"
    proc = as_user(user, ws, "sudo rosrun overlay_manager overlay_env --help")
    assert proc.returncode != 0 and "usage: overlay_env" not in proc.stdout, proc.stdout + proc.stderr
