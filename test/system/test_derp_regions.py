"""The fleet's own DERP regions in the campus lab (config/lab/derp_campus.yaml): relayed links that
survive the control server's outage and a region's loss, measured on the ROS topics::

    east (public)    east-derp: base station, tailscaled + derper, region east (901)
    west (public)    west-derp: base station, tailscaled + derper, region west (902)
    north (adpm)     alpha-robot1: ROS master, camera 320x240 rgb8 30 Hz, Twist echo
    south (adpm)     alpha-op1: operator, camera subscriber, Twist round trip

Headscale's embedded DERP is off. Symmetric NATs on both sides: alpha-robot1 <-> alpha-op1 is
relayed (derp) through the regions. Tests, in order (one lab for the module; later tests build
on earlier ones):

1. the link is derp through one of the fleet's regions, and the nodes say which by name
   (Peer.derp_region), list every region's latency (~status nat) and, on east-derp, report its
   derper (~status derper_*, /diagnostics "DERP server"); every machine is a home client of one
   of the derpers;
2. headscale stopped (OUTAGE_S): the camera keeps >= MIN_HZ after at most 10 s, the Twist round
   trip keeps answering; headscale back;
3. the derper of the region that carries the camera (alpha-op1's home) killed: alpha-op1
   re-homes to the other region, the camera resumes within RESUME_BOUND_S, alpha-robot1's node
   names the new region (~peers derp_region, a derp -> derp ~path_changes); the derper back:
   the camera keeps flowing;
4. verify-clients: tailscale's derpprobe (clients with fresh node keys no tailnet knows) is
   refused by the fleet's derper, which logs "not authorized" (its STUN answers: the server is up).

Measured numbers are printed (pytest -s) and collected in MEASURED.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from overlay_manager.core.levels import Level
from overlay_manager.core.ros_names import overlay_node
from overlay_manager.lab.campus import robots
from overlay_manager.lab.campus.derp_outage import home_region, run_outage
from overlay_manager.lab.campus.system import wait_for

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "config" / "lab" / "derp_campus.yaml"
MASTER, OP = "alpha-robot1", "alpha-op1"
DERPERS = {"east": "east-derp", "west": "west-derp"}
NAMES = {"east": "East campus", "west": "West campus"}
CAMERA = "/camera/image_raw"
OUTAGE_S = 20.0         # headscale down (60 s in scripts/bench derp)
KILL_S = 25.0           # one region's derper down
MIN_HZ = 15.0           # camera rate that counts as flowing (30 Hz sent, 320x240 rgb8: 55 Mbit/s; the
                        # relayed rate dips when other work shares the 2 cores)
HEADSCALE_BOUND_S = 10.0  # camera back at MIN_HZ after headscale stops (goal: no dip at all)
RESUME_BOUND_S = 20.0   # camera back at MIN_HZ after a derper is killed
NODES = [overlay_node(OP), overlay_node(MASTER)]   # whose ~peers/~path_changes are recorded
MEASURED: Dict[str, Any] = {}


def _peer(lab: Any, host: str, peer: str) -> Dict[str, Any]:
    """``peer`` in ``host``'s tailscaled status (by host name)."""
    return next(p for p in lab.tailscale_status(host)["Peer"].values() if p.get("HostName") == peer)


@pytest.fixture(scope="module")
def campus(lab_factory):
    """The DERP campus up: derpers on east-derp and west-derp (their tailscaled enrolled first),
    robot.launch on alpha-robot1 (master), alpha-op1 and east-derp (its node reports its derper),
    the camera and the Twist echo on alpha-robot1. Everything stopped by pid at the end."""
    lab = lab_factory(SPEC)
    procs: List[Any] = []
    try:
        lab.start_derpers()
        robots.start_master_then(lab, MASTER, [OP, DERPERS["east"]], procs)
        procs.append(robots.start_camera(lab, MASTER, CAMERA, 30.0, width=320, height=240))
        procs.append(robots.start_echo(lab, MASTER))
        yield lab, procs
    except Exception:
        robots.print_launch_logs(lab, [MASTER, OP], lines=30)
        raise
    finally:
        for p in reversed(procs):
            robots.stop(lab, p)
        print("DERP region measurements: " + json.dumps(MEASURED))
        lab.down()


def test_link_is_relayed_through_a_fleet_region(campus):
    lab, _ = campus
    robots.peers(lab, OP, where=f"any(p['name'] == {MASTER!r} and p['path'] == 'derp' for p in m['peers'])",
                 timeout=60, node=overlay_node(OP))
    cli = lab.ping(OP, MASTER, count=3, until_direct=False)
    homes = {h: home_region(lab, h) for h in (MASTER, OP)}
    MEASURED["homes"] = homes
    print(f"alpha-op1 -> alpha-robot1: {cli.path} via {cli.via}; home regions {homes}")
    assert cli.path == "derp" and cli.via in DERPERS, cli.output
    assert set(homes.values()) <= set(DERPERS), homes
    # every machine keeps a connection to its home region's derper
    states = {region: lab.derpers.read(host) for region, host in DERPERS.items()}
    assert all(st.listening for st in states.values()), states
    assert sum(st.home_connections for st in states.values()) >= 4, states
    # the nodes name the region of the relayed link, and list every region's latency
    want = NAMES[_peer(lab, OP, MASTER)["Relay"]]
    msg = robots.peers(lab, OP, where=f"any(p['name'] == {MASTER!r} and p['derp_region'] == {want!r} "
                                      "for p in m['peers'])", timeout=30, node=overlay_node(OP))
    st = robots.status(lab, OP, where="set(m['nat']['region_codes']) == {'east', 'west'}", timeout=90,
                       node=overlay_node(OP))
    MEASURED["op_region_latency_ms"] = dict(zip(st["nat"]["region_codes"], st["nat"]["region_latency_ms"]))
    assert st["nat"]["preferred_derp_name"] in NAMES.values(), st["nat"]
    assert [p for p in msg["peers"] if p["name"] == DERPERS["east"]], msg
    # east-derp's node reports its derper: as many clients as the derper itself counts. How many
    # that is depends on which region each machine picked as home (the lower latency, often all
    # west: then only machines that reach a peer homed on east connect), so the derper is asked
    want = lab.derpers.read(DERPERS["east"]).clients
    node = overlay_node(DERPERS["east"])
    st = robots.status(lab, DERPERS["east"], where=f"m['derper_listening'] and m['derper_clients'] >= {want}",
                       timeout=60, node=node)
    MEASURED["east_derper_status"] = st["derper_summary"]
    assert st["derper_region"] == "east" and st["derper_summary"].startswith("derper region east:"), st
    diag = robots.run_probe(lab, DERPERS["east"], ["collect", "/diagnostics", "diagnostic_msgs/DiagnosticArray",
                                                   "--seconds", "3"], timeout=30)
    entries = [s for d in diag["msgs"] for s in d["status"] if s["name"] == f"{node.lstrip('/')}: DERP server"]
    assert entries and entries[-1]["level"] == Level.OK, entries[-1:]


def test_headscale_down_relayed_camera_keeps_flowing(campus):
    lab, _ = campus
    out = run_outage(lab, OP, MASTER, NODES, CAMERA, "headscale",
                     ("headscale stopped", lab.headscale_stop), ("headscale started", lab.headscale_start),
                     before_s=5.0, outage_s=OUTAGE_S, after_s=5.0)
    m = out.summary(MIN_HZ)
    MEASURED["headscale_down"] = m
    print(f"headscale down {OUTAGE_S:.0f} s, camera alpha-robot1 -> alpha-op1 over derp: {json.dumps(m)}")
    assert m["baseline_hz"] >= MIN_HZ, m
    resumed = m["resume_after_break_s"]
    assert resumed is not None and resumed <= HEADSCALE_BOUND_S, m
    assert m["min_hz_after_10s_of_break"] >= MIN_HZ * 0.5, m
    assert m["twist"]["received"] and m["twist"]["received"] >= 0.8 * m["twist"]["sent"], m


def test_region_derper_killed_clients_rehome_camera_resumes(campus):
    lab, _ = campus
    wait_for("headscale to answer again", lambda: lab.headscale_running() and lab.deployment().cli().health(), 30)
    before = home_region(lab, OP)
    victim = DERPERS[before]
    other = next(r for r in DERPERS if r != before)
    out = run_outage(lab, OP, MASTER, NODES, CAMERA, f"derper-{before}",
                     (f"derper of region {before} ({victim}) killed", lambda: lab.stop_derper(victim)),
                     (f"derper of region {before} started", lambda: lab.start_derper(victim)),
                     before_s=5.0, outage_s=KILL_S, after_s=8.0)
    m = out.summary(MIN_HZ)
    m["home_before"], m["home_after"] = before, home_region(lab, OP)
    MEASURED["derper_killed"] = m
    print(f"derper of region {before} killed for {KILL_S:.0f} s, camera alpha-robot1 -> alpha-op1: {json.dumps(m)}")
    assert m["baseline_hz"] >= MIN_HZ, m
    resumed = m["resume_after_break_s"]
    assert resumed is not None and resumed <= RESUME_BOUND_S, m
    # alpha-op1 moved to the other region, and alpha-robot1 reaches it there
    assert m["home_after"] == other, m
    assert _peer(lab, MASTER, OP).get("Relay") == other, _peer(lab, MASTER, OP)
    # alpha-robot1's node names the region the link moved to
    robots.peers(lab, MASTER, where=f"any(p['name'] == {OP!r} and p['derp_region'] == {NAMES[other]!r} "
                                    "for p in m['peers'])", timeout=30, node=overlay_node(MASTER))
    moved = [e for e in out.changes if e["node"] == overlay_node(MASTER) and e["peer"] == OP
             and e["old"] == "derp" and e["new"] == "derp" and e["derp_region"] == NAMES[other]]
    assert moved, m["path_changes"]
    # the region came back and the camera kept flowing after it
    assert m["resume_after_restore_s"] is not None and m["resume_after_restore_s"] <= 5.0, m
    assert lab.derpers.read(victim).listening


def test_unknown_clients_are_refused(campus):
    lab, _ = campus
    region = "east"
    res = lab.derpers.probe(OP, region)
    mesh = [b for b in res["bad"] if b.startswith(f"derp/{region}/") and "/mesh" in b.split(":")[0]]
    MEASURED["derpprobe"] = {"good": res["good"], "bad": res["bad"]}
    print(f"derpprobe (fresh node keys) against region {region}: {json.dumps(MEASURED['derpprobe'])}")
    # the server is up (its STUN answers the probe) ...
    assert any(g.startswith(f"derp/{region}/") and g.split(":")[0].endswith("/udp") for g in res["good"]), \
        res["output"]
    # ... but a client the tailnet does not know cannot relay through it: the server drops it
    assert mesh, res["output"]
    log = lab.derpers.log_path(DERPERS[region]).read_text(errors="replace")
    assert "not authorized (not found in local tailscaled)" in log, log[-2000:]
