"""The lab benchmarks' report files and pure helpers (bench, bench_camera, demo), without a lab."""
import json
import time
from pathlib import Path

import pytest

from overlay_manager.lab.bench import camera as bench_camera
from overlay_manager.lab.bench import fleet as bench_fleet
from overlay_manager.lab.bench.report import replot, write_report
from overlay_manager.lab.bench.run import imp_label, impairments
from overlay_manager.lab.campus import camera_streams
from overlay_manager.lab.demo.run import ROBOT, PathSeen

REPO_ROOT = Path(__file__).resolve().parents[3]
CAMERA_RUN = {
    "meta": {"date": "2026-11-22 19:24", "seconds_per_stream": 8.0, "uplink_mbit": 30.0,
             "budgets_kbps": [8000.0], "cores": 2, "image": "640x480 rgb8 30 Hz", "control_hz": 50,
             "run_seconds": 300, "errors": ["peer-relay: timed out"]},
    "columns": ["direct", "derp"],
    "results": {
        "direct": {"control_idle": {"rtt_p50_ms": 1.8, "rtt_p99_ms": 12.2},
                   "raw": {"rate_hz": 29.9, "latency_p50_ms": 20.0, "latency_p99_ms": 40.0, "psnr_mean": 99.0,
                           "psnr_p5": 99.0, "bytes_per_s": 27.6e6, "control": {"rtt_p50_ms": 2.0, "rtt_p99_ms": 9.0}},
                   "link-aware": {"rate_hz": 30.0, "latency_p50_ms": 10.0, "latency_p99_ms": 20.0,
                                  "psnr_mean": 36.04, "psnr_p5": 35.0,
                                  "bytes_per_s": 1e6, "encoder_cpu_pct": 12.5,
                                  "state": {"quality": 80, "rate_hz": 30.0}},
                   "h264": {"rate_hz": 30.0, "latency_p50_ms": 8.0, "latency_p99_ms": 15.0, "psnr_mean": 41.2,
                            "psnr_p5": 40.1, "bytes_per_s": 0.25e6, "encoder_cpu_pct": 4.0,
                            "state": {"quality": None, "rate_hz": 30.0}}},
        "derp": {"control_idle": {"rtt_p50_ms": 3.0, "rtt_p99_ms": 30.0},
                 "raw": {"rate_hz": 2.0, "latency_p50_ms": None, "latency_p99_ms": None},
                 "link-aware 8": {"rate_hz": 29.0, "latency_p50_ms": 50.0, "latency_p99_ms": 90.0,
                                  "bytes_per_s": 0.9e6, "encoder_cpu_pct": None}}},
}


def _recording_plot(calls):
    def plot(data, out_dir):
        calls.append((data["meta"]["date"], out_dir))
        (out_dir / "plot.png").write_bytes(b"png")
    return plot


def test_write_report_writes_json_markdown_and_plots(tmp_path):
    calls = []
    out = tmp_path / "new" / "dir"
    md = write_report(out, "bench_camera", CAMERA_RUN, bench_camera.render_markdown, _recording_plot(calls))
    assert json.loads((out / "bench_camera.json").read_text()) == CAMERA_RUN
    assert (out / "bench_camera.md").read_text() == md == bench_camera.render_markdown(CAMERA_RUN)
    assert calls == [("2026-11-22 19:24", out)] and (out / "plot.png").exists()


def test_replot_rerenders_without_touching_the_json(tmp_path, capsys):
    src = tmp_path / "saved.json"
    src.write_text(json.dumps(CAMERA_RUN))
    calls = []
    assert replot(src, tmp_path / "out", "bench_camera", bench_camera.render_markdown, _recording_plot(calls)) == 0
    assert not (tmp_path / "out" / "bench_camera.json").exists()
    assert (tmp_path / "out" / "bench_camera.md").read_text() == capsys.readouterr().out.rstrip("\n") + "\n"
    assert len(calls) == 1


def test_camera_markdown_rows():
    md = bench_camera.render_markdown(CAMERA_RUN).splitlines()
    assert "| direct | (no camera) | - | - | - | 1.8 / 12.2 | - | - | - |" in md
    assert "| direct | raw | 29.9 | lossless / lossless | 20 / 40 | 2.0 / 9.0 | 220.80 | - | - |" in md
    assert "| direct | link-aware JPEG | 30.0 | 36.0 / 35.0 | 10 / 20 | - / - | 8.00 | 12.5 | q80, 30 Hz |" in md
    assert "| direct | link-aware H.264 | 30.0 | 41.2 / 40.1 | 8 / 15 | - / - | 2.00 | 4.0 | 30 Hz |" in md
    assert "| derp | link-aware JPEG, budget 8 Mbit/s | 29.0 | - / - | 50 / 90 | - / - | 7.20 | - | - |" in md
    assert "| derp | raw | 2.0 | - / - | - / - | - / - | 0.00 | - | - |" in md
    assert md[-1] == "Not measured: peer-relay: timed out"


def test_tier_goals_and_cpu_window():
    tiers = {"direct": {"rate_hz": 29.3, "psnr_mean": 45.3}, "relayed": {"rate_hz": 29.2, "psnr_mean": 41.8,
                                                                          "mbit": 2.5}, "encoder_cpu_pct": 19.9}
    goals = bench_camera.tier_goals(tiers, {"encoder_cpu_pct": 11.3})
    assert goals["direct psnr_mean"] == {"value": 45.3, "goal": 45.0, "met": True}
    assert goals["relayed mbit"]["met"] is False  # at most 2 Mbit/s
    assert goals["cpu_ratio"] == {"value": 1.76, "goal": 1.6, "met": False}
    assert bench_camera.tier_goals({"direct": {}}, None)["cpu_ratio"]["met"] is None
    assert "cpu_ratio_full" not in goals
    # beside it, against the direct viewer alone on the full tier
    goals = bench_camera.tier_goals(tiers, {"encoder_cpu_pct": 11.3}, {"encoder_cpu_pct": 13.0})
    assert goals["cpu_ratio_full"] == {"value": 1.53, "goal": 1.6, "met": True}
    assert goals["cpu_ratio"]["met"] is False
    # CPU over the window both viewers received in: 0.2 CPU s in the 2 s between t=1 and t=3
    samples = [(0.0, 5.0), (1.0, 5.5), (2.0, 5.6), (3.0, 5.7), (4.0, 9.0)]
    assert bench_camera._cpu_in_window(samples, 1.0, 3.0) == pytest.approx(10.0)
    assert bench_camera._cpu_in_window(samples, 1.5, 2.5) is None


def test_tier_markdown_from_the_committed_run():
    data = json.loads((REPO_ROOT / "docs" / "bench_camera_tiers.json").read_text())
    md = bench_camera.render_tiers_markdown(data)
    assert "| H.264 | tiers | laptop (direct) | `/camera/image_raw/link_aware_h264/full` |" in md
    assert "| H.264 | one stream | laptop2 (derp) | `/camera/image_raw/link_aware_h264` |" in md
    assert "Goals, h264 tiers: " in md and "cpu_ratio 1.76 (goal <= 1.6): missed" in md


def test_stream_labels():
    assert bench_camera.stream_label("raw") == "raw"
    assert bench_camera.stream_label("link-aware") == "link-aware JPEG"
    assert bench_camera.stream_label("h264 8") == "link-aware H.264, budget 8 Mbit/s"


def test_encoder_cpu_counts_only_busy_seconds():
    samples = [(0.0, 1.0), (1.0, 1.005), (2.0, 1.505), (3.0, None), (4.0, 2.0), (5.0, 2.25)]
    # busy: 1->2 s (0.5 s of CPU) and 4->5 s (0.25 s); idle and vanished intervals are left out
    assert camera_streams.active_cpu_pct(samples) == pytest.approx(37.5)
    assert camera_streams.active_cpu_pct([(0.0, 1.0), (1.0, 1.001)]) is None


def test_stream_topics_prefer_the_transports():
    raw = "/alpha_robot1/camera/image_raw"
    assert camera_streams.pick_streams(raw, [raw, raw + "/compressed"]) == {"raw": raw, "jpeg": raw + "/compressed"}
    assert camera_streams.pick_streams(raw, [raw, raw + "/compressed", raw + "/link_aware",
                                             raw + "/link_aware_h264"]) == {
        "raw": raw, "jpeg": raw + "/link_aware", "h264": raw + "/link_aware_h264"}
    assert camera_streams.pick_streams(raw, ["/other/camera/image_raw/link_aware_h264"]) == {"raw": raw}


def test_fleet_episode_check():
    # 30 Hz frames: 40 dB before, 30 dB during the episode (t 10..15), back to 39.5 after
    frames = [[t / 30, t, 0.0, 5000, 40.0 if t / 30 < 10 else (30.0 if t / 30 < 16 else 39.5)]
              for t in range(0, 30 * 25)]
    ok = bench_fleet.episode_check(frames, 10.0, 15.0, settle_s=1.0, margin_db=4.0)
    assert ok["psnr_mean_before"] == 40.0 and ok["psnr_min_during"] == 30.0 and ok["psnr_min_after"] == 39.5
    assert ok["ok"] is True and ok["rate_hz_during"] == pytest.approx(30.0, abs=0.5)
    frames[-10][4] = 20.0  # one broken picture after the episode
    bad = bench_fleet.episode_check(frames, 10.0, 15.0, settle_s=1.0, margin_db=4.0)
    assert bad["ok"] is False and bad["psnr_min_after"] == 20.0
    assert bench_fleet.episode_check([], 10.0, 15.0)["ok"] is None
    # a coarse frame sent during the episode that waited 2 s in the link's queue arrives after it:
    # part of the episode, not a failure after it; one sent after the episode is
    frames[-10][4] = 39.5
    queued = frames + [[16.5, 999, 2000.0, 5000, 28.0]]
    assert bench_fleet.episode_check(queued, 10.0, 15.0, settle_s=1.0, margin_db=4.0)["ok"] is True
    late = frames + [[16.5, 999, 100.0, 5000, 28.0]]
    assert bench_fleet.episode_check(late, 10.0, 15.0, settle_s=1.0, margin_db=4.0)["ok"] is False


def test_sweep_steps_and_labels():
    assert [imp_label(i) for i in impairments(quick=True)] == ["loss 0%", "loss 5%"]
    assert [imp_label(i) for i in impairments(quick=False)] == ["loss 0%", "loss 1%", "loss 5%", "rate 100 Mbit/s"]


def test_demo_path_seen_waits_for_the_path_then_the_hold():
    since = time.monotonic() - 5.0
    seen = PathSeen("derp", since, hold_s=3.0)
    assert not seen({ROBOT: ("direct", 1.0, "10.0.0.1:41641")}) and seen.after_s is None
    assert seen.seen_at() - since == pytest.approx(1e9)
    assert not seen({})
    assert not seen({ROBOT: ("derp", None, "lab")})  # first seen now, held for 0 s of 3
    assert seen.after_s == pytest.approx(5.0, abs=1.0)
    assert seen.seen_at() == pytest.approx(since + seen.after_s)
    seen.since -= 10.0  # as if 10 s had passed
    assert seen({ROBOT: ("direct", 1.0, "")})  # held long enough, whatever the path now


def test_demo_stream_cells():
    from overlay_manager.lab.demo.run import stream_cells

    row = {"rate_hz": 30.0, "latency_p50_ms": 12.4, "latency_p99_ms": 40.2, "kbps": 7600.0, "psnr_mean": 36.04}
    assert stream_cells(row, short=True) == "30.0 Hz, 12 ms, 7.6 Mbit/s, PSNR 36.0 dB"
    assert stream_cells(row) == " 30.0 Hz, latency p50    12 ms / p99    40 ms,    7.6 Mbit/s, PSNR 36.0 dB"
    raw = {"rate_hz": 16.1, "latency_p50_ms": 362.0, "latency_p99_ms": None, "kbps": 118700.0, "psnr_mean": 99.0}
    assert stream_cells(raw, short=True) == "16.1 Hz, 362 ms, 118.7 Mbit/s, PSNR lossless"
    assert "p99 ? ms" in stream_cells(raw)


def test_fleet_markdown_and_goals():
    def stream(rate, psnr, p99, kbps):
        return {"rate_hz": rate, "psnr_mean": psnr, "psnr_p5": psnr - 1 if psnr < 99 else psnr,
                "latency_p50_ms": 20.0, "latency_p99_ms": p99, "kbps": kbps}
    robots = ["alpha-robot1", "alpha-robot2"]
    data = {"meta": {"date": "2026-11-25 16:00", "seconds_per_kind": 10, "uplink_mbit": 30, "budget_kbps": 6000,
                     "cores": 2, "load_start": [3.0, 2.0, 1.0], "load_end": [4.0, 3.0, 2.0], "image": "scene",
                     "control_hz": 50, "robots": robots, "viewer": "ops-laptop", "kinds": ["raw", "h264"],
                     "goals": bench_fleet.GOALS, "episode_margin_db": 4.0, "run_seconds": 200, "errors": []},
            "results": {"raw": {"streams": {r: stream(3.0, 99.0, 900.0, 22000.0) for r in robots},
                                "control": {r: {"rtt_p50_ms": 40.0, "rtt_p99_ms": 400.0} for r in robots},
                                "encoder_cpu_pct": {r: None for r in robots}},
                        "h264": {"streams": {"alpha-robot1": stream(30.0, 40.0, 60.0, 2500.0),
                                             "alpha-robot2": stream(29.5, 37.5, 70.0, 2400.0)},
                                 "control": {r: {"rtt_p50_ms": 5.0, "rtt_p99_ms": 30.0} for r in robots},
                                 "encoder_cpu_pct": {r: 6.0 for r in robots}}},
            "episode": {}}
    assert bench_fleet.goal_check(data["results"]["h264"]) == {"rate_hz": True, "psnr_mean": False,
                                                               "latency_p99_ms": True, "rtt_p99_ms": True}
    md = bench_fleet.render_markdown(data).splitlines()
    assert "| raw rgb8 | alpha-robot1 | 3.0 | lossless / lossless | 20 / 900 | 22.00 | 40.0 / 400.0 | - |" in md
    assert "| link-aware H.264 | alpha-robot2 | 29.5 | 37.5 / 36.5 | 20 / 70 | 2.40 | 5.0 / 30.0 | 6.0 |" in md
    assert any(line.startswith("Goals for link-aware H.264") and "psnr_mean NOT met" in line for line in md)


def test_tier_markdown_full_alone_has_only_the_direct_row():
    data = json.loads((REPO_ROOT / "docs" / "bench_camera_tiers.json").read_text())
    full = {"tiers": True, "topics": {"direct": "/camera/image_raw/link_aware_h264/full"},
            "direct": {"rate_hz": 29.9, "psnr_mean": 45.4, "psnr_p5": 45.0, "mbit": 3.7,
                       "latency_p50_ms": 9.0, "latency_p99_ms": 30.0}, "encoder_cpu_pct": 13.4}
    data["results"]["h264 full alone"] = full
    md = bench_camera.render_tiers_markdown(data)
    rows = [line for line in md.splitlines() if line.startswith("| H.264 | full alone |")]
    assert rows == ["| H.264 | full alone | laptop (direct) | `/camera/image_raw/link_aware_h264/full` | 29.9 | "
                    "45.4 / 45.0 | 3.70 | 9 / 30 | 13.4 |"]


def test_tier_goal_lines_say_at_most_for_both_ratios():
    data = json.loads((REPO_ROOT / "docs" / "bench_camera_tiers.json").read_text())
    res = data["results"]["h264 tiers"]
    res["goals"] = bench_camera.tier_goals(res, {"encoder_cpu_pct": 11.1}, {"encoder_cpu_pct": 13.7})
    md = bench_camera.render_tiers_markdown(data)
    line = next(x for x in md.splitlines() if x.startswith("Goals, h264 tiers: "))
    assert "cpu_ratio 1.79 (goal <= 1.6): missed" in line and "cpu_ratio_full 1.45 (goal <= 1.6): met" in line
