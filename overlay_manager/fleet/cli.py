"""``fleet``: provision a Headscale overlay for a robot fleet from one fleet file.

    fleet [-f FLEET_FILE] [-d DEPLOY_DIR] COMMAND ...

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

Errors print ``fleet: error: ...`` on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

from ..validation import ConfigError, redact
from ..waiting import wait_for
from .bundle import nodes_named, write_bundle
from .config import FleetConfig, FleetError, load_fleet
from .deploy import Deployment, apply_policy, init_deployment, write_derp_map
from .ops import fleet_status, revoke, rotate, sync_tags
from .policy import render_policy


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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleet", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[4:15]))
    p.add_argument("-f", "--fleet", default="fleet.yaml",
                   help="fleet file (default: ./fleet.yaml)")
    p.add_argument("-d", "--deployment", default="headscale",
                   help="deployment directory (default: ./headscale)")
    p.add_argument("--headscale", default=None,
                   help="headscale binary (default: $HEADSCALE_BIN, .tools/bin/headscale, PATH)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser("init", help="write or converge the headscale deployment")
    s = sub.add_parser("serve", help="run headscale in the foreground with the deployment")
    s.add_argument("--unit", action="store_true", help="print a systemd unit instead")
    s = sub.add_parser("policy", help="check, apply and reload the ACL policy")
    s.add_argument("--print", action="store_true", help="only print the generated policy")
    s = sub.add_parser("bundle", help="write enrolment bundles")
    s.add_argument("host", nargs="?", help="host short name")
    s.add_argument("--all", action="store_true", help="every host of the fleet file")
    s.add_argument("-o", "--out", default=None,
                   help="bundle directory (default: bundles/HOST; with --all: DIR/HOST)")
    s = sub.add_parser("status", help="show every host's enrolment state")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s = sub.add_parser("revoke", help="expire a host's node and pre-auth key")
    s.add_argument("host")
    s.add_argument("--delete", action="store_true", help="also delete the node from headscale")
    s = sub.add_parser("rotate", help="replace a host's pre-auth key and write a new bundle")
    s.add_argument("host")
    s.add_argument("-o", "--out", default=None, help="bundle directory (default: bundles/HOST)")
    s.add_argument("--expire-node", action="store_true",
                   help="also expire the enrolled node (it must enrol again)")
    return p


def _bundle_dir(args: argparse.Namespace, host: str) -> Path:
    if args.out and not getattr(args, "all", False):
        return Path(args.out)
    return Path(args.out or "bundles") / host


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


def run(argv: List[str]) -> int:
    """Run one command; return the exit status. Raises FleetError or ConfigError on failure."""
    args = _parser().parse_args(argv)
    fleet: Optional[FleetConfig] = None

    def need_fleet() -> FleetConfig:
        nonlocal fleet
        if fleet is None:
            fleet = load_fleet(args.fleet)
        return fleet

    if args.cmd == "init":
        dep = init_deployment(need_fleet(), args.deployment, args.headscale)
        print(f"deployment: {dep.root}")
        print(f"server_url: {dep.server_url}")
        print(f"ca_cert:    {dep.ca_cert or '(none: system trust store)'}")
        print(f"next: fleet -f {args.fleet} -d {args.deployment} serve")
        return 0

    if args.cmd == "policy" and args.print:
        sys.stdout.write(render_policy(need_fleet()))
        return 0

    dep = Deployment.open(args.deployment, args.headscale)

    if args.cmd == "serve":
        argv_hs = dep.serve_argv()
        if args.unit:
            print(f"""[Unit]
Description=Headscale control server of fleet {dep.fleet_name}
After=network-online.target
Wants=network-online.target

[Service]
ExecStart={' '.join(argv_hs)}
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target""")
            return 0
        dep.pid_path.write_text(f"{os.getpid()}\n")
        sys.stdout.flush()
        os.execv(argv_hs[0], argv_hs)

    if args.cmd == "policy":
        fleet = need_fleet()
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

    if args.cmd == "bundle":
        f = need_fleet()
        if args.all == bool(args.host):
            raise FleetError("give a HOST or --all")
        hosts = list(f.hosts) if args.all else [args.host]
        for h in hosts:
            f.host(h)  # unknown host: error naming the fleet file
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

    if args.cmd == "status":
        rows = fleet_status(dep, need_fleet())
        if args.json:
            print(json.dumps([{
                "host": r.host, "team": r.team, "role": r.role, "state": r.state,
                "node_id": r.node_id, "ip": r.ip,
                "last_seen": r.last_seen.isoformat() if r.last_seen else None,
                "node_expiry": r.node_expiry.isoformat() if r.node_expiry else None,
                "key_id": r.key_id,
                "key_expiry": r.key_expiry.isoformat() if r.key_expiry else None,
                "tags": list(r.tags), "problems": list(r.problems)} for r in rows], indent=2))
            return 0
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
        return 0

    if args.cmd == "revoke":
        try:
            f: Optional[FleetConfig] = need_fleet()
        except ConfigError:
            if Path(args.fleet).exists():
                raise
            f = None
        res = revoke(dep, f, args.host, delete=args.delete)
        print(f"{args.host}: nodes expired {list(res.expired_nodes)}, deleted "
              f"{list(res.deleted_nodes)}, pre-auth keys expired {list(res.expired_keys)}")
        return 0

    if args.cmd == "rotate":
        path = rotate(dep, need_fleet(), args.host, _bundle_dir(args, args.host),
                      expire_node=args.expire_node)
        print(f"{args.host}: new bundle {path}")
        return 0
    return 2  # unreachable: argparse requires a command


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of scripts/fleet: exit 0 on success, 2 with ``fleet: error: ...``."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except (FleetError, ConfigError) as e:
        print(f"fleet: error: {redact(' '.join(str(e).split()))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
