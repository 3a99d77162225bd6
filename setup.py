"""Python package setup, for catkin and for pip.

**catkin** (``catkin_python_setup()`` in CMakeLists.txt: catkin_make, scripts/build, an install
space) runs this file twice: ``interrogate_setup_dot_py.py`` reads its arguments when CMake
configures, and catkin's install script (``CATKIN_BINARY_DIR`` set) installs the package. Both get
catkin_pkg's ``generate_distutils_setup`` (the metadata of package.xml) and the packages below,
as always; the tools are the scripts/ that CMakeLists.txt installs (``rosrun overlay_manager
fleet``).

**pip** (``pip install <clone>``, ``pip install "overlay_manager @ git+URL"``) gets plain
setuptools, wherever catkin_pkg is or is not installed: the same packages, PyYAML and cryptography
as requirements, the console scripts ``fleet`` and ``overlay_env`` (neither imports ROS) and the
files ``fleet`` reads under ``<prefix>/share/overlay_manager/`` (the install space's layout: the
unit templates, package.xml, the example fleet file). That is a control server without ROS
(docs/fleet.md, "Install the control server").

Installed either way: every folder of overlay_manager/ (the product's layers: core, system,
tailscaled, monitor, ros, cli, the fleet tool, the dashboard, ...). Not installed:
overlay_manager.lab (the network-namespace campus, demo and benchmarks) and overlay_manager.testing
(fakes for the tests); both run from a clone, where the devel space finds them in the source tree.
"""
import os
import sys
import xml.etree.ElementTree as ET

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
NOT_INSTALLED = ("overlay_manager.lab", "overlay_manager.testing")
# every layer folder of overlay_manager/ (a new one is installed without an edit here), but the two
# that run from a clone only
PACKAGES = sorted(find_packages(HERE, include=["overlay_manager", "overlay_manager.*"],
                                exclude=[p + s for p in NOT_INSTALLED for s in ("", ".*")]))
PACKAGE_DATA = {"overlay_manager.dashboard": ["resource/*.ui"]}


def run_by_catkin() -> bool:
    """True when catkin runs this file: its configure-time interrogation or its install script."""
    return ("CATKIN_BINARY_DIR" in os.environ
            or os.path.basename(sys.argv[0]) == "interrogate_setup_dot_py.py")


def pip_setup_args() -> dict:
    """setuptools' arguments for a plain (pip) install: name and version from package.xml."""
    manifest = ET.parse(os.path.join(HERE, "package.xml")).getroot()
    share = "share/overlay_manager"
    return dict(
        name="overlay_manager",
        version=manifest.findtext("version").strip(),
        description="Fleet provisioning for a self-hosted Tailscale/Headscale overlay of ROS robots "
                    "(the fleet tool) and the overlay_manager package",
        license=manifest.findtext("license").strip(),
        python_requires=">=3.8",
        install_requires=["PyYAML>=5.3", "cryptography>=2.8"],
        entry_points={"console_scripts": ["fleet = overlay_manager.cli.fleet:main",
                                          "overlay_env = overlay_manager.cli.overlay_env:main"]},
        data_files=[(share, ["package.xml"]),
                    (f"{share}/config", ["config/fleet.example.yaml"]),
                    (f"{share}/config/systemd", ["config/systemd/headscale.service.in",
                                                 "config/systemd/derper.service.in"])],
        zip_safe=False,
    )


if run_by_catkin():
    from catkin_pkg.python_setup import generate_distutils_setup

    setup(**generate_distutils_setup(packages=PACKAGES, package_dir={"": "."},
                                     package_data=PACKAGE_DATA))
else:
    setup(packages=PACKAGES, package_dir={"": "."}, package_data=PACKAGE_DATA, **pip_setup_args())
