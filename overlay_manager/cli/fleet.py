"""``fleet``: provision a Headscale overlay for a robot fleet from one fleet file.

    fleet COMMAND [-f FLEET_FILE] [-d DEPLOY_DIR] [--headscale PATH] ...

    init                 write/converge the headscale deployment (config, CA + cert, policy,
                         DERP map of the fleet's derp_regions)
    serve [--unit]       run headscale in the foreground (or print a systemd unit)
    policy [--print]     regenerate the ACL policy (and the DERP map), check it with headscale,
                         swap it in, reload
    bundle HOST|--all    write enrolment bundles (robot.yaml, ca.crt, auth.key 0600; a derper
                         host's also derper/: certificate, unit, mesh key); a revoked
                         host is refused: `rotate` it
    status [--json]      every host: state, last seen, expiries, tags, team
    revoke HOST          expire the host's node and key (--delete: also delete the node)
    rotate HOST          expire the host's key and write a new bundle
    renew-cert [--force] re-issue the server certificate from the fleet CA before it expires

The global options (-f, -d, --headscale) go before or after the command. Only the commands
that talk to headscale need its binary (serve, policy, bundle, status, revoke, rotate).
Errors print ``fleet: error: ...`` (one line) on stderr and exit with status 2. A headscale
binary whose version is not a supported one (or cannot be told) gets one ``fleet: warning: ...``
line naming it, the version found and the supported range (init and every command that runs it).

Adding a command: write ``cmd_<name>(args) -> int`` and, if it takes options, an
``_args_<name>(parser)``; add one :class:`Verb` to :data:`VERBS`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from overlay_manager.core.validation import ConfigError, redact
from overlay_manager.fleet import tls
from overlay_manager.fleet.bundle import nodes_named, write_bundle
from overlay_manager.fleet.config import load_fleet
from overlay_manager.fleet.deploy import (
    Deployment,
    apply_policy,
    cert_notices,
    init_deployment,
    renew_server_cert,
    write_derp_map,
)
from overlay_manager.fleet.headscale import find_headscale, version_problem
from overlay_manager.fleet.model import FleetConfig, FleetError
from overlay_manager.fleet.ops import fleet_status, revoke, rotate, sync_tags
from overlay_manager.fleet.policy import render_policy
from overlay_manager.fleet.unit import render_unit
from overlay_manager.system.waiting import wait_for

# --- global options --------------------------------------------------------------------------

_GLOBALS: Tuple[Tuple[Tuple[str, ...], Optional[str], str], ...] = (
    (("-f", "--fleet"), "fleet.yaml", "fleet file (default: ./fleet.yaml)"),
    (("-d", "--deployment"), "headscale", "deployment directory (default: ./headscale)"),
    (("--headscale",), None, "headscale binary, for the commands that run it "
                             "(default: $HEADSCALE_BIN, .tools/bin/headscale, PATH)"),
)


def _global_options(after_verb: bool) -> argparse.ArgumentParser:
    """The global options as an argparse parent. After the verb their default is SUPPRESS, so
    an option given before the verb is not overwritten by the subcommand's default."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("global options (before or after the command)")
    for flags, default, help_text in _GLOBALS:
        g.add_argument(*flags, default=argparse.SUPPRESS if after_verb else default, help=help_text)
    return p


# --- helpers ---------------------------------------------------------------------------------

def _fmt_time(t: Optional[datetime], now: datetime) -> str:
    if t is None:
        return "-"
    d = (t - now).total_seconds()
    sign, d = ("in ", d) if d >= 0 else ("", -d)
    if d < 120:
        s = f"{int(d)}s"
    elif d < 7200:
        s = f"{int(d // 60)}m"
    elif d < 172800:
        s = f"{int(d // 3600)}h"
    else:
        s = f"{int(d // 86400)}d"
    return f"{sign}{s}" if sign else f"{s} ago"


def _bundle_dir(args: argparse.Namespace, host: str) -> Path:
    if args.out and not getattr(args, "all", False):
        return Path(args.out)
    return Path(args.out or "bundles") / host


def _fleet_cmd(args: argparse.Namespace, verb: str) -> str:
    """The command line that runs ``verb`` on the same fleet file and deployment."""
    return f"fleet -f {args.fleet} -d {args.deployment} {verb}"


def _open(args: argparse.Namespace, needed_for: str = "") -> Deployment:
    """The deployment of ``-d``; with ``needed_for`` the headscale binary is looked up now, so a
    missing one is reported before anything is done (naming the command and the flag)."""
    dep = Deployment.open(args.deployment, args.headscale)
    if needed_for:
        dep.headscale = dep.binary(needed_for)
        _check_version(dep.headscale)
    return dep


def _check_version(binary: str) -> None:
    """One ``fleet: warning:`` line on stderr when ``binary``'s headscale version is not a
    supported one or cannot be told (it may still work: the line says why it may not)."""
    problem = version_problem(binary)
    if problem:
        print(f"fleet: warning: {problem}", file=sys.stderr)


def _print_notices(notices: List[tls.CertNotice]) -> bool:
    """Print each certificate notice as one ``fleet: warning:`` / ``fleet: error:`` line on
    stderr; True when one of them is an error (a certificate has expired)."""
    for n in notices:
        print(f"fleet: {n.level}: {n.line()}", file=sys.stderr)
    return any(n.level == "error" for n in notices)


def revoked_hosts(dep: Deployment, hosts: List[str]) -> List[str]:
    """Those of ``hosts`` whose every headscale node is expired (``fleet revoke`` ran).

    A revoked machine cannot re-enrol with a new pre-auth key while its expired node exists:
    headscale 0.29 keeps a tagged node's expiry and spends the key on it. Hosts that never
    enrolled, or that have a live node, are not revoked.
    """
    nodes = dep.cli().list_nodes()
    out = []
    for host in hosts:
        mine = nodes_named(nodes, host)
        if mine and all(n.expired() for n in mine):
            out.append(host)
    return out


# --- commands: one function each ---------------------------------------------------------------

def cmd_init(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet)
    try:  # the headscale init records (and runs, to check a changed policy), if there is one
        binary = args.headscale or find_headscale()
    except FleetError:
        binary = ""  # init needs none
    if binary:
        _check_version(binary)
    crt = Path(args.deployment).expanduser().resolve() / "tls" / "server.crt"
    before = tls.not_after(crt) if crt.exists() else None
    dep = init_deployment(fleet, args.deployment, args.headscale)
    print(f"deployment: {dep.root}")
    print(f"server_url: {dep.server_url}")
    print(f"ca_cert:    {dep.ca_cert or '(none: system trust store)'}")
    if before is not None and crt.exists() and tls.not_after(crt) != before:
        print(f"server certificate re-issued (valid until {tls.not_after(crt):%Y-%m-%d}): restart "
              "headscale to serve it")
    if _print_notices(cert_notices(dep, fleet, _fleet_cmd(args, "renew-cert"))):
        return 2
    print(f"next: {_fleet_cmd(args, 'serve')}")
    return 0


def _args_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--unit", action="store_true", help="print a systemd unit instead")


def cmd_serve(args: argparse.Namespace) -> int:
    dep = _open(args, "`fleet serve`")
    argv_hs = dep.serve_argv()
    if args.unit:
        sys.stdout.write(render_unit(dep.fleet_name, argv_hs))
        return 0
    dep.pid_path.write_text(f"{os.getpid()}\n")
    sys.stdout.flush()
    os.execv(argv_hs[0], argv_hs)
    return 0  # not reached: execv replaces this process


def _args_policy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--print", action="store_true", help="only print the generated policy")


def cmd_policy(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet)
    if args.print:
        sys.stdout.write(render_policy(fleet))
        return 0
    dep = _open(args, "`fleet policy`")
    if write_derp_map(dep.root, fleet):
        print(f"DERP map written: {dep.derp_map_path} (headscale reads it when it starts: restart "
              "it; existing links keep their relays meanwhile)")
    res = apply_policy(dep, fleet)
    if not res.changed:
        print(f"policy unchanged: {dep.policy_path}")
    else:
        print(f"policy checked ({res.checked}) and installed: {dep.policy_path}")
        print("headscale reloaded (SIGHUP)" if res.reloaded
              else "headscale not running: it loads the policy when started")
    if dep.cli().health():
        # enrolled hosts keep their tags when they re-enrol: give them the fleet file's
        # (e.g. tag:relay for a new relay); headscale takes them once the reload is done
        for line in wait_for("headscale to accept the fleet file's tags",
                             lambda: sync_tags(dep, fleet) or ["tags of enrolled hosts: as in the fleet file"],
                             15.0, interval=0.5, error=FleetError):
            print(line)
    return 0


def _args_bundle(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", nargs="?", help="host short name")
    p.add_argument("--all", action="store_true", help="every host of the fleet file")
    p.add_argument("-o", "--out", default=None,
                   help="bundle directory (default: bundles/HOST; with --all: DIR/HOST)")


def cmd_bundle(args: argparse.Namespace) -> int:
    f = load_fleet(args.fleet)
    if args.all == bool(args.host):
        raise FleetError("give a HOST or --all")
    hosts = list(f.hosts) if args.all else [args.host]
    for h in hosts:
        f.host(h)  # unknown host: error naming the fleet file
    dep = _open(args, "`fleet bundle` (it creates the pre-auth keys)")
    revoked = revoked_hosts(dep, hosts)
    for host in hosts:
        if host not in revoked:
            path = write_bundle(dep, f, host, _bundle_dir(args, host))
            print(f"{host}: {path}")
    if revoked:
        raise FleetError(
            f"{', '.join(revoked)}: revoked (the node is expired); a bundle would not enrol, "
            "because headscale spends its key on the expired node. Use `fleet rotate "
            f"{revoked[0]}`: it deletes the expired node and writes a bundle that enrols afresh"
            + (" (the other hosts' bundles were written)" if len(hosts) > len(revoked) else ""))
    return 0


def _args_status(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_status(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet)
    dep = _open(args, "`fleet status`")
    expired = _print_notices(cert_notices(dep, fleet, _fleet_cmd(args, "renew-cert")))
    rows = fleet_status(dep, fleet)
    if args.json:
        print(json.dumps([{
            "host": r.host, "team": r.team, "role": r.role, "state": r.state,
            "node_id": r.node_id, "ip": r.ip,
            "last_seen": r.last_seen.isoformat() if r.last_seen else None,
            "node_expiry": r.node_expiry.isoformat() if r.node_expiry else None,
            "key_id": r.key_id,
            "key_expiry": r.key_expiry.isoformat() if r.key_expiry else None,
            "tags": list(r.tags), "problems": list(r.problems)} for r in rows], indent=2))
        return 2 if expired else 0
    now = datetime.now(timezone.utc)
    head = ("HOST", "TEAM", "ROLE", "STATE", "IP", "LAST SEEN", "NODE EXPIRY", "KEY EXPIRY",
            "TAGS")
    table = [head] + [(r.host, r.team or "-", r.role or "-", r.state, r.ip or "-",
                       _fmt_time(r.last_seen, now), _fmt_time(r.node_expiry, now),
                       _fmt_time(r.key_expiry, now), ",".join(r.tags)) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    for r in rows:
        for p in r.problems:
            print(f"{r.host}: {p}")
    return 2 if expired else 0


def _args_revoke(p: argparse.ArgumentParser) -> None:
    p.add_argument("host")
    p.add_argument("--delete", action="store_true", help="also delete the node from headscale")


def cmd_revoke(args: argparse.Namespace) -> int:
    try:
        f: Optional[FleetConfig] = load_fleet(args.fleet)
    except ConfigError:
        if Path(args.fleet).exists():
            raise
        f = None  # revoking a node that is not in (or without) a fleet file
    dep = _open(args, "`fleet revoke`")
    res = revoke(dep, f, args.host, delete=args.delete)
    print(f"{args.host}: nodes expired {list(res.expired_nodes)}, deleted "
          f"{list(res.deleted_nodes)}, pre-auth keys expired {list(res.expired_keys)}")
    return 0


def _args_rotate(p: argparse.ArgumentParser) -> None:
    p.add_argument("host")
    p.add_argument("-o", "--out", default=None, help="bundle directory (default: bundles/HOST)")
    p.add_argument("--expire-node", action="store_true",
                   help="also expire the enrolled node (it must enrol again)")


def cmd_rotate(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet)
    dep = _open(args, "`fleet rotate`")
    path = rotate(dep, fleet, args.host, _bundle_dir(args, args.host), expire_node=args.expire_node)
    print(f"{args.host}: new bundle {path}")
    return 0


def _args_renew_cert(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true",
                   help="re-issue even when the certificate is valid for 30 more days")


def cmd_renew_cert(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet)
    dep = _open(args)
    res = renew_server_cert(dep, fleet, force=args.force)
    if not res.renewed:
        print(f"{res.crt}: valid until {res.not_after:%Y-%m-%d %H:%M} UTC, names unchanged: kept "
              "(--force re-issues it anyway)")
    else:
        running = dep.server_pid() is not None
        print(f"{res.crt}: re-issued from the fleet CA ({res.reason}), valid until "
              f"{res.not_after:%Y-%m-%d %H:%M} UTC; robots keep trusting it (same CA)")
        print("restart headscale to serve it (e.g. systemctl restart headscale-"
              f"{dep.fleet_name}, or stop `fleet serve` and start it again)" if running
              else "headscale is not running: it serves the new certificate when started")
    _print_notices([n for n in cert_notices(dep, fleet, _fleet_cmd(args, "renew-cert"))
                    if n.file != res.crt])
    return 0


@dataclass(frozen=True)
class Verb:
    """One ``fleet`` command: its name, one-line help, how to run it and its own options."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None


VERBS: Tuple[Verb, ...] = (
    Verb("init", "write or converge the headscale deployment", cmd_init),
    Verb("serve", "run headscale in the foreground with the deployment", cmd_serve, _args_serve),
    Verb("policy", "check, apply and reload the ACL policy", cmd_policy, _args_policy),
    Verb("bundle", "write enrolment bundles", cmd_bundle, _args_bundle),
    Verb("status", "show every host's enrolment state", cmd_status, _args_status),
    Verb("revoke", "expire a host's node and pre-auth key", cmd_revoke, _args_revoke),
    Verb("rotate", "replace a host's pre-auth key and write a new bundle", cmd_rotate, _args_rotate),
    Verb("renew-cert", "re-issue the server certificate from the fleet CA", cmd_renew_cert,
         _args_renew_cert),
)


def _parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    lines = doc.split("\n")
    table = lines[4:lines.index("", 4)]
    p = argparse.ArgumentParser(prog="fleet", description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(table), parents=[_global_options(False)])
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    after = _global_options(True)
    for v in VERBS:
        s = sub.add_parser(v.name, help=v.help, description=v.help, parents=[after])
        if v.arguments is not None:
            v.arguments(s)
        s.set_defaults(run=v.run)
    return p


def run(argv: List[str]) -> int:
    """Run one command; return the exit status. Raises FleetError or ConfigError on failure."""
    args = _parser().parse_args(argv)
    return args.run(args)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of scripts/fleet: exit 0 on success, 2 with ``fleet: error: ...``."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except (FleetError, ConfigError) as e:
        print(f"fleet: error: {redact(' '.join(str(e).split()))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
