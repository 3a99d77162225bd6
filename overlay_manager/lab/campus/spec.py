"""Lab spec: a small YAML description of a campus, validated into frozen dataclasses.

A spec names a control host (Headscale with embedded DERP and STUN), buildings (a LAN behind a
router whose NAT behaviour is chosen by name) and the hosts in each building. Example::

    name: two_buildings
    control: {port: 8443, stun_port: 3478, base_domain: fleet.internal}
    buildings:
      b1: {nat: eim-adpf, hosts: [robot1]}
      b2: {nat: eim-adpf, hosts: {laptop: {team: ops}}}
    impair:
      b2: {delay_ms: 10, jitter_ms: 1, loss_pct: 0.5, rate_mbit: 100}

NAT kinds follow RFC 4787: ``<mapping>-<filtering>`` with mapping ``eim`` (endpoint-independent),
``adm`` (address-dependent) or ``adpm`` (address-and-port-dependent) and filtering ``eif``, ``adf``
or ``adpf``; a bare mapping (``eim``) means ``<mapping>-adpf`` (what Linux conntrack does by
default). ``udp-blocked`` is ``eim-adpf`` that forwards no UDP except to the STUN server;
``tcp-only`` forwards no UDP at all (tailscale can only use DERP over HTTPS); ``udp-servers`` is
``eim-adpf`` that forwards UDP only to the campus servers: the STUN server and the peer relays'
UDP ports (what many campuses do). ``public`` is a campus server network: no NAT, its hosts'
addresses are routed on the backbone (where a campus puts a relay).

Peer relays (``relays: {relay1: {port: 40000, teams: [alpha]}}``) name hosts of the spec that
serve a Tailscale peer relay; they become the lab fleet's ``relays`` section.

DERP regions (``derp: {embedded: false, regions: {east: {id: 901, servers: [east-derp]}}}``)
name hosts of ``public`` buildings that run tailscale's derper (with their own tailscaled, which
derper asks to verify clients); they become the lab fleet's ``derp_regions`` section, and
``embedded`` turns headscale's embedded DERP on or off (default on).

Every error is a :class:`SpecError` (the validation layer's ConfigError, also a LabError) naming
the file and the key path. The values (NatKind, Impairment, LabSpec, ...) are defined in
spec_model.py.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Set, Tuple

from overlay_manager.core.validation import (
    MISSING,
    ConfigError,
    Reader,
    is_domain,
    join_key,
    load_yaml,
    lower_case_hint,
    shorten,
    type_name,
)
from overlay_manager.lab.campus.errors import SpecError
from overlay_manager.lab.campus.spec_model import (
    DEFAULT_RELAY_PORT,
    BuildingSpec,
    ControlSpec,
    DerpRegionSpec,
    DerpSpec,
    HostSpec,
    Impairment,
    LabSpec,
    RelaySpec,
    SpecInput,
    nat_kind_names,
    parse_nat_kind,
)

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,22}[a-z0-9])?$")
"""Building and host names: lowercase DNS labels (a-z, 0-9, '-'; a digit may come first) of at most
24 characters: they become network namespace names (``olab<run>-h-<host>``), tailscale host names
and, through ros_names.ros_namespace, ROS namespaces (``alpha-robot1`` -> ``/alpha_robot1``)."""
RESERVED_NAMES = frozenset({"control", "backbone", "bb", "ctl"})
ROLES = ("robot", "base_station", "operator")
"""Fleet roles a lab host can have."""
MAX_BUILDINGS = 200
MAX_HOSTS_PER_BUILDING = 200


class _SpecReader(Reader):
    """The validation layer's Reader raising SpecError (a ConfigError that is also a LabError)."""

    def error(self, key: str, problem: str, host: str = "") -> ConfigError:
        return SpecError(self.source, key, problem, host=host)


def _check_keys(source: str, key: str, value: Any, allowed: Set[str]) -> Mapping[str, Any]:
    return _SpecReader(source).mapping(value, key, allowed)


def _name(source: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise SpecError(source, key, f"{shorten(value)} is not a name: lowercase letters, digits and '-', "
                        f"not starting or ending with '-', at most 24 characters{lower_case_hint(value, NAME_RE)}")
    if value in RESERVED_NAMES:
        raise SpecError(source, key, f"{value!r} is reserved ({', '.join(sorted(RESERVED_NAMES))})")
    return value


def _number(source: str, key: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(source, key, f"expected a number, got {shorten(value)}")
    f = _SpecReader(source).number(value, key)  # finite
    if not lo <= f <= hi:
        raise SpecError(source, key, f"{f:g} is outside {lo:g}..{hi:g}")
    return f


def _port(source: str, key: str, value: Any) -> int:
    return _SpecReader(source).port(value, key)


def parse_impairment(source: str, key: str, value: Any) -> Impairment:
    """Validate one impairment mapping (keys delay_ms, jitter_ms, loss_pct, rate_mbit)."""
    data = _check_keys(source, key, value, {"delay_ms", "jitter_ms", "loss_pct", "rate_mbit"})
    imp = Impairment(
        delay_ms=_number(source, f"{key}.delay_ms", data.get("delay_ms", 0), 0, 60000),
        jitter_ms=_number(source, f"{key}.jitter_ms", data.get("jitter_ms", 0), 0, 60000),
        loss_pct=_number(source, f"{key}.loss_pct", data.get("loss_pct", 0), 0, 100),
        rate_mbit=_number(source, f"{key}.rate_mbit", data.get("rate_mbit", 0), 0, 100000),
    )
    if imp.jitter_ms and not imp.delay_ms:
        raise SpecError(source, f"{key}.jitter_ms", "jitter needs delay_ms > 0")
    return imp


def _parse_hosts(source: str, key: str, value: Any, building: str) -> Tuple[HostSpec, ...]:
    items: List[Tuple[str, Any]]
    if isinstance(value, list):
        items = [(v, {}) for v in value]
        keys = [f"{key}[{i}]" for i in range(len(value))]
    elif isinstance(value, Mapping):
        items = [(k, v if v is not None else {}) for k, v in value.items()]
        keys = [join_key(key, k) for k in value]
    else:
        raise SpecError(source, key, "expected a list of host names or a mapping name -> {team, role}, "
                        f"got {type_name(value)}")
    if not 1 <= len(items) <= MAX_HOSTS_PER_BUILDING:
        raise SpecError(source, key, f"a building needs 1..{MAX_HOSTS_PER_BUILDING} hosts")
    hosts = []
    for (name, body), hkey in zip(items, keys):
        _name(source, hkey, name)
        data = _check_keys(source, hkey, body, {"team", "role"})
        team = data.get("team", "lab")
        if not isinstance(team, str) or not NAME_RE.match(team):
            raise SpecError(source, f"{hkey}.team", f"{shorten(team)} is not a name")
        role = data.get("role", "robot")
        if not isinstance(role, str) or role not in ROLES:
            raise SpecError(source, f"{hkey}.role", f"{shorten(role)} is not one of {', '.join(ROLES)}")
        hosts.append(HostSpec(name=name, building=building, team=team, role=role))
    return tuple(hosts)


def parse_spec(data: Any, source: str = "<dict>", default_name: str = "lab") -> LabSpec:
    """Validate a spec given as parsed YAML; ``source`` names it in errors."""
    r = _SpecReader(source)
    if data is None:
        raise SpecError(source, "(top)", "empty spec")
    top = r.mapping(data, "", {"name", "control", "buildings", "teams", "impair", "relays", "derp"})
    name = r.string(top.get("name", MISSING), "name", default_name, empty=False, max_len=64)

    ctl = r.mapping(top.get("control"), "control", {"port", "stun_port", "base_domain"})
    base_domain = ctl.get("base_domain", "fleet.internal")
    if not isinstance(base_domain, str) or not is_domain(base_domain):
        raise SpecError(source, "control.base_domain", f"{shorten(base_domain)} is not a DNS domain")
    control = ControlSpec(
        port=_port(source, "control.port", ctl.get("port", 8443)),
        stun_port=_port(source, "control.stun_port", ctl.get("stun_port", 3478)),
        base_domain=base_domain,
    )

    raw_buildings = top.get("buildings")
    if not isinstance(raw_buildings, Mapping) or not raw_buildings:
        raise SpecError(source, "buildings", "expected a non-empty mapping building name -> {nat, hosts}, "
                        f"got {type_name(raw_buildings)}")
    r.mapping(raw_buildings, "buildings")  # string keys only
    if len(raw_buildings) > MAX_BUILDINGS:
        raise SpecError(source, "buildings", f"at most {MAX_BUILDINGS} buildings")
    buildings = []
    seen: Dict[str, str] = {}
    for bname, body in raw_buildings.items():
        bkey = join_key("buildings", bname)
        _name(source, bkey, bname)
        b = _check_keys(source, bkey, body if body is not None else {}, {"nat", "hosts"})
        if "nat" not in b:
            raise SpecError(source, f"{bkey}.nat", "missing (e.g. eim-adpf)")
        try:
            if not isinstance(b["nat"], str):
                raise ValueError(f"expected a NAT kind name, got {type_name(b['nat'])}; "
                                 f"valid: {', '.join(nat_kind_names())}")
            nat = parse_nat_kind(b["nat"])
        except ValueError as exc:
            raise SpecError(source, f"{bkey}.nat", str(exc)) from None
        if "hosts" not in b:
            raise SpecError(source, f"{bkey}.hosts", "missing (a list of host names)")
        hosts = _parse_hosts(source, f"{bkey}.hosts", b["hosts"], bname)
        for n, k in [(bname, bkey)] + [(h.name, f"{bkey}.hosts.{h.name}") for h in hosts]:
            if n in seen:
                raise SpecError(source, k, f"name {n!r} already used at {seen[n]} "
                                "(building and host names share one namespace)")
            seen[n] = k
        buildings.append(BuildingSpec(name=bname, nat=nat, hosts=hosts))

    spec = LabSpec(name=name, control=control, buildings=tuple(buildings), source=source)
    teams = _parse_teams(source, top.get("teams") or {}, spec)
    impair_raw = r.mapping(top.get("impair"), "impair",
                           what="a mapping link name -> {delay_ms, jitter_ms, loss_pct, rate_mbit}")
    links = spec.link_names()
    impair: Dict[str, Impairment] = {}
    for link, body in impair_raw.items():
        if link not in links:
            raise SpecError(source, join_key("impair", link), f"unknown link (links: {', '.join(links)})")
        impair[str(link)] = parse_impairment(source, f"impair.{link}", body)
    relays = _parse_relays(r, top.get("relays"), spec, teams)
    derp = _parse_derp(r, top.get("derp"), spec)
    return LabSpec(name=name, control=control, buildings=tuple(buildings), teams=teams, impair=impair,
                   source=source, relays=relays, derp=derp)


def _parse_derp(r: Reader, raw: Any, spec: LabSpec) -> DerpSpec:
    """The ``derp`` section: {embedded, regions: {code: {id, name, servers: [host, ...]}}}."""
    m = r.mapping(raw, "derp", {"embedded", "regions"})
    embedded = r.boolean(m.get("embedded", MISSING), "derp.embedded", True)
    regions: Dict[str, DerpRegionSpec] = {}
    ids: Dict[int, str] = {}
    used: Dict[str, str] = {}
    for code, body in r.mapping(m.get("regions"), "derp.regions",
                                what="a mapping region code -> {id, name, servers}").items():
        key = join_key("derp.regions", code)
        _name(r.source, key, code)
        b = r.mapping(body, key, {"id", "name", "servers"})
        rid = r.integer(b.get("id", MISSING), f"{key}.id", lo=900, hi=998 if embedded else 999)
        if rid in ids:
            raise r.error(f"{key}.id", f"id {rid} already used by region {ids[rid]!r}")
        ids[rid] = code
        servers = r.string_list(b.get("servers", MISSING), f"{key}.servers")
        if not servers:
            raise r.error(f"{key}.servers", "needs at least one host")
        for i, host in enumerate(servers):
            hk = f"{key}.servers[{i}]"
            try:
                h = spec.host(host)
            except KeyError:
                raise r.error(hk, f"no host {shorten(host)} in the spec (hosts: "
                                  f"{', '.join(x.name for x in spec.hosts)})") from None
            if not spec.building(h.building).nat.public:
                raise r.error(hk, f"{host} is in building {h.building!r} ({spec.building(h.building).nat.name}): "
                                  "a derper host must be in a public building (a campus server network)")
            if h.role == "operator":
                raise r.error(hk, "an operator cannot run derper (use a robot or base station)")
            if host in used:
                raise r.error(hk, f"{host} already serves region {used[host]!r}")
            used[host] = code
        regions[str(code)] = DerpRegionSpec(code=str(code), id=rid,
                                            name=r.string(b.get("name", MISSING), f"{key}.name", str(code),
                                                          empty=False, max_len=128),
                                            servers=tuple(servers))
    if not embedded and not regions:
        raise r.error("derp.embedded", "false needs derp.regions (machines would have no relay)")
    return DerpSpec(embedded=embedded, regions=regions)


def _parse_relays(r: Reader, raw: Any, spec: LabSpec, teams: Mapping[str, str]) -> Dict[str, RelaySpec]:
    """Host -> RelaySpec from the ``relays`` mapping (host -> {port, teams})."""
    section = r.mapping(raw, "relays", what="a mapping relay host -> {port, teams}")
    out: Dict[str, RelaySpec] = {}
    for host, body in section.items():
        key = join_key("relays", host)
        try:
            h = spec.host(host)
        except KeyError:
            raise r.error(key, f"no host {shorten(host)} in the spec (hosts: "
                               f"{', '.join(x.name for x in spec.hosts)})") from None
        if h.role == "operator":
            raise r.error(key, "an operator cannot be a relay (use a robot or base station)")
        m = r.mapping(body, key, {"port", "teams"})
        served = r.string_list(m.get("teams", MISSING), f"{key}.teams", [])
        for i, t in enumerate(served):
            if t not in teams:
                raise r.error(f"{key}.teams[{i}]", f"unknown team {shorten(t)} (teams: {', '.join(teams)})")
        out[host] = RelaySpec(host=host, port=r.port(m.get("port", MISSING), f"{key}.port", DEFAULT_RELAY_PORT),
                              teams=tuple(served))
    return out


def _parse_teams(source: str, raw: Any, spec: LabSpec) -> Dict[str, str]:
    """Team -> master host; a team without an entry gets its first robot (else its first host)."""
    _SpecReader(source).mapping(raw, "teams", what="a mapping team name -> {master: HOST}")
    members: Dict[str, List[HostSpec]] = {}
    for h in spec.hosts:
        members.setdefault(h.team, []).append(h)
    teams: Dict[str, str] = {}
    for team, body in raw.items():
        key = join_key("teams", team)
        if team not in members:
            raise SpecError(source, key, f"no host has team {team!r} (teams: {', '.join(members)})")
        data = _check_keys(source, key, body if body is not None else {}, {"master"})
        master = data.get("master")
        if master is not None:
            if not any(h.name == master for h in members[team]):
                raise SpecError(source, f"{key}.master", f"{shorten(master)} is not a host of team {team!r}")
            teams[str(team)] = str(master)
    for team, hosts in members.items():
        if team not in teams:
            robots = [h for h in hosts if h.role == "robot"]
            teams[team] = (robots or hosts)[0].name
    return teams


def load_spec(spec: SpecInput) -> LabSpec:
    """Load and validate a spec from a YAML file path, a parsed mapping, or pass a LabSpec through."""
    if isinstance(spec, LabSpec):
        return spec
    if isinstance(spec, Mapping):
        return parse_spec(spec)
    path = Path(spec)
    try:
        data = load_yaml(path)
    except SpecError:
        raise
    except ConfigError as exc:
        raise SpecError(exc.source, exc.key, exc.problem) from None
    return parse_spec(data, source=str(path), default_name=path.stem)


def spec_to_dict(spec: LabSpec) -> Dict[str, Any]:
    """A plain mapping that :func:`parse_spec` turns back into an equal spec (for state files)."""
    def imp(i: Impairment) -> Dict[str, float]:
        return {k: v for k, v in (("delay_ms", i.delay_ms), ("jitter_ms", i.jitter_ms),
                                  ("loss_pct", i.loss_pct), ("rate_mbit", i.rate_mbit)) if v}

    return {
        "name": spec.name,
        "control": {"port": spec.control.port, "stun_port": spec.control.stun_port,
                    "base_domain": spec.control.base_domain},
        "buildings": {
            b.name: {"nat": b.nat.name,
                     "hosts": {h.name: {"team": h.team, "role": h.role} for h in b.hosts}}
            for b in spec.buildings
        },
        "teams": {t: {"master": m} for t, m in spec.teams.items()},
        "impair": {link: imp(i) for link, i in spec.impair.items()},
        "relays": {h: ({"port": rs.port, "teams": list(rs.teams)} if rs.teams else {"port": rs.port})
                   for h, rs in spec.relays.items()},
        "derp": {"embedded": spec.derp.embedded,
                 "regions": {c: {"id": rg.id, "name": rg.name, "servers": list(rg.servers)}
                             for c, rg in spec.derp.regions.items()}},
    }
