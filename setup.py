"""Python package setup for catkin (catkin_python_setup); not for pip.

Installed to robots: the product's layers (core, system, tailscaled, monitor, ros, cli), the fleet
tool and the dashboard. Not installed: overlay_manager.lab (the network-namespace campus, demo and
benchmarks) and overlay_manager.testing (fakes for the tests); both run from a clone, where the
devel space finds them in the source tree.
"""
from catkin_pkg.python_setup import generate_distutils_setup
from setuptools import setup

setup(**generate_distutils_setup(
    packages=["overlay_manager", "overlay_manager.core", "overlay_manager.core.validation",
              "overlay_manager.system", "overlay_manager.tailscaled", "overlay_manager.monitor",
              "overlay_manager.ros", "overlay_manager.cli", "overlay_manager.fleet",
              "overlay_manager.dashboard"],
    package_dir={"": "."},
    package_data={"overlay_manager.dashboard": ["resource/*.ui"]},
))
