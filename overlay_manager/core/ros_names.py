"""One mapping from a machine's host name to a ROS-legal namespace.

A DNS host name may hold hyphens, start with a digit and use upper case (``alpha-robot1``,
``3d-scanner``, ``Base-Station``); a ROS name may not: ``rosgraph.names.is_legal_name`` refuses a
hyphen, and roscpp aborts on such a namespace. Everywhere a host appears inside a ROS name (the
overlay node's namespace ``/<ns>/overlay_manager``, the encoder's, the dashboard's node finder,
the aggregator's paths) it goes through :func:`ros_namespace`; wherever a peer is *shown* (topics'
``name`` fields, the dashboard, diagnostics' text) the original host name stays.

Rules, applied in order:
1. lower case (DNS names are case-insensitive);
2. every character outside ``[a-z0-9_]`` (a hyphen, a dot) becomes ``_``;
3. a name that does not start with a letter gets the prefix ``h_``.

The mapping is injective on DNS host names: DNS labels hold no ``_``, so no two host names map to
one namespace (``alpha-robot1`` -> ``alpha_robot1``, ``3d-scanner`` -> ``h_3d_scanner``).
"""

from __future__ import annotations

import re

_NOT_ROS = re.compile(r"[^a-z0-9_]")
PREFIX = "h_"  # in front of a host name that does not start with a letter


def ros_namespace(host: str) -> str:
    """The ROS-legal base name for host (a short name or an overlay FQDN: only its first label).

    Raises ValueError for an empty host name."""
    label = host.strip().rstrip(".").split(".", 1)[0]
    if not label:
        raise ValueError(f"no host name to turn into a ROS namespace: {host!r}")
    name = _NOT_ROS.sub("_", label.lower())
    if not name[0].isalpha():
        name = PREFIX + name
    return name


NODE_NAME = "overlay_manager"
"""The overlay node's base name; robot.launch starts it inside the machine's namespace."""


def overlay_node(host: str) -> str:
    """The full ROS name robot.launch gives the overlay node on ``host``:
    ``/<ros_namespace(host)>/overlay_manager`` (``alpha-robot1`` -> ``/alpha_robot1/overlay_manager``)."""
    return f"/{ros_namespace(host)}/{NODE_NAME}"
