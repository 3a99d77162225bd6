"""The link-aware video transports end to end through image_transport, in the cases that crashed
processes or showed wrong pictures (real roscore, real C++ camera driver and viewers).

The camera driver is test/cpp/test_camera_driver.cpp: it publishes through image_transport, so the
`link_aware` and `link_aware_h264` publisher plugins encode inside it. The viewers are
`image_transport republish link_aware_h264` and `republish link_aware` (the subscriber plugins) and
the package's `compressed_decoder` with `_transport:=link_aware_h264`
(overlay_manager.lab.bench.hostile.viewers). record_images.py records what they publish.

1. Valid streams at widths that overflowed the H.264 decoder's picture before (648x480, 2x2,
   330x250, 1288x720): every viewer stays up, and every picture it shows has the right width,
   height, step and encoding, data of exactly step x height bytes and (not at 2x2) the driver's red
   block where it belongs and the bright end of its grey gradient in the last column.
2. A driver whose frames lie about their size (its ~lie: short data, step 0, step < width, a
   claimed 16000x16000, an unknown encoding, 32FC1) and honest yuv422 / bayer_rggb8 frames: the
   driver stays up, the viewers show only the honest frames (the right picture, labelled as
   converted), and the driver's log names each problem once per stream and kind, not per frame.
3. Hostile messages to the viewers (overlay_manager.lab.bench.hostile, also scripts/bench_hostile):
   8 MB of filler NAL units, an SPS claiming 16000x16000 before a real IDR, a 2x2 IDR, a JPEG whose
   SOF0 claims 8192x8192, a truncated JPEG, a JPEG start with a bad marker, then random garbage at
   200 Hz for 3 s: the viewers stay up, show no picture from a hostile message (the 2x2 IDR is
   valid: 2x2 if any), show a valid probe after each one, decode a valid stream afterwards, and
   their logs hold few libavcodec lines (libavcodec's own stderr output is unthrottled: a viewer
   printing it was seen writing 54,802 lines in 3 s of garbage). Memory (VmRSS on a 1080p stream,
   the peak after each hostile message) is printed, not asserted.

Each test starts its own processes (by pid, stopped in `finally`); run with -s to see the numbers.
"""
import json
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest
from ros_graph import read_jsonl, start

from overlay_manager.lab.bench import hostile
from overlay_manager.system import children, waiting

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(shutil.which("rostest") is None or shutil.which("rosrun") is None,
                                reason="ROS not installed (scripts/setup)")

SIZES = [(648, 480), (2, 2), (330, 250), (1288, 720)]
LIES = ["short_data", "zero_step", "step_lt_width", "huge", "unknown_encoding", "32FC1", "yuv422", "bayer_rggb8"]
HONEST = {"yuv422", "bayer_rggb8"}
# what the driver's log says for each lie (zero_step and step_lt_width are one kind: "step N is less than width")
PROBLEMS = {
    "short_data": r"data holds 100 bytes, less than step 5760 x height 1080",
    "step": r"step \d+ is less than width 640 x 3",
    "huge": r"picture 16000x16000 exceeds max_width 8192 \(parameter ~max_width\)",
    "unknown_encoding": r"unknown encoding 'no_such_encoding'",
    "32FC1": r"'32FC1' is not a picture the link-aware transports encode",
}
PROBLEM_PERIOD_S = 10.0  # problem_log.h: the least time between two lines of one kind
LOG_TIME = re.compile(r"\[(?:ERROR|WARN|INFO)\s*\] \[(\d+\.\d+)\]")


def _red(px, encoding):
    """True when a pixel (bytes in the message's channel order) is the driver's pure red."""
    r, g, b = px if encoding == "rgb8" else px[::-1]
    return r > 180 and g < 80 and b < 80


def _dead(procs, logs):
    """Processes of ``procs`` (name -> Popen) that have exited, with their exit code and log tail."""
    return {n: f"exit {p.returncode} ({_signal_name(p.returncode)}): {waiting.tail(logs[n], 6)}"
            for n, p in procs.items() if p.poll() is not None}


def _signal_name(code):
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            pass
    return "exited"


class Graph:
    """The processes one test starts, stopped by pid (last started first) in ``close``."""

    def __init__(self, env, tmp):
        # the log format the driver's log is read with (the default, whatever this environment says)
        self.env = dict(env, ROSCONSOLE_FORMAT="[${severity}] [${time}]: ${message}")
        self.tmp, self.procs = tmp, []
        self.named, self.logs = {}, {}

    def start(self, name, argv):
        log = self.tmp / f"{name}.log"
        self.logs[name] = log
        self.named[name] = start(argv, self.env, log, self.procs)
        return self.named[name]

    def recorder(self, topics):
        out = self.tmp / "images.jsonl"
        self.start("record_images", [sys.executable, str(HERE / "record_images.py"), str(out), *topics])
        return out

    def close(self):
        for proc in reversed(self.procs):
            children.stop(proc, 10.0, signal.SIGINT)


def test_valid_streams_at_sizes_that_overflowed(master, tmp_path):
    """Part 1: both subscriber plugins and the decoder node on 648x480, 2x2, 330x250, 1288x720."""
    g = Graph(master, tmp_path)
    views = {}
    try:
        for w, h in SIZES:
            prefix = f"/e2e_{w}x{h}"
            g.start(f"camera_{w}x{h}", hostile.driver_argv(f"e2e_camera_{w}x{h}", prefix + "/image", w, h, 10.0))
            for v in hostile.viewers(prefix + "/image", prefix):
                g.start(v.name, v.argv)
                views[v.output] = (v, (w, h))
        record = g.recorder(list(views))
        n_frames = 15

        def enough():
            if _dead(g.named, g.logs):
                raise RuntimeError(f"processes exited: {_dead(g.named, g.logs)}")
            counts = {t: 0 for t in views}
            for r in read_jsonl(record):
                counts[r["topic"]] += 1
            return all(c >= n_frames for c in counts.values())

        def counts():
            seen = {t: sum(1 for r in read_jsonl(record) if r["topic"] == t) for t in views}
            return f"pictures per output {seen}; exited: {_dead(g.named, g.logs)}"
        waiting.wait_for(f"{n_frames} pictures on every viewer's output ({len(views)} outputs)", enough, 60,
                         interval=0.2, detail=counts, fatal=(RuntimeError,), error=AssertionError)
        assert not _dead(g.named, g.logs), f"processes exited: {_dead(g.named, g.logs)}"
        records = read_jsonl(record)
        for topic, (v, (w, h)) in views.items():
            got = [r for r in records if r["topic"] == topic]
            bad = [r for r in got if (r["w"], r["h"], r["step"], r["encoding"], r["len"]) != (w, h, 3 * w, v.encoding,
                                                                                         3 * w * h)]
            assert not bad, f"{v.name} ({w}x{h}): wrong pictures, e.g. {bad[0]}"
            if w >= 80:
                last = got[-1]
                assert _red(last["px"], v.encoding), f"{v.name} ({w}x{h}): red block shown as {last['px']}"
                # the row's last pixel is written (libswscale once left the end of odd rows unwritten)
                assert min(last["px_last"]) > 120, f"{v.name} ({w}x{h}): last pixel of a row {last['px_last']}"
            print(f"{v.name}: {len(got)} pictures {w}x{h} {v.encoding}, step {3 * w}, "
                  f"red block {got[-1].get('px')}, "
                  f"row end {got[-1].get('px_last')}", flush=True)
    finally:
        g.close()


def test_a_driver_with_lying_frames_stays_up_and_says_so_once_per_kind(master, tmp_path):
    """Part 2: the plugins inside a driver refuse frames that lie about their size, once per kind in
    its log; honest yuv422 and bayer_rggb8 frames reach both transports' viewers as bgr8 pictures."""
    g = Graph(master, tmp_path)
    prefix = "/e2e_liar"
    try:
        driver = g.start("camera", hostile.driver_argv("e2e_liar_camera", prefix + "/image", 640, 480, 30.0,
                                                       " ".join(LIES)))
        views = {v.output: v for v in hostile.viewers(prefix + "/image", prefix)}
        for v in views.values():
            g.start(v.name, v.argv)
        record = g.recorder(list(views))
        n_frames = 10

        def per_kind():
            if _dead(g.named, g.logs):
                raise RuntimeError(f"processes exited: {_dead(g.named, g.logs)}")
            seen = {(t, k): 0 for t in views for k in HONEST}
            for r in read_jsonl(record):
                key = (r["topic"], r["frame_id"])
                seen[key] = seen.get(key, 0) + 1
            return seen

        waiting.wait_for(f"{n_frames} yuv422 and bayer_rggb8 pictures on every viewer's output",
                         lambda: all(c >= n_frames for (t, k), c in per_kind().items() if k in HONEST), 40,
                         interval=0.2, detail=lambda: str(per_kind()), fatal=(RuntimeError,), error=AssertionError)
        assert driver.poll() is None and not _dead(g.named, g.logs), f"processes exited: {_dead(g.named, g.logs)}"
        records = read_jsonl(record)
        for topic, v in views.items():
            got = [r for r in records if r["topic"] == topic]
            lied = sorted({r["frame_id"] for r in got} - HONEST)
            assert not lied, f"{v.name} showed pictures of lying frames: {lied}"
            # H.264 viewers label what they were made for; a JPEG viewer labels a converted frame bgr8
            want = "bgr8" if v.transport == "jpeg" else v.encoding
            bad = [r for r in got if (r["w"], r["h"], r["step"], r["encoding"], r["len"]) != (640, 480, 1920, want,
                                                                                         1920 * 480)]
            assert not bad, f"{v.name}: wrong pictures, e.g. {bad[0]}"
            for kind in HONEST:
                last = [r for r in got if r["frame_id"] == kind][-1]
                assert _red(last["px"], want), f"{v.name}: red block of the {kind} frame shown as {last['px']}"
                assert min(last["px_last"]) > 120, f"{v.name}: grey end of the {kind} frame shown as {last['px_last']}"
            print(f"{v.name}: " + ", ".join(f"{sum(1 for r in got if r['frame_id'] == k)} {k}" for k in sorted(HONEST))
                  + f" pictures, labelled {want}", flush=True)
        # each lying kind was published at least once per honest picture a viewer showed
        published = min(sum(1 for r in records if r["topic"] == t and r["frame_id"] == k)
                        for t in views for k in HONEST)
        log = g.logs["camera"].read_text(errors="replace").splitlines()
        refusals = [x for x in log if "refuses a frame" in x]
        for stream in ("link_aware", "link_aware_h264"):
            mine = [x for x in refusals if f"{prefix}/image/{stream}:" in x]
            for kind, pattern in PROBLEMS.items():
                lines = [x for x in mine if re.search(pattern, x)]
                assert lines, f"the driver's log never names {kind} for {stream}: {mine[:8]}"
                times = [float(LOG_TIME.search(x).group(1)) for x in lines]
                gaps = [b - a for a, b in zip(times, times[1:])]
                assert all(d >= PROBLEM_PERIOD_S - 0.5 for d in gaps), \
                    f"{stream}: {kind} said {len(lines)} times in {times[-1] - times[0]:.1f} s: {lines}"
            unknown = [x for x in mine if not any(re.search(p, x) for p in PROBLEMS.values())]
            assert not unknown, f"{stream}: refusals of honest frames: {unknown[:3]}"
            print(f"driver log, {stream}: {len(mine)} refusal lines for {len(PROBLEMS)} kinds "
                  f"(each lying kind published >= {published} times)", flush=True)
        other = [x for x in log if "cannot" in x]
        assert not other, f"the driver could not convert or encode an honest frame: {other[:3]}"
        assert published >= n_frames - 1
    finally:
        g.close()


def test_hostile_messages_to_the_viewers(master, tmp_path):
    """Part 3: one hostile message at a time, a garbage flood, then a valid stream."""
    g = Graph(master, tmp_path)

    def start_one(argv, log):
        name = Path(log).stem
        g.logs[name] = Path(log)
        g.named[name] = start(argv, g.env, log, g.procs)
        return g.named[name]

    try:
        result = hostile.run(tmp_path, start_one, lambda p: children.stop(p, 10.0, signal.SIGINT),
                             width=1920, height=1080, rate=10.0, flood_seconds=3.0, flood_hz=200.0,
                             error=AssertionError)
    finally:
        g.close()
    print("\n" + hostile.table(result), flush=True)
    for row in hostile.memory_rows(result):
        print(f"{row['viewer']}: RSS on 1080p {row['baseline_rss_mb']} MB; peak after a hostile message / that: "
              f"{row['ratio']} (goal <= 2)", flush=True)
    print(f"keyframe requests from the H.264 viewers: {len(result['keyframe_requests'])}; valid frames shown "
          f"afterwards: {result['valid']['shown']} of {result['valid']['sent']}", flush=True)
    (tmp_path / "result.json").write_text(json.dumps({k: v for k, v in result.items() if k != "events"}, indent=1))

    viewers = result["viewers"]
    for h in result["hostile"]:
        died = [n for n, up in h["alive"].items() if not up]
        assert not died, f"{died} died after {h['name']}: " + "; ".join(waiting.tail(viewers[n]["log"], 5)
                                                                         for n in died)
    exited = {n: v["exit"] for n, v in viewers.items() if v["exit"] is not None}
    assert not exited, f"viewers exited: {exited}"
    allowed = {h["name"] for h in result["hostile"] if h["picture_allowed"]}  # the 2x2 IDR: valid
    for o in result["outputs"]:
        if o["frame_id"].startswith("hostile:"):
            name = o["frame_id"].split(":", 1)[1]
            assert name in allowed, f"{o['viewer']} showed a picture of the hostile message {name}: {o}"
            assert (o["w"], o["h"], o["step"], o["len"]) == (2, 2, 6, 12), f"{o['viewer']}: {o}"
    for h in result["hostile"]:
        missing = [n for n, s in h["probe_shown_s"].items() if s is None]
        assert not missing, (f"{missing} showed no valid picture after {h['name']} "
                             f"(a probe sent every 0.5 s for 5 s): " +
                             "; ".join(waiting.tail(viewers[n]["log"], 3) for n in missing))
    valid = result["valid"]
    for name, v in viewers.items():
        # at least a few: a viewer that stalls (2 shared cores) drops frames and waits for the next keyframe
        assert valid["shown"][name] >= 5, \
            f"{name} showed {valid['shown'][name]} of {valid['sent']} valid frames after the hostile messages"
        last = [o for o in result["outputs"] if o["viewer"] == name and o["frame_id"] == "valid"][-1]
        assert (last["w"], last["h"], last["step"], last["len"]) == (640, 480, 1920, 1920 * 480), last
        assert _red(last["px"], v["encoding"]), f"{name}: red block shown as {last['px']}"
        # libavcodec's log goes through ROS logging, throttled per message template
        assert v["libav_lines"] <= 200, f"{name}: {v['libav_lines']} libavcodec lines in its log"
        assert v["lines"] <= 400, f"{name}: {v['lines']} log lines"
