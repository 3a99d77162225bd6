"""IPN bus parsing: which notifications count as changes, and the chunked stream (a notification
split over chunks, garbage lines, an HTTP error) from a stand-in socket server."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from typing import List, Tuple

from overlay_manager.system.waiting import wait_for
from overlay_manager.tailscaled.ipnbus import DEFAULT_MASK, BusWatcher, change_kinds


def test_change_kinds() -> None:
    assert change_kinds({"State": 6}) == ("state",)
    assert change_kinds({"Engine": {"RBytes": 1}, "Version": "1.102.5"}) == ()
    assert change_kinds({"PeerChangedPatch": [{"NodeID": 3, "Online": False}]}) == ("peer-patch",)
    assert change_kinds({"PeersChanged": [{}], "PeerState": {"n1": {}}}) == ("peers", "wireguard")
    assert change_kinds({"Health": {"Warnings": {}}}) == ("health",)
    assert change_kinds({"ErrMessage": ""}) == ()
    assert change_kinds(["not", "an", "object"]) == ()
    assert DEFAULT_MASK & 1 == 0  # no engine counters (every live peer, every 2 s)


def _serve(sock_path: str, body_chunks: List[bytes], status: str = "200 OK") -> socket.socket:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(4)

    def run() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.recv(4096)
            if not status.startswith("200"):
                conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: 9\r\n\r\nforbidden".encode())
                conn.close()
                continue
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            for chunk in body_chunks:
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                time.sleep(0.01)
            time.sleep(30)  # the bus stays open

    threading.Thread(target=run, daemon=True).start()
    return srv


def test_stream_split_chunks_and_garbage() -> None:
    d = tempfile.mkdtemp()
    path = os.path.join(d, "ts.sock")
    srv = _serve(path, [b'{"State": 6}\n{"Eng', b'ine": {}}\n', b"garbage\n", b'{"PeerChangedPatch": [{"Online"',
                        b': false}]}\n'])
    got: List[Tuple[str, ...]] = []
    w = BusWatcher(path, on_change=got.append, retry_s=0.1)
    w.start()
    try:
        wait_for("two changes from the stream", lambda: len(got) >= 2, 5, detail=lambda: str(got))
        assert got == [("state",), ("peer-patch",)]
        assert w.connected and w.stats()["notifications"] == 3
    finally:
        start = time.monotonic()
        w.stop()
        w.join(3)
        assert time.monotonic() - start < 1.0
        srv.close()


def test_http_error_is_reported_and_retried() -> None:
    d = tempfile.mkdtemp()
    path = os.path.join(d, "ts.sock")
    srv = _serve(path, [], status="403 Forbidden")
    w = BusWatcher(path, retry_s=0.05)
    w.start()
    try:
        wait_for("the HTTP error", lambda: "HTTP 403" in w.stats()["error"], 5, detail=lambda: str(w.stats()))
        assert not w.connected
    finally:
        w.stop()
        w.join(3)
        srv.close()


def test_missing_socket() -> None:
    w = BusWatcher("/nonexistent/ts.sock", retry_s=0.05)
    w.start()
    try:
        wait_for("the error for a missing socket", lambda: w.stats()["error"], 5)
        assert "/nonexistent/ts.sock" in w.stats()["error"]
    finally:
        w.stop()
        w.join(3)
