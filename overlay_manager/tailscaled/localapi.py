"""Client for tailscaled: its LocalAPI on a unix socket, plus the CLI for `up` and `netcheck`.

The LocalAPI is plain HTTP/1.1 on tailscaled's unix socket with Host ``local-tailscaled.sock``
(the same JSON `tailscale status --json` prints). Only the standard library is used. Tailscale's
JSON is not a stable API: callers get raw dicts here and parse them leniently in core/peers.py.

Typed errors, modelled on tailscale's own client:
- TailscaledNotRunning: the socket is missing or refuses connections (with a hint how to start it);
- AccessDenied: the socket exists but this user may not use it (run as root or `tailscale set
  --operator`);
- LocalAPIError: tailscaled answered with an HTTP error;
- EnrolError: `tailscale up` failed (never contains the auth key).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import stat
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from overlay_manager.core.commands import overlay_env_as_root
from overlay_manager.core.validation import redact  # the one redaction: the key itself and anything key-shaped
from overlay_manager.system import children
from overlay_manager.tailscaled.status_json import StatusDecoder

DEFAULT_SOCKET = "/var/run/tailscale/tailscaled.sock"
LOCALAPI_HOST = "local-tailscaled.sock"


FIX = " -- fix: "
"""Separator between the cause and the fix in every error message of this module."""

RESTART_TAILSCALED = "restart tailscaled (systemctl restart tailscaled)"


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) made one space."""
    return " ".join(str(text).split())


class TailscaleError(Exception):
    """Base class of every error talking to tailscaled.

    ``str()`` is one line: what failed and why (:attr:`cause`), then `` -- fix: `` and what
    to do (:attr:`fix`), with anything key-shaped redacted.
    """

    def __init__(self, cause: str, fix: str = "") -> None:
        self.cause = redact(one_line(cause))
        self.fix = redact(one_line(fix))
        super().__init__(self.cause + (FIX + self.fix if self.fix else ""))


class TailscaledNotRunning(TailscaleError):
    """tailscaled's LocalAPI socket is missing or refuses connections."""

    def __init__(self, socket_path: str, detail: str) -> None:
        super().__init__(
            f"tailscaled is not reachable at {socket_path} ({detail})",
            "start tailscaled (systemctl start tailscaled), or set tailscale.socket in the robot "
            "config to the socket it was started with (--socket)")
        self.socket_path = socket_path


class AccessDenied(TailscaleError):
    """The LocalAPI socket exists but this process may not use it."""

    def __init__(self, socket_path: str) -> None:
        super().__init__(
            f"access to tailscaled's socket {socket_path} denied",
            "run the node as root, or allow this user once with `sudo tailscale set --operator=$USER`")
        self.socket_path = socket_path


class LocalAPITimeout(TailscaleError):
    """tailscaled accepted the request but did not answer within the timeout (a hung daemon)."""

    def __init__(self, socket_path: str, path: str, timeout_s: float) -> None:
        super().__init__(f"tailscaled at {socket_path} did not answer {path} within {timeout_s:.1f} s "
                         "(hung or overloaded)",
                         f"{RESTART_TAILSCALED}; if it keeps hanging, look at `journalctl -u tailscaled`")
        self.socket_path = socket_path


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class LocalAPIError(TailscaleError):
    """tailscaled answered a LocalAPI request with an HTTP error, or with a body that is not
    the JSON it documents (:attr:`malformed`)."""

    def __init__(self, endpoint: str, status: int, body: str, malformed: bool = False) -> None:
        body = body.strip()
        try:
            body = str(json.loads(body).get("error", body))
        except (ValueError, AttributeError):
            pass
        if malformed:
            cause = f"tailscaled's answer to LocalAPI {endpoint} is malformed: {body[:300]}"
            fix = (f"check that tailscaled is a supported version (`tailscale version`; tested with "
                   f"1.102) and {RESTART_TAILSCALED}")
        else:
            cause = f"tailscaled LocalAPI {endpoint}: HTTP {status}: {body[:300]}"
            fix = (f"see `tailscale status` and `journalctl -u tailscaled` on this machine; "
                   f"{RESTART_TAILSCALED} if it persists")
        super().__init__(cause, fix)
        self.status = status
        self.malformed = malformed


class DebugUnsupported(TailscaleError):
    """tailscaled does not have a LocalAPI debug action (older or newer than the versions it was
    checked with, or built without debug support)."""

    def __init__(self, action: str, detail: str) -> None:
        super().__init__(f"tailscaled has no LocalAPI debug action {action!r} ({detail[:200]})",
                         f"use tailscale {DEBUG_ACTIONS_CHECKED} (the node then works without it)")
        self.action = action


DEBUG_ACTIONS_CHECKED = "1.102"
"""The tailscale version whose debug actions (rebind, restun, force-prefer-derp) the node was
written and measured against (their source: ipn/localapi/debug.go, wgengine/magicsock)."""

DEBUG_ACTIONS_MIN = (1, 80)
"""Oldest tailscale (major, minor) whose debug actions the node calls. rebind and restun are much
older; a tailscaled without one of them (force-prefer-derp is the youngest) answers "unknown
action", which the node takes as DebugUnsupported and does without."""


def tailscale_version(text: str) -> Optional[tuple]:
    """(major, minor) of tailscaled's ``Version`` ("1.102.5-t1234..." -> (1, 102)); None when it
    does not look like one."""
    parts = str(text or "").split("-", 1)[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


def debug_actions_supported(version: str) -> str:
    """Why the node must not call tailscaled's debug actions ("" = it may): the version is
    unknown or older than DEBUG_ACTIONS_MIN."""
    v = tailscale_version(version)
    if v is None:
        return f"tailscaled's version {version!r} is not known"
    if v < DEBUG_ACTIONS_MIN:
        return (f"tailscaled {version} is older than {DEBUG_ACTIONS_MIN[0]}.{DEBUG_ACTIONS_MIN[1]} "
                "(its debug actions differ)")
    return ""


class LocalAPIProtocolError(TailscaleError):
    """tailscaled's socket answered something that is not a usable HTTP reply: not HTTP at all,
    a body cut short, or the connection closed before any answer."""

    def __init__(self, socket_path: str, path: str, detail: str) -> None:
        super().__init__(f"tailscaled at {socket_path} gave a broken answer to {path}: {detail}",
                         f"check that tailscale.socket is tailscaled's own socket (nothing else "
                         f"listening there), then {RESTART_TAILSCALED}")
        self.socket_path = socket_path


#: EnrolError kinds: what went wrong, so callers can make the fix concrete.
ENROL_KEY_FILE = "key-file"          # auth_key_file missing, unreadable, empty or readable by others
ENROL_KEY_REJECTED = "key-rejected"  # the control server refused the key (used, expired, unknown)
ENROL_CERTIFICATE = "certificate"    # tailscaled does not trust the control server's certificate
ENROL_UNREACHABLE = "unreachable"    # the control server did not answer (network, DNS, timeout)
ENROL_TAGS = "tags"                  # headscale refused the tags asked for
ENROL_SERVER = "other-server"        # logged in to another control server
ENROL_OTHER = "other"


class EnrolError(TailscaleError):
    """Logging in to the control server failed. The message never contains the auth key.

    Attributes:
        kind: one of the ``ENROL_*`` kinds.
    """

    def __init__(self, cause: str, fix: str = "", kind: str = ENROL_OTHER) -> None:
        super().__init__(cause, fix)
        self.kind = kind


class _DeadlineSocket(socket.socket):
    """A unix socket whose reads all end by one deadline (monotonic s): a daemon that trickles
    its answer a byte at a time cannot hold a request longer than its timeout."""

    deadline = math.inf

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:  # noqa: D102
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("deadline passed")
        self.settimeout(left)
        return super().recv_into(buffer, nbytes, flags)


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTPConnection over a unix socket; the whole request (connect to last byte) takes at most
    ``timeout`` seconds."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__(LOCALAPI_HOST, timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:  # noqa: D102 - http.client API
        sock = _DeadlineSocket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.deadline = time.monotonic() + self.timeout
        sock.settimeout(self.timeout)
        sock.connect(self._socket_path)
        self.sock = sock


Transport = Callable[[str, str, Optional[bytes], float], "tuple[int, bytes]"]
"""(method, path with query, body, timeout in s) -> (HTTP status, body); injectable for tests."""


class LocalAPI:
    """tailscaled's LocalAPI.

    Args:
        socket_path: tailscaled's unix socket (its --socket flag).
        timeout: default seconds for one request.
        transport: replaces the unix-socket HTTP transport (tests).
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        timeout: float = 5.0,
        transport: Optional[Transport] = None,
    ) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._transport = transport or self._unix_transport

    def _unix_transport(
        self, method: str, path: str, body: Optional[bytes], timeout: float
    ) -> "tuple[int, bytes]":
        conn = _UnixHTTPConnection(self.socket_path, timeout)
        try:
            try:
                conn.request(method, path, body=body, headers={"Host": LOCALAPI_HOST})
                resp = conn.getresponse()
                return resp.status, resp.read()
            except FileNotFoundError:
                raise TailscaledNotRunning(self.socket_path, "no such socket") from None
            except ConnectionRefusedError:
                raise TailscaledNotRunning(self.socket_path, "connection refused") from None
            except PermissionError:
                raise AccessDenied(self.socket_path) from None
            except socket.timeout:
                raise LocalAPITimeout(self.socket_path, path, timeout) from None
            except http.client.HTTPException as exc:  # BadStatusLine, IncompleteRead, LineTooLong, ...
                raise LocalAPIProtocolError(self.socket_path, path, _describe(exc)) from None
            except ConnectionResetError:
                raise LocalAPIProtocolError(self.socket_path, path, "connection reset") from None
            except OSError as exc:
                raise TailscaledNotRunning(self.socket_path, exc.strerror or str(exc)) from None
        finally:
            conn.close()

    def _request(
        self,
        method: str,
        endpoint: str,
        query: Optional[Dict[str, str]] = None,
        body: Optional[bytes] = None,
        timeout: Optional[float] = None,
        decode: Callable[[str], Any] = json.loads,
    ) -> Any:
        path = "/localapi/v0/" + endpoint
        if query:
            path += "?" + urllib.parse.urlencode(query)
        status, data = self._transport(method, path, body, timeout or self.timeout)
        if status == 403:
            raise AccessDenied(self.socket_path)
        if status >= 400:
            raise LocalAPIError(endpoint, status, data.decode("utf-8", "replace"))
        try:
            return decode(data.decode("utf-8")) if data else None
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise LocalAPIError(endpoint, status, f"not JSON: {_describe(exc)}", malformed=True) from None

    def status(self, timeout: Optional[float] = None, decoder: Optional[StatusDecoder] = None) -> Dict[str, Any]:
        """The full status (ipnstate.Status as JSON), peers included.

        Args:
            timeout: seconds for this request (default: the client's timeout).
            decoder: decodes the body reusing the peers that did not change since its last
                body (one caller at a time); the result is the same as without it.
        """
        result = self._request("GET", "status", timeout=timeout,
                               decode=decoder.decode if decoder is not None else json.loads)
        if not isinstance(result, dict):
            raise LocalAPIError("status", 200, f"expected a JSON object, got {type(result).__name__}",
                                malformed=True)
        return result

    def prefs(self) -> Dict[str, Any]:
        """Current preferences (ipn.Prefs as JSON): ControlURL, Hostname, AdvertiseTags, ..."""
        result = self._request("GET", "prefs")
        return result if isinstance(result, dict) else {}

    def derp_map(self) -> Dict[str, Any]:
        """The DERP map from the control server (tailcfg.DERPMap as JSON)."""
        result = self._request("GET", "derpmap")
        return result if isinstance(result, dict) else {}

    def edit_prefs(self, masked: Dict[str, Any]) -> Dict[str, Any]:
        """Change preferences (PATCH prefs with an ipn.MaskedPrefs body: the fields to change
        plus ``<Field>Set: true`` for each); returns the prefs after the change."""
        result = self._request("PATCH", "prefs", body=json.dumps(masked).encode("utf-8"))
        return result if isinstance(result, dict) else {}

    def peer_relay_sessions(self) -> Dict[str, Any]:
        """This machine's peer relay server: port and sessions (status.ServerStatus as JSON)."""
        result = self._request("GET", "debug-peer-relay-sessions")
        return result if isinstance(result, dict) else {}

    def ping(self, ip: str, ping_type: str = "disco", timeout: float = 5.0) -> Dict[str, Any]:
        """One ping to an overlay IP (ipnstate.PingResult as JSON).

        A disco ping goes over the same path WireGuard uses and makes tailscaled refresh that path.
        The result's "Err" is non-empty when the ping failed (e.g. timeout).
        """
        try:
            result = self._request(
                "POST", "ping", {"ip": ip, "type": ping_type}, body=b"", timeout=timeout
            )
        except LocalAPITimeout:
            return {"Err": f"no answer within {timeout:.1f} s", "IP": ip}
        return result if isinstance(result, dict) else {"Err": "empty ping result", "IP": ip}

    def debug_action(self, action: str, body: bytes = b"", timeout: Optional[float] = None) -> None:
        """Run one of tailscaled's LocalAPI debug actions (``POST debug?action=...``; the same as
        ``tailscale debug <action>``): a debug interface, not a stable API, so callers check
        :func:`debug_actions_supported` first and treat :class:`DebugUnsupported` as "this
        tailscaled cannot do it". The actions used here (ipn/localapi/debug.go, v1.102.5):

        - ``rebind``: re-binds the UDP sockets and forgets every peer's best path (each then goes
          out over DERP and every candidate path until a pong arrives);
        - ``restun``: a new network check now (STUN, DERP latencies, the home region);
        - ``force-prefer-derp`` with body ``N`` (a region id; 0 = stop forcing): the network check
          prefers region N whenever it reaches it;
        - ``pick-new-derp``: the home region becomes another region of the DERP map at once (the
          first one that is not the current home).

        Raises DebugUnsupported (HTTP 404, 501 or "unknown action"), AccessDenied, or another
        TailscaleError.
        """
        try:
            self._request("POST", "debug", {"action": action}, body=body, timeout=timeout,
                          decode=lambda _text: None)
        except LocalAPIError as exc:
            if exc.status in (404, 501) or "unknown action" in str(exc):
                raise DebugUnsupported(action, str(exc)) from None
            raise



@dataclass
class EnrolRequest:
    """What `tailscale up` needs. auth_key_file is read by the CLI itself (file:PATH), so the key
    never passes through this process's argv, environment or logs."""

    login_server: str
    hostname: str
    auth_key_file: str
    tags: List[str]
    accept_dns: bool = False
    timeout_s: float = 30.0
    force_reauth: bool = False  # log in again although already logged in (--force-reauth)


BUNDLE_FIX = ("copy auth.key from the machine's enrolment bundle (on the fleet server: `fleet bundle "
              "HOST`, or `fleet rotate HOST` for a new key) and `chmod 600` it")


def check_key_file(path: str) -> None:
    """Refuse an auth-key file that is missing, empty, or readable by group or others.

    Raises:
        EnrolError: (kind ``key-file``) naming the file and how to fix it (never its content).
    """
    def bad(cause: str, fix: str = BUNDLE_FIX) -> EnrolError:
        return EnrolError(f"auth_key_file {path} {cause}", fix, ENROL_KEY_FILE)

    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise bad("does not exist") from None
    except PermissionError:
        raise bad("is not readable by this user", "run as root (the shipped units do), or make the "
                  "user running the node own the file") from None
    if not stat.S_ISREG(st.st_mode):
        raise bad("is not a regular file")
    if st.st_mode & 0o077:
        raise bad(f"has mode {stat.S_IMODE(st.st_mode):04o}: it is readable by group or others",
                  f"`chmod 600 {path}` (and keep it owned by the user running the node)")
    if st.st_size == 0:
        raise bad("is empty")


UP_GRACE_S = 10.0
"""Seconds `tailscale up` may run beyond its own ``--timeout`` (to report its own error) before
it is killed."""

_KEY_REJECTED = ("invalid key", "not valid", "authkey", "auth key", "auth-key", "preauthkey",
                 "pre-auth key", "already used", "key expired", "expired key")
_CERTIFICATE = ("x509", "certificate")
_UNREACHABLE = ("connection refused", "no such host", "network is unreachable", "i/o timeout",
                "context deadline exceeded", "timeout waiting", "no route to host",
                "connection reset", "tls handshake timeout")


def classify_up_failure(text: str) -> str:
    """The ENROL_* kind of a failed `tailscale up`, from its (lower-cased) output."""
    low = text.lower()
    if any(w in low for w in _CERTIFICATE):
        return ENROL_CERTIFICATE
    if "requested tags" in low or "advertise-tags" in low:
        return ENROL_TAGS
    if any(w in low for w in _KEY_REJECTED):
        return ENROL_KEY_REJECTED
    if any(w in low for w in _UNREACHABLE):
        return ENROL_UNREACHABLE
    return ENROL_OTHER


def up_failure_fix(kind: str, request: EnrolRequest, key_file: str = "", config: str = "") -> str:
    """What to do about a failed `tailscale up` of ``kind`` (one line).

    ``key_file`` and ``config``: the machine's auth-key file and robot config, named in the fix
    when known.
    """
    config_opt = f"--config {config}" if config else ""
    if kind == ENROL_KEY_REJECTED:
        return (f"on the fleet server run `fleet rotate {request.hostname}`, copy the new auth.key "
                f"over {key_file or request.auth_key_file} (mode 0600), then run "
                f"`{overlay_env_as_root(config_opt + ' --enrol --reauth')}` on this machine")
    if kind == ENROL_CERTIFICATE:
        return ("start tailscaled with SSL_CERT_FILE=<the bundle's ca.crt> in its environment or "
                f"install the CA with `{overlay_env_as_root(config_opt + ' --install-ca')}`, "
                "then restart tailscaled")
    if kind == ENROL_UNREACHABLE:
        return (f"check that {request.login_server} answers from this machine (`curl -sSk "
                f"{request.login_server.rstrip('/')}/health`; routes, firewall, DNS) and that "
                "headscale runs (`fleet status` on the server)")
    if kind == ENROL_TAGS:
        return ("do not pass --advertise-tags with a pre-auth key (headscale 0.29 refuses it): the "
                "key carries the tags")
    return ("see `tailscale status` and `journalctl -u tailscaled` on this machine and headscale's "
            "log on the server")


def enrol(
    cli: str,
    socket_path: str,
    request: EnrolRequest,
    env: Optional[Dict[str, str]] = None,
) -> None:
    """Log tailscaled in with `tailscale up` and a pre-auth key read from a file.

    Tags are not advertised: a tagged pre-auth key gives the node its tags, and Headscale 0.29
    rejects a registration that combines a pre-auth key with --advertise-tags.

    Raises:
        EnrolError: one line with the CLI's error text (the key redacted should it ever
            appear), its ``kind`` and a fix.
    """
    check_key_file(request.auth_key_file)
    with open(request.auth_key_file, encoding="utf-8") as fh:
        secret = fh.read().strip()
    argv = [
        cli,
        f"--socket={socket_path}",
        "up",
        f"--login-server={request.login_server}",
        f"--auth-key=file:{request.auth_key_file}",
        f"--hostname={request.hostname}",
        f"--accept-dns={'true' if request.accept_dns else 'false'}",
        # a Go duration: 0.5 stays 0.5 s (int() made it 0s, which tailscale takes as "no timeout")
        f"--timeout={request.timeout_s:g}s",
    ] + (["--force-reauth"] if request.force_reauth else [])
    what = f"`tailscale up` against {request.login_server} as {request.hostname}"
    started = time.monotonic()
    try:
        proc = children.run(argv, timeout_s=request.timeout_s + UP_GRACE_S, env=env)
    except FileNotFoundError:
        raise EnrolError(f"tailscale CLI {cli!r} not found",
                         "install tailscale (pkgs.tailscale.com) or set tailscale.cli in the robot config") from None
    except subprocess.TimeoutExpired:
        raise EnrolError(
            f"{what} did not finish within tailscale.up_timeout = {request.timeout_s:g} s (stopped "
            f"after {time.monotonic() - started:.1f} s: tailscale gets {UP_GRACE_S:g} s more to "
            "report its own error)", up_failure_fix(ENROL_UNREACHABLE, request) +
            "; or raise tailscale.up_timeout", ENROL_UNREACHABLE) from None
    if proc.returncode != 0:
        text = redact(one_line(proc.stderr or proc.stdout or ""), secret)
        kind = classify_up_failure(text)
        cause = {ENROL_KEY_REJECTED: "the control server rejected the auth key (used, expired, revoked or unknown)",
                 ENROL_CERTIFICATE: "tailscaled does not trust the control server's certificate",
                 ENROL_UNREACHABLE: "the control server did not answer",
                 ENROL_TAGS: "headscale refused the tags asked for"}.get(kind, "it failed")
        raise EnrolError(f"{what} failed (exit {proc.returncode}): {cause}; tailscale said: {text[-300:]}",
                         up_failure_fix(kind, request), kind)


def parse_netcheck_output(stdout: str) -> Optional[Dict[str, Any]]:
    """The last JSON object in netcheck's stdout: one per line (json-line) or one indented
    document (json); None when there is none."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report, dict):
                return report
    start = stdout.find("{")
    if start != -1:
        try:
            report = json.loads(stdout[start:])
        except ValueError:
            return None
        if isinstance(report, dict):
            return report
    return None


def netcheck(cli: str, socket_path: str, env: Optional[Dict[str, str]] = None,
             timeout_s: float = 20.0) -> Dict[str, Any]:
    """Run `tailscale netcheck --format=json-line` (NAT and DERP latency report, netcheck.Report).

    The child is killed after timeout_s seconds, and with this process (see system/children.py).

    Raises:
        TailscaleError: when the CLI is missing, fails or prints no JSON.
    """
    argv = [cli, f"--socket={socket_path}", "netcheck", "--format=json-line"]
    try:
        proc = children.run(argv, timeout_s=timeout_s, env=env)
    except FileNotFoundError:
        raise TailscaleError(f"tailscale CLI {cli!r} not found",
                             "install tailscale or set tailscale.cli in the robot config") from None
    except subprocess.TimeoutExpired:
        raise TailscaleError(f"`tailscale netcheck` took longer than {timeout_s:.0f} s",
                             "check that this machine reaches the DERP/STUN server (server.derp in the "
                             "fleet file); the next check runs at node.netcheck_interval") from None
    report = parse_netcheck_output(proc.stdout)
    if report is not None:
        return report
    raise TailscaleError(
        f"`tailscale netcheck` gave no report (exit {proc.returncode}): {proc.stderr.strip()[-300:]}",
        f"run `tailscale --socket={socket_path} netcheck` by hand to see why; {RESTART_TAILSCALED} if it hangs")
