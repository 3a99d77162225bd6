"""nftables rule that keeps rosbridge's websocket port to loopback and the overlay interface.

rosbridge_suite's ROS 1 server (0.11.x) listens on every interface whatever its ``~address``
says (it passes no interface to Twisted's ``listenWS``). This table of our own drops TCP to the
port unless it arrives on loopback or the overlay interface (tailscaled's TUN, ``tailscale0``):

    table inet overlay_manager {
        chain rosbridge_input {
            type filter hook input priority filter - 10; policy accept;
            tcp dport 9090 iifname "lo" accept
            tcp dport 9090 iifname "tailscale0" accept
            tcp dport 9090 counter drop
        }
    }

It touches nothing else: other traffic is accepted by this chain and judged by the machine's
own firewall as before (a packet passes every base chain of a hook; a drop in any is final).
``inet`` covers IPv4 and IPv6. ``iifname`` matches by name, so the rule is valid before
tailscaled creates its interface. Installed by ``overlay_env --rosbridge-firewall PORT`` (root),
removed by ``overlay_env --rosbridge-firewall 0``.

Pure text (:func:`ruleset`, :func:`parse_listing`) plus two thin runners of ``nft``.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Optional, Tuple

from overlay_manager.core.commands import OVERLAY_ENV_AS_ROOT
from overlay_manager.system import children

TABLE = "inet overlay_manager"
"""The nftables table (family and name) this module owns; nothing else is ever changed."""
CHAIN = "rosbridge_input"
OVERLAY_INTERFACE = "tailscale0"
"""tailscaled's TUN interface on Linux (its --tun default)."""
NFT_TIMEOUT_S = 5.0
"""Seconds an nft call may take before it is killed."""
_IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # IFNAMSIZ - 1 characters, no quotes or spaces

# what `overlay_env` and the node print as the fix (the one root form of overlay_env: core/commands.py)
FIX = (f"`{OVERLAY_ENV_AS_ROOT} --rosbridge-firewall {{port}}` "
       "(installs the nftables table inet overlay_manager; docs/install.md)")


class FirewallError(Exception):
    """nft is missing, refused the rules (not root), or the arguments are invalid."""


def check_args(port: int, interface: str) -> None:
    """Raise FirewallError for a port outside 1..65535 or an interface name nft cannot take."""
    if not isinstance(port, int) or not 0 < port < 65536:
        raise FirewallError(f"rosbridge port {port!r} is not a TCP port (1..65535)")
    if not _IFNAME.match(interface):
        raise FirewallError(f"overlay interface {interface!r} is not an interface name "
                            "(1-15 characters: letters, digits, '_', '.', '-')")


def ruleset(port: int, interface: str = OVERLAY_INTERFACE) -> str:
    """``nft -f`` input that (re)creates the table: the port on lo and ``interface`` only.

    The leading ``table``/``delete table`` pair makes it idempotent (nft applies a file in one
    transaction: the old table is replaced, never left half-written).
    """
    check_args(port, interface)
    return "\n".join([
        "# overlay_manager: rosbridge's websocket on loopback and the overlay only",
        f"table {TABLE}",
        f"delete table {TABLE}",
        f"table {TABLE} {{",
        f"  chain {CHAIN} {{",
        "    type filter hook input priority filter - 10; policy accept;",
        f'    tcp dport {port} iifname "lo" accept',
        f'    tcp dport {port} iifname "{interface}" accept',
        f"    tcp dport {port} counter drop",
        "  }",
        "}",
        "",
    ])


def removal() -> str:
    """``nft -f`` input that deletes the table if it exists (and does nothing otherwise)."""
    return f"table {TABLE}\ndelete table {TABLE}\n"


def _nft_file(text: str, nft: str) -> None:
    fd, path = tempfile.mkstemp(prefix="overlay_manager-", suffix=".nft")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            proc = children.run([nft, "-f", path], timeout_s=NFT_TIMEOUT_S)
        except FileNotFoundError:
            raise FirewallError(f"{nft} not found: install nftables (apt install nftables)") from None
        except subprocess.TimeoutExpired:
            raise FirewallError(f"{nft} -f did not finish within {NFT_TIMEOUT_S:.0f} s") from None
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout or "").strip().splitlines()
        why = err[0] if err else f"exit status {proc.returncode}"
        hint = (f" (needs root: run it through sudo, `{OVERLAY_ENV_AS_ROOT} --rosbridge-firewall ...`)"
                if "not permitted" in why.lower() else "")
        raise FirewallError(f"nft refused the rules: {why}{hint}")


def apply(port: int, interface: str = OVERLAY_INTERFACE, nft: str = "nft") -> str:
    """Install (port 1..65535) or remove (port 0) the table; returns what was done, one line.

    Raises:
        FirewallError: bad arguments, nft missing, or nft refused (e.g. not root).
    """
    if port == 0:
        _nft_file(removal(), nft)
        return f"nftables table {TABLE} removed: the rosbridge port is no longer restricted"
    _nft_file(ruleset(port, interface), nft)
    return (f"nftables table {TABLE}: TCP port {port} accepted on lo and {interface} only, "
            "dropped on every other interface")


@dataclass(frozen=True)
class Restriction:
    """Whether the table restricts a port, as far as this process can tell.

    state: ``restricted`` (the drop rule for the port is there), ``missing`` (nft answered: no
        table, or no drop rule for this port) or ``unknown`` (nft could not be asked: not root,
        not installed, timed out).
    detail: one line: the interfaces accepted, or why it cannot tell.
    """

    state: str
    detail: str


RESTRICTED, MISSING, UNKNOWN = "restricted", "missing", "unknown"


def parse_listing(text: str, port: int) -> Tuple[bool, Tuple[str, ...]]:
    """``nft list table inet overlay_manager`` output -> (a rule drops TCP to ``port`` from any
    interface not accepted before it, the interfaces accepted for the port)."""
    accepted = []
    drops = False
    prefix = f"tcp dport {port} "
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith(prefix):
            continue
        m = re.match(r'^tcp dport \d+ iifname "([^"]+)" accept$', line)
        if m:
            accepted.append(m.group(1))
        elif line.endswith(" drop") and "iifname" not in line and "iif " not in line:
            drops = True
    return drops, tuple(accepted)


def read_restriction(port: int, nft: str = "nft") -> Restriction:
    """Ask nft whether :data:`TABLE` drops ``port`` beyond lo and the overlay (needs root or
    CAP_NET_ADMIN; without them the answer is ``unknown``). Bounded by NFT_TIMEOUT_S."""
    try:
        proc = children.run([nft, "list", "table", *TABLE.split()], timeout_s=NFT_TIMEOUT_S)
    except FileNotFoundError:
        return Restriction(UNKNOWN, f"cannot tell whether nftables restricts it: {nft} is not installed")
    except subprocess.TimeoutExpired:
        return Restriction(UNKNOWN, f"cannot tell whether nftables restricts it: {nft} did not answer "
                                    f"within {NFT_TIMEOUT_S:.0f} s")
    err = (proc.stderr or "").strip()
    if proc.returncode != 0:
        if "no such file" in err.lower():
            return Restriction(MISSING, f"no nftables table {TABLE}")
        why = err.splitlines()[0] if err else f"exit status {proc.returncode}"
        if "not permitted" in why.lower():
            why = "reading nftables needs root (the node is not running as root)"
        return Restriction(UNKNOWN, f"cannot tell whether nftables restricts it: {why}")
    drops, accepted = parse_listing(proc.stdout or "", port)
    if not drops:
        return Restriction(MISSING, f"nftables table {TABLE} has no drop rule for TCP port {port}")
    return Restriction(RESTRICTED, f"nftables table {TABLE} accepts TCP port {port} only on "
                                   f"{', '.join(accepted) or 'no interface'}")


def fix(port: int) -> str:
    """The command that installs the restriction for ``port``."""
    return FIX.format(port=port)


def optional_port(value: Optional[str]) -> int:
    """``--rosbridge-firewall`` argument -> port (0 = remove); FirewallError for anything else."""
    try:
        port = int(str(value))
    except ValueError:
        raise FirewallError(f"--rosbridge-firewall {value!r}: give a TCP port (1..65535), or 0 to "
                            "remove the table") from None
    if not 0 <= port < 65536:
        raise FirewallError(f"--rosbridge-firewall {port}: not a TCP port (1..65535; 0 removes the table)")
    return port
