"""The robot mix's data (lab/probe/mix_data.py), the viewer's arithmetic (lab/probe/mix_nodes.py)
and the benchmark's goal check and report (lab/bench/mix.py): pure parts, no ROS, no lab."""
from __future__ import annotations

import math
import struct

import pytest

from overlay_manager.lab.bench import mix as bench_mix
from overlay_manager.lab.probe import mix_data, mix_nodes

np = pytest.importorskip("numpy")
pytest.importorskip("cv2")


@pytest.fixture(scope="module")
def real():
    if not (mix_data.DATA_DIR / "aloeGT.png").is_file():
        pytest.skip(f"{mix_data.DATA_DIR}/aloeGT.png missing: Debian's opencv-doc is not installed")
    return mix_data.load_scene()


@pytest.fixture(scope="module")
def small():
    """A synthetic scene small enough for quick checks."""
    return mix_data.synthetic_scene(width=160, height=120, seed=3)


def test_real_scene_sizes_and_source(real):
    assert real.shift.shape == (1110, 1282) and real.bgr.shape == (1110, 1282, 3)
    known = real.shift > 0
    assert 0.95 < known.mean() < 0.98  # 3.5 % unknown in the ground truth
    assert real.shift[known].min() == 43 and real.shift.max() == 211
    assert "aloe" in real.source.lower()


def test_cloud_of_the_real_scene(real):
    c = mix_data.point_cloud(real)
    assert (c.width, c.height) == (641, 555)
    assert len(c.data) == 641 * 555 * mix_data.POINT_STEP == 5692080
    pts = np.frombuffer(c.data, dtype="<f4").reshape(-1, 4)
    valid = ~np.isnan(pts[:, 2])
    assert int(valid.sum()) == c.valid and 330_000 < c.valid < 350_000
    z = pts[valid, 2]
    # depth from the assumed camera: fx * baseline / (shift + offset) for shifts 43..211 (with noise)
    assert 1.2 < z.min() and z.max() < 1.95
    assert np.isnan(pts[~valid, 0]).all() and np.isnan(pts[~valid, 1]).all()
    # colour: PCL's packed 0x00RRGGBB; pixel (0, 0) of the left picture
    rgb = pts[:, 3].view("<u4")
    b, g, r = (int(v) for v in real.bgr[0, 0])
    assert rgb[0] == (r << 16) | (g << 8) | b


def test_cloud_geometry_follows_the_camera_model(small):
    cam = mix_data.Camera()
    c = mix_data.point_cloud(small, stride=1, noise_px=0.0, cam=cam)
    pts = np.frombuffer(c.data, dtype="<f4").reshape(small.shift.shape + (4,))
    v, u = 37, 101
    d = small.shift[v, u]
    assert d > 0
    z = cam.fx * cam.baseline_m / (d + cam.offset_px)
    cx, cy = (160 - 1) / 2.0, (120 - 1) / 2.0
    assert pts[v, u, 2] == pytest.approx(z, rel=1e-5)
    assert pts[v, u, 0] == pytest.approx((u - cx) * z / cam.fx, rel=1e-4, abs=1e-7)
    assert pts[v, u, 1] == pytest.approx((v - cy) * z / cam.fx, rel=1e-4, abs=1e-7)


def test_frames_are_deterministic_and_differ_by_variant(small):
    a, b = mix_data.point_cloud(small, variant=1), mix_data.point_cloud(small, variant=1)
    assert a.data == b.data
    assert mix_data.point_cloud(small, variant=2).data != a.data
    s1, s2 = mix_data.laser_scan(small, variant=4), mix_data.laser_scan(small, variant=4)
    assert s1 == s2 and mix_data.laser_scan(small, variant=5).ranges != s1.ranges
    same = mix_data.synthetic_scene(64, 48, seed=1).shift.tobytes()
    assert same == mix_data.synthetic_scene(64, 48, 1).shift.tobytes()
    with pytest.raises(ValueError, match="stride"):
        mix_data.point_cloud(small, stride=0)


def test_scan_of_the_real_scene(real):
    s = mix_data.laser_scan(real)
    assert len(s.ranges) == len(s.intensities) == 1282
    assert s.angle_min < 0 < s.angle_max
    assert math.degrees(s.angle_max - s.angle_min) == pytest.approx(19.4, abs=0.1)
    assert s.angle_min + s.angle_increment * 1281 == pytest.approx(s.angle_max)
    hits = [r for r in s.ranges if math.isfinite(r)]
    assert len(hits) > 1100  # most beams see the scene; the others are +inf (no return, REP 117)
    assert all(r == math.inf for r in s.ranges if not math.isfinite(r))
    assert 1.2 < min(hits) and max(hits) < 2.0
    assert all(0 <= i <= 255 for i in s.intensities)


def test_scan_takes_the_nearest_point_per_beam():
    """A flat wall at one depth with a nearer post: the post's beams are nearer than the wall's."""
    shift = np.full((20, 40), 50.0, dtype=np.float32)
    shift[:, 18:22] = 150.0  # nearer (larger shift)
    scene = mix_data.Scene(np.zeros((20, 40, 3), dtype=np.uint8), shift, "test")
    s = mix_data.laser_scan(scene, band=5, noise_m=0.0)
    cam = mix_data.Camera()
    wall, post = cam.fx * cam.baseline_m / (50 + cam.offset_px), cam.fx * cam.baseline_m / (150 + cam.offset_px)
    finite = [r for r in s.ranges if math.isfinite(r)]
    assert min(finite) == pytest.approx(post, rel=1e-3)
    assert max(finite) == pytest.approx(wall, rel=1e-3)
    # beams run counter-clockwise: column 0 (left in the picture) is the largest angle, the last entry
    assert s.ranges[-1] == pytest.approx(wall, rel=1e-3)


def test_grid_of_the_real_scene(real):
    g = mix_data.occupancy_grid(real)
    assert (g.width, g.height, g.resolution) == (2564, 2220, 0.05)
    cells = np.frombuffer(g.data, dtype=np.int8)
    assert cells.size == 2564 * 2220
    values = set(np.unique(cells).tolist())
    assert {-1, 0, 100} <= values and values <= set(range(-1, 101))
    assert 0.02 < (cells == -1).mean() < 0.05 and 0.005 < (cells == 100).mean() < 0.05
    tile = cells.reshape(2220, 2564)[:1110, :1282]
    # mirrored tiles meet: the second tile of a row is the first one flipped left-right
    assert (cells.reshape(2220, 2564)[:1110, 1282:] == tile[:, ::-1]).all()


def test_grid_marks_depth_steps_and_inflates_around_them():
    shift = np.full((30, 30), 50.0, dtype=np.float32)
    shift[:, 15:] = 150.0
    shift[0:3, 0:3] = 0.0  # unknown
    scene = mix_data.Scene(np.zeros((30, 30, 3), dtype=np.uint8), shift, "test")
    g = mix_data.occupancy_grid(scene, tiles=1, inflation_cells=5)
    cells = np.frombuffer(g.data, dtype=np.int8).reshape(30, 30)[::-1]  # back to picture rows
    assert (cells[10, 14:16] == 100).all()
    assert 0 < cells[10, 12] < 100 and cells[10, 12] > cells[10, 11]
    assert cells[10, 5] == 0
    assert (cells[0:3, 0:3] == -1).all()
    with pytest.raises(ValueError, match="tiles"):
        mix_data.occupancy_grid(scene, tiles=0)


def test_missing_files_name_the_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="opencv-doc"):
        mix_data.load_scene(tmp_path)


def test_header_of_a_serialized_message():
    wire = struct.pack("<III", 7, 1700000000, 250000000) + b"\x05\x00\x00\x00frame" + b"rest"
    assert mix_nodes.header_stamp(wire) == pytest.approx(1700000000.25)
    assert mix_nodes.header_stamp(b"short") is None
    new = mix_nodes.with_header(wire, 9, 1800000000, 5)
    assert struct.unpack_from("<III", new) == (9, 1800000000, 5) and new[12:] == wire[12:]


def test_topic_report_sees_a_growing_queue():
    t0 = 100.0
    steady = [[t0 + i * 0.1, 0.05, 1000.0] for i in range(100)]
    growing = [[t0 + i * 0.1, 0.05 + 0.02 * i, 1000.0] for i in range(100)]
    ages = [0.05] * 200
    a = mix_nodes.topic_report(steady, ages, t0, 10.0, [[t0 + i * 0.05, 0.05] for i in range(200)], 0, 0.2)
    b = mix_nodes.topic_report(growing, ages, t0, 10.0, [], 0, 0.2)
    assert a["rate_hz"] == 10.0 and a["latency_growth_ms"] == pytest.approx(0.0)
    assert a["kbps"] == pytest.approx(80.0) and a["bytes_p50"] == 1000.0
    assert a["age_p99_ms"] == pytest.approx(50.0) and len(a["series"]) == 10 and a["series"][0][1] == 10
    assert b["latency_growth_ms"] > 1000 and b["latency_slope_ms_per_s"] == pytest.approx(200.0)
    assert mix_nodes.slope([1, 2], [3, 4]) is None and mix_nodes.slope([1, 1, 1], [1, 2, 3]) is None


def _viewer(rate_cam, lat_p99, growth, rate_heavy=None, size=100):
    rows = {"camera": {"rate_hz": rate_cam, "latency_p99_ms": 10, "latency_growth_ms": 0, "bytes_p50": 5}}
    for n, hz in bench_mix.NOMINAL_HZ.items():
        if n != "camera":
            rows[n] = {"rate_hz": hz if rate_heavy is None else rate_heavy, "latency_p99_ms": lat_p99,
                       "latency_growth_ms": growth, "bytes_p50": size}
    return {"topics": rows}


def test_goal_check():
    published = {"bytes": {"points": 100, "scan": 100, "map": 100}}
    good = {"relayed": _viewer(29.5, 120, 5), "direct": _viewer(30, 5, 0), "control": {"rtt_p99_ms": 20}}
    assert bench_mix.goal_check(good, published) == {"rtt_p99": True, "camera_rate": True, "age_p99": True,
                                                    "no_queue_growth": True, "direct_full_rate": True,
                                                    "direct_full_content": True}
    bad = {"relayed": _viewer(12, 4000, 900), "direct": _viewer(30, 5, 0, rate_heavy=0.5, size=50),
           "control": {"rtt_p99_ms": 300}}
    assert set(bench_mix.goal_check(bad, published).values()) == {False}
    assert bench_mix.goal_check({"relayed": {}, "control": {}}, published)["rtt_p99"] is None


def test_report_renders_a_run(tmp_path):
    res = {"relayed": _viewer(29.5, 120, 5), "direct": _viewer(30, 5, 0), "control": {"rtt_p99_ms": 20},
           "topics": {"camera": "/r/camera/image_raw/link_aware_h264", "points": "/r/points"}, "load": [1.0, 1, 1]}
    data = {"meta": {"date": "2026-11-28 02:00", "robot": "alpha-robot1", "relayed": "ops-laptop",
                     "direct": "lab-laptop", "scene": "real", "camera_stream": "/r/camera/image_raw/link_aware_h264",
                     "published": {"bytes": {"points": 100, "scan": 100, "map": 100}, "source": "aloe"},
                     "nominal_hz": bench_mix.NOMINAL_HZ, "throttle_hz": {"points": 0.3}, "uplink_mbit": 30.0,
                     "seconds_per_mode": 20, "cores": 2, "load_start": [1, 1, 1], "load_end": [2, 2, 2],
                     "modes": ["raw"], "goals": bench_mix.GOALS, "errors": ["shaped: not measured"]},
            "results": {"raw": res}}
    md = bench_mix.render_markdown(data)
    assert "| raw | relayed | /r/points |" in md and "rtt_p99 met" in md and "Not measured: shaped" in md
    pytest.importorskip("matplotlib")
    bench_mix.plot(data, tmp_path)
    assert (tmp_path / "bench_mix.png").stat().st_size > 0 and (tmp_path / "bench_mix_series.png").exists()
