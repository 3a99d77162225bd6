"""Every enrolment and LocalAPI error is one line that names the cause and a fix, and never a
secret: each typed error of overlay_manager.tailscaled.localapi, each failure of ``enrol`` (a fake
`tailscale` CLI printing what the real one prints, multi-line) and of
``enrolment.ensure_enrolled`` (a LocalAPI whose transport answers like tailscaled)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest
import yaml

from overlay_manager.core.config import load_robot_config
from overlay_manager.tailscaled import localapi as T
from overlay_manager.tailscaled.enrolment import ensure_enrolled

SECRET = "hskey-auth-Xq7Zb2LmN9pR4sT6vW8yA1cE3gJ5kM0o"


def check(exc: BaseException, *words: str) -> str:
    """One line, a cause, ' -- fix: ' and a fix, no secret, every word present."""
    msg = str(exc)
    assert "\n" not in msg and "\r" not in msg, msg
    cause, sep, fix = msg.partition(T.FIX)
    assert sep and cause.strip() and len(fix.strip()) > 10, f"no fix named: {msg}"
    assert SECRET not in msg and SECRET[:20] not in msg, msg
    assert len(msg) < 1200, len(msg)
    for w in words:
        assert w in msg, f"{w!r} not in {msg}"
    return msg


def fake_cli(tmp: Path, stderr: str, code: int = 1, sleep: float = 0.0) -> str:
    cli = tmp / "tailscale"
    body = f"sleep {sleep}\n" if sleep else ""
    cli.write_text("#!/bin/sh\n" + body + "cat >&2 <<'EOF'\n" + stderr + "\nEOF\n" + f"exit {code}\n")
    cli.chmod(stat.S_IRWXU)
    return str(cli)


def key_file(tmp: Path, mode: int = 0o600, text: str = SECRET) -> str:
    p = tmp / "auth.key"
    p.write_text(text)
    os.chmod(p, mode)
    return str(p)


# --- the LocalAPI's typed errors -------------------------------------------------------------

TYPED: List[Tuple[str, Callable[[], T.TailscaleError], Tuple[str, ...]]] = [
    ("not running", lambda: T.TailscaledNotRunning("/run/ts.sock", "no such socket"),
     ("/run/ts.sock", "start tailscaled", "tailscale.socket")),
    ("access denied", lambda: T.AccessDenied("/run/ts.sock"), ("denied", "--operator")),
    ("hung", lambda: T.LocalAPITimeout("/run/ts.sock", "/localapi/v0/status", 1.5),
     ("did not answer", "restart tailscaled")),
    ("http 500", lambda: T.LocalAPIError("status", 500, '{"error": "boom\\nsecond line ' + SECRET + '"}'),
     ("HTTP 500", "boom second line", "journalctl -u tailscaled")),
    ("not json", lambda: T.LocalAPIError("status", 200, "not JSON: JSONDecodeError", malformed=True),
     ("malformed", "tailscale version", "restart tailscaled")),
    ("broken", lambda: T.LocalAPIProtocolError("/run/ts.sock", "/localapi/v0/status", "BadStatusLine: x\ny"),
     ("broken answer", "tailscale.socket")),
    ("enrol error", lambda: T.EnrolError("cause\nline two", "do this and that"),
     ("cause line two", "do this and that")),
]


@pytest.mark.parametrize("name,make,words", TYPED, ids=[t[0] for t in TYPED])
def test_typed_errors_are_one_line_with_a_fix(name: str, make: Callable[[], T.TailscaleError],
                                              words: Tuple[str, ...]) -> None:
    check(make(), *words)


def test_localapi_answers_that_are_not_json_say_malformed() -> None:
    api = T.LocalAPI("/s", transport=lambda m, p, b, t: (200, b"\xff{not json"))
    with pytest.raises(T.LocalAPIError) as info:
        api.status()
    assert info.value.malformed
    check(info.value, "malformed", "tailscale version")
    api = T.LocalAPI("/s", transport=lambda m, p, b, t: (200, b"[1, 2]"))
    with pytest.raises(T.LocalAPIError) as info:
        api.status()
    check(info.value, "expected a JSON object, got list")


# --- the auth-key file -------------------------------------------------------------------------

def test_key_file_errors(tmp_path: Path) -> None:
    check(pytest.raises(T.EnrolError, T.check_key_file, str(tmp_path / "nope")).value,
          "does not exist", "fleet bundle")
    d = tmp_path / "dir"
    d.mkdir()
    check(pytest.raises(T.EnrolError, T.check_key_file, str(d)).value, "not a regular file")
    e = pytest.raises(T.EnrolError, T.check_key_file, key_file(tmp_path, 0o644)).value
    check(e, "0644", "chmod 600")
    assert e.kind == T.ENROL_KEY_FILE
    check(pytest.raises(T.EnrolError, T.check_key_file, key_file(tmp_path, 0o600, "")).value, "is empty",
          "fleet rotate")


# --- `tailscale up` failures -------------------------------------------------------------------

UP_FAILURES = [
    ("used key", "backend error: invalid key: \nauth key " + SECRET + "\n is not valid\n", T.ENROL_KEY_REJECTED,
     ("rejected the auth key", "tailscale said: backend error: invalid key", "fleet rotate robot1",
      "--enrol --reauth", "auth.key")),
    ("headscale already used", "backend error: authkey already used\n", T.ENROL_KEY_REJECTED,
     ("fleet rotate robot1",)),
    ("x509", 'Post "https://hs.example:8443/key": tls: failed to verify certificate:\nx509: certificate '
     'signed by unknown authority\n', T.ENROL_CERTIFICATE, ("does not trust", "SSL_CERT_FILE", "--install-ca")),
    ("unreachable", "dial tcp 10.99.0.2:8443: connect: connection refused\n", T.ENROL_UNREACHABLE,
     ("did not answer", "curl -sSk https://hs.example:8443/health")),
    ("tags", "requested tags [tag:robot] are invalid or not permitted\n", T.ENROL_TAGS, ("--advertise-tags",)),
    ("other", "something odd\nhappened\n", T.ENROL_OTHER, ("something odd happened", "journalctl")),
]


@pytest.mark.parametrize("name,stderr,kind,words", UP_FAILURES, ids=[u[0] for u in UP_FAILURES])
def test_tailscale_up_failures(tmp_path: Path, name: str, stderr: str, kind: str, words: Tuple[str, ...]) -> None:
    req = T.EnrolRequest("https://hs.example:8443", "robot1", key_file(tmp_path), [], timeout_s=5)
    with pytest.raises(T.EnrolError) as info:
        T.enrol(fake_cli(tmp_path, stderr), "/s", req)
    assert info.value.kind == kind
    check(info.value, "exit 1", *words)


def test_up_timeout_names_the_configured_and_the_real_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """up_timeout: 1 said "did not finish in 11 s" (the 10 s grace added silently): now the
    message names the configured timeout and how long it really ran."""
    monkeypatch.setattr(T, "UP_GRACE_S", 0.5)
    req = T.EnrolRequest("https://hs.example:8443", "robot1", key_file(tmp_path), [], timeout_s=0.5)
    with pytest.raises(T.EnrolError) as info:
        T.enrol(fake_cli(tmp_path, "never", sleep=30), "/s", req)
    msg = check(info.value, "tailscale.up_timeout = 0.5 s", "stopped after 1.", "0.5 s more",
                "raise tailscale.up_timeout")
    assert "11 s" not in msg


def test_up_gets_the_exact_timeout(tmp_path: Path) -> None:
    out = tmp_path / "argv"
    cli = tmp_path / "tailscale"
    cli.write_text(f"#!/bin/sh\necho \"$@\" > {out}\n")
    cli.chmod(stat.S_IRWXU)
    T.enrol(str(cli), "/s", T.EnrolRequest("https://h", "r", key_file(tmp_path), [], timeout_s=0.5))
    assert "--timeout=0.5s" in out.read_text()  # was int(0.5) = 0s: no timeout at all


def test_missing_cli_and_netcheck(tmp_path: Path) -> None:
    req = T.EnrolRequest("https://h", "r", key_file(tmp_path), [])
    check(pytest.raises(T.EnrolError, T.enrol, str(tmp_path / "nope"), "/s", req).value, "not found",
          "tailscale.cli")
    check(pytest.raises(T.TailscaleError, T.netcheck, str(tmp_path / "nope"), "/s").value, "tailscale.cli")
    check(pytest.raises(T.TailscaleError, T.netcheck, fake_cli(tmp_path, "no\nreport"), "/s").value,
          "gave no report", "netcheck")


# --- ensure_enrolled -----------------------------------------------------------------------------

def robot(tmp: Path, **over: object) -> Path:
    cfg: Dict[str, object] = {"hostname": "robot1", "login_server": "https://hs.example:8443",
                              "base_domain": "fleet.internal", "master": "robot1",
                              "auth_key_file": "auth.key", "ca_cert": "",
                              "tailscale": {"cli": str(tmp / "tailscale"), "up_timeout": 0.5}}
    cfg.update(over)
    p = tmp / "robot.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def api(state: str = "NeedsLogin", control: str = "", key: str = "nodekey:1") -> T.LocalAPI:
    def transport(method: str, path: str, body: Optional[bytes], timeout: float) -> Tuple[int, bytes]:
        if path.endswith("/status"):
            return 200, json.dumps({"BackendState": state, "Self": {"PublicKey": key}}).encode()
        if path.endswith("/prefs"):
            return 200, json.dumps({"ControlURL": control}).encode()
        return 404, b'{"error": "no"}'
    return T.LocalAPI("/s", transport=transport)


def test_enrolment_errors(tmp_path: Path) -> None:
    path = robot(tmp_path)
    cfg = load_robot_config(path)
    # logged in to another server
    e = pytest.raises(T.EnrolError, ensure_enrolled, api("Running", "https://other.example"), cfg).value
    check(e, "other.example", "tailscale logout")
    # no key file in the config
    e = pytest.raises(T.EnrolError, ensure_enrolled, api(), load_robot_config(robot(tmp_path, auth_key_file=""))).value
    check(e, "no auth_key_file", "fleet bundle robot1")
    # key file missing
    e = pytest.raises(T.EnrolError, ensure_enrolled, api(), cfg).value
    check(e, str(path), "auth_key_file", "fleet bundle robot1")
    # ca_cert missing
    key_file(tmp_path)
    e = pytest.raises(T.EnrolError, ensure_enrolled, api(),
                      load_robot_config(robot(tmp_path, ca_cert="ca.crt"))).value
    check(e, "ca_cert", "fleet bundle robot1")
    # key rejected: the fix names the host, the key file and the config file
    fake_cli(tmp_path, "backend error: invalid key:\n" + SECRET + " not valid")
    e = pytest.raises(T.EnrolError, ensure_enrolled, api(), cfg).value
    check(e, "rejected the auth key", "fleet rotate robot1", str(tmp_path / "auth.key"),
          f"overlay_env --config {path} --enrol --reauth")
    # certificate
    fake_cli(tmp_path, "x509: certificate signed by unknown authority")
    check(pytest.raises(T.EnrolError, ensure_enrolled, api(), cfg).value, "SSL_CERT_FILE",
          f"--config {path} --install-ca")
    # `tailscale up` returned but tailscaled stays NeedsLogin / Starting
    fake_cli(tmp_path, "", code=0)
    check(pytest.raises(T.EnrolError, ensure_enrolled, api("NeedsLogin"), cfg, wait_s=0.3).value,
          "NeedsLogin", "fleet rotate robot1")
    check(pytest.raises(T.EnrolError, ensure_enrolled, api("NoState"), cfg, wait_s=0.3).value,
          "NoState", "tailscale status", "up_timeout")
