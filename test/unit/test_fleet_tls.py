"""The fleet CA's and server certificate's lifetimes, renewal and expiry notices, with real
openssl: certificates that expire soon are made with short ``days``, expired ones with
``openssl ca -startdate/-enddate`` (past dates, signed by the deployment's own CA key)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from overlay_manager.fleet import tls
from overlay_manager.fleet.config import load_fleet
from overlay_manager.fleet.deploy import Deployment, cert_notices, init_deployment, renew_server_cert
from overlay_manager.fleet.model import FleetError

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
HEADSCALE = "/bin/true"
NOW = datetime.now(timezone.utc)


def write_fleet(d: Path, tls_cfg: Dict[str, Any]) -> Path:
    p = d / "fleet.yaml"
    p.write_text(yaml.safe_dump({"fleet": "lab", "base_domain": "fleet.internal",
                                 "server": {"url": "https://10.231.0.2:8443", "tls": tls_cfg},
                                 "teams": {"alpha": {"robots": ["alpha-robot1"]}}}))
    return p


def days_left(cert: Path) -> float:
    return (tls.not_after(cert) - NOW).total_seconds() / 86400


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=cwd)


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


def verify(ca: Path, cert: Path) -> bool:
    return subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(cert)], capture_output=True).returncode == 0


def key_matches(key: Path, cert: Path) -> bool:
    a = subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout"], capture_output=True, text=True).stdout
    b = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-pubkey"], capture_output=True,
                       text=True).stdout
    return bool(a) and a == b


def test_default_lifetimes_ca_ten_years_server_825_days(tmp_path: Path) -> None:
    dep = init_deployment(load_fleet(write_fleet(tmp_path, {})), tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    assert 3649 < days_left(t / "ca.crt") < 3651
    assert 824 < days_left(t / "server.crt") < 826
    assert verify(t / "ca.crt", t / "server.crt") and key_matches(t / "server.key", t / "server.crt")
    assert (t / "server.key").stat().st_mode & 0o777 == 0o600
    assert cert_notices(dep, load_fleet(tmp_path / "fleet.yaml"), "fleet renew-cert") == []


def test_renewal_keeps_the_ca_and_switches_atomically(tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet(tmp_path, {"names": ["headscale.campus.example"]}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    ca = (t / "ca.crt").read_bytes()
    first = (t / "server.crt").read_bytes()
    kept = renew_server_cert(dep, fleet)
    assert not kept.renewed and (t / "server.crt").read_bytes() == first, "valid for long: kept"
    gens = []
    for _ in range(3):
        res = renew_server_cert(dep, fleet, force=True)
        assert res.renewed and res.reason == "asked"
        gens.append(os.readlink(t / "live"))
        assert (t / "server.crt").read_bytes() != first
        assert verify(t / "ca.crt", t / "server.crt") and key_matches(t / "server.key", t / "server.crt")
    assert (t / "ca.crt").read_bytes() == ca, "robots keep trusting the same CA"
    # the live generation and the one before are kept, older ones pruned; no temporary files
    assert sorted(p.name for p in (t / "certs").iterdir()) == sorted(Path(g).name for g in gens[-2:])
    assert not [p for p in t.iterdir() if p.name.startswith(".")]
    # the paths headscale reads are links through tls/live (one rename switches key and cert together)
    for n in ("server.crt", "server.key", "server.names"):
        assert os.readlink(t / n) == f"live/{n}"
    assert "DNS:headscale.campus.example" in subprocess.run(
        ["openssl", "x509", "-in", str(t / "server.crt"), "-noout", "-ext", "subjectAltName"],
        capture_output=True, text=True).stdout


def test_a_failed_renewal_leaves_the_old_certificate(tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet(tmp_path, {}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    t = dep.root / "tls"
    before, live = (t / "server.crt").read_bytes(), os.readlink(t / "live")
    (t / "ca.key").write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(FleetError) as info:
        renew_server_cert(dep, fleet, force=True)
    assert "openssl failed to sign the server certificate" in str(info.value) and "\n" not in str(info.value)
    assert (t / "server.crt").read_bytes() == before and os.readlink(t / "live") == live
    assert sorted(p.name for p in (t / "certs").iterdir()) == [Path(live).name]


def test_plain_files_of_an_older_deployment_are_adopted(tmp_path: Path) -> None:
    """A deployment whose server.crt/key are plain files (made before generation directories)
    is renewed the same way; the old pair moves into a generation of its own first."""
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


def test_short_lived_server_certificate_warns_and_renews(tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet(tmp_path, {"days": 10}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    crt = dep.root / "tls" / "server.crt"
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


def test_openssl_dates_parse_without_locale() -> None:
    assert tls.parse_openssl_date("Nov  5 15:40:00 2036 GMT") == datetime(2036, 11, 5, 15, 40, tzinfo=timezone.utc)
    with pytest.raises(ValueError):
        tls.parse_openssl_date("2036-11-05")


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
