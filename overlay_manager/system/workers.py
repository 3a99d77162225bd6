"""Periodic worker threads that survive any exception, a watchdog view of them, and a log queue.

The node runs every periodic job (status poll, pings, NAT check, preflight, iperf3 supervision,
reporting) in a :class:`Worker`. A worker catches every exception at the top of its loop, keeps
the error for reports, hands it to a log callback only when it differs from the previous one, and
goes on. :meth:`Worker.health` tells a watchdog whether the thread died, is stuck in one cycle
for longer than it may take, or failed its last cycle.

:class:`LogQueue` moves log calls off the threads that must not block: rospy 1.15's log calls can
block on an XML-RPC call to the ROS master, and a master behind a dead overlay holds them until
TCP gives up. Threads put (severity, text) here and return at once; one thread writes them out.

Two kinds of level, on purpose: a log line's severity (``LOG_*`` words, how loud a line is, mapped
to rospy.logdebug ... rospy.logerr) and a worker's health (core.levels.Level, the state of a
thread as /diagnostics shows it).

No ROS import here: everything takes plain callables and is unit-tested with fakes.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Deque, Optional, Tuple

from overlay_manager.core.levels import Level

# log severities given to a LogQueue's writer (not diagnostic levels: see the module docstring)
LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR = "debug", "info", "warn", "error"

LogFn = Callable[[str, str], None]
"""(severity, text) -> None: where a worker reports failures and recoveries (severity: LOG_*)."""


class LogQueue:
    """Log lines written by one background thread, so producers never wait on the writer.

    Args:
        write: (level, text) -> None, e.g. a function calling rospy.loginfo and friends; it may
            block for a long time, only this queue's own thread waits for it.
        maxlen: lines kept while the writer is blocked; older lines are dropped and counted.
    """

    def __init__(self, write: LogFn, maxlen: int = 500) -> None:
        self._write = write
        self._lines: Deque[Tuple[str, str]] = collections.deque(maxlen=maxlen)
        self._dropped = 0
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="overlay-log", daemon=True)
        self._thread.start()

    def put(self, level: str, text: str) -> None:
        """Queue one line; never blocks on the writer."""
        with self._cv:
            if len(self._lines) == self._lines.maxlen:
                self._dropped += 1
            self._lines.append((level, text))
            self._cv.notify()

    def __call__(self, level: str, text: str) -> None:
        """Same as put, so a LogQueue is a LogFn."""
        self.put(level, text)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._lines and not self._stop:
                    self._cv.wait()
                if not self._lines:
                    return
                level, text = self._lines.popleft()
                dropped, self._dropped = self._dropped, 0
            try:
                if dropped:
                    self._write(LOG_WARN, f"{dropped} log lines dropped while logging was blocked")
                self._write(level, text)
            except Exception:  # noqa: BLE001 - a broken log sink must not end logging
                pass

    def close(self, timeout_s: float = 1.0) -> None:
        """Write what is queued (waiting at most timeout_s seconds), then stop the thread."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout_s)


@dataclass(frozen=True)
class WorkerHealth:
    """What a watchdog knows about one worker at one moment.

    level: core.levels.Level: OK, WARN (last cycle raised, the thread goes on), ERROR (dead or stuck).
    message: "" when OK; otherwise one line naming the thread, which stays the same while the
        condition lasts (so a report that compares messages does not change every cycle).
    """

    name: str
    level: Level
    message: str                 # "" when OK
    cycles: int                  # completed cycles (successful or not)
    failures: int                # cycles that raised, in a row ("" error = 0)
    last_error: str              # the last cycle's exception, "" = it succeeded
    since_beat_s: float          # seconds since the last cycle ended; NaN = none ended yet


class Worker:
    """A daemon thread that calls ``fn`` every ``period_s`` seconds until stopped.

    Args:
        name: thread name, shown in reports (e.g. "overlay-poll").
        fn: one cycle of work. Any exception it raises is caught, kept and reported; the loop
            goes on after the usual period.
        period_s: seconds from the start of one cycle to the start of the next (a cycle that
            overruns is followed at once by the next). ``math.inf``: run once.
        stuck_after_s: a cycle running longer than this is reported stuck (ERROR); choose it
            above the slowest legitimate cycle (e.g. the call's own timeout plus margin).
        log: (level, text) callback for the first failure of a kind, and for recovery; use a
            LogQueue so a blocked logger never delays the cycle.
        clock: monotonic seconds (tests inject a fake).
        start: start the thread now.
    """

    def __init__(self, name: str, fn: Callable[[], None], period_s: float, stuck_after_s: float,
                 log: Optional[LogFn] = None, clock: Callable[[], float] = time.monotonic,
                 start: bool = True) -> None:
        self.name = name
        self.fn = fn
        self.period_s = period_s
        self.stuck_after_s = stuck_after_s
        self._log = log or (lambda _level, _text: None)
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()        # guards the counters below (no I/O under it)
        self._cycles = 0
        self._failures = 0
        self._last_error = ""
        self._cycle_started: Optional[float] = None
        self._last_beat: Optional[float] = None
        self._died = ""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start the thread (when constructed with start=False)."""
        self._thread.start()

    def wake(self) -> None:
        """Run the next cycle now instead of at the end of the period."""
        self._wake.set()

    def stop(self) -> None:
        """Ask the loop to end after the current cycle (does not wait)."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout_s: float) -> None:
        """Wait up to timeout_s seconds for the thread to end."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                start = self._clock()
                self._cycle(start)
                if math.isinf(self.period_s):
                    return
                delay = self.period_s - (self._clock() - start)
                if delay > 0:
                    self._wake.wait(delay)
                self._wake.clear()
        except BaseException as exc:  # noqa: BLE001 - recorded for the watchdog, then the thread ends
            with self._lock:
                self._died = f"{type(exc).__name__}: {exc}"
            raise

    def _cycle(self, start: float) -> None:
        with self._lock:
            self._cycle_started = start
        error = ""
        try:
            self.fn()
        except Exception as exc:  # noqa: BLE001 - every periodic thread survives any exception
            error = describe(exc)
        with self._lock:
            previous, failures = self._last_error, self._failures
            self._cycles += 1
            self._cycle_started = None
            self._last_beat = self._clock()
            self._last_error = error
            self._failures = failures + 1 if error else 0
        if error and error != previous:
            self._log(LOG_ERROR, f"{self.name}: {error} (the thread goes on; logged once until it changes)")
        elif previous and not error:
            self._log(LOG_INFO, f"{self.name}: works again after {failures} failed cycles")

    def health(self, now: Optional[float] = None) -> WorkerHealth:
        """Dead, stuck, failing or fine, as of now (monotonic seconds; default: the clock)."""
        now = self._clock() if now is None else now
        with self._lock:
            cycles, failures, error = self._cycles, self._failures, self._last_error
            started, beat, died = self._cycle_started, self._last_beat, self._died
        since = now - beat if beat is not None else math.nan

        def out(level: Level, message: str) -> WorkerHealth:
            return WorkerHealth(self.name, level, message, cycles, failures, error, since)

        if died or (not self._thread.is_alive() and self._thread.ident is not None
                    and not self._stop.is_set() and not math.isinf(self.period_s)):
            return out(Level.ERROR, f"thread {self.name} died: {died or 'ended unexpectedly'}")
        if started is not None and now - started > self.stuck_after_s:
            return out(Level.ERROR, f"thread {self.name} is stuck: one cycle has run longer than "
                          f"{self.stuck_after_s:.1f} s")
        if error:
            return out(Level.WARN, f"thread {self.name}: last cycle failed: {error}")
        return out(Level.OK, "")


def describe(exc: BaseException, limit: int = 300) -> str:
    """One line naming an exception's type and message, shortened to about limit characters."""
    text = str(exc).replace("\n", " ").strip()
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

