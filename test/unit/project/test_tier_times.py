"""test/conftest.py prints the suite's time per tier (folder of test/) at the end of a run, and the
Python 3.8 run's time that scripts/test passes in OVERLAY_PY38_RUN_S."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def test_a_run_prints_each_tier_and_the_python38_run(tmp_path: Path) -> None:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    for tier, body in (("unit", "def test_a():\n    pass\n\ndef test_b():\n    pass\n"),
                       ("cpp", "import time\n\ndef test_slow():\n    time.sleep(0.3)\n")):
        (tmp_path / tier).mkdir()
        (tmp_path / tier / f"test_{tier}_tier.py").write_text(body)
    env = dict(os.environ, OVERLAY_PY38_RUN_S="95")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    table = run.stdout.split("time per tier", 1)[1].splitlines()[1:]
    assert re.match(r"cpp +1 tests +0\.[3-9]\d* s$", table[0]), table  # the slowest tier first
    assert re.match(r"unit +2 tests +\d+\.\d s$", table[1]), table
    assert re.match(r"all tiers +3 tests +\d+\.\d s \(session \d+\.\d s\)$", table[2]), table
    assert re.match(r"Python 3\.8 +test/unit +95 s", table[3]), table
