"""`fleet init` never leaves a half-written deployment: a new one is built in a temporary
directory and moved into place only when complete; bad TLS inputs are errors naming the fleet
file and the key. Real openssl, no headscale needed (init does not run it for a new deployment)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import yaml

from overlay_manager.core.validation import ConfigError
from overlay_manager.fleet.config import load_fleet
from overlay_manager.fleet.deploy import Deployment, init_deployment

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
HEADSCALE = "/bin/true"  # never run for a new deployment; init only records its path


def write_fleet(d: Path, server: Dict[str, Any]) -> Path:
    p = d / "fleet.yaml"
    p.write_text(yaml.safe_dump({"fleet": "lab", "base_domain": "fleet.internal", "server": server,
                                 "teams": {"alpha": {"robots": ["alpha-robot1"]}}}))
    return p


def keypair(d: Path, name: str) -> Tuple[Path, Path]:
    """A self-signed certificate and its key (PEM), made with openssl."""
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "2", "-subj", f"/CN={name}"],
                   check=True, capture_output=True)
    return crt, key


def leftovers(d: Path) -> List[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def test_new_deployment_is_complete_and_rerun_converges(tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet(tmp_path, {"url": "https://10.231.0.2:8443"}))
    dep = init_deployment(fleet, tmp_path / "hs", HEADSCALE)
    root = tmp_path / "hs"
    for f in ("config.yaml", "policy.hujson", "deployment.json", "tls/ca.crt", "tls/ca.key",
              "tls/server.crt", "tls/server.key"):
        assert (root / f).is_file(), f
    assert (root / "tls" / "ca.key").stat().st_mode & 0o777 == 0o600
    assert (root.stat().st_mode & 0o777) == 0o700 and not leftovers(tmp_path)
    cfg = yaml.safe_load((root / "config.yaml").read_text())
    assert cfg["tls_cert_path"] == str(root / "tls" / "server.crt")  # final paths, not the temp dir
    assert dep.ca_cert == root / "tls" / "ca.crt"
    assert Deployment.open(root, HEADSCALE).server_url == "https://10.231.0.2:8443"
    ca = (root / "tls" / "ca.crt").read_bytes()
    init_deployment(fleet, root, HEADSCALE)
    assert (root / "tls" / "ca.crt").read_bytes() == ca, "the CA robots trust is kept"


def _assert_nothing_left(tmp_path: Path, out: Path, before: List[str]) -> None:
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == before
    assert not leftovers(tmp_path)


@pytest.mark.parametrize("case,key,words", [
    ("garbage cert", "server.tls.cert", "not a PEM certificate"),
    ("garbage key", "server.tls.key", "not an unencrypted PEM private key"),
    ("missing cert", "server.tls.cert", "does not exist"),
    ("cert is a directory", "server.tls.cert", "not a regular file"),
    ("key of another cert", "server.tls.key", "does not belong"),
    ("garbage ca", "server.tls.ca", "not a PEM certificate"),
])
@pytest.mark.parametrize("outdir", ["new", "existing-empty", "existing-with-files"])
def test_bad_tls_files_leave_nothing(tmp_path: Path, case: str, key: str, words: str, outdir: str) -> None:
    crt, k = keypair(tmp_path, "server")
    other_crt, other_key = keypair(tmp_path, "other")
    ca = crt
    if case == "garbage cert":
        crt = tmp_path / "bad.crt"
        crt.write_text("not a certificate\n")
    elif case == "garbage key":
        k = tmp_path / "bad.key"
        k.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    elif case == "missing cert":
        crt = tmp_path / "nope.crt"
    elif case == "cert is a directory":
        crt = tmp_path / "certdir"
        crt.mkdir()
    elif case == "key of another cert":
        k = other_key
    elif case == "garbage ca":
        ca = tmp_path / "bad-ca.crt"
        ca.write_bytes(b"\x00\xff")
    path = write_fleet(tmp_path, {"url": "https://10.231.0.2:8443",
                                  "tls": {"generate": False, "cert": str(crt), "key": str(k), "ca": str(ca)}})
    fleet = load_fleet(path)
    out = tmp_path / "hs"
    if outdir != "new":
        out.mkdir()
    if outdir == "existing-with-files":
        (out / "notes.txt").write_text("mine\n")
    before = sorted(p.name for p in out.iterdir()) if out.exists() else []
    with pytest.raises(ConfigError) as info:
        init_deployment(fleet, out, HEADSCALE)
    msg = str(info.value)
    assert info.value.key == key and msg.startswith(f"{path}: {key}: ") and words in msg, msg
    assert "PRIVATE KEY" not in msg and "\n" not in msg
    _assert_nothing_left(tmp_path, out, before)


def test_bad_certificate_name_leaves_nothing(tmp_path: Path) -> None:
    """openssl refuses a common name over 64 characters: the error names the fleet file and the
    key, and the half-made CA does not survive."""
    long_host = "h" * 63 + ".example.org"
    path = write_fleet(tmp_path, {"url": f"https://{long_host}:8443"})
    out = tmp_path / "hs"
    with pytest.raises(ConfigError) as info:
        init_deployment(load_fleet(path), out, HEADSCALE)
    assert info.value.key == "server.url" and str(path) in str(info.value)
    assert "cannot issue the server certificate" in str(info.value)
    _assert_nothing_left(tmp_path, out, [])


def test_own_tls_files_work(tmp_path: Path) -> None:
    crt, k = keypair(tmp_path, "server")
    path = write_fleet(tmp_path, {"url": "https://10.231.0.2:8443",
                                  "tls": {"generate": False, "cert": str(crt), "key": str(k), "ca": str(crt)}})
    dep = init_deployment(load_fleet(path), tmp_path / "hs", HEADSCALE)
    assert dep.ca_cert == crt and not (tmp_path / "hs" / "tls" / "ca.key").exists()


def test_existing_non_deployment_directory_gets_the_files(tmp_path: Path) -> None:
    out = tmp_path / "fleetdir"
    out.mkdir()
    path = write_fleet(out, {"url": "https://10.231.0.2:8443"})
    init_deployment(load_fleet(path), out, HEADSCALE)
    assert (out / "deployment.json").is_file() and (out / "fleet.yaml").is_file()
    assert not leftovers(out)


def test_corrupt_deployment_json_is_a_clear_error(tmp_path: Path) -> None:
    from overlay_manager.fleet.model import FleetError
    (tmp_path / "deployment.json").write_bytes(b"\xff\xfe")
    with pytest.raises(FleetError, match="corrupt"):
        Deployment.open(tmp_path, HEADSCALE)
    (tmp_path / "deployment.json").write_text("[1, 2]")
    with pytest.raises(FleetError, match="corrupt"):
        Deployment.open(tmp_path, HEADSCALE)


def test_missing_derp_map_is_named(tmp_path: Path) -> None:
    path = write_fleet(tmp_path, {"url": "https://10.231.0.2:8443", "derp": {"extra_maps": ["derp.yaml"]}})
    with pytest.raises(ConfigError) as info:
        init_deployment(load_fleet(path), tmp_path / "hs", HEADSCALE)
    assert info.value.key == "server.derp.extra_maps[0]" and "does not exist" in str(info.value)
    _assert_nothing_left(tmp_path, tmp_path / "hs", [])
