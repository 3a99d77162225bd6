"""Shared fixtures for system tests that run in the campus lab (root + built binaries).

Fixtures
--------
``lab_factory`` (session)
    ``make(spec, run_id=None, enrol=False, start_tailscaled=True, **lab_kw) -> Lab`` (lab_kw go
    to Lab, e.g. robot_overrides): brings a lab up
    (workdir under pytest's tmp dir, so logs survive the run) and tears every lab it made down at
    the end of the session, whatever happened. ``spec``: a path, a mapping or a LabSpec.
``two_buildings_lab`` (session)
    config/lab/two_buildings.yaml up, tailscaled running on robot1 (b1) and laptop (b2), not
    enrolled (the node enrols them through robot.launch).
``two_buildings_robots`` (module)
    two_buildings_lab with robot.launch on robot1 (the master) and laptop, both nodes listing a
    peer; the launches are stopped by pid at the end of the module.
``lab_required`` (function)
    skips the test, saying what is missing, when the lab cannot run here.
``host_network_snapshot`` (function)
    ``take() -> dict`` of the host's /etc/resolv.conf, /etc/hosts, ``ip route``, ``ip -6 route``,
    ``ip rule`` and ``nft list ruleset``, for before/after comparisons.

Every test using these is skipped, with the reason, when not root or a binary is missing
(``require_lab()``); CI runs as root with the binaries, so there they run.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.layout import missing_prerequisites

REPO = Path(__file__).resolve().parents[2]

TWO_BUILDINGS = REPO / "config" / "lab" / "two_buildings.yaml"


def require_lab() -> None:
    """Skip the calling test (or fixture) when the lab cannot run here, saying why."""
    missing = missing_prerequisites()
    if missing:
        pytest.skip("campus lab unavailable: missing " + "; ".join(missing))


@pytest.fixture
def lab_required() -> None:
    """Skip the test (with the reason) when the lab cannot run here."""
    require_lab()


@pytest.fixture(scope="session")
def lab_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Lab]]:
    """``make(spec, run_id=None, enrol=False, start_tailscaled=True, **lab_kw) -> Lab`` (see module doc)."""
    labs: List[Lab] = []

    def make(spec: Any, run_id: Optional[str] = None, enrol: bool = False,
             start_tailscaled: bool = True, **lab_kw: Any) -> Lab:
        require_lab()
        lab = Lab(spec, run_id=run_id, workdir=tmp_path_factory.mktemp("lab"), **lab_kw)
        labs.append(lab)
        lab.up(start_tailscaled=start_tailscaled)
        if enrol:
            lab.tailscale_up_all(timeout=60)
        return lab

    yield make
    errors = []
    for lab in reversed(labs):
        try:
            lab.down()
        except Exception as exc:  # noqa: BLE001 - tear down the others, report at the end
            errors.append(str(exc))
    if errors:
        raise RuntimeError("lab teardown problems: " + "; ".join(errors))


@pytest.fixture(scope="session")
def two_buildings_lab(lab_factory: Callable[..., Lab]) -> Lab:
    """config/lab/two_buildings.yaml: robot1 in b1, laptop in b2, tailscaled up, not enrolled."""
    return lab_factory(TWO_BUILDINGS)


@pytest.fixture(scope="module")
def two_buildings_robots(two_buildings_lab: Lab) -> Iterator[Lab]:
    """robot.launch on robot1 (master) and laptop of two_buildings_lab; stopped by pid at the end."""
    lab = two_buildings_lab
    with robots.processes(lab, ("alpha-robot1", "alpha-laptop")) as procs:
        robots.start_master_then(lab, "alpha-robot1", ["alpha-laptop"], procs)
        yield lab


def _snapshot() -> Dict[str, bytes]:
    out = {}
    for f in ("/etc/resolv.conf", "/etc/hosts"):
        try:
            out[f] = Path(f).read_bytes()
        except OSError as exc:
            out[f] = f"unreadable: {exc}".encode()
    for argv in (["ip", "route", "show", "table", "all"], ["ip", "-6", "route", "show", "table", "all"],
                 ["ip", "rule"], ["nft", "list", "ruleset"], ["ip", "-br", "link"]):
        res = subprocess.run(argv, capture_output=True, check=False, timeout=30)
        out[" ".join(argv)] = res.stdout + res.stderr
    return out


@pytest.fixture
def host_network_snapshot() -> Callable[[], Dict[str, bytes]]:
    """``take()``: the host's resolver files, routes, rules, links and nft ruleset (bytes)."""
    return _snapshot
