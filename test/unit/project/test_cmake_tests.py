"""One list of rostests and gtests: CMakeLists.txt registers every launch file of test/rostest/ and
every gtest source of test/cpp/, and the pytest wrappers (test/rostest/test_rostest.py,
test/cpp/test_gtests.py) read that list (overlay_manager.testing.cmake_tests)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from overlay_manager.testing.cmake_tests import ROOT, Gtest, Rostest, gtests, rostests


@pytest.mark.parametrize("test", rostests(), ids=lambda t: t.name)
def test_rostest_is_registered(test: Rostest) -> None:
    assert test.exists, f"CMakeLists.txt registers {test.path}, which does not exist: remove {test.cmake_line}"
    assert test.registered, (f"{test.path} is not registered in CMakeLists.txt, so catkin_make run_tests and "
                             f"the suite do not run it: add {test.cmake_line} (inside if(CATKIN_ENABLE_TESTING))")
    assert test.time_limit_s > 0, f"{test.path}: no <test> element with a time-limit rostest can read"


@pytest.mark.parametrize("test", gtests(), ids=lambda t: t.name)
def test_gtest_is_registered(test: Gtest) -> None:
    assert test.exists, f"CMakeLists.txt registers {test.source}, which does not exist: remove {test.cmake_line}"
    assert test.registered, (f"{test.source} is a gtest that CMakeLists.txt does not register, so "
                             f"catkin_make run_tests and the suite do not run it: add {test.cmake_line}")


def test_every_cpp_file_of_test_cpp_is_built() -> None:
    """A test/cpp/*.cpp that is no gtest (the rostests' camera driver, a benchmark) is still built."""
    cmake = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    named = set(re.findall(r"test/cpp/[\w.-]+\.cpp", re.sub(r"#[^\n]*", "", cmake)))
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "test" / "cpp").glob("*.cpp"))
               if str(p.relative_to(ROOT)) not in named]
    assert not missing, f"CMakeLists.txt builds none of {missing}: register a gtest or add its executable"


def test_the_lists_are_read(tmp_path: Path) -> None:
    assert {"node.test", "link_aware_camera.test"} <= {t.name for t in rostests() if t.registered}
    assert {"test_stream_policy", "test_h264_codec"} <= {g.name for g in gtests() if g.registered}
    (tmp_path / "test" / "rostest").mkdir(parents=True)
    (tmp_path / "test" / "cpp").mkdir(parents=True)
    (tmp_path / "CMakeLists.txt").write_text(
        "if(CATKIN_ENABLE_TESTING)\n"
        "  add_rostest(test/rostest/a.test)\n"
        "  # add_rostest(test/rostest/b.test)  a comment registers nothing\n"
        "  add_rostest(test/rostest/gone.test ARGS x:=1)\n"
        "  catkin_add_gtest(test_one\n    test/cpp/test_one.cpp)\n"
        "  if(FOUND)\n    catkin_add_gtest(test_two test/cpp/test_two.cpp)\n  endif()\n"
        "endif()\n")
    (tmp_path / "test" / "rostest" / "a.test").write_text(
        '<launch><test test-name="x" pkg="p" type="x.py" time-limit="90"/>'
        '<test test-name="y" pkg="p" type="y.py"/></launch>')
    (tmp_path / "test" / "rostest" / "b.test").write_text('<launch><test test-name="b" pkg="p" type="b.py"/></launch>')
    for name, text in (("test_one", "#include <gtest/gtest.h>\n"), ("test_three", '#include "gtest/gtest.h"\n'),
                       ("driver", "int main() {}\n")):
        (tmp_path / "test" / "cpp" / f"{name}.cpp").write_text(text)
    assert rostests(tmp_path) == [
        Rostest("test/rostest/a.test", True, True, 90.0),
        Rostest("test/rostest/b.test", False, True, 60.0),
        Rostest("test/rostest/gone.test", True, False, 0.0),
    ]
    assert gtests(tmp_path) == [
        Gtest("test_one", "test/cpp/test_one.cpp", True, True),
        Gtest("test_three", "test/cpp/test_three.cpp", False, True),
        Gtest("test_two", "test/cpp/test_two.cpp", True, False),
    ]
    assert Rostest("test/rostest/b.test", False, True, 60.0).cmake_line == "add_rostest(test/rostest/b.test)"
    assert Gtest("test_three", "test/cpp/test_three.cpp", False, True).cmake_line == \
        "catkin_add_gtest(test_three test/cpp/test_three.cpp)"
