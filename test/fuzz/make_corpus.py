#!/usr/bin/python3
"""Writes the seed corpus of the fuzz targets (test/fuzz/corpus/<target>/) from real video.

    /usr/bin/python3 test/fuzz/make_corpus.py            # regenerate every seed
    /usr/bin/python3 test/fuzz/make_corpus.py --check    # only say what would be written, and the total size

Sources: opencv-doc's real scenes (vtest.avi, a pedestrian street; Megamind.avi, animation),
ffmpeg with libx264 for H.264 (Annex B, the settings the project's encoder uses:
``-preset ultrafast -tune zerolatency``, plus other encoders' habits: B-frames, CABAC, slices,
4:4:4, 4:0:0, 10-bit), python3-opencv and Pillow for JPEG and PNG, numpy for raw frames in every
sensor_msgs encoding. Files named ``regress-*`` (crashes found by fuzzing) are never touched.

Input formats (the targets' own comments are the reference):
  fuzz_h264_decode   one config byte, then access units separated by ``#AU#``
  fuzz_image_decode  one byte indexing kFormats of fuzz_image_decode.cpp, then JPEG/PNG bytes
  fuzz_h264_encode,
  fuzz_image_encode  the 8-byte raw-frame header of fuzz_input.h, then pixel bytes
The format and encoding tables are read from those C++ files, so an index here cannot drift.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import cv2
import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
DATA = Path("/usr/share/doc/opencv-doc/examples/data")
VTEST = DATA / "vtest.avi"
MEGAMIND = DATA / "Megamind.avi"
DELIMITER = b"#AU#"
BUDGET = 2 << 20  # bytes of seeds in all (the repository keeps them)

# ---- the C++ tables ----------------------------------------------------------------------------


def _cpp_strings(block: str) -> List[str]:
    """The entries of a C++ initializer list of strings: "x", std::string("x", n), std::string(n, 'c')."""
    out = []
    token = re.compile(r'std::string\("((?:[^"\\]|\\.)*)",\s*(\d+)\)'
                       r"|std::string\((\d+),\s*'(.)'\)"
                       r'|"((?:[^"\\]|\\.)*)"')
    for m in token.finditer(re.sub(r"//[^\n]*", "", block)):
        if m.group(2):
            s = bytes(m.group(1), "ascii").decode("unicode_escape")
            out.append((s + "\0" * int(m.group(2)))[: int(m.group(2))])
        elif m.group(3):
            out.append(m.group(4) * int(m.group(3)))
        else:
            out.append(bytes(m.group(5), "ascii").decode("unicode_escape"))
    return out


def _table(path: Path, start: str) -> List[str]:
    text = path.read_text(encoding="utf-8")
    i = text.index(start)
    return _cpp_strings(text[text.index("{", i) + 1: text.index("};", i)])


FORMATS = _table(HERE / "fuzz_image_decode.cpp", "kFormats =")
ENCODINGS = _table(HERE / "fuzz_input.h", "static const std::vector<std::string> names =")
assert ENCODINGS[:2] == ["rgb8", "rgba8"] and "yuv422" in ENCODINGS and FORMATS[0].startswith("rgb8; jpeg")

# ---- real frames -------------------------------------------------------------------------------

_frames: Dict[Path, List[np.ndarray]] = {}


def frames(video: Path, count: int = 40) -> List[np.ndarray]:
    """The first `count` BGR frames of a video (cached)."""
    if video not in _frames:
        cap = cv2.VideoCapture(str(video))
        got = []
        while len(got) < count:
            ok, f = cap.read()
            if not ok:
                break
            got.append(f)
        cap.release()
        if not got:
            sys.exit(f"make_corpus: cannot read {video} (install opencv-doc)")
        _frames[video] = got
    return _frames[video]


def scene(video: Path, width: int, height: int, index: int = 10) -> np.ndarray:
    return cv2.resize(frames(video)[index], (width, height), interpolation=cv2.INTER_AREA)


# ---- H.264 -------------------------------------------------------------------------------------


def x264(video: Path, width: int, height: int, count: int, *, preset: str = "ultrafast",
         tune: Optional[str] = "zerolatency", crf: int = 23, gop: int = 30, pix_fmt: str = "yuv420p",
         params: str = "", start: int = 0) -> bytes:
    """`count` frames of `video` scaled to width x height as an Annex B stream from ffmpeg's libx264."""
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-i", str(video),
           "-vf", f"select=gte(n\\,{start}),scale={width}:{height}:flags=area,format={pix_fmt}",
           "-frames:v", str(count), "-c:v", "libx264", "-preset", preset]
    if tune:
        cmd += ["-tune", tune]
    cmd += ["-crf", str(crf), "-g", str(gop), "-threads", "1", "-pix_fmt", pix_fmt]
    if params:
        cmd += ["-x264-params", params]
    cmd += ["-bsf:v", "h264_mp4toannexb", "-f", "h264", "-"]
    run = subprocess.run(cmd, capture_output=True, check=False)
    if run.returncode != 0 or not run.stdout:
        sys.exit(f"make_corpus: ffmpeg failed: {' '.join(cmd)}\n{run.stderr.decode(errors='replace')}")
    return run.stdout


def nal_units(stream: bytes) -> List[bytes]:
    """NAL units of an Annex B stream, each with its start code."""
    starts = [m.start() for m in re.finditer(b"\x00\x00\x01", stream)]
    out = []
    for i, s in enumerate(starts):
        begin = s - 1 if s > 0 and stream[s - 1] == 0 else s
        end = starts[i + 1] if i + 1 < len(starts) else len(stream)
        if i + 1 < len(starts) and stream[end - 1] == 0:
            end -= 1
        out.append(stream[begin:end])
    return out


def _nal_type(nal: bytes) -> int:
    return nal[nal.index(b"\x00\x01") + 2] & 0x1F


def _first_mb_zero(nal: bytes) -> bool:
    """first_mb_in_slice == 0: ue(v) 0 is the single bit 1."""
    header = nal.index(b"\x00\x01") + 2
    return bool(nal[header + 1] & 0x80)


def access_units(stream: bytes) -> List[bytes]:
    """The stream cut into access units (one picture each), as an encoder sends them one per message."""
    aus: List[List[bytes]] = []
    current: List[bytes] = []
    have_slice = False
    for nal in nal_units(stream):
        t = _nal_type(nal)
        starts_new = (t in (1, 5) and _first_mb_zero(nal)) or t in (6, 7, 8, 9)
        if have_slice and starts_new:
            aus.append(current)
            current, have_slice = [], False
        current.append(nal)
        have_slice = have_slice or t in (1, 5)
    if current:
        aus.append(current)
    return [b"".join(a) for a in aus]


COUNTER_UUID = bytes([0x2B, 0x66, 0x0C, 0x53, 0x16, 0x0F, 0x40, 0x4E, 0xAA, 0x0B, 0x5F, 0x3F, 0xF8, 0x21, 0xEB, 0x22])


def counter_sei(stream_id: int, frame: int) -> bytes:
    """The project encoder's frame counter SEI (include/overlay_manager/h264_codec.h): payload type 5,
    UUID, version 1, stream id, frame number; emulation prevention applied."""
    payload = COUNTER_UUID + bytes([1]) + struct.pack(">IQ", stream_id, frame)
    rbsp = bytes([5, len(payload)]) + payload + b"\x80"
    out, zeros = bytearray(b"\x00\x00\x00\x01\x06"), 0
    for b in rbsp:
        if zeros >= 2 and b <= 3:
            out.append(3)
            zeros = 0
        out.append(b)
        zeros = zeros + 1 if b == 0 else 0
    return bytes(out)


def with_counter(aus: Sequence[bytes], stream_id: int, first: int = 0) -> List[bytes]:
    """The access units as the project's encoder sends them: its counter SEI before the first slice."""
    out = []
    for i, au in enumerate(aus):
        nals = nal_units(au)
        k = next(j for j, n in enumerate(nals) if _nal_type(n) in (1, 5))
        out.append(b"".join(nals[:k]) + counter_sei(stream_id, first + i) + b"".join(nals[k:]))
    return out


def decode_seed(aus: Sequence[bytes], config: int = 0) -> bytes:
    return bytes([config]) + DELIMITER.join(aus)


def _sid(name: str) -> int:
    return int.from_bytes(hashlib.sha1(name.encode()).digest()[:4], "big")


def h264_decode_seeds() -> Iterator[Tuple[str, bytes]]:
    # the project's own stream (x264 ultrafast/zerolatency + the counter SEI), 3 frames, at widths
    # that are odd-sized pictures' crops, tiny, not multiples of 16, and 1080p
    sizes = [(2, 2), (4, 4), (8, 8), (28, 30), (96, 64), (330, 250), (640, 480), (648, 480), (650, 482),
             (654, 480), (808, 600), (1288, 720)]
    for w, h in sizes:
        name = f"vtest-{w}x{h}"
        yield name, decode_seed(with_counter(access_units(x264(VTEST, w, h, 3)), _sid(name)), config=0)
    yield "vtest-1920x1080-crf35", decode_seed(
        with_counter(access_units(x264(VTEST, 1920, 1080, 3, crf=35)), _sid("1080")), config=1)
    # one 4K IDR (over the fuzz limits: the refusal), low quality to stay small
    yield "vtest-3840x2160-idr", decode_seed(access_units(x264(VTEST, 3840, 2160, 1, crf=51)), config=0)
    # other encoders' habits (no counter SEI: checked by frame_num)
    yield "megamind-330x250-plain", decode_seed(access_units(x264(MEGAMIND, 330, 250, 4)), config=2)
    yield "megamind-176x144-bframes", decode_seed(
        access_units(x264(MEGAMIND, 176, 144, 6, preset="medium", tune=None, gop=4)), config=0)
    yield "megamind-320x240-cabac", decode_seed(access_units(x264(MEGAMIND, 320, 240, 3, preset="fast")), config=1)
    yield "vtest-648x480-slices4", decode_seed(access_units(x264(VTEST, 648, 480, 2, params="slices=4")), config=0)
    yield "vtest-33x17-yuv444", decode_seed(access_units(x264(VTEST, 33, 17, 3, pix_fmt="yuv444p")), config=0)
    yield "vtest-65x47-yuv444", decode_seed(access_units(x264(VTEST, 65, 47, 2, pix_fmt="yuv444p")), config=2)
    yield "vtest-64x48-gray", decode_seed(access_units(x264(VTEST, 64, 48, 3, pix_fmt="gray")), config=2)
    yield "vtest-64x48-10bit", decode_seed(access_units(x264(VTEST, 64, 48, 3, pix_fmt="yuv420p10le")), config=0)
    yield "vtest-66x50-yuv422", decode_seed(access_units(x264(VTEST, 66, 50, 2, pix_fmt="yuv422p")), config=1)

    # message sequences a viewer sees on a real network: 12 frames, GOP 4, with the counter
    aus = with_counter(access_units(x264(VTEST, 96, 64, 12, gop=4)), _sid("seq"))
    other = with_counter(access_units(x264(MEGAMIND, 96, 64, 4, gop=4)), _sid("other"))
    yield "seq-96x64-clean", decode_seed(aus)
    yield "seq-96x64-late-joiner", decode_seed(aus[2:])
    yield "seq-96x64-lost-p", decode_seed(aus[:2] + aus[3:])
    yield "seq-96x64-duplicate-p", decode_seed(aus[:3] + [aus[2]] + aus[3:8])
    yield "seq-96x64-missed-gop", decode_seed(aus[:3] + aus[9:])  # the next GOP goes on as P frames
    yield "seq-96x64-lost-across-idr", decode_seed(aus[:3] + aus[5:])
    yield "seq-96x64-new-stream", decode_seed(aus[:3] + other[1:] + other[:2])
    yield "seq-96x64-reset", decode_seed(aus[:6], config=4)
    yield "seq-96x64-truncated", decode_seed([aus[0][: len(aus[0]) // 2]] + aus[1:4] + [aus[4][:-7]] + aus[5:7])
    idr = nal_units(aus[0])
    ps = [n for n in idr if _nal_type(n) in (7, 8)]
    yield "seq-96x64-split-nals", decode_seed(ps + [b"".join(n for n in idr if n not in ps)] + aus[1:3] + [b""])
    small = with_counter(access_units(x264(VTEST, 64, 96, 2)), _sid("turned"))
    yield "seq-resolution-change", decode_seed(aus[:2] + small + aus[4:6])


# ---- JPEG and PNG ------------------------------------------------------------------------------


def _fmt(name: str) -> int:
    return FORMATS.index(name)


def _jpeg(img: np.ndarray, quality: int = 80, **extra: int) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    for k, v in extra.items():
        params += [getattr(cv2, k), v]
    ok, buf = cv2.imencode(".jpg", img, params)
    assert ok
    return buf.tobytes()


def _png(img: np.ndarray, level: int = 6) -> bytes:
    ok, buf = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, level])
    assert ok
    return buf.tobytes()


def _pil(img: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **kw)
    return out.getvalue()


def image_decode_seeds() -> Iterator[Tuple[str, bytes]]:
    sizes = [(1, 1), (2, 2), (7, 5), (28, 30), (64, 48), (330, 250), (648, 480)]
    for w, h in sizes:
        colour = scene(VTEST, w, h)
        grey = cv2.cvtColor(colour, cv2.COLOR_BGR2GRAY)
        yield f"jpeg-bgr8-{w}x{h}", bytes([_fmt("bgr8; jpeg compressed bgr8")]) + _jpeg(colour, 75)
        yield f"jpeg-mono8-{w}x{h}", bytes([_fmt("mono8; jpeg compressed ")]) + _jpeg(grey, 75)
        if w * h <= 64 * 48:
            yield f"png-bgr8-{w}x{h}", bytes([_fmt("bgr8; png compressed bgr8")]) + _png(colour)
            yield f"png-mono8-{w}x{h}", bytes([_fmt("mono8; png compressed ")]) + _png(grey)
            yield f"png-bgr16-{w}x{h}", bytes([_fmt("bgr16; png compressed bgr16")]) + _png(
                colour.astype(np.uint16) * 257)
            yield f"png-mono16-{w}x{h}", bytes([_fmt("mono16; png compressed ")]) + _png(grey.astype(np.uint16) * 257)
            bgra = cv2.cvtColor(colour, cv2.COLOR_BGR2BGRA)
            bgra[..., 3] = grey
            yield f"png-bgra8-{w}x{h}", bytes([_fmt("rgba8; png compressed bgra8")]) + _png(bgra)
    big = scene(MEGAMIND, 1920, 1080)
    yield "jpeg-rgb8-1920x1080-q20", bytes([_fmt("rgb8; jpeg compressed bgr8")]) + _jpeg(big, 20)
    mid = scene(MEGAMIND, 330, 250)
    mid_grey = cv2.cvtColor(mid, cv2.COLOR_BGR2GRAY)
    yield "png-mono16-330x250", bytes([_fmt("mono16; png compressed ")]) + _png(mid_grey.astype(np.uint16) * 257, 9)
    yield "png-bgr8-330x250-megamind", bytes([_fmt("rgb8; png compressed bgr8")]) + _png(mid, 9)
    yield "jpeg-progressive-330x250", bytes([_fmt("rgb8; jpeg compressed bgr8")]) + _jpeg(
        mid, 60, IMWRITE_JPEG_PROGRESSIVE=1)
    yield "jpeg-restart-330x250", bytes([_fmt("bgr8; jpeg compressed bgr8")]) + _jpeg(
        mid, 60, IMWRITE_JPEG_RST_INTERVAL=4)
    yield "jpeg-optimized-330x250", bytes([_fmt("bgr8; jpeg compressed bgr8")]) + _jpeg(
        mid, 60, IMWRITE_JPEG_OPTIMIZE=1)
    yield "jpeg-444-330x250", bytes([_fmt("bgr8; jpeg compressed bgr8")]) + _pil(
        Image.fromarray(mid[..., ::-1]), "JPEG", quality=60, subsampling=0)
    yield "jpeg-cmyk-64x48", bytes([_fmt("bgr8; jpeg compressed bgr8")]) + _pil(
        Image.fromarray(scene(MEGAMIND, 64, 48)[..., ::-1]).convert("CMYK"), "JPEG", quality=70)
    small = Image.fromarray(scene(MEGAMIND, 64, 48)[..., ::-1])
    yield "png-palette-64x48", bytes([_fmt("bgr8; png compressed bgr8")]) + _pil(small.convert("P"), "PNG")
    yield "png-1bit-64x48", bytes([_fmt("mono8; png compressed ")]) + _pil(small.convert("1"), "PNG")
    yield "png-grey-alpha-64x48", bytes([_fmt("mono8; png compressed ")]) + _pil(small.convert("LA"), "PNG")
    # labels that do not match the data, older formats
    colour = scene(VTEST, 64, 48)
    yield "jpeg-labelled-16UC1", bytes([_fmt("16UC1; jpeg compressed bgr8")]) + _jpeg(colour)
    yield "jpeg-labelled-mono16", bytes([_fmt("mono16; jpeg compressed ")]) + _jpeg(colour)
    yield "png-labelled-32FC1", bytes([_fmt("32FC1; png compressed ")]) + _png(colour)
    yield "jpeg-bare-format", bytes([_fmt("jpeg")]) + _jpeg(colour)
    yield "png-as-jpeg", bytes([_fmt("bgr8; jpeg compressed bgr8")]) + _png(colour)
    yield "jpeg-truncated", bytes([_fmt("bgr8; jpeg compressed bgr8")]) + _jpeg(colour)[:-300]


# ---- raw frames for the encode targets ---------------------------------------------------------


def _enc(name: str) -> int:
    return ENCODINGS.index(name)


def _bayer(bgr: np.ndarray, pattern: str) -> np.ndarray:
    """A Bayer mosaic of a BGR picture; pattern names the 2x2 cell row by row (rggb, bggr, ...)."""
    channel = {"b": 0, "g": 1, "r": 2}
    out = np.zeros(bgr.shape[:2], dtype=bgr.dtype)
    for i, c in enumerate(pattern):
        dy, dx = divmod(i, 2)
        out[dy::2, dx::2] = bgr[dy::2, dx::2, channel[c]]
    return out


def _uyvy(bgr: np.ndarray) -> np.ndarray:
    """yuv422 (UYVY, as sensor_msgs means it) of a BGR picture with an even width."""
    yuv = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV)
    h, w = yuv.shape[:2]
    out = np.zeros((h, w, 2), dtype=np.uint8)
    out[:, :, 1] = yuv[:, :, 0]
    out[:, 0::2, 0] = ((yuv[:, 0::2, 1].astype(int) + yuv[:, 1::2, 1]) // 2).astype(np.uint8)
    out[:, 1::2, 0] = ((yuv[:, 0::2, 2].astype(int) + yuv[:, 1::2, 2]) // 2).astype(np.uint8)
    return out


def pixels(encoding: str, bgr: np.ndarray) -> np.ndarray:
    """A real picture in `encoding`, little-endian rows (H x W x bytes per pixel as uint8)."""
    grey = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
    if encoding.startswith("bayer_"):
        img = _bayer(bgr, encoding[6:10])
        if encoding.endswith("16"):
            img = img.astype("<u2") * 257
    else:
        img = {
            "rgb8": bgr[..., ::-1], "bgr8": bgr, "mono8": grey,
            "rgba8": cv2.cvtColor(bgr, cv2.COLOR_BGR2RGBA), "bgra8": cv2.cvtColor(bgr, cv2.COLOR_BGR2BGRA),
            "rgb16": bgr[..., ::-1].astype("<u2") * 257, "bgr16": bgr.astype("<u2") * 257,
            "rgba16": cv2.cvtColor(bgr, cv2.COLOR_BGR2RGBA).astype("<u2") * 257,
            "bgra16": cv2.cvtColor(bgr, cv2.COLOR_BGR2BGRA).astype("<u2") * 257,
            "mono16": grey.astype("<u2") * 257, "yuv422": _uyvy(bgr) if bgr.shape[1] % 2 == 0 else None,
            "16UC1": grey.astype("<u2") * 40, "32FC1": (grey / 255.0).astype("<f4"),
            "8UC3": bgr, "8UC1": grey, "64FC1": (grey / 255.0).astype("<f8"),
        }[encoding]
    if img is None:
        raise ValueError(encoding)
    img = np.ascontiguousarray(img)
    return img.view(np.uint8).reshape(img.shape[0], img.shape[1], -1)


def raw_seed(encoding: str, bgr: np.ndarray, *, pad: int = 0, flags: int = 0, quality: int = 80) -> bytes:
    """A frame of `encoding` whose header tells the truth: exact (or padded by `pad` bytes) step,
    data = step x height, filled with the real picture."""
    px = pixels(encoding, bgr)
    h, w, bpp = px.shape
    rows = px.reshape(h, w * bpp)
    if pad:
        rows = np.hstack([rows, np.full((h, pad), 0xA5, np.uint8)])
    assert w <= 96 and h <= 96 and pad < 32
    header = bytes([_enc(encoding), w, h, (pad << 3) | (1 if pad else 0), 0, flags, quality, 0])
    return header + rows.tobytes()


def raw_lie(encoding: str, *, width: int, height: int, step: int, size: int, flags: int = 0,
            fill: bytes = b"") -> bytes:
    """A header that lies: raw fields as fuzz_input.h reads them (modes packed by the caller)."""
    return bytes([_enc(encoding), width, height, step, size, flags, 50, 0]) + fill


BIG = 1  # fuzz_input.h kBigSides
ALT = 4  # kAlt: PNG instead of JPEG
FRESH = 32  # kFresh: a fresh H.264 encoder


def raw_seeds() -> Iterator[Tuple[str, bytes]]:
    honest = ["rgb8", "bgr8", "mono8", "rgba8", "bgra8", "rgb16", "bgr16", "rgba16", "bgra16", "mono16",
              "bayer_rggb8", "bayer_bggr8", "bayer_gbrg8", "bayer_grbg8", "bayer_rggb16", "bayer_grbg16",
              "yuv422", "16UC1", "32FC1", "8UC3", "8UC1", "64FC1"]
    for i, e in enumerate(honest):
        yield f"raw-{e}-32x24", raw_seed(e, scene(VTEST, 32, 24, 5 + i), flags=ALT if i % 3 == 0 else 0)
    yield "raw-bgr8-48x32-fresh-encoder", raw_seed("bgr8", scene(MEGAMIND, 48, 32), flags=FRESH | ALT)
    for e in ("rgb8", "bgr8", "mono8"):
        yield f"raw-{e}-96x96", raw_seed(e, scene(MEGAMIND, 96, 96))
        yield f"raw-{e}-33x25-padded", raw_seed(e, scene(VTEST, 33, 25), pad=5, flags=ALT)
        yield f"raw-{e}-2x2", raw_seed(e, scene(VTEST, 2, 2))
        yield f"raw-{e}-1x1", raw_seed(e, scene(VTEST, 1, 1))
    yield "raw-bgra8-95x61-padded", raw_seed("bgra8", scene(VTEST, 95, 61), pad=12)
    yield "raw-yuv422-30x20-padded", raw_seed("yuv422", scene(VTEST, 30, 20), pad=4, flags=ALT)
    # lying frames (mode bits: step low 3 bits, size low 3 bits; fuzz_input.h)
    sides = [0, 1, 2, 97, 1920, 3840, 8192, 8193, 16000, 65535, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
    s1920 = sides.index(1920)
    fill = scene(VTEST, 10, 10).tobytes()[:100]
    yield "lie-bgr8-1920x1920-100-bytes", raw_lie("bgr8", width=s1920, height=s1920, step=0, size=5, flags=BIG,
                                                  fill=fill)
    yield "lie-rgb8-3840x3840-step0", raw_lie("rgb8", width=sides.index(3840), height=sides.index(3840), step=3,
                                              size=4 | (8 << 3), flags=BIG, fill=fill)
    yield "lie-mono8-negative-width", raw_lie("mono8", width=sides.index(0xFFFFFFFF), height=2, step=0, size=5,
                                              flags=BIG, fill=fill)
    yield "lie-bgr8-64x48-short-step", raw_lie("bgr8", width=64, height=48, step=2 | (10 << 3), size=0, fill=fill)
    yield "lie-rgba8-64x48-short-data", raw_lie("rgba8", width=64, height=48, step=0, size=1 | (31 << 3), fill=fill)
    yield "lie-mono16-64x48-half-data", raw_lie("mono16", width=64, height=48, step=0, size=6, fill=fill)
    yield "lie-bgr8-1000-bytes-step0", raw_lie("bgr8", width=96, height=96, step=3, size=5, fill=fill * 10)
    yield "lie-jpeg-name", raw_lie("jpeg", width=32, height=24, step=0, size=0, fill=fill)
    yield "lie-empty-name-png", raw_lie("", width=32, height=24, step=0, size=0, flags=ALT, fill=fill)
    yield "lie-8UC99999999999", raw_lie("8UC99999999999", width=8, height=8, step=0, size=0, fill=fill)
    yield "lie-yuv422-odd-width", raw_lie("yuv422", width=33, height=8, step=0, size=0, fill=fill)
    yield "lie-bayer-odd-size", raw_lie("bayer_rggb8", width=33, height=25, step=0, size=0, flags=ALT, fill=fill)
    yield "lie-huge-step", raw_lie("mono8", width=16, height=16, step=5, size=7, fill=fill)


# ---- writing -----------------------------------------------------------------------------------

TARGETS = {
    "fuzz_h264_decode": h264_decode_seeds,
    "fuzz_image_decode": image_decode_seeds,
    "fuzz_h264_encode": raw_seeds,
    "fuzz_image_encode": raw_seeds,
}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing: list the seeds and their total size")
    args = parser.parse_args(argv)
    total = 0
    for target, make in TARGETS.items():
        seeds = dict(make())
        size = sum(len(v) for v in seeds.values())
        total += size
        print(f"{target}: {len(seeds)} seeds, {size / 1024:.0f} KiB")
        if args.check:
            continue
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            if old.is_file() and not old.name.startswith("regress-") and old.name != "README.md":
                old.unlink()
        for name, data in seeds.items():
            (folder / name).write_bytes(data)
    print(f"total {total / 1024:.0f} KiB (budget {BUDGET // 1024} KiB)")
    if total > BUDGET:
        print("make_corpus: over the budget: the repository keeps these files; make them smaller", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
