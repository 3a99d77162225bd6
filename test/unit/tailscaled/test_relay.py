"""This machine as a peer relay: robot config section, LocalAPI prefs patch, sessions (pure logic;
the LocalAPI is a fake transport that applies ipn.MaskedPrefs the way tailscaled does)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

import pytest

from overlay_manager.core import config as C
from overlay_manager.core.validation import MISSING, ConfigError, Reader
from overlay_manager.tailscaled import relay as R
from overlay_manager.tailscaled.localapi import LocalAPI, TailscaleError

READER = Reader("robot.yaml")


class PrefsTailscaled:
    """Keeps ipn.Prefs and applies PATCH bodies field by field (``<Field>Set`` masks)."""

    def __init__(self, prefs: Optional[Dict[str, Any]] = None, supports_relay: bool = True,
                 sessions: Optional[Dict[str, Any]] = None) -> None:
        self.prefs: Dict[str, Any] = dict(prefs or {"Hostname": "relay1"})
        self.supports_relay = supports_relay
        self.sessions = sessions
        self.calls: List[Tuple[str, str]] = []

    def __call__(self, method: str, path: str, body: Optional[bytes], timeout: float) -> Tuple[int, bytes]:
        self.calls.append((method, path))
        if path == "/localapi/v0/prefs" and method == "GET":
            return 200, json.dumps(self.prefs).encode()
        if path == "/localapi/v0/prefs" and method == "PATCH":
            masked = json.loads(body or b"{}")
            for key, value in masked.items():
                if key.endswith("Set") and value is True:
                    field = key[:-3]
                    if field.startswith("RelayServer") and not self.supports_relay:
                        continue
                    v = masked.get(field)
                    if v is None or v == []:
                        self.prefs.pop(field, None)  # Go omits nil/empty with omitempty
                    else:
                        self.prefs[field] = v
            return 200, json.dumps(self.prefs).encode()
        if path == "/localapi/v0/debug-peer-relay-sessions" and self.sessions is not None:
            return 200, json.dumps(self.sessions).encode()
        return 404, b'{"error": "not found"}'


def test_settings_defaults_and_canonical_endpoints() -> None:
    assert C.parse_relay_settings(READER, None) is None
    assert C.parse_relay_settings(READER, MISSING) is None
    assert C.parse_relay_settings(READER, {}) == C.RelaySettings(40000, ())
    s = C.parse_relay_settings(READER, {"port": 41000, "static_endpoints": ["192.0.2.1:41000", "[2001:db8::1]:41000",
                                                                   "192.0.2.1:41000"]})
    assert s == C.RelaySettings(41000, ("192.0.2.1:41000", "[2001:db8::1]:41000"))


@pytest.mark.parametrize("raw,key,words", [
    ([40000], "relay", "mapping"),
    ({"prot": 1}, "relay.prot", "unknown key"),
    ({"port": 0}, "relay.port", "1..65535"),
    ({"port": True}, "relay.port", "1..65535"),
    ({"port": "40000"}, "relay.port", "1..65535"),
    ({"static_endpoints": [""]}, "relay.static_endpoints[0]", "non-empty"),
    ({"static_endpoints": "1.2.3.4:5"}, "relay.static_endpoints", "list"),
    ({"static_endpoints": ["relay.example:40000"]}, "relay.static_endpoints[0]", "no host names"),
    ({"static_endpoints": ["1.2.3.4"]}, "relay.static_endpoints[0]", "ip:port"),
    ({"static_endpoints": ["2001:db8::1:40000"]}, "relay.static_endpoints[0]", "[addr]:port"),
])
def test_settings_errors_name_the_key(raw: Any, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        C.parse_relay_settings(READER, raw)
    assert e.value.key == key and words in str(e.value)
    assert str(e.value).startswith(f"robot.yaml: {key}: ")


def test_patch_only_when_different() -> None:
    want = C.RelaySettings(40000, ("192.0.2.1:40000",))
    assert R.relay_prefs_patch({}, None) is None
    on = R.relay_prefs_patch({}, want)
    assert on == {"RelayServerPort": 40000, "RelayServerPortSet": True,
                  "RelayServerStaticEndpoints": ["192.0.2.1:40000"], "RelayServerStaticEndpointsSet": True}
    have = {"RelayServerPort": 40000, "RelayServerStaticEndpoints": ["192.0.2.1:40000"]}
    assert R.relay_prefs_patch(have, want) is None
    assert R.relay_prefs_patch(have, C.RelaySettings(40000, ()))["RelayServerStaticEndpoints"] == []
    off = R.relay_prefs_patch(have, None)
    assert off["RelayServerPort"] is None and off["RelayServerPortSet"] is True


def test_apply_turns_on_idempotently_and_off() -> None:
    ts = PrefsTailscaled()
    api = LocalAPI(transport=ts)
    want = C.RelaySettings(40000, ())
    r1 = R.apply_relay(api, want)
    assert r1.changed and r1.active and "on UDP 40000 (was off)" in r1.message
    assert ts.prefs["RelayServerPort"] == 40000
    r2 = R.apply_relay(api, want)
    assert not r2.changed and r2.active
    assert ts.calls.count(("PATCH", "/localapi/v0/prefs")) == 1
    r3 = R.apply_relay(api, None)
    assert r3.changed and not r3.active and "RelayServerPort" not in ts.prefs
    assert "off (was on UDP 40000)" in r3.message
    assert not R.apply_relay(api, None).changed


def test_apply_fails_clearly_when_tailscaled_ignores_the_prefs() -> None:
    api = LocalAPI(transport=PrefsTailscaled(supports_relay=False))
    with pytest.raises(TailscaleError, match="relay server feature"):
        R.apply_relay(api, C.RelaySettings())


# status.ServerStatus as tailscaled v1.102.5 encodes it (netip.AddrPort -> "ip:port").
SESSIONS = {
    "UDPPort": 40000,
    "Sessions": [
        {"VNI": 1, "Client1": {"Endpoint": "192.168.0.12:41641", "ShortDisco": "d:1", "PacketsTx": 10,
                               "BytesTx": 12000},
         "Client2": {"Endpoint": "192.168.0.13:1234", "ShortDisco": "d:2", "PacketsTx": 9, "BytesTx": 9000}},
        {"VNI": 2, "Client1": {"Endpoint": "", "BytesTx": 0}, "Client2": {}},
    ],
}


def test_sessions_parsed() -> None:
    st = R.parse_relay_sessions(SESSIONS)
    assert st.port == 40000 and st.active and len(st.sessions) == 2
    assert st.sessions[0] == R.RelaySession(1, ("192.168.0.12:41641", "192.168.0.13:1234"), (12000, 9000))
    assert st.sessions[0].bound and not st.sessions[1].bound
    assert R.parse_relay_sessions({"UDPPort": None, "Sessions": None}) == R.RelayServerState()
    assert R.parse_relay_sessions([]).error


def test_read_state_keeps_errors() -> None:
    st = R.read_relay_state(LocalAPI(transport=PrefsTailscaled(sessions=None)))
    assert not st.active and "HTTP 404" in st.error
    st = R.read_relay_state(LocalAPI(transport=PrefsTailscaled(sessions=SESSIONS)))
    assert st.port == 40000 and not st.error


def test_summary_says_what_it_means() -> None:
    state = R.parse_relay_sessions(SESSIONS)
    text, ok = R.relay_summary(C.RelaySettings(40000), state)
    assert ok and text == "relays on UDP 40000: 2 session(s), 1 carrying traffic"
    assert R.relay_summary(None, R.RelayServerState()) == ("not a peer relay", True)
    text, ok = R.relay_summary(None, state)
    assert not ok and "does not ask for" in text
    text, ok = R.relay_summary(C.RelaySettings(40000), R.RelayServerState())
    assert not ok and "relay server is off" in text
    text, ok = R.relay_summary(C.RelaySettings(41000), state)
    assert not ok and "serves UDP 40000" in text
    text, ok = R.relay_summary(C.RelaySettings(40000), R.RelayServerState(error="boom"))
    assert not ok and "boom" in text


def test_dashboard_words_for_peer_relay() -> None:
    from types import SimpleNamespace

    from overlay_manager.view import text as fmt

    peer = SimpleNamespace(path="peer-relay", endpoint="10.231.12.10:40000:vni:3", relay_region="lab",
                           peer_relay="10.231.12.10:40000", relay_host="relay1")
    assert fmt.peer_where(peer) == "relay relay1 10.231.12.10:40000"
    unknown = SimpleNamespace(path="peer-relay", endpoint="10.231.12.10:40000:vni:3", relay_region="lab",
                              peer_relay="10.231.12.10:40000", relay_host="")
    assert fmt.peer_where(unknown) == "10.231.12.10:40000"
    derp = SimpleNamespace(path="derp", endpoint="", relay_region="lab", peer_relay="", relay_host="")
    assert fmt.peer_where(derp) == "DERP lab"
    assert "near-direct" in fmt.path_description("peer-relay")
    assert fmt.path_colour("peer-relay") != fmt.path_colour("derp")
    ping = SimpleNamespace(ok=True, received=3, latency_mean_ms=1.0, latency_min_ms=0.9, latency_max_ms=1.2,
                           path="peer-relay", endpoint="10.231.12.10:40000")
    assert fmt.ping_text("robot4", ping).level == fmt.LEVEL_OK



def test_peer_relay_fields_from_status() -> None:
    from overlay_manager.core import peers as P

    assert P.relay_endpoint("192.168.0.1:40000:vni:1") == "192.168.0.1:40000"
    assert P.relay_endpoint("[2001:db8::1]:40000:vni:7") == "[2001:db8::1]:40000"
    assert P.relay_endpoint("") == ""
    status = {
        "BackendState": "Running",
        "Self": {"DNSName": "robot3.fleet.internal.", "HostName": "robot3", "Online": True},
        "Peer": {
            "k1": {"DNSName": "robot4.fleet.internal.", "HostName": "robot4", "Online": True, "Active": True,
                   "CurAddr": "", "PeerRelay": "10.231.15.10:40000:vni:3", "Relay": "lab",
                   "Addrs": ["10.231.0.13:20001"], "ID": "n4"},
            "k2": {"DNSName": "relay1.fleet.internal.", "HostName": "relay1", "Online": True,
                   "Addrs": ["10.231.15.10:41641"], "ID": "r1"},
            "k3": {"DNSName": "robot5.fleet.internal.", "HostName": "robot5", "Online": True, "Active": True,
                   "PeerRelay": "203.0.113.9:40000:vni:9", "ID": "n5"},
        },
    }
    snap = P.parse_status(status)
    r4, r5 = snap.find("robot4"), snap.find("robot5")
    assert r4.path == "peer-relay" and r4.peer_relay == "10.231.15.10:40000" and r4.relay_host == "relay1"
    assert r5.peer_relay == "203.0.113.9:40000" and r5.relay_host == ""  # static endpoint: unknown
    assert snap.find("relay1").peer_relay == "" and snap.find("relay1").relay_host == ""
    # a relay change is a change worth publishing at once
    moved = P.parse_status({**status, "Peer": {**status["Peer"], "k1": {
        **status["Peer"]["k1"], "PeerRelay": "10.231.16.10:40000:vni:1"}}})
    assert P.peer_fingerprint(moved.find("robot4")) != P.peer_fingerprint(r4)
    blinded = P.blind(snap, daemon_gone=True).find("robot4")
    assert blinded.peer_relay == "" and blinded.relay_host == ""
    assert P.relay_host_name("10.231.15.10:40000", [{"Addrs": None}, "junk"]) == ""
    # tailscaled v1.102.5 leaves Addrs empty: the direct path to the relay host, else its tag
    by_cur = [{"DNSName": "relay1.fleet.internal.", "CurAddr": "10.231.15.10:41641", "Addrs": None}]
    assert P.relay_host_name("10.231.15.10:40000", by_cur) == "relay1"
    tagged = [{"DNSName": "relay2.fleet.internal.", "Tags": ["tag:team-alpha", "tag:relay"]},
              {"DNSName": "robot9.fleet.internal.", "Tags": ["tag:team-alpha"]}]
    assert P.relay_host_name("203.0.113.9:40000", tagged) == "relay2"
    two = tagged + [{"DNSName": "relay3.fleet.internal.", "Tags": ["tag:relay"]}]
    assert P.relay_host_name("203.0.113.9:40000", two) == ""  # several relays, none direct: unknown


def _robot_cfg(relay: Any) -> Any:
    from overlay_manager.core.config import parse_robot_config

    raw = {"hostname": "relay1", "login_server": "https://10.231.0.2:8443", "base_domain": "fleet.internal",
           "master": "robot1"}
    if relay is not None:
        raw["relay"] = relay
    return parse_robot_config(raw, "/etc/overlay_manager/robot.yaml")


def test_monitor_turns_relay_on_reports_it_and_off_when_key_removed() -> None:
    from overlay_manager.monitor.overlay_monitor import OverlayMonitor
    from overlay_manager.monitor.readings import OK, WARN

    ts = PrefsTailscaled(sessions=SESSIONS)
    api = LocalAPI(transport=ts)
    m = OverlayMonitor(_robot_cfg({"port": 40000}), api)
    assert m.relay_diagnostic().level == WARN and "not read yet" in m.relay_diagnostic().message
    note = m.refresh_relay()
    assert "on UDP 40000 (was off)" in note and ts.prefs["RelayServerPort"] == 40000
    d = m.relay_diagnostic()
    assert d.level == OK and d.message == "relays on UDP 40000: 2 session(s), 1 carrying traffic"
    values = dict(d.values)
    assert values["port"] == "40000" and values["sessions"] == "2"
    assert values["session vni 1"] == "192.168.0.12:41641 <-> 192.168.0.13:1234, bytes 12000 / 9000"
    assert m.refresh_relay() == ""  # idempotent: nothing to say, no second PATCH
    assert ts.calls.count(("PATCH", "/localapi/v0/prefs")) == 1

    m2 = OverlayMonitor(_robot_cfg(None), api)  # the key was removed from the config
    assert "off (was on UDP 40000)" in m2.refresh_relay()
    assert "RelayServerPort" not in ts.prefs and m2.relay_diagnostic() is None


def test_monitor_relay_failure_is_reported_not_raised() -> None:
    from overlay_manager.monitor.overlay_monitor import OverlayMonitor
    from overlay_manager.monitor.readings import WARN

    m = OverlayMonitor(_robot_cfg({}), LocalAPI(transport=PrefsTailscaled(supports_relay=False)))
    note = m.refresh_relay()
    assert note.startswith("cannot set the peer relay server") and "relay server feature" in note
    assert m.relay_diagnostic().level == WARN
    # tailscaled down: a relay host says so; any other machine has no "peer relay" entry at all
    down = LocalAPI(transport=lambda m_, p_, b_, t_: (_ for _ in ()).throw(TailscaleError("no socket")))
    relay_host = OverlayMonitor(_robot_cfg({}), down)
    assert "no socket" in relay_host.refresh_relay() and relay_host.relay_diagnostic().level == WARN
    robot = OverlayMonitor(_robot_cfg(None), down)
    assert robot.refresh_relay() == "" and robot.relay_diagnostic() is None


def test_wait_for_peer_accepts_peer_relay_only_when_asked() -> None:
    from overlay_manager.monitor.overlay_monitor import OverlayMonitor

    status = {"BackendState": "Running", "Self": {"DNSName": "robot3.fleet.internal.", "Online": True},
              "Peer": {"k": {"DNSName": "robot4.fleet.internal.", "HostName": "robot4", "Online": True,
                             "Active": True, "PeerRelay": "10.231.15.10:40000:vni:1",
                             "TailscaleIPs": ["100.64.0.4"], "ID": "n4"}}}
    pong = {"IP": "100.64.0.4", "NodeName": "robot4", "LatencySeconds": 0.001,
            "PeerRelay": "10.231.15.10:40000:vni:1"}

    def transport(method: str, path: str, body: Optional[bytes], timeout: float) -> Tuple[int, bytes]:
        if path.startswith("/localapi/v0/status"):
            return 200, json.dumps(status).encode()
        if path.startswith("/localapi/v0/ping"):
            return 200, json.dumps(pong).encode()
        return 404, b"{}"

    clock = [0.0]

    def tick() -> float:
        clock[0] += 0.5
        return clock[0]

    m = OverlayMonitor(_robot_cfg(None), LocalAPI(transport=transport), clock=tick)
    m.poll()
    ok = m.wait_for_peer("robot4", 3.0, True, accept_peer_relay=True)
    assert ok.ok and ok.peer.relay_host == "" and ok.peer.peer_relay == "10.231.15.10:40000"
    strict = m.wait_for_peer("robot4", 2.0, True)
    assert not strict.ok and "path is peer-relay, not direct" in strict.message
