"""Campus lab: buildings behind real NATs in network namespaces (pyroute2 + nftables + tc netem),
a control host running Headscale (through overlay_manager.fleet) and one tailscaled per host.

Quick use (as root)::

    from overlay_manager.lab import Lab
    with Lab("config/lab/two_buildings.yaml") as lab:
        lab.tailscale_up("alpha-robot1"); lab.tailscale_up("alpha-laptop")
        lab.wait_enrolled()
        print(lab.ping("alpha-laptop", "alpha-robot1").path)   # direct
        lab.block_udp("b1")

See docs/lab.md.
"""
from overlay_manager.lab.campus.core import (
    Lab,
    PingResult,
    down_all,
    leftover_runs,
    missing_prerequisites,
    parse_ping_output,
    tools_bin,
)
from overlay_manager.lab.campus.errors import CommandError, LabError, LabTimeout, SpecError
from overlay_manager.lab.campus.spec import Impairment, LabSpec, NatKind, load_spec, parse_nat_kind

__all__ = [
    "CommandError", "Impairment", "Lab", "LabError", "LabSpec", "LabTimeout", "NatKind", "PingResult",
    "SpecError", "down_all", "leftover_runs", "load_spec", "missing_prerequisites", "parse_nat_kind",
    "parse_ping_output", "tools_bin",
]
