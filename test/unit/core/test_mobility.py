"""core/mobility.py: stalls, roams, the explanation of a path change and the actual home region."""

from __future__ import annotations

import math

from overlay_manager.core.mobility import (
    CAUSE_ROAM,
    CAUSE_STALL,
    EPISODE_KEEP_S,
    StallTracker,
    actual_home,
    explain,
    parse_default_route,
    pick_other_region,
)
from overlay_manager.core.nat import NatInfo

ROUTE = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
tailscale0\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0
wlan0\t00000000\t0100000A\t0003\t0\t0\t600\t00000000\t0\t0\t0
eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0
"""


def test_default_route_lowest_metric_not_tailscale():
    assert parse_default_route(ROUTE) == ("eth0", "192.168.1.1")


def test_no_default_route():
    assert parse_default_route(ROUTE.splitlines()[0] + "\neth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\n") \
        == ("", "")
    assert parse_default_route("") == ("", "")


def test_a_stall_needs_stall_after_without_an_answer():
    t = StallTracker(stall_after_s=0.5)
    t.answered("a", 100.0)
    assert not t.unanswered("a", 100.1, 100.4)      # 0.4 s since the last answer
    assert t.unanswered("a", 100.2, 100.6)          # 0.6 s: a stall
    assert not t.unanswered("a", 100.6, 101.2)      # the same stall, not a new one
    ep = t.episodes(100.6)["a"]
    assert (ep.cause, ep.stopped, ep.detected, ep.resumed) == (CAUSE_STALL, 100.0, 100.6, 0.0)
    t.answered("a", 101.0)
    assert t.episodes(101.0)["a"].resumed == 101.0
    assert t.unanswered("a", 101.1, 101.6)          # a new stall after it resumed
    assert t.episodes(101.6)["a"].stopped == 101.0


def test_a_peer_never_answered_counts_from_its_first_probe():
    t = StallTracker(stall_after_s=0.5)
    assert not t.unanswered("a", 10.0, 10.3)
    assert t.unanswered("a", 10.2, 10.6)
    assert t.episodes(10.6)["a"].stopped == 10.0


def test_cooldown_between_reevaluations():
    t = StallTracker(stall_after_s=0.5, cooldown_s=2.0)
    assert t.may_act(10.0)
    assert not t.may_act(11.9)
    assert t.may_act(12.0)


def test_roam_and_action_and_forget():
    t = StallTracker(stall_after_s=0.5)
    t.answered("a", 99.8)
    t.roamed(["a", "b"], 99.5, 100.0)
    t.note_action(["a", "b"], "rebind")
    eps = t.episodes(100.0)
    assert eps["a"].cause == CAUSE_ROAM and eps["a"].stopped == 99.8 and eps["a"].action == "rebind"
    assert eps["b"].stopped == 99.5
    assert t.episodes(100.0 + EPISODE_KEEP_S + 1) == {}
    t.forget(["a"])
    assert set(t.episodes(100.0)) == {"a"}


def test_explain_only_episodes_since_the_previous_change():
    t = StallTracker(stall_after_s=0.5)
    t.answered("a", 10.0)
    t.unanswered("a", 10.2, 10.6)
    t.note_action(["a"], "rebind")
    t.answered("a", 10.8)
    ep = t.episodes(11.0)["a"]
    why = explain(ep, previous_change=5.0)
    assert (why.cause, why.stopped, why.resumed) == (CAUSE_STALL, 10.0, 10.8)
    assert "rebind" in why.detail
    assert explain(ep, previous_change=10.7).cause == ""   # a later change: not this episode's
    assert explain(None, 0.0).cause == ""


def test_actual_home_replaces_the_netchecks_pick():
    nat = NatInfo(known=True, preferred_derp="a", preferred_derp_latency_ms=1.0,
                  summary="UDP works; home DERP a (Alpha) (1.0 ms)",
                  region_latency=(("a", "Alpha", 1.0), ("b", "Beta", 2.5)))
    home = actual_home(nat, "b", {"b": "Beta"})
    assert home.summary == "UDP works; home DERP b (Beta) (2.5 ms)"
    assert (home.preferred_derp, home.preferred_derp_latency_ms, home.preferred_derp_name) == ("b", 2.5, "Beta")
    assert actual_home(nat, "", {}) is nat
    assert math.isnan(actual_home(nat, "c", {}).preferred_derp_latency_ms)


def test_pick_other_region():
    assert pick_other_region("a", {"a": 0.001, "b": 0.01, "c": 0.002}) == "c"
    assert pick_other_region("a", {"a": 0.001}) == ""


def test_probe_timeout_ends_when_a_stall_would_be_declared():
    t = StallTracker(stall_after_s=0.5)
    assert t.probe_timeout("a", 10.0) == 0.5            # never answered
    t.answered("a", 10.0)
    assert abs(t.probe_timeout("a", 10.2) - 0.3) < 1e-9
    assert t.probe_timeout("a", 10.45) == 0.1           # the floor
    t.unanswered("a", 10.2, 10.5)
    assert t.probe_timeout("a", 10.6) == 0.5            # an open stall: full timeout


def test_a_change_waits_for_its_traffic_to_resume():
    from overlay_manager.core.mobility import Episode, Explanation, completed
    why = Explanation(CAUSE_STALL, "x", 10.0, 0.0)
    open_ep = Episode(CAUSE_STALL, 10.0, 10.5)
    assert completed(why, open_ep, 0.3, 2.0) is None                     # wait
    assert completed(why, open_ep, 2.0, 2.0) is why                      # waited long enough
    done = completed(why, Episode(CAUSE_STALL, 10.0, 10.5, 10.7), 0.3, 2.0)
    assert done is not None and done.resumed == 10.7
    assert completed(why, Episode(CAUSE_STALL, 12.0, 12.5, 12.7), 0.3, 2.0) is None  # another episode
    plain = Explanation()
    assert completed(plain, None, 0.0, 2.0) is plain
