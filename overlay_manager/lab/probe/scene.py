"""The lab camera's real scene: frames of a video file, their identity on the wire, and PSNR.

The lab camera (rosnodes.py ``camera``) plays a video file, by default OpenCV's pedestrian scene
``vtest.avi`` (768x576, 795 frames, shipped by Debian's ``opencv-doc``), scaled to the camera's
size (640x480) and looped. A synthetic pattern flatters every codec; a real scene does not.

Frame identity
    The publisher writes the frame's index in the video into ``header.frame_id`` as
    ``<base>#<index>`` (``camera#123``, 0-based, restarting at 0 when the video loops). Every
    encoder of the project copies the raw image's header into its output (JPEG and H.264 alike),
    so a receiver of any stream knows which source frame it got without a side topic (a side
    topic would have to be matched to frames by stamp, and would not survive a rosbag filter), and
    ``header.stamp`` (the send time) still gives the latency. :func:`tag_frame_id` and
    :func:`frame_index` are the two halves.

Decoding
    Decoded once per machine, played from memory: the first use decodes the video's first
    :data:`DEFAULT_FRAMES` frames (OpenCV's VideoCapture, FFmpeg backend), scales them with
    ``cv2.INTER_LINEAR`` to RGB and writes them to a cache file in /dev/shm
    (:func:`scene_file`); every camera and every receiver of the machine then memory-maps that
    one file (:class:`SceneFrames`), so publishing a frame is a copy (about 0.2 ms) and a
    receiver's reference frame costs nothing. Measured here for comparison, per 640x480 frame on
    one core: decoding 1.0-2.3 ms, INTER_LINEAR scaling 0.65-1.9 ms, the RGB conversion
    0.05-0.9 ms (the larger values with the machine's 2 cores busy): decoding on the fly would
    cost each camera 7-15 % of a core at 30 Hz and each receiver as much again for its
    references, 0.5-1.2 cores for four cameras and their viewer. ``INTER_AREA`` scaling alone
    costs 7.5 ms at this non-integer ratio (768x576 -> 640x480). The whole video (795 frames)
    would take 730 MB; 300 frames (a 10 s loop) take 276 MB, one copy for the machine.

PSNR
    :func:`psnr`: both pictures (the decoded one and its source frame, RGB) are converted to YUV
    4:2:0 (OpenCV's BT.601 ``COLOR_RGB2YUV_I420``, the same conversion for both) and
    10 log10(255^2 / MSE) is taken over all their Y, U and V samples: the PSNR that ffmpeg's psnr
    filter and codec comparisons report for yuv420p video (its "average"). Every codec here
    codes 4:2:0 (JPEG and H.264 alike), so this measures what the codec lost; a PSNR over the RGB
    samples would also count the chroma subsampling itself and caps at about 41 dB on this scene
    even for a lossless 4:2:0 round trip (H.264 at 1.5 Mbit/s: 40.9 dB here, 36.0 dB in RGB).
    Identical pictures give :data:`PSNR_IDENTICAL` (a cap, not infinity, so means stay finite).

Needs numpy and OpenCV (python3-opencv); no ROS.
"""
from __future__ import annotations

import fcntl
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Optional, Tuple

DEFAULT_VIDEO = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")
"""A pedestrian scene, 768x576, 795 frames (Debian package opencv-doc)."""
DEFAULT_FRAMES = 300
"""Frames of the video the camera loops by default: 10 s at 30 Hz (276 MB at 640x480 RGB, cached
once per machine)."""
PSNR_IDENTICAL = 99.0
"""PSNR reported for a picture identical to its source (dB)."""
_FRAME_ID = re.compile(r"#(\d+)$")


def tag_frame_id(base: str, index: int) -> str:
    """``base#index``: the header.frame_id of source frame ``index``."""
    return f"{base}#{index}"


def frame_index(frame_id: str) -> Optional[int]:
    """The source frame index in a frame_id written by :func:`tag_frame_id`; None without one."""
    m = _FRAME_ID.search(frame_id or "")
    return int(m.group(1)) if m else None


def psnr(decoded: Any, source: Any) -> float:
    """PSNR in dB of the RGB picture ``decoded`` against the RGB frame ``source`` (HxWx3 uint8,
    even sizes), over the Y, U and V samples of both converted to YUV 4:2:0 (see the module doc);
    :data:`PSNR_IDENTICAL` when equal. ValueError when the shapes differ."""
    import cv2

    if decoded.shape != source.shape:
        raise ValueError(f"decoded picture {decoded.shape} and source frame {source.shape} differ in size")
    return psnr_samples(cv2.cvtColor(decoded, cv2.COLOR_RGB2YUV_I420), cv2.cvtColor(source, cv2.COLOR_RGB2YUV_I420))


def psnr_samples(a: Any, b: Any) -> float:
    """10 log10(255^2 / MSE) over all samples of two uint8 arrays of one shape, capped at
    :data:`PSNR_IDENTICAL`. ValueError when the shapes differ."""
    import numpy as np

    if a.shape != b.shape:
        raise ValueError(f"pictures of {a.shape} and {b.shape} samples differ in size")
    diff = a.astype(np.int16) - b.astype(np.int16)
    mse = float(np.mean(np.square(diff, dtype=np.int32)))
    if mse == 0.0:
        return PSNR_IDENTICAL
    return min(PSNR_IDENTICAL, 10.0 * math.log10(255.0 * 255.0 / mse))


class VideoError(Exception):
    """The video file cannot be opened or decoded (message names the file and the fix)."""


class VideoFrames:
    """Frames of a video file, decoded and scaled to ``width`` x ``height`` RGB (uint8, HxWx3), in
    order, looping: :meth:`next` returns ``(index, frame)`` with index 0..count-1 (what
    :func:`scene_file` caches). Not thread-safe: one owner calls :meth:`next`."""

    def __init__(self, path: Path = DEFAULT_VIDEO, width: int = 640, height: int = 480) -> None:
        import cv2

        self.path, self.width, self.height = Path(path), width, height
        self._cv2 = cv2
        cv2.setNumThreads(1)  # 2 cores shared by 4 cameras: threads only add overhead
        if not self.path.is_file():
            raise VideoError(f"video {self.path} not found: install Debian's opencv-doc (scripts/setup does) "
                             "or give another file")
        self._cap: Any = None
        self._next = 0  # index of the frame the capture returns next
        self._open()
        n = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT))
        self.count = n if n > 0 else 0  # 0 = unknown until the first loop ends

    def _open(self) -> None:
        if self._cap is not None:
            self._cap.release()
        self._cap = self._cv2.VideoCapture(str(self.path))
        if not self._cap.isOpened():
            raise VideoError(f"video {self.path}: OpenCV cannot open it (python3-opencv with its FFmpeg backend)")
        self._next = 0

    def _scaled(self, bgr: Any) -> Any:
        cv2 = self._cv2
        if bgr.shape[1] != self.width or bgr.shape[0] != self.height:
            bgr = cv2.resize(bgr, (self.width, self.height), interpolation=cv2.INTER_LINEAR)
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)

    def _wrap(self) -> None:
        """End of the file: note the count, start again at frame 0."""
        if self._next == 0:
            raise VideoError(f"video {self.path}: no frame could be decoded")
        self.count = self._next
        self._open()

    def next(self) -> Tuple[int, Any]:
        """The next frame (index, RGB array), starting again at 0 after the last one."""
        ok, bgr = self._cap.read()
        if not ok:
            self._wrap()
            ok, bgr = self._cap.read()
            if not ok:
                raise VideoError(f"video {self.path}: frame 0 cannot be decoded")
        index = self._next
        self._next += 1
        return index, self._scaled(bgr)

    def close(self) -> None:
        """Release the decoder."""
        if self._cap is not None:
            self._cap.release()
            self._cap = None


def check_video(video: Path) -> Path:
    """``video`` as an absolute path once its first frame decodes (what a benchmark checks before
    it brings a lab up). Raises VideoError naming the file and what is wrong with it."""
    path = Path(video).expanduser().absolute()
    if path != DEFAULT_VIDEO and not path.is_file():
        raise VideoError(f"video {path}: no such file" if not path.exists() else f"video {path}: not a file")
    src = VideoFrames(path, 64, 48)
    try:
        src.next()
    finally:
        src.close()
    return path


def scene_label(video: Optional[Path] = None) -> str:
    """How reports name the scene a camera plays: the default video's description, or the file."""
    path = Path(video).absolute() if video else DEFAULT_VIDEO
    if path == DEFAULT_VIDEO:
        return f"{DEFAULT_VIDEO.name} (a pedestrian scene)"
    return str(path)


def cache_dir() -> Path:
    """Where scaled scenes are cached: /dev/shm (memory) when there is one, else the temp dir."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / "overlay_manager-scene"


def scene_file(video: Path, width: int, height: int, frames: int) -> Path:
    """The cache file of ``video``'s first ``frames`` frames scaled to width x height RGB (raw
    uint8, frame after frame), made on first use (under a lock: cameras starting together decode
    the video once) and shared by every process of the machine through the page cache."""
    video = Path(video)
    try:
        st = video.stat()
    except OSError as exc:
        raise VideoError(f"video {video} not found: install Debian's opencv-doc (scripts/setup does) "
                         f"or give another file ({exc.strerror})") from exc
    d = cache_dir()
    d.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = d / f"{video.stem}-{st.st_size}-{int(st.st_mtime)}-{width}x{height}-{frames}.rgb"
    with open(d / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            src = VideoFrames(video, width, height)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            try:
                with open(tmp, "wb") as f:
                    for _ in range(min(frames, src.count) if src.count else frames):
                        i, frame = src.next()
                        if i == 0 and f.tell():
                            break  # the video is shorter than its header said
                        f.write(frame.tobytes())
                os.replace(tmp, path)
            finally:
                src.close()
                if tmp.exists():
                    tmp.unlink()
    return path


class SceneFrames:
    """The scene as the lab camera plays it: frame ``i`` (0 <= i < count) of the video scaled to
    width x height RGB, from the shared cache file (:func:`scene_file`, memory-mapped: no decoding
    after the first use on the machine). ``frame(i)`` is a read-only HxWx3 uint8 array."""

    def __init__(self, video: Path = DEFAULT_VIDEO, width: int = 640, height: int = 480,
                 frames: int = DEFAULT_FRAMES) -> None:
        import numpy as np

        self.path = scene_file(Path(video), width, height, frames)
        size = self.path.stat().st_size
        self.count = size // (width * height * 3)
        if self.count == 0:
            raise VideoError(f"video {video}: no frame could be decoded")
        self._frames = np.memmap(self.path, dtype=np.uint8, mode="r", shape=(self.count, height, width, 3))

    def frame(self, index: int) -> Optional[Any]:
        """Frame ``index``; None outside 0..count-1."""
        return self._frames[index] if 0 <= index < self.count else None
