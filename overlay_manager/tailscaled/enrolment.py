"""Bring this machine onto the overlay: enrol once, never re-enrol or rename on restart."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Dict, Optional

from overlay_manager.core.commands import overlay_env_as_root
from overlay_manager.core.config import RobotConfig, require_config_file
from overlay_manager.core.validation.errors import ConfigError
from overlay_manager.tailscaled.localapi import (
    BUNDLE_FIX,
    ENROL_CERTIFICATE,
    ENROL_KEY_FILE,
    ENROL_KEY_REJECTED,
    ENROL_SERVER,
    EnrolError,
    EnrolRequest,
    LocalAPI,
    TailscaleError,
    enrol,
    up_failure_fix,
)


@dataclass(frozen=True)
class EnrolResult:
    """What ensure_enrolled did."""

    action: str          # "already-enrolled" | "enrolled" | "re-enrolled"
    backend_state: str   # tailscaled's BackendState afterwards
    message: str


def tailscale_env(cfg: RobotConfig) -> Dict[str, str]:
    """Environment for the tailscale CLI: trusts the fleet's private CA when ca_cert is set."""
    env = dict(os.environ)
    if cfg.ca_cert:
        env["SSL_CERT_FILE"] = cfg.ca_cert
    return env


def _node_key(status: object) -> str:
    """This machine's node key from a LocalAPI status ("" when unknown)."""
    me = status.get("Self") if isinstance(status, dict) else None
    return str(me.get("PublicKey", "") or "") if isinstance(me, dict) else ""


def _reauthenticated(api: LocalAPI, old_node_key: str, wait_s: float) -> bool:
    """True when tailscaled runs with a node key other than old_node_key within wait_s seconds
    (on a loaded machine its state settles seconds after `tailscale up` returned): a
    re-authentication took place, whatever `tailscale up` said."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            status = api.status()
        except TailscaleError:
            status = {}
        key = _node_key(status)
        if status.get("BackendState") == "Running" and key and old_node_key and key != old_node_key:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _same_server(a: str, b: str) -> bool:
    return a.rstrip("/").lower() == b.rstrip("/").lower()


def ensure_enrolled(api: LocalAPI, cfg: RobotConfig, wait_s: Optional[float] = None,
                    reauth: bool = False) -> EnrolResult:
    """Log in to cfg.login_server unless tailscaled already runs logged in to it.

    With reauth, log in again with cfg.auth_key_file even when already logged in to that server
    (`tailscale up --force-reauth` with the same flags as the first enrolment, so tailscale does
    not refuse it for leaving settings out). For a new key after `fleet rotate` or an expired node.

    Raises:
        EnrolError: logged in to another server, no key file, bad key file, `tailscale up` failed,
            or tailscaled not Running in time. Messages never contain the key.
        TailscaleError: tailscaled not reachable.
    """
    status = api.status()
    state = status.get("BackendState", "") if isinstance(status, dict) else ""
    prefs = api.prefs()
    control = prefs.get("ControlURL", "") if isinstance(prefs, dict) else ""
    logged_in = state in ("Running", "Starting") and bool(control)
    other_server = EnrolError(
        f"tailscaled is logged in to {control}, but {cfg.source} says login_server "
        f"{cfg.login_server}; not re-enrolling",
        "run `sudo tailscale logout` first to switch servers (or fix login_server in "
        f"{cfg.source})", ENROL_SERVER)
    if logged_in and not reauth:
        if not _same_server(control, cfg.login_server):
            raise other_server
        return EnrolResult("already-enrolled", state, f"already enrolled at {control}")
    if reauth and control and not _same_server(control, cfg.login_server):
        raise other_server
    if not cfg.auth_key_file:
        raise EnrolError(
            f"tailscaled is not logged in (state {state or 'unknown'}) and {cfg.source} has no "
            "auth_key_file",
            f"get an enrolment bundle with `fleet bundle {cfg.hostname}` on the fleet server and "
            "use its robot.yaml and auth.key", ENROL_KEY_FILE)
    try:  # named after the config file and key; check_key_file adds the mode check
        require_config_file(cfg, "auth_key_file")
    except ConfigError as exc:
        raise EnrolError(str(exc), BUNDLE_FIX.replace("HOST", cfg.hostname), ENROL_KEY_FILE) from None
    try:
        if cfg.ca_cert:
            require_config_file(cfg, "ca_cert")  # tailscale up would fail with an x509 riddle
    except ConfigError as exc:
        raise EnrolError(str(exc), "copy ca.crt from the machine's enrolment bundle (`fleet bundle "
                         f"{cfg.hostname}` on the fleet server)", ENROL_CERTIFICATE) from None
    request = EnrolRequest(
        login_server=cfg.login_server, hostname=cfg.hostname, auth_key_file=cfg.auth_key_file,
        tags=list(cfg.tags), accept_dns=cfg.tailscale.accept_dns, timeout_s=cfg.tailscale.up_timeout,
        force_reauth=reauth,
    )
    old_node_key = _node_key(status)
    try:
        enrol(cfg.tailscale.cli, api.socket_path, request, env=tailscale_env(cfg))
    except EnrolError as exc:
        text = str(exc)
        if reauth and "authkey already used" in text.lower() and _reauthenticated(
                api, old_node_key, cfg.tailscale.up_timeout):
            # Seen with headscale 0.29 + tailscale 1.102: the re-registration with the new key
            # succeeds (new node key, same node, key marked used), then tailscaled registers once
            # more with the same key and `tailscale up` reports headscale's "already used".
            return EnrolResult("re-enrolled", "Running", f"re-enrolled at {cfg.login_server} as {cfg.hostname} "
                               f"(new node key; headscale answered a repeated registration with "
                               f"'authkey already used')")
        if exc.kind == ENROL_CERTIFICATE:
            install_ca = overlay_env_as_root(f"--config {cfg.source} --install-ca")
            raise EnrolError(exc.cause, (
                f"start tailscaled with SSL_CERT_FILE={cfg.ca_cert or '<fleet ca.crt>'} in its "
                f"environment or install the CA with `{install_ca}`, then restart tailscaled"), exc.kind) from None
        if exc.kind == ENROL_KEY_REJECTED:
            raise EnrolError(exc.cause, up_failure_fix(exc.kind, request, cfg.auth_key_file, cfg.source),
                             exc.kind) from None
        if exc.kind == ENROL_KEY_FILE:
            raise EnrolError(exc.cause, exc.fix.replace("HOST", cfg.hostname), exc.kind) from None
        raise
    deadline = time.monotonic() + (wait_s if wait_s is not None else cfg.tailscale.up_timeout)
    while True:
        try:
            state = api.status().get("BackendState", "")
        except TailscaleError:
            state = ""
        if state == "Running":
            action = "re-enrolled" if reauth else "enrolled"
            return EnrolResult(action, state, f"{action} at {cfg.login_server} as {cfg.hostname}")
        if time.monotonic() > deadline:
            waited = wait_s if wait_s is not None else cfg.tailscale.up_timeout
            if state == "NeedsLogin":
                raise EnrolError(
                    f"after `tailscale up`, tailscaled is in state NeedsLogin after {waited:g} s: the "
                    "control server did not accept the key", up_failure_fix(
                        ENROL_KEY_REJECTED, request, cfg.auth_key_file, cfg.source), ENROL_KEY_REJECTED)
            raise EnrolError(
                f"after `tailscale up`, tailscaled is in state {state or 'unknown'}, not Running, "
                f"after {waited:g} s",
                "see `tailscale status` and `journalctl -u tailscaled`; NeedsMachineAuth: approve the "
                f"node on the server; or raise tailscale.up_timeout in {cfg.source}")
        time.sleep(0.2)
