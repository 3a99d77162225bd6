"""Every command, flag and launch argument quoted in README.md and docs/ exists.

The docs quote command lines (``rosrun overlay_manager overlay_env --enrol``, ``scripts/fleet -f
fleet.yaml bundle HOST``, ``roslaunch overlay_manager robot.launch camera_topics:=...``). This test
reads them back and checks each against the real tool: a flag must appear in the tool's (and its
verb's) ``--help``, a launch argument must be an ``<arg>`` of that launch file, a ``rosrun`` target
must be a script or a built executable of the package. Docs that drift from the code fail here.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[3]
PYTHON = "/usr/bin/python3"  # the tools run under Debian's Python (ROS), also from the 3.8 unit run
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))

# where a quoted command starts: `rosrun overlay_manager TOOL` (also as root: `rosrun --prefix "sudo env ..."
# overlay_manager TOOL`), `scripts/TOOL`, `roslaunch overlay_manager X`
_START = re.compile(r'(?:rosrun (?:--prefix "[^"]*" )?overlay_manager |(?<![\w/.-])scripts/'
                    r'|roslaunch overlay_manager )')
# where it ends: a comment, the end of an inline code span, a shell operator
_END = re.compile(r"\s#|`|\|\||&&|[;|)]|\"|'|$")


def _code_lines(text: str) -> Iterator[str]:
    """Lines of fenced code blocks (continuations joined) and inline code spans of a markdown text."""
    fenced = False
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield pending + line
            pending = ""
        else:
            yield from re.findall(r"`([^`]+)`", line)


def quoted_commands() -> List[Tuple[str, str, str]]:
    """(doc name, kind: rosrun|scripts|roslaunch, the command text after the prefix)."""
    out = []
    for doc in DOCS:
        for line in _code_lines(doc.read_text(encoding="utf-8")):
            for m in _START.finditer(line):
                rest = line[m.end():]
                rest = rest[:_END.search(rest).start()].strip()
                kind = m.group(0).split()[0].rstrip("/")
                if rest:
                    out.append((doc.name, kind, rest))
    return out


def _runner(script: Path) -> Optional[List[str]]:
    """How to run a scripts/ entry point's Python part: the script itself when it is Python, else
    `python3 -m` the module its bash wrapper runs (bash wrappers build the package first)."""
    text = script.read_text(encoding="utf-8")
    if re.search(r"from ([\w.]+) import main", text):
        return [PYTHON, str(script)]
    m = re.search(r"python3 -m ([\w.]+)", text)
    return [PYTHON, "-m", m.group(1)] if m else None


@functools.lru_cache(maxsize=None)
def _help(runner: Tuple[str, ...], verb: str = "") -> str:
    argv = list(runner) + ([verb] if verb else []) + ["--help"]
    run = subprocess.run(argv, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"{' '.join(argv)} failed: {run.stderr.strip()[-400:]}"
    return run.stdout


def _verbs(help_text: str) -> Set[str]:
    """Sub-commands an argparse help lists: `{a,b}` or one per line under a metavar."""
    m = re.search(r"\{([\w,-]+)\}", help_text)
    found = set(m.group(1).split(",")) if m else set()
    return found | set(re.findall(r"^    ([a-z][\w-]*)(?:\s{2,}|$)", help_text, flags=re.M))


def _executables() -> Set[str]:
    cmake = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    names = set(re.findall(r"add_executable\((\w+)", cmake))
    for loop in re.findall(r"foreach\(\w+ ([\w ]+)\)\s*\n\s*add_executable", cmake):
        names.update(loop.split())
    return names | {p.name for p in (ROOT / "scripts").iterdir() if p.is_file()}


def _launch_args(name: str) -> Optional[Set[str]]:
    path = ROOT / "launch" / name
    if not path.is_file():
        return None
    return {a.get("name") for a in ET.parse(path).getroot().iter("arg")}


def _tokens(text: str) -> List[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _flag_problems(runner: Tuple[str, ...], args: List[str]) -> List[str]:
    """Flags in args that neither the tool's nor its verb's --help mentions."""
    top = _help(runner)
    verbs = _verbs(top)
    words = [a for a in args if not a.startswith("-")]
    verb = next((w for w in words if w in verbs), "")
    known = top + (_help(runner, verb) if verb else "")
    tool = Path(runner[-1]).name
    problems = []
    for a in args:
        if a == "--":
            break
        a = a.strip("[]")
        if not a.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", a) or a in ("-", "--"):
            continue
        flag = a.split("=", 1)[0]
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", known):
            problems.append(f"{flag} (not in `{tool}{' ' + verb if verb else ''} --help`)")
    return problems


def check(kind: str, text: str) -> List[str]:
    """Problems with one quoted command (empty when it is right)."""
    tokens = _tokens(text)
    if not tokens:
        return []
    target, args = tokens[0], tokens[1:]
    if kind == "roslaunch":
        known = _launch_args(target)
        if known is None:
            return [f"no launch file launch/{target}"]
        names = [a.strip("[]").split(":=")[0] for a in args if ":=" in a]
        return [f"launch arg {n} not in launch/{target}" for n in names
                if not n.startswith("_") and n not in known]
    if kind == "rosrun" and target not in _executables():
        return [f"rosrun target {target} is neither a script nor a built executable"]
    script = ROOT / "scripts" / target
    if kind == "scripts" and not script.is_file():
        return [f"no script scripts/{target}"]
    if not script.is_file():
        return []  # a built executable: its ~params are documented with the node
    runner = _runner(script)
    if runner is None or target == "overlay_manager_node":
        return []  # the node takes ~params (name:=value), documented with the node
    return _flag_problems(tuple(runner), [a for a in args if ":=" not in a])


COMMANDS = quoted_commands()


def test_the_docs_quote_commands():
    kinds: Dict[str, int] = {}
    for _, kind, _ in COMMANDS:
        kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds.get("roslaunch", 0) >= 3 and kinds.get("scripts", 0) >= 5 and kinds.get("rosrun", 0) >= 3, kinds


@pytest.mark.parametrize("doc, kind, text", sorted(set(COMMANDS)))
def test_quoted_command_exists(doc, kind, text):
    problems = check(kind, text)
    assert not problems, f"{doc}: `{kind} {text}`: " + "; ".join(problems)


def test_check_catches_a_flag_that_does_not_exist():
    assert check("rosrun", "overlay_env --no-such-flag")
    assert check("roslaunch", "robot.launch no_such_arg:=1")
    assert check("rosrun", "no_such_tool")
    assert not check("rosrun", "overlay_env --enrol")


def test_root_commands_are_checked_too():
    root = [text for _, kind, text in COMMANDS if kind == "rosrun" and "--rosbridge-firewall" in text]
    assert root, "the documented root form (rosrun --prefix \"sudo env ...\" overlay_manager ...) is read"
    line = 'x="$(rosrun --prefix "sudo env PYTHONPATH=$PYTHONPATH" overlay_manager overlay_env --enrol --no-such)"'
    starts = [m.end() for m in _START.finditer(line)]
    assert len(starts) == 1 and line[starts[0]:].startswith("overlay_env --enrol --no-such")
