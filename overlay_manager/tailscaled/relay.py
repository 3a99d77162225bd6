"""This machine as a Tailscale peer relay: turn tailscaled's relay server on or off through the
LocalAPI prefs, and read the sessions it carries.

A relay host's robot config has ``relay: {port: 40000, static_endpoints: []}`` (the fleet bundle
writes it for the hosts in the fleet file's ``relays`` section). tailscaled keeps the relay
server in its prefs (ipn.Prefs, tailscale v1.102.5):

- ``RelayServerPort`` (``*uint16``): UDP port the relay binds on all interfaces; absent/null =
  relay server off; 0 = a random port (never written here: a campus firewall opens one port).
- ``RelayServerStaticEndpoints`` (``[]netip.AddrPort``): extra ``ip:port`` candidates to
  advertise (e.g. a port forward in front of the relay).

They are changed with ``PATCH /localapi/v0/prefs`` and an ipn.MaskedPrefs body (the prefs
fields plus ``<Field>Set: true`` for each field to change), exactly what ``tailscale set
--relay-server-port`` sends. :func:`apply_relay` reads the prefs first and patches only what
differs, so running it every start is idempotent; with no ``relay`` key it turns a relay server
off. ``GET /localapi/v0/debug-peer-relay-sessions`` (status.ServerStatus) lists the sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from overlay_manager.core.config import RelaySettings, parse_addr_port
from overlay_manager.core.json_fields import clamp_uint64
from overlay_manager.tailscaled.localapi import LocalAPI, TailscaleError


def current_relay(prefs: Mapping[str, Any]) -> Optional[RelaySettings]:
    """The relay server tailscaled's prefs (ipn.Prefs JSON) say it runs; None = off.

    A port of 0 (random) is returned as port 0.
    """
    port = prefs.get("RelayServerPort")
    if isinstance(port, bool) or not isinstance(port, int):
        return None
    eps = prefs.get("RelayServerStaticEndpoints") or []
    canon = set()
    if isinstance(eps, list):
        for ep in eps:
            try:
                canon.add(parse_addr_port(ep))
            except ValueError:
                continue
    return RelaySettings(port=port, static_endpoints=tuple(sorted(canon)))


def relay_prefs_patch(prefs: Mapping[str, Any], want: Optional[RelaySettings]) -> Optional[Dict[str, Any]]:
    """The ipn.MaskedPrefs body that makes tailscaled's relay server ``want``; None = no change.

    Args:
        prefs: tailscaled's current prefs (GET /localapi/v0/prefs).
        want: the relay to serve, or None for no relay server.
    """
    have = current_relay(prefs)
    if have == want:
        return None
    if want is None:
        return {"RelayServerPort": None, "RelayServerPortSet": True,
                "RelayServerStaticEndpoints": [], "RelayServerStaticEndpointsSet": True}
    return {"RelayServerPort": want.port, "RelayServerPortSet": True,
            "RelayServerStaticEndpoints": list(want.static_endpoints),
            "RelayServerStaticEndpointsSet": True}


@dataclass(frozen=True)
class RelayApplyResult:
    """What :func:`apply_relay` did.

    Attributes:
        changed: tailscaled's prefs were patched.
        active: the relay server is on after the call.
        message: one line for the log, e.g. "peer relay server on UDP 40000 (was off)".
    """

    changed: bool
    active: bool
    message: str


def _describe(r: Optional[RelaySettings]) -> str:
    if r is None:
        return "off"
    eps = f", static endpoints {', '.join(r.static_endpoints)}" if r.static_endpoints else ""
    return f"on UDP {r.port}{eps}"


def apply_relay(api: LocalAPI, want: Optional[RelaySettings]) -> RelayApplyResult:
    """Make tailscaled serve (or stop serving) a peer relay; idempotent.

    Reads the prefs, patches only when they differ, and reads them back to confirm.

    Raises:
        TailscaleError: tailscaled unreachable, or it refused or ignored the change (e.g. a
            tailscaled built without the relay server feature).
    """
    prefs = api.prefs()
    patch = relay_prefs_patch(prefs, want)
    if patch is None:
        return RelayApplyResult(False, want is not None, f"peer relay server {_describe(want)}")
    before = current_relay(prefs)
    after_prefs = api.edit_prefs(patch)
    after = current_relay(after_prefs)
    if after != want:
        raise TailscaleError(f"tailscaled did not apply the peer relay setting (asked "
                             f"{_describe(want)}, prefs say {_describe(after)}); is this "
                             "tailscaled built with the relay server feature?")
    return RelayApplyResult(True, want is not None,
                            f"peer relay server {_describe(want)} (was {_describe(before)})")


@dataclass(frozen=True)
class RelaySession:
    """One session the relay server carries between two peers (status.ServerSession).

    Attributes:
        vni: Geneve virtual network identifier of the session.
        endpoints: underlay ``ip:port`` of the two clients ("" = not yet bound).
        bytes: overlay bytes each client sent through the relay (same order as endpoints).
    """

    vni: int
    endpoints: Tuple[str, str]
    bytes: Tuple[int, int]

    @property
    def bound(self) -> bool:
        """Both clients completed the handshake with the relay."""
        return all(self.endpoints)


@dataclass(frozen=True)
class RelayServerState:
    """This machine's relay server as tailscaled reports it.

    Attributes:
        port: UDP port it serves (None = relay server off).
        sessions: sessions it carries now.
        error: why the state is unknown ("" = read fine).
    """

    port: Optional[int] = None
    sessions: Tuple[RelaySession, ...] = ()
    error: str = ""

    @property
    def active(self) -> bool:
        """The relay server is configured on."""
        return self.port is not None


def _endpoint(v: Any) -> str:
    """An AddrPort from Go's JSON: "ip:port"; the zero value (not bound yet) is "" -> ""."""
    if not isinstance(v, str) or not v or ":" not in v or v.startswith("invalid"):
        return ""
    return v


def parse_relay_sessions(doc: Any) -> RelayServerState:
    """debug-peer-relay-sessions JSON (status.ServerStatus) -> RelayServerState; lenient."""
    if not isinstance(doc, dict):
        return RelayServerState(error="unexpected answer from tailscaled")
    port = doc.get("UDPPort")
    sessions: List[RelaySession] = []
    for s in doc.get("Sessions") or []:
        if not isinstance(s, dict):
            continue
        c1 = s.get("Client1") if isinstance(s.get("Client1"), dict) else {}
        c2 = s.get("Client2") if isinstance(s.get("Client2"), dict) else {}
        sessions.append(RelaySession(
            vni=clamp_uint64(s.get("VNI")),
            endpoints=(_endpoint(c1.get("Endpoint")), _endpoint(c2.get("Endpoint"))),
            bytes=(clamp_uint64(c1.get("BytesTx")), clamp_uint64(c2.get("BytesTx"))),
        ))
    return RelayServerState(
        port=port if isinstance(port, int) and not isinstance(port, bool) else None,
        sessions=tuple(sessions),
    )


def read_relay_state(api: LocalAPI) -> RelayServerState:
    """The relay server's port and sessions; the error is kept in the result, never raised."""
    try:
        return parse_relay_sessions(api.peer_relay_sessions())
    except TailscaleError as exc:
        return RelayServerState(error=str(exc))


def sync_relay(api: LocalAPI, want: Optional[RelaySettings]) -> Tuple[RelayServerState, str]:
    """Make tailscaled's relay server match want (on; off when None; idempotent), then read its
    port and sessions.

    Returns (state, a line worth logging when the prefs were changed or could not be; "" =
    nothing to say). Never raises for tailscaled's answers: a failure is kept in state.error
    (on a machine that is not a relay, an unreachable tailscaled is the poll's to report).
    """
    note = ""
    try:
        res = apply_relay(api, want)
        if res.changed:
            note = res.message
    except TailscaleError as exc:
        if want is None:
            return RelayServerState(), ""
        state = RelayServerState(error=f"cannot set the peer relay server: {exc}")
        return state, state.error
    if want is None:
        return RelayServerState(), note  # off, as the prefs say now
    return read_relay_state(api), note


def relay_summary(settings: Optional[RelaySettings], state: RelayServerState) -> Tuple[str, bool]:
    """(one-line description, ok) of this machine's relay duty, for ~status and /diagnostics.

    ``ok`` is False when the config asks for a relay and tailscaled does not run it on that
    port (or cannot be read), or runs one the config does not ask for.
    """
    if settings is None:
        if state.active:
            return f"serves a peer relay on UDP {state.port} that the config does not ask for", False
        return "not a peer relay", True
    if state.error:
        return f"peer relay on UDP {settings.port} asked for; state unknown: {state.error}", False
    if not state.active:
        return f"peer relay on UDP {settings.port} asked for but tailscaled's relay server is off", False
    if state.port != settings.port:
        return (f"peer relay asked on UDP {settings.port} but tailscaled serves UDP {state.port}",
                False)
    bound = sum(1 for s in state.sessions if s.bound)
    return (f"relays on UDP {state.port}: {len(state.sessions)} session(s), {bound} carrying "
            "traffic", True)

