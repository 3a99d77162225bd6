"""A robot's heavy sensor data from a real scene, generated at run time: a coloured point cloud,
a laser scan and a large occupancy grid (no ROS; the lab's publisher turns them into messages).

Where the data comes from
    Debian's ``opencv-doc`` ships a stereo pair with its ground-truth disparity
    (/usr/share/doc/opencv-doc/examples/data/ ``aloeL.jpg``, ``aloeR.jpg``, ``aloeGT.png``:
    the "Aloe" scene of the Middlebury 2006 stereo datasets, 1282x1110 pixels, a plant in front
    of a backdrop, measured with structured light). ``aloeGT.png`` holds, per pixel of the left
    image, the horizontal shift in pixels to the same point in the right image (43-211; 0 =
    unknown, 3.5 % of the pixels). Checked here by template matching: the shift between the two
    pictures equals the stored value.

The camera model assumed (:class:`Camera`; the files carry no calibration)
    A rectified pinhole pair, fx = fy = 3740 px and baseline 0.16 m (the rig the Middlebury 2006
    pages give for their full-size images), principal point at the image centre, and a
    disparity offset of 270 px added to the stored shift (the pictures are crops of a wider pair;
    without an offset the backdrop would be 14 m away). Depth Z = fx * baseline / (shift +
    offset): 1.24 m (shift 211) to 1.91 m (shift 43), a table-top scene about 0.6 m wide. The
    camera's optical frame: x right, y down, z forward.

What is made from it
    :func:`point_cloud`: every ``stride``-th pixel of the left image (stride 2: 641 x 555 =
    355,755 points) as an organized cloud (x, y, z, rgb float32, 16 bytes a point: the layout of
    stereo_image_proc's ``points2``), NaN where the depth is unknown; 5.69 MB a cloud, 455
    Mbit/s at 10 Hz.
    :func:`laser_scan`: a band of rows around the image centre (``band`` rows) turned into a
    planar scan as depthimage_to_laserscan does: one beam per image column (1282 beams over the
    camera's 19.4 degrees), the nearest point of the band per beam, +inf where none (REP 117),
    intensities = the grey level there. 10.3 KB a scan, 3.3 Mbit/s at 40 Hz.
    :func:`occupancy_grid`: the ground-truth depth seen as terrain, one cell per pixel: occupied
    (100) where the depth steps by more than ``step_m`` to a neighbour (an obstacle's edge),
    unknown (-1) where the depth is unknown, costs inflated around occupied cells (99 down to 1
    over ``inflation_cells``, as costmap_2d's inflation does), free (0) elsewhere; tiled
    ``tiles`` x ``tiles`` (mirrored, so the tiles meet) to the size of a campus map: 2 x 2 =
    2564 x 2220 cells at 0.05 m, 5.69 MB, 45.5 Mbit/s at 1 Hz.

Frames differ like a real sensor's (``variant``): the cloud's shifts get a Gaussian noise of
:data:`DISPARITY_NOISE_PX`, the scan's ranges :data:`RANGE_NOISE_M`, seeded by ``variant``, so
two frames are not byte-identical (which would flatter compression) and the same variant is the
same bytes on every run. The grid is a map: the same every second.

Synthetic option (:func:`synthetic_scene`): a smooth random shift field (planes and blobs, same
range and a few unknown holes) with a gradient picture, same sizes: for machines without
opencv-doc or to see what real structure changes.

Needs numpy; OpenCV (python3-opencv) to read the files and for the grid's inflation.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, List, NamedTuple, Optional, Tuple

DATA_DIR = Path("/usr/share/doc/opencv-doc/examples/data")
"""Debian's opencv-doc sample data (aloeL.jpg, aloeR.jpg, aloeGT.png)."""
DISPARITY_NOISE_PX = 0.25
"""Per-frame noise of a cloud's stereo shift (px, one standard deviation)."""
RANGE_NOISE_M = 0.01
"""Per-frame noise of a scan's ranges (m, one standard deviation; a 2D lidar's is 10-30 mm)."""
POINT_STEP = 16
"""Bytes per cloud point: x, y, z, rgb as float32."""


class Camera(NamedTuple):
    """The assumed rectified stereo camera (see the module doc). fx, cx, cy in pixels of the
    full-size image; baseline in m; offset_px added to a stored shift to give the disparity."""

    fx: float = 3740.0
    baseline_m: float = 0.16
    offset_px: float = 270.0
    cx: Optional[float] = None  # None: the image centre
    cy: Optional[float] = None


class Scene(NamedTuple):
    """A left picture and its per-pixel shift. ``bgr``: HxWx3 uint8 (OpenCV's order); ``shift``:
    HxW float32 pixels, 0 where unknown; ``source``: where it comes from (for reports)."""

    bgr: Any
    shift: Any
    source: str


class Cloud(NamedTuple):
    """A sensor_msgs/PointCloud2's content: organized ``height`` x ``width``, fields x, y, z,
    rgb (float32 at offsets 0, 4, 8, 12), :data:`POINT_STEP` bytes a point, little-endian,
    ``data`` row after row; ``valid`` points with a depth (the others are NaN)."""

    width: int
    height: int
    data: bytes
    valid: int


class Scan(NamedTuple):
    """A sensor_msgs/LaserScan's content (angles in rad, ranges in m, +inf = no return)."""

    angle_min: float
    angle_max: float
    angle_increment: float
    range_min: float
    range_max: float
    ranges: List[float]
    intensities: List[float]


class Grid(NamedTuple):
    """A nav_msgs/OccupancyGrid's content: ``width`` x ``height`` cells of ``resolution`` m,
    ``data`` int8 row after row (row 0 at the origin), -1 unknown, 0 free, 1-99 cost, 100
    occupied."""

    width: int
    height: int
    resolution: float
    data: bytes


def load_scene(data_dir: Path = DATA_DIR) -> Scene:
    """The Aloe pair's left picture and ground-truth shift (see the module doc).

    Raises:
        FileNotFoundError: a file is missing (names it and the Debian package that has it).
    """
    import cv2
    import numpy as np

    left, gt = Path(data_dir) / "aloeL.jpg", Path(data_dir) / "aloeGT.png"
    for f in (left, gt):
        if not f.is_file():
            raise FileNotFoundError(f"{f} not found: install Debian's opencv-doc (scripts/setup does), "
                                    "or use the synthetic scene")
    bgr = cv2.imread(str(left), cv2.IMREAD_COLOR)
    shift = cv2.imread(str(gt), cv2.IMREAD_UNCHANGED)
    if bgr is None or shift is None or shift.ndim != 2 or bgr.shape[:2] != shift.shape:
        raise FileNotFoundError(f"{left} / {gt}: unreadable or of different sizes")
    return Scene(bgr, shift.astype(np.float32), f"{left.name} + {gt.name} (opencv-doc, Middlebury 2006 Aloe)")


def synthetic_scene(width: int = 1282, height: int = 1110, seed: int = 7) -> Scene:
    """A made-up scene of the real one's size and shift range: a sloped backdrop, a few round
    objects in front (blobs of larger shift), 3 % unknown pixels in small holes, a colour
    gradient with texture. Deterministic for a seed."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    shift = 45.0 + 20.0 * xs / width + 10.0 * ys / height
    for _ in range(6):
        cx, cy = rng.uniform(0.15, 0.85) * width, rng.uniform(0.15, 0.85) * height
        r = rng.uniform(0.05, 0.15) * width
        inside = (xs - cx) ** 2 + (ys - cy) ** 2 < r * r
        shift[inside] = rng.uniform(90, 205)
    holes = rng.random((height // 8 + 1, width // 8 + 1)) < 0.03
    shift[np.kron(holes, np.ones((8, 8), dtype=bool))[:height, :width]] = 0.0
    tex = rng.integers(0, 40, size=(height, width, 1))
    base = np.stack([xs * 200.0 / width, ys * 200.0 / height, np.full_like(xs, 90.0)], axis=2)
    bgr = np.clip(base + tex, 0, 255).astype(np.uint8)
    return Scene(bgr, shift.astype(np.float32), f"synthetic (seed {seed})")


def _centre(cam: Camera, width: int, height: int) -> Tuple[float, float]:
    return (cam.cx if cam.cx is not None else (width - 1) / 2.0,
            cam.cy if cam.cy is not None else (height - 1) / 2.0)


def depth(scene: Scene, cam: Camera = Camera(), noise_px: float = 0.0, seed: int = 0) -> Any:
    """Depth Z (m, HxW float32) per pixel; NaN where the shift is unknown. ``noise_px``: a
    Gaussian noise added to the known shifts (seeded), as a stereo matcher's would be."""
    import numpy as np

    shift = scene.shift
    if noise_px > 0:
        shift = shift + np.random.default_rng(seed).normal(0.0, noise_px, shift.shape).astype(np.float32)
    z = np.full(shift.shape, np.nan, dtype=np.float32)
    known = scene.shift > 0
    z[known] = cam.fx * cam.baseline_m / (shift[known] + cam.offset_px)
    return z


def point_cloud(scene: Scene, stride: int = 2, variant: int = 0, cam: Camera = Camera(),
                noise_px: float = DISPARITY_NOISE_PX) -> Cloud:
    """The organized coloured cloud of every ``stride``-th pixel (see the module doc); frame
    ``variant`` (its noise seed)."""
    import numpy as np

    if stride < 1:
        raise ValueError(f"stride {stride}: must be >= 1")
    h, w = scene.shift.shape
    cx, cy = _centre(cam, w, h)
    z = depth(scene, cam, noise_px, seed=1000 + variant)[::stride, ::stride]
    vs, us = np.mgrid[0:h:stride, 0:w:stride].astype(np.float32)
    x = (us - cx) * z / cam.fx
    y = (vs - cy) * z / cam.fx
    bgr = scene.bgr[::stride, ::stride].astype(np.uint32)
    rgb = ((bgr[..., 2] << 16) | (bgr[..., 1] << 8) | bgr[..., 0]).astype("<u4")
    pts = np.empty(z.shape + (4,), dtype="<f4")
    pts[..., 0], pts[..., 1], pts[..., 2] = x, y, z
    pts[..., 3] = rgb.view("<f4")  # PCL's packed rgb: 0x00RRGGBB read as a float32
    return Cloud(width=z.shape[1], height=z.shape[0], data=pts.tobytes(), valid=int(np.count_nonzero(~np.isnan(z))))


def laser_scan(scene: Scene, band: int = 9, variant: int = 0, cam: Camera = Camera(),
               noise_m: float = RANGE_NOISE_M, range_max: float = 30.0) -> Scan:
    """A planar scan from the ``band`` rows around the image centre, one beam per column (see
    the module doc); frame ``variant`` (its noise seed)."""
    import numpy as np

    h, w = scene.shift.shape
    cx, cy = _centre(cam, w, h)
    top = max(0, int(round(cy)) - band // 2)
    rows = slice(top, min(h, top + band))
    z = depth(scene, cam)[rows]
    us = np.arange(w, dtype=np.float32)[None, :].repeat(z.shape[0], axis=0)
    x = (us - cx) * z / cam.fx
    # the scan's frame: x forward (the optical z), y left (the optical -x); beams counter-clockwise
    angle = np.arctan2(-x, z)
    rng_m = np.hypot(x, z)
    a_min, a_max = math.atan2(-(w - 1 - cx), cam.fx), math.atan2(cx, cam.fx)
    inc = (a_max - a_min) / (w - 1)
    ok = ~np.isnan(rng_m)
    idx = np.clip(np.round((angle[ok] - a_min) / inc).astype(int), 0, w - 1)
    ranges = np.full(w, np.inf, dtype=np.float64)
    np.minimum.at(ranges, idx, rng_m[ok].astype(np.float64))
    grey = scene.bgr[rows].mean(axis=2)
    inten = np.zeros(w, dtype=np.float64)
    np.maximum.at(inten, idx, grey[ok])
    hit = np.isfinite(ranges)
    if noise_m > 0:
        ranges[hit] += np.random.default_rng(2000 + variant).normal(0.0, noise_m, int(hit.sum()))
    return Scan(angle_min=a_min, angle_max=a_max, angle_increment=inc, range_min=0.1, range_max=range_max,
                ranges=[float(r) for r in ranges], intensities=[float(i) for i in inten])


def occupancy_grid(scene: Scene, tiles: int = 2, resolution: float = 0.05, step_m: float = 0.02,
                   inflation_cells: int = 10, cam: Camera = Camera()) -> Grid:
    """The scene's depth as a cost map, one cell per pixel, tiled ``tiles`` x ``tiles`` (see the
    module doc)."""
    import cv2
    import numpy as np

    if tiles < 1:
        raise ValueError(f"tiles {tiles}: must be >= 1")
    z = depth(scene, cam)
    unknown = np.isnan(z)
    zf = np.where(unknown, 0.0, z)
    step = np.zeros(z.shape, dtype=bool)
    for dz in (np.abs(np.diff(zf, axis=0)), np.abs(np.diff(zf, axis=1))):
        both = dz > step_m
        if dz.shape[0] != z.shape[0]:
            both &= ~unknown[1:] & ~unknown[:-1]
            step[1:] |= both
            step[:-1] |= both
        else:
            both &= ~unknown[:, 1:] & ~unknown[:, :-1]
            step[:, 1:] |= both
            step[:, :-1] |= both
    dist = cv2.distanceTransform(np.where(step, 0, 255).astype(np.uint8), cv2.DIST_L2, 5)
    cost = np.where(dist <= inflation_cells, np.round(99.0 * np.exp(-3.0 * dist / inflation_cells)), 0.0)
    cell = np.where(step, 100, np.clip(cost, 0, 99)).astype(np.int8)
    cell[unknown & ~step] = -1
    tile = cell[::-1]  # image row 0 is the top; grid row 0 is at the origin (the bottom)
    rows = []
    for i in range(tiles):
        row = []
        for j in range(tiles):
            t = tile[::-1] if i % 2 else tile
            row.append(t[:, ::-1] if j % 2 else t)
        rows.append(np.concatenate(row, axis=1))
    grid = np.ascontiguousarray(np.concatenate(rows, axis=0))
    return Grid(width=grid.shape[1], height=grid.shape[0], resolution=resolution, data=grid.tobytes())
