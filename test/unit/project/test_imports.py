"""Every module of the package imports on this Python (3.8 through 3.12): no 3.9+ syntax or
stdlib names at import time. Modules that need ROS or Qt are skipped only where those are missing
(the Python 3.8 run of scripts/test has pytest, pyyaml and pyroute2, no ROS)."""
import importlib
import os

import pytest

import overlay_manager

# top-level modules that only ROS / Qt installs provide
ROS_OR_QT = {"rospy", "rosgraph", "roslib", "rosnode", "rostopic", "rosservice", "genpy", "std_msgs",
             "diagnostic_msgs", "sensor_msgs", "geometry_msgs", "python_qt_binding", "qt_gui",
             "rqt_gui", "rqt_gui_py", "PyQt5", "cv_bridge", "cv2", "diagnostic_updater", "tf",
             "dynamic_reconfigure", "matplotlib", "numpy", "PIL"}

PKG_DIR = os.path.dirname(overlay_manager.__file__)


def _modules():
    """Every module under the package directory (found by file name, none imported)."""
    root = os.path.dirname(PKG_DIR)
    for base, dirs, files in os.walk(PKG_DIR):
        dirs[:] = sorted(d for d in dirs if os.path.exists(os.path.join(base, d, "__init__.py")))
        for f in sorted(files):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(base, f), root)[:-3].replace(os.sep, ".")
                yield rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


MODULES = sorted(_modules())


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        generated = (exc.name or "").startswith(("overlay_manager.msg", "overlay_manager.srv"))
        if missing in ROS_OR_QT or generated:
            pytest.skip(f"{name} needs {exc.name}, not installed for this Python")
        raise
