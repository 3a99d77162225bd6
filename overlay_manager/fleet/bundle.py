"""Enrolment bundles: robot.yaml + ca.crt + auth.key (0600) for one host; a derper host's bundle
also holds ``derper/`` (its certificate from the fleet CA, key 0600, the systemd unit, a meshed
region's mesh key 0600; see :func:`write_derper_files`).

The pre-auth key is tagged with the host's ACL tags (so the node is a tagged node of its team)
and recorded in the deployment (``keys/<host>.json`` without the secret, ``keys/<host>.key``
with it, 0600). Running ``bundle`` again reuses a recorded key while it can still enrol the host
(or while the host is enrolled with it), so no keys pile up. The secret is only ever written to
0600 files; it is never printed, logged or put in an exception.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import yaml

from overlay_manager.fleet import tls
from overlay_manager.fleet.deploy import Deployment
from overlay_manager.fleet.derp import DerpServer, derper_settings, derper_unit, servers_on, template_path
from overlay_manager.fleet.headscale import HeadscaleCLI, Node, PreAuthKey
from overlay_manager.fleet.model import FleetConfig, FleetError
from overlay_manager.fleet.relays import relay_settings
from overlay_manager.system.files import atomic_write, write_text

#: A recorded key is reused only if it stays usable at least this long (seconds).
REUSE_MARGIN_S = 600.0
#: Where the derper unit expects the bundle's derper/ directory and the derper binary on the host.
DERPER_CERTDIR = "/etc/overlay_manager/derper"
DERPER_BIN = "/usr/local/bin/derper"
#: tailscaled's LocalAPI socket of the packaged tailscaled.service (robot.yaml may say otherwise).
DEFAULT_TAILSCALED_SOCKET = "/var/run/tailscale/tailscaled.sock"


@dataclass(frozen=True)
class KeyRecord:
    """The current pre-auth key of one host (metadata only).

    Attributes:
        host: short name.
        id: headscale key id.
        tags: tags the key gives.
        expiration: when it stops working (None = never).
        created: True when this call created it (False = an existing key was reused).
    """

    host: str
    id: int
    tags: Tuple[str, ...]
    expiration: Optional[datetime]
    created: bool = False


def _write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` + newline to ``path`` with mode 0600 from the first byte (atomic:
    overlay_manager.system.files.atomic_write sets the temporary file's mode before writing)."""
    write_text(path, secret + "\n", 0o600)


def _read_record(dep: Deployment, host: str) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads((dep.keys_dir / f"{host}.json").read_text(encoding="utf-8"))
        return data if isinstance(data, dict) and "id" in data else None
    except (OSError, json.JSONDecodeError):
        return None


def read_key_record(dep: Deployment, host: str) -> Optional[Tuple[int, Optional[datetime]]]:
    """(key id, expiration) recorded for ``host``, or None."""
    rec = _read_record(dep, host)
    if rec is None:
        return None
    exp = rec.get("expiration")
    return int(rec["id"]), datetime.fromisoformat(exp) if exp else None


def nodes_named(nodes: List[Node], host: str) -> List[Node]:
    """Nodes whose MagicDNS name or reported hostname is ``host``."""
    return [n for n in nodes if n.given_name == host or n.name == host]


def ensure_key(dep: Deployment, fleet: FleetConfig, host: str, *, force_new: bool = False,
               cli: Optional[HeadscaleCLI] = None) -> KeyRecord:
    """Make sure ``host`` has a recorded pre-auth key with its tags; create one if needed.

    Reuses the recorded key when headscale still lists it with the same tags and it is either
    usable for :data:`REUSE_MARGIN_S` more seconds, or already used by the host's enrolled,
    unexpired node. Otherwise (or with ``force_new``) creates a new key and expires the old
    one if it could still enrol a machine.

    Raises:
        FleetError: unknown host, headscale not running, or a CLI failure (naming the host).
    """
    h = fleet.host(host)
    tags = fleet.host_tags(h.name)
    cli = cli or dep.cli()
    secret_path = dep.keys_dir / f"{h.name}.key"
    rec = _read_record(dep, h.name)
    try:
        keys = {k.id: k for k in cli.list_preauth_keys()}
        old: Optional[PreAuthKey] = keys.get(int(rec["id"])) if rec else None
        if old is not None and not force_new and secret_path.exists() \
                and sorted(old.tags) == sorted(tags):
            if old.usable(margin_s=REUSE_MARGIN_S):
                return KeyRecord(h.name, old.id, old.tags, old.expiration, created=False)
            if old.used:
                enrolled = [n for n in nodes_named(cli.list_nodes(), h.name) if not n.expired()]
                if enrolled:
                    return KeyRecord(h.name, old.id, old.tags, old.expiration, created=False)
        new, secret = cli.create_preauth_key(tags, fleet.keys.auth_key_expiry,
                                             reusable=fleet.keys.reusable)
        _write_secret(secret_path, secret)
        del secret
        write_text(dep.keys_dir / f"{h.name}.json", json.dumps({
            "host": h.name, "id": new.id, "tags": list(new.tags),
            "expiration": new.expiration.isoformat() if new.expiration else None,
        }, indent=2) + "\n", 0o600)
        if old is not None and old.id != new.id and old.usable():
            cli.expire_preauth_key(old.id)
    except FleetError as e:
        raise FleetError(e.reason, file=e.file, key=e.key, host=h.name) from None
    return KeyRecord(h.name, new.id, new.tags, new.expiration, created=True)


def robot_config(dep: Deployment, fleet: FleetConfig, host: str,
                 overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The robot.yaml mapping for ``host`` (keys as in config/robot.example.yaml).

    ``overrides``: optional ``tailscale`` / ``node`` sections (or top-level keys) merged in.
    A relay host (the fleet file's ``relays`` section) gets ``relay: {port, static_endpoints}``,
    which makes its node turn tailscaled's peer relay server on; a derper host (``derp_regions``)
    gets ``derper: {url, region}``. Both are written by the types overlay_manager.core.config
    parses them into (``RelaySettings``, ``DerperSettings``), so writer and reader cannot drift.
    """
    h = fleet.host(host)
    team = fleet.teams[h.team]
    cfg: Dict[str, Any] = {
        "hostname": h.name,
        "login_server": dep.server_url,
        "base_domain": fleet.base_domain,
        "master": team.master,
        "auth_key_file": "auth.key",
        "tags": fleet.host_tags(h.name),
        "ca_cert": "ca.crt" if dep.ca_cert else "",
        "master_port": fleet.hosts[team.master].master_port,
    }
    relay = fleet.relays.get(h.name)
    if relay is not None:
        cfg["relay"] = relay_settings(relay).to_yaml()
    derpers = servers_on(fleet.derp_regions, h.name)
    if derpers:
        cfg["derper"] = derper_settings(derpers[0]).to_yaml()
    for k, v in (overrides or {}).items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    # With MagicDNS off on the machine (tailscale.accept_dns false, the default) nothing resolves
    # the other machines' overlay names unless the node keeps its managed hosts block: turn it on
    # (an explicit node.manage_hosts in overrides wins).
    tailscale = cfg.get("tailscale")
    if not (isinstance(tailscale, dict) and tailscale.get("accept_dns") is True):
        node = cfg.get("node")
        cfg["node"] = {"manage_hosts": True, **(node if isinstance(node, dict) else {})}
    return cfg


def robot_yaml(cfg: Dict[str, Any], header: str = "") -> str:
    """robot.yaml's text: ``header`` (comment lines) and ``cfg`` (from :func:`robot_config`) in
    its key order."""
    return header + yaml.safe_dump(cfg, sort_keys=False)


def write_bundle(deployment: Deployment, fleet: FleetConfig, host: str, outdir: Union[str, Path],
                 *, overrides: Optional[Dict[str, Any]] = None, force_new_key: bool = False) -> Path:
    """Write the enrolment bundle of ``host`` into ``outdir``; return the robot.yaml path.

    Files: ``robot.yaml`` (loadable by overlay_manager.core.config.load_robot_config; relative
    paths), ``ca.crt`` (when the server uses a CA) and ``auth.key`` (mode 0600). Needs the
    deployment's headscale running (pre-auth keys are created through its CLI). Idempotent:
    see :func:`ensure_key`.

    Args:
        deployment: the initialised deployment.
        fleet: its fleet file.
        host: short name of a host in the fleet file.
        outdir: bundle directory (created, mode 0700).
        overrides: optional extra robot.yaml content, e.g. ``{"tailscale": {"socket": ...}}``.
        force_new_key: always create a new pre-auth key (used by ``rotate``).

    Raises:
        FleetError: naming the host (unknown host, headscale not running, ...).
    """
    out = Path(outdir).expanduser().resolve()
    rec = ensure_key(deployment, fleet, host, force_new=force_new_key)
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    secret_src = deployment.keys_dir / f"{rec.host}.key"
    try:
        secret = secret_src.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise FleetError(f"cannot read the recorded key: {e.strerror}", file=secret_src,
                         host=rec.host) from None
    _write_secret(out / "auth.key", secret)
    del secret
    if deployment.ca_cert:
        if deployment.ca_cert.resolve() != (out / "ca.crt").resolve():
            atomic_write(out / "ca.crt", deployment.ca_cert.read_bytes(), 0o644)
    cfg = robot_config(deployment, fleet, rec.host, overrides)
    for server in servers_on(fleet.derp_regions, rec.host):
        tailscale = cfg.get("tailscale") if isinstance(cfg.get("tailscale"), dict) else {}
        write_derper_files(deployment, fleet, server, out / "derper",
                           socket=str(tailscale.get("socket") or DEFAULT_TAILSCALED_SOCKET))
    exp = rec.expiration.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") \
        if rec.expiration else "never"
    header = (f"# overlay_manager robot config for '{rec.host}' (team {fleet.host(rec.host).team}),"
              f" written by `fleet bundle`.\n"
              f"# auth.key: pre-auth key id {rec.id}, tags {', '.join(rec.tags)}, "
              f"usable until {exp}.\n")
    path = out / "robot.yaml"
    write_text(path, robot_yaml(cfg, header), 0o644)
    return path


def derper_credentials(dep: Deployment, fleet: FleetConfig, server: DerpServer) -> Tuple[Path, Path, Optional[Path]]:
    """(certificate, key, mesh key or None) of ``server`` in the deployment, made when missing:
    the certificate (``tls/derp-<host>.crt``) from the fleet CA for the server's hostname and
    address, re-issued when they change; the region's mesh key (``derp/<region>.meshkey``, 0600,
    64 hex digits) when the region has several servers.

    Raises:
        FleetError: no fleet CA in the deployment, or it cannot issue (naming the host).
    """
    tls_dir = dep.root / "tls"
    ca_key, ca_crt = tls_dir / "ca.key", tls_dir / "ca.crt"
    if not (ca_key.exists() and ca_crt.exists()):
        raise FleetError("no fleet CA in the deployment to sign the derper certificate (rerun `fleet init` "
                         "with server.tls.generate: true)", file=ca_key, host=server.host)
    try:
        key, crt = tls.ensure_derper_cert(tls_dir, ca_key, ca_crt, server.cert_names, fleet.server.tls.days,
                                          server.host)
    except FleetError as e:
        raise FleetError(e.reason, file=e.file, host=server.host) from None
    mesh: Optional[Path] = None
    if fleet.derp_regions[server.region].meshed:
        mesh = dep.root / "derp" / f"{server.region}.meshkey"
        if not mesh.exists():
            write_text(mesh, secrets.token_hex(32) + "\n", 0o600)
    return crt, key, mesh


def write_derper_files(dep: Deployment, fleet: FleetConfig, server: DerpServer, outdir: Path, *,
                       socket: str) -> Path:
    """Write ``outdir`` (the bundle's ``derper/``): ``<hostname>.crt``, ``<hostname>.key`` (0600),
    ``mesh.key`` (0600, meshed regions) and ``derper.service`` from
    ``config/systemd/derper.service.in``, verifying clients against the tailscaled at ``socket``.
    Returns the unit's path.

    Raises:
        FleetError: naming the host or the template.
    """
    crt, key, mesh = derper_credentials(dep, fleet, server)
    outdir.mkdir(parents=True, exist_ok=True)
    os.chmod(outdir, 0o700)
    atomic_write(outdir / f"{server.cert_stem}.crt", crt.read_bytes(), 0o644)
    atomic_write(outdir / f"{server.cert_stem}.key", key.read_bytes(), 0o600)
    if mesh is not None:
        atomic_write(outdir / "mesh.key", mesh.read_bytes(), 0o600)
    template = template_path()
    try:
        text = template.read_text(encoding="utf-8")
        unit = derper_unit(text, str(template), server, fleet.derp_regions[server.region], fleet=fleet.name,
                           derper_bin=DERPER_BIN, certdir=DERPER_CERTDIR, socket=socket,
                           mesh_key_file=f"{DERPER_CERTDIR}/mesh.key")
    except OSError as e:
        raise FleetError(f"cannot read the derper unit template: {e.strerror}", file=template,
                         host=server.host) from None
    except KeyError as e:
        raise FleetError(str(e.args[0]), file=template, host=server.host) from None
    path = outdir / "derper.service"
    write_text(path, unit, 0o644)
    return path
