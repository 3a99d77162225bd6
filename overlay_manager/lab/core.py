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
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from . import control, nft, system
from . import impair as impair_mod
from .errors import LabError
from .naming import NS_RE, TAILSCALE_PORT, TUN_NAME, Names, check_run_id, new_run_id
from .spec import Impairment, LabSpec, SpecInput, load_spec, parse_spec, spec_to_dict
from .system import Echo, default_echo, wait_for

RUN_ROOT = Path("/run/overlay-lab")
"""Per-run state directories live here (tmpfs: gone after a reboot, like the namespaces)."""
REPO_ROOT = Path(__file__).resolve().parents[2]
SOCKET_PATH_MAX = 107
HEADSCALE_START_TIMEOUT_S = 30.0
TAILSCALED_START_TIMEOUT_S = 20.0


def tools_bin() -> Path:
    """Directory of the tailscale, tailscaled and headscale binaries.

    ``OVERLAY_TOOLS_BIN`` overrides; default is the repository's ``.tools/bin`` (scripts/setup).
    """
    return Path(os.environ.get("OVERLAY_TOOLS_BIN") or REPO_ROOT / ".tools" / "bin").resolve()


def missing_prerequisites() -> list[str]:
    """What the lab needs but does not have (empty list = ready): root, binaries, tools."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the lab creates network namespaces)")
    for b in ("tailscale", "tailscaled", "headscale"):
        if not os.access(tools_bin() / b, os.X_OK):
            missing.append(f"{tools_bin() / b} (run scripts/setup)")
    for tool in ("ip", "nft", "tc"):
        if shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin") is None:
            missing.append(f"{tool} (Debian: iproute2/nftables)")
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        missing.append("python3-pyroute2")
    if not os.path.exists("/dev/net/tun"):
        missing.append("/dev/net/tun")
    return missing


@dataclass(frozen=True)
class PingResult:
    """Outcome of ``tailscale ping`` from one lab host to another."""

    path: str
    """``direct`` | ``derp`` | ``none`` (no pong at all)."""
    via: str
    """The endpoint ip:port for direct, the DERP region code for derp, "" for none."""
    latency_ms: float
    """Round trip of the last pong in milliseconds (0 when none)."""
    output: str
    """The CLI's full output."""


_PONG_RE = re.compile(r"pong from \S+ \(([^)]*)\) via (\S+)(?: \S+)* in ([0-9.]+)(µs|us|ms|s)")


def parse_ping_output(text: str) -> PingResult:
    """The path of the last pong printed by ``tailscale ping`` (pure; used by :meth:`Lab.ping`)."""
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
    return PingResult("direct", via, latency, text)


class Lab:
    """One run of a lab spec.

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
    """

    def __init__(self, spec: SpecInput, run_id: str | None = None, workdir: str | Path | None = None,
                 echo: Echo | None = None, robot_overrides: Mapping[str, Any] | None = None) -> None:
        self.spec: LabSpec = load_spec(spec)
        self.robot_overrides = dict(robot_overrides or {})
        self.run_id = check_run_id(run_id) if run_id is not None else new_run_id()
        self.names = Names(self.spec, self.run_id)
        self.run_dir = RUN_ROOT / self.run_id
        self._own_workdir = workdir is None
        self.workdir = (Path(workdir) if workdir is not None else self.run_dir).resolve()
        self.echo: Echo = echo or default_echo
        self._procs: dict[str, subprocess.Popen] = {}
        self._fleet: Any = None
        self._deployment: Any = None
        self._netem: bool | None = None
        for h in self.spec.hosts:
            sock = self.socket_path(h.name)
            if len(str(sock)) > SOCKET_PATH_MAX:
                raise LabError(f"unix socket path {sock} is longer than {SOCKET_PATH_MAX} characters; "
                               "use a shorter workdir")

    # --- paths and names ----------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        """The run's state file (JSON)."""
        return self.run_dir / "state.json"

    def host_dir(self, host: str) -> Path:
        """``<workdir>/hosts/<host>``: the host's fleet bundle, tailscaled state, socket, logs."""
        self.names.host_index(host)
        return self.workdir / "hosts" / host

    def socket_path(self, host: str) -> Path:
        """tailscaled's LocalAPI socket of a host."""
        return self.workdir / "hosts" / host / "tailscaled.sock"

    def robot_yaml(self, host: str) -> Path:
        """The host's robot config (fleet bundle)."""
        return self.host_dir(host) / "robot.yaml"

    def auth_key_path(self, host: str) -> Path:
        """The host's pre-auth key file (fleet bundle, mode 0600)."""
        return self.host_dir(host) / "auth.key"

    def ca_cert_path(self, host: str) -> Path:
        """The CA certificate the host trusts for the control server (fleet bundle)."""
        return self.host_dir(host) / "ca.crt"

    @property
    def control_dir(self) -> Path:
        """The headscale deployment directory (fleet init output)."""
        return self.workdir / "control"

    def namespace(self, node: str) -> str:
        """Namespace of a host, a building's router, ``control`` or ``backbone``."""
        return self.names.namespace_of(node)

    def address(self, host: str) -> str:
        """A host's LAN (underlay) address; for a building, its router's public (backbone) address."""
        if any(b.name == host for b in self.spec.buildings):
            return self.names.router_wan_address(host)
        if host == "control":
            return self.names.control_address
        return self.names.host_address(host)

    @property
    def server_url(self) -> str:
        """Headscale's URL as the hosts reach it."""
        return self.names.server_url

    @property
    def hosts(self) -> list[str]:
        """Host names in spec order."""
        return [h.name for h in self.spec.hosts]

    def tailscale_cli(self) -> Path:
        """The tailscale CLI binary."""
        return tools_bin() / "tailscale"

    # --- state --------------------------------------------------------------------------
    @contextmanager
    def _locked_state(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write the state file under an exclusive lock."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
            except json.JSONDecodeError:
                state = {}
            yield state
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state, indent=2) + "\n")
            os.replace(tmp, self.state_path)

    def state(self) -> dict[str, Any]:
        """The run's state as last written (empty when the run does not exist)."""
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    @classmethod
    def attach(cls, run_id: str | None = None, echo: Echo | None = None) -> Lab:
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

    # --- bring up -----------------------------------------------------------------------
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
        with self._locked_state() as st:
            st.update({"run_id": self.run_id, "spec": spec_to_dict(self.spec),
                       "spec_source": self.spec.source, "workdir": str(self.workdir),
                       "own_workdir": self._own_workdir, "phase": "creating", "namespaces": [],
                       "processes": {}, "routers": {b.name: {"udp_blocked": False, "cut": False}
                                                    for b in self.spec.buildings},
                       "impair": {}, "owner_pid": os.getpid(), "created": time.time()})
        self._build_network()
        for link, imp in self.spec.impair.items():
            self.impair(link, imp)
        self._start_control()
        self._write_bundles()
        if start_tailscaled:
            for h in self.hosts:
                self.start_tailscaled(h)
            for h in self.hosts:
                self.wait_tailscaled(h)
        with self._locked_state() as st:
            st["phase"] = "up"
        self.echo(f"up: run {self.run_id} ready in {time.monotonic() - t0:.1f} s")
        return self

    def _record_ns(self, ns: str) -> None:
        with self._locked_state() as st:
            if ns not in st.setdefault("namespaces", []):
                st["namespaces"].append(ns)

    def _new_ns(self, ns: str) -> None:
        self._record_ns(ns)  # recorded first: a crash right after still leaves a trace
        system.create_ns(ns, self.echo)

    def _sysctl(self, ns: str, settings: Mapping[str, str]) -> None:
        args = [f"{k}={v}" for k, v in settings.items()]
        system.run(["sysctl", "-q", "-w", *args], ns, echo=self.echo)

    def _build_network(self) -> None:
        from pyroute2 import NetNS

        n = self.names
        for ns in n.all_namespaces():
            self._new_ns(ns)
        nobr = {"net.bridge.bridge-nf-call-iptables": "0", "net.bridge.bridge-nf-call-ip6tables": "0",
                "net.bridge.bridge-nf-call-arptables": "0"}
        with NetNS(n.backbone_ns) as bb:
            self.echo(f"({n.backbone_ns}) ip link add br0 type bridge; ip link set br0 up")
            bb.link("add", ifname="br0", kind="bridge")
            br = bb.link_lookup(ifname="br0")[0]
            bb.link("set", index=br, state="up")
            self._veth(bb, n.backbone_ns, "ctl", br, n.control_ns, "eth0",
                       f"{n.control_address}/24", gateway=None)
            for i, b in enumerate(self.spec.buildings):
                self._veth(bb, n.backbone_ns, f"r{i}", br, n.router_ns(b.name), "wan",
                           f"{n.router_wan_address(b.name)}/24", gateway=None)
        self._sysctl(n.backbone_ns, nobr)
        for b in self.spec.buildings:
            rns = n.router_ns(b.name)
            with NetNS(rns) as r:
                self.echo(f"({rns}) ip link add br0 type bridge; ip addr add "
                          f"{n.router_lan_address(b.name)}/24 dev br0; ip link set br0 up")
                r.link("add", ifname="br0", kind="bridge")
                rbr = r.link_lookup(ifname="br0")[0]
                r.addr("add", index=rbr, address=n.router_lan_address(b.name), prefixlen=24)
                r.link("set", index=rbr, state="up")
                for j, h in enumerate(b.hosts):
                    self._veth(r, rns, f"h{j}", rbr, n.host_ns(h.name), "eth0",
                               f"{n.host_address(h.name)}/24", gateway=n.router_lan_address(b.name))
            self._sysctl(rns, {"net.ipv4.ip_forward": "1", **nobr})
            ruleset = nft.router_ruleset(b.nat, n.router_wan_address(b.name), n.control_address,
                                         self.spec.control.stun_port)
            self._nft(rns, ruleset, f"NAT {b.nat.name}")
        # name resolution of every namespace that runs programs: its own files, never the host's
        resolv = ("# overlay lab: /etc/resolv.conf inside this namespace (no DNS server in the lab)\n"
                  "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        system.write_etc(n.control_ns, "resolv.conf", resolv, self.echo)
        system.write_etc(n.control_ns, "hosts", f"127.0.0.1 localhost\n{n.control_address} control\n",
                         self.echo)
        for h in self.spec.hosts:
            ns = n.host_ns(h.name)
            system.write_etc(ns, "resolv.conf", resolv, self.echo)
            system.write_etc(ns, "hosts", f"# /etc/hosts of lab host {h.name} (namespace {ns})\n"
                             "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
                             f"{n.host_address(h.name)} {h.name}\n", self.echo)

    def _veth(self, ipr: Any, ns: str, ifname: str, bridge: int, peer_ns: str, peer_ifname: str,
              peer_cidr: str, gateway: str | None) -> None:
        """veth ``ifname`` in ``ns`` (enslaved to ``bridge``) <-> ``peer_ifname`` in ``peer_ns``."""
        from pyroute2 import NetNS

        self.echo(f"({ns}) ip link add {ifname} master br0 type veth peer {peer_ifname} netns {peer_ns}; "
                  f"({peer_ns}) ip addr add {peer_cidr} dev {peer_ifname}"
                  + (f"; ip route add default via {gateway}" if gateway else ""))
        ipr.link("add", ifname=ifname, kind="veth", peer={"ifname": peer_ifname, "net_ns_fd": peer_ns})
        idx = ipr.link_lookup(ifname=ifname)[0]
        ipr.link("set", index=idx, master=bridge, state="up")
        address, prefixlen = peer_cidr.split("/")
        with NetNS(peer_ns) as p:
            pidx = p.link_lookup(ifname=peer_ifname)[0]
            p.addr("add", index=pidx, address=address, prefixlen=int(prefixlen))
            p.link("set", index=pidx, state="up")
            if gateway:
                p.route("add", dst="default", gateway=gateway)

    def _nft(self, ns: str, ruleset: str, what: str) -> None:
        path = self.workdir / "nft" / f"{ns}.nft"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ruleset)
        self.echo(f"({ns}) nft -f {path}  # {what}")
        system.run(["nft", "-f", "-"], ns, echo=self.echo, input=ruleset, quiet=True)

    # --- processes ----------------------------------------------------------------------
    def _track(self, key: str, proc: subprocess.Popen, ns: str, argv: Sequence[str]) -> None:
        self._procs[key] = proc
        with self._locked_state() as st:
            st.setdefault("processes", {})[key] = {"pid": proc.pid, "ns": ns, "argv": [str(a) for a in argv]}

    def _untrack(self, key: str) -> None:
        self._procs.pop(key, None)
        with self._locked_state() as st:
            st.setdefault("processes", {}).pop(key, None)

    def _stop_process(self, key: str, grace: float = 5.0) -> None:
        """Stop one tracked process by pid (checked to still be the process we started)."""
        proc = self._procs.get(key)
        info = self.state().get("processes", {}).get(key)
        pid = proc.pid if proc is not None else (info or {}).get("pid")
        if pid is not None and (proc is not None or _argv_matches(pid, (info or {}).get("argv", []))):
            system.terminate_pids([pid], f"{key} in {(info or {}).get('ns', '?')}", self.echo, grace)
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                system.kill_group(proc.pid)
                proc.wait(timeout=5)
        self._untrack(key)

    def host_env(self, host: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for programs on a lab host: ours, ``<host_dir>/bin`` first on PATH (its
        ``tailscale`` wrapper talks to the host's own tailscaled), LAB_HOST/LAB_RUN_ID, plus ``env``."""
        out = dict(os.environ)
        out["PATH"] = f"{self.host_dir(host) / 'bin'}:{out.get('PATH', '/usr/bin:/bin')}"
        out["LAB_HOST"] = host
        out["LAB_RUN_ID"] = self.run_id
        if env:
            out.update(env)
        return out

    def exec(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
             timeout: float = 60.0, check: bool = True, input: str | None = None,
             quiet: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in a host's (or router's, ``control``'s) namespace and wait for it.

        stdout and stderr are captured as text. ``timeout`` in seconds: the process group is
        killed and LabTimeout raised. ``check``: CommandError on a non-zero exit.
        """
        ns = self.namespace(host)
        full_env = self.host_env(host, env) if host in self.hosts else {**os.environ, **(env or {})}
        return system.run(argv, ns, echo=self.echo, timeout=timeout, check=check, input=input,
                          env=full_env, quiet=quiet)

    def popen(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              log: str | Path | None = None, **popen_kw: Any) -> subprocess.Popen:
        """Start ``argv`` in a host's namespace in the background (own session, pgid = pid).

        The lab stops it at down() if it is still running (by pid). ``log``: file for stdout and
        stderr; otherwise ``stdout``/``stderr`` etc. go to subprocess.Popen.
        """
        ns = self.namespace(host)
        full_env = self.host_env(host, env) if host in self.hosts else {**os.environ, **(env or {})}
        proc = system.spawn(argv, ns, echo=self.echo, env=full_env,
                            log=Path(log) if log is not None else None, **popen_kw)
        self._track(f"popen:{host}:{proc.pid}", proc, ns, argv)
        return proc

    # --- control host (headscale) -------------------------------------------------------
    def _start_control(self) -> None:
        self._fleet, self._deployment = control.init_control(self.names, self.control_dir,
                                                             tools_bin() / "headscale")
        self.echo(f"headscale deployment in {self.control_dir} (server_url {self.server_url})")
        self.headscale_start()

    def deployment(self) -> Any:
        """The fleet Deployment of this run's headscale (overlay_manager.fleet.deploy)."""
        if self._deployment is None:
            self._deployment = control.open_control(self.control_dir, tools_bin() / "headscale")
        return self._deployment

    def fleet(self) -> Any:
        """The FleetConfig generated from the lab spec."""
        if self._fleet is None:
            self._fleet = control.load_fleet(self.names, str(self.control_dir / "fleet.yaml"))
        return self._fleet

    def headscale_running(self) -> bool:
        """True when the headscale process of this run is alive."""
        info = self.state().get("processes", {}).get("headscale")
        return bool(info) and _argv_matches(info["pid"], info["argv"])

    def headscale_start(self, timeout: float = HEADSCALE_START_TIMEOUT_S) -> None:
        """Start headscale in the control namespace and wait until it accepts HTTPS connections
        and answers its CLI."""
        if self.headscale_running():
            self.echo("headscale: already running")
            return
        dep = self.deployment()
        argv = dep.serve_argv()
        ns = self.names.control_ns
        proc = system.spawn(argv, ns, echo=self.echo, log=self.control_dir / "headscale.log",
                            env={**os.environ, "HOME": str(self.control_dir)})
        self._track("headscale", proc, ns, argv)
        port = self.spec.control.port

        def ready() -> bool:
            if proc.poll() is not None:
                log = self.control_dir / "headscale.log"
                raise LabError(f"headscale exited with {proc.returncode}; {log} ends: {_tail(log)}")
            return system.tcp_connect(ns, self.names.control_address, port, 1.0) and dep.cli().health()

        wait_for(f"headscale to listen on {self.names.control_address}:{port} in {ns}", ready, timeout,
                 interval=0.2, detail=lambda: _tail(self.control_dir / "headscale.log"))

    def headscale_stop(self) -> None:
        """Stop headscale (SIGTERM, then SIGKILL after 5 s): existing tailscale links stay up."""
        self._stop_process("headscale")

    def _write_bundles(self) -> None:
        for h in self.hosts:
            d = self.host_dir(h)
            d.mkdir(parents=True, exist_ok=True)
            self.echo(f"fleet bundle for {h} -> {d}")
            control.write_host_bundle(self.deployment(), self.fleet(), h, d, self.socket_path(h),
                                      self.tailscale_cli(), self.robot_overrides)
            wrapper = d / "bin" / "tailscale"
            wrapper.parent.mkdir(exist_ok=True)
            wrapper.write_text(f'#!/bin/sh\n# tailscale CLI bound to lab host {h}\'s tailscaled\n'
                               f'exec {self.tailscale_cli()} --socket={self.socket_path(h)} "$@"\n')
            wrapper.chmod(0o755)

    # --- tailscaled ---------------------------------------------------------------------
    def start_tailscaled(self, host: str) -> subprocess.Popen:
        """Start the host's tailscaled (TUN ``tailscale0``, own statedir/socket/logs, port 41641)."""
        d = self.host_dir(host)
        for sub in ("state", "logs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        argv = [str(tools_bin() / "tailscaled"), f"--tun={TUN_NAME}", f"--statedir={d / 'state'}",
                f"--socket={self.socket_path(host)}", f"--port={TAILSCALE_PORT}", "--no-logs-no-support"]
        env = {**os.environ, "TS_LOGS_DIR": str(d / "logs"), "SSL_CERT_FILE": str(self.ca_cert_path(host)),
               "HOME": str(d)}
        ns = self.names.host_ns(host)
        proc = system.spawn(argv, ns, echo=self.echo, env=env, log=d / "tailscaled.log")
        self._track(f"tailscaled:{host}", proc, ns, argv)
        return proc

    def stop_tailscaled(self, host: str) -> None:
        """Stop the host's tailscaled (by pid)."""
        self._stop_process(f"tailscaled:{host}")

    def localapi(self, host: str) -> Any:
        """overlay_manager.tailscale.LocalAPI bound to the host's tailscaled socket."""
        from ..tailscale import LocalAPI

        return LocalAPI(str(self.socket_path(host)), timeout=5.0)

    def tailscale_status(self, host: str) -> dict[str, Any]:
        """The host's tailscaled status (``tailscale status --json``) from its LocalAPI."""
        return self.localapi(host).status()

    def wait_tailscaled(self, host: str, timeout: float = TAILSCALED_START_TIMEOUT_S) -> None:
        """Wait until the host's tailscaled answers its LocalAPI."""
        proc = self._procs.get(f"tailscaled:{host}")

        def ready() -> bool:
            if proc is not None and proc.poll() is not None:
                log = self.host_dir(host) / "tailscaled.log"
                raise LabError(f"tailscaled of {host} exited with {proc.returncode}; {log} ends: {_tail(log)}")
            return bool(self.tailscale_status(host).get("BackendState"))

        wait_for(f"tailscaled of {host} to answer on {self.socket_path(host)}", ready, timeout,
                 interval=0.1, detail=lambda: _tail(self.host_dir(host) / "tailscaled.log"))

    def tailscale_up(self, host: str, timeout: float = 30.0) -> None:
        """Enrol a host with ``tailscale up`` and its bundle's auth key (tests and demos before
        the node does it)."""
        self.exec(host, [str(self.tailscale_cli()), f"--socket={self.socket_path(host)}", "up",
                         f"--login-server={self.server_url}", f"--auth-key=file:{self.auth_key_path(host)}",
                         f"--hostname={host}", "--accept-dns=false", f"--timeout={int(timeout)}s"],
                  timeout=timeout + 10)

    def tailscale_up_all(self, hosts: Sequence[str] | None = None, timeout: float = 30.0) -> None:
        """Enrol several hosts at once (``tailscale up`` in parallel), then wait until they see
        their peers. LabError names every host that failed."""
        hosts = list(hosts or self.hosts)
        procs = {}
        for h in hosts:
            argv = [str(self.tailscale_cli()), f"--socket={self.socket_path(h)}", "up",
                    f"--login-server={self.server_url}", f"--auth-key=file:{self.auth_key_path(h)}",
                    f"--hostname={h}", "--accept-dns=false", f"--timeout={int(timeout)}s"]
            procs[h] = system.spawn(argv, self.names.host_ns(h), echo=self.echo, env=self.host_env(h),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
        for ip in self.tailscale_status(host).get("TailscaleIPs") or []:
            if "." in ip:
                return str(ip)
        raise LabError(f"lab host {host} has no overlay IPv4 address yet (not enrolled?)")

    def expected_peers(self, host: str, among: Sequence[str] | None = None) -> set[str]:
        """Hosts (of ``among``, default all) that ``host`` should see as peers: those the fleet's
        ACL policy lets it reach or be reached by (operators do not see each other)."""
        from ..fleet.policy import allowed

        fleet = self.fleet()
        return {o for o in (among or self.hosts)
                if o != host and (allowed(fleet, host, o) or allowed(fleet, o, host))}

    def wait_enrolled(self, hosts: Sequence[str] | None = None, timeout: float = 30.0) -> None:
        """Wait until every host is Running and sees every other given host its ACLs allow."""
        hosts = list(hosts or self.hosts)
        expected = {h: self.expected_peers(h, hosts) for h in hosts}

        def seen(h: str) -> set[str] | None:
            st = self.tailscale_status(h)
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
        sends ``count`` pings whatever the path.
        """
        ip = self.overlay_ip(peer)
        argv = [str(self.tailscale_cli()), f"--socket={self.socket_path(host)}", "ping", f"--c={count}",
                f"--until-direct={'true' if until_direct else 'false'}", "--timeout=3s", ip]
        res = self.exec(host, argv, timeout=timeout, check=False)
        return parse_ping_output(res.stdout + res.stderr)

    # --- runtime actions ----------------------------------------------------------------
    def _apply_router_actions(self, building: str, **change: bool) -> None:
        self.names.building_index(building)
        with self._locked_state() as st:
            flags = st.setdefault("routers", {}).setdefault(building, {"udp_blocked": False, "cut": False})
            flags.update(change)
            ruleset = nft.actions_ruleset(udp_blocked=flags["udp_blocked"], cut=flags["cut"])
        ns = self.names.router_ns(building)
        self.echo(f"({ns}) router actions: udp_blocked={flags['udp_blocked']} cut={flags['cut']}")
        system.run(["nft", "-f", "-"], ns, echo=self.echo, input=ruleset, quiet=True)

    def block_udp(self, building: str) -> None:
        """Drop all UDP the building's router forwards (both ways): direct paths break, DERP stays."""
        self._apply_router_actions(building, udp_blocked=True)

    def unblock_udp(self, building: str) -> None:
        """Undo :meth:`block_udp`."""
        self._apply_router_actions(building, udp_blocked=False)

    def cut(self, building: str) -> None:
        """Cut the building off the backbone: its router forwards nothing to or from the WAN."""
        self._apply_router_actions(building, cut=True)

    def uncut(self, building: str) -> None:
        """Undo :meth:`cut`."""
        self._apply_router_actions(building, cut=False)

    def netem_available(self) -> bool:
        """True when the kernel has tc netem (probed once on loopback in the backbone namespace)."""
        if self._netem is None:
            ns = self.names.backbone_ns
            res = system.run(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms"], ns,
                             echo=self.echo, check=False, quiet=True)
            self._netem = res.returncode == 0
            if self._netem:
                system.run(["tc", "qdisc", "del", "dev", "lo", "root"], ns, echo=self.echo, check=False,
                           quiet=True)
            else:
                self.echo("tc netem is not available in this kernel: rate via tbf, loss via nftables, "
                          "no delay/jitter")
        return self._netem

    def impair(self, link: str, impairment: Impairment | None) -> None:
        """Impair both ends of a link (None or an empty Impairment clears it).

        Links: ``control``, a building name (its uplink to the backbone), a host name (its LAN
        link). Values apply per direction, so delay_ms adds twice to the round trip. Uses tc netem
        when the kernel has it; otherwise tbf for rate and nftables for loss, and LabError for
        delay/jitter (see impair.py).
        """
        ends = self.names.link_endpoints(link)
        clear = impairment is None or impairment.empty
        netem = False if clear else self.netem_available()
        if impairment is not None and not clear and not netem:
            reason = impair_mod.fallback_supported(impairment)
            if reason:
                raise LabError(f"cannot impair link {link}: {reason}")
        for end in ends:
            system.run(impair_mod.clear_qdisc_argv(end.ifname), end.ns, echo=self.echo, check=False,
                       quiet=True)
            system.run(["nft", "-f", "-"], end.ns, echo=self.echo, quiet=True,
                       input=impair_mod.loss_ruleset(end.ifname, 0))
            if impairment is None or clear:
                self.echo(f"({end.ns}) {end.ifname}: impairment cleared")
                continue
            if netem:
                system.run(impair_mod.netem_argv(end.ifname, impairment), end.ns, echo=self.echo)
                continue
            if impairment.rate_mbit:
                system.run(impair_mod.tbf_argv(end.ifname, impairment.rate_mbit), end.ns, echo=self.echo)
            if impairment.loss_pct:
                rules = impair_mod.loss_ruleset(end.ifname, impairment.loss_pct)
                self.echo(f"({end.ns}) nft: drop {impairment.loss_pct:g}% of packets arriving on {end.ifname}")
                system.run(["nft", "-f", "-"], end.ns, echo=self.echo, quiet=True, input=rules)
        with self._locked_state() as st:
            if impairment is None or clear:
                st.setdefault("impair", {}).pop(link, None)
            else:
                st.setdefault("impair", {})[link] = asdict(impairment)

    # --- status -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """A summary of the run: namespaces, addresses, NAT kinds, router flags, processes,
        impairments and each host's tailscale state (BackendState, overlay IPs)."""
        st = self.state()
        hosts = {}
        for h in self.spec.hosts:
            entry: dict[str, Any] = {"building": h.building, "namespace": self.names.host_ns(h.name),
                                     "address": self.address(h.name), "socket": str(self.socket_path(h.name))}
            try:
                ts = self.tailscale_status(h.name)
                entry["backend_state"] = ts.get("BackendState")
                entry["overlay_ips"] = ts.get("TailscaleIPs") or []
            except Exception as exc:  # noqa: BLE001 - status reports, never fails
                entry["backend_state"] = f"unreachable ({exc})"
            hosts[h.name] = entry
        procs = {k: {**v, "alive": _argv_matches(v["pid"], v["argv"])}
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

    # --- tear down ----------------------------------------------------------------------
    def down(self) -> None:
        """Remove everything of this run: processes (by pid), namespaces, /etc/netns files,
        state. Safe to call twice and after a crash; errors are collected and raised at the end."""
        errors = teardown_run(self.run_id, self.echo, procs=self._procs,
                              extra_namespaces=self.names.all_namespaces())
        self._procs.clear()
        if self._own_workdir and self.workdir != self.run_dir and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise LabError(f"lab down (run {self.run_id}) left problems: " + "; ".join(errors))


def _argv_matches(pid: int, argv: Sequence[str]) -> bool:
    """True when process ``pid`` is alive and runs exactly ``argv`` (guards against pid reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            actual = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return False
    return bool(actual) and actual[-len(argv):] == list(argv) if argv else False


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return f"(no {path})"


def list_runs() -> list[str]:
    """Run ids that have a state directory under /run/overlay-lab."""
    try:
        return sorted(p.name for p in RUN_ROOT.iterdir() if p.is_dir() and check_run_id_ok(p.name))
    except FileNotFoundError:
        return []


def check_run_id_ok(run_id: str) -> bool:
    """True when ``run_id`` is a valid run id."""
    try:
        check_run_id(run_id)
        return True
    except LabError:
        return False


def leftover_runs() -> list[str]:
    """Run ids with anything left: a state directory, a namespace or an /etc/netns directory."""
    ids = set(list_runs())
    for ns in system.list_namespaces():
        m = NS_RE.match(ns)
        if m:
            ids.add(m.group(1))
    try:
        for p in system.NETNS_ETC_DIR.iterdir():
            m = NS_RE.match(p.name)
            if m:
                ids.add(m.group(1))
    except FileNotFoundError:
        pass
    return sorted(ids)


def teardown_run(run_id: str, echo: Echo = default_echo,
                 procs: Mapping[str, subprocess.Popen] | None = None,
                 extra_namespaces: Sequence[str] = ()) -> list[str]:
    """Remove every trace of run ``run_id``; returns the problems met (empty = clean).

    Order: processes recorded in the state file (each checked to still run its recorded argv),
    then every process inside the run's namespaces (found by namespace inode, killed by pid),
    then the namespaces and their /etc/netns directories, then the state directory.
    """
    check_run_id(run_id)
    errors: list[str] = []
    run_dir = RUN_ROOT / run_id
    state: dict[str, Any] = {}
    try:
        state = json.loads((run_dir / "state.json").read_text())
    except (OSError, json.JSONDecodeError):
        pass
    echo(f"down: run {run_id}")
    pids = []
    for info in (state.get("processes") or {}).values():
        if _argv_matches(info.get("pid", -1), info.get("argv", [])):
            pids.append(info["pid"])
    for proc in (procs or {}).values():
        if proc.poll() is None and proc.pid not in pids:
            pids.append(proc.pid)
    prefix = f"olab{run_id}-"
    namespaces = list(dict.fromkeys(
        [*(state.get("namespaces") or []), *extra_namespaces,
         *[ns for ns in system.list_namespaces() if ns.startswith(prefix) and NS_RE.match(ns)]]))
    namespaces = [ns for ns in namespaces if ns.startswith(prefix)]
    try:
        system.terminate_pids(pids, f"processes of run {run_id}", echo)
        for ns in namespaces:
            system.terminate_pids(system.pids_in_ns(ns), f"processes in {ns}", echo)
    except LabError as exc:
        errors.append(str(exc))
    for proc in (procs or {}).values():
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            errors.append(f"pid {proc.pid} did not exit")
    etc_dirs = []
    try:
        etc_dirs = [p.name for p in system.NETNS_ETC_DIR.iterdir() if p.name.startswith(prefix)]
    except FileNotFoundError:
        pass
    for ns in list(reversed(namespaces)) + [d for d in etc_dirs if d not in namespaces]:
        try:
            system.delete_ns(ns, echo)
        except (LabError, OSError) as exc:
            errors.append(f"namespace {ns}: {exc}")
    if run_dir.exists():
        echo(f"rm -r {run_dir}")
        shutil.rmtree(run_dir, ignore_errors=True)
    return errors


def down_all(echo: Echo = default_echo) -> list[str]:
    """Tear down every lab run found (state dirs, namespaces, /etc/netns dirs); returns the run
    ids removed. LabError lists problems."""
    runs = leftover_runs()
    errors = []
    for run_id in runs:
        errors += teardown_run(run_id, echo)
    if errors:
        raise LabError("lab down --all left problems: " + "; ".join(errors))
    return runs
