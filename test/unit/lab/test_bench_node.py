"""The node benchmark's pure parts and its in-namespace status watcher (scripts/bench_node).

The watcher runs as the benchmark starts it (``python3 -m overlay_manager.lab.bench.node.main
_watch-status``) against the fake tailscaled of the unit tests, read by the benchmark's
LineWatcher; the rest is plain functions on recorded or synthetic data.
"""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from overlay_manager.core.peers import parse_status
from overlay_manager.lab.bench.node.cpu import fake_ping_for, fake_status, ns_argv, proc_sample
from overlay_manager.lab.bench.node.path import LineWatcher
from overlay_manager.lab.bench.node.report import TARGET_NODE_LATENCY_S, summarize_path, table
from overlay_manager.testing.tsfake import FakeTailscaled

REPO = Path(__file__).resolve().parents[3]


def _trial(block_node_s, unblock_node_s):
    """One path_bench trial record: tailscaled 6 s / 1 s after the action, the node as given."""
    return {"block": {"node_latency_s": block_node_s, "node_stamp_latency_s": block_node_s - 0.01,
                      "tailscaled_s": 6.0},
            "unblock": {"node_latency_s": unblock_node_s, "node_stamp_latency_s": unblock_node_s - 0.01,
                        "tailscaled_s": 1.0}}


def test_summary_counts_only_complete_phases():
    p = {"trials": [_trial(0.2, 0.1), _trial(0.4, 0.3),
                    {"block": {"error": "timed out"}}]}  # a failed block has no unblock phase
    s = summarize_path(p)
    assert s["block"]["node_latency_s"]["n"] == 2
    assert s["block"]["node_latency_s"]["max"] == pytest.approx(0.4)
    assert s["unblock"]["node_latency_s"]["mean"] == pytest.approx(0.2)
    assert s["block"]["tailscaled_s"]["mean"] == pytest.approx(6.0)


def test_table_judges_latency_against_the_target_and_lists_errors():
    slow = TARGET_NODE_LATENCY_S + 0.5
    p = {"trials": [_trial(0.2, slow)], "errors": ["trial 2 block: timed out after 90 s waiting for x"]}
    p["summary"] = summarize_path(p)
    text = table({"path_change": p, "cpu": [
        {"peers": 100, "topic_peers": 5, "ipn_bus": True, "wall_s": 15.2, "cpu_mean_pct": 1.94,
         "cpu_max_1s_pct": 3.0, "rss_max_mib": 53.21},
        {"peers": 500, "error": "node did not publish 500 peers"}]})
    lines = text.splitlines()
    assert lines[:2] == ["| measurement | condition | result |", "|---|---|---|"]
    block = next(x for x in lines if x.startswith("| node latency") and "UDP blocked" in x)
    unblock = next(x for x in lines if x.startswith("| node latency") and "UDP unblocked" in x)
    assert "(meets < 1 s)" in block and "mean 0.200 s" in block
    assert "(MISSES < 1 s)" in unblock
    assert "| path change error | | trial 2 block: timed out" in text
    assert ("| node CPU / RSS | 100 peers (5 streaming to this machine), fake tailscaled with IPN bus, 15 s"
            in text) and "CPU mean 1.9 % of one core (1-s max 3 %), RSS max 53.2 MiB |" in text
    assert "| node CPU / RSS | 500 peers | error: node did not publish 500 peers |" in text


def test_table_without_complete_trials_says_so():
    p = {"trials": [{"block": {"error": "x"}}], "errors": []}
    p["summary"] = summarize_path(p)
    assert table({"path_change": p}).count("no complete trial") == 2


def test_fake_status_clones_distinct_direct_peers():
    st = fake_status(300)
    snap = parse_status(st)
    assert len(snap.peers) == 300
    assert {p.path for p in snap.peers} == {"direct"}
    ips = [p["TailscaleIPs"][0] for p in st["Peer"].values()]
    assert len(set(ips)) == 300 and "100.64.1.45" in ips  # peer 300 is k = 301 = 1 * 256 + 45
    assert snap.find("robot-300") is not None


def test_fake_ping_answers_for_its_peers_only():
    st = fake_status(3)
    pong = fake_ping_for(st)
    p = next(v for v in st["Peer"].values() if v["HostName"] == "robot-002")
    ok = pong(p["TailscaleIPs"][0])
    assert ok["Err"] == "" and ok["NodeName"] == "robot-002" and ok["Endpoint"] == p["CurAddr"]
    assert pong("100.99.0.1")["Err"] == "no matching peer"


def test_ns_argv_and_proc_sample():
    assert ns_argv("ombench-1", ["ip", "-j", "addr"]) == ["ip", "netns", "exec", "ombench-1", "ip", "-j", "addr"]
    s = proc_sample(os.getpid())
    assert s["ticks"] >= 0 and s["rss_kib"] > 0 and s["hwm_kib"] >= s["rss_kib"] and s["threads"] >= 1
    assert not math.isnan(s["t"])


def _child(code):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)


def test_line_watcher_skips_non_json_and_names_what_it_waited_for():
    proc = _child("import sys, time; print('noise'); print('{\"n\": 1}'); sys.stdout.flush(); time.sleep(30)")
    try:
        w = LineWatcher("child", proc)
        assert w.wait("n = 1", lambda e: e.get("n") == 1, 20) == {"n": 1}
        with pytest.raises(TimeoutError, match=r"waiting for n = 2 \(last seen: state\)"):
            w.wait("n = 2", lambda e: e.get("n") == 2, 0.3, lambda: "state")
        assert w.last() == {"n": 1} and w.last(lambda e: "x" in e) is None
    finally:
        proc.kill()
        proc.wait()
    exited = _child("print('{\"n\": 1}')")
    w = LineWatcher("short child", exited)
    with pytest.raises(RuntimeError, match="short child exited"):
        w.wait("n = 2", lambda e: e.get("n") == 2, 20)


def test_watch_status_helper_reports_each_path_change():
    fake = FakeTailscaled()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "overlay_manager.lab.bench.node.main", "_watch-status",
                             fake.socket_path, "robotb", "--hz", "20"], stdout=subprocess.PIPE,
                            env=env, start_new_session=True)
    try:
        w = LineWatcher("status watcher", proc)
        w.wait("the watcher to start", lambda e: "ready" in e, 20)
        first = w.wait("robotb direct", lambda e: e.get("path") == "direct", 20)
        assert first["cur_addr"] == "10.250.0.3:41641" and first["req_s"] >= 0
        with fake._lock:  # UDP gone: tailscaled keeps the peer active with no direct address
            (peer,) = fake.status["Peer"].values()
            peer["CurAddr"] = ""
        derp = w.wait("robotb derp", lambda e: e.get("path") == "derp", 20)
        assert derp["t"] > first["t"] and derp["cur_addr"] == ""
        fake.stop()
        w.wait("an error once tailscaled is gone", lambda e: e.get("path") == "error", 20)
        assert [e["path"] for e in w.events if "path" in e] == ["direct", "derp", "error"]
    finally:
        proc.kill()
        proc.wait()
        fake.close()


def test_cpu_rows_name_the_settings_the_run_used():
    from overlay_manager.lab.bench.node.cpu import node_settings

    st = node_settings(["bus_poll_rate=1"])
    assert st["iperf_server"] is False and st["manage_hosts"] is False and st["bus_poll_rate"] == "1"
    row = table({"cpu": [{"peers": 500, "topic_peers": 5, "ipn_bus": True, "wall_s": 30.0, "cpu_mean_pct": 1.5,
                          "cpu_max_1s_pct": 4.0, "rss_max_mib": 61.0, "settings": st}]})
    assert (f"poll {st['poll_rate']} Hz, 1 Hz with the bus, publish {st['publish_rate']} Hz, "
            f"ping {st['ping_interval']} s, topic links {st['topic_links_interval']} s |") in row
