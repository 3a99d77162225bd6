"""Bring this machine onto the overlay: enrol once, never re-enrol or rename on restart."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Dict, Optional

from .config import ConfigError, RobotConfig, require_config_file
from .tailscale import EnrolError, EnrolRequest, LocalAPI, TailscaleError, enrol


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
    if logged_in and not reauth:
        if not _same_server(control, cfg.login_server):
            raise EnrolError(
                f"tailscaled is logged in to {control}, but {cfg.source} says login_server "
                f"{cfg.login_server}; not re-enrolling. Run `tailscale logout` first to switch servers."
            )
        return EnrolResult("already-enrolled", state, f"already enrolled at {control}")
    if reauth and control and not _same_server(control, cfg.login_server):
        raise EnrolError(
            f"tailscaled is logged in to {control}, but {cfg.source} says login_server "
            f"{cfg.login_server}; not re-enrolling. Run `tailscale logout` first to switch servers."
        )
    if not cfg.auth_key_file:
        raise EnrolError(
            f"tailscaled is not logged in (state {state or 'unknown'}) and {cfg.source} has no "
            f"auth_key_file; get an enrolment bundle with `fleet bundle {cfg.hostname}`"
        )
    try:  # named after the config file and key; check_key_file adds the mode check
        require_config_file(cfg, "auth_key_file")
        if cfg.ca_cert:
            require_config_file(cfg, "ca_cert")  # tailscale up would fail with an x509 riddle
    except ConfigError as exc:
        raise EnrolError(str(exc)) from None
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
        if reauth and "authkey already used" in text and _reauthenticated(api, old_node_key,
                                                                           cfg.tailscale.up_timeout):
            # Seen with headscale 0.29 + tailscale 1.102: the re-registration with the new key
            # succeeds (new node key, same node, key marked used), then tailscaled registers once
            # more with the same key and `tailscale up` reports headscale's "already used".
            return EnrolResult("re-enrolled", "Running", f"re-enrolled at {cfg.login_server} as {cfg.hostname} "
                               f"(new node key; headscale answered a repeated registration with "
                               f"'authkey already used')")
        if "x509" in text or "certificate" in text:
            raise EnrolError(
                text + f" -- tailscaled does not trust the server's certificate: start tailscaled with "
                f"SSL_CERT_FILE={cfg.ca_cert or '<fleet ca.crt>'} or install the CA with "
                f"`overlay_env --config {cfg.source} --install-ca` (root), then restart tailscaled"
            ) from None
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
            raise EnrolError(f"after `tailscale up`, tailscaled is in state {state or 'unknown'}, "
                             f"not Running (waited for Running)")
        time.sleep(0.2)
