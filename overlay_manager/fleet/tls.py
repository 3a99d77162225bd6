"""Private CA and server certificate for the control server, made with the openssl CLI.

Idempotent: the CA is created once and kept (robots trust it); the server certificate is
re-issued only when its subject alternative names change, it is missing, or it expires within
30 days. Private keys are written with mode 0600.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple
from urllib.parse import urlsplit

from ..validation import Reader
from .config import FleetConfig, FleetError

#: Re-issue the server certificate when it expires within this many seconds.
RENEW_BEFORE_S = 30 * 86400


def _openssl(args: List[str], what: str, file: Path) -> str:
    exe = shutil.which("openssl")
    if exe is None:
        raise FleetError("the openssl command is missing (Debian package: openssl)", file=file)
    proc = subprocess.run([exe, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise FleetError(f"openssl failed to {what}: {proc.stderr.strip()[-400:]}", file=file)
    return proc.stdout


def _san_entries(names: List[str]) -> List[str]:
    out = []
    for n in names:
        try:
            out.append(f"IP:{ipaddress.ip_address(n)}")
        except ValueError:
            out.append(f"DNS:{n}")
    return out


def _valid_for(cert: Path, seconds: int) -> bool:
    """True when ``cert`` exists and stays valid for at least ``seconds`` more."""
    if not cert.exists():
        return False
    exe = shutil.which("openssl") or "openssl"
    proc = subprocess.run([exe, "x509", "-in", str(cert), "-noout", "-checkend", str(seconds)],
                          capture_output=True, check=False)
    return proc.returncode == 0


def ensure_ca(tls_dir: Path, common_name: str, days: int) -> Tuple[Path, Path]:
    """Create ``tls_dir/ca.key`` and ``tls_dir/ca.crt`` unless both exist; return their paths."""
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


def ensure_server_cert(tls_dir: Path, ca_key: Path, ca_crt: Path, names: List[str],
                       days: int, stem: str = "server") -> Tuple[Path, Path]:
    """Issue ``tls_dir/<stem>.{key,crt}`` for ``names`` (DNS names/IPs) signed by the CA.

    Kept as is when it exists with the same names and is valid for 30 more days. ``stem``
    "server" is the control server's; a derper's is ``derp-<host>``.
    """
    key, crt, sans = tls_dir / f"{stem}.key", tls_dir / f"{stem}.crt", tls_dir / f"{stem}.names"
    wanted = "\n".join(sorted(set(names))) + "\n"
    if (key.exists() and _valid_for(crt, RENEW_BEFORE_S) and sans.exists()
            and sans.read_text() == wanted):
        return key, crt
    tls_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tls_dir) as tmp:
        t = Path(tmp)
        ext = t / "ext.cnf"
        ext.write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            f"subjectAltName={','.join(_san_entries(sorted(set(names))))}\n")
        old = os.umask(0o077)
        try:
            _openssl(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                      "-nodes", "-keyout", str(t / "server.key"), "-out", str(t / "server.csr"),
                      "-subj", f"/CN={names[0]}"], "create the server key", crt)
            _openssl(["x509", "-req", "-in", str(t / "server.csr"), "-CA", str(ca_crt),
                      "-CAkey", str(ca_key), "-set_serial", str(int.from_bytes(os.urandom(8), "big")),
                      "-days", str(days), "-extfile", str(ext), "-out", str(t / "server.crt")],
                     "sign the server certificate", crt)
        finally:
            os.umask(old)
        os.chmod(t / "server.key", 0o600)
        os.chmod(t / "server.crt", 0o644)
        os.replace(t / "server.key", key)
        os.replace(t / "server.crt", crt)
    sans.write_text(wanted)
    return key, crt


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
