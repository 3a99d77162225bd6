"""Diagnostic levels: one definition for /diagnostics, the monitor's entries and the watchdog.

The values are diagnostic_msgs/DiagnosticStatus's byte constants (OK=0, WARN=1, ERROR=2,
STALE=3), so a :class:`Level` goes into a DiagnosticStatus.level unchanged and comparisons
order by severity (``max`` of several levels is the worst). STALE means "no current data"
(diagnostic_aggregator's word for an entry that stopped updating).

Log severities are a different thing (how loud a log line is, not the state of something
watched): they are :mod:`overlay_manager.system.workers`'s ``LogLevel`` words.
"""

from __future__ import annotations

import enum


class Level(enum.IntEnum):
    """Severity of one diagnostic entry (diagnostic_msgs/DiagnosticStatus.level)."""

    OK = 0
    WARN = 1
    ERROR = 2
    STALE = 3


OK = Level.OK
WARN = Level.WARN
ERROR = Level.ERROR
STALE = Level.STALE
