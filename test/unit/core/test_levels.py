"""One level vocabulary (overlay_manager.core.levels): the values diagnostic_msgs uses, and the
monitor's and the watchdog's levels are that type."""

from __future__ import annotations

import pytest

from overlay_manager.core import levels
from overlay_manager.core.levels import Level
from overlay_manager.monitor import readings
from overlay_manager.system import workers


def test_values_and_order() -> None:
    assert [(lv.name, int(lv)) for lv in Level] == [("OK", 0), ("WARN", 1), ("ERROR", 2), ("STALE", 3)]
    assert max(Level.OK, Level.ERROR, Level.WARN) is Level.ERROR
    assert (levels.OK, levels.WARN, levels.ERROR, levels.STALE) == tuple(Level)


def test_values_are_diagnostic_msgs_bytes() -> None:
    msgs = pytest.importorskip("diagnostic_msgs.msg", reason="diagnostic_msgs needs /usr/bin/python3 with ROS")
    status = msgs.DiagnosticStatus
    assert (status.OK, status.WARN, status.ERROR, status.STALE) == (Level.OK, Level.WARN, Level.ERROR, Level.STALE)


def test_the_monitor_and_the_watchdog_use_the_one_type() -> None:
    assert readings.OK is Level.OK and readings.WARN is Level.WARN and readings.ERROR is Level.ERROR
    w = workers.Worker("overlay-test", lambda: None, 1.0, 5.0, start=False)
    assert type(w.health().level) is Level


def test_log_severities_are_words_not_levels() -> None:
    words = (workers.LOG_DEBUG, workers.LOG_INFO, workers.LOG_WARN, workers.LOG_ERROR)
    assert words == ("debug", "info", "warn", "error")
    assert not any(isinstance(w, int) for w in words)


def test_the_dashboard_uses_the_one_type() -> None:
    from overlay_manager.view import text
    assert (text.LEVEL_OK, text.LEVEL_WARN, text.LEVEL_ERROR, text.LEVEL_UNKNOWN) == tuple(Level)
    assert set(text.LEVEL_COLOURS) == set(Level)
