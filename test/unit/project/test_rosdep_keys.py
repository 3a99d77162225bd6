"""Every rosdep key of package.xml has a rule for Ubuntu 20.04 + Noetic.

test/data/rosdep_keys_noetic.txt is written by ``scripts/check_rosdep ROSDISTRO_DIR --write-keys``,
which runs the real rosdep offline against a ros/rosdistro checkout (its commit and date are in the
file's header). CI has neither the internet nor that checkout, so this test compares package.xml
with the recorded list: a key added to package.xml without a rosdep rule (or one added without
re-running the check) fails here. Names recorded as ``# no rule:`` are installed by hand
(docs/install.md) and must not appear as package.xml keys.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, Set, Tuple

ROOT = Path(__file__).resolve().parents[3]
KEYS_FILE = ROOT / "test" / "data" / "rosdep_keys_noetic.txt"
DEPENDS = ("depend", "build_depend", "build_export_depend", "buildtool_depend", "buildtool_export_depend",
           "exec_depend", "test_depend", "doc_depend")


def package_keys() -> Tuple[Set[str], Set[str]]:
    """(the dependency keys of package.xml, the keys its comments mark ``optional: KEY (...)``)."""
    text = (ROOT / "package.xml").read_text()
    root = ET.fromstring(text)
    keys = {el.text.strip() for tag in DEPENDS for el in root.iter(tag) if el.text}
    optional = set(re.findall(r"optional: ([A-Za-z0-9_.+-]+) \(", text))
    return keys, optional


def recorded() -> Tuple[Dict[str, str], Set[str], str]:
    """(key -> packages on Ubuntu focal, names with no rule, the source line of the header)."""
    resolved: Dict[str, str] = {}
    unkeyed: Set[str] = set()
    source = ""
    for line in KEYS_FILE.read_text().splitlines():
        if line.startswith("# source: "):
            source = line
        elif line.startswith("# no rule: "):
            unkeyed.add(line[len("# no rule: "):].strip())
        elif line and not line.startswith("#"):
            key, _, pkgs = line.partition("\t")
            resolved[key] = pkgs
    return resolved, unkeyed, source


def test_list_names_its_rosdistro_snapshot():
    _, _, source = recorded()
    assert re.search(r"ros/rosdistro [0-9a-f]{40} \(\d{4}-\d\d-\d\dT", source), source


def test_every_package_xml_key_has_a_rule():
    keys, optional = package_keys()
    resolved, _, source = recorded()
    missing = sorted((keys | optional) - resolved.keys())
    assert not missing, (f"package.xml keys with no recorded rosdep rule: {missing}; run "
                         f"scripts/check_rosdep on a ros/rosdistro checkout (recorded: {source})")


def test_hand_installed_names_are_not_keys():
    keys, _ = package_keys()
    _, unkeyed, _ = recorded()
    assert unkeyed >= {"tailscale", "iperf3", "nftables"}
    assert not keys & unkeyed, f"declared in package.xml although rosdep has no rule: {keys & unkeyed}"


def test_install_doc_apt_line_is_complete():
    """docs/install.md's apt line installs what every build and run key of package.xml resolves
    to on Ubuntu 20.04 (it once lacked cv_bridge and turbojpeg)."""
    root = ET.fromstring((ROOT / "package.xml").read_text())
    keys = {el.text.strip() for tag in DEPENDS if tag not in ("test_depend", "doc_depend")
            for el in root.iter(tag) if el.text}
    resolved, _, _ = recorded()
    assert resolved["cv_bridge"] == "ros-noetic-cv-bridge"
    assert resolved["libturbojpeg"] == "libturbojpeg0-dev"
    install = (ROOT / "docs" / "install.md").read_text()
    lacking = sorted(f"{pkg} ({key})" for key in keys for pkg in resolved.get(key, "").split()
                     if not re.search(rf"(?<![\w-]){re.escape(pkg)}(?![\w-])", install))
    assert not lacking, f"docs/install.md's apt line lacks: {', '.join(lacking)}"
