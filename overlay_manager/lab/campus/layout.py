"""Where a lab run keeps things: binaries, its state directory, per-host files (pure paths);
and what the machine must have for a run (:func:`missing_prerequisites`).

Nothing here touches the system; :class:`RunLayout` only computes paths and names from the spec,
the run id and the work directory, so every other part of the lab (network, processes, control
server, tailscaled, teardown) asks it instead of rebuilding paths on its own.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List

from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.naming import Names
from overlay_manager.lab.campus.spec_model import LabSpec

RUN_ROOT = Path("/run/overlay-lab")
"""Per-run state directories live here (tmpfs: gone after a reboot, like the namespaces)."""
REPO_ROOT = Path(__file__).resolve().parents[3]
SOCKET_PATH_MAX = 107
"""Longest unix socket path Linux accepts (sun_path is 108 bytes with the terminating NUL)."""


def tools_bin() -> Path:
    """Directory of the tailscale, tailscaled and headscale binaries.

    ``OVERLAY_TOOLS_BIN`` overrides; default is the repository's ``.tools/bin`` (scripts/setup).
    """
    return Path(os.environ.get("OVERLAY_TOOLS_BIN") or REPO_ROOT / ".tools" / "bin").resolve()


def missing_prerequisites() -> List[str]:
    """What the lab needs but does not have (empty list = ready): root, binaries, tools."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the lab creates network namespaces)")
    for b in ("tailscale", "tailscaled", "headscale"):
        if not os.access(tools_bin() / b, os.X_OK):
            missing.append(f"{tools_bin() / b} (run scripts/setup)")
    for tool in ("ip", "nft", "tc"):
        if shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin") is None:
            missing.append(f"{tool} (Debian: iproute2/nftables)")
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        missing.append("python3-pyroute2")
    if not os.path.exists("/dev/net/tun"):
        missing.append("/dev/net/tun")
    return missing


class RunLayout:
    """Paths and names of one run.

    Args:
        spec: the parsed lab spec.
        names: the run's namespace names and addresses (naming.Names).
        workdir: per-host directories (state, sockets, bundles, logs) and the headscale
            deployment go here.
    """

    def __init__(self, spec: LabSpec, names: Names, workdir: Path) -> None:
        self.spec = spec
        self.names = names
        self.run_id = names.run_id
        self.run_dir = RUN_ROOT / names.run_id
        self.workdir = workdir
        for h in spec.hosts:
            sock = self.socket_path(h.name)
            if len(str(sock)) > SOCKET_PATH_MAX:
                raise LabError(f"unix socket path {sock} is longer than {SOCKET_PATH_MAX} characters; "
                               "use a shorter workdir")

    @property
    def state_path(self) -> Path:
        """The run's state file (JSON)."""
        return self.run_dir / "state.json"

    def host_dir(self, host: str) -> Path:
        """``<workdir>/hosts/<host>``: the host's fleet bundle, tailscaled state, socket, logs."""
        self.names.host_index(host)
        return self.workdir / "hosts" / host

    def socket_path(self, host: str) -> Path:
        """tailscaled's LocalAPI socket of a host."""
        return self.workdir / "hosts" / host / "tailscaled.sock"

    def robot_yaml(self, host: str) -> Path:
        """The host's robot config (fleet bundle)."""
        return self.host_dir(host) / "robot.yaml"

    def auth_key_path(self, host: str) -> Path:
        """The host's pre-auth key file (fleet bundle, mode 0600)."""
        return self.host_dir(host) / "auth.key"

    def ca_cert_path(self, host: str) -> Path:
        """The CA certificate the host trusts for the control server (fleet bundle)."""
        return self.host_dir(host) / "ca.crt"

    @property
    def control_dir(self) -> Path:
        """The headscale deployment directory (fleet init output)."""
        return self.workdir / "control"

    def namespace(self, node: str) -> str:
        """Namespace of a host, a building's router, ``control`` or ``backbone``."""
        return self.names.namespace_of(node)

    def address(self, host: str) -> str:
        """A host's LAN (underlay) address; for a building, its router's public (backbone) address."""
        if any(b.name == host for b in self.spec.buildings):
            return self.names.router_wan_address(host)
        if host == "control":
            return self.names.control_address
        return self.names.host_address(host)

    @property
    def server_url(self) -> str:
        """Headscale's URL as the hosts reach it."""
        return self.names.server_url

    @property
    def hosts(self) -> List[str]:
        """Host names in spec order."""
        return [h.name for h in self.spec.hosts]

    def tailscale_cli(self) -> Path:
        """The tailscale CLI binary."""
        return tools_bin() / "tailscale"
