"""``lab nat-matrix``: tailscale's path (direct or DERP) for every pair of NAT kinds, measured.

One lab run holds every NAT kind twice (buildings ``<kind>-a`` and ``<kind>-b``, one host each:
``h-<kind>-a``, ``h-<kind>-b``), all hosts robots of one fleet team, so every host sees every
other. For each cell of the upper triangle (diagonal = two different buildings of the same kind)
one ``tailscale ping`` (Lab.ping, ``--until-direct``) decides the path; pings of disjoint host
pairs run in parallel. The expected outcome beside it comes from :func:`expected`, RFC 4787
reasoning spelled out in matrix/model.py. Writes ``artifacts/nat_matrix.md`` and ``artifacts/nat_matrix.json``.

Not part of CI: about 2.5 minutes on 2 cores (22 tailscaled, 66 pings; a DERP ping takes the CLI's
full 10 x 1 s). Run as root::

    scripts/lab nat-matrix [--out artifacts] [--count 10] [--parallel 6] [--keep] [--relay]

``--relay`` adds what a campus can do about its derp cells: a peer relay host in a ``public``
building (a campus server network) and the building mode ``udp-servers`` (UDP only to STUN and
the relay's port). Every cell is measured twice in one run: first with the relay host enrolled
but its relay server off (the plain matrix), then, after its relay server is turned on from its
bundle (as the node does), every cell that was not direct again. Writes
``artifacts/nat_matrix_relay.md`` / ``.json`` with both tables; the expectation with the relay is
:func:`expected_with_relay` (direct stays direct; otherwise peer-relay when both sides can send
UDP to the relay's port, else derp).

The expectation (:func:`expected`, :func:`expected_with_relay`) and the cell layout are the pure
model in matrix/model.py, with the RFC 4787 reasoning spelled out.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from overlay_manager.lab.campus.core import Lab
from overlay_manager.lab.campus.errors import LabError
from overlay_manager.lab.campus.layout import REPO_ROOT
from overlay_manager.lab.campus.relays import enable_relays
from overlay_manager.lab.campus.tailscaled import PingResult
from overlay_manager.lab.matrix.model import (
    KINDS,
    NOTES,
    RELAY_KINDS,
    cells,
    expected,
    expected_with_relay,
    matrix_spec,
    rule_of_thumb,
    why_not_rule_of_thumb,
)


def run_cells(lab: Lab, todo: Sequence[Tuple[str, str, str, str]], count: int, parallel: int,
              log: Any = print, model: Any = expected) -> List[Dict[str, Any]]:
    """Ping every cell, never two pings on one host at once; returns one record per cell.

    ``model``: (kind a, kind b) -> (expected path, reason)."""
    lock = threading.Condition()
    busy: Set[str] = set()
    results: List[Dict[str, Any]] = []

    def one(cell: Tuple[str, str, str, str]) -> None:
        a, b, ha, hb = cell
        with lock:
            while ha in busy or hb in busy:
                lock.wait(1.0)
            busy.update((ha, hb))
        try:
            exp, why = model(a, b)
            t0 = time.monotonic()
            attempts = []
            r: PingResult = lab.ping(ha, hb, count=count, timeout=count * 4 + 20)
            attempts.append(r.path)
            if r.path != exp and r.path != "direct":
                # one more try: a slow hole punch must not be reported as derp
                r = lab.ping(ha, hb, count=count, timeout=count * 4 + 20)
                attempts.append(r.path)
            rec = {"a": a, "b": b, "host_a": ha, "host_b": hb, "expected": exp, "reason": why,
                   "rule_of_thumb": rule_of_thumb(a, b),
                   "observed": r.path, "via": r.via, "latency_ms": r.latency_ms, "attempts": attempts,
                   "seconds": round(time.monotonic() - t0, 1), "output": r.output.strip()[-600:]}
            log(f"[nat-matrix] {a} x {b}: expected {exp}, observed {r.path} {r.via} "
                f"({rec['seconds']} s, attempts {attempts})")
        finally:
            with lock:
                busy.difference_update((ha, hb))
                lock.notify_all()
        with lock:
            results.append(rec)

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for f in [pool.submit(one, c) for c in todo]:
            f.result()
    order = {(a, b): n for n, (a, b, _, _) in enumerate(todo)}
    return sorted(results, key=lambda r: order[(r["a"], r["b"])])


def _mark(r: Dict[str, Any]) -> str:
    """A matrix cell: the observed path in bold, the expected one beside it when they differ."""
    obs, exp = r["observed"], r["expected"]
    return f"**{obs}**" if obs == exp else f"**{obs}** (exp. {exp}) ⚠"


def _matrix_table(kinds: Sequence[str], cell: Callable[[str, str], Optional[Dict[str, Any]]]) -> List[str]:
    """Markdown rows of the upper-triangle matrix over ``kinds``; ``cell(a, b)`` is the record
    shown in row a, column b (None = empty)."""
    lines = ["| | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for i, a in enumerate(kinds):
        row = [f"**{a}**"]
        for j, b in enumerate(kinds):
            r = cell(a, b) if j >= i else None
            row.append(_mark(r) if r else "")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def render_markdown(results: Sequence[Dict[str, Any]], meta: Dict[str, Any],
                    kinds: Sequence[str] = KINDS) -> str:
    """The matrix (observed / expected per cell) and the list of cells with notes."""
    by = {(r["a"], r["b"]): r for r in results}
    lines = [
        "# NAT matrix: tailscale path between two hosts behind NAT kinds (RFC 4787)",
        "",
        f"Measured {meta['date']} with tailscale {meta['tailscale']}, headscale {meta['headscale']}; "
        f"one `tailscale ping --until-direct --c={meta['count']}` per cell (a second one when the first "
        f"was not direct and direct was expected); run time {meta['seconds']:.0f} s "
        f"(lab up + enrolment {meta['setup_seconds']:.0f} s). "
        f"Cells: observed path, expected in brackets when different. {meta['agree']}/{meta['cells']} agree "
        f"with the model; {meta.get('rule_agree', '?')}/{meta['cells']} with the rule of thumb.",
        "",
    ]
    lines += _matrix_table(kinds, lambda a, b: by.get((a, b)))
    lines += ["", "## Every cell", "",
              "`expected` is the model in overlay_manager/lab/matrix/model.py; `rule of thumb` is the usual "
              "shorthand (\"hole punching fails if both sides have a port-changing mapping, or one has and "
              "the other does not filter endpoint-independently\"); the note explains every cell where "
              "either differs from what was measured.", "",
              "| A | B | expected | rule of thumb | observed | via | why expected | note |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        note = r.get("note", "")
        rot = r.get("rule_of_thumb", rule_of_thumb(r["a"], r["b"]))
        if not note:
            note = why_not_rule_of_thumb(r["a"], r["b"], r["observed"])
        lines.append(f"| {r['a']} | {r['b']} | {r['expected']} | {rot} | {r['observed']} | {r['via']} | "
                     f"{r['reason']} | {note} |")
    lines += ["", "Kinds: `<mapping>-<filtering>`, mapping eim/adm/adpm = endpoint-independent / "
              "address-dependent / address-and-port-dependent, filtering eif/adf/adpf likewise; "
              "`udp-blocked` = eim-adpf with no UDP except to STUN, `tcp-only` = no UDP at all. "
              "How they are built: docs/lab.md; the reasoning: overlay_manager/lab/matrix/model.py.", ""]
    return "\n".join(lines)


def _version(lab: Lab, binary: str) -> str:
    """The pinned version scripts/setup recorded next to the binary (``.<binary>.version``)."""
    try:
        return (lab.tailscale_cli().parent / f".{binary}.version").read_text().strip()
    except OSError:
        return "?"


UNEXPLAINED = "not explained yet: see the ping output in the JSON"
"""The note of a cell that missed its expectation for a reason NOTES does not give."""


def note_surprises(results: Sequence[Dict[str, Any]]) -> None:
    """Give every cell whose observed path is not its expected one a ``note``: the explanation in
    NOTES, else :data:`UNEXPLAINED`."""
    for r in results:
        if r["observed"] != r["expected"]:
            r["note"] = NOTES.get((r["a"], r["b"]), UNEXPLAINED)


def _run_meta(lab: Lab, count: int, parallel: int, t0: float, setup_s: float,
              results: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """What every report's header says: date, versions, ping settings, seconds (setup, total since
    ``t0`` on the monotonic clock), cells and how many agree with the model."""
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "tailscale": _version(lab, "tailscale"),
            "headscale": _version(lab, "headscale"), "count": count, "parallel": parallel,
            "setup_seconds": setup_s, "seconds": time.monotonic() - t0, "cells": len(results),
            "agree": sum(r["observed"] == r["expected"] for r in results)}


def _release(lab: Lab, keep: bool) -> None:
    """Take the lab down, or with ``keep`` leave it up and say how to take it down later."""
    if keep:
        print(f"[nat-matrix] keeping run {lab.run_id}: scripts/lab --run-id {lab.run_id} down")
    else:
        lab.down()


def write_report(out_dir: Path, stem: str, data: Dict[str, Any], markdown: str) -> None:
    """``<out_dir>/<stem>.json`` (the data, indented) and ``<stem>.md`` (the rendered tables)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out_dir / f"{stem}.md").write_text(markdown)


def run(out_dir: Path, count: int = 10, parallel: int = 6, run_id: Optional[str] = None,
        keep: bool = False) -> Dict[str, Any]:
    """Build the matrix lab, measure every cell, write the markdown and JSON; returns the data."""
    t0 = time.monotonic()
    lab = Lab(matrix_spec(), run_id=run_id)
    try:
        lab.up()
        lab.tailscale_up_all(timeout=90)
        setup_s = time.monotonic() - t0
        results = run_cells(lab, cells(), count, parallel)
        note_surprises(results)
        meta = _run_meta(lab, count, parallel, t0, setup_s, results)
        meta.update(rule_agree=sum(r["observed"] == r["rule_of_thumb"] for r in results), run_id=lab.run_id)
    finally:
        _release(lab, keep)
    data = {"meta": meta, "kinds": list(KINDS), "cells": results}
    write_report(out_dir, "nat_matrix", data, render_markdown(results, meta))
    print(f"[nat-matrix] wrote {out_dir / 'nat_matrix.md'} and nat_matrix.json "
          f"({meta['agree']}/{meta['cells']} agree, {meta['seconds']:.0f} s)")
    return data


def render_relay_markdown(plain: Sequence[Dict[str, Any]], relayed: Sequence[Dict[str, Any]],
                          meta: Dict[str, Any]) -> str:
    """Both tables of a ``--relay`` run: without the relay server, then with it (cells that were
    direct without the relay are not measured again and shown as such)."""
    by_plain = {(r["a"], r["b"]): r for r in plain}
    by_relay = {(r["a"], r["b"]): r for r in relayed}
    kinds = list(RELAY_KINDS)
    lines = [
        "# NAT matrix with a peer relay on the campus server network",
        "",
        f"Measured {meta['date']} with tailscale {meta['tailscale']}, headscale {meta['headscale']} in one lab "
        f"run: a relay host in a `public` building (campus server network, no NAT) granted to every host. "
        f"Table 1: its relay server off. Table 2: on (turned on from its bundle's `relay` key through the "
        f"LocalAPI, as the node does), every cell that was not direct measured again "
        f"({meta['relay_wait_s']:.0f} s after turning it on). One `tailscale ping --c={meta['count']}` per "
        f"cell, a second when the first missed the expectation. Run time {meta['seconds']:.0f} s. "
        f"Without relay {meta['agree']}/{meta['cells']} agree with the model, with relay "
        f"{meta['relay_agree']}/{meta['cells']}; {meta['derp_before']} derp cells before, "
        f"{meta['derp_after']} after ({meta['peer_relay_after']} peer-relay).",
        "",
        "`udp-servers` = eim-adpf that lets UDP out only to STUN and the relay's port (a common campus "
        "policy); `udp-blocked` lets only STUN out, `tcp-only` no UDP at all.",
        "",
    ]
    lines += ["## Without the relay", ""] + _matrix_table(kinds, lambda a, b: by_plain.get((a, b))) + [""]
    # cells that were direct without the relay are not measured again: shown from the first table
    lines += ["## With the relay", ""] + _matrix_table(
        kinds, lambda a, b: by_relay.get((a, b)) or by_plain.get((a, b))) + [""]
    lines += ["## Cells measured with the relay", "",
              "| A | B | without relay | expected with relay | observed | via | why |", "|---|---|---|---|---|---|---|"]
    for r in relayed:
        before = by_plain.get((r["a"], r["b"]), {}).get("observed", "?")
        lines.append(f"| {r['a']} | {r['b']} | {before} | {r['expected']} | {r['observed']} | {r['via']} | "
                     f"{r['reason']} |")
    lines.append("")
    return "\n".join(lines)


def run_relay(out_dir: Path, count: int = 10, parallel: int = 6, run_id: Optional[str] = None,
              keep: bool = False, relay_wait_s: float = 15.0) -> Dict[str, Any]:
    """``--relay``: the matrix without, then with the campus peer relay, in one lab run."""
    t0 = time.monotonic()
    lab = Lab(matrix_spec(relay=True), run_id=run_id)
    try:
        lab.up()
        lab.tailscale_up_all(timeout=120)
        setup_s = time.monotonic() - t0
        todo = cells(RELAY_KINDS)
        plain = run_cells(lab, todo, count, parallel)
        enable_relays(lab.spec, lab.robot_yaml, lab.localapi, print)
        # the relay's capability reaches the peers through the control server's map updates
        time.sleep(relay_wait_s)
        again = [c for c in todo if next(r for r in plain if (r["a"], r["b"]) == c[:2])["observed"] != "direct"]
        relayed = run_cells(lab, again, count, parallel, model=expected_with_relay)
        note_surprises(plain + relayed)
        by_relay = {(r["a"], r["b"]): r for r in relayed}
        final = [by_relay.get((r["a"], r["b"]), r) for r in plain]
        meta = _run_meta(lab, count, parallel, t0, setup_s, plain)
        meta.update(relay_agree=sum(r["observed"] == expected_with_relay(r["a"], r["b"])[0] for r in final),
                    derp_before=sum(r["observed"] == "derp" for r in plain),
                    derp_after=sum(r["observed"] == "derp" for r in final),
                    peer_relay_after=sum(r["observed"] == "peer-relay" for r in final),
                    relay_wait_s=relay_wait_s, run_id=lab.run_id)
    finally:
        _release(lab, keep)
    data = {"meta": meta, "kinds": list(RELAY_KINDS), "cells": plain, "relay_cells": relayed}
    write_report(out_dir, "nat_matrix_relay", data, render_relay_markdown(plain, relayed, meta))
    print(f"[nat-matrix] wrote {out_dir / 'nat_matrix_relay.md'} and nat_matrix_relay.json "
          f"(derp cells {meta['derp_before']} -> {meta['derp_after']}, {meta['seconds']:.0f} s)")
    return data


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``lab nat-matrix``."""
    p.add_argument("--out", default=str(REPO_ROOT / "artifacts"), help="output directory (default artifacts/)")
    p.add_argument("--count", type=int, default=10, help="tailscale pings per cell (1 s apart)")
    p.add_argument("--parallel", type=int, default=6, help="pings at once (on disjoint host pairs)")
    p.add_argument("--keep", action="store_true", help="leave the lab running afterwards")
    p.add_argument("--relay", action="store_true",
                   help="add a peer relay on a campus server network and the udp-servers kind; measure "
                        "every cell without, then the non-direct ones with the relay (nat_matrix_relay.md)")
    p.add_argument("--from-json", metavar="JSON", help="no measurement: re-render the table from a nat_matrix.json")


def rerender(json_path: Path, out_dir: Path) -> Dict[str, Any]:
    """Rewrite nat_matrix.md from an earlier nat_matrix.json (after the notes or the model changed)."""
    data = json.loads(json_path.read_text())
    for r in data["cells"]:
        r["rule_of_thumb"] = rule_of_thumb(r["a"], r["b"])
        r["expected"], r["reason"] = expected(r["a"], r["b"])
    note_surprises(data["cells"])
    m = data["meta"]
    m["agree"] = sum(r["observed"] == r["expected"] for r in data["cells"])
    m["rule_agree"] = sum(r["observed"] == r["rule_of_thumb"] for r in data["cells"])
    write_report(out_dir, "nat_matrix", data, render_markdown(data["cells"], m))
    return data


def main_from_args(args: argparse.Namespace) -> int:
    """Entry from the lab CLI."""
    import os
    if args.from_json:
        data = rerender(Path(args.from_json), Path(args.out))
        print(render_markdown(data["cells"], data["meta"]))
        return 0
    if os.geteuid() != 0:
        raise LabError("lab nat-matrix needs root (network namespaces)")
    if getattr(args, "relay", False):
        data = run_relay(Path(args.out), count=args.count, parallel=args.parallel, run_id=args.run_id,
                         keep=args.keep)
        print(render_relay_markdown(data["cells"], data["relay_cells"], data["meta"]))
        return 0
    data = run(Path(args.out), count=args.count, parallel=args.parallel, run_id=args.run_id, keep=args.keep)
    print(render_markdown(data["cells"], data["meta"]))
    return 0
