"""The lab's control host: a fleet description built from the lab spec, provisioned through the
project's own fleet code (overlay_manager.fleet), so the lab and a real deployment share one path.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .errors import LabError
from .naming import Names

FLEET_NAME = "lab"
"""Fleet (and headscale user) name used by every lab run."""


def fleet_dict(names: Names) -> dict[str, Any]:
    """A fleet file (as a mapping) for the lab: every lab host is a member of its spec team.

    server_url is ``https://<control address>:<port>`` (reachable from every namespace), TLS from
    a generated CA, embedded DERP + STUN announced on the control address.
    """
    spec = names.spec
    teams: dict[str, dict[str, Any]] = {}
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
            "derp": {"embedded": True,
                     "stun_listen": f"{names.control_address}:{spec.control.stun_port}",
                     "ipv4": names.control_address},
        },
        "keys": {"auth_key_expiry": "24h", "reusable": False},
        "teams": teams,
    }


def _fleet_modules() -> tuple[Any, Any, Any]:
    try:
        from ..fleet import bundle, config, deploy
    except ImportError as exc:
        raise LabError("overlay_manager.fleet (fleet provisioning: config, deploy, bundle) is not "
                       f"available: {exc}") from None
    return config, deploy, bundle


def load_fleet(names: Names, source: str) -> Any:
    """The lab's FleetConfig (``source`` names it in errors)."""
    config, _, _ = _fleet_modules()
    try:
        return config.load_fleet_dict(fleet_dict(names), path=source)
    except config.FleetError as exc:
        raise LabError(f"fleet description generated from lab spec {names.spec.source} is invalid: "
                       f"{exc}") from None


def init_control(names: Names, outdir: Path, headscale: Path) -> tuple[Any, Any]:
    """Write the headscale deployment for the lab into ``outdir``: (FleetConfig, Deployment)."""
    config, deploy, _ = _fleet_modules()
    fleet = load_fleet(names, str(outdir / "fleet.yaml"))
    try:
        dep = deploy.init_deployment(fleet, outdir, headscale=str(headscale))
    except config.FleetError as exc:
        raise LabError(f"cannot initialise the lab's headscale deployment in {outdir}: {exc}") from None
    return fleet, dep


def open_control(outdir: Path, headscale: Path) -> Any:
    """Reopen the Deployment written by :func:`init_control`."""
    config, deploy, _ = _fleet_modules()
    try:
        return deploy.Deployment.open(outdir, headscale=str(headscale))
    except config.FleetError as exc:
        raise LabError(f"cannot reopen the lab's headscale deployment in {outdir}: {exc}") from None


def write_host_bundle(dep: Any, fleet: Any, host: str, outdir: Path, socket: Path, cli: Path,
                      overrides: Mapping[str, Any] | None = None) -> Path:
    """The fleet bundle (robot.yaml, auth.key, ca.crt) for one lab host, in ``outdir``.

    robot.yaml's ``tailscale.socket`` is the host's own tailscaled socket and ``tailscale.cli``
    the given CLI binary; ``overrides`` adds other robot.yaml content (sections are merged).
    """
    config, _, bundle = _fleet_modules()
    merged: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (overrides or {}).items()}
    merged.setdefault("tailscale", {}).update({"socket": str(socket), "cli": str(cli)})
    try:
        return Path(bundle.write_bundle(dep, fleet, host, outdir, overrides=merged))
    except config.FleetError as exc:
        raise LabError(f"cannot write the fleet bundle of lab host {host} into {outdir}: {exc}") from None
