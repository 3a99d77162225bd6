"""tailscaled's IPN bus (``GET /localapi/v0/watch-ipn-bus?mask=N``): a stream of ipn.Notify JSON
objects, one per line, for as long as the connection stays open.

What the bus carries in tailscale v1.102.5 (ipn/backend.go, ipn/ipnlocal/local.go), and so what
it can replace in a status poll:
- ``State`` (NotifyInitialState gives the current one at once), ``ErrMessage``, ``Health``,
  ``Prefs``, ``LoginFinished``;
- peer-set changes from the control server: ``PeersChanged`` / ``PeersRemoved``
  (NotifyPeerChanges) and narrow per-field patches ``PeerChangedPatch`` (NotifyPeerPatches:
  Online, LastSeen, DERPHome, Endpoints), i.e. a peer going offline or coming back;
- WireGuard session states per peer, ``PeerState`` (NotifyPeerWireGuardState);
- ``Engine`` byte counters every 2 s (NotifyWatchEngineUpdates; not asked for here: at 500
  peers each one lists every live peer).
It does NOT carry a peer's current path (magicsock's CurAddr / PeerRelay): a switch between
direct, peer-relay and DERP is seen only in ``/localapi/v0/status``. So the bus makes the node
read the status at once when something changed, and the periodic status read stays the way
path switches are found.

``BusWatcher`` runs one daemon thread that keeps a connection open (reconnecting after
``retry_s`` when tailscaled goes away) and calls ``on_change(kinds)`` for every notification that
says something changed. The callback runs on the watcher's thread and must not block (the node's
sets an event). Nothing here holds a lock while reading.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from overlay_manager.tailscaled.localapi import DEFAULT_SOCKET, LOCALAPI_HOST

# ipn.NotifyWatchOpt bits (tailscale v1.102.5 ipn/backend.go)
NOTIFY_WATCH_ENGINE_UPDATES = 1 << 0
NOTIFY_INITIAL_STATE = 1 << 1
NOTIFY_INITIAL_PREFS = 1 << 2
NOTIFY_INITIAL_NETMAP = 1 << 3
NOTIFY_INITIAL_HEALTH_STATE = 1 << 7
NOTIFY_RATE_LIMIT = 1 << 8
NOTIFY_PEER_CHANGES = 1 << 12
NOTIFY_NO_NETMAP = 1 << 13
NOTIFY_PEER_PATCHES = 1 << 15
NOTIFY_PEER_WIREGUARD_STATE = 1 << 18

DEFAULT_MASK = (NOTIFY_INITIAL_STATE | NOTIFY_PEER_CHANGES | NOTIFY_PEER_PATCHES | NOTIFY_NO_NETMAP
                | NOTIFY_PEER_WIREGUARD_STATE)
"""State, peer adds/removes/patches and WireGuard session states; no engine counters, no netmap."""

# Notify field -> the kind of change it announces
_KINDS: Tuple[Tuple[str, str], ...] = (
    ("State", "state"),
    ("ErrMessage", "error"),
    ("LoginFinished", "login"),
    ("Prefs", "prefs"),
    ("Health", "health"),
    ("NetMap", "netmap"),
    ("PeersChanged", "peers"),
    ("PeersRemoved", "peers"),
    ("PeerChangedPatch", "peer-patch"),
    ("SelfChange", "self"),
    ("PeerState", "wireguard"),
)


def change_kinds(notify: Any) -> Tuple[str, ...]:
    """The kinds of change one ipn.Notify object announces (sorted, unique); () for notifications
    that change nothing the status shows (Engine counters, Version, BrowseToURL, ...) and for
    anything that is not a JSON object."""
    if not isinstance(notify, Mapping):
        return ()
    kinds = {kind for key, kind in _KINDS if notify.get(key) not in (None, "", [], {})}
    return tuple(sorted(kinds))


class BusWatcher:
    """Keeps tailscaled's IPN bus open and reports changes.

    Args:
        socket_path: tailscaled's LocalAPI socket.
        on_change: called with the change kinds of each notification that changed something;
            runs on the watcher's thread, must not block.
        mask: ipn.NotifyWatchOpt bits.
        retry_s: seconds between reconnection attempts while tailscaled does not answer.
        connect_timeout_s: timeout of connecting and of the response headers.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET,
                 on_change: Callable[[Tuple[str, ...]], None] = lambda _kinds: None,
                 mask: int = DEFAULT_MASK, retry_s: float = 2.0, connect_timeout_s: float = 3.0) -> None:
        """Nothing runs until start()."""
        self.socket_path = socket_path
        self.on_change = on_change
        self.mask = mask
        self.retry_s = retry_s
        self.connect_timeout_s = connect_timeout_s
        self._stop = threading.Event()
        self._lock = threading.Lock()   # guards the plain values below and _sock (no I/O under it)
        self._sock: Optional[socket.socket] = None
        self._connected = False
        self._error = ""
        self._notifications = 0
        self._changes = 0
        self._connects = 0
        self._thread = threading.Thread(target=self._run, name="overlay-ipnbus", daemon=True)

    # ----- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the watcher thread."""
        self._thread.start()

    def stop(self) -> None:
        """End the thread: closes the connection so a blocked read returns at once."""
        self._stop.set()
        with self._lock:
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def join(self, timeout_s: float) -> None:
        """Wait up to timeout_s seconds for the thread to end."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # ----- state ----------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """The bus is open and tailscaled answered it."""
        with self._lock:
            return self._connected

    def stats(self) -> Dict[str, Any]:
        """connected, last error, counts of connections, notifications and change reports."""
        with self._lock:
            return {"connected": self._connected, "error": self._error, "connects": self._connects,
                    "notifications": self._notifications, "changes": self._changes}

    # ----- thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_once()
            except OSError as exc:
                self._set(connected=False, error=f"IPN bus at {self.socket_path}: {exc.strerror or exc}")
            except ValueError as exc:  # a malformed HTTP answer
                self._set(connected=False, error=f"IPN bus at {self.socket_path}: {exc}")
            finally:
                with self._lock:
                    sock, self._sock = self._sock, None
                    self._connected = False
                if sock is not None:
                    sock.close()
            self._stop.wait(self.retry_s)

    def _set(self, connected: bool, error: str) -> None:
        with self._lock:
            self._connected, self._error = connected, error

    def _watch_once(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._lock:
            self._sock = sock
        if self._stop.is_set():
            return
        sock.settimeout(self.connect_timeout_s)
        sock.connect(self.socket_path)
        request = (f"GET /localapi/v0/watch-ipn-bus?mask={self.mask} HTTP/1.1\r\n"
                   f"Host: {LOCALAPI_HOST}\r\nAccept: application/json\r\n\r\n")
        sock.sendall(request.encode("ascii"))
        reader = sock.makefile("rb")
        status = reader.readline(1024).decode("latin-1").split()
        if len(status) < 2 or not status[1].isdigit():
            raise ValueError(f"not an HTTP answer: {' '.join(status)[:80]!r}")
        headers = _read_headers(reader)
        if status[1] != "200":
            body = reader.read(300).decode("utf-8", "replace")
            raise ValueError(f"HTTP {status[1]}: {body.strip()[:200]}")
        chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        sock.settimeout(None)  # the bus is quiet for as long as nothing changes; stop() ends reads
        with self._lock:
            self._connects += 1
        self._set(connected=True, error="")
        for line in (_chunked_lines(reader) if chunked else iter(reader.readline, b"")):
            if self._stop.is_set():
                return
            self._handle(line)

    def _handle(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        try:
            notify = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            return  # garbage on the bus: ignored (the periodic status read still runs)
        kinds = change_kinds(notify)
        with self._lock:
            self._notifications += 1
            if kinds:
                self._changes += 1
        if kinds:
            self.on_change(kinds)


def _read_headers(reader: Any) -> Dict[str, str]:
    headers: Dict[str, str] = {}
    for _ in range(100):
        line = reader.readline(8192).decode("latin-1").strip()
        if not line:
            return headers
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    raise ValueError("too many HTTP header lines")


def _chunked_lines(reader: Any) -> Any:
    """Lines of a chunked HTTP body, as they arrive (a notification may span chunks)."""
    pending = b""
    while True:
        size_line = reader.readline(1024)
        if not size_line:
            return
        try:
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        except ValueError:
            raise ValueError(f"bad chunk size {size_line[:40]!r}") from None
        if size == 0:
            return
        data = _read_exact(reader, size)
        reader.readline(8)  # the CRLF after the chunk
        pending += data
        *lines, pending = pending.split(b"\n")
        yield from lines


def _read_exact(reader: Any, size: int) -> bytes:
    parts: List[bytes] = []
    while size > 0:
        part = reader.read(size)
        if not part:
            raise OSError("connection closed inside a chunk")
        parts.append(part)
        size -= len(part)
    return b"".join(parts)

