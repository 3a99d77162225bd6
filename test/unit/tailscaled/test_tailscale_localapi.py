"""LocalAPI client against a fake tailscaled on a real unix socket, and typed errors."""
import os
import stat

import pytest

from overlay_manager.tailscaled import localapi as T


def test_status_over_unix_socket(fake_tailscaled):
    api = T.LocalAPI(fake_tailscaled.socket_path)
    st = api.status()
    assert st["BackendState"] == "Running"
    assert fake_tailscaled.requests[-1] == ("GET", "/localapi/v0/status", T.LOCALAPI_HOST)


def test_ping_posts_disco(fake_tailscaled):
    res = T.LocalAPI(fake_tailscaled.socket_path).ping("100.64.0.2")
    assert res["Endpoint"] == "10.250.0.3:41641"
    method, path, _ = fake_tailscaled.requests[-1]
    assert method == "POST" and path == "/localapi/v0/ping?ip=100.64.0.2&type=disco"


def test_http_error_is_typed(fake_tailscaled):
    api = T.LocalAPI(fake_tailscaled.socket_path)
    with pytest.raises(T.LocalAPIError, match="HTTP 404"):
        api._request("GET", "nope")


def test_missing_socket_says_how_to_fix(tmp_path):
    with pytest.raises(T.TailscaledNotRunning, match="fix: start tailscaled"):
        T.LocalAPI(str(tmp_path / "none.sock")).status()


def test_injected_transport():
    api = T.LocalAPI(transport=lambda m, p, b, t: (403, b"denied"))
    with pytest.raises(T.AccessDenied, match="operator"):
        api.status()


def _key(tmp_path, mode, text="hskey-auth-SECRETSECRET"):
    p = tmp_path / "auth.key"
    p.write_text(text)
    os.chmod(p, mode)
    return str(p)


def test_key_file_mode_refused_without_leaking(tmp_path):
    path = _key(tmp_path, 0o644)
    with pytest.raises(T.EnrolError) as e:
        T.check_key_file(path)
    assert "chmod 600" in str(e.value) and "SECRET" not in str(e.value)
    T.check_key_file(_key(tmp_path, 0o600))
    with pytest.raises(T.EnrolError, match="empty"):
        T.check_key_file(_key(tmp_path, 0o600, ""))
    with pytest.raises(T.EnrolError, match="does not exist"):
        T.check_key_file(str(tmp_path / "missing"))


def test_enrol_failure_redacts_key(tmp_path):
    key = _key(tmp_path, 0o600)
    cli = tmp_path / "tailscale"
    cli.write_text("#!/bin/sh\necho \"backend error: invalid key hskey-auth-SECRETSECRET\" >&2\nexit 1\n")
    cli.chmod(stat.S_IRWXU)
    req = T.EnrolRequest("https://hs.example:8443", "robot1", key, ["tag:robot"], timeout_s=5)
    with pytest.raises(T.EnrolError) as e:
        T.enrol(str(cli), str(tmp_path / "ts.sock"), req)
    assert "SECRET" not in str(e.value) and "<redacted>" in str(e.value) and "exit 1" in str(e.value)


def test_enrol_passes_key_by_file_and_no_advertised_tags(tmp_path):
    key = _key(tmp_path, 0o600)
    out = tmp_path / "argv"
    cli = tmp_path / "tailscale"
    cli.write_text(f"#!/bin/sh\necho \"$@\" > {out}\n")
    cli.chmod(stat.S_IRWXU)
    T.enrol(str(cli), "/s.sock", T.EnrolRequest("https://hs:8443", "robot1", key, ["tag:robot"]))
    argv = out.read_text()
    assert f"--auth-key=file:{key}" in argv and "SECRET" not in argv
    assert "--socket=/s.sock" in argv and "--hostname=robot1" in argv and "advertise-tags" not in argv


def test_missing_cli(tmp_path):
    key = _key(tmp_path, 0o600)
    with pytest.raises(T.EnrolError, match="not found"):
        T.enrol(str(tmp_path / "nope"), "/s", T.EnrolRequest("https://h", "r", key, []))


def test_netcheck_output_json_line_and_indented():
    line = '{"UDP":true,"MappingVariesByDestIP":false,"PreferredDERP":999}'
    assert T.parse_netcheck_output("# Warning: not stable\n" + line + "\n")["PreferredDERP"] == 999
    indented = '{\n  "UDP": true,\n  "PreferredDERP": 999\n}\n'
    assert T.parse_netcheck_output(indented)["UDP"] is True
    assert T.parse_netcheck_output("netcheck: UDP test failure\n") is None


def test_netcheck_runs_cli_with_json_line(tmp_path):
    cli = tmp_path / "tailscale"
    cli.write_text('#!/bin/sh\necho "$@" >&2\necho \'{"UDP":false}\'\n')
    cli.chmod(stat.S_IRWXU)
    assert T.netcheck(str(cli), "/s.sock") == {"UDP": False}
    bad = tmp_path / "bad"
    bad.write_text("#!/bin/sh\necho oops >&2\nexit 1\n")
    bad.chmod(stat.S_IRWXU)
    with pytest.raises(T.TailscaleError, match="no report"):
        T.netcheck(str(bad), "/s.sock")
