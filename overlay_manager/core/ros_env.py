"""Overlay names for ROS: ROS_MASTER_URI, ROS_HOSTNAME and the variables overlay_env exports,
computed from the robot config (and tailscaled's view when known). Pure: no I/O."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import List, Tuple

from overlay_manager.core.config import RobotConfig
from overlay_manager.core.ros_names import ros_namespace


@dataclass(frozen=True)
class RosEnv:
    """ROS network environment in overlay names."""

    ros_master_uri: str   # http://<master FQDN>:<port>
    ros_hostname: str     # this machine's FQDN
    # this machine's overlay IPv4 address when tailscaled was asked ("" = unknown); robot.launch
    # binds rosbridge to it (the own name may resolve to loopback through the hosts block)
    overlay_address: str = ""
    # the ROS master runs on this machine (the config's master is its host name): roslaunch
    # starts roscore here; elsewhere the bringup waits for the remote master (roslaunch --wait)
    master_local: bool = False

    @property
    def short_name(self) -> str:
        """This machine's short name, as the host name is written (shown, never used in ROS names)."""
        return self.ros_hostname.split(".", 1)[0]

    @property
    def namespace(self) -> str:
        """ROS-legal namespace of this machine (robot.launch puts its node under /<namespace>/)."""
        return ros_namespace(self.short_name)

    def variables(self) -> List[Tuple[str, str]]:
        """(name, value) of every variable set for ROS, in output order."""
        out = [("ROS_HOSTNAME", self.ros_hostname), ("ROS_MASTER_URI", self.ros_master_uri),
               ("OVERLAY_MANAGER_HOST", self.short_name), ("OVERLAY_MANAGER_NS", self.namespace)]
        if self.overlay_address:
            out.append(("OVERLAY_MANAGER_ADDRESS", self.overlay_address))
        out.append(("OVERLAY_MANAGER_MASTER_LOCAL", "true" if self.master_local else "false"))
        return out

    def environment_file(self) -> str:
        """A systemd EnvironmentFile (KEY=value lines). ROS_IP cannot be unset here: ROS_HOSTNAME
        takes precedence over it in every ROS client library, and the shipped units unset it."""
        lines = ["# overlay names for ROS (written by overlay_env --env-file; do not edit)"]
        lines += [f"{k}={_systemd_value(v)}" for k, v in self.variables()]
        return "\n".join(lines) + "\n"

    def shell(self) -> str:
        """Lines for eval in sh/bash/zsh (systemd wants environment_file() instead)."""
        lines = [f"export {k}={shlex.quote(v)}" for k, v in self.variables()]
        lines.insert(2, "unset ROS_IP")  # after ROS_HOSTNAME and ROS_MASTER_URI
        return "\n".join(lines) + "\n"


_SYSTEMD_BARE = re.compile(r"^[A-Za-z0-9_.:/@%+,=-]*$")


def _systemd_value(value: str) -> str:
    """value quoted for a systemd EnvironmentFile: bare when plain, else in double quotes."""
    if _SYSTEMD_BARE.match(value):
        return value
    if "\n" in value or "\r" in value:
        raise ValueError(f"a line break cannot go into an EnvironmentFile value: {value!r}")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def compute_env(cfg: RobotConfig, self_dns_name: str = "", overlay_address: str = "") -> RosEnv:
    """ROS env for cfg. self_dns_name (from tailscaled, when known) wins over the computed name;
    overlay_address (from tailscaled) is exported when known."""
    host = self_dns_name.rstrip(".") or cfg.fqdn
    master_local = cfg.master_fqdn.rstrip(".").lower() == cfg.fqdn.lower()
    return RosEnv(ros_master_uri=f"http://{cfg.master_fqdn}:{cfg.master_port}", ros_hostname=host,
                  overlay_address=overlay_address, master_local=master_local)
