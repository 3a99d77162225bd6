"""The failover measurements the campus and relay tests assert on, from made-up recorder events
(no lab needed): rates, gaps, DERP latency, path changes, and the checks failing when they should."""
import pytest
from path_failover import FailoverRun, frame_rate_hz, longest_gap_s, peer_path


def _frames(*times, lat=10.0):
    return [{"ev": "frame", "t": t, "lat_ms": lat} for t in times]


def _change(t, old, new):
    return {"ev": "change", "t": t, "peer": "robot1", "old": old, "new": new}


def _run(changes, frames=None):
    frames = _frames(7.0, 8.0, 9.0, 10.5, 12.0, 14.0, 16.0, 21.0) if frames is None else frames
    return FailoverRun(t_break=10.0, t_derp=12.0, t_restore=15.0, t_back=20.0, t_end=23.0, frames=frames,
                       changes=changes)


def test_rates_gaps_and_latency():
    frames = _frames(0.0, 0.5, 1.0, 3.0)
    assert frame_rate_hz(frames, 0.0, 2.0) == 1.5 and frame_rate_hz(frames, 2.0, 2.0) == 0.0
    assert longest_gap_s(frames) == 2.0 and longest_gap_s(frames[:1]) is None
    run = _run([], frames=_frames(11.0) + _frames(12.0, 13.0, lat=100.0) + _frames(14.0, lat=300.0))
    assert run.derp_latency_p50_ms() == 100.0       # only frames between derp and the restore
    assert run.count(12.0, 15.0) == 3 and run.rate_hz(12.0, 14.0) == 1.0


def test_measured_and_the_switch_back():
    run = _run([_change(11.0, "direct", "derp"), _change(19.0, "derp", "direct")])
    m = run.measured("to_direct_s")
    assert m == {"to_derp_s": 2.0, "to_direct_s": 5.0, "longest_gap_s": 5.0, "latency_derp_p50_ms": 10.0,
                 "path_changes": ["direct->derp @+1.0s", "derp->direct @+9.0s"]}
    run.assert_switched_and_back("direct", m)


@pytest.mark.parametrize("changes,frames", [
    ([_change(19.0, "derp", "direct")], None),                                   # no switch to derp
    ([_change(11.0, "peer-relay", "derp"), _change(19.0, "derp", "direct")], None),  # from another path
    ([_change(11.0, "direct", "derp"), _change(14.0, "derp", "direct")], None),  # back before the restore
    ([_change(11.0, "direct", "derp"), _change(19.0, "derp", "direct")], _frames(7.0, 12.0)),  # stream stopped
])
def test_switch_checks_fail_when_the_record_says_otherwise(changes, frames):
    run = _run(changes, frames)
    with pytest.raises(AssertionError):
        run.assert_switched_and_back("direct", run.measured("to_direct_s"))


def test_peer_path_predicate():
    pred = peer_path("laptop", "robot1", "derp")
    assert pred({"ev": "peers", "node": "/laptop/overlay_manager", "paths": {"robot1": ["derp", "lab"]}})
    assert not pred({"ev": "peers", "node": "/laptop/overlay_manager", "paths": {"robot1": ["direct"]}})
    assert not pred({"ev": "peers", "node": "/robot1/overlay_manager", "paths": {"robot1": ["derp"]}})
    assert not pred({"ev": "peers", "node": "/laptop/overlay_manager", "paths": {}})
