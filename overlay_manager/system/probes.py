"""Name and port probes of this machine: what its resolver answers and whether a TCP port answers.

The preflight checks (monitor.diagnose.preflight_checks) judge what these return; the probes
themselves do the I/O (DNS lookups, one TCP connect).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Tuple


def resolve(name: str) -> Tuple[str, ...]:
    """Addresses name resolves to on this machine (empty when it does not resolve)."""
    try:
        return tuple(sorted({ai[4][0] for ai in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}))
    except (socket.gaierror, UnicodeError):
        return ()


def tcp_answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """True when a TCP connection to host:port succeeds within timeout_s seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class NameLookups:
    """What this machine saw of its ROS names (one preflight's probes).

    Attributes:
        own: addresses this machine's ROS_HOSTNAME resolves to (empty: it does not resolve).
        master: addresses the master's name resolves to (empty: it does not resolve).
        master_answers: the master's XML-RPC port accepted a TCP connection (within timeout_s).
    """

    own: Tuple[str, ...]
    master: Tuple[str, ...]
    master_answers: bool


def look_up_names(own_name: str, master: str, master_port: int, timeout_s: float = 2.0) -> NameLookups:
    """Resolve own_name and master, and try master:master_port when master resolves (timeout_s s)."""
    maddrs = resolve(master)
    return NameLookups(own=resolve(own_name), master=maddrs,
                       master_answers=bool(maddrs) and tcp_answers(master, master_port, timeout_s))
