"""The suite's time per tier: at the end of a run, pytest prints how long the tests of each folder
under test/ (unit, cpp, gui, rostest, integration, system) took, wall time from each test's setup to
its teardown (module and session fixtures included, collection not), and the whole session's.

scripts/test runs the unit tests under Python 3.8 before the main run and passes that run's wall
time in OVERLAY_PY38_RUN_S; the table then ends with it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Dict, List

import pytest

TESTS = Path(__file__).resolve().parent
PY38_ENV = "OVERLAY_PY38_RUN_S"


class TierClock:
    """Wall time and test count per tier (a folder of test/)."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}
        self.tests: Dict[str, int] = {}
        self.started = time.monotonic()

    @staticmethod
    def tier(path: Path) -> str:
        try:
            parts = Path(path).resolve().relative_to(TESTS).parts
        except ValueError:
            return "other"
        return parts[0] if len(parts) > 1 else "other"

    def add(self, tier: str, seconds: float) -> None:
        self.seconds[tier] = self.seconds.get(tier, 0.0) + seconds
        self.tests[tier] = self.tests.get(tier, 0) + 1

    def lines(self, py38_run_s: str = "") -> List[str]:
        """The table: one line per tier (slowest first), the sum, the session, the Python 3.8 run."""
        out = [f"{tier:<12} {self.tests[tier]:>5} tests {secs:>9.1f} s"
               for tier, secs in sorted(self.seconds.items(), key=lambda kv: -kv[1])]
        total = sum(self.seconds.values())
        out.append(f"{'all tiers':<12} {sum(self.tests.values()):>5} tests {total:>9.1f} s "
                   f"(session {time.monotonic() - self.started:.1f} s)")
        if py38_run_s:
            out.append(f"{'Python 3.8':<12} {'test/unit':>11} {py38_run_s:>9} s (its own run, before this one)")
        return out


CLOCK = TierClock()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.monotonic()
    yield
    CLOCK.add(TierClock.tier(item.path), time.monotonic() - start)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not CLOCK.tests:
        return
    terminalreporter.write_sep("=", "time per tier (test/<tier>/)")
    for line in CLOCK.lines(os.environ.get(PY38_ENV, "")):
        terminalreporter.write_line(line)
