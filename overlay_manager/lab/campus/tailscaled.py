"""tailscaled on the lab's hosts: start and stop it, enrol hosts, read status, ``tailscale ping``.

One tailscaled per host namespace, in TUN mode (``tailscale0``) with its own statedir, socket and
log directory, on the port the packaged systemd unit uses (41641). Enrolment here
(:meth:`Tailscaleds.up`) is for tests and demos that need an overlay before a node runs; the
product enrols through overlay_manager.tailscaled.enrolment.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set

from overlay_manager.fleet.policy import visible
from overlay_manager.lab.campus import system
from overlay_manager.lab.campus.control import ControlServer
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import RunLayout, tools_bin
from overlay_manager.lab.campus.naming import TAILSCALE_PORT, TUN_NAME
from overlay_manager.lab.campus.processes import Processes
from overlay_manager.lab.campus.system import Echo, wait_for
from overlay_manager.system.waiting import tail
from overlay_manager.tailscaled.localapi import LocalAPI

TAILSCALED_START_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class PingResult:
    """Outcome of ``tailscale ping`` from one lab host to another."""

    path: str
    """``direct`` | ``derp`` | ``peer-relay`` | ``none`` (no pong at all)."""
    via: str
    """The endpoint ip:port for direct, the DERP region code for derp, the relay's
    ``ip:port:vni:N`` for peer-relay, "" for none."""
    latency_ms: float
    """Round trip of the last pong in milliseconds (0 when none)."""
    output: str
    """The CLI's full output."""


_PONG_RE = re.compile(r"pong from \S+ \(([^)]*)\) via (\S+)(?: \S+)* in ([0-9.]+)(µs|us|ms|s)")


def parse_ping_output(text: str) -> PingResult:
    """The path of the last pong printed by ``tailscale ping`` (pure; used by :meth:`Tailscaleds.ping`)."""
    last = None
    for m in _PONG_RE.finditer(text):
        last = m
    if last is None:
        return PingResult("none", "", 0.0, text)
    via, value, unit = last.group(2), float(last.group(3)), last.group(4)
    latency = value / 1000 if unit in ("µs", "us") else value * 1000 if unit == "s" else value
    dm = re.match(r"DERP\(([^)]*)\)", via)
    if dm:
        return PingResult("derp", dm.group(1), latency, text)
    pm = re.match(r"peer-relay\(([^)]*)\)", via)
    if pm:
        return PingResult("peer-relay", pm.group(1), latency, text)
    return PingResult("direct", via, latency, text)


class Tailscaleds:
    """The tailscaleds of one run.

    Args:
        layout: the run's paths and names.
        procs: where each tailscaled is tracked (key ``tailscaled:<host>``) and commands run.
        control: the run's control server (its fleet policy says which hosts see each other).
        echo: receives one line per action.
    """

    def __init__(self, layout: RunLayout, procs: Processes, control: ControlServer, echo: Echo) -> None:
        self.layout = layout
        self.procs = procs
        self.control = control
        self.echo = echo

    # --- the daemon -------------------------------------------------------------------------
    def start(self, host: str, extra_env: Optional[Mapping[str, str]] = None) -> subprocess.Popen:
        """Start the host's tailscaled (TUN ``tailscale0``, own statedir/socket/logs, port 41641);
        extra_env is added to its environment (e.g. a systemd drop-in's Environment=)."""
        lay = self.layout
        d = lay.host_dir(host)
        for sub in ("state", "logs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        argv = [str(tools_bin() / "tailscaled"), f"--tun={TUN_NAME}", f"--statedir={d / 'state'}",
                f"--socket={lay.socket_path(host)}", f"--port={TAILSCALE_PORT}", "--no-logs-no-support"]
        env = {**os.environ, "TS_LOGS_DIR": str(d / "logs"), "SSL_CERT_FILE": str(lay.ca_cert_path(host)),
               "HOME": str(d), **(extra_env or {})}
        return self.procs.spawn(f"tailscaled:{host}", lay.names.host_ns(host), argv, env, d / "tailscaled.log")

    def stop(self, host: str) -> None:
        """Stop the host's tailscaled (by pid)."""
        self.procs.stop(f"tailscaled:{host}")

    def localapi(self, host: str) -> LocalAPI:
        """overlay_manager.tailscaled.localapi.LocalAPI bound to the host's tailscaled socket."""
        return LocalAPI(str(self.layout.socket_path(host)), timeout=5.0)

    def status(self, host: str) -> Dict[str, Any]:
        """The host's tailscaled status (``tailscale status --json``) from its LocalAPI."""
        return self.localapi(host).status()

    def wait_started(self, host: str, timeout: float = TAILSCALED_START_TIMEOUT_S) -> None:
        """Wait up to ``timeout`` seconds until the host's tailscaled answers its LocalAPI."""
        proc = self.procs.procs.get(f"tailscaled:{host}")
        log = self.layout.host_dir(host) / "tailscaled.log"

        def ready() -> bool:
            if proc is not None and proc.poll() is not None:
                raise LabError(f"tailscaled of {host} exited with {proc.returncode}; {log} ends: {tail(log)}")
            return bool(self.status(host).get("BackendState"))

        wait_for(f"tailscaled of {host} to answer on {self.layout.socket_path(host)}", ready, timeout,
                 interval=0.1, detail=lambda: tail(log))

    # --- enrolment --------------------------------------------------------------------------
    def _up_argv(self, host: str, timeout: float) -> List[str]:
        lay = self.layout
        return [str(lay.tailscale_cli()), f"--socket={lay.socket_path(host)}", "up",
                f"--login-server={lay.server_url}", f"--auth-key=file:{lay.auth_key_path(host)}",
                f"--hostname={host}", "--accept-dns=false", f"--timeout={int(timeout)}s"]

    def up(self, host: str, timeout: float = 30.0) -> None:
        """Enrol a host with ``tailscale up`` and its bundle's auth key (``timeout`` in seconds)."""
        self.procs.exec(host, self._up_argv(host, timeout), timeout=timeout + 10)

    def up_all(self, hosts: Optional[Sequence[str]] = None, timeout: float = 30.0) -> None:
        """Enrol several hosts at once (``tailscale up`` in parallel), then wait until they see
        their peers. LabError names every host that failed."""
        hosts = list(hosts or self.layout.hosts)
        procs = {}
        for h in hosts:
            procs[h] = system.spawn(self._up_argv(h, timeout), self.layout.names.host_ns(h), echo=self.echo,
                                    env=self.procs.host_env(h), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
        failed = []
        deadline = time.monotonic() + timeout + 10
        for h, proc in procs.items():
            try:
                out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                system.kill_group(proc.pid)
                out, _ = proc.communicate()
                failed.append(f"{h}: tailscale up did not finish within {timeout + 10:g} s")
                continue
            if proc.returncode != 0:
                failed.append(f"{h}: tailscale up exited {proc.returncode}: "
                              f"{out.decode(errors='replace').strip()[-300:]}")
        if failed:
            raise LabError("enrolment failed: " + "; ".join(failed))
        self.wait_enrolled(hosts, timeout=timeout)

    def overlay_ip(self, host: str) -> str:
        """The host's overlay IPv4 address (100.x), LabError when not enrolled."""
        for ip in self.status(host).get("TailscaleIPs") or []:
            if "." in ip:
                return str(ip)
        raise LabError(f"lab host {host} has no overlay IPv4 address yet (not enrolled?)")

    def expected_peers(self, host: str, among: Optional[Sequence[str]] = None) -> Set[str]:
        """Hosts (of ``among``, default all) that ``host`` should see as peers: those the fleet's
        ACL policy lets it reach or be reached by (operators do not see each other; a relay's
        ICMP-only visibility rule counts)."""
        fleet = self.control.fleet()
        return {o for o in (among or self.layout.hosts) if o != host and visible(fleet, host, o)}

    def wait_enrolled(self, hosts: Optional[Sequence[str]] = None, timeout: float = 30.0) -> None:
        """Wait up to ``timeout`` seconds until every host is Running and sees every other given
        host its ACLs allow."""
        hosts = list(hosts or self.layout.hosts)
        expected = {h: self.expected_peers(h, hosts) for h in hosts}

        def seen(h: str) -> Optional[Set[str]]:
            st = self.status(h)
            if st.get("BackendState") != "Running":
                return None
            return {str(p.get("HostName")) for p in (st.get("Peer") or {}).values()}

        def ready() -> bool:
            for h in hosts:
                s = seen(h)
                if s is None or not expected[h] <= s:
                    return False
            return True

        def state() -> str:
            out = []
            for h in hosts:
                try:
                    s = seen(h)
                    out.append(f"{h}: " + ("not Running" if s is None else
                                           f"missing peers {sorted(expected[h] - s)}"))
                except Exception as exc:  # noqa: BLE001 - only for the message
                    out.append(f"{h}: {exc}")
            return "; ".join(out)

        wait_for(f"hosts {', '.join(hosts)} to be enrolled and see their peers", ready, timeout,
                 interval=0.2, detail=state)

    def ping(self, host: str, peer: str, count: int = 10, timeout: float = 40.0,
             until_direct: bool = True) -> PingResult:
        """``tailscale ping`` from ``host`` to ``peer``'s overlay IP; the path of the last pong.

        With ``until_direct`` the CLI stops at the first direct pong (its default); otherwise it
        sends ``count`` pings whatever the path. ``timeout`` in seconds for the whole command.
        """
        ip = self.overlay_ip(peer)
        argv = [str(self.layout.tailscale_cli()), f"--socket={self.layout.socket_path(host)}", "ping",
                f"--c={count}", f"--until-direct={'true' if until_direct else 'false'}", "--timeout=3s", ip]
        res = self.procs.exec(host, argv, timeout=timeout, check=False)
        return parse_ping_output(res.stdout + res.stderr)
