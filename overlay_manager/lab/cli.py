"""``lab``: command line of the campus lab (scripts/lab in a source checkout; not installed).

    lab up SPEC [--run-id ID] [--workdir DIR] [--no-tailscaled] [--enrol]
    lab status [--json]
    lab exec HOST -- CMD...
    lab block-udp BUILDING | lab unblock-udp BUILDING
    lab cut BUILDING | lab uncut BUILDING
    lab headscale stop|start
    lab impair LINK [--delay MS] [--jitter MS] [--loss PCT] [--rate MBIT] | lab impair LINK --clear
    lab ping HOST PEER
    lab move HOST BUILDING [--handover S] | lab move HOST --home
    lab flap TARGET [--kind link|udp] [--count N] [--period S] [--down S]
    lab kill-tailscaled HOST | lab start-tailscaled HOST | lab kill-derper HOST | lab start-derper HOST
    lab actions [--json]
    lab down [--run-id ID | --all]
    lab nat-matrix [--out DIR] [--count N] [--parallel N] [--keep] [--relay]   (own run; see matrix/run.py)

Every command prints what it does (with the namespace) to stderr. Exit codes: 0 ok, 1 a lab
error (message on stderr), 2 usage error, otherwise the exit code of ``lab exec``'s command.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Optional, Sequence

from overlay_manager.core.validation import ConfigError
from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.spec_model import Impairment
from overlay_manager.lab.campus.teardown import down_all, leftover_runs, teardown_run


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lab", description="Campus lab: buildings behind NATs in network "
                                "namespaces, Headscale and one tailscaled per host (root only).")
    run_help = "run to act on (default: the only run); for `up`: 1..8 of [a-z0-9], default random"
    p.add_argument("--run-id", help=run_help)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run-id", default=argparse.SUPPRESS, help=run_help)
    sub = p.add_subparsers(dest="cmd", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, parents=[common])

    up = command("up", "build the lab from a spec (config/lab/*.yaml)")
    up.add_argument("spec", help="lab spec file, e.g. config/lab/two_buildings.yaml")
    up.add_argument("--workdir", help="per-host files and logs (default /run/overlay-lab/<run>)")
    up.add_argument("--no-tailscaled", action="store_true", help="do not start tailscaled on the hosts")
    up.add_argument("--enrol", action="store_true", help="also enrol every host with `tailscale up`")
    st = command("status", "namespaces, NAT kinds, processes, tailscale states")
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    ex = command("exec", "run a command in a host's (router's, control's) namespace")
    ex.add_argument("host", help="a host of the spec, a building (its router), control or backbone")
    ex.add_argument("argv", nargs=argparse.REMAINDER, help="the command and its arguments")
    for name, text in (("block-udp", "drop all UDP at a building's router"),
                       ("unblock-udp", "undo block-udp"),
                       ("cut", "cut a building off the backbone"), ("uncut", "undo cut")):
        command(name, text).add_argument("building", help="building name from the spec, e.g. b1")
    hs = command("headscale", "stop or start the control server")
    hs.add_argument("action", choices=["stop", "start"], help="stop or start headscale")
    im = command("impair", "tc netem on a link (control, a building's uplink, a host's LAN link)")
    im.add_argument("link", help="control, a building name (its uplink) or a host name (its LAN link)")
    im.add_argument("--delay", type=float, default=0.0, help="one-way delay, ms")
    im.add_argument("--jitter", type=float, default=0.0, help="delay jitter, ms")
    im.add_argument("--loss", type=float, default=0.0, help="loss per direction, percent")
    im.add_argument("--rate", type=float, default=0.0, help="rate limit per direction, Mbit/s")
    im.add_argument("--clear", action="store_true", help="remove the impairment")
    pg = command("ping", "tailscale ping from HOST to PEER; prints the path")
    pg.add_argument("host", help="host to ping from")
    pg.add_argument("peer", help="host to ping (short name)")
    mv = command("move", "roam a host's LAN link to another building (new address, gateway, NAT)")
    mv.add_argument("host", help="host to move")
    mv.add_argument("building", nargs="?", help="building to move it to")
    mv.add_argument("--home", action="store_true", help="move it back to its own building")
    mv.add_argument("--handover", type=float, default=0.0, help="seconds without carrier in between")
    fl = command("flap", "take a link down and up on a schedule (runs until done)")
    fl.add_argument("target", help="a host (kind link: its LAN link) or a building (kind udp)")
    fl.add_argument("--kind", choices=["link", "udp"], default="link", help="link carrier or UDP at the router")
    fl.add_argument("--count", type=int, default=10, help="number of flaps")
    fl.add_argument("--period", type=float, default=2.0, help="seconds from one flap to the next")
    fl.add_argument("--down", type=float, default=1.0, help="seconds down per flap")
    for name, text in (("kill-tailscaled", "kill -9 a host's tailscaled (e.g. a peer relay dies)"),
                       ("start-tailscaled", "start a host's tailscaled again"),
                       ("kill-derper", "kill -9 derper on a host (its region dies, the host stays up)"),
                       ("start-derper", "start derper on a host again")):
        command(name, text).add_argument("host", help="host name from the spec")
    ac = command("actions", "the run's runtime actions with their times (monotonic and wall clock)")
    ac.add_argument("--json", action="store_true", help="one JSON object per line")
    dn = command("down", "tear a run down (also after a crash)")
    dn.add_argument("--all", action="store_true", help="every lab run and leftover on this machine")
    from overlay_manager.lab.matrix.run import add_arguments as matrix_arguments
    matrix_arguments(command("nat-matrix", "tailscale path for every pair of NAT kinds (own run, a few minutes)"))
    return p


def _print_status(s: dict) -> None:
    print(f"run {s['run_id']} ({s['phase']}), workdir {s['workdir']}, headscale {s['server_url']}")
    hs = s["processes"].get("headscale")
    headscale = f"running pid {hs['pid']}" if hs and hs["alive"] else "stopped"
    print(f"  control   {s['control']['namespace']:<24} {s['control']['address']:<15} headscale {headscale}")
    for name, b in s["buildings"].items():
        flags = [f for f in ("udp_blocked", "cut", "udp_servers_only") if b.get(f)]
        print(f"  building  {b['namespace']:<24} {b['public_address']:<15} {name}: NAT {b['nat']}, "
              f"LAN {b['lan']}" + (f" [{', '.join(flags)}]" if flags else ""))
    for name, h in s["hosts"].items():
        ips = ", ".join(h.get("overlay_ips") or [])
        print(f"  host      {h['namespace']:<24} {h['address']:<15} {name} in {h['building']}: "
              f"{h.get('backend_state')}" + (f" {ips}" if ips else ""))
    for link, imp in s["impair"].items():
        print(f"  impair    {link}: {imp}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "up":
            if os.geteuid() != 0:
                raise LabError("lab up needs root (network namespaces)")
            lab = Lab(args.spec, run_id=args.run_id, workdir=args.workdir)
            try:
                lab.up(start_tailscaled=not args.no_tailscaled)
                if lab.spec.derp.regions and not args.no_tailscaled:
                    lab.start_derpers()  # enrols the derper hosts: derper verifies clients through them
                if args.enrol and not args.no_tailscaled:
                    lab.tailscale_up_all()
            except BaseException:
                lab.echo("up failed: tearing the run down")
                lab.down()
                raise
            _print_status(lab.status())
            print(f"tear down with: scripts/lab --run-id {lab.run_id} down")
            return 0
        if args.cmd == "nat-matrix":
            from overlay_manager.lab.matrix.run import main_from_args
            return main_from_args(args)
        if args.cmd == "down":
            if args.all:
                runs = down_all()
                print(f"removed runs: {', '.join(runs) or 'none'}")
                return 0
            run_id = args.run_id
            if run_id is None:
                runs = leftover_runs()
                if len(runs) != 1:
                    raise LabError("no lab run found" if not runs else
                                   f"several runs exist ({', '.join(runs)}): pass --run-id or --all")
                run_id = runs[0]
            errors = teardown_run(run_id)
            if errors:
                raise LabError("; ".join(errors))
            print(f"removed run {run_id}")
            return 0
        lab = Lab.attach(args.run_id)
        if args.cmd == "status":
            s = lab.status()
            if args.json:
                print(json.dumps(s, indent=2))
            else:
                _print_status(s)
        elif args.cmd == "exec":
            argv_ = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not argv_:
                raise LabError("lab exec HOST -- CMD: no command given")
            ns = lab.namespace(args.host)
            lab.echo(f"({ns}) {' '.join(argv_)}")
            env = lab.host_env(args.host) if args.host in lab.hosts else None
            return subprocess.call(["ip", "netns", "exec", ns, *argv_], env=env)
        elif args.cmd == "block-udp":
            lab.block_udp(args.building)
        elif args.cmd == "unblock-udp":
            lab.unblock_udp(args.building)
        elif args.cmd == "cut":
            lab.cut(args.building)
        elif args.cmd == "uncut":
            lab.uncut(args.building)
        elif args.cmd == "headscale":
            lab.headscale_start() if args.action == "start" else lab.headscale_stop()
        elif args.cmd == "impair":
            imp = None if args.clear else Impairment(args.delay, args.jitter, args.loss, args.rate)
            lab.impair(args.link, imp)
        elif args.cmd == "move":
            if args.home == bool(args.building):
                raise LabError("lab move HOST BUILDING or lab move HOST --home (exactly one)")
            rec = (lab.move_home(args.host, args.handover) if args.home
                   else lab.move(args.host, args.building, args.handover))
            print(f"{args.host}: {rec['from_building']} {rec['old_address']} -> {rec['to_building']} "
                  f"{rec['new_address']} in {rec['done_mono'] - rec['t_mono']:.3f} s")
        elif args.cmd == "flap":
            recs = lab.flap(args.target, args.kind, args.count, args.period, args.down)
            print(f"{args.target}: {len(recs)} actions ({args.kind}), see `lab actions`")
        elif args.cmd == "kill-tailscaled":
            lab.kill_tailscaled(args.host)
        elif args.cmd == "start-tailscaled":
            lab.restore_tailscaled(args.host)
        elif args.cmd == "kill-derper":
            lab.kill_derper(args.host)
        elif args.cmd == "start-derper":
            lab.start_derper(args.host)
        elif args.cmd == "actions":
            from overlay_manager.lab.campus.mobility import read_actions
            for r in read_actions(lab.actions.path):
                print(json.dumps(r) if args.json else
                      f"{r['t_wall']:.3f} (mono {r['t_mono']:.3f}, {r['done_mono'] - r['t_mono']:.3f} s) "
                      f"{r['action']} {r['target']}" + (f" ERROR {r['error']}" if "error" in r else ""))
        elif args.cmd == "ping":
            r = lab.ping(args.host, args.peer)
            print(f"{args.host} -> {args.peer}: {r.path} {r.via} {r.latency_ms:g} ms")
            return 0 if r.path != "none" else 1
        return 0
    except ConfigError as exc:  # a bad spec file (SpecError): usage error, like argparse's
        print(f"lab: error: {exc}", file=sys.stderr)
        return 2
    except LabError as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
