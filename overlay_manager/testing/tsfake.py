"""Unit-test helpers: recorded tailscaled JSON, a fake LocalAPI unix socket (tailscaled stand-in)
and a robot config that points the node at it (:func:`robot_config`).

The fake can also misbehave, like a broken or hung tailscaled, through ``FakeTailscaled.mode``
(switchable at any time, applies to every request):

| mode | what the socket does |
|---|---|
| ``good`` | answers like tailscaled (the default) |
| ``garbage`` | replies bytes that are not HTTP, then closes |
| ``truncated`` | HTTP 200 with a Content-Length larger than the body it sends, then closes |
| ``huge`` | status whose peer counters are ``1e400`` (JSON overflow to inf) and 2^70 (> uint64) |
| ``hang`` | accepts and reads the request, never answers it (even after the mode changes) |
| ``trickle`` | HTTP 200 headers, then the body one byte every 0.1 s (never finishing in time) |
| ``close`` | closes the connection without a byte |
| ``http500`` | HTTP 500 with tailscaled's JSON error body |

``stop()`` makes tailscaled gone (socket closed and removed: connection refused / no such
socket); ``start()`` serves again on the same path.
"""
import copy
import json
import os
import queue
import socketserver
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Optional, Union
from urllib.parse import parse_qs, urlparse

import yaml

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "data")  # recorded status JSON


def recorded(name: str) -> dict:
    """A recorded JSON document from test/data (deep copy)."""
    with open(os.path.join(DATA, name), encoding="utf-8") as fh:
        return copy.deepcopy(json.load(fh))


def robot_config(socket_path: str, node: Optional[dict] = None, **top: Any) -> dict:
    """A robot config (parsed YAML) of machine ``robota`` in ``fleet.internal``, its own ROS master,
    whose tailscaled LocalAPI is at ``socket_path`` and whose tailscale CLI is /bin/false (nothing
    is ever enrolled). ``node``: the node section (none when None); ``top``: top-level keys to
    add or replace (``master``, ``auth_key_file``, a whole ``tailscale`` section ...)."""
    data: dict = {"hostname": "robota", "login_server": "http://10.250.0.1:8080", "base_domain": "fleet.internal",
                  "master": "robota", "tailscale": {"socket": socket_path, "cli": "/bin/false"}}
    if node is not None:
        data["node"] = node
    data.update(top)
    return data


def write_robot_config(path: Union[str, Path], socket_path: str, node: Optional[dict] = None, **top: Any) -> Path:
    """:func:`robot_config` written to ``path`` as YAML; returns the path."""
    path = Path(path)
    path.write_text(yaml.safe_dump(robot_config(socket_path, node, **top)))
    return path


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


MODES = ("good", "garbage", "truncated", "huge", "hang", "trickle", "close", "http500")


def status_body(status: dict) -> bytes:
    """status as tailscaled writes it (Go's json.Encoder indented with tabs, then a newline)."""
    return (json.dumps(status, indent="\t") + "\n").encode()


def huge_status(status: dict) -> bytes:
    """status as JSON bytes with every peer's RxBytes = 1e400 and TxBytes = 2^70 (literal JSON
    numbers: Python's json turns 1e400 into inf, and 2^70 does not fit a uint64)."""
    doc = copy.deepcopy(status)
    for ps in doc.get("Peer", {}).values():
        ps["RxBytes"], ps["TxBytes"] = "@RX@", "@TX@"
    return status_body(doc).replace(b'"@RX@"', b"1e400").replace(b'"@TX@"', str(2 ** 70).encode())


class FakeTailscaled:
    """Serves status/prefs/ping JSON on a unix socket the way tailscaled's LocalAPI does.

    Args (all optional; the defaults serve the recorded two-machine tailnet):
        status: the status document to serve (default: test/data/status_direct.json).
        ping_for: ``ip -> ping result`` for POST /localapi/v0/ping?ip=...; default: the recorded
            ping_direct.json whatever the ip.
        record_requests: keep every request in ``requests`` (off for long benchmarks, where
            ``counts`` alone is kept: method+endpoint -> number of requests).
        ipn_bus: serve GET /localapi/v0/watch-ipn-bus (chunked JSON lines: {"State": 6} at once,
            then every object given to ``notify``); off = 404 like an old tailscaled.
    """

    def __init__(self, status=None, ping_for=None, record_requests=True, ipn_bus=False) -> None:
        self.dir = tempfile.mkdtemp(prefix="fake-ts-")
        self.socket_path = os.path.join(self.dir, "tailscaled.sock")
        self.status = status if status is not None else recorded("status_direct.json")
        self.prefs = {"ControlURL": "http://10.250.0.1:8080", "Hostname": "robota"}
        self.ping = recorded("ping_direct.json")
        self.ping_for = ping_for
        self.record_requests = record_requests
        self.mode = "good"
        self.requests = []
        self.counts = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.ipn_bus = ipn_bus
        self._bus_queues = []       # one queue per open watch-ipn-bus stream
        self._generation = 0        # bumped by stop(): open streams end like tailscaled's would
        fake = self

        def note(method, path, host):
            with fake._lock:
                key = f"{method} {path.split('?')[0]}"
                fake.counts[key] = fake.counts.get(key, 0) + 1
                if fake.record_requests:
                    fake.requests.append((method, path, host))

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _misbehave(self):
                """Answer as the current mode says; True when the request is dealt with."""
                mode = fake.mode
                if mode == "good" or mode == "huge" and self.path != "/localapi/v0/status":
                    return False
                self.close_connection = True
                if mode == "garbage":
                    self.wfile.write(b"\x00\xffthis is not HTTP\r\n\r\n")
                elif mode == "truncated":
                    body = status_body(fake.status)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                elif mode == "huge":
                    self._send(200, huge_status(fake.status))
                elif mode == "hang":  # like a wedged daemon: this request never gets an answer
                    fake._closing.wait()
                elif mode == "trickle":
                    body = status_body(fake.status)
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    for i in range(len(body)):
                        if fake._closing.wait(0.1):
                            break
                        try:
                            self.wfile.write(body[i:i + 1])
                            self.wfile.flush()
                        except OSError:
                            break
                elif mode == "http500":
                    self._send(500, {"error": "internal error: backend is wedged"})
                # "close": nothing at all
                return True

            def _bus(self):
                """watch-ipn-bus: chunked JSON lines until stop() or close()."""
                generation = fake._generation
                q = queue.Queue()
                with fake._lock:
                    fake._bus_queues.append(q)
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    q.put({"State": 6})
                    while not fake._closing.is_set() and generation == fake._generation:
                        try:
                            obj = q.get(timeout=0.2)
                        except queue.Empty:
                            continue
                        line = json.dumps(obj).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                except OSError:
                    pass
                finally:
                    with fake._lock:
                        fake._bus_queues.remove(q)

            def do_GET(self):
                note("GET", self.path, self.headers.get("Host"))
                if self._misbehave():
                    return
                if self.path.startswith("/localapi/v0/watch-ipn-bus") and fake.ipn_bus:
                    self._bus()
                elif self.path == "/localapi/v0/status":
                    self._send(200, status_body(fake.status))
                elif self.path == "/localapi/v0/prefs":
                    self._send(200, fake.prefs)
                elif self.path == "/localapi/v0/derpmap":
                    self._send(200, {"Regions": {"999": {"RegionID": 999, "RegionCode": "lab"}}})
                else:
                    self._send(404, b"not found\n")

            def do_POST(self):
                note("POST", self.path, self.headers.get("Host"))
                if self._misbehave():
                    return
                if self.path.startswith("/localapi/v0/ping"):
                    if fake.ping_for is not None:
                        ip = parse_qs(urlparse(self.path).query).get("ip", [""])[0]
                        self._send(200, fake.ping_for(ip))
                    else:
                        self._send(200, fake.ping)
                else:
                    self._send(404, b"not found\n")

            def client_address_string(self):
                return "unix"

        self._handler = Handler
        self.server = None
        self.start()

    def start(self) -> None:
        """Serve on socket_path (again, after stop())."""
        self.server = _Server(self.socket_path, self._handler)
        # shutdown() returns at the serve loop's next poll: 0.5 s by default, paid by every test
        # that stops the fake (teardown, a tailscaled restart); 20 ms costs nothing while idle
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def notify(self, obj: dict) -> None:
        """Send one ipn.Notify object to every open watch-ipn-bus stream."""
        with self._lock:
            for q in self._bus_queues:
                q.put(obj)

    def stop(self) -> None:
        """tailscaled gone: stop serving and remove the socket (clients get 'no such socket')."""
        self._generation += 1
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)

    def close(self) -> None:
        self._closing.set()
        self.stop()
        os.rmdir(self.dir)


