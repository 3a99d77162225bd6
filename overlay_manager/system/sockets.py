"""TCP sockets of this network namespace: the listening ones (from /proc/net/tcp and
/proc/net/tcp6) and the remote ends of the established IPv4 ones (from the kernel's sock_diag
netlink interface, /proc/net/tcp when that is not available).

Pure parsing (:func:`parse_proc_net_tcp`, :func:`parse_established`, :func:`parse_diag_dump`) plus readers
(:func:`read_listeners`, :func:`established_remotes`), so the node can tell on which addresses a
port (rosbridge's websocket) is reachable and whether tailscaled holds its connection to a derper
without any tool or privilege: every process may read both for its own network namespace.

Why two sources: a read of /proc/net/tcp walks the kernel's whole TCP hash tables and formats every
socket as text, 4-5 ms of CPU on a machine with a few GB of memory even when the namespace has one
socket; a sock_diag dump restricted to ESTABLISHED sockets costs about 0.2 ms plus a few
microseconds per socket. The listeners are read rarely (preflight); the established sockets every
``node.home_check_interval`` (0.5 s).

The kernel prints each socket as ``sl local_address rem_address st ...``; ``local_address`` is
``ADDR:PORT`` with ADDR the address's 32-bit words as hexadecimal numbers in host byte order
(one word for IPv4, four for IPv6) and PORT in hexadecimal; ``st`` 0A is LISTEN.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Tuple

PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
"""The kernel's TCP socket tables of the reading process's network namespace (IPv4, IPv6)."""
TCP_LISTEN = 0x0A
"""The ``st`` value of a listening socket (include/net/tcp_states.h: TCP_LISTEN)."""
TCP_ESTABLISHED = 0x01
"""The ``st`` value (and sock_diag state) of an established connection (TCP_ESTABLISHED)."""


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: the local address it is bound to and its port.

    address: textual IP address (``0.0.0.0`` / ``::`` = every address of the machine).
    """

    address: str
    port: int

    @property
    def wildcard(self) -> bool:
        """Bound to every address (0.0.0.0 or ::)."""
        return ipaddress.ip_address(self.address).is_unspecified

    @property
    def loopback(self) -> bool:
        """Bound to a loopback address (127.0.0.0/8, ::1, or ::ffff:127.x): this machine only."""
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback


def _address(hex_addr: str) -> str:
    """The kernel's hexadecimal address (host-order 32-bit words) -> textual IP address."""
    if len(hex_addr) == 8:
        return socket.inet_ntop(socket.AF_INET, struct.pack("=I", int(hex_addr, 16)))
    if len(hex_addr) == 32:
        words = [int(hex_addr[i:i + 8], 16) for i in range(0, 32, 8)]
        return socket.inet_ntop(socket.AF_INET6, struct.pack("=4I", *words))
    raise ValueError(f"address {hex_addr!r} is neither 8 nor 32 hexadecimal digits")


def _rows(text: str, state: int) -> Iterator[Tuple[str, str]]:
    """(local, remote) ``ADDR:PORT`` fields of the rows in ``state`` of one /proc/net/tcp or
    /proc/net/tcp6 text (header line skipped). Lines that do not have the kernel's layout are
    skipped (the file is the kernel's; a truncated last line of a racing read must not hide the
    other sockets)."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or ":" not in fields[1] or ":" not in fields[2]:
            continue
        try:
            if int(fields[3], 16) == state:
                yield fields[1], fields[2]
        except ValueError:
            continue


def _endpoint(field: str) -> Tuple[str, int]:
    """``ADDR:PORT`` as the kernel prints it -> (textual address, port); ValueError if malformed."""
    hex_addr, hex_port = field.split(":")
    return _address(hex_addr), int(hex_port, 16)


def parse_proc_net_tcp(text: str) -> List[Listener]:
    """The listening sockets of one /proc/net/tcp or /proc/net/tcp6 text (malformed lines skipped)."""
    out: List[Listener] = []
    for local, _ in _rows(text, TCP_LISTEN):
        try:
            out.append(Listener(*_endpoint(local)))
        except ValueError:
            continue
    return out


def parse_established(text: str) -> List[Tuple[str, int]]:
    """(remote IPv4 address, port) of every ESTABLISHED connection in one /proc/net/tcp text
    (malformed lines and IPv6 rows skipped)."""
    out: List[Tuple[str, int]] = []
    for _, remote in _rows(text, TCP_ESTABLISHED):
        try:
            address, port = _endpoint(remote)
        except ValueError:
            continue
        if ":" not in address:
            out.append((address, port))
    return out


def read_listeners(paths: Iterable[str] = PROC_NET_TCP) -> Tuple[List[Listener], str]:
    """Every listening TCP socket of this namespace, and "" or why a table could not be read
    (tcp6 is missing on a kernel without IPv6: not an error). Reads local files only."""
    out: List[Listener] = []
    errors: List[str] = []
    for path in paths:
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                out.extend(parse_proc_net_tcp(fh.read()))
        except FileNotFoundError:
            if not path.endswith("6"):
                errors.append(f"{path} does not exist")
        except OSError as exc:
            errors.append(f"cannot read {path}: {exc.strerror or exc}")
    return out, "; ".join(errors)


def on_port(listeners: Iterable[Listener], port: int) -> List[Listener]:
    """The listeners on one TCP port, sorted by address (duplicates, e.g. SO_REUSEPORT, once)."""
    return sorted({x for x in listeners if x.port == port}, key=lambda x: (":" in x.address, x.address))


# ---- established IPv4 connections (sock_diag) ---------------------------------------------------
# linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x01
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
_NLMSGHDR = struct.Struct("=IHHII")
"""struct nlmsghdr: length, type, flags, sequence number, port id."""
_DIAG_REQ_V2 = struct.Struct("=BBBBI48s")
"""struct inet_diag_req_v2: family, protocol, extensions, pad, state mask, socket id (48 bytes,
zero: every socket)."""
_DIAG_MSG = struct.Struct("!BBBBHH16s16s")
"""The head of struct inet_diag_msg: family, state, timer, retransmits, then the socket id's source
port, destination port (network order), source and destination addresses (16 bytes each; IPv4
uses the first 4)."""
DIAG_RECV_BYTES = 1 << 16
"""Bytes asked of each recv (the kernel sends a dump in messages of at most a page or so each)."""


def parse_diag_dump(data: bytes, seq: int) -> Tuple[List[Tuple[str, int]], bool]:
    """One recv of a sock_diag IPv4 dump -> ((remote address, port) of each socket in it, whether
    the dump ended (NLMSG_DONE)). Messages of another sequence number are skipped.

    Raises:
        OSError: the kernel answered an error (its errno), or a message is cut short.
    """
    out: List[Tuple[str, int]] = []
    pos = 0
    while pos + _NLMSGHDR.size <= len(data):
        length, kind, _flags, mseq, _pid = _NLMSGHDR.unpack_from(data, pos)
        if length < _NLMSGHDR.size or pos + length > len(data):
            raise OSError(errno.EPROTO, f"sock_diag: a message of {length} bytes at byte {pos} of {len(data)}")
        body = pos + _NLMSGHDR.size
        if mseq == seq:
            if kind == NLMSG_DONE:
                return out, True
            if kind == NLMSG_ERROR:
                code = -struct.unpack_from("=i", data, body)[0] if length >= _NLMSGHDR.size + 4 else errno.EPROTO
                raise OSError(code, f"sock_diag: {os.strerror(code)}")
            if kind == SOCK_DIAG_BY_FAMILY and length >= _NLMSGHDR.size + _DIAG_MSG.size:
                family, _state, _t, _r, _sport, dport, _src, dst = _DIAG_MSG.unpack_from(data, body)
                if family == socket.AF_INET:
                    out.append((socket.inet_ntoa(dst[:4]), dport))
        pos += (length + 3) & ~3  # NLMSG_ALIGN
    return out, False


def _diag_established(timeout_s: float) -> List[Tuple[str, int]]:
    """(remote address, port) of every ESTABLISHED IPv4 TCP socket of this network namespace, by a
    sock_diag dump. Raises OSError when netlink or sock_diag is not available."""
    seq = 1
    request = _DIAG_REQ_V2.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 1 << TCP_ESTABLISHED, bytes(48))
    header = _NLMSGHDR.pack(_NLMSGHDR.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(timeout_s)
        nl.sendto(header + request, (0, 0))
        out: List[Tuple[str, int]] = []
        while True:
            part, done = parse_diag_dump(nl.recv(DIAG_RECV_BYTES), seq)
            out.extend(part)
            if done:
                return out


def established_remotes(proc_net_tcp: Optional[str] = None, timeout_s: float = 1.0) -> List[Tuple[str, int]]:
    """(remote IPv4 address, port) of every ESTABLISHED TCP connection of this network namespace:
    a sock_diag dump (answered within timeout_s seconds), else the text of ``proc_net_tcp``
    (default /proc/net/tcp). Raises OSError only when neither can be read."""
    if proc_net_tcp is None:
        try:
            return _diag_established(timeout_s)
        except OSError:
            proc_net_tcp = PROC_NET_TCP[0]
    with open(proc_net_tcp, encoding="ascii", errors="replace") as fh:
        return parse_established(fh.read())
