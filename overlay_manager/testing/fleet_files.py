"""Fleet files for the fleet unit tests, as the YAML parser returns them.

:func:`fleet_data` gives the fields every test fleet shares (name, base domain, the lab's control
server URL) around the teams a test module needs, so each module states only what it is about.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Mapping

SERVER_URL = "https://10.231.0.2:8443"
"""The control server URL of the test fleets (the lab's headscale address and TLS port)."""


def fleet_data(teams: Mapping[str, Any], /, **changes: Any) -> Dict[str, Any]:
    """A fleet file's parsed YAML: fleet ``lab``, base_domain ``fleet.internal``, server
    :data:`SERVER_URL`, the given teams; ``changes`` replace or add top-level keys (``teams``
    too). A deep copy every call, so a test may change it freely."""
    data: Dict[str, Any] = {"fleet": "lab", "base_domain": "fleet.internal", "server": {"url": SERVER_URL},
                            "teams": teams}
    data.update(changes)
    return copy.deepcopy(data)
