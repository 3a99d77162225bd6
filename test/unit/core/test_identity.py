"""One peer key and one host rule (overlay_manager.core.identity), and the shared host -> path table
(test/data/host_matching_cases.yaml, which test/cpp/test_host_matching.cpp runs against the C++
encoder's subscriber_hosts)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import yaml

from overlay_manager.core.identity import (
    HostMatcher,
    is_address,
    is_loopback,
    normalise_host,
    peer_key,
    refers_to,
    short_label,
)
from overlay_manager.core.peers import PATH_DERP, PATH_DIRECT, PeerState, Snapshot, parse_status, path_changes
from overlay_manager.core.topic_links import MachineMap

CASES = Path(__file__).resolve().parents[2] / "data" / "host_matching_cases.yaml"


def peer(name: str, dns_name: str = "", addresses: tuple = (), path: str = PATH_DIRECT, node_id: str = "") -> PeerState:
    return PeerState(name=name, dns_name=dns_name, addresses=tuple(addresses), online=True, active=True,
                     path=path, node_id=node_id)


ALPHA_ROBOT1 = peer("alpha-robot1", "alpha-robot1.fleet.internal", ("100.64.0.5", "fd7a:115c:a1e0::5"), node_id="n5")
ALPHA = peer("alpha", "alpha.fleet.internal", ("100.64.0.6",), node_id="n6")
OLD = peer("old", "", ("100.64.0.9",))


def test_normalise_host() -> None:
    assert normalise_host(" Robot1.Fleet.Internal. ") == "robot1.fleet.internal"
    assert normalise_host("[FD7A:115C:A1E0:0:0:0:0:2]") == "fd7a:115c:a1e0::2"
    assert normalise_host("100.64.0.2") == "100.64.0.2"
    assert normalise_host("1.2.3") == "1.2.3"          # not an address: left as a name
    assert normalise_host("") == ""
    assert is_address("fd7a::1") and is_address("[::1]") and not is_address("alpha-robot1")
    assert short_label("alpha-robot1.fleet.internal.") == "alpha-robot1"
    assert short_label("100.64.0.2") == "100.64.0.2"


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST.", "localhost.localdomain", "ip6-localhost",
                                  "ip6-loopback", "127.0.0.1", "127.1.2.3", "::1", "[::1]"])
def test_loopback(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["local", "robot1", "128.0.0.1", "::2", ""])
def test_not_loopback(host: str) -> None:
    assert not is_loopback(host)


@pytest.mark.parametrize("host", ["alpha-robot1", "ALPHA-ROBOT1", "alpha-robot1.fleet.internal",
                                  "Alpha-Robot1.Fleet.Internal.", "100.64.0.5", "fd7a:115c:a1e0::5",
                                  "[FD7A:115C:A1E0:0::5]", " alpha-robot1 "])
def test_refers_to_names_addresses_any_case_trailing_dot(host: str) -> None:
    assert refers_to(host, ALPHA_ROBOT1)
    assert not refers_to(host, ALPHA)


@pytest.mark.parametrize("host", ["alpha", "robot1", "alpha-robot", "alpha-robot1.other.domain", "alpha-robot1x",
                                  "100.64.0.50", "fd7a:115c:a1e0::50", "", "."])
def test_hyphenated_name_is_one_label(host: str) -> None:
    assert not refers_to(host, ALPHA_ROBOT1)


def test_fqdn_of_a_peer_without_overlay_name_matches_by_first_label() -> None:
    assert refers_to("old.fleet.internal", OLD) and refers_to("OLD", OLD)
    assert not refers_to("old.fleet.internal", peer("old", "old.other.domain", ("100.64.0.9",)))


def test_host_matcher_agrees_with_refers_to() -> None:
    m = HostMatcher([ALPHA_ROBOT1, ALPHA, OLD])
    for host in ["alpha-robot1", "ALPHA.fleet.internal.", "100.64.0.6", "[fd7a:115c:a1e0::5]", "old.x.y", "ghost"]:
        want = next((p for p in (ALPHA_ROBOT1, ALPHA, OLD) if refers_to(host, p)), None)
        assert m.peer(host) is want, host
    assert m.by_name("ALPHA") is ALPHA and m.by_name("alpha.fleet.internal") is None


def test_peer_key_prefers_the_stable_node_id_and_survives_a_rename() -> None:
    assert peer_key(ALPHA) == "n6"
    renamed = peer("beta", "beta.fleet.internal", ALPHA.addresses, node_id="n6")
    assert peer_key(renamed) == peer_key(ALPHA)
    assert peer_key(peer("alpha", "alpha.fleet.internal", ALPHA.addresses)) == "alpha.fleet.internal"  # no id: DNS name
    assert peer_key(OLD) == "old"                                          # neither: the short name


def test_a_renamed_peer_is_the_same_peer_for_path_changes() -> None:
    before = Snapshot("Running", None, (ALPHA,))
    after = Snapshot("Running", None, (peer("beta", "beta.fleet.internal", ALPHA.addresses, PATH_DERP, "n6"),))
    (ev,) = path_changes(before, after)
    assert (ev.peer.name, ev.old_path, ev.new_path) == ("beta", PATH_DIRECT, PATH_DERP)


def test_recorded_status_keys_are_node_ids() -> None:
    from overlay_manager.testing.tsfake import recorded
    snap = parse_status(recorded("status_direct.json"))
    assert all(p.node_id and peer_key(p) == p.node_id for p in snap.peers)


# ----- the shared table -------------------------------------------------------------------------
def _state(d: Dict[str, Any]) -> PeerState:
    return PeerState(name=d["name"], dns_name=d.get("dns_name", ""), addresses=tuple(d.get("addresses", ())),
                     online=True, active=True, path=d.get("path", "self"), latency_ms=math.nan)


def _snapshots(table: Dict[str, Any]) -> Dict[str, Optional[Snapshot]]:
    out: Dict[str, Optional[Snapshot]] = {}
    for key, s in table["peer_sets"].items():
        out[key] = None if s is None else Snapshot("Running", _state(s["self"]), tuple(_state(p) for p in s["peers"]))
    return out


def _cases() -> List[Dict[str, Any]]:
    return yaml.safe_load(CASES.read_text())["cases"]


def test_the_table_is_not_empty_and_every_case_is_complete() -> None:
    cases = _cases()
    assert len(cases) >= 30
    assert all(set(c) == {"host", "peers", "machine", "path"} for c in cases)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c['host'] or '(empty)'}@{c['peers']}")
def test_host_matching_table(case: Dict[str, Any]) -> None:
    table = yaml.safe_load(CASES.read_text())
    snap = _snapshots(table)[case["peers"]]
    m = MachineMap(snap, (table["own_host"],), table["aliases"])
    assert (m.machine(case["host"]), m.path(case["host"])) == (case["machine"], case["path"])
