"""The lab camera's scene: frame identity on the wire, PSNR, the video source and its reference
frames, and the quality probe's decoders (JPEG, H.264 Annex B one frame per message)."""
from __future__ import annotations

import fractions
import math

import pytest

from overlay_manager.lab.probe.quality import parse_stream
from overlay_manager.lab.probe.scene import PSNR_IDENTICAL, frame_index, tag_frame_id


def test_frame_id_round_trip():
    assert tag_frame_id("camera", 123) == "camera#123"
    assert frame_index("camera#123") == 123
    assert frame_index("camera#0") == 0
    assert frame_index("camera") is None
    assert frame_index("") is None
    assert frame_index("camera#x") is None


def test_parse_stream():
    assert parse_stream("h264:/a/camera/image_raw/link_aware_h264") == ("h264", "/a/camera/image_raw/link_aware_h264")
    assert parse_stream("raw:/camera/image_raw") == ("raw", "/camera/image_raw")
    for bad in ("png:/x", "/camera/image_raw", "jpeg:"):
        with pytest.raises(ValueError, match="KIND:TOPIC"):
            parse_stream(bad)


def test_psnr_values():
    np = pytest.importorskip("numpy")
    pytest.importorskip("cv2")
    from overlay_manager.lab.probe.scene import psnr, psnr_samples

    a = np.zeros((4, 4, 3), np.uint8)
    assert psnr_samples(a, a) == PSNR_IDENTICAL
    b = a.copy()
    b[...] = 1  # MSE 1 -> 48.13 dB
    assert psnr_samples(b, a) == pytest.approx(10 * math.log10(255 ** 2), abs=1e-9)
    c = a.copy()
    c[0, 0, 0] = 255  # no uint8 wrap-around: MSE = 255^2 / 48
    assert psnr_samples(c, a) == pytest.approx(10 * math.log10(48), abs=1e-9)
    with pytest.raises(ValueError, match="differ in size"):
        psnr_samples(a, np.zeros((4, 5, 3), np.uint8))
    # RGB pictures are compared in YUV 4:2:0 (as ffmpeg's psnr filter does for yuv420p)
    rgb = np.random.default_rng(1).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    assert psnr(rgb, rgb) == PSNR_IDENTICAL
    grey = np.full((8, 8, 3), 100, np.uint8)
    lighter = grey + 4  # Y moves by 3 (BT.601 video range: 219/255 of 4), U and V stay; Y is 64 of 96 samples
    assert psnr(lighter, grey) == pytest.approx(10 * math.log10(255 ** 2 / (9 * 64 / 96)), abs=1e-6)
    with pytest.raises(ValueError, match="differ in size"):
        psnr(rgb, np.zeros((8, 10, 3), np.uint8))


@pytest.fixture(scope="module")
def small_video(tmp_path_factory):
    """A 12-frame 160x120 MJPG AVI whose frames differ (a moving bar)."""
    cv2 = pytest.importorskip("cv2")
    np = pytest.importorskip("numpy")
    path = tmp_path_factory.mktemp("video") / "bar.avi"
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, (160, 120))
    if not w.isOpened():
        pytest.skip("OpenCV cannot write MJPG AVI here")
    for i in range(12):
        img = np.full((120, 160, 3), 40, np.uint8)
        img[:, 10 * i:10 * i + 12] = (0, 200, 255)
        w.write(img)
    w.release()
    return path


def test_video_frames_loop_and_scale(small_video):
    from overlay_manager.lab.probe.scene import VideoFrames

    v = VideoFrames(small_video, 80, 60)
    seen = [v.next() for _ in range(15)]
    assert [i for i, _ in seen] == list(range(12)) + [0, 1, 2]
    assert v.count == 12
    assert seen[0][1].shape == (60, 80, 3)
    assert (seen[12][1] == seen[0][1]).all()  # the loop gives the same pictures again
    assert not (seen[1][1] == seen[0][1]).all()
    v.close()


def test_scene_frames_are_the_decoded_frames_cached_once(small_video, tmp_path, monkeypatch):
    """The shared cache holds exactly what the decoder gives (so the receiver's reference is
    bit-identical to what the camera sent); a second user reuses the file; a count beyond the
    video's length stops at its end."""
    from overlay_manager.lab.probe import scene

    monkeypatch.setattr(scene, "cache_dir", lambda: tmp_path / "cache")
    v = scene.VideoFrames(small_video, 80, 60)
    decoded = dict(v.next() for _ in range(12))
    s1 = scene.SceneFrames(small_video, 80, 60, frames=8)
    assert s1.count == 8
    for i in (0, 5, 7):
        assert (s1.frame(i) == decoded[i]).all()
    assert s1.frame(8) is None and s1.frame(-1) is None
    mtime = s1.path.stat().st_mtime_ns
    s2 = scene.SceneFrames(small_video, 80, 60, frames=8)
    assert s2.path == s1.path and s2.path.stat().st_mtime_ns == mtime
    whole = scene.SceneFrames(small_video, 80, 60, frames=100)
    assert whole.count == 12 and (whole.frame(11) == decoded[11]).all()
    assert not list((tmp_path / "cache").glob("*.tmp*"))


def test_missing_video_names_the_fix(tmp_path):
    pytest.importorskip("cv2")
    from overlay_manager.lab.probe.scene import VideoError, VideoFrames

    with pytest.raises(VideoError, match="opencv-doc"):
        VideoFrames(tmp_path / "none.avi")
    from overlay_manager.lab.probe.scene import SceneFrames
    with pytest.raises(VideoError, match="opencv-doc"):
        SceneFrames(tmp_path / "none.avi")


def _h264_packets(frames, gop=10):
    """Encode RGB frames with libx264 (zerolatency) to one Annex B packet per frame."""
    av = pytest.importorskip("av")
    ctx = av.CodecContext.create("libx264", "w")
    h, w = frames[0].shape[:2]
    ctx.width, ctx.height, ctx.pix_fmt = w, h, "yuv420p"
    ctx.time_base = fractions.Fraction(1, 30)
    ctx.options = {"preset": "ultrafast", "tune": "zerolatency",
                   "x264-params": f"keyint={gop}:min-keyint={gop}:repeat-headers=1"}
    out = []
    for i, f in enumerate(frames):
        vf = av.VideoFrame.from_ndarray(f, format="rgb24")
        vf.pts = i
        out.extend(bytes(p) for p in ctx.encode(vf))
    out.extend(bytes(p) for p in ctx.encode(None))
    return out


def test_h264_one_frame_per_message_and_late_start(small_video):
    """The probe's H.264 decoder gives one picture per message with the message's number, PSNR
    well above a wrong frame's; a subscriber starting mid-GOP gets nothing until the keyframe."""
    pytest.importorskip("av")
    from overlay_manager.lab.probe.quality import Decoder
    from overlay_manager.lab.probe.scene import VideoFrames, psnr

    v = VideoFrames(small_video, 160, 120)
    frames = [v.next()[1] for _ in range(20)]
    packets = _h264_packets(frames, gop=10)
    assert len(packets) == 20
    assert packets[0].startswith((b"\x00\x00\x00\x01", b"\x00\x00\x01"))
    dec = Decoder("h264")
    for n, data in enumerate(packets):
        out = dec.decode(data, n)
        assert [m for m, _ in out] == [n]
        assert psnr(out[0][1], frames[n]) > 30
    assert psnr(frames[3], frames[0]) < 25  # a wrong source frame would show

    late = Decoder("h264")
    got = []
    for n, data in enumerate(packets[3:], start=3):
        try:
            got.extend(m for m, _ in late.decode(data, n))
        except Exception:  # noqa: BLE001 - before the keyframe the decoder may raise or give nothing
            pass
    assert got and got[0] == 10, got


def test_jpeg_decoder_gives_rgb(small_video):
    cv2 = pytest.importorskip("cv2")
    from overlay_manager.lab.probe.quality import Decoder
    from overlay_manager.lab.probe.scene import VideoFrames, psnr

    rgb = VideoFrames(small_video, 160, 120).next()[1]
    ok, jpg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    (n, pic), = Decoder("jpeg").decode(jpg.tobytes(), 7)
    assert n == 7 and psnr(pic, rgb) > 30
    with pytest.raises(ValueError):
        Decoder("jpeg").decode(b"not a jpeg", 0)


def test_h264_on_the_real_scene():
    """The viewer's path on the lab's real scene: 60 frames of vtest.avi as the camera sends them,
    H.264 (libx264 ultrafast/zerolatency, 1.5 Mbit/s, GOP 30) one Annex B frame per message, decoded
    by the probe's decoder: every message gives its picture, PSNR around 40 dB (and far less against
    the wrong source frame)."""
    av = pytest.importorskip("av")
    from overlay_manager.lab.probe.quality import Decoder
    from overlay_manager.lab.probe.scene import DEFAULT_VIDEO, VideoFrames, psnr

    if not DEFAULT_VIDEO.exists():
        pytest.skip(f"{DEFAULT_VIDEO} missing (Debian package opencv-doc)")
    v = VideoFrames(DEFAULT_VIDEO)
    frames = [v.next()[1] for _ in range(60)]
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = 640, 480, "yuv420p"
    ctx.time_base = fractions.Fraction(1, 30)
    ctx.bit_rate = 1_500_000
    ctx.options = {"preset": "ultrafast", "tune": "zerolatency", "x264-params": "keyint=30:repeat-headers=1"}
    packets = []
    for i, f in enumerate(frames):
        vf = av.VideoFrame.from_ndarray(f, format="rgb24")
        vf.pts = i
        packets.extend(bytes(p) for p in ctx.encode(vf))
    assert len(packets) == 60
    dec = Decoder("h264")
    values = []
    for n, data in enumerate(packets):
        (m, pic), = dec.decode(data, n)
        assert m == n
        values.append(psnr(pic, frames[n]))
    mean = sum(values) / len(values)
    assert 38.0 < mean < 60.0, values  # ffmpeg's psnr filter gives 40.9 dB at 1.5 Mbit/s here
    assert psnr(frames[40], frames[0]) < mean - 10


def test_check_video_gives_the_absolute_path_of_a_decodable_file(small_video, tmp_path, monkeypatch):
    """What a benchmark's --video is checked with before its lab comes up: a video whose first
    frame decodes comes back absolute; a file that is not a video, or not there, is refused by
    name."""
    from overlay_manager.lab.probe.scene import VideoError, check_video

    monkeypatch.chdir(small_video.parent)
    assert check_video(small_video.name) == small_video
    junk = tmp_path / "notes.avi"
    junk.write_text("not a video\n")
    with pytest.raises(VideoError, match=r"notes\.avi"):
        check_video(junk)
    with pytest.raises(VideoError, match=r"none\.avi: no such file"):
        check_video(tmp_path / "none.avi")
    with pytest.raises(VideoError, match=r": not a file"):
        check_video(tmp_path)


def test_scene_label_names_the_default_scene_or_the_file(tmp_path):
    from overlay_manager.lab.probe.scene import DEFAULT_VIDEO, scene_label

    assert scene_label() == "vtest.avi (a pedestrian scene)"
    assert scene_label(DEFAULT_VIDEO) == "vtest.avi (a pedestrian scene)"
    assert scene_label(tmp_path / "Megamind.avi") == str(tmp_path / "Megamind.avi")


@pytest.mark.parametrize("prog", ["bench_camera", "bench_fleet"])
def test_benches_refuse_a_bad_video_before_the_lab(prog, small_video, tmp_path, capsys):
    """--video is checked first (exit 2, the file named), before the root check and the lab."""
    from overlay_manager.lab.bench import camera, fleet

    main = {"bench_camera": camera.main, "bench_fleet": fleet.main}[prog]
    assert main(["--video", str(tmp_path / "none.avi"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{prog}: --video: video {tmp_path / 'none.avi'}: no such file" in err
    assert not list(tmp_path.glob("bench_*"))
    if prog == "bench_camera":
        assert main(["--tiers", "--pattern", "synthetic", "--video", str(small_video), "--out", str(tmp_path)]) == 2
        assert "only with --pattern scene" in capsys.readouterr().err


def test_the_video_reaches_the_camera_and_the_viewer(small_video, monkeypatch):
    """The camera and probe quality both get --video (the PSNR's reference is the file played);
    none for the default scene."""
    from overlay_manager.lab.campus import camera_streams, robots

    seen = []
    monkeypatch.setattr(robots, "run_probe", lambda lab, host, args, timeout=0: seen.append(args) or {})
    camera_streams.quality(None, "ops-laptop", [("h264", "/c/link_aware_h264")], 5, video=str(small_video))
    camera_streams.quality(None, "ops-laptop", [("h264", "/c/link_aware_h264")], 5)
    assert seen[0][-2:] == ["--video", str(small_video)]
    assert "--video" not in seen[1]
    assert camera_streams.bench_video("bench_fleet", "") == ""
    assert camera_streams.bench_video("bench_fleet", str(small_video)) == str(small_video)


def test_the_demo_refuses_a_bad_video_before_the_lab(tmp_path, capsys):
    pytest.importorskip("cv2")
    from overlay_manager.lab.demo import run

    assert run.main(["--video", str(tmp_path / "none.avi")]) == 2
    err = capsys.readouterr().err
    assert "demo: --video:" in err and "none.avi" in err
