"""The outage measures of the DERP region test and benchmark (pure: frame times in, numbers out)."""

from __future__ import annotations

from overlay_manager.lab.campus.derp_outage import longest_gap, per_second_rates, recovery_s

FPS = 30


def frames(*spans: tuple) -> list:
    """Frame times at 30 Hz over each (start, end) span."""
    return [s + i / FPS for s, e in spans for i in range(int((e - s) * FPS))]


def test_rates_and_gaps() -> None:
    ts = frames((0, 10), (20, 30))
    assert per_second_rates(ts, 0, 30)[8:12] == [30, 30, 0, 0] and len(per_second_rates(ts, 0, 30)) == 30
    assert abs(longest_gap(ts, 0, 30) - 10.03) < 0.01
    assert longest_gap([], 5, 7) == 2.0


def test_recovery_after_a_stall_that_starts_late() -> None:
    # the break at 5 s; frames drain until 10 s, nothing until 20 s, then 30 Hz again
    ts = frames((0, 10), (20, 30))
    r = recovery_s(ts, 5.0, 30.0, 25)
    assert r is not None and 14.0 <= r <= 15.0   # back at 20 s = 15 s after the break
    assert recovery_s(frames((0, 30)), 5.0, 30.0, 25) == 0.0  # never stopped
    assert recovery_s(frames((0, 10)), 5.0, 30.0, 25) is None  # never back
    slow = [t for i, t in enumerate(frames((0, 30))) if i % 2]  # 15 Hz throughout
    assert recovery_s(slow, 5.0, 30.0, 25) is None and recovery_s(slow, 5.0, 30.0, 10) == 0.0
