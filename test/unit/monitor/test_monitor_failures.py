"""OverlayMonitor against a misbehaving tailscaled: every failure becomes a reported error, never
an exception, and the monitor recovers as soon as tailscaled answers again."""
import math
import os
import threading
import time

import pytest

from overlay_manager.core.config import apply_overrides, load_robot_config
from overlay_manager.core.json_fields import UINT64_MAX
from overlay_manager.core.peers import PATH_DIRECT, PATH_OFFLINE, PATH_UNKNOWN
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.monitor.readings import ERROR, HANG_REPORT_S, OK, STATUS_TIMEOUT_S
from overlay_manager.tailscaled.localapi import LocalAPI

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
EXAMPLE = os.path.join(ROOT, "config", "robot.example.yaml")

# mode -> words the error must contain (what an operator needs to tell them apart)
BROKEN = {
    "garbage": "broken answer",
    "truncated": "broken answer",
    "close": "broken answer",
    "http500": "HTTP 500",
}


def _monitor(fake, tmp_path):
    cfg = load_robot_config(EXAMPLE)
    cfg = apply_overrides(cfg, {"hosts_file": str(tmp_path / "hosts")}, "test")
    return OverlayMonitor(cfg, LocalAPI(fake.socket_path), env={})


def _good_then(fake, tmp_path):
    m = _monitor(fake, tmp_path)
    m.poll()
    assert not m.freshness().stale and m.find("robotb").path == PATH_DIRECT
    return m


@pytest.mark.parametrize("mode", sorted(BROKEN))
def test_broken_answer_is_reported_and_recovered(fake_tailscaled, tmp_path, mode):
    m = _good_then(fake_tailscaled, tmp_path)
    fake_tailscaled.mode = mode
    changes = m.poll()  # must not raise
    fresh = m.freshness()
    assert fresh.stale and BROKEN[mode] in fresh.error, fresh
    assert [(e.old_path, e.new_path) for e in changes] == [(PATH_DIRECT, PATH_UNKNOWN)]
    peer = m.find("robotb")  # still listed (name, addresses), path no longer claimed
    assert peer.path == PATH_UNKNOWN and not peer.online and peer.addresses
    (diag,) = m.diagnostics()
    assert diag.level == ERROR and diag.message.startswith("stale: tailscaled last answered")
    assert m.poll() == []  # the same failure again is no new change
    fake_tailscaled.mode = "good"
    changes = m.poll()
    assert not m.freshness().stale and m.error == ""
    assert [(e.old_path, e.new_path) for e in changes] == [(PATH_UNKNOWN, PATH_DIRECT)]
    assert {d.name: d for d in m.diagnostics()}["overlay"].level == OK
    m.close()


def test_daemon_gone_marks_peers_offline_and_recovers(fake_tailscaled, tmp_path):
    m = _good_then(fake_tailscaled, tmp_path)
    fake_tailscaled.stop()
    changes = m.poll()
    assert [(e.old_path, e.new_path) for e in changes] == [(PATH_DIRECT, PATH_OFFLINE)]
    assert m.reading.daemon_gone and "start tailscaled" in m.freshness().error
    fake_tailscaled.start()
    m.poll()
    assert not m.freshness().stale and m.find("robotb").path == PATH_DIRECT
    m.close()


def test_huge_numbers_are_clamped_not_fatal(fake_tailscaled, tmp_path):
    m = _good_then(fake_tailscaled, tmp_path)
    fake_tailscaled.mode = "huge"
    m.poll()
    assert not m.freshness().stale, m.error
    peer = m.find("robotb")
    assert peer.rx_bytes == 0            # 1e400 -> inf -> unknown
    assert peer.tx_bytes == UINT64_MAX   # 2^70 -> clamped to the field's range
    m.close()


def test_hang_is_reported_while_the_read_runs_and_bounded(fake_tailscaled, tmp_path):
    m = _good_then(fake_tailscaled, tmp_path)
    fake_tailscaled.mode = "hang"
    done = threading.Event()
    start = time.monotonic()
    t = threading.Thread(target=lambda: (m.poll(), done.set()), daemon=True)
    t.start()
    seen = None
    while not done.is_set() and time.monotonic() - start < STATUS_TIMEOUT_S + 2:
        f = m.freshness()
        if f.stale and seen is None:
            seen = time.monotonic() - start
        time.sleep(0.02)
    took = time.monotonic() - start
    assert done.is_set(), f"poll against a hung tailscaled did not return in {took:.1f} s"
    assert seen is not None and HANG_REPORT_S <= seen < STATUS_TIMEOUT_S, seen
    assert took < STATUS_TIMEOUT_S + 0.5
    assert "did not answer" in m.error
    fake_tailscaled.mode = "good"
    m.poll()
    assert not m.freshness().stale
    m.close()


def test_stale_by_age_when_nobody_polls(fake_tailscaled, tmp_path):
    now = [100.0]
    m = _monitor(fake_tailscaled, tmp_path)
    m.clock = lambda: now[0]
    m.poll()
    assert not m.freshness().stale
    now[0] += m.stale_after_s + 0.1
    f = m.freshness()
    assert f.stale and "not read for more than" in f.error and f.age_s > m.stale_after_s
    m.close()


def test_poll_interval_sets_when_the_status_turns_stale(fake_tailscaled, tmp_path):
    """The node says how often it reads (slower while the IPN bus is open): three missed reads,
    1.5 s at least, make the status stale."""
    now = [100.0]
    m = _monitor(fake_tailscaled, tmp_path)
    m.clock = lambda: now[0]
    assert m.stale_after_s == max(3.0 / m.cfg.node.poll_rate, 1.5)
    m.set_poll_interval(2.0)
    m.poll()
    now[0] += 5.9
    assert not m.freshness().stale
    now[0] += 0.2
    assert m.freshness().stale and "not read for more than 6.0 s" in m.freshness().error
    m.set_poll_interval(0.1)
    assert m.stale_after_s == 1.5
    m.close()


def test_freshness_changes_at_names_the_moment_it_turns_stale(fake_tailscaled, tmp_path):
    """The reporting thread sleeps until freshness_changes_at: at that moment (and not before)
    freshness turns stale, for an aging answer and for a read that hangs."""
    now = [100.0]
    m = _monitor(fake_tailscaled, tmp_path)
    m.clock = lambda: now[0]
    assert m.freshness_changes_at(now[0]) == math.inf          # never read: already stale
    m.poll()
    at = m.freshness_changes_at(now[0])
    assert at == 100.0 + m.stale_after_s
    now[0] = at - 0.01
    assert not m.freshness().stale
    now[0] = at + 0.01
    assert m.freshness().stale and m.freshness_changes_at(now[0]) == math.inf
    m.poll()                                                    # fresh again
    m._poll_started = now[0]                                    # a read starts and does not answer
    hang = m.freshness_changes_at(now[0])
    assert hang == now[0] + HANG_REPORT_S < now[0] + m.stale_after_s
    base = now[0]
    now[0] = base + HANG_REPORT_S - 0.01
    assert not m.freshness().stale
    now[0] = base + HANG_REPORT_S + 0.01
    assert m.freshness().stale and "has not answered" in m.freshness().error
    m._poll_started = None
    fake_tailscaled.mode = "http500"
    m.poll()
    assert m.freshness_changes_at(now[0]) == math.inf           # failing: nothing left to turn
    m.close()


def test_never_read_is_stale_with_nan_age(tmp_path):
    from overlay_manager.testing.tsfake import FakeTailscaled
    fake = FakeTailscaled()
    fake.stop()
    m = _monitor(fake, tmp_path)
    assert m.poll() == []
    f = m.freshness()
    assert f.stale and math.isnan(f.age_s) and "tailscaled" in f.error
    (diag,) = m.diagnostics()
    assert diag.level == ERROR and "not reachable" in diag.message
    m.close()
    fake.close()


def test_close_cancels_queued_pings_on_any_python(fake_tailscaled, tmp_path):
    m = _good_then(fake_tailscaled, tmp_path)
    fake_tailscaled.mode = "hang"
    t = threading.Thread(target=m.ping_watched, kwargs={"timeout_s": 0.5}, daemon=True)
    t.start()
    time.sleep(0.1)
    m.close()  # no cancel_futures (Python 3.8); must not raise or wait for the hung ping
    t.join(3)
    assert not t.is_alive()


def test_trickled_answer_is_bounded_like_a_hang(fake_tailscaled, tmp_path):
    m = _good_then(fake_tailscaled, tmp_path)
    fake_tailscaled.mode = "trickle"  # every recv gets a byte in time; the whole answer never does
    start = time.monotonic()
    m.poll()
    took = time.monotonic() - start
    assert took < STATUS_TIMEOUT_S + 0.5, f"a trickling tailscaled held the poll for {took:.1f} s"
    assert m.freshness().stale and "did not answer" in m.error
    fake_tailscaled.mode = "good"
    m.poll()
    assert not m.freshness().stale
    m.close()
