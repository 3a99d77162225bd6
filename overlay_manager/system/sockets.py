"""Listening TCP sockets of this network namespace, from /proc/net/tcp and /proc/net/tcp6.

Pure parsing (:func:`parse_proc_net_tcp`) plus one reader (:func:`read_listeners`), so the node
can tell on which addresses a port (rosbridge's websocket) is reachable without any tool or
privilege: every process may read /proc/net/tcp of its own network namespace.

The kernel prints each socket as ``sl local_address rem_address st ...``; ``local_address`` is
``ADDR:PORT`` with ADDR the address's 32-bit words as hexadecimal numbers in host byte order
(one word for IPv4, four for IPv6) and PORT in hexadecimal; ``st`` 0A is LISTEN.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Iterable, List, Tuple

PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
"""The kernel's TCP socket tables of the reading process's network namespace (IPv4, IPv6)."""
TCP_LISTEN = 0x0A
"""The ``st`` value of a listening socket (include/net/tcp_states.h: TCP_LISTEN)."""


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


def parse_proc_net_tcp(text: str) -> List[Listener]:
    """The listening sockets of one /proc/net/tcp or /proc/net/tcp6 text (header line skipped).

    Lines that do not have the kernel's layout are skipped (the file is the kernel's; a
    truncated last line of a racing read must not hide the other sockets).
    """
    out: List[Listener] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or ":" not in fields[1]:
            continue
        try:
            if int(fields[3], 16) != TCP_LISTEN:
                continue
            hex_addr, hex_port = fields[1].split(":")
            out.append(Listener(_address(hex_addr), int(hex_port, 16)))
        except ValueError:
            continue
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
