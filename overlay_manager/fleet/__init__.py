"""Fleet provisioning: a Headscale deployment, ACL policy and enrolment bundles from one fleet file.

Public API (see docs/ARCHITECTURE.md, "Contracts between modules"); import from the modules::

    from overlay_manager.fleet.config import load_fleet
    from overlay_manager.fleet.deploy import init_deployment, renew_server_cert
    from overlay_manager.fleet.bundle import write_bundle
    fleet = load_fleet("fleet.yaml")             # FleetConfig, or ConfigError naming file/key/host
    dep = init_deployment(fleet, "headscale")    # Deployment (idempotent; nothing half-written)
    argv = dep.serve_argv()                      # run it (in any namespace); wait for dep.cli().health()
    write_bundle(dep, fleet, "alpha-robot1", "bundles/alpha-robot1")  # robot.yaml, ca.crt, auth.key
    renew_server_cert(dep, fleet)                # server certificate from the same CA (atomic)
"""
