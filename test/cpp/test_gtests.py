"""Runs every C++ unit test (gtest) from pytest, so the one test command runs them.

The list is CMakeLists.txt's ``catkin_add_gtest(...)`` lines (overlay_manager.testing.cmake_tests),
the same list ``catkin_make run_tests`` runs; the binaries are the ones ``catkin_make tests`` built
into the sourced devel space (scripts/build). A gtest source in test/cpp/ that is not registered is
skipped here with the line to add (and test/unit/project/test_cmake_tests.py fails until it is added)."""
import os
import subprocess

import pytest

from overlay_manager.testing.cmake_tests import gtests

TIMEOUT_S = 300.0
"""The longest a gtest may run (test_h264_codec encodes and decodes a real video: about a minute)."""


def _devel_binary(name):
    """The binary `name` of overlay_manager in the sourced devel space(s); None when not built."""
    for prefix in os.environ.get("CMAKE_PREFIX_PATH", "").split(os.pathsep):
        path = os.path.join(prefix, "lib", "overlay_manager", name)
        if prefix and os.access(path, os.X_OK):
            return path
    return None


@pytest.mark.skipif(not os.environ.get("CMAKE_PREFIX_PATH"), reason="no catkin devel space sourced (scripts/build)")
@pytest.mark.parametrize("test", gtests(), ids=lambda t: t.name)
def test_gtest(test):
    if not test.registered:
        pytest.skip(f"{test.source} is not registered in CMakeLists.txt: add the line {test.cmake_line}")
    binary = _devel_binary(test.name)
    assert binary, (f"{test.name} not built: CMAKE_PREFIX_PATH has no devel space with overlay_manager's gtests "
                    f"(scripts/build runs catkin_make tests)")
    proc = subprocess.run([binary], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "[  PASSED  ]" in proc.stdout
