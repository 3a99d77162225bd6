"""Overlay names for ROS_MASTER_URI / ROS_HOSTNAME, and the `overlay_env` command.

    eval "$(rosrun overlay_manager overlay_env --config robot.yaml)"

prints ``export ROS_HOSTNAME=<this machine's overlay name>``, ``export
ROS_MASTER_URI=http://<master's overlay name>:<port>``, ``unset ROS_IP``, ``export
OVERLAY_MANAGER_HOST=<short name>``, ``export OVERLAY_MANAGER_NS=<ROS namespace of the short name>``
(``ros_names.ros_namespace``: ``alpha-robot1`` -> ``alpha_robot1``) and, when tailscaled was
asked (--enrol or --write-hosts), ``export OVERLAY_MANAGER_ADDRESS=<overlay IPv4 address>``, and ``export
OVERLAY_MANAGER_MASTER_LOCAL=true|false`` (is the ROS master this machine, by the config: the
bringup unit starts ``roslaunch --wait`` when it is not). It needs only the config (overlay name
= <hostname>.<base_domain>), so it works before the node runs. Options can enrol the machine,
write the managed hosts block and wait for the master first, and (as root) keep rosbridge's
port to loopback and the overlay (``--rosbridge-firewall PORT``, system/firewall.py).

``--offline-ok`` (boot): when tailscaled does not answer (or enrolment fails) within ``--retry``,
the names still come from the config alone, the hosts block gets at least this machine's own names
(-> loopback) when it has none, and the exit status is 0: the robot's ROS stack starts without the
overlay. ``--watch SECONDS`` (the root upkeep unit) keeps enrolment, the hosts block and the peer
relay prefs in step with tailscaled, every SECONDS and whenever tailscaled's IPN bus reports a
change, until SIGTERM; tailscaled going away or restarting is waited out, never an exit.

``--env-file FILE`` writes the same variables as a systemd EnvironmentFile instead (``KEY=value``
lines, no ``export``/``unset``; systemd rejects those), replacing FILE atomically. Exit status is
non-zero, and FILE is left untouched, whenever any step fails, so a unit that needs the file (or
a shell that checks the status) does not start with stale names.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional, Tuple

from overlay_manager.core.config import RobotConfig, load_robot_config, require_config_file
from overlay_manager.core.ros_env import RosEnv, compute_env
from overlay_manager.core.validation.errors import ConfigError
from overlay_manager.system import firewall
from overlay_manager.system.files import write_text
from overlay_manager.system.probes import resolve, tcp_answers

DEFAULT_CONFIG = "/etc/overlay_manager/robot.yaml"
CONFIG_ENV = "OVERLAY_MANAGER_CONFIG"
RETRY_PAUSE_S = 2.0  # seconds between --retry attempts
ENROL_RETRY_S = 30.0
"""--watch: seconds between enrolment attempts after an enrolment error (bad or used key, other
login server): slow enough not to hammer the control server, fast enough to pick up a new key."""
WATCH_MIN_PAUSE_S = 1.0
"""--watch: fewest seconds between two passes, however often tailscaled's IPN bus reports changes."""


def write_env_file(path: str, env: RosEnv) -> bool:
    """Write env as a systemd EnvironmentFile at path (mode 0644, atomic). True when it changed."""
    return write_text(Path(path), env.environment_file(), 0o644)


def install_ca(cfg: RobotConfig) -> str:
    """Copy cfg.ca_cert into the system trust store (Debian/Ubuntu; needs root). Returns a message."""
    if not cfg.ca_cert:
        raise ConfigError(cfg.source, "ca_cert", "not set; nothing to install")
    source = require_config_file(cfg, "ca_cert")  # ConfigError naming the file and key
    target = f"/usr/local/share/ca-certificates/overlay_manager-{cfg.base_domain}.crt"
    shutil.copyfile(source, target)
    subprocess.run(["update-ca-certificates"], check=True, capture_output=True)
    return f"installed {cfg.ca_cert} as {target}; restart tailscaled so it trusts the fleet CA"


def _err(msg: str) -> None:
    print(f"overlay_env: {msg}", file=sys.stderr)


def _enrol_and_write_hosts(cfg: RobotConfig, enrol: bool, write_hosts: bool, quiet: bool = False,
                           reauth: bool = False, relay: Optional[bool] = None) -> Tuple[str, str]:
    """Enrol if asked (log in again with a new key if reauth), set the config's peer relay prefs
    if relay (default: when enrolling), write the hosts block if asked; returns this machine's
    overlay name and overlay IPv4 address (each "" when unknown)."""
    from overlay_manager.core.peers import parse_status
    from overlay_manager.system.hosts import entries_for, has_block, own_names, update_hosts_file
    from overlay_manager.tailscaled.enrolment import ensure_enrolled
    from overlay_manager.tailscaled.localapi import LocalAPI
    api = LocalAPI(cfg.tailscale.socket)
    if enrol:
        result = ensure_enrolled(api, cfg, reauth=reauth)
        if not quiet or result.action != "already-enrolled":
            print(f"overlay_env: {result.message}", file=sys.stderr)
    if enrol if relay is None else relay:
        # the config's relay key: serve a peer relay (or stop serving one), idempotent
        from overlay_manager.tailscaled.relay import apply_relay
        relay = apply_relay(api, cfg.relay)
        if relay.changed or (relay.active and not quiet):
            print(f"overlay_env: {relay.message}", file=sys.stderr)
    snap = parse_status(api.status())
    if write_hosts and snap.backend_state != "Running" and has_block(cfg.node.hosts_file):
        # starting or logged out: tailscaled lists no peers now; keep their names meanwhile
        if not quiet:
            print(f"overlay_env: tailscaled is {snap.backend_state or 'not running'}: kept the managed "
                  f"block in {cfg.node.hosts_file} as it is", file=sys.stderr)
    elif write_hosts:
        # split horizon: this machine's own names -> loopback, the others -> overlay addresses
        own = own_names(snap.self_peer, cfg.fqdn, snap.peers)
        changed = update_hosts_file(cfg.node.hosts_file, entries_for(snap.peers, own))  # HostsError: caller
        if changed or not quiet:
            print(f"overlay_env: {cfg.node.hosts_file}: {', '.join(own)} -> loopback, overlay names of "
                  f"{len(snap.peers)} other machines", file=sys.stderr)
    return (snap.self_peer.dns_name, snap.self_peer.ipv4) if snap.self_peer else ("", "")


def write_own_names(cfg: RobotConfig) -> bool:
    """Without tailscaled: give node.hosts_file a managed block with this machine's own names
    (from the config) -> loopback when it has no block yet, so ROS_HOSTNAME resolves and the
    local ROS graph starts; an existing block (the names of an earlier boot) is kept as it is.
    True when the file changed. Raises HostsError (naming the file)."""
    from overlay_manager.system.hosts import entries_for, has_block, own_names, update_hosts_file
    if has_block(cfg.node.hosts_file):
        return False
    return update_hosts_file(cfg.node.hosts_file, entries_for([], own_names(None, cfg.fqdn)))


def keep_in_step(cfg: RobotConfig, enrol: bool, write_hosts: bool, interval_s: float,
                 stop: threading.Event) -> None:
    """The root upkeep loop (``overlay_env --watch``): until stop is set, repeat the same steps as
    ``overlay_env --enrol --write-hosts`` (enrol when tailscaled reports NeedsLogin, the config's
    peer relay prefs, the managed hosts block), every interval_s seconds and whenever tailscaled's
    IPN bus reports a change (at most once per WATCH_MIN_PAUSE_S). Nothing tailscaled does ends it:
    while tailscaled is gone or restarting, the hosts block is kept and the loop waits; an
    enrolment error is retried every ENROL_RETRY_S seconds. Every change of the outcome is printed
    once on stderr (the journal), each problem naming its cause.

    Threads: this one (LocalAPI, `tailscale up`, the hosts file; all bounded) and the IPN bus
    watcher's, which only sets an event."""
    from overlay_manager.system.hosts import HostsError
    from overlay_manager.system.workers import describe
    from overlay_manager.tailscaled.ipnbus import BusWatcher
    from overlay_manager.tailscaled.localapi import EnrolError, LocalAPI, TailscaleError
    api = LocalAPI(cfg.tailscale.socket)
    wake = threading.Event()
    watcher = BusWatcher(cfg.tailscale.socket, on_change=lambda _kinds: wake.set())
    watcher.start()
    next_enrol = 0.0            # monotonic s of the next enrolment attempt
    enrol_problem = ""          # the last enrolment error ("" = none)
    reported: Optional[str] = None
    try:
        while not stop.is_set():
            wake.clear()
            now = time.monotonic()
            problem = ""
            try:
                # enrol only when tailscaled says it needs a login: right after a restart it is
                # in NoState/Starting with its login intact, and `tailscale up` then would be a
                # needless second use of the key
                state = api.status().get("BackendState", "")
                try_enrol = enrol and state == "NeedsLogin" and now >= next_enrol
                _enrol_and_write_hosts(cfg, try_enrol, write_hosts, quiet=True, relay=enrol)
                if state == "Running":
                    enrol_problem = ""
            except EnrolError as exc:
                enrol_problem = f"enrolment failed: {exc} (next try in {ENROL_RETRY_S:.0f} s)"
                next_enrol = now + ENROL_RETRY_S
            except (TailscaleError, HostsError) as exc:
                problem = str(exc)
            except Exception as exc:  # noqa: BLE001 - the upkeep must outlive whatever tailscaled answers
                problem = f"unexpected failure: {describe(exc)}"
            outcome = "; ".join(p for p in (enrol_problem, problem) if p)
            if outcome != reported:
                _err(outcome or "in step with tailscaled (enrolment, peer relay prefs, hosts block)")
                reported = outcome
            stop.wait(WATCH_MIN_PAUSE_S)
            deadline = time.monotonic() + max(0.0, interval_s - WATCH_MIN_PAUSE_S)
            while not stop.is_set() and not wake.is_set() and time.monotonic() < deadline:
                wake.wait(min(0.5, max(0.0, deadline - time.monotonic())))
    finally:
        watcher.stop()


def main(argv: Optional[List[str]] = None) -> int:
    """overlay_env command line; exit 0 ok, 1 runtime failure, 2 bad config/usage."""
    ap = argparse.ArgumentParser(
        prog="overlay_env",
        description="Print ROS_HOSTNAME/ROS_MASTER_URI in overlay names for eval in a shell.")
    ap.add_argument("--config", default=os.environ.get(CONFIG_ENV, DEFAULT_CONFIG),
                    help=f"robot config (default ${CONFIG_ENV} or {DEFAULT_CONFIG})")
    ap.add_argument("--enrol", action="store_true",
                    help="log tailscaled in first if it is not (uses auth_key_file)")
    ap.add_argument("--reauth", action="store_true",
                    help="with --enrol: log in again with auth_key_file even if already logged in "
                         "(a new key from `fleet rotate`, or a node key that expired); keeps this "
                         "machine's name and settings")
    ap.add_argument("--write-hosts", action="store_true",
                    help="write the managed overlay-names block into node.hosts_file now")
    ap.add_argument("--wait-master", type=float, default=0.0, metavar="SECONDS",
                    help="wait up to SECONDS for the master's XML-RPC port to answer")
    ap.add_argument("--retry", type=float, default=0.0, metavar="SECONDS",
                    help="keep retrying --enrol/--write-hosts for up to SECONDS while tailscaled or "
                         "the network is not up yet (at boot); a bad config fails at once")
    ap.add_argument("--env-file", metavar="FILE",
                    help="write the variables to FILE as a systemd EnvironmentFile (KEY=value) "
                         "instead of printing shell lines; FILE is replaced atomically, and left "
                         "untouched when anything fails")
    ap.add_argument("--offline-ok", action="store_true",
                    help="when tailscaled does not answer or enrolment fails within --retry, still "
                         "succeed: names from the config alone, and with --write-hosts this "
                         "machine's own names -> loopback in the hosts file if it has no managed "
                         "block (boot: the robot's ROS stack starts without the overlay)")
    ap.add_argument("--watch", type=float, default=0.0, metavar="SECONDS",
                    help="with --enrol/--write-hosts: keep them (and the peer relay prefs) in step "
                         "with tailscaled every SECONDS and on every change it reports, until "
                         "SIGTERM; tailscaled restarting or gone is waited out (root upkeep unit)")
    ap.add_argument("--install-ca", action="store_true",
                    help="install ca_cert into the system trust store (root) and exit")
    ap.add_argument("--rosbridge-firewall", metavar="PORT",
                    help="(root) install the nftables table inet overlay_manager: TCP PORT (rosbridge's "
                         "websocket) accepted on lo and the overlay interface only; 0 removes it. "
                         "Alone: do that and exit; with other options: first, then the rest")
    ap.add_argument("--overlay-interface", default=firewall.OVERLAY_INTERFACE, metavar="NAME",
                    help=f"tailscaled's TUN interface for --rosbridge-firewall (default {firewall.OVERLAY_INTERFACE})")
    args = ap.parse_args(argv)
    if args.reauth and not args.enrol:
        ap.error("--reauth needs --enrol")
    if args.watch < 0 or (args.watch and not (args.enrol or args.write_hosts)):
        ap.error("--watch SECONDS (> 0) needs --enrol and/or --write-hosts")
    if args.watch and (args.reauth or args.env_file or args.wait_master):
        ap.error("--watch runs the upkeep loop only: no --reauth, --env-file or --wait-master")
    if args.rosbridge_firewall is not None:
        try:
            print("overlay_env: " + firewall.apply(firewall.optional_port(args.rosbridge_firewall),
                                                   args.overlay_interface), file=sys.stderr)
        except firewall.FirewallError as exc:
            _err(f"--rosbridge-firewall: {exc}")
            return 1
        if not (args.enrol or args.write_hosts or args.wait_master or args.env_file or args.install_ca):
            return 0
    try:
        cfg = load_robot_config(args.config)
    except ConfigError as exc:
        hint = (f"\n  (pass --config FILE or set {CONFIG_ENV}; example: config/robot.example.yaml)"
                if exc.key == "(file)" else "")  # only when the file itself is the problem
        _err(f"{exc}{hint}")
        return 2
    if args.install_ca:
        try:
            print(install_ca(cfg), file=sys.stderr)
        except (OSError, subprocess.CalledProcessError, ConfigError) as exc:
            _err(f"cannot install CA: {exc}")
            return 1
        return 0
    if args.watch:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        keep_in_step(cfg, args.enrol, args.write_hosts, args.watch, stop)
        return 0
    self_dns, address = "", ""
    if args.enrol or args.write_hosts:
        from overlay_manager.system.hosts import HostsError
        from overlay_manager.tailscaled.localapi import TailscaleError
        deadline = time.monotonic() + args.retry
        while True:
            try:
                self_dns, address = _enrol_and_write_hosts(cfg, args.enrol, args.write_hosts, reauth=args.reauth)
                break
            except HostsError as exc:  # the file needs a person (unbalanced markers, permissions)
                _err(str(exc))
                return 1
            except (TailscaleError, OSError) as exc:
                if time.monotonic() + RETRY_PAUSE_S > deadline:
                    _err(str(exc) + (f" (retried for {args.retry:.0f} s)" if args.retry > 0 else ""))
                    if not args.offline_ok:
                        return 1
                    try:
                        if args.write_hosts and write_own_names(cfg):
                            _err(f"{cfg.node.hosts_file}: {cfg.fqdn} -> loopback (no managed block yet)")
                    except HostsError as hexc:
                        _err(str(hexc))
                        return 1
                    _err("going on without tailscaled (--offline-ok): ROS names from the config alone")
                    break
                _err(f"{exc}; retrying in {RETRY_PAUSE_S:.0f} s")
                time.sleep(RETRY_PAUSE_S)
    env = compute_env(cfg, self_dns, address)
    if args.wait_master > 0:
        host = cfg.master_fqdn
        deadline = time.monotonic() + args.wait_master
        while not (resolve(host) and tcp_answers(host, cfg.master_port, 1.0)):
            if time.monotonic() > deadline:
                _err(f"ROS master {host}:{cfg.master_port} did not answer within {args.wait_master:.0f} s "
                     f"(resolves to {resolve(host) or 'nothing'}); is roscore running there and is "
                     f"the overlay up?")
                return 1
            time.sleep(0.5)
            if args.write_hosts:  # the master may enrol after us: refresh the names
                try:
                    _enrol_and_write_hosts(cfg, False, True, quiet=True)
                except Exception as exc:  # noqa: BLE001 - keep waiting; report at the deadline
                    _err(f"refreshing {cfg.node.hosts_file}: {exc}")
    if args.env_file:
        try:
            changed = write_env_file(args.env_file, env)
        except (OSError, ValueError) as exc:
            _err(f"cannot write {args.env_file}: {exc}")
            return 1
        print(f"overlay_env: {args.env_file}: {'written' if changed else 'unchanged'} "
              f"(ROS_HOSTNAME={env.ros_hostname}, ROS_MASTER_URI={env.ros_master_uri})", file=sys.stderr)
        return 0
    sys.stdout.write(env.shell())
    return 0
