"""Worker threads survive any exception, the watchdog view names dead and stuck threads, and a
LogQueue never makes its producers wait for a blocked writer."""
import http.client
import threading
import time

import pytest

from overlay_manager.core.levels import Level
from overlay_manager.system.workers import LOG_ERROR, LOG_INFO, LogQueue, Worker, describe


def _until(pred, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_every_exception_is_caught_reported_and_logged_once():
    errors = [http.client.BadStatusLine("x"), http.client.IncompleteRead(b"ab", 10), OverflowError("big"),
              ValueError("json"), RuntimeError("serialize")]
    calls = []
    logged = []

    def cycle():
        calls.append(1)
        if len(calls) <= 10:
            raise errors[min(len(calls) - 1, len(errors) - 1)]  # the last one repeats

    w = Worker("t-poll", cycle, 0.01, 5.0, log=lambda lv, tx: logged.append((lv, tx)))
    assert _until(lambda: len(calls) > 12), "the worker stopped after an exception"
    w.stop()
    w.join(1)
    errs = [tx for lv, tx in logged if lv == LOG_ERROR]
    assert len(errs) == len(errors), errs  # once per distinct error, not once per cycle
    assert "BadStatusLine" in errs[0] and "IncompleteRead" in errs[1] and "OverflowError" in errs[2]
    assert any(lv == LOG_INFO and "works again after 10 failed cycles" in tx for lv, tx in logged), logged


def test_health_reports_failure_then_ok():
    fail = [True]

    def cycle():
        if fail[0]:
            raise OverflowError("cannot convert float infinity to integer")

    w = Worker("t-x", cycle, 0.01, 5.0)
    assert _until(lambda: w.health().level == Level.WARN)
    h = w.health()
    assert "t-x" in h.message and "OverflowError" in h.message and h.failures >= 1
    fail[0] = False
    assert _until(lambda: w.health().level == Level.OK)
    w.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_thread_is_an_error_naming_it():
    def cycle():
        raise SystemExit("gone")  # not an Exception: escapes the loop and ends the thread

    w = Worker("t-dead", cycle, 0.01, 5.0)
    assert _until(lambda: w.health().level == Level.ERROR)
    h = w.health()
    assert h.message.startswith("thread t-dead died") and "SystemExit" in h.message


def test_stuck_cycle_is_an_error_with_a_stable_message():
    release = threading.Event()
    w = Worker("t-stuck", lambda: release.wait(5), 0.01, 0.2)
    assert _until(lambda: w.health().level == Level.ERROR)
    first = w.health().message
    time.sleep(0.1)
    assert w.health().message == first and "t-stuck is stuck" in first  # no running count
    release.set()
    assert _until(lambda: w.health().level == Level.OK)
    w.stop()


def test_run_once_worker_ending_is_not_death():
    w = Worker("t-once", lambda: None, float("inf"), 1.0)
    w.join(2)
    assert w.health().level == Level.OK and w.health().cycles == 1


def test_wake_runs_the_next_cycle_early():
    calls = []
    w = Worker("t-wake", lambda: calls.append(time.monotonic()), 30.0, 5.0)
    assert _until(lambda: len(calls) == 1)
    w.wake()
    assert _until(lambda: len(calls) == 2, 1.0)
    w.stop()


def test_log_queue_never_blocks_producers():
    gate = threading.Event()
    written = []

    def slow_write(level, text):  # like a rospy log call waiting for an unreachable master
        gate.wait(10)
        written.append(text)

    q = LogQueue(slow_write, maxlen=5)
    start = time.monotonic()
    for i in range(50):
        q.put(LOG_ERROR, f"line {i}")
    assert time.monotonic() - start < 0.5
    gate.set()
    assert _until(lambda: "line 49" in written)
    assert any("dropped" in t for t in written)
    q.close()


def test_describe_is_one_short_line():
    text = describe(ValueError("a\nb" + "x" * 1000))
    assert text.startswith("ValueError: a b") and "\n" not in text and len(text) < 340
