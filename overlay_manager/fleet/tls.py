"""Private CA and server certificate for the control server, made with the openssl CLI.

Lifetimes (fleet file ``server.tls``): the CA lives ``ca_days`` (default 3650: ten years; robots
trust it, so it is created once and kept), the server certificate ``days`` (default 825).

Renewal: :func:`ensure_server_cert` re-issues the server certificate from the fleet CA when its
names change, when it is missing, when it expires within :data:`RENEW_BEFORE_S` (``fleet init``,
``fleet renew-cert``) or when asked (``fleet renew-cert --force``). The CA stays, so robots keep
trusting the server. A renewal is atomic: each certificate and its key live in a generation
directory ``tls/certs/<stamp>/``, ``tls/live`` is a symbolic link to the current one and
``tls/server.crt``, ``server.key`` and ``server.names`` are links through ``tls/live``; the new
generation is written completely, then ``live`` is switched with one rename. A reader (headscale
at start) sees the old pair or the new pair, never a mix. Private keys are written with mode 0600.

:func:`certificate_notices` says which certificates expire soon (one line each: the file, the
date and the command that renews it).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from overlay_manager.core.validation import Reader
from overlay_manager.fleet.model import FleetConfig, FleetError

#: Re-issue the server certificate when it expires within this many seconds.
RENEW_BEFORE_S = 30 * 86400
#: Warn about a server certificate (ours or the operator's own) this long before it expires.
SERVER_WARN_BEFORE_S = 30 * 86400
#: Warn about the CA this long before it expires: a new CA means a new ca.crt on every robot.
CA_WARN_BEFORE_S = 180 * 86400



class CAExpired(FleetError):
    """The fleet CA has expired (or expires within a day): nothing can be issued from it."""


_MONTHS = {m: i + 1 for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"))}


def _openssl(args: List[str], what: str, file: Path) -> str:
    exe = shutil.which("openssl")
    if exe is None:
        raise FleetError("the openssl command is missing (Debian package: openssl)", file=file)
    proc = subprocess.run([exe, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise FleetError(f"openssl failed to {what}: {' '.join(proc.stderr.split())[-400:]}", file=file)
    return proc.stdout


def _san_entries(names: List[str]) -> List[str]:
    out = []
    for n in names:
        try:
            out.append(f"IP:{ipaddress.ip_address(n)}")
        except ValueError:
            out.append(f"DNS:{n}")
    return out


def parse_openssl_date(text: str) -> datetime:
    """openssl's ``notAfter=`` value (``Nov 25 15:40:00 2036 GMT``) -> aware UTC datetime.

    Month names are parsed here, not with strptime, so the locale does not matter.

    Raises:
        ValueError: not in that form.
    """
    parts = text.split()
    if len(parts) != 5 or parts[4] != "GMT" or parts[0] not in _MONTHS:
        raise ValueError(f"not an openssl date: {text!r}")
    hh, mm, ss = (int(x) for x in parts[2].split(":"))
    return datetime(int(parts[3]), _MONTHS[parts[0]], int(parts[1]), hh, mm, ss, tzinfo=timezone.utc)


def not_after(cert: Path) -> datetime:
    """When ``cert`` (PEM) expires (UTC).

    Raises:
        FleetError: naming the file when openssl cannot read it.
    """
    out = _openssl(["x509", "-noout", "-enddate", "-in", str(cert)], "read the expiry date", cert)
    try:
        return parse_openssl_date(out.strip().partition("=")[2])
    except ValueError as e:
        raise FleetError(f"cannot read the expiry date: {e}", file=cert) from None


def _valid_for(cert: Path, seconds: int) -> bool:
    """True when ``cert`` exists and stays valid for at least ``seconds`` more."""
    if not cert.exists():
        return False
    exe = shutil.which("openssl") or "openssl"
    proc = subprocess.run([exe, "x509", "-in", str(cert), "-noout", "-checkend", str(seconds)],
                          capture_output=True, check=False)
    return proc.returncode == 0


def ensure_ca(tls_dir: Path, common_name: str, days: int) -> Tuple[Path, Path]:
    """Create ``tls_dir/ca.key`` and ``tls_dir/ca.crt`` (valid ``days`` days) unless both
    exist; return their paths. An existing CA is never replaced (robots trust it)."""
    key, crt = tls_dir / "ca.key", tls_dir / "ca.crt"
    if key.exists() and crt.exists():
        return key, crt
    tls_dir.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)
    try:
        _openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                  "-nodes", "-keyout", str(key), "-out", str(crt), "-days", str(days),
                  "-subj", f"/CN={common_name}",
                  "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
                 "create the CA", crt)
    finally:
        os.umask(old)
    os.chmod(key, 0o600)
    os.chmod(crt, 0o644)
    return key, crt


@dataclass(frozen=True)
class ServerCert:
    """Outcome of :func:`ensure_server_cert`.

    Attributes:
        key: the server key path headscale reads (``tls/server.key``).
        crt: the server certificate path headscale reads (``tls/server.crt``).
        renewed: a new certificate was issued by this call.
        reason: why it was issued ("" when kept): "new", "names changed", "expires on ...",
            "asked".
        not_after: when the certificate in force expires (UTC).
    """

    key: Path
    crt: Path
    renewed: bool
    reason: str
    not_after: datetime


_LINKED = ("server.key", "server.crt", "server.names")


def _relink(link: Path, target: str) -> None:
    """Point the symbolic link ``link`` at ``target`` with one rename (atomic)."""
    tmp = link.with_name(f".{link.name}.new")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _adopt_plain_files(tls_dir: Path) -> None:
    """A deployment made before generation directories: move its plain server.key/crt/names
    into a generation of their own and link them, without any moment where the key and the
    certificate differ (each link points at the same content the plain file had)."""
    if (tls_dir / "live").is_symlink() or not (tls_dir / "server.crt").is_file():
        return
    gen = tls_dir / "certs" / "adopted"
    if gen.exists():
        shutil.rmtree(gen)
    gen.mkdir(parents=True, mode=0o755)
    for n in _LINKED:
        if (tls_dir / n).is_file():
            shutil.copy2(tls_dir / n, gen / n)
    _relink(tls_dir / "live", "certs/adopted")
    for n in _LINKED:
        if (gen / n).exists():
            _relink(tls_dir / n, f"live/{n}")


def _issue(gen: Path, ca_key: Path, ca_crt: Path, names: List[str], days: int, report: Path) -> None:
    """Write server.key, server.csr's certificate server.crt and server.names into ``gen``."""
    ext = gen / "ext.cnf"
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName={','.join(_san_entries(sorted(set(names))))}\n")
    old = os.umask(0o077)
    try:
        _openssl(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                  "-nodes", "-keyout", str(gen / "server.key"), "-out", str(gen / "server.csr"),
                  "-subj", f"/CN={names[0]}"], "create the server key", report)
        _openssl(["x509", "-req", "-in", str(gen / "server.csr"), "-CA", str(ca_crt),
                  "-CAkey", str(ca_key), "-set_serial", str(int.from_bytes(os.urandom(8), "big")),
                  "-days", str(days), "-extfile", str(ext), "-out", str(gen / "server.crt")],
                 "sign the server certificate", report)
    finally:
        os.umask(old)
    ext.unlink()
    (gen / "server.csr").unlink()
    os.chmod(gen / "server.key", 0o600)
    os.chmod(gen / "server.crt", 0o644)
    (gen / "server.names").write_text("\n".join(sorted(set(names))) + "\n")


def _prune(certs: Path, keep: List[str]) -> None:
    """Remove generation directories other than ``keep`` (the live one and the one before)."""
    for d in certs.iterdir():
        if d.name not in keep and d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)


def ensure_server_cert(tls_dir: Path, ca_key: Path, ca_crt: Path, names: List[str], days: int,
                       *, force: bool = False, now: Optional[datetime] = None) -> ServerCert:
    """Issue ``tls_dir/server.{key,crt}`` for ``names`` (DNS names/IPs) signed by the CA, unless
    the one in force has the same names and stays valid for :data:`RENEW_BEFORE_S` more seconds
    (and ``force`` is not set). Atomic: see the module docstring.

    The certificate never outlives the CA: ``days`` is cut to the CA's remaining life.

    Raises:
        FleetError: the CA has expired (the fix: a new CA, see docs/fleet.md), or openssl failed.
    """
    now = now or datetime.now(timezone.utc)
    key, crt, sans = tls_dir / "server.key", tls_dir / "server.crt", tls_dir / "server.names"
    wanted = "\n".join(sorted(set(names))) + "\n"
    reason = "asked" if force else ""
    if not reason:
        if not (key.exists() and crt.exists()):
            reason = "new"
        elif not sans.exists() or sans.read_text() != wanted:
            reason = "names changed"
        elif not _valid_for(crt, RENEW_BEFORE_S):
            reason = f"expires on {not_after(crt):%Y-%m-%d}"
    if not reason:
        return ServerCert(key, crt, False, "", not_after(crt))
    ca_end = not_after(ca_crt)
    ca_left_days = int((ca_end - now).total_seconds() // 86400)
    if ca_left_days < 1:
        raise CAExpired(f"the fleet CA expired on {ca_end:%Y-%m-%d} (or expires within a day): no "
                         "server certificate can be issued from it; make a new CA (docs/fleet.md, "
                         "\"A new CA\") and give every robot the new ca.crt", file=ca_crt)
    tls_dir.mkdir(parents=True, exist_ok=True)
    _adopt_plain_files(tls_dir)
    certs = tls_dir / "certs"
    certs.mkdir(mode=0o755, exist_ok=True)
    previous = os.readlink(tls_dir / "live") if (tls_dir / "live").is_symlink() else ""
    gen = Path(tempfile.mkdtemp(prefix=now.strftime("%Y%m%dT%H%M%SZ-"), dir=certs))
    try:
        os.chmod(gen, 0o755)
        _issue(gen, ca_key, ca_crt, names, min(days, ca_left_days), crt)
        _relink(tls_dir / "live", f"certs/{gen.name}")
    except BaseException:
        shutil.rmtree(gen, ignore_errors=True)
        raise
    for n in _LINKED:
        if not (tls_dir / n).is_symlink():
            _relink(tls_dir / n, f"live/{n}")
    _prune(certs, [gen.name, Path(previous).name] if previous else [gen.name])
    return ServerCert(key, crt, True, reason, not_after(crt))


def ensure_derper_cert(tls_dir: Path, ca_key: Path, ca_crt: Path, names: List[str], days: int,
                       host: str) -> Tuple[Path, Path]:
    """Issue ``tls_dir/derp-<host>.{key,crt}``, a derper's certificate for ``names`` signed by the
    fleet CA, unless the one there has the same names and stays valid for :data:`RENEW_BEFORE_S`
    more seconds. Never outlives the CA. The names file is removed first and written last, so a
    run stopped half-way is re-issued by the next one (the key and certificate always match).

    Raises:
        FleetError: the CA has expired, or openssl failed.
    """
    stem = f"derp-{host}"
    key, crt, sans = tls_dir / f"{stem}.key", tls_dir / f"{stem}.crt", tls_dir / f"{stem}.names"
    wanted = "\n".join(sorted(set(names))) + "\n"
    if (key.exists() and crt.exists() and sans.exists() and sans.read_text() == wanted
            and _valid_for(crt, RENEW_BEFORE_S)):
        return key, crt
    ca_left_days = int((not_after(ca_crt) - datetime.now(timezone.utc)).total_seconds() // 86400)
    if ca_left_days < 1:
        raise CAExpired(f"the fleet CA expires within a day: no derper certificate for {host} can be "
                        "issued from it; make a new CA (docs/fleet.md, \"A new CA\")", file=ca_crt)
    tmp = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=tls_dir))
    try:
        _issue(tmp, ca_key, ca_crt, names, min(days, ca_left_days), crt)
        if sans.exists():
            sans.unlink()
        os.replace(tmp / "server.key", key)
        os.replace(tmp / "server.crt", crt)
        os.replace(tmp / "server.names", sans)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return key, crt


@dataclass(frozen=True)
class CertNotice:
    """A certificate that expires soon or has expired.

    Attributes:
        level: "warning" (expires within the warning window) or "error" (expired).
        file: the certificate file.
        what: "server certificate" | "fleet CA" | "server certificate (server.tls.cert)" ...
        not_after: when it expires (UTC).
        fix: the command or step that renews it.
    """

    level: str
    file: Path
    what: str
    not_after: datetime
    fix: str

    def line(self) -> str:
        """One line: file, what, date and the fix."""
        when = f"{self.not_after:%Y-%m-%d %H:%M} UTC"
        state = f"expired on {when}" if self.level == "error" else f"expires on {when}"
        return f"{self.file}: the {self.what} {state}: {self.fix}"


def certificate_notices(certs: List[Tuple[Path, str, int, str]],
                        now: Optional[datetime] = None) -> List[CertNotice]:
    """Notices for the certificates that expire within their window.

    Args:
        certs: (file, what, warning window in seconds, fix) per certificate; missing files are
            skipped, unreadable ones raise.
        now: the current time (tests).
    """
    now = now or datetime.now(timezone.utc)
    out: List[CertNotice] = []
    for path, what, window, fix in certs:
        if not path.exists():
            continue
        end = not_after(path)
        left = (end - now).total_seconds()
        if left <= 0:
            out.append(CertNotice("error", path, what, end, fix))
        elif left <= window:
            out.append(CertNotice("warning", path, what, end, fix))
    return out


def check_tls_files(fleet: FleetConfig) -> None:
    """With ``server.tls.generate: false``: the cert, key and CA files exist, are readable and
    are what their key says (openssl parses them, the key matches the certificate).

    Raises:
        ConfigError: naming the fleet file and ``server.tls.cert|key|ca``.
    """
    t = fleet.server.tls
    if urlsplit(fleet.server.url).scheme != "https" or t.generate:
        return
    r = Reader(fleet.path)
    checks = (("cert", t.cert, ["x509", "-noout", "-pubkey", "-in"], "a PEM certificate"),
              ("key", t.key, ["pkey", "-pubout", "-passin", "pass:", "-in"], "an unencrypted PEM private key"),
              ("ca", t.ca, ["x509", "-noout", "-in"], "a PEM certificate"))
    pubkeys: Dict[str, str] = {}
    for what, path, args, kind in checks:
        if path is None:
            continue
        r.existing_file(path, f"server.tls.{what}")
        try:
            out = _openssl([*args, str(path)], f"read server.tls.{what}", path)
        except FleetError as e:
            raise r.error(f"server.tls.{what}", f"{path} is not {kind}: {e.reason}") from None
        pubkeys[what] = out
    if "cert" in pubkeys and "key" in pubkeys and pubkeys["cert"].strip() != pubkeys["key"].strip():
        raise r.error("server.tls.key", f"{t.key} does not belong to the certificate {t.cert}")
