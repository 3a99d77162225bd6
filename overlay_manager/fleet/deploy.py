"""A Headscale deployment directory made from a fleet file.

Layout of a deployment directory (``outdir``)::

    config.yaml        headscale config: offline (no public DERP map, no update checks, no logtail)
    policy.hujson      ACL policy (file mode; reloaded with SIGHUP)
    deployment.json    what the fleet tool needs to reopen the deployment (no secrets)
    tls/ca.crt         private CA robots trust (ca.key next to it, 0600)
    tls/server.crt     server certificate (server.key 0600)
    data/              headscale's database and private keys (headscale owns it; never opened here)
    run/headscale.sock headscale's unix socket (CLI gRPC)
    run/headscale.pid  pid of `fleet serve` (if started that way)
    keys/<host>.json   id and expiry of the host's current pre-auth key; keys/<host>.key its
                       secret (0600), so that `bundle` again reuses an unused key
    derp/derpmap.yaml  the fleet's own DERP regions (fleet file ``derp_regions``), in headscale's
                       derp.paths; tls/derp-<host>.crt a derper's certificate, derp/<region>.meshkey
                       the mesh key of a region with several derpers (0600); see fleet/derp.py

:func:`init_deployment` builds a new deployment in a temporary directory and moves it into place
only when complete, so a failed ``init`` leaves nothing half-written. It is idempotent: running
it again converges (the CA is kept, the server
certificate is re-issued only when its names change, config.yaml is rewritten only when it
differs, a changed policy goes through :func:`apply_policy`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union
from urllib.parse import urlsplit

import yaml

from overlay_manager.core.validation import ConfigError, require_file
from overlay_manager.fleet import tls
from overlay_manager.fleet.derp import render_derp_map
from overlay_manager.fleet.headscale import HeadscaleCLI, find_headscale
from overlay_manager.fleet.model import FleetConfig, FleetError
from overlay_manager.fleet.policy import render_policy
from overlay_manager.system.files import write_text


@dataclass
class Deployment:
    """An initialised deployment directory.

    Attributes:
        root: the deployment directory (absolute).
        fleet_name: the fleet's name (its headscale user owns the tags).
        server_url: URL machines enrol against (headscale server_url).
        base_domain: MagicDNS base domain.
        ca_cert: CA certificate robots must trust, or None (system trust store / http).
        headscale: headscale binary given or recorded ("" = none known); :meth:`binary` looks
            it up only when a command needs it (``init`` never runs headscale).
    """

    root: Path
    fleet_name: str
    server_url: str
    base_domain: str
    ca_cert: Optional[Path]
    headscale: str

    @property
    def config_path(self) -> Path:
        """headscale's config.yaml."""
        return self.root / "config.yaml"

    @property
    def policy_path(self) -> Path:
        """The ACL policy headscale enforces."""
        return self.root / "policy.hujson"

    @property
    def socket_path(self) -> Path:
        """headscale's unix socket (the CLI talks gRPC over it)."""
        return self.root / "run" / "headscale.sock"

    @property
    def pid_path(self) -> Path:
        """pid file written by `fleet serve`."""
        return self.root / "run" / "headscale.pid"

    @property
    def derp_map_path(self) -> Path:
        """The DERP map of the fleet's own regions (in headscale's ``derp.paths``)."""
        return self.root / "derp" / "derpmap.yaml"

    @property
    def keys_dir(self) -> Path:
        """Per-host pre-auth key records (0700)."""
        return self.root / "keys"

    def binary(self, needed_for: str = "") -> str:
        """The headscale binary (:func:`find_headscale` from :attr:`headscale`).

        Raises:
            FleetError: none found; the message names ``needed_for`` and how to point at one.
        """
        return find_headscale(self.headscale or None, needed_for=needed_for)

    def _serve_args(self) -> List[str]:
        return ["serve", "--config", str(self.config_path)]

    def serve_argv(self) -> List[str]:
        """argv that runs headscale in the foreground with this deployment."""
        return [self.binary("`fleet serve`"), *self._serve_args()]

    def cli(self, needed_for: str = "") -> HeadscaleCLI:
        """A CLI wrapper talking to this deployment's (running) headscale."""
        return HeadscaleCLI(self.binary(needed_for), self.config_path)

    def server_pid(self) -> Optional[int]:
        """pid of the running headscale serving this deployment, or None.

        Reads run/headscale.pid; otherwise looks for a process whose arguments are exactly
        those of :meth:`serve_argv` (same config path), e.g. one the lab started.
        """
        want = self._serve_args()
        try:
            pid = int(self.pid_path.read_text().strip())
            if _argv_of(pid)[1:] == want:
                return pid
        except (OSError, ValueError):
            pass
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _argv_of(int(entry))[1:] == want:
                return int(entry)
        return None

    def reload(self) -> bool:
        """Send SIGHUP to the running headscale so it re-reads the policy file.

        Returns False when no headscale is running for this deployment.
        """
        pid = self.server_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGHUP)
        return True

    def to_json(self) -> Dict[str, Any]:
        """What deployment.json stores."""
        return {"fleet": self.fleet_name, "server_url": self.server_url,
                "base_domain": self.base_domain,
                "ca_cert": str(self.ca_cert) if self.ca_cert else None,
                "headscale": self.headscale or None}

    @classmethod
    def open(cls, root: Union[str, Path], headscale: Optional[str] = None) -> Deployment:
        """Reopen a deployment written by :func:`init_deployment`.

        ``headscale``: binary to use (default: the one recorded at ``init``, then
        :func:`find_headscale`'s search, when a command needs it).
        """
        root = Path(root).expanduser().resolve()
        meta = root / "deployment.json"
        try:
            data = json.loads(meta.read_text(encoding="utf-8"))
        except OSError:
            raise FleetError("not a deployment directory (run `fleet init` first)",
                             file=meta) from None
        except ValueError as e:  # not JSON, not UTF-8
            raise FleetError(f"corrupt: {e}; rerun `fleet init`", file=meta) from None
        if not isinstance(data, dict):
            raise FleetError("corrupt: not a JSON object; rerun `fleet init`", file=meta)
        try:
            return cls(root=root, fleet_name=data["fleet"], server_url=data["server_url"],
                       base_domain=data["base_domain"],
                       ca_cert=Path(data["ca_cert"]) if data.get("ca_cert") else None,
                       headscale=str(headscale or data.get("headscale") or ""))
        except KeyError as e:
            raise FleetError("missing", file=meta, key=str(e.args[0])) from None


def _argv_of(pid: int) -> List[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def headscale_config(fleet: FleetConfig, root: Path, tls_cert: Optional[Path],
                     tls_key: Optional[Path]) -> Dict[str, Any]:
    """headscale v0.29 config for ``fleet`` in deployment ``root``: offline-ready.

    No public DERP map (``derp.urls: []``), no update checks, no logtail, DNS left alone on the
    clients (``override_local_dns: false``), MagicDNS on ``fleet.base_domain``.
    """
    s = fleet.server
    data = root / "data"
    derp_server: Dict[str, Any] = {
        "enabled": s.derp.embedded,
        "region_id": s.derp.region_id,
        "region_code": s.derp.region_code,
        "region_name": s.derp.region_name,
        "verify_clients": True,
        "stun_listen_addr": s.derp.stun_listen,
        "private_key_path": str(data / "derp_server_private.key"),
        "automatically_add_embedded_derp_region": True,
    }
    if s.derp.ipv4:
        derp_server["ipv4"] = s.derp.ipv4
    return {
        "server_url": s.url,
        "listen_addr": s.listen,
        "metrics_listen_addr": s.metrics_listen,
        "grpc_listen_addr": s.grpc_listen,
        "grpc_allow_insecure": False,
        "noise": {"private_key_path": str(data / "noise_private.key")},
        "prefixes": {"v4": s.prefixes_v4, "v6": s.prefixes_v6, "allocation": "sequential"},
        "derp": {
            "server": derp_server,
            "urls": [],
            "paths": [str(p) for p in s.derp.extra_maps]
            + ([str(root / "derp" / "derpmap.yaml")] if fleet.derp_regions else []),
            "auto_update_enabled": False,
            "update_frequency": "24h",
        },
        "disable_check_updates": True,
        "node": {"expiry": f"{fleet.keys.node_expiry}s"},
        "database": {"type": "sqlite",
                     "sqlite": {"path": str(data / "db.sqlite"), "write_ahead_log": True}},
        "tls_cert_path": str(tls_cert) if tls_cert else "",
        "tls_key_path": str(tls_key) if tls_key else "",
        "log": {"level": fleet.log_level, "format": "text"},
        "policy": {"mode": "file", "path": str(root / "policy.hujson")},
        "dns": {
            "magic_dns": True,
            "base_domain": fleet.base_domain,
            "override_local_dns": False,
            "nameservers": {"global": [], "split": {}},
            "search_domains": [],
            "extra_records": [],
        },
        "unix_socket": str(root / "run" / "headscale.sock"),
        "unix_socket_permission": "0770",
        "logtail": {"enabled": False},
        "taildrop": {"enabled": False},
        "cli": {"timeout": "5s"},
    }


def init_deployment(fleet: FleetConfig, outdir: Union[str, Path],
                    headscale: Optional[str] = None) -> Deployment:
    """Write (or converge) a complete offline Headscale deployment for ``fleet`` in ``outdir``.

    Creates the directory tree, the CA and server certificate (when ``server.tls.generate``),
    config.yaml, the ACL policy and deployment.json. Safe to run again: see the module
    docstring. A changed policy for a running server is checked and applied atomically.

    A new deployment is built in a temporary directory next to ``outdir`` (or inside it, when
    ``outdir`` already holds other files) and moved into place only when complete, with
    deployment.json last: on any error nothing of it is left behind. An existing deployment
    is converged file by file, each file replaced atomically, after every input was checked.

    Args:
        fleet: validated fleet file.
        outdir: deployment directory (created, mode 0700).
        headscale: headscale binary to record (default: the one :func:`find_headscale` finds,
            if any). A new deployment does not need it; converging one whose policy changed
            does (headscale checks the new policy).

    Raises:
        ConfigError: a problem in the fleet file (TLS files, certificate names), naming it and
            the key.
        FleetError: any other failure, naming the file concerned.
    """
    root = Path(outdir).expanduser().resolve()
    binary = str(headscale) if headscale else _headscale_if_any()
    if len(str(root / "run" / "headscale.sock")) > 100:
        raise FleetError("path too long for a unix socket (max 100 characters); use a shorter "
                         "deployment directory", file=root / "run" / "headscale.sock")
    tls.check_tls_files(fleet)
    for i, derp_map in enumerate(fleet.server.derp.extra_maps):  # headscale reads them at start
        require_file(fleet.path, f"server.derp.extra_maps[{i}]", derp_map, what="DERP map")
    if (root / "deployment.json").exists():
        return _write_deployment(fleet, root, root, binary, new=False)
    if root.exists() and not root.is_dir():
        raise FleetError("exists and is not a directory", file=root)
    root.parent.mkdir(parents=True, exist_ok=True)
    in_place = root.is_dir() and any(root.iterdir())
    build = Path(tempfile.mkdtemp(prefix=f".{root.name}.init-", dir=root if in_place else root.parent))
    try:
        dep = _write_deployment(fleet, build, root, binary, new=True)
        if in_place:
            names = sorted(os.listdir(build), key=lambda n: n == "deployment.json")
            clash = [n for n in names if (root / n).exists()]
            if clash:
                raise FleetError(f"not a deployment directory but holds {', '.join(clash)}; "
                                 "choose an empty or new directory", file=root)
            moved: List[Path] = []
            try:
                for n in names:
                    os.rename(build / n, root / n)
                    moved.append(root / n)
            except OSError:
                for m in moved:
                    if m.is_dir():
                        shutil.rmtree(m)
                    else:
                        m.unlink()
                raise
        else:
            os.rename(build, root)  # replaces an empty directory atomically
        os.chmod(root, 0o700)
        return dep
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)


def _headscale_if_any() -> str:
    """The headscale binary find_headscale finds, or "" (looked up again when needed)."""
    try:
        return find_headscale()
    except FleetError:
        return ""


def _write_deployment(fleet: FleetConfig, build: Path, root: Path, binary: str,
                      *, new: bool) -> Deployment:
    """Write the deployment's files into ``build`` for a deployment that will live at ``root``
    (the same directory when converging an existing one)."""
    for d in (build, build / "data", build / "run", build / "keys", build / "tls"):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700 if d != build / "tls" else 0o755)

    s = fleet.server
    ca_cert: Optional[Path] = None
    cert = key = None
    if urlsplit(s.url).scheme == "https":
        if s.tls.generate:
            tls.require_cryptography(fleet.path)
            names = [s.host, *s.tls.names]
            try:
                ca_key, _ = tls.ensure_ca(build / "tls", f"{fleet.name} fleet CA", s.tls.ca_days)
            except tls.NameRefused as e:
                raise ConfigError(fleet.path, "fleet", f"cannot make the fleet CA: {e.reason}; use a "
                                  "shorter fleet name") from None
            try:
                tls.ensure_server_cert(build / "tls", ca_key, build / "tls" / "ca.crt", names, s.tls.days)
            except tls.NameRefused as e:
                raise ConfigError(fleet.path, "server.tls.names" if s.tls.names else "server.url",
                                  f"cannot issue the server certificate for {', '.join(names)}: "
                                  f"{e.reason}") from None
            ca_cert, key, cert = root / "tls" / "ca.crt", root / "tls" / "server.key", root / "tls" / "server.crt"
        else:
            cert, key, ca_cert = s.tls.cert, s.tls.key, s.tls.ca

    dep = Deployment(root=root, fleet_name=fleet.name, server_url=s.url,
                     base_domain=fleet.base_domain, ca_cert=ca_cert, headscale=binary)
    cfg = headscale_config(fleet, root, cert, key)
    header = (f"# headscale config of fleet '{fleet.name}', written by `fleet init` from "
              f"{fleet.path}.\n# Do not edit: rerun `fleet init` after changing the fleet file.\n")
    write_derp_map(build, fleet)
    write_text(build / "config.yaml", header + yaml.safe_dump(cfg, sort_keys=False), 0o600)
    if new or not dep.policy_path.exists():
        write_text(build / "policy.hujson", render_policy(fleet), 0o644)
    else:
        apply_policy(dep, fleet)
    write_text(build / "deployment.json", json.dumps(dep.to_json(), indent=2) + "\n", 0o644)
    return dep


def renew_server_cert(dep: Deployment, fleet: FleetConfig, *, force: bool = False) -> tls.ServerCert:
    """Re-issue the deployment's server certificate from its fleet CA (``fleet renew-cert``).

    Renews when the certificate expires within :data:`tls.RENEW_BEFORE_S`, its names differ
    from the fleet file's, or ``force``; otherwise keeps it (idempotent). Atomic (see
    :mod:`.tls`); the CA is kept, so robots keep trusting the server. headscale reads the
    certificate when it starts: restart it afterwards.

    Raises:
        FleetError: TLS not generated by the fleet tool (own files or http), the CA missing or
            expired, unreadable or not matching its key; naming the file and the fix.
    """
    s = fleet.server
    if urlsplit(s.url).scheme != "https":
        raise FleetError("server.url is http://: there is no certificate to renew", file=fleet.path)
    if not s.tls.generate:
        raise FleetError(f"server.tls.generate is false: the certificate {s.tls.cert} is your own; "
                         "renew it with the CA that issued it, then restart headscale",
                         file=fleet.path, key="server.tls.cert")
    tls_dir = dep.root / "tls"
    ca_key, ca_crt = tls_dir / "ca.key", tls_dir / "ca.crt"
    for f in (ca_key, ca_crt):
        if not f.is_file():
            raise FleetError("missing: the fleet CA is needed to renew the server certificate "
                             "(restore it from a backup; a new CA needs a new ca.crt on every "
                             "robot, see docs/fleet.md)", file=f)
    return tls.ensure_server_cert(tls_dir, ca_key, ca_crt, [s.host, *s.tls.names], s.tls.days,
                                  force=force)


def cert_notices(dep: Deployment, fleet: Optional[FleetConfig], renew_command: str,
                 now: Optional[Any] = None) -> List[tls.CertNotice]:
    """The deployment's certificates that expire soon or have expired (``fleet status`` and
    ``fleet init`` print them): the server certificate (fix: ``renew_command``) and the fleet
    CA (fix: a new CA); with ``server.tls.generate: false`` the operator's own files."""
    tls_dir = dep.root / "tls"
    own = fleet is not None and not fleet.server.tls.generate
    certs = []
    if own and fleet is not None:
        t = fleet.server.tls
        if t.cert:
            certs.append((t.cert, "server certificate (server.tls.cert)", tls.SERVER_WARN_BEFORE_S,
                          "renew it with the CA that issued it, then restart headscale"))
        if t.ca:
            certs.append((t.ca, "CA (server.tls.ca)", tls.CA_WARN_BEFORE_S,
                          "get a new CA certificate, give it to every robot (ca.crt) and rerun `fleet init`"))
    else:
        certs.append((tls_dir / "server.crt", "server certificate", tls.SERVER_WARN_BEFORE_S,
                      f"run `{renew_command}`, then restart headscale"))
        certs.append((tls_dir / "ca.crt", "fleet CA", tls.CA_WARN_BEFORE_S,
                      "make a new CA and give every robot its ca.crt (docs/fleet.md, \"A new CA\")"))
    return tls.certificate_notices(certs, now)
def write_derp_map(root: Path, fleet: FleetConfig) -> bool:
    """Write ``root/derp/derpmap.yaml`` from the fleet's ``derp_regions`` (removed when there are
    none); True when it changed. headscale reads it when it starts."""
    path = root / "derp" / "derpmap.yaml"
    if not fleet.derp_regions:
        if path.exists():
            path.unlink()
            return True
        return False
    return write_text(path, render_derp_map(fleet.derp_regions, fleet.path), 0o644)


@dataclass(frozen=True)
class PolicyResult:
    """Outcome of :func:`apply_policy`.

    Attributes:
        changed: the policy file was replaced.
        reloaded: a running headscale was sent SIGHUP to load it.
        checked: "server" (checked by the running headscale), "offline" (headscale checked it
            against its database while stopped) or "" (unchanged, nothing checked).
    """

    changed: bool
    reloaded: bool
    checked: str


def apply_policy(dep: Deployment, fleet: FleetConfig) -> PolicyResult:
    """Generate the policy from ``fleet``, check it with headscale, swap it in atomically and
    reload the running server. A policy headscale rejects is never installed: the old one stays
    in force, and FleetError says why.
    """
    text = render_policy(fleet)
    try:
        if dep.policy_path.read_text(encoding="utf-8") == text:
            return PolicyResult(changed=False, reloaded=False, checked="")
    except OSError:
        pass
    new = dep.policy_path.with_name("policy.hujson.new")
    write_text(new, text, 0o644)
    cli = dep.cli("checking a changed policy (`fleet policy`, `fleet init` of an existing deployment)")
    running = dep.server_pid() is not None or cli.health()
    try:
        try:
            if running:
                cli.check_policy(new)
            else:
                cli.check_policy_offline(new)
        except FleetError as e:
            raise FleetError(f"headscale rejected the new policy; the old one stays in force: "
                             f"{e.reason}", file=new) from None
        os.replace(new, dep.policy_path)
    finally:
        if new.exists():
            new.unlink()
    reloaded = dep.reload() if running else False
    return PolicyResult(changed=True, reloaded=reloaded, checked="server" if running else "offline")
