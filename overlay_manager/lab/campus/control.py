"""The lab's control host: a fleet description built from the lab spec, provisioned through the
project's own fleet code (overlay_manager.fleet), so the lab and a real deployment share one path;
and :class:`ControlServer`, which runs that deployment's headscale in the control namespace and
writes each host's fleet bundle.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from overlay_manager.core.validation import ConfigError
from overlay_manager.fleet import bundle, config, deploy
from overlay_manager.fleet.deploy import Deployment
from overlay_manager.fleet.model import FleetConfig, FleetError
from overlay_manager.lab.campus.derpers import fleet_derp
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import RunLayout, tools_bin
from overlay_manager.lab.campus.naming import Names
from overlay_manager.lab.campus.processes import Processes
from overlay_manager.lab.campus.relays import fleet_relays
from overlay_manager.lab.campus.system import Echo, tcp_connect, wait_for
from overlay_manager.system.waiting import tail

HEADSCALE_START_TIMEOUT_S = 30.0
HEADSCALE_KEY = "headscale"
"""Key of the headscale process in the run's state file."""

FLEET_NAME = "lab"
"""Fleet (and headscale user) name used by every lab run."""


def fleet_dict(names: Names) -> Dict[str, Any]:
    """A fleet file (as a mapping) for the lab: every lab host is a member of its spec team.

    server_url is ``https://<control address>:<port>`` (reachable from every namespace), TLS from
    a generated CA, embedded DERP + STUN announced on the control address (unless the spec's
    ``derp.embedded`` is false), and the spec's DERP regions as ``derp_regions``.
    """
    spec = names.spec
    regions, embedded = fleet_derp(names)
    teams: Dict[str, Dict[str, Any]] = {}
    role_key = {"robot": "robots", "base_station": "base_stations", "operator": "operators"}
    for h in spec.hosts:
        team = teams.setdefault(h.team, {"master": spec.teams[h.team]})
        team.setdefault(role_key[h.role], []).append(h.name)
    return {
        "fleet": FLEET_NAME,
        "base_domain": spec.control.base_domain,
        "server": {
            "url": names.server_url,
            "listen": f"{names.control_address}:{spec.control.port}",
            "tls": {"generate": True},
            "derp": {"embedded": embedded,
                     "stun_listen": f"{names.control_address}:{spec.control.stun_port}",
                     "ipv4": names.control_address},
        },
        "keys": {"auth_key_expiry": "24h", "reusable": False},
        "teams": teams,
        **({"relays": fleet_relays(spec)} if spec.relays else {}),
        **({"derp_regions": regions} if regions else {}),
    }


def load_fleet(names: Names, source: str) -> FleetConfig:
    """The lab's FleetConfig (``source`` names it in errors)."""
    try:
        return config.load_fleet_dict(fleet_dict(names), path=source)
    except (FleetError, ConfigError) as exc:
        raise LabError(f"fleet description generated from lab spec {names.spec.source} is invalid: "
                       f"{exc}") from None


def init_control(names: Names, outdir: Path, headscale: Path) -> Tuple[FleetConfig, Deployment]:
    """Write the headscale deployment for the lab into ``outdir``: (FleetConfig, Deployment)."""
    fleet = load_fleet(names, str(outdir / "fleet.yaml"))
    try:
        dep = deploy.init_deployment(fleet, outdir, headscale=str(headscale))
    except (FleetError, ConfigError) as exc:
        raise LabError(f"cannot initialise the lab's headscale deployment in {outdir}: {exc}") from None
    return fleet, dep


def open_control(outdir: Path, headscale: Path) -> Deployment:
    """Reopen the Deployment written by :func:`init_control`."""
    try:
        return deploy.Deployment.open(outdir, headscale=str(headscale))
    except FleetError as exc:
        raise LabError(f"cannot reopen the lab's headscale deployment in {outdir}: {exc}") from None


def write_host_bundle(dep: Deployment, fleet: FleetConfig, host: str, outdir: Path, socket: Path, cli: Path,
                      overrides: Optional[Mapping[str, Any]] = None) -> Path:
    """The fleet bundle (robot.yaml, auth.key, ca.crt) for one lab host, in ``outdir``.

    robot.yaml's ``tailscale.socket`` is the host's own tailscaled socket and ``tailscale.cli``
    the given CLI binary; ``overrides`` adds other robot.yaml content (sections are merged).
    """
    merged: Dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (overrides or {}).items()}
    merged.setdefault("tailscale", {}).update({"socket": str(socket), "cli": str(cli)})
    try:
        return Path(bundle.write_bundle(dep, fleet, host, outdir, overrides=merged))
    except FleetError as exc:
        raise LabError(f"cannot write the fleet bundle of lab host {host} into {outdir}: {exc}") from None


class ControlServer:
    """The run's headscale: deployment files, the process, and the hosts' fleet bundles.

    Args:
        layout: the run's paths and names (the deployment lives in ``layout.control_dir``).
        procs: where the headscale process is tracked (key ``headscale``).
        echo: receives one line per action.
        robot_overrides: extra robot.yaml content for every host's bundle.
    """

    def __init__(self, layout: RunLayout, procs: Processes, echo: Echo,
                 robot_overrides: Optional[Mapping[str, Any]] = None) -> None:
        self.layout = layout
        self.procs = procs
        self.echo = echo
        self.robot_overrides: Dict[str, Any] = dict(robot_overrides or {})
        self._fleet: Optional[FleetConfig] = None
        self._deployment: Optional[Deployment] = None

    @property
    def log_path(self) -> Path:
        """headscale's log file."""
        return self.layout.control_dir / "headscale.log"

    def init(self) -> None:
        """Write the deployment (config, TLS, policy) from the lab spec and start headscale."""
        self._fleet, self._deployment = init_control(self.layout.names, self.layout.control_dir,
                                                     tools_bin() / "headscale")
        self.echo(f"headscale deployment in {self.layout.control_dir} (server_url {self.layout.server_url})")
        self.start()

    def deployment(self) -> Deployment:
        """The fleet Deployment of this run's headscale (overlay_manager.fleet.deploy)."""
        if self._deployment is None:
            self._deployment = open_control(self.layout.control_dir, tools_bin() / "headscale")
        return self._deployment

    def fleet(self) -> FleetConfig:
        """The FleetConfig generated from the lab spec."""
        if self._fleet is None:
            self._fleet = load_fleet(self.layout.names, str(self.layout.control_dir / "fleet.yaml"))
        return self._fleet

    def running(self) -> bool:
        """True when the headscale process of this run is alive."""
        return self.procs.running(HEADSCALE_KEY)

    def start(self, timeout: float = HEADSCALE_START_TIMEOUT_S) -> None:
        """Start headscale in the control namespace and wait (``timeout`` seconds) until it
        accepts TCP connections and answers its CLI."""
        if self.running():
            self.echo("headscale: already running")
            return
        dep = self.deployment()
        names = self.layout.names
        ns = names.control_ns
        proc = self.procs.spawn(HEADSCALE_KEY, ns, dep.serve_argv(),
                                {**os.environ, "HOME": str(self.layout.control_dir)}, self.log_path)
        port = self.layout.spec.control.port

        def ready() -> bool:
            if proc.poll() is not None:
                raise LabError(f"headscale exited with {proc.returncode}; {self.log_path} ends: "
                               f"{tail(self.log_path)}")
            return tcp_connect(ns, names.control_address, port, 1.0) and dep.cli().health()

        wait_for(f"headscale to listen on {names.control_address}:{port} in {ns}", ready, timeout,
                 interval=0.2, detail=lambda: tail(self.log_path))

    def stop(self) -> None:
        """Stop headscale (SIGTERM, then SIGKILL after 5 s): existing tailscale links stay up."""
        self.procs.stop(HEADSCALE_KEY)

    def write_bundles(self) -> None:
        """Each host's fleet bundle (robot.yaml, auth.key, ca.crt) plus ``bin/tailscale``, a CLI
        wrapper bound to the host's own tailscaled socket."""
        cli = self.layout.tailscale_cli()
        for h in self.layout.hosts:
            d = self.layout.host_dir(h)
            d.mkdir(parents=True, exist_ok=True)
            sock = self.layout.socket_path(h)
            self.echo(f"fleet bundle for {h} -> {d}")
            write_host_bundle(self.deployment(), self.fleet(), h, d, sock, cli, self.robot_overrides)
            wrapper = d / "bin" / "tailscale"
            wrapper.parent.mkdir(exist_ok=True)
            wrapper.write_text(f'#!/bin/sh\n# tailscale CLI bound to lab host {h}\'s tailscaled\n'
                               f'exec {cli} --socket={sock} "$@"\n')
            wrapper.chmod(0o755)
