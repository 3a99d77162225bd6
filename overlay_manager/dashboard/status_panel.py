"""The dashboard's "This machine" panel: the selected node's own state from its ~status message
(overlay verdict and tailscaled's state, names and addresses, NAT, control server, ROS
environment, tailscaled's health warnings).

The panel is the ``*_value`` labels of the widget's .ui file; these functions fill them on the
GUI thread. Long texts keep all of it in their tooltips (a narrow window may cut the label).
"""

from __future__ import annotations

from typing import Any

from overlay_manager.dashboard.cells import coloured
from overlay_manager.view import text as fmt

#: the labels :func:`show_status` fills (``<name>_value`` in the .ui file)
STATUS_FIELDS = ("state", "self", "nat", "control", "ros", "health")


def show_status(view: Any, msg: Any) -> None:
    """Fill ``view``'s status labels from an overlay_manager/OverlayStatus message."""
    verdict = fmt.overlay_verdict(msg)
    view.state_value.setText(coloured(f"{verdict.text} (tailscaled {msg.backend_state or '-'}"
                                      f", {msg.tailscale_version or 'version unknown'})",
                                      verdict.level))
    addresses = ", ".join(msg.self_addresses) or "no overlay address"
    view.self_value.setText(f"{msg.self_name or '-'}  {msg.self_dns_name}  ({addresses})")
    nat = fmt.nat_verdict(msg.nat)
    view.nat_value.setText(coloured(nat.text, nat.level))
    view.nat_value.setToolTip(nat.text + (f"\nnode's summary: {msg.nat.summary}" if msg.nat.summary else ""))
    control = "reachable" if msg.control_reachable else "not reachable"
    view.control_value.setText(coloured(f"{msg.login_server or '-'}: {control}",
                                        fmt.LEVEL_OK if msg.control_reachable else fmt.LEVEL_WARN))
    view.ros_value.setText(f"ROS_MASTER_URI={msg.ros_master_uri or '-'}  "
                           f"ROS_HOSTNAME={msg.ros_hostname or '-'}")
    view.ros_value.setToolTip(view.ros_value.text())
    view.health_value.setText(coloured("; ".join(msg.health), fmt.LEVEL_WARN)
                              if msg.health else coloured("no warnings", fmt.LEVEL_OK))
    view.health_value.setToolTip("\n".join(msg.health))


def clear_status(view: Any) -> None:
    """Every status label shows "-" (no ~status from the selected node yet)."""
    for name in STATUS_FIELDS:
        getattr(view, f"{name}_value").setText("-")
