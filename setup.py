"""Python package setup for catkin (catkin_python_setup); not for pip."""
from catkin_pkg.python_setup import generate_distutils_setup
from setuptools import setup

setup(**generate_distutils_setup(
    packages=["overlay_manager", "overlay_manager.fleet", "overlay_manager.lab", "overlay_manager.dashboard",
              "overlay_manager.validation"],
    package_dir={"": "."},
    package_data={"overlay_manager.dashboard": ["resource/*.ui"]},
))
