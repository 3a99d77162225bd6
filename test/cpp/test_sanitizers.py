"""The C++ codecs under AddressSanitizer and UndefinedBehaviorSanitizer, libFuzzer and valgrind, in
the suite (docs/fuzzing.md): runs ``bash scripts/sanitize`` once (a clang workspace of its own) and
reports each of its stages as a test: the build, every gtest under ASan/UBSan (leaks included),
every fuzz target for FUZZ_SECONDS over a copy of its corpus, and valgrind memcheck on the plain
build's H.264 widths test. A sanitizer report, a crash or a valgrind error fails that stage's test,
with the report (or the log's tail) in the message. Skipped only where the sanitizer build cannot
exist: not root (scripts/setup installs clang as root) or no clang. scripts/test builds the
workspace beforehand (in the background, beside its lint and Python 3.8 runs); the stage `build`
then checks that it is up to date."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
FUZZ_SECONDS = 20
# the stages scripts/sanitize runs: every gtest of CMakeLists.txt, every fuzz target of test/fuzz
GTESTS = re.findall(r"^\s*catkin_add_gtest\((\w+)", (ROOT / "CMakeLists.txt").read_text(encoding="utf-8"), re.M)
FUZZERS = sorted(p.stem for p in (ROOT / "test" / "fuzz").glob("fuzz_*.cpp"))
STAGES = ["build"] + [f"gtest:{g}" for g in GTESTS] + [f"fuzz:{f}" for f in FUZZERS] + ["valgrind:test_h264_codec"]
REPORT = re.compile(r"ERROR: \w+Sanitizer|runtime error:|FUZZ CHECK FAILED|^==\d+== (Invalid|Conditional|Use of)"
                    r"|deadly signal|^\[  FAILED  \]", re.M)


class Stage(NamedTuple):
    status: str
    seconds: float
    log: str
    detail: str


class Run(NamedTuple):
    stages: Dict[str, Stage]
    output: str
    returncode: int


def _why_skip() -> str:
    if os.geteuid() != 0:
        return "sanitizer stages need root: scripts/setup installs clang and libclang-rt-14-dev as root"
    if not (shutil.which("clang++", path="/usr/bin:/bin") or shutil.which("clang++")):
        return "no clang++ (scripts/setup installs clang and libclang-rt-14-dev)"
    return ""


@pytest.fixture(scope="module")
def sanitize(tmp_path_factory) -> Run:
    why = _why_skip()
    if why:
        pytest.skip(why)
    summary = tmp_path_factory.mktemp("sanitize") / "stages.tsv"
    env = dict(os.environ, PATH="/usr/bin:/bin:/usr/sbin:/sbin:" + os.environ.get("PATH", ""))
    started = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "sanitize"), "--fuzz-time", str(FUZZ_SECONDS),
                           "--summary", str(summary)], cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=2400, check=False)
    stages = {}
    if summary.is_file():
        for line in summary.read_text(encoding="utf-8").splitlines():
            name, status, seconds, log, detail = (line.split("\t") + [""] * 5)[:5]
            stages[name] = Stage(status, float(seconds or 0), log, detail)
    print(f"\nscripts/sanitize: {time.monotonic() - started:.0f} s in all (exit {proc.returncode})")
    for name, s in stages.items():
        print(f"  {name:28} {s.status:7} {s.seconds:7.1f} s  {s.detail}")
    return Run(stages, proc.stdout + proc.stderr, proc.returncode)


def _excerpt(log: str) -> str:
    """The first report of a log and what follows it, else the log's tail."""
    try:
        text = Path(log).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {log})"
    m = REPORT.search(text)
    lines = text[text.rfind("\n", 0, m.start()) + 1:].splitlines()[:80] if m else text.splitlines()[-60:]
    return "\n".join(lines)


@pytest.mark.parametrize("stage", STAGES)
def test_stage(sanitize: Run, stage: str, record_property):
    s = sanitize.stages.get(stage)
    if s is None:
        tail = "\n".join(sanitize.output.splitlines()[-40:])
        pytest.fail(f"scripts/sanitize did not run stage {stage} (exit {sanitize.returncode}):\n{tail}")
    record_property("seconds", s.seconds)
    assert s.status == "ok", f"{stage}: {s.detail}\nlog {s.log}:\n{_excerpt(s.log)}"


def test_every_stage_is_known(sanitize: Run):
    """scripts/sanitize ran exactly the stages this module reports (the same lists, read the same way)."""
    assert set(sanitize.stages) == set(STAGES), (sorted(set(sanitize.stages) - set(STAGES)),
                                                 sorted(set(STAGES) - set(sanitize.stages)))


def test_the_lists_are_found():
    assert {"test_h264_codec", "test_image_rules", "test_topic_shaping"} <= set(GTESTS) and \
        {"fuzz_h264_decode", "fuzz_image_decode", "fuzz_shaped_decode"} <= set(FUZZERS), (GTESTS, FUZZERS)
