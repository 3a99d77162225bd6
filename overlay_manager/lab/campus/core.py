"""The campus lab: buildings behind real NATs in network namespaces, one tailscaled per host.

Topology of a run (``olab<run>-`` prefixes every namespace; see naming.py for the address plan)::

                        olab<run>-ctl  (headscale: HTTPS control + DERP :8443, STUN :3478)
                              | eth0 10.231.0.2
                              | ctl
      +-------------- olab<run>-bb  (campus backbone: bridge br0) --------------+
      | r0                                                                   r1 |
      | wan 10.231.0.10                                          wan 10.231.0.11 |
   olab<run>-r-b1  (router: NAT kind, nft)             olab<run>-r-b2  (router)
      | br0 10.231.10.1                                          br0 10.231.11.1 |
      | h0                                                                    h0 |
      | eth0 10.231.10.10                                      eth0 10.231.11.10 |
   olab<run>-h-robot1 (tailscaled, TUN tailscale0)    olab<run>-h-laptop (tailscaled)

Every interface lives inside the run's namespaces; nothing is created in, routed through or
filtered in the host's own namespace, and the host's /etc/hosts and /etc/resolv.conf are never
touched (each host namespace has its own /etc/netns/<ns>/{hosts,resolv.conf}).

State of a run is kept in /run/overlay-lab/<run>/state.json so that another process (the CLI)
can act on it and ``lab down`` can remove everything after a crash.

:class:`Lab` is the one object tests, the demo and the benchmarks use; it composes one part per
concern, each in its own module:

=====================  ====================================================================
layout.py              paths and names of the run (no side effects), binaries, prerequisites
state.py               the state file (locked read-modify-write), runs on this machine
network.py             namespaces, bridges, veths, NAT routers; block/cut; rate/loss impairment
processes.py           commands and background processes in namespaces, tracked by pid
control.py             headscale (through overlay_manager.fleet) and the hosts' fleet bundles
tailscaled.py          tailscaled per host, enrolment, status, ``tailscale ping``
derpers.py             derper on the hosts of the spec's DERP regions (the fleet's own relays)
teardown.py            removing a run (this one, another process's, a crashed one)
=====================  ====================================================================
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Union

from overlay_manager.fleet.deploy import Deployment
from overlay_manager.fleet.model import FleetConfig
from overlay_manager.lab.campus import relays, system
from overlay_manager.lab.campus.control import HEADSCALE_START_TIMEOUT_S, ControlServer
from overlay_manager.lab.campus.derpers import Derpers, derper_hosts
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import (
    RUN_ROOT,
    RunLayout,
    missing_prerequisites,
)
from overlay_manager.lab.campus.mobility import ActionLog, Attachment, Mobility, flap_schedule, run_schedule
from overlay_manager.lab.campus.naming import Names, check_run_id, new_run_id
from overlay_manager.lab.campus.network import Network
from overlay_manager.lab.campus.processes import Processes
from overlay_manager.lab.campus.spec import load_spec, parse_spec, spec_to_dict
from overlay_manager.lab.campus.spec_model import Impairment, LabSpec, SpecInput
from overlay_manager.lab.campus.state import RunState, argv_matches, list_runs
from overlay_manager.lab.campus.system import Echo, default_echo
from overlay_manager.lab.campus.tailscaled import TAILSCALED_START_TIMEOUT_S, PingResult, Tailscaleds
from overlay_manager.lab.campus.teardown import teardown_run
from overlay_manager.tailscaled.localapi import LocalAPI


class Lab:
    """One run of a lab spec (a facade over the parts listed in the module doc).

    Args:
        spec: a spec file path, a parsed mapping or a LabSpec.
        run_id: 1..8 of [a-z0-9]; random when None. Scopes every name the run creates.
        workdir: where per-host directories (state, sockets, bundles, logs) and the headscale
            deployment go. Default: /run/overlay-lab/<run>/ (removed by down()); a given workdir
            is kept at down() (logs stay for inspection).
        echo: receives one line per action (default: print to stderr with a ``[lab]`` prefix).
        robot_overrides: extra robot.yaml content for every host's bundle, e.g.
            ``{"node": {"manage_hosts": True}}`` (``tailscale.socket``/``cli`` are always the lab's).

    Use as a context manager (``with Lab(spec) as lab:``): up() on enter, down() always on exit.
    The parts are attributes too: ``layout``, ``run_state``, ``net``, ``procs``, ``control``,
    ``tailscaleds``.
    """

    def __init__(self, spec: SpecInput, run_id: Optional[str] = None, workdir: Union[str, Path, None] = None,
                 echo: Optional[Echo] = None, robot_overrides: Optional[Mapping[str, Any]] = None) -> None:
        self.spec: LabSpec = load_spec(spec)
        self.run_id = check_run_id(run_id) if run_id is not None else new_run_id()
        self.names = Names(self.spec, self.run_id)
        self.run_dir = RUN_ROOT / self.run_id
        self._own_workdir = workdir is None
        self.workdir = (Path(workdir) if workdir is not None else self.run_dir).resolve()
        self.echo: Echo = echo or default_echo
        self.layout = RunLayout(self.spec, self.names, self.workdir)
        self.run_state = RunState(self.run_dir)
        self.net = Network(self.layout, self.run_state, self.echo)
        self.procs = Processes(self.layout, self.run_state, self.echo)
        self.control = ControlServer(self.layout, self.procs, self.echo, robot_overrides)
        self.tailscaleds = Tailscaleds(self.layout, self.procs, self.control, self.echo)
        self.derpers = Derpers(self.layout, self.procs, self.control, self.echo)
        self.actions = ActionLog(self.run_dir / "actions.jsonl")
        """Every runtime action (block/unblock, move, flap, kills) with its times (mobility.py)."""
        self.mobility = Mobility(self.names, self.run_state, self.echo, self.actions)

    # --- paths and names (layout.py) --------------------------------------------------------
    @property
    def state_path(self) -> Path:
        """The run's state file (JSON)."""
        return self.layout.state_path

    def host_dir(self, host: str) -> Path:
        """``<workdir>/hosts/<host>``: the host's fleet bundle, tailscaled state, socket, logs."""
        return self.layout.host_dir(host)

    def socket_path(self, host: str) -> Path:
        """tailscaled's LocalAPI socket of a host."""
        return self.layout.socket_path(host)

    def robot_yaml(self, host: str) -> Path:
        """The host's robot config (fleet bundle)."""
        return self.layout.robot_yaml(host)

    def auth_key_path(self, host: str) -> Path:
        """The host's pre-auth key file (fleet bundle, mode 0600)."""
        return self.layout.auth_key_path(host)

    def ca_cert_path(self, host: str) -> Path:
        """The CA certificate the host trusts for the control server (fleet bundle)."""
        return self.layout.ca_cert_path(host)

    @property
    def control_dir(self) -> Path:
        """The headscale deployment directory (fleet init output)."""
        return self.layout.control_dir

    def namespace(self, node: str) -> str:
        """Namespace of a host, a building's router, ``control`` or ``backbone``."""
        return self.layout.namespace(node)

    def address(self, host: str) -> str:
        """A host's LAN (underlay) address where it is plugged in now (see :meth:`move`); for a
        building, its router's public (backbone) address."""
        if host in self.hosts:
            return self.mobility.where(host).address
        return self.layout.address(host)

    @property
    def server_url(self) -> str:
        """Headscale's URL as the hosts reach it."""
        return self.layout.server_url

    @property
    def hosts(self) -> List[str]:
        """Host names in spec order."""
        return self.layout.hosts

    def tailscale_cli(self) -> Path:
        """The tailscale CLI binary."""
        return self.layout.tailscale_cli()

    # --- state (state.py) -------------------------------------------------------------------
    def state(self) -> Dict[str, Any]:
        """The run's state as last written (empty when the run does not exist)."""
        return self.run_state.read()

    @classmethod
    def attach(cls, run_id: Optional[str] = None, echo: Optional[Echo] = None) -> Lab:
        """The Lab of a run started elsewhere (e.g. by ``lab up``), from its state file.

        ``run_id`` None: the only run under /run/overlay-lab (LabError if none or several).
        """
        if run_id is None:
            runs = list_runs()
            if not runs:
                raise LabError(f"no lab run found under {RUN_ROOT} (start one with `lab up SPEC`)")
            if len(runs) > 1:
                raise LabError(f"several lab runs exist ({', '.join(runs)}): pass --run-id")
            run_id = runs[0]
        path = RUN_ROOT / check_run_id(run_id) / "state.json"
        if not path.exists():
            raise LabError(f"no lab run {run_id} ({path} does not exist; runs: "
                           f"{', '.join(list_runs()) or 'none'})")
        try:
            state = json.loads(path.read_text())
            spec = parse_spec(state["spec"], source=state.get("spec_source", str(path)))
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            raise LabError(f"cannot read the state of run {run_id} from {path}: {exc}") from None
        lab = cls(spec, run_id=run_id, workdir=state["workdir"], echo=echo)
        lab._own_workdir = bool(state.get("own_workdir"))
        return lab

    # --- bring up and tear down -------------------------------------------------------------
    def __enter__(self) -> Lab:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self, start_tailscaled: bool = True) -> Lab:
        """Build the whole lab: namespaces, links, NAT, headscale, bundles, tailscaled per host.

        tailscaled is started but not logged in (enrolment belongs to the node or
        :meth:`tailscale_up`). Raises LabError (nothing is torn down here; the context manager
        or down() does that).
        """
        missing = missing_prerequisites()
        if missing:
            raise LabError("the lab cannot run here, missing: " + "; ".join(missing))
        if self.state_path.exists() or any(system.ns_exists(ns) for ns in self.names.all_namespaces()):
            raise LabError(f"run {self.run_id} already exists (state {self.state_path}); "
                           f"remove it with `lab down --run-id {self.run_id}`")
        t0 = time.monotonic()
        self.echo(f"up: run {self.run_id}, spec {self.spec.source} ({len(self.spec.buildings)} buildings, "
                  f"{len(self.spec.hosts)} hosts), workdir {self.workdir}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.run_state.locked() as st:
            st.update({"run_id": self.run_id, "spec": spec_to_dict(self.spec),
                       "spec_source": self.spec.source, "workdir": str(self.workdir),
                       "own_workdir": self._own_workdir, "phase": "creating", "namespaces": [],
                       "processes": {}, "routers": {b.name: {"udp_blocked": False, "cut": False}
                                                    for b in self.spec.buildings},
                       "impair": {}, "owner_pid": os.getpid(), "created": time.time()})
        self.net.build()
        for link, imp in self.spec.impair.items():
            self.impair(link, imp)
        self.control.init()
        self.control.write_bundles()
        if start_tailscaled:
            for h in self.hosts:
                self.start_tailscaled(h)
            for h in self.hosts:
                self.wait_tailscaled(h)
        with self.run_state.locked() as st:
            st["phase"] = "up"
        self.echo(f"up: run {self.run_id} ready in {time.monotonic() - t0:.1f} s")
        return self

    def down(self) -> None:
        """Remove everything of this run: processes (by pid), namespaces, /etc/netns files,
        state. Safe to call twice and after a crash; errors are collected and raised at the end."""
        errors = teardown_run(self.run_id, self.echo, procs=self.procs.procs,
                              extra_namespaces=self.names.all_namespaces())
        self.procs.procs.clear()
        if self._own_workdir and self.workdir != self.run_dir and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise LabError(f"lab down (run {self.run_id}) left problems: " + "; ".join(errors))

    def status(self) -> Dict[str, Any]:
        """A summary of the run: namespaces, addresses, NAT kinds, router flags, processes,
        impairments and each host's tailscale state (BackendState, overlay IPs)."""
        st = self.state()
        hosts = {}
        for h in self.spec.hosts:
            entry: Dict[str, Any] = {"building": self.mobility.where(h.name).building,
                                     "namespace": self.names.host_ns(h.name),
                                     "address": self.address(h.name), "socket": str(self.socket_path(h.name))}
            try:
                ts = self.tailscale_status(h.name)
                entry["backend_state"] = ts.get("BackendState")
                entry["overlay_ips"] = ts.get("TailscaleIPs") or []
            except Exception as exc:  # noqa: BLE001 - status reports, never fails
                entry["backend_state"] = f"unreachable ({exc})"
            hosts[h.name] = entry
        procs = {k: {**v, "alive": argv_matches(v["pid"], v["argv"])}
                 for k, v in st.get("processes", {}).items()}
        return {
            "run_id": self.run_id, "phase": st.get("phase", "absent"), "workdir": str(self.workdir),
            "server_url": self.server_url,
            "control": {"namespace": self.names.control_ns, "address": self.names.control_address},
            "buildings": {b.name: {"namespace": self.names.router_ns(b.name), "nat": b.nat.name,
                                   "public_address": self.names.router_wan_address(b.name),
                                   "lan": self.names.lan_cidr(b.name),
                                   **st.get("routers", {}).get(b.name, {})}
                          for b in self.spec.buildings},
            "hosts": hosts, "processes": procs, "impair": st.get("impair", {}),
            "namespaces_present": [ns for ns in self.names.all_namespaces() if system.ns_exists(ns)],
        }

    # --- processes (processes.py) -----------------------------------------------------------
    def host_env(self, host: str, env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """Environment for programs on a lab host (see Processes.host_env)."""
        return self.procs.host_env(host, env)

    def exec(self, host: str, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
             timeout: float = 60.0, check: bool = True, input: Optional[str] = None,
             quiet: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` in a host's (router's, ``control``'s) namespace and wait (Processes.exec)."""
        return self.procs.exec(host, argv, env=env, timeout=timeout, check=check, input=input, quiet=quiet)

    def popen(self, host: str, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
              log: Union[str, Path, None] = None, **popen_kw: Any) -> subprocess.Popen:
        """Start ``argv`` in a host's namespace in the background, stopped at down() (Processes.popen)."""
        return self.procs.popen(host, argv, env=env, log=log, **popen_kw)

    # --- control server (control.py) --------------------------------------------------------
    def deployment(self) -> Deployment:
        """The fleet Deployment of this run's headscale (overlay_manager.fleet.deploy)."""
        return self.control.deployment()

    def fleet(self) -> FleetConfig:
        """The FleetConfig generated from the lab spec."""
        return self.control.fleet()

    def headscale_running(self) -> bool:
        """True when the headscale process of this run is alive."""
        return self.control.running()

    def headscale_start(self, timeout: float = HEADSCALE_START_TIMEOUT_S) -> None:
        """Start headscale and wait until it accepts connections and answers its CLI."""
        self.control.start(timeout)

    def headscale_stop(self) -> None:
        """Stop headscale (SIGTERM, then SIGKILL after 5 s): existing tailscale links stay up."""
        self.control.stop()

    # --- tailscaled (tailscaled.py) ---------------------------------------------------------
    def start_tailscaled(self, host: str, extra_env: Optional[Mapping[str, str]] = None) -> subprocess.Popen:
        """Start the host's tailscaled (TUN ``tailscale0``, own statedir/socket/logs, port 41641);
        extra_env is added to its environment."""
        return self.tailscaleds.start(host, extra_env)

    def stop_tailscaled(self, host: str) -> None:
        """Stop the host's tailscaled (by pid)."""
        self.tailscaleds.stop(host)

    def localapi(self, host: str) -> LocalAPI:
        """overlay_manager.tailscaled.localapi.LocalAPI bound to the host's tailscaled socket."""
        return self.tailscaleds.localapi(host)

    def tailscale_status(self, host: str) -> Dict[str, Any]:
        """The host's tailscaled status (``tailscale status --json``) from its LocalAPI."""
        return self.tailscaleds.status(host)

    def wait_tailscaled(self, host: str, timeout: float = TAILSCALED_START_TIMEOUT_S) -> None:
        """Wait until the host's tailscaled answers its LocalAPI."""
        self.tailscaleds.wait_started(host, timeout)

    def tailscale_up(self, host: str, timeout: float = 30.0) -> None:
        """Enrol a host with ``tailscale up`` and its bundle's auth key (tests and demos before
        the node does it)."""
        self.tailscaleds.up(host, timeout)

    def tailscale_up_all(self, hosts: Optional[Sequence[str]] = None, timeout: float = 30.0) -> None:
        """Enrol several hosts at once, then wait until they see their peers."""
        self.tailscaleds.up_all(hosts, timeout)

    def overlay_ip(self, host: str) -> str:
        """The host's overlay IPv4 address (100.x), LabError when not enrolled."""
        return self.tailscaleds.overlay_ip(host)

    def expected_peers(self, host: str, among: Optional[Sequence[str]] = None) -> Set[str]:
        """Hosts (of ``among``, default all) that ``host`` should see as peers under the fleet's ACLs."""
        return self.tailscaleds.expected_peers(host, among)

    def wait_enrolled(self, hosts: Optional[Sequence[str]] = None, timeout: float = 30.0) -> None:
        """Wait until every host is Running and sees every other given host its ACLs allow."""
        self.tailscaleds.wait_enrolled(hosts, timeout)

    def ping(self, host: str, peer: str, count: int = 10, timeout: float = 40.0,
             until_direct: bool = True) -> PingResult:
        """``tailscale ping`` from ``host`` to ``peer``'s overlay IP; the path of the last pong."""
        return self.tailscaleds.ping(host, peer, count, timeout, until_direct)

    # --- runtime actions (network.py) -------------------------------------------------------
    def block_udp(self, building: str) -> Dict[str, Any]:
        """Drop all UDP the building's router forwards (both ways): direct paths break, DERP stays.
        Returns the action record (mobility.ActionLog)."""
        return self.actions.run("block-udp", building, lambda: self.net.set_router_flags(building, udp_blocked=True))

    def unblock_udp(self, building: str) -> Dict[str, Any]:
        """Undo :meth:`block_udp` and :meth:`udp_servers_only`; returns the action record."""
        return self.actions.run("unblock-udp", building, lambda: self.net.set_router_flags(
            building, udp_blocked=False, udp_servers_only=False))

    def udp_servers_only(self, building: str) -> Dict[str, Any]:
        """Let the building's router forward UDP only to and from the campus servers (STUN and
        the peer relays' ports), like the ``udp-servers`` NAT kind: direct paths break, peer
        relays and DERP stay. Returns the action record."""
        return self.actions.run("udp-servers-only", building, lambda: self.net.set_router_flags(
            building, udp_servers_only=True))

    # --- robots that move (mobility.py) -------------------------------------------------------
    def where(self, host: str) -> Attachment:
        """Where ``host``'s LAN link is plugged in now (building, address, gateway)."""
        return self.mobility.where(host)

    def move(self, host: str, building: str, handover_s: float = 0.0) -> Dict[str, Any]:
        """Roam ``host`` to ``building``'s LAN (new address and gateway, that building's NAT; the
        overlay address stays), ``handover_s`` seconds without carrier in between. Returns the
        action record (``t_mono``/``t_wall``/``done_mono``)."""
        return self.mobility.move(host, building, handover_s)

    def move_home(self, host: str, handover_s: float = 0.0) -> Dict[str, Any]:
        """Roam ``host`` back to the building the spec puts it in."""
        return self.mobility.move(host, self.spec.host(host).building, handover_s)

    def link_down(self, host: str) -> Dict[str, Any]:
        """The host's LAN link loses carrier (its access point goes away)."""
        return self.mobility.link_down(host)

    def link_up(self, host: str) -> Dict[str, Any]:
        """Undo :meth:`link_down`."""
        return self.mobility.link_up(host)

    def flap(self, target: str, kind: str = "link", count: int = 1, period_s: float = 2.0,
             down_s: float = 1.0, stop: Optional[Any] = None) -> List[Dict[str, Any]]:
        """Flap ``count`` times, one every ``period_s`` s, down for ``down_s`` s each: ``kind``
        ``link`` = a host's LAN link loses carrier, ``udp`` = a building's router blocks UDP.
        ``stop()`` true ends it early; the link is always left up. Returns the action records."""
        if kind == "link":
            actions = {"down": lambda: self.link_down(target), "up": lambda: self.link_up(target)}
        elif kind == "udp":
            actions = {"down": lambda: self.block_udp(target), "up": lambda: self.unblock_udp(target)}
        else:
            raise LabError(f"flap kind {kind!r}: expected link (a host) or udp (a building)")
        t0 = time.monotonic()
        try:
            run_schedule(flap_schedule(count, period_s, down_s), actions, stop)
        finally:
            last = self.actions.since(t0)
            if last and last[-1]["action"] in ("link-down", "block-udp"):
                actions["up"]()
        return self.actions.since(t0)

    def kill_tailscaled(self, host: str) -> Dict[str, Any]:
        """``kill -9`` the host's tailscaled (a crash: no clean shutdown; e.g. a peer relay dies)."""
        return self.actions.run("kill-tailscaled", host, lambda: self.procs.kill(f"tailscaled:{host}"))

    def restore_tailscaled(self, host: str) -> Dict[str, Any]:
        """Start the host's tailscaled again (its state keeps login and prefs, a relay server's
        port too) and wait until it answers."""
        def do() -> None:
            self.start_tailscaled(host)
            self.wait_tailscaled(host)
        return self.actions.run("start-tailscaled", host, do)

    def kill_derper(self, host: str) -> Dict[str, Any]:
        """``kill -9`` derper on ``host`` (its host stays up and answers ICMP): its region dies."""
        return self.actions.run("kill-derper", host, lambda: self.procs.kill(f"derper:{host}"))

    def enable_relays(self) -> None:
        """Turn on every relay host's relay server from its bundle (as the node does); see
        relays.enable_relays."""
        relays.enable_relays(self.spec, self.robot_yaml, self.localapi, self.echo)

    # --- DERP regions (derpers.py) ------------------------------------------------------------
    def start_derpers(self, timeout: float = 30.0) -> None:
        """Enrol every derper host (derper verifies clients through its tailscaled), then start
        derper on each and wait until it listens; the other hosts enrol afterwards."""
        hosts = derper_hosts(self.spec)
        if hosts:
            self.tailscale_up_all(hosts, timeout)
            for h in hosts:
                self.derpers.start(h)

    def start_derper(self, host: str) -> Dict[str, Any]:
        """Start derper on ``host`` (again) and wait until it listens; returns the action record."""
        return self.actions.run("start-derper", host, lambda: self.derpers.start(host))

    def stop_derper(self, host: str) -> None:
        """Stop derper on ``host`` (by pid): its region goes away, its clients re-home."""
        self.derpers.stop(host)

    def cut(self, building: str) -> None:
        """Cut the building off the backbone: its router forwards nothing to or from the WAN."""
        self.net.set_router_flags(building, cut=True)

    def uncut(self, building: str) -> None:
        """Undo :meth:`cut`."""
        self.net.set_router_flags(building, cut=False)

    def netem_available(self) -> bool:
        """True when the kernel has tc netem (probed once)."""
        return self.net.netem_available()

    def impair(self, link: str, impairment: Optional[Impairment]) -> None:
        """Impair both ends of a link (None clears it); see Network.impair."""
        self.net.impair(link, impairment)
