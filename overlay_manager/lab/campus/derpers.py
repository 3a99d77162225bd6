"""The fleet's own DERP regions in the lab: tailscale's derper on hosts of campus server networks.

A derper host is a lab host named in the spec's ``derp.regions``, in a ``public`` building (no
NAT, routed on the backbone), running its own tailscaled (derper's ``--verify-clients`` asks it
whether a client's node key belongs to the tailnet) and derper beside it::

                     olab<run>-bb (campus backbone)
        |                     |                        |                       |
     r-east (public)       r-west (public)          r-north (adpm NAT)      r-south (adpm NAT)
        |                     |                        |                       |
     h-east-derp           h-west-derp              h-alpha-robot1          h-alpha-op1
     tailscaled +          tailscaled +             tailscaled              tailscaled
     derper :443 (TLS)     derper :443 (TLS)        home region: the lowest latency one
     STUN :3478/udp        STUN :3478/udp

What is particular to DERP regions stays here:

- :func:`fleet_derp`: the lab fleet file's ``derp_regions`` section and ``server.derp.embedded``
  (so ``fleet init`` writes the DERP map headscale serves and the bundles carry the derper files,
  as in production);
- :func:`stun_servers`: (address, UDP port) of every derper's STUN, which ``udp-servers`` routers
  let through;
- :class:`Derpers`: starts derper on its host from the host's fleet bundle (``derper/``: the
  certificate the fleet CA signed, the mesh key) with the same arguments as the bundle's
  derper.service (:func:`overlay_manager.fleet.derp.derper_args`), stops it by pid, reads its
  /debug/vars, and probes it with tailscale's derpprobe (a client with a fresh, unknown key).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from overlay_manager.fleet.derp import DerpServer, derp_map, derper_args, servers_on
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import RunLayout, tools_bin
from overlay_manager.lab.campus.naming import Names
from overlay_manager.lab.campus.processes import Processes
from overlay_manager.lab.campus.spec_model import LabSpec
from overlay_manager.lab.campus.system import Echo, tcp_connect, wait_for
from overlay_manager.system.waiting import tail
from overlay_manager.tailscaled.derper import DerperState

if TYPE_CHECKING:  # control.py imports this module for fleet_derp
    from overlay_manager.lab.campus.control import ControlServer

DERPER_START_TIMEOUT_S = 20.0


def fleet_derp(names: Names) -> Tuple[Dict[str, Any], bool]:
    """(the fleet file's ``derp_regions`` mapping, ``server.derp.embedded``) for the spec."""
    spec = names.spec
    regions = {code: {"id": r.id, "name": r.name,
                      "servers": [{"host": h, "address": names.host_address(h), "hostname": derp_hostname(h)}
                                  for h in r.servers]}
               for code, r in spec.derp.regions.items()}
    return regions, spec.derp.embedded


def derp_hostname(host: str) -> str:
    """The TLS name of the derper on lab host ``host`` (clients dial its address and verify this
    name against the fleet CA's certificate, as on a campus with DNS)."""
    return f"{host}.campus.internal"


def stun_servers(names: Names) -> List[Tuple[str, int]]:
    """(underlay address, STUN UDP port) of every derper host: what a ``udp-servers`` router
    forwards (DERP itself is TCP)."""
    return [(names.host_address(h), 3478) for h, _ in names.spec.derp.servers()]


def derper_hosts(spec: LabSpec) -> List[str]:
    """Hosts that run derper, regions in spec order."""
    return [h for h, _ in spec.derp.servers()]


class Derpers:
    """The run's derpers: one per derper host, tracked as ``derper:<host>``.

    Args:
        layout: the run's paths and names.
        procs: where the processes are tracked.
        control: the run's fleet (its ``derp_regions`` give each derper's settings).
        echo: receives one line per action.
    """

    def __init__(self, layout: RunLayout, procs: Processes, control: "ControlServer", echo: Echo) -> None:
        self.layout = layout
        self.procs = procs
        self.control = control
        self.echo = echo

    def server(self, host: str) -> DerpServer:
        """The fleet's DerpServer on ``host``; LabError when the host runs none."""
        found = servers_on(self.control.fleet().derp_regions, host)
        if not found:
            raise LabError(f"lab host {host} runs no derper (spec derp.regions: "
                           f"{', '.join(derper_hosts(self.layout.spec)) or 'none'})")
        return found[0]

    def log_path(self, host: str) -> Path:
        """derper's log file on ``host``."""
        return self.layout.host_dir(host) / "derper.log"

    def argv(self, host: str) -> List[str]:
        """derper's command line on ``host``: the bundle unit's arguments with the lab's paths."""
        s = self.server(host)
        region = self.control.fleet().derp_regions[s.region]
        files = self.layout.host_dir(host) / "derper"
        if not (files / f"{s.cert_stem}.crt").exists():
            raise LabError(f"lab host {host}: no derper certificate in {files} (the fleet bundle did not "
                           "write derper/)")
        return [str(tools_bin() / "derper"), *derper_args(
            s, region, certdir=str(files), socket=str(self.layout.socket_path(host)),
            state_file=str(files / "derper-state.key"), mesh_key_file=str(files / "mesh.key"))]

    def running(self, host: str) -> bool:
        """True when this run's derper on ``host`` is alive."""
        return self.procs.running(f"derper:{host}")

    def start(self, host: str, timeout: float = DERPER_START_TIMEOUT_S) -> subprocess.Popen:
        """Start derper on ``host`` and wait (``timeout`` s) until it accepts TLS connections on
        its DERP port and answers /debug/vars."""
        s = self.server(host)
        ns = self.layout.names.host_ns(host)
        env = {**os.environ, "HOME": str(self.layout.host_dir(host)),
               "SSL_CERT_FILE": str(self.layout.ca_cert_path(host))}
        proc = self.procs.spawn(f"derper:{host}", ns, self.argv(host), env, self.log_path(host))
        log = self.log_path(host)

        def ready() -> bool:
            if proc.poll() is not None:
                raise LabError(f"derper on {host} exited with {proc.returncode}; {log} ends: {tail(log)}")
            return tcp_connect(ns, s.address, s.port, 1.0) and self.read(host).listening

        wait_for(f"derper on {host} to listen on {s.address}:{s.port} in {ns}", ready, timeout,
                 interval=0.2, detail=lambda: tail(log))
        self.echo(f"({host}) derper of region {s.region} on {s.address}:{s.port} (STUN {s.stun_port})")
        return proc

    def stop(self, host: str) -> None:
        """Stop (SIGTERM, by pid) derper on ``host``: its region goes away."""
        self.procs.stop(f"derper:{host}", grace=3.0)

    def read(self, host: str) -> DerperState:
        """derper's counters on ``host`` (its /debug/vars, read inside the host's namespace)."""
        s = self.server(host)
        ns = self.layout.names.host_ns(host)
        code = ("import json,sys; from overlay_manager.core.config import DerperSettings; "
                "from overlay_manager.tailscaled.derper import read_derper; "
                f"st = read_derper(DerperSettings({s.debug_url!r})); print(json.dumps(st.__dict__))")
        res = subprocess.run(["ip", "netns", "exec", ns, "/usr/bin/python3", "-c", code],
                             capture_output=True, text=True, timeout=15, check=False,
                             cwd=str(Path(__file__).resolve().parents[3]))
        try:
            return DerperState(**json.loads(res.stdout))
        except (ValueError, TypeError):
            return DerperState(error=f"cannot read derper on {host}: {res.stderr.strip()[-300:]}")

    def probe(self, host: str, region: str, timeout: float = 90.0) -> Dict[str, Any]:
        """Run tailscale's ``derpprobe --once`` from ``host``'s namespace against ``region``: its
        clients use fresh node keys that no tailnet knows. Returns {"rc", "good": [...], "bad":
        [...], "output"} (probe names as derpprobe prints them)."""
        regions = self.control.fleet().derp_regions
        path = self.layout.host_dir(host) / f"derpprobe-{region}.json"
        path.write_text(json.dumps({"Regions": {str(k): v for k, v in derp_map(
            {region: regions[region]})["regions"].items()}}))
        argv = [str(tools_bin() / "derpprobe"), f"--derp-map=file://{path}", "--once", "--spread=false",
                f"--region-code={region}"]
        env = {"SSL_CERT_FILE": str(self.layout.ca_cert_path(host)), "HOME": str(self.layout.host_dir(host))}
        res = self.procs.exec(host, argv, env=env, timeout=timeout, check=False)
        out = (res.stdout or "") + (res.stderr or "")
        good = [line.split("good: ", 1)[1] for line in out.splitlines() if "good: " in line]
        bad = [line.split("bad: ", 1)[1] for line in out.splitlines() if "bad: " in line]
        return {"rc": res.returncode, "good": good, "bad": bad, "output": out[-3000:]}
