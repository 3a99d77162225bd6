"""Fleet provisioning: a Headscale deployment, ACL policy and enrolment bundles from one fleet file.

Public API (see docs/ARCHITECTURE.md, "Contracts between modules")::

    from overlay_manager.fleet import load_fleet, init_deployment, write_bundle
    fleet = load_fleet("fleet.yaml")             # FleetConfig, or ConfigError naming file/key/host
    dep = init_deployment(fleet, "headscale")    # Deployment (idempotent; nothing half-written)
    argv = dep.serve_argv()                      # run it (in any namespace); wait for dep.cli().health()
    write_bundle(dep, fleet, "alpha-robot1", "bundles/alpha-robot1")  # robot.yaml, ca.crt, auth.key
    renew_server_cert(dep, fleet)                # server certificate from the same CA (atomic)
"""

from overlay_manager.fleet.bundle import ensure_key, robot_config, write_bundle
from overlay_manager.fleet.config import FleetConfig, FleetError, Host, Team, load_fleet, load_fleet_dict
from overlay_manager.fleet.deploy import Deployment, apply_policy, init_deployment, renew_server_cert
from overlay_manager.fleet.headscale import HeadscaleCLI, find_headscale
from overlay_manager.fleet.ops import fleet_status, revoke, rotate
from overlay_manager.fleet.policy import generate_policy, render_policy

__all__ = [
    "Deployment", "FleetConfig", "FleetError", "HeadscaleCLI", "Host", "Team", "apply_policy",
    "ensure_key", "find_headscale", "fleet_status", "generate_policy", "init_deployment",
    "load_fleet", "load_fleet_dict", "render_policy", "renew_server_cert", "revoke", "robot_config",
    "rotate", "write_bundle",
]
