"""The lab camera's frames hold exactly step x height bytes (C++ encoders refuse shorter ones)."""

from __future__ import annotations

import pytest

from overlay_manager.lab.probe.rosnodes import gradient_frame


@pytest.mark.parametrize("width, height", [(640, 480), (1, 2), (85, 300), (1920, 1080)])
def test_gradient_frame_is_full_size(width, height):
    frame = gradient_frame(width, height)
    assert len(frame) == width * 3 * height
    assert frame[:3] == bytes([0, 1, 2]) and frame[width * 3:width * 3 + 3] == bytes([1, 2, 3])
