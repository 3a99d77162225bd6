"""Private CA and server certificate for the control server, made with python3-cryptography.

Lifetimes (fleet file ``server.tls``): the CA lives ``ca_days`` (default 3650: ten years; robots
trust it, so it is created once and kept), the server certificate ``days`` (default 825).

What is made: ECDSA P-256 keys (PKCS#8 PEM, unencrypted, mode 0600) and SHA-256 signed
certificates (PEM, 0644). The CA: subject and issuer ``CN=<fleet> fleet CA``, basicConstraints
``critical, CA:TRUE, pathlen:0``, keyUsage ``critical, keyCertSign, cRLSign``. The server (and a
derper's) certificate: ``CN=<first name>``, basicConstraints ``critical, CA:FALSE``, keyUsage
``critical, digitalSignature, keyEncipherment``, extendedKeyUsage ``serverAuth``, one
subjectAltName per name (an IP address or a DNS name). Both carry subject and authority key
identifiers. Every file is written with :func:`overlay_manager.system.files.atomic_write` (mode
set before any byte, fsynced, renamed into place): a key is never readable by others and never
half-written.

Renewal: :func:`ensure_server_cert` re-issues the server certificate from the fleet CA when its
names change, when it is missing, when it expires within :data:`RENEW_BEFORE_S` (``fleet init``,
``fleet renew-cert``) or when asked (``fleet renew-cert --force``). The CA stays, so robots keep
trusting the server. A renewal is atomic: each certificate and its key live in a generation
directory ``tls/certs/<stamp>/``, ``tls/live`` is a symbolic link to the current one and
``tls/server.crt``, ``server.key`` and ``server.names`` are links through ``tls/live``; the new
generation is written completely, then ``live`` is switched with one rename. A reader (headscale
at start) sees the old pair or the new pair, never a mix.

:func:`certificate_notices` says which certificates expire soon (one line each: the file, the
date and the command that renews it).

Errors name the file and the fix; the content of a private key never appears in them (nor in
their chained exceptions' text). Without python3-cryptography this module still imports (the
rest of the fleet package needs it); every function that makes or reads a certificate then raises
a :class:`~overlay_manager.fleet.model.FleetError` saying what to install.

Works with python3-cryptography 2.8 (Ubuntu 20.04) and later: the ``backend`` arguments 2.8
requires are passed, and dates are read from ``not_valid_after_utc`` where it exists (42+).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from overlay_manager.core.validation import Reader
from overlay_manager.fleet.model import FleetConfig, FleetError
from overlay_manager.system.files import atomic_write

try:
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.backends import default_backend
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # the fleet package imports without it; using certificates says what to install
    x509 = None  # type: ignore[assignment]

#: Re-issue the server certificate when it expires within this many seconds.
RENEW_BEFORE_S = 30 * 86400
#: Warn about a server certificate (ours or the operator's own) this long before it expires.
SERVER_WARN_BEFORE_S = 30 * 86400
#: Warn about the CA this long before it expires: a new CA means a new ca.crt on every robot.
CA_WARN_BEFORE_S = 180 * 86400
#: X.509's upper bound for a common name (RFC 5280 ub-common-name), which openssl enforces.
MAX_COMMON_NAME = 64

MISSING_LIBRARY = ("python3-cryptography is missing: the fleet tool makes and reads its TLS "
                   "certificates with it (install the package python3-cryptography, or "
                   "`pip install cryptography`)")
_NEW_CA = "make a new CA (docs/fleet.md, \"A new CA\") and give every robot the new ca.crt"


class CAError(FleetError):
    """The fleet CA cannot issue: its key or certificate is missing, unreadable, or they do not
    belong together. The message names the file."""


class CAExpired(CAError):
    """The fleet CA has expired (or expires within a day): nothing can be issued from it."""


class NameRefused(FleetError):
    """A name cannot go into a certificate (a common name over 64 characters, a DNS name that is
    not ASCII): a problem of the fleet file's names."""


def require_cryptography(file: Any = "") -> None:
    """Raise FleetError (naming ``file``) when python3-cryptography cannot be imported."""
    if x509 is None:
        raise FleetError(MISSING_LIBRARY, file=file)


# --- reading ------------------------------------------------------------------------------------

def _read_bytes(path: Path, what: str, error: type = FleetError) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise error(f"missing: {what}", file=path) from None
    except OSError as e:
        raise error(f"cannot read {what}: {e.strerror}", file=path) from None


def load_certificate(path: Path, what: str = "the certificate", error: type = FleetError) -> Any:
    """The first PEM certificate in ``path`` (an ``x509.Certificate``).

    Raises:
        FleetError (or ``error``): naming the file when it is missing, unreadable or holds no PEM
            certificate.
    """
    require_cryptography(path)
    data = _read_bytes(path, what, error)
    try:
        return x509.load_pem_x509_certificate(data, default_backend())
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise error(f"{what} is not a PEM certificate (damaged or another kind of file)", file=path) from None


def load_private_key(path: Path, what: str = "the private key", error: type = FleetError) -> Any:
    """The unencrypted PEM private key in ``path``. The error never quotes the file's content.

    Raises:
        FleetError (or ``error``): naming the file when it is missing, unreadable, encrypted or
            not a PEM private key.
    """
    require_cryptography(path)
    data = _read_bytes(path, what, error)
    try:
        return serialization.load_pem_private_key(data, password=None, backend=default_backend())
    except TypeError:
        raise error(f"{what} is encrypted: it must be an unencrypted PEM private key", file=path) from None
    except (ValueError, UnsupportedAlgorithm):
        raise error(f"{what} is not an unencrypted PEM private key (damaged or another kind of file)",
                    file=path) from None


def _public_der(key_or_cert: Any) -> bytes:
    """The SubjectPublicKeyInfo (DER) of a private key, public key or certificate."""
    pub = key_or_cert.public_key() if hasattr(key_or_cert, "public_key") else key_or_cert
    return pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _cert_not_after(cert: Any) -> datetime:
    end = getattr(cert, "not_valid_after_utc", None)  # 42+; not_valid_after is naive UTC
    return end if end is not None else cert.not_valid_after.replace(tzinfo=timezone.utc)


def not_after(cert: Path) -> datetime:
    """When ``cert`` (PEM) expires (UTC).

    Raises:
        FleetError: naming the file when it is missing or not a PEM certificate.
    """
    return _cert_not_after(load_certificate(cert))


def _valid_for(cert: Path, seconds: int, now: datetime) -> bool:
    """True when ``cert`` exists and stays valid for at least ``seconds`` more after ``now``."""
    if not cert.exists():
        return False
    return (not_after(cert) - now).total_seconds() > seconds


# --- making -------------------------------------------------------------------------------------

def _utcnow() -> datetime:
    """Now in UTC, whole seconds, naive (what CertificateBuilder takes in every version)."""
    return datetime.now(timezone.utc).replace(microsecond=0, tzinfo=None)


def _common_name(name: str) -> Any:
    if not name or len(name) > MAX_COMMON_NAME:
        raise NameRefused(f"{name!r} cannot be a certificate's common name (1 to {MAX_COMMON_NAME} "
                          "characters, X.509's limit)")
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])


def _san_entries(names: List[str]) -> List[Any]:
    out: List[Any] = []
    for n in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
            continue
        except ValueError:
            pass
        if not n.isascii():
            raise NameRefused(f"{n!r} is not an ASCII DNS name (write an internationalised name "
                              "in its xn-- form)")
        try:
            out.append(x509.DNSName(n))
        except ValueError:
            raise NameRefused(f"{n!r} cannot be a DNS name in a certificate") from None
    return out


def _new_key() -> Any:
    return ec.generate_private_key(ec.SECP256R1(), default_backend())


def _key_pem(key: Any) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: Any) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _digest(key: Any) -> Any:
    """SHA-256 for EC and RSA keys; None (the key's own) for Ed25519/Ed448 CA keys."""
    return hashes.SHA256() if isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)) else None


def _authority_key_id(ca_cert: Any, ca_key: Any) -> Any:
    """The CA certificate's own subject key identifier, else one computed from its key."""
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        return x509.AuthorityKeyIdentifier(ski.digest, None, None)
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())


def _write(path: Path, data: bytes, mode: int) -> None:
    """atomic_write, its OSError turned into a FleetError naming the file."""
    try:
        atomic_write(path, data, mode)
    except OSError as e:
        raise FleetError(f"cannot write: {e.strerror}", file=path) from None


def ensure_ca(tls_dir: Path, common_name: str, days: int) -> Tuple[Path, Path]:
    """Create ``tls_dir/ca.key`` (0600) and ``tls_dir/ca.crt`` (valid ``days`` days) unless both
    exist; return their paths. An existing CA is never replaced (robots trust it).

    The key is written first: a run stopped before the certificate leaves no CA anyone trusts,
    and the next run makes both again.

    Raises:
        CAError: ``ca.crt`` exists without ``ca.key`` (it is never replaced silently).
        NameRefused: ``common_name`` is not 1 to 64 characters.
        FleetError: python3-cryptography missing, or the files cannot be written.
    """
    key, crt = tls_dir / "ca.key", tls_dir / "ca.crt"
    if key.exists() and crt.exists():
        return key, crt
    if crt.exists():
        raise CAError("missing: the fleet CA's private key, next to the ca.crt robots trust; restore it "
                      f"from a backup, or {_NEW_CA}", file=key)
    require_cryptography(crt)
    name = _common_name(common_name)
    tls_dir.mkdir(parents=True, exist_ok=True)
    ca_key = _new_key()
    start = _utcnow()
    cert = (x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + timedelta(days=days))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(ca_key, hashes.SHA256(), default_backend()))
    _write(key, _key_pem(ca_key), 0o600)
    _write(crt, _cert_pem(cert), 0o644)
    return key, crt


def _load_ca_cert(ca_crt: Path) -> Any:
    """The fleet CA certificate; CAError naming the file and the fix when it cannot be read."""
    try:
        return load_certificate(ca_crt, "the fleet CA certificate", CAError)
    except CAError as e:
        raise CAError(f"{e.reason}; restore it from a backup, or {_NEW_CA}", file=e.file) from None


def _load_ca(ca_key: Path, ca_crt: Path) -> Tuple[Any, Any]:
    """(CA private key, CA certificate), checked to belong together.

    Raises:
        CAError: either file missing or unreadable, or the key not the certificate's; naming the
            file and the fix, never quoting the key.
    """
    cert = _load_ca_cert(ca_crt)
    try:
        key = load_private_key(ca_key, "the fleet CA's private key", CAError)
    except CAError as e:
        raise CAError(f"{e.reason}; restore it from a backup, or {_NEW_CA}", file=e.file) from None
    if _public_der(key) != _public_der(cert):
        raise CAError(f"the fleet CA's private key does not belong to {ca_crt}; restore the pair from a "
                      f"backup, or {_NEW_CA}", file=ca_key)
    return key, cert


def _issue(gen: Path, ca_key: Path, ca_crt: Path, names: List[str], days: int, report: Path) -> None:
    """Write server.key (0600), server.crt (signed by the CA, valid ``days`` days) and
    server.names (the sorted names) into ``gen``.

    Raises:
        CAError: the CA's files cannot be used (naming the file).
        NameRefused: a name cannot go into the certificate.
        FleetError: a file cannot be written; the signature failed (naming ``report``).
    """
    require_cryptography(report)
    key_ca, cert_ca = _load_ca(ca_key, ca_crt)
    wanted = sorted(set(names))
    subject = _common_name(names[0])
    sans = _san_entries(wanted)
    key = _new_key()
    start = _utcnow()
    builder = (x509.CertificateBuilder()
               .subject_name(subject)
               .issuer_name(cert_ca.subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(start)
               .not_valid_after(start + timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=True, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=False, crl_sign=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
               .add_extension(x509.SubjectAlternativeName(sans), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(_authority_key_id(cert_ca, key_ca), critical=False))
    try:
        cert = builder.sign(key_ca, _digest(key_ca), default_backend())
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise CAError(f"the fleet CA's key ({type(key_ca).__name__}) cannot sign certificates here; "
                      f"{_NEW_CA}", file=ca_key) from None
    _write(gen / "server.key", _key_pem(key), 0o600)
    _write(gen / "server.crt", _cert_pem(cert), 0o644)
    _write(gen / "server.names", ("\n".join(wanted) + "\n").encode(), 0o644)


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


def _prune(certs: Path, keep: List[str]) -> None:
    """Remove generation directories other than ``keep`` (the live one and the one before)."""
    for d in certs.iterdir():
        if d.name not in keep and d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)


def _ca_days_left(ca_crt: Path, now: datetime) -> Tuple[datetime, int]:
    end = _cert_not_after(_load_ca_cert(ca_crt))
    return end, int((end - now).total_seconds() // 86400)


def ensure_server_cert(tls_dir: Path, ca_key: Path, ca_crt: Path, names: List[str], days: int,
                       *, force: bool = False, now: Optional[datetime] = None) -> ServerCert:
    """Issue ``tls_dir/server.{key,crt}`` for ``names`` (DNS names/IPs) signed by the CA, unless
    the one in force has the same names and stays valid for :data:`RENEW_BEFORE_S` more seconds
    (and ``force`` is not set). Atomic: see the module docstring.

    The certificate never outlives the CA: ``days`` is cut to the CA's remaining life.

    Raises:
        CAExpired: the CA has expired (the fix: a new CA, see docs/fleet.md).
        CAError: the CA's key or certificate is missing, unreadable or they do not match.
        NameRefused: a name cannot go into a certificate.
        FleetError: the certificate in force is unreadable, a file cannot be written, or
            python3-cryptography is missing; each naming the file.
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
        else:
            try:
                if not _valid_for(crt, RENEW_BEFORE_S, now):
                    reason = f"expires on {not_after(crt):%Y-%m-%d}"
            except FleetError as e:
                raise FleetError(f"{e.reason}; `fleet renew-cert --force` issues a new one", file=e.file) from None
    if not reason:
        return ServerCert(key, crt, False, "", not_after(crt))
    ca_end, ca_left_days = _ca_days_left(ca_crt, now)
    if ca_left_days < 1:
        raise CAExpired(f"the fleet CA expired on {ca_end:%Y-%m-%d} (or expires within a day): no "
                        f"server certificate can be issued from it; {_NEW_CA}", file=ca_crt)
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
        CAExpired, CAError, NameRefused, FleetError: as :func:`ensure_server_cert`.
    """
    stem = f"derp-{host}"
    key, crt, sans = tls_dir / f"{stem}.key", tls_dir / f"{stem}.crt", tls_dir / f"{stem}.names"
    wanted = "\n".join(sorted(set(names))) + "\n"
    now = datetime.now(timezone.utc)
    if (key.exists() and crt.exists() and sans.exists() and sans.read_text() == wanted
            and _valid_for(crt, RENEW_BEFORE_S, now)):
        return key, crt
    _, ca_left_days = _ca_days_left(ca_crt, now)
    if ca_left_days < 1:
        raise CAExpired(f"the fleet CA expires within a day: no derper certificate for {host} can be "
                        f"issued from it; {_NEW_CA}", file=ca_crt)
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
    are what their key says (PEM certificates, an unencrypted PEM private key that belongs to
    the certificate).

    Raises:
        ConfigError: naming the fleet file and ``server.tls.cert|key|ca``; never quoting a key.
        FleetError: python3-cryptography is missing.
    """
    t = fleet.server.tls
    if urlsplit(fleet.server.url).scheme != "https" or t.generate:
        return
    r = Reader(fleet.path)
    loaded: Dict[str, Any] = {}
    for what, path in (("cert", t.cert), ("key", t.key), ("ca", t.ca)):
        if path is None:
            continue
        r.existing_file(path, f"server.tls.{what}")
        require_cryptography(fleet.path)
        try:
            loaded[what] = load_private_key(path, str(path)) if what == "key" else load_certificate(path, str(path))
        except FleetError as e:
            raise r.error(f"server.tls.{what}", e.reason) from None
    if "cert" in loaded and "key" in loaded and _public_der(loaded["cert"]) != _public_der(loaded["key"]):
        raise r.error("server.tls.key", f"{t.key} does not belong to the certificate {t.cert}")
