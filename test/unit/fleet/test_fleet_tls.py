"""The fleet CA and server certificate (made with python3-cryptography), checked with real openssl:
``openssl verify`` accepts the chain, ``openssl x509 -text`` shows the names and CA flags, keys
are 0600 PKCS#8, renewal re-issues a certificate close to its end and keeps one far from it byte
for byte, and a missing, corrupt or foreign key is a one-line error naming the file that never
quotes the key. Certificates with past or chosen dates are made with ``openssl ca
-startdate/-enddate`` (signed by the deployment's own CA key), so the reader is also tested on
openssl's own output."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from overlay_manager.core.validation import ConfigError
from overlay_manager.fleet import tls
from overlay_manager.fleet.config import load_fleet
from overlay_manager.fleet.deploy import Deployment, cert_notices, init_deployment, renew_server_cert
from overlay_manager.fleet.model import FleetError

REPO = Path(__file__).resolve().parents[3]

try:
    import cryptography  # noqa: F401 - only whether it imports
    HAVE_CRYPTOGRAPHY = True
except ImportError:
    HAVE_CRYPTOGRAPHY = False

pytestmark = [pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
             pytest.mark.skipif(not HAVE_CRYPTOGRAPHY, reason="needs python3-cryptography")]
HEADSCALE = "/bin/true"
def utc_now() -> datetime:
    """Now, read when a test needs it (the suite may run a test half an hour after collecting it)."""
    return datetime.now(timezone.utc)
C_LOCALE = {**os.environ, "LC_ALL": "C"}


def write_fleet(d: Path, tls_cfg: Dict[str, Any], name: str = "lab") -> Path:
    p = d / "fleet.yaml"
    p.write_text(yaml.safe_dump({"fleet": name, "base_domain": "fleet.internal",
                                 "server": {"url": "https://10.231.0.2:8443", "tls": tls_cfg},
                                 "teams": {"alpha": {"robots": ["alpha-robot1"]}}}))
    return p


def days_left(cert: Path) -> float:
    return (tls.not_after(cert) - utc_now()).total_seconds() / 86400


def openssl(*args: str, cwd: Path) -> str:
    return subprocess.run(["openssl", *args], check=True, capture_output=True, text=True, cwd=cwd,
                          env=C_LOCALE).stdout


def text_of(cert: Path) -> str:
    """``openssl x509 -noout -text`` of ``cert``."""
    return openssl("x509", "-in", str(cert), "-noout", "-text", cwd=cert.parent)


def ymd(d: datetime) -> str:
    return d.strftime("%Y%m%d%H%M%SZ")


def sign_with_dates(work: Path, ca_key: Path, ca_crt: Path, key: Path, out: Path, start: str, end: str,
                    selfsign: bool = False) -> None:
    """Sign a certificate for ``key`` with fixed validity dates (YYYYMMDDHHMMSSZ), as `openssl ca`
    allows: a CA (selfsign, same key) or a server certificate."""
    work.mkdir(exist_ok=True)
    (work / "index.txt").write_text("")
    (work / "serial").write_text("1000\n")
    (work / "ca.cnf").write_text(
        "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\n"
        "default_md = sha256\npolicy = p\nunique_subject = no\n[p]\ncommonName = supplied\n"
        "[v3_ca]\nbasicConstraints = critical,CA:TRUE,pathlen:0\nkeyUsage = critical,keyCertSign,cRLSign\n"
        "[v3_srv]\nbasicConstraints = critical,CA:FALSE\nsubjectAltName = IP:10.231.0.2\n")
    openssl("req", "-new", "-key", str(key), "-out", "req.csr", "-subj", "/CN=10.231.0.2", cwd=work)
    args = ["ca", "-batch", "-config", "ca.cnf", "-in", "req.csr", "-out", str(out), "-startdate", start,
            "-enddate", end, "-keyfile", str(ca_key), "-notext"]
    args += ["-selfsign", "-extensions", "v3_ca"] if selfsign else ["-cert", str(ca_crt), "-extensions", "v3_srv"]
    openssl(*args, cwd=work)


def verify(ca: Path, cert: Path, *extra: str) -> bool:
    return subprocess.run(["openssl", "verify", *extra, "-CAfile", str(ca), str(cert)],
                          capture_output=True).returncode == 0


def key_matches(key: Path, cert: Path) -> bool:
    a = subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout"], capture_output=True, text=True).stdout
    b = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-pubkey"], capture_output=True,
                       text=True).stdout
    return bool(a) and a == b


def mode(p: Path) -> int:
    return p.stat().st_mode & 0o777


def tree(d: Path) -> Dict[str, Any]:
    """Every entry under ``d``: a link's target, a file's bytes, mode and mtime."""
    out: Dict[str, Any] = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            st = p.stat()
            out[rel] = ("file", p.read_bytes(), st.st_mode & 0o777, st.st_mtime_ns)
    return out


def one_line_without(exc: BaseException, secrets: List[str]) -> str:
    """The exception's text (and its whole printed traceback) on one line with none of ``secrets``."""
    msg = str(exc)
    printed = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert "\n" not in msg, msg
    for s in secrets:
        assert s not in msg and s not in printed, "a private key's content reached the error"
    assert "PRIVATE KEY" not in msg
    return msg


def key_body_lines(key: Path) -> List[str]:
    return [ln for ln in key.read_text().splitlines() if ln and not ln.startswith("-----")]


@pytest.fixture
def deployment(tmp_path: Path) -> Any:
    fleet = load_fleet(write_fleet(tmp_path, {"names": ["headscale.campus.example"]}))
    return fleet, init_deployment(fleet, tmp_path / "hs", HEADSCALE)


# --- what is made, as openssl sees it -----------------------------------------------------------

def test_default_lifetimes_ca_ten_years_server_825_days(tmp_path: Path) -> None:
    dep = init_deployment(load_fleet(write_fleet(tmp_path, {})), tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    assert 3649 < days_left(t / "ca.crt") < 3651
    assert 824 < days_left(t / "server.crt") < 826
    assert verify(t / "ca.crt", t / "server.crt") and key_matches(t / "server.key", t / "server.crt")
    assert mode(t / "server.key") == 0o600
    assert cert_notices(dep, load_fleet(tmp_path / "fleet.yaml"), "fleet renew-cert") == []


def test_openssl_verifies_and_shows_names_flags_and_modes(deployment: Any) -> None:
    _, dep = deployment
    t = dep.root / "tls"
    assert verify(t / "ca.crt", t / "server.crt")
    assert verify(t / "ca.crt", t / "server.crt", "-purpose", "sslserver", "-verify_hostname",
                  "headscale.campus.example")
    assert verify(t / "ca.crt", t / "server.crt", "-verify_ip", "10.231.0.2")
    assert not verify(t / "ca.crt", t / "server.crt", "-verify_hostname", "other.campus.example")
    assert verify(t / "ca.crt", t / "ca.crt"), "the CA is self-signed"

    ca = text_of(t / "ca.crt")
    assert "Issuer: CN = lab fleet CA" in ca and "Subject: CN = lab fleet CA" in ca
    assert "X509v3 Basic Constraints: critical\n                CA:TRUE, pathlen:0" in ca
    assert "X509v3 Key Usage: critical\n                Certificate Sign, CRL Sign" in ca
    assert "ASN1 OID: prime256v1" in ca and "Signature Algorithm: ecdsa-with-SHA256" in ca
    assert "X509v3 Subject Key Identifier" in ca

    srv = text_of(t / "server.crt")
    assert "Issuer: CN = lab fleet CA" in srv and "Subject: CN = 10.231.0.2" in srv
    assert "X509v3 Basic Constraints: critical\n                CA:FALSE" in srv
    assert "X509v3 Key Usage: critical\n                Digital Signature, Key Encipherment" in srv
    assert "X509v3 Extended Key Usage: \n                TLS Web Server Authentication" in srv
    assert "X509v3 Subject Alternative Name: \n                IP Address:10.231.0.2, DNS:headscale.campus.example" \
        in srv
    assert "ASN1 OID: prime256v1" in srv and "Signature Algorithm: ecdsa-with-SHA256" in srv
    ca_ski = openssl("x509", "-in", str(t / "ca.crt"), "-noout", "-ext", "subjectKeyIdentifier", cwd=t)
    srv_aki = openssl("x509", "-in", str(t / "server.crt"), "-noout", "-ext", "authorityKeyIdentifier", cwd=t)
    assert ca_ski.splitlines()[1].strip() in srv_aki, "the server certificate names its CA's key"

    for key in ("ca.key", "server.key"):
        pem = (t / key).read_text()
        assert pem.startswith("-----BEGIN PRIVATE KEY-----\n"), "unencrypted PKCS#8, as openssl -nodes writes"
        assert mode(t / key) == 0o600 and mode((t / key).resolve()) == 0o600
        assert "Key is valid" in openssl("pkey", "-in", str(t / key), "-check", "-noout", cwd=t)
    for crt in ("ca.crt", "server.crt", "server.names"):
        assert mode((t / crt).resolve()) == 0o644
    assert key_matches(t / "ca.key", t / "ca.crt") and key_matches(t / "server.key", t / "server.crt")
    assert (t / "server.names").read_text() == "10.231.0.2\nheadscale.campus.example\n"
    assert mode(t) == 0o755 and not [p for p in t.rglob(".*")], "no temporary files left"


def test_expiry_dates_agree_with_openssl(deployment: Any) -> None:
    _, dep = deployment
    for name in ("ca.crt", "server.crt"):
        crt = dep.root / "tls" / name
        end = openssl("x509", "-in", str(crt), "-noout", "-enddate", cwd=crt.parent).strip().partition("=")[2]
        assert tls.not_after(crt) == datetime.strptime(end, "%b %d %H:%M:%S %Y GMT").replace(tzinfo=timezone.utc)
        start = openssl("x509", "-in", str(crt), "-noout", "-startdate", cwd=crt.parent).strip().partition("=")[2]
        began = datetime.strptime(start, "%b %d %H:%M:%S %Y GMT").replace(tzinfo=timezone.utc)
        assert abs((began - utc_now()).total_seconds()) < 120, "valid from now, as openssl req/x509 made them"


def test_handshake_with_openssl_s_client(deployment: Any, tmp_path: Path) -> None:
    """openssl s_server serves the pair; s_client trusting only ca.crt accepts it for the IP."""
    _, dep = deployment
    t = dep.root / "tls"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(["openssl", "s_server", "-accept", f"127.0.0.1:{port}", "-cert", str(t / "server.crt"),
                               "-key", str(t / "server.key"), "-www"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "openssl s_server did not start"
                time.sleep(0.05)
        # the certificate names 10.231.0.2 (s_client checks the name it is given, not the address)
        res = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile",
                              str(t / "ca.crt"), "-verify_return_error", "-verify_ip", "10.231.0.2"],
                             input="", capture_output=True, text=True, timeout=20)
        out = res.stdout + res.stderr
        assert res.returncode == 0 and "Verify return code: 0 (ok)" in out, out[-2000:]
    finally:
        server.kill()
        server.wait(timeout=10)


# --- renewal ------------------------------------------------------------------------------------

def test_far_from_expiry_is_kept_byte_for_byte(deployment: Any) -> None:
    fleet, dep = deployment
    t = dep.root / "tls"
    before = tree(t)
    kept = renew_server_cert(dep, fleet)
    assert not kept.renewed and kept.reason == "" and kept.not_after == tls.not_after(t / "server.crt")
    init_deployment(fleet, dep.root, HEADSCALE)  # init converges without touching the pair either
    assert tree(t) == before, "nothing under tls/ was rewritten, not even its mtime"


def test_renewal_keeps_the_ca_and_switches_atomically(deployment: Any) -> None:
    fleet, dep = deployment
    t = dep.root / "tls"
    ca = (t / "ca.crt").read_bytes(), (t / "ca.key").read_bytes()
    first = (t / "server.crt").read_bytes(), (t / "server.key").read_bytes()
    gens = []
    for _ in range(3):
        res = renew_server_cert(dep, fleet, force=True)
        assert res.renewed and res.reason == "asked"
        gens.append(os.readlink(t / "live"))
        assert (t / "server.crt").read_bytes() != first[0] and (t / "server.key").read_bytes() != first[1]
        assert verify(t / "ca.crt", t / "server.crt") and key_matches(t / "server.key", t / "server.crt")
        assert mode(t / "server.key") == 0o600
    assert ((t / "ca.crt").read_bytes(), (t / "ca.key").read_bytes()) == ca, "robots keep trusting the same CA"
    # the live generation and the one before are kept, older ones pruned; no temporary files
    assert sorted(p.name for p in (t / "certs").iterdir()) == sorted(Path(g).name for g in gens[-2:])
    assert not [p for p in t.rglob(".*")]
    # the paths headscale reads are links through tls/live (one rename switches key and cert together)
    for n in ("server.crt", "server.key", "server.names"):
        assert os.readlink(t / n) == f"live/{n}"
    assert "DNS:headscale.campus.example" in text_of(t / "server.crt")


@pytest.mark.parametrize("days,renewed", [(20, True), (40, False)])
def test_openssl_made_certificate_near_its_end_is_renewed_and_one_far_from_it_kept(
        tmp_path: Path, days: int, renewed: bool) -> None:
    """A server certificate openssl made (the deployment's CA, its key) ending in 20 days is
    re-issued by `renew-cert` without --force; one ending in 40 days stays byte for byte."""
    fleet = load_fleet(write_fleet(tmp_path, {}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    now = utc_now()
    sign_with_dates(tmp_path / "ca-work", t / "ca.key", t / "ca.crt", t / "server.key", t / "live" / "server.crt",
                    ymd(now - timedelta(days=1)), ymd(now + timedelta(days=days)))
    assert verify(t / "ca.crt", t / "server.crt")
    before = tree(t)
    res = renew_server_cert(dep, fleet)
    assert res.renewed is renewed
    if renewed:
        assert res.reason == f"expires on {now + timedelta(days=days):%Y-%m-%d}"
        assert 824 < days_left(t / "server.crt") < 826 and verify(t / "ca.crt", t / "server.crt")
        assert (t / "ca.crt").read_bytes() == before["ca.crt"][1]
    else:
        assert tree(t) == before


def test_changed_names_are_re_issued(tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet(tmp_path, {}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    fleet = load_fleet(write_fleet(tmp_path, {"names": ["hs.campus.example", "10.231.0.3"]}))
    init_deployment(fleet, dep.root, HEADSCALE)
    sans = openssl("x509", "-in", str(t / "server.crt"), "-noout", "-ext", "subjectAltName", cwd=t)
    assert "IP Address:10.231.0.2, IP Address:10.231.0.3, DNS:hs.campus.example" in sans
    assert (t / "server.names").read_text() == "10.231.0.2\n10.231.0.3\nhs.campus.example\n"


def test_a_failed_renewal_leaves_the_old_certificate(deployment: Any) -> None:
    fleet, dep = deployment
    t = dep.root / "tls"
    before, live = (t / "server.crt").read_bytes(), os.readlink(t / "live")
    secret = key_body_lines(t / "ca.key")
    (t / "ca.key").write_text("-----BEGIN PRIVATE KEY-----\n" + secret[0][:40] + "\n-----END PRIVATE KEY-----\n")
    with pytest.raises(tls.CAError) as info:
        renew_server_cert(dep, fleet, force=True)
    msg = one_line_without(info.value, [secret[0][:40]])
    assert msg.startswith(f"{t / 'ca.key'}: the fleet CA's private key is not an unencrypted PEM private key")
    assert "restore it from a backup" in msg and "A new CA" in msg
    assert (t / "server.crt").read_bytes() == before and os.readlink(t / "live") == live
    assert sorted(p.name for p in (t / "certs").iterdir()) == [Path(live).name]


def test_plain_files_of_an_older_deployment_are_adopted(tmp_path: Path) -> None:
    """A deployment whose server.crt/key are plain files (made before generation directories)
    is renewed the same way; the old pair moves into a generation of their own first."""
    fleet = load_fleet(write_fleet(tmp_path, {}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    for n in ("server.crt", "server.key", "server.names"):
        data = (t / n).read_bytes()
        (t / n).unlink()
        (t / n).write_bytes(data)
    (t / "live").unlink()
    shutil.rmtree(t / "certs")
    res = renew_server_cert(dep, fleet, force=True)
    assert res.renewed and os.readlink(t / "server.crt") == "live/server.crt"
    assert verify(t / "ca.crt", t / "server.crt") and key_matches(t / "server.key", t / "server.crt")


# --- expiry notices -----------------------------------------------------------------------------

def test_short_lived_server_certificate_warns_and_renews(tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet(tmp_path, {"days": 10}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    crt = dep.root / "tls" / "server.crt"
    assert 9 < days_left(crt) < 11
    notes = cert_notices(dep, fleet, "fleet -f fleet.yaml -d hs renew-cert")
    assert [n.level for n in notes] == ["warning"]
    line = notes[0].line()
    end = tls.not_after(crt)
    assert line.startswith(f"{crt}: the server certificate expires on {end:%Y-%m-%d %H:%M} UTC: ")
    assert "run `fleet -f fleet.yaml -d hs renew-cert`" in line and "\n" not in line
    res = renew_server_cert(dep, fleet)  # within 30 days: renewed without --force
    assert res.renewed and res.reason.startswith("expires on ")


def test_expired_server_certificate_is_an_error_and_renew_fixes_it(tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet(tmp_path, {}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    sign_with_dates(tmp_path / "ca-work", t / "ca.key", t / "ca.crt", t / "server.key", t / "live" / "server.crt",
                    "20240101000000Z", "20240301000000Z")
    notes = cert_notices(dep, fleet, "fleet renew-cert")
    assert [(n.level, n.what) for n in notes] == [("error", "server certificate")]
    assert "expired on 2024-03-01 00:00 UTC" in notes[0].line()
    res = renew_server_cert(dep, fleet)
    assert res.renewed and res.reason == "expires on 2024-03-01"
    assert cert_notices(dep, fleet, "fleet renew-cert") == []
    assert verify(t / "ca.crt", t / "server.crt")


def test_ca_near_expiry_warns_and_caps_the_server_certificate(tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet(tmp_path, {"ca_days": 100}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    assert 99 < days_left(t / "ca.crt") < 101
    assert days_left(t / "server.crt") < 100.5, "a server certificate never outlives its CA"
    notes = cert_notices(dep, fleet, "fleet renew-cert")
    assert [(n.level, n.what) for n in notes] == [("warning", "fleet CA")]
    assert "A new CA" in notes[0].line() and str(t / "ca.crt") in notes[0].line()


def test_expired_ca_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet(tmp_path, {}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    sign_with_dates(tmp_path / "ca-work", t / "ca.key", t / "ca.crt", t / "ca.key", t / "ca.crt",
                    "20200101000000Z", "20240101000000Z", selfsign=True)
    with pytest.raises(tls.CAExpired) as info:
        renew_server_cert(dep, fleet, force=True)
    msg = str(info.value)
    assert msg.startswith(f"{t / 'ca.crt'}: the fleet CA expired on 2024-01-01") and "\n" not in msg
    assert "new CA" in msg and "ca.crt" in msg
    assert [n.level for n in cert_notices(dep, fleet, "x") if n.what == "fleet CA"] == ["error"]


def test_own_certificate_files_get_notices_and_renew_cert_refuses(tmp_path: Path) -> None:
    key, crt = tmp_path / "own.key", tmp_path / "own.crt"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
            str(key), "-out", str(crt), "-days", "3", "-subj", "/CN=10.231.0.2", cwd=tmp_path)
    fleet = load_fleet(write_fleet(tmp_path, {"generate": False, "cert": str(crt), "key": str(key)}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    notes = cert_notices(dep, fleet, "fleet renew-cert")
    assert [(n.file, n.level) for n in notes] == [(crt, "warning")]
    assert "server.tls.cert" in notes[0].line()
    with pytest.raises(FleetError, match="generate is false"):
        renew_server_cert(dep, fleet)


# --- broken, missing and foreign files ----------------------------------------------------------

@pytest.mark.parametrize("case", ["corrupt", "truncated", "missing", "foreign", "encrypted", "empty"])
def test_bad_ca_key_is_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    fleet = load_fleet(write_fleet(tmp_path, {}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    secret = key_body_lines(t / "ca.key")
    before = tree(t)
    k = t / "ca.key"
    if case == "corrupt":
        k.write_bytes(b"\x00\xff garbage")
    elif case == "truncated":
        k.write_text("\n".join(k.read_text().splitlines()[:2]) + "\n")
    elif case == "missing":
        k.unlink()
    elif case == "foreign":
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", str(k), cwd=t)
    elif case == "encrypted":
        openssl("pkey", "-in", str(k), "-aes256", "-passout", "pass:s3cret", "-out", str(k) + ".enc", cwd=t)
        os.replace(str(k) + ".enc", k)
    else:
        k.write_text("")
    with pytest.raises(FleetError) as info:
        renew_server_cert(dep, fleet, force=True)
    msg = one_line_without(info.value, secret + (key_body_lines(k) if case in ("foreign", "encrypted") else []))
    assert msg.startswith(f"{k}: "), msg
    words = {"corrupt": "not an unencrypted PEM private key", "truncated": "not an unencrypted PEM private key",
             "missing": "missing", "foreign": "does not belong to", "encrypted": "is encrypted",
             "empty": "not an unencrypted PEM private key"}[case]
    assert words in msg, msg
    after = tree(t)
    after.pop("ca.key", None)
    before.pop("ca.key")
    assert after == before, "the pair in force is untouched"


def test_missing_ca_key_next_to_ca_crt_is_never_replaced_silently(tmp_path: Path) -> None:
    """`init` on a deployment whose ca.key is gone: an error naming ca.key; a new CA would cut
    every robot off, so ca.crt stays."""
    fleet = load_fleet(write_fleet(tmp_path, {"names": ["hs.campus.example"]}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    ca = (t / "ca.crt").read_bytes()
    (t / "ca.key").unlink()
    with pytest.raises(tls.CAError) as info:
        init_deployment(fleet, dep.root, HEADSCALE)
    assert str(info.value).startswith(f"{t / 'ca.key'}: missing: ") and "backup" in str(info.value)
    assert (t / "ca.crt").read_bytes() == ca and not (t / "ca.key").exists()


@pytest.mark.parametrize("case", ["corrupt", "missing"])
def test_bad_ca_certificate_names_it(deployment: Any, case: str) -> None:
    fleet, dep = deployment
    t = dep.root / "tls"
    if case == "corrupt":
        (t / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    else:
        (t / "ca.crt").unlink()
    with pytest.raises(FleetError) as info:
        renew_server_cert(dep, fleet, force=True)
    msg = one_line_without(info.value, key_body_lines(t / "ca.key"))
    assert msg.startswith(f"{t / 'ca.crt'}: ") and ("missing" if case == "missing" else "not a PEM certificate") in msg


def test_corrupt_server_certificate_names_it_and_force_replaces_it(deployment: Any) -> None:
    fleet, dep = deployment
    t = dep.root / "tls"
    (t / "live" / "server.crt").write_text("garbage\n")
    with pytest.raises(FleetError) as info:
        renew_server_cert(dep, fleet)
    assert str(info.value).startswith(f"{t / 'server.crt'}: ") and "renew-cert --force" in str(info.value)
    assert renew_server_cert(dep, fleet, force=True).renewed
    assert verify(t / "ca.crt", t / "server.crt") and key_matches(t / "server.key", t / "server.crt")


def test_encrypted_own_key_is_named_and_not_quoted(tmp_path: Path) -> None:
    key, crt = tmp_path / "own.key", tmp_path / "own.crt"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
            str(key), "-out", str(crt), "-days", "30", "-subj", "/CN=10.231.0.2", cwd=tmp_path)
    openssl("pkey", "-in", str(key), "-aes256", "-passout", "pass:s3cret", "-out", str(tmp_path / "enc.key"),
            cwd=tmp_path)
    path = write_fleet(tmp_path, {"generate": False, "cert": str(crt), "key": str(tmp_path / "enc.key")})
    with pytest.raises(ConfigError) as info:
        init_deployment(load_fleet(path), tmp_path / "hs", HEADSCALE)
    msg = one_line_without(info.value, key_body_lines(tmp_path / "enc.key"))
    assert info.value.key == "server.tls.key" and "enc.key is encrypted" in msg, msg


def test_a_fleet_name_too_long_for_the_ca_is_a_config_error(tmp_path: Path) -> None:
    """``<fleet> fleet CA`` must fit X.509's 64-character common name (openssl's limit too)."""
    path = write_fleet(tmp_path, {}, name="f" * 60)
    with pytest.raises(ConfigError) as info:
        init_deployment(load_fleet(path), tmp_path / "hs", HEADSCALE)
    assert info.value.key == "fleet" and "64" in str(info.value) and not (tmp_path / "hs").exists()


def test_derper_certificate_verifies_and_is_kept_while_valid(deployment: Any) -> None:
    _, dep = deployment
    t = dep.root / "tls"
    names = ["derp-west.campus.example", "10.231.13.10"]
    key, crt = tls.ensure_derper_cert(t, t / "ca.key", t / "ca.crt", names, 90, "west")
    assert verify(t / "ca.crt", crt, "-purpose", "sslserver", "-verify_hostname", "derp-west.campus.example")
    assert "Subject: CN = derp-west.campus.example" in text_of(crt) and mode(key) == 0o600
    assert key_matches(key, crt) and 89 < days_left(crt) < 91
    before = tree(t)
    assert tls.ensure_derper_cert(t, t / "ca.key", t / "ca.crt", names, 90, "west") == (key, crt)
    assert tree(t) == before, "valid with the same names: kept byte for byte"
    tls.ensure_derper_cert(t, t / "ca.key", t / "ca.crt", names[:1], 90, "west")
    assert (t / "derp-west.names").read_text() == "derp-west.campus.example\n" and key_matches(key, crt)
    assert not [p for p in t.iterdir() if p.name.startswith(".")]


# --- without python3-cryptography -------------------------------------------------------------

def test_without_the_library_the_fleet_package_imports_and_init_says_what_to_install(tmp_path: Path) -> None:
    """Python with ``cryptography`` made unimportable: the fleet package and its CLI import, an
    http fleet still initialises, an https one fails with one line naming the package."""
    code = (
        "import sys\n"
        "sys.modules['cryptography'] = None\n"
        "from pathlib import Path\n"
        "import overlay_manager.cli.fleet\n"
        "from overlay_manager.fleet import tls\n"
        "from overlay_manager.fleet.config import load_fleet\n"
        "from overlay_manager.fleet.deploy import init_deployment\n"
        "from overlay_manager.fleet.model import FleetError\n"
        "assert tls.x509 is None\n"
        "d = Path(sys.argv[1])\n"
        "init_deployment(load_fleet(d / 'http.yaml'), d / 'hs-http', '/bin/true')\n"
        "try:\n"
        "    init_deployment(load_fleet(d / 'fleet.yaml'), d / 'hs', '/bin/true')\n"
        "except FleetError as e:\n"
        "    print(e)\n")
    write_fleet(tmp_path, {})
    (tmp_path / "http.yaml").write_text(yaml.safe_dump({
        "fleet": "lab", "base_domain": "fleet.internal", "server": {"url": "http://10.231.0.2:8080"},
        "teams": {"alpha": {"robots": ["alpha-robot1"]}}}))
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"{tmp_path / 'fleet.yaml'}: {tls.MISSING_LIBRARY}"
    assert (tmp_path / "hs-http" / "deployment.json").is_file() and not (tmp_path / "hs").exists()


def test_cli_init_prints_the_warning_and_renew_cert_runs(tmp_path: Path) -> None:
    write_fleet(tmp_path, {"ca_days": 60})
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    env.pop("HEADSCALE_BIN", None)
    run = [sys.executable, str(REPO / "scripts" / "fleet")]
    res = subprocess.run(run + ["init", "-f", "fleet.yaml", "-d", "hs"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    warn = [ln for ln in res.stderr.splitlines() if ln.startswith("fleet: warning: ")]
    assert len(warn) == 1 and "fleet CA expires on" in warn[0] and "ca.crt" in warn[0], res.stderr
    assert "server certificate" not in res.stderr, "the server certificate was capped to the CA, not warned about"
    res = subprocess.run(run + ["renew-cert", "--force", "-d", "hs"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0 and "re-issued from the fleet CA (asked)" in res.stdout, res.stdout + res.stderr
    assert Deployment.open(tmp_path / "hs").ca_cert == (tmp_path / "hs" / "tls" / "ca.crt").resolve()


def test_a_new_ca_as_docs_fleet_md_says(tmp_path: Path) -> None:
    """docs/fleet.md "A new CA": move tls/ aside and rerun init: a new CA and a server
    certificate from it, the rest of the deployment unchanged."""
    fleet = load_fleet(write_fleet(tmp_path, {}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    config = (dep.root / "config.yaml").read_bytes()
    old_ca = (dep.root / "tls" / "ca.crt").read_bytes()
    (dep.root / "tls").rename(tmp_path / "tls.old")
    init_deployment(fleet, dep.root, HEADSCALE)
    t = dep.root / "tls"
    assert (t / "ca.crt").read_bytes() != old_ca and verify(t / "ca.crt", t / "server.crt")
    assert not verify(tmp_path / "tls.old" / "ca.crt", t / "server.crt")
    assert (dep.root / "config.yaml").read_bytes() == config
