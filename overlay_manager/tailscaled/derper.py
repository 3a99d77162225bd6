"""This machine as a DERP server of the fleet: read its derper's own counters.

A derper host's robot config has ``derper: {url: http://127.0.0.1:3340, region: east}`` (the
fleet bundle writes it for the hosts in the fleet file's ``derp_regions``; fleet/derp.py). The
node does not start derper (systemd's derper.service or the lab does); it reads derper's expvar
page ``GET <url>/debug/vars`` (JSON; tailscale v1.102.5 cmd/derper serves it on its plain-HTTP
listener to loopback and tailnet addresses), whose ``derp`` object holds the server's counters:

- ``gauge_current_connections``: client connections now (each machine keeps one to its home
  region and one to every other region it sends through);
- ``gauge_current_home_connections``: of those, machines whose home region this is;
- ``gauge_clients_total``: distinct client keys (the mesh included);
- ``bytes_received``, ``bytes_sent``: bytes relayed since start;
- ``packets_received``, ``packets_sent``: packets relayed since start;
- ``accepts``: connections accepted since start;
- ``home_moves_in``, ``home_moves_out``: clients that made this their home region / left it.

:func:`read_derper` does one bounded read and never raises; :func:`parse_derper_vars` is the pure
part.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from overlay_manager.core.config import DerperSettings
from overlay_manager.core.json_fields import uint_field

#: Seconds one read of derper's /debug/vars may take.
READ_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class DerperState:
    """This machine's derper as last read.

    Attributes:
        listening: derper answered its debug page on the last read.
        connections: client connections now (``gauge_current_connections``).
        home_connections: clients whose home region this is (``gauge_current_home_connections``).
        clients: distinct client keys (``gauge_clients_total``).
        bytes_received: bytes received from clients since derper started.
        bytes_sent: bytes sent to clients since derper started.
        packets_received: packets received since derper started.
        packets_sent: packets sent since derper started.
        version: derper's version string ("" = unknown).
        read_at: time.time() of the last read (0 = never).
        error: why the last read failed ("" = it worked).
    """

    listening: bool = False
    connections: int = 0
    home_connections: int = 0
    clients: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    packets_received: int = 0
    packets_sent: int = 0
    version: str = ""
    read_at: float = 0.0
    error: str = ""


def parse_derper_vars(data: Any, now: float) -> DerperState:
    """/debug/vars JSON (already decoded) -> DerperState; an error state when it has no ``derp``."""
    derp = data.get("derp") if isinstance(data, Mapping) else None
    if not isinstance(derp, Mapping):
        return DerperState(read_at=now, error="no 'derp' counters in /debug/vars (not a derper?)")
    version = derp.get("version")
    return DerperState(
        listening=True, connections=uint_field(derp, "gauge_current_connections"),
        home_connections=uint_field(derp, "gauge_current_home_connections"),
        clients=uint_field(derp, "gauge_clients_total"), bytes_received=uint_field(derp, "bytes_received"),
        bytes_sent=uint_field(derp, "bytes_sent"), packets_received=uint_field(derp, "packets_received"),
        packets_sent=uint_field(derp, "packets_sent"), version=version if isinstance(version, str) else "",
        read_at=now)


def read_derper(settings: DerperSettings, timeout: float = READ_TIMEOUT_S) -> DerperState:
    """One bounded read of ``<url>/debug/vars``; never raises (the error is in the state)."""
    now = time.time()
    try:
        with urllib.request.urlopen(f"{settings.url}/debug/vars", timeout=timeout) as resp:  # noqa: S310 - http to localhost
            body = resp.read(4 * 1024 * 1024)
        return parse_derper_vars(json.loads(body.decode("utf-8", errors="replace")), now)
    except urllib.error.HTTPError as exc:
        return DerperState(read_at=now, error=f"derper at {settings.url} answered HTTP {exc.code}")
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return DerperState(read_at=now, error=f"derper at {settings.url} not answering: {reason}")


def derper_summary(settings: Optional[DerperSettings], state: DerperState) -> Tuple[str, bool]:
    """(one line for ~status and /diagnostics, ok). ("", True) when this machine runs no derper."""
    if settings is None:
        return "", True
    region = f" region {settings.region}" if settings.region else ""
    if not state.listening:
        return f"derper{region}: {state.error or 'not read yet'}", False
    return (f"derper{region}: {state.connections} connections ({state.home_connections} home), "
            f"{state.clients} clients, {state.bytes_received / 1e6:.1f} MB in / "
            f"{state.bytes_sent / 1e6:.1f} MB out", True)
