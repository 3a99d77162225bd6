"""Unit-test helpers: recorded tailscaled JSON and a fake LocalAPI unix socket (tailscaled stand-in)."""
import copy
import json
import os
import socketserver
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

DATA = os.path.join(os.path.dirname(__file__), "..", "data")


def recorded(name: str) -> dict:
    """A recorded JSON document from test/data (deep copy)."""
    with open(os.path.join(DATA, name), encoding="utf-8") as fh:
        return copy.deepcopy(json.load(fh))


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class FakeTailscaled:
    """Serves status/prefs/ping JSON on a unix socket the way tailscaled's LocalAPI does.

    Args (all optional; the defaults serve the recorded two-machine tailnet):
        status: the status document to serve (default: test/data/status_direct.json).
        ping_for: ``ip -> ping result`` for POST /localapi/v0/ping?ip=...; default: the recorded
            ping_direct.json whatever the ip.
        record_requests: keep every request in ``requests`` (off for long benchmarks, where
            ``counts`` alone is kept: method+endpoint -> number of requests).
    """

    def __init__(self, status=None, ping_for=None, record_requests=True) -> None:
        self.dir = tempfile.mkdtemp(prefix="fake-ts-")
        self.socket_path = os.path.join(self.dir, "tailscaled.sock")
        self.status = status if status is not None else recorded("status_direct.json")
        self.prefs = {"ControlURL": "http://10.250.0.1:8080", "Hostname": "robota"}
        self.ping = recorded("ping_direct.json")
        self.ping_for = ping_for
        self.record_requests = record_requests
        self.requests = []
        self.counts = {}
        self._lock = threading.Lock()
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

            def do_GET(self):
                note("GET", self.path, self.headers.get("Host"))
                if self.path == "/localapi/v0/status":
                    self._send(200, fake.status)
                elif self.path == "/localapi/v0/prefs":
                    self._send(200, fake.prefs)
                elif self.path == "/localapi/v0/derpmap":
                    self._send(200, {"Regions": {"999": {"RegionID": 999, "RegionCode": "lab"}}})
                else:
                    self._send(404, b"not found\n")

            def do_POST(self):
                note("POST", self.path, self.headers.get("Host"))
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

        self.server = _Server(self.socket_path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        os.unlink(self.socket_path)
        os.rmdir(self.dir)


