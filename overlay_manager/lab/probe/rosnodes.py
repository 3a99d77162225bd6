"""Small ROS nodes for the lab: a camera publisher and a Twist echo (run inside a lab host).

    python3 -m overlay_manager.lab.probe.rosnodes camera [--topic /camera/image_raw] [--rate 30]
                                                   [--width 640] [--height 480]
                                                   [--pattern scene|synthetic|gradient] [--video FILE]
    python3 -m overlay_manager.lab.probe.rosnodes echo [--input /cmd_vel] [--output /cmd_vel_echo]

``camera`` publishes sensor_msgs/Image (rgb8, the size given) at a fixed rate with header.stamp
set to the send time and header.seq counting frames, so a subscriber on another lab host (same
machine clock) measures rate, gaps and latency. By default it plays a real scene (scene.py: a
video file scaled and looped, the frame's index in header.frame_id as ``camera#123``) so
receivers also measure quality (PSNR against the source frame, quality.py). ``echo``
republishes every geometry_msgs/Twist it receives unchanged, so the sender measures the round
trip (see main.py ``control``).

Both need the ROS env of the host (robots.start_tool runs them with ``overlay_env``'s output, the
way a user starts a node on that machine) and stop on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from overlay_manager.lab.probe.scene import DEFAULT_FRAMES, DEFAULT_VIDEO


def textured_frames(width: int, height: int, count: int = 30) -> List[bytes]:
    """``count`` rgb8 frames of a colour gradient with a smooth random texture that moves 4 px a
    frame. JPEG sizes match a real 640x480 camera (about 33 KB at quality 80, 46 KB at 90),
    where the plain gradient compresses to almost nothing and would hide what a codec does."""
    import numpy as np

    rng = np.random.default_rng(1)
    wide = width + 4 * count
    ys, xs = np.mgrid[0:height, 0:wide].astype(np.float32)
    # smooth texture on a canvas 4*count px wider than a frame: 16x16-pixel random cells,
    # bilinear between them (computed once; frame i is the canvas shifted by 4*i px)
    cells = rng.uniform(-60, 60, size=(height // 16 + 2, wide // 16 + 2, 3)).astype(np.float32)
    fy, fx = ys / 16.0, xs / 16.0
    y0, x0 = fy.astype(int), fx.astype(int)
    wy, wx = (fy - y0)[..., None], (fx - x0)[..., None]
    tex = ((1 - wy) * ((1 - wx) * cells[y0, x0] + wx * cells[y0, x0 + 1])
           + wy * ((1 - wx) * cells[y0 + 1, x0] + wx * cells[y0 + 1, x0 + 1]))
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([xs * 255.0 / width, ys * 255.0 / height, np.full_like(xs, 128.0)], axis=2)
    frames = [np.clip(base + tex[:, 4 * i:4 * i + width], 0, 255).astype(np.uint8).tobytes() for i in range(count)]
    return frames


def gradient_frame(width: int, height: int) -> bytes:
    """One rgb8 frame of width x height pixels (exactly width * 3 * height bytes): byte values
    rising along each row, each row shifted by one."""
    row = bytes(range(256)) * (width * 3 // 256 + 2)  # long enough for a shift of up to 255
    return b"".join(row[(y % 256):(y % 256) + width * 3] for y in range(height))


def run_camera(topic: str, rate_hz: float, width: int, height: int, pattern: str = "scene",
               video: str = "", scene_frames: int = DEFAULT_FRAMES) -> None:
    """Publish width x height rgb8 frames on topic at rate_hz until shutdown.

    pattern ``scene`` (default): the first ``scene_frames`` frames of ``video``
    (scene.DEFAULT_VIDEO when empty), scaled and looped, from the machine's shared cache
    (scene.SceneFrames: decoded once, memory-mapped); header.frame_id = ``camera#<index in the video>``
    (scene.tag_frame_id) so receivers compute PSNR against the source frame. ``synthetic``: a
    moving random texture with real-camera JPEG sizes (textured_frames); ``gradient``: one plain
    gradient. header.stamp is the send time (set just before publishing), header.seq counts frames.
    """
    import rospy
    from sensor_msgs.msg import Image

    from overlay_manager.lab.probe.scene import SceneFrames, tag_frame_id

    rospy.init_node("lab_camera", anonymous=True)
    pub = rospy.Publisher(topic, Image, queue_size=2)
    scene = SceneFrames(Path(video) if video else DEFAULT_VIDEO, width, height, scene_frames) \
        if pattern == "scene" else None
    frames: List[bytes] = []
    if pattern in ("synthetic", "textured"):
        frames = textured_frames(width, height)
    elif pattern == "gradient":
        frames = [gradient_frame(width, height)]
    msg = Image(height=height, width=width, encoding="rgb8", is_bigendian=0, step=width * 3)
    msg.header.frame_id = "camera"
    rate = rospy.Rate(rate_hz)
    what = f"{video or DEFAULT_VIDEO} ({scene.count} frames from {scene.path}, looping)" if scene else pattern
    rospy.loginfo("camera: %dx%d rgb8 at %.1f Hz on %s: %s", width, height, rate_hz, rospy.resolve_name(topic), what)
    seq = 0
    while not rospy.is_shutdown():
        seq += 1
        msg.header.seq = seq
        if scene is not None:
            index = (seq - 1) % scene.count
            msg.data = scene.frame(index).tobytes()
            msg.header.frame_id = tag_frame_id("camera", index)
        else:
            msg.data = frames[seq % len(frames)]
        msg.header.stamp = rospy.Time.now()
        pub.publish(msg)
        try:
            rate.sleep()
        except rospy.ROSInterruptException:
            break


def run_echo(input_topic: str, output_topic: str) -> None:
    """Republish every Twist from input_topic on output_topic until shutdown."""
    import rospy
    from geometry_msgs.msg import Twist

    rospy.init_node("lab_twist_echo", anonymous=True)
    pub = rospy.Publisher(output_topic, Twist, queue_size=100, tcp_nodelay=True)
    rospy.Subscriber(input_topic, Twist, pub.publish, queue_size=100, tcp_nodelay=True)
    rospy.loginfo("twist echo: %s -> %s", rospy.resolve_name(input_topic), rospy.resolve_name(output_topic))
    rospy.spin()


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point (see the module doc)."""
    ap = argparse.ArgumentParser(prog="rosnodes")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("camera", help="sensor_msgs/Image publisher")
    c.add_argument("--topic", default="/camera/image_raw")
    c.add_argument("--rate", type=float, default=30.0, help="Hz")
    c.add_argument("--width", type=int, default=640)
    c.add_argument("--height", type=int, default=480)
    c.add_argument("--pattern", choices=["scene", "synthetic", "textured", "gradient"], default="scene",
                   help="scene: a real video (--video), frame index in header.frame_id; synthetic (or its "
                        "older name textured): moving texture with real-camera JPEG sizes; gradient: one plain frame")
    c.add_argument("--video", default="", help=f"video file for --pattern scene (default {DEFAULT_VIDEO})")
    c.add_argument("--scene-frames", type=int, default=DEFAULT_FRAMES, help="loop the video's first N frames")
    e = sub.add_parser("echo", help="geometry_msgs/Twist echo")
    e.add_argument("--input", default="/cmd_vel")
    e.add_argument("--output", default="/cmd_vel_echo")
    args = ap.parse_args(argv)
    if args.cmd == "camera":
        run_camera(args.topic, args.rate, args.width, args.height, args.pattern, args.video, args.scene_frames)
    else:
        run_echo(args.input, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
