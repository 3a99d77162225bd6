"""The established-connection reader of system.sockets: a sock_diag dump against the real kernel
(loopback sockets this test opens), the /proc/net/tcp fallback, and the dump parser's errors."""

from __future__ import annotations

import errno
import socket
import struct
from typing import Iterator, List, Tuple

import pytest

from overlay_manager.system import sockets
from overlay_manager.system.sockets import established_remotes, parse_diag_dump, parse_established


@pytest.fixture
def connections() -> Iterator[List[Tuple[str, int]]]:
    """Three loopback connections to one listener; yields (127.0.0.1, listener port) per client."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    opened = []
    try:
        for _ in range(3):
            c = socket.create_connection(("127.0.0.1", port))
            a, _ = srv.accept()
            opened += [c, a]
        yield [("127.0.0.1", port)] * 3
    finally:
        for s in opened:
            s.close()
        srv.close()


def test_the_dump_finds_this_namespaces_connections(connections):
    got = sockets._diag_established(1.0)
    port = connections[0][1]
    assert got.count(("127.0.0.1", port)) == 3          # the three clients' remote end
    accepted = [r for r in got if r[0] == "127.0.0.1" and r[1] != port]
    assert len(accepted) >= 3                           # the accepted ends point at the clients' ports


def test_the_dump_and_proc_net_tcp_agree(connections):
    port = connections[0][1]
    ours = lambda remotes: sorted(r for r in remotes if r == ("127.0.0.1", port))  # noqa: E731
    assert ours(established_remotes()) == ours(established_remotes("/proc/net/tcp")) == connections


def test_a_closed_connection_is_gone(connections):
    port = connections[0][1]
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    other = srv.getsockname()[1]
    c = socket.create_connection(("127.0.0.1", other))
    a, _ = srv.accept()
    assert ("127.0.0.1", other) in established_remotes()
    for s in (c, a, srv):
        s.close()
    assert ("127.0.0.1", other) not in established_remotes()
    assert ("127.0.0.1", port) in established_remotes()


def test_without_netlink_it_reads_proc_net_tcp(monkeypatch, connections):
    def no_netlink(timeout_s: float) -> List[Tuple[str, int]]:
        raise OSError(errno.EAFNOSUPPORT, "no netlink here")

    monkeypatch.setattr(sockets, "_diag_established", no_netlink)
    assert ("127.0.0.1", connections[0][1]) in established_remotes()


def test_neither_source_is_an_oserror(monkeypatch, tmp_path):
    with pytest.raises(OSError):
        established_remotes(str(tmp_path / "missing"))


def _msg(kind: int, seq: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, 0, seq, 0) + body + bytes(-len(body) % 4)


def _sock(dst: str, dport: int) -> bytes:
    return struct.pack("!BBBBHH16s16s", socket.AF_INET, 1, 0, 0, 40000, dport, bytes(16),
                       socket.inet_aton(dst) + bytes(12)) + bytes(20)


def test_parse_reads_each_socket_and_the_end():
    data = (_msg(sockets.SOCK_DIAG_BY_FAMILY, 7, _sock("10.0.0.1", 443))
            + _msg(sockets.SOCK_DIAG_BY_FAMILY, 7, _sock("10.0.0.2", 8443)))
    assert parse_diag_dump(data, 7) == ([("10.0.0.1", 443), ("10.0.0.2", 8443)], False)
    assert parse_diag_dump(data + _msg(sockets.NLMSG_DONE, 7, bytes(4)), 7)[1] is True
    assert parse_diag_dump(_msg(sockets.SOCK_DIAG_BY_FAMILY, 8, _sock("10.0.0.3", 1)), 7) == ([], False)  # not ours


def test_parse_raises_the_kernels_error_and_on_a_cut_message():
    with pytest.raises(OSError) as exc:
        parse_diag_dump(_msg(sockets.NLMSG_ERROR, 1, struct.pack("=i", -errno.EPERM) + bytes(16)), 1)
    assert exc.value.errno == errno.EPERM and "sock_diag" in str(exc.value)
    whole = _msg(sockets.SOCK_DIAG_BY_FAMILY, 1, _sock("10.0.0.1", 443))
    with pytest.raises(OSError, match="bytes at byte 0"):
        parse_diag_dump(whole[:40], 1)


def test_parse_established_keeps_the_established_ipv4_rows():
    text = ("  sl  local_address rem_address   st tx_queue\n"
            "   0: 0100007F:906B 00000000:0000 0A 00000000:00000000\n"
            "   1: 0A0AE70A:B3C2 0A0AE70A:01BB 01 00000000:00000000\n"
            "   2: 0A0AE70A:B3C4 0B0AE70A:01BB 06 00000000:00000000\n"
            "   3: garbage\n")
    assert parse_established(text) == [("10.231.10.10", 443)]
