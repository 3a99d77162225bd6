"""The lab camera's real scene: frames of a video file, their identity on the wire, and PSNR.

The lab camera (rosnodes.py ``camera``) plays a video file, by default OpenCV's pedestrian scene
``vtest.avi`` (768x576, 795 frames, shipped by Debian's ``opencv-doc``), scaled to the camera's
size (640x480) and looped. A synthetic pattern flatters every codec; a real scene does not.

Frame identity
    The publisher writes the frame's index in the video into ``header.frame_id`` as
    ``<base>#<index>`` (``camera#123``, 0-based, restarting at 0 when the video loops). Every
    encoder of the project copies the raw image's header into its output (JPEG and H.264 alike),
    so a receiver of any stream knows which source frame it got without a side topic, and
    ``header.stamp`` (the send time) still gives the latency. :func:`tag_frame_id` and
    :func:`frame_index` are the two halves.

Decoding
    Frames are decoded on the fly (OpenCV's VideoCapture, one frame per publish) and scaled with
    ``cv2.INTER_AREA``, then converted to RGB: about 2 ms a frame on one core, so 4 cameras at
    30 Hz need about a quarter of one core. Holding the scaled video in memory would cost 730 MB
    per process (795 x 640x480x3). The receiver (probe_quality.py) rebuilds the same source frame
    with the same code (:class:`ReferenceFrames`: the same decoder walking forward, a small cache
    of recent frames), so its reference is bit-identical to what the publisher sent.

PSNR
    :func:`psnr`: 10 log10(255^2 / MSE) over all samples of the RGB frame (every channel, every
    pixel), the decoded picture against the source frame; identical frames give
    :data:`PSNR_IDENTICAL` (a cap, not infinity, so means stay finite).

Needs numpy and OpenCV (python3-opencv); no ROS.
"""
from __future__ import annotations

import math
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional, Tuple

DEFAULT_VIDEO = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")
"""A pedestrian scene, 768x576, 795 frames (Debian package opencv-doc)."""
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
    """PSNR in dB of ``decoded`` against ``source`` (uint8 arrays of one shape), over all samples;
    :data:`PSNR_IDENTICAL` when they are equal. ValueError when the shapes differ."""
    import numpy as np

    if decoded.shape != source.shape:
        raise ValueError(f"decoded picture {decoded.shape} and source frame {source.shape} differ in size")
    diff = decoded.astype(np.int16) - source.astype(np.int16)
    mse = float(np.mean(np.square(diff, dtype=np.int32)))
    if mse == 0.0:
        return PSNR_IDENTICAL
    return min(PSNR_IDENTICAL, 10.0 * math.log10(255.0 * 255.0 / mse))


class VideoError(Exception):
    """The video file cannot be opened or decoded (message names the file and the fix)."""


class VideoFrames:
    """Frames of a video file, scaled to ``width`` x ``height`` RGB (uint8, HxWx3), in order,
    looping: :meth:`next` returns ``(index, frame)`` with index 0..count-1.

    Not thread-safe: one owner calls :meth:`next` / :meth:`skip`.
    """

    def __init__(self, path: Path = DEFAULT_VIDEO, width: int = 640, height: int = 480) -> None:
        import cv2

        self.path, self.width, self.height = Path(path), width, height
        self._cv2 = cv2
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
            bgr = cv2.resize(bgr, (self.width, self.height), interpolation=cv2.INTER_AREA)
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

    def skip(self) -> int:
        """Decode past the next frame without scaling it (for seeking forward); returns its index."""
        if not self._cap.grab():
            self._wrap()
            if not self._cap.grab():
                raise VideoError(f"video {self.path}: frame 0 cannot be decoded")
        index = self._next
        self._next += 1
        return index

    @property
    def position(self) -> int:
        """Index of the frame :meth:`next` returns next (before a wrap is noticed)."""
        return self._next

    def rewind(self) -> None:
        """Start again at frame 0."""
        self._open()

    def close(self) -> None:
        """Release the decoder."""
        if self._cap is not None:
            self._cap.release()
            self._cap = None


class ReferenceFrames:
    """The source frame for an index, for a receiver that sees frames mostly in order, maybe with
    gaps (dropped frames) and wrap-arounds (the video loops): one :class:`VideoFrames` walking
    forward, the last ``keep`` frames cached. A request behind the cache rewinds to 0 and walks
    forward again (a loop of the video, or a stream that started over).

    Not thread-safe: one owner (a receiver's worker thread).
    """

    def __init__(self, path: Path = DEFAULT_VIDEO, width: int = 640, height: int = 480, keep: int = 16) -> None:
        self.video = VideoFrames(path, width, height)
        self.keep = keep
        self._cache: "OrderedDict[int, Any]" = OrderedDict()
        self.decoded = 0  # frames decoded to serve requests (CPU cost indicator)

    def get(self, index: int) -> Optional[Any]:
        """The RGB source frame ``index``; None when the video has no such frame."""
        if index in self._cache:
            return self._cache[index]
        if index < 0 or (self.video.count and index >= self.video.count):
            return None
        if index < self.video.position:
            self.video.rewind()
            self._cache.clear()
        while self.video.position < index:
            self.video.skip()
            self.decoded += 1
            if self.video.count and index >= self.video.count:  # shorter than its header said
                return None
        i, frame = self.video.next()
        self.decoded += 1
        if i != index:  # the video was shorter than its header said
            return None
        self._cache[i] = frame
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return frame

    def close(self) -> None:
        """Release the decoder."""
        self.video.close()
