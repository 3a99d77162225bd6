"""The one bounded poll (overlay_manager.system.waiting.wait_for) and log tail, as the lab uses them."""
import time

import pytest

from overlay_manager.lab.campus.errors import LabError, LabTimeout
from overlay_manager.lab.campus.system import wait_for as lab_wait_for
from overlay_manager.system.waiting import WaitTimeout, tail, wait_for


def test_returns_the_first_truthy_value():
    calls = []

    def check():
        calls.append(1)
        return "ready" if len(calls) >= 3 else None

    assert wait_for("three calls", check, timeout=5, interval=0.001) == "ready"
    assert len(calls) == 3


def test_timeout_names_what_last_error_and_state():
    def check():
        raise ConnectionRefusedError("port closed")

    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as ei:
        wait_for("the server", check, timeout=0.05, interval=0.01, detail=lambda: "3 of 4 up")
    assert time.monotonic() - t0 < 2
    msg = str(ei.value)
    assert "waiting for the server" in msg and "port closed" in msg and "last state: 3 of 4 up" in msg
    assert isinstance(ei.value, TimeoutError)


def test_fatal_errors_end_the_wait_at_once():
    with pytest.raises(KeyError):
        wait_for("never", lambda: {}["x"], timeout=30, fatal=(KeyError,))


def test_lab_flavour_raises_lab_timeout_and_passes_lab_errors():
    with pytest.raises(LabTimeout, match="waiting for nothing"):
        lab_wait_for("nothing", lambda: False, timeout=0.02, interval=0.005)

    def died():
        raise LabError("daemon exited with 1")

    t0 = time.monotonic()
    with pytest.raises(LabError, match="daemon exited"):
        lab_wait_for("the daemon", died, timeout=30)
    assert time.monotonic() - t0 < 1


def test_tail(tmp_path):
    log = tmp_path / "d.log"
    log.write_text("a\nb\nc\nd\n")
    assert tail(log, 2) == "c | d"
    assert tail(log, 3, sep="\n") == "b\nc\nd"
    assert tail(tmp_path / "missing.log") == f"(no {tmp_path / 'missing.log'})"
