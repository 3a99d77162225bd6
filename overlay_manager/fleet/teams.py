"""The fleet file's ``teams`` and ``hosts`` sections -> :class:`~overlay_manager.fleet.model.Team`
values with their :class:`~overlay_manager.fleet.model.Host` members.

A host is listed either in its team (``teams.<team>.{robots,base_stations,operators}``, as a
name or ``{name, master_port}``) or in ``hosts.<name>: {team, role, master_port}``. Host names
are unique across the fleet; every team has at least one host and one master (given, or its
first robot or base station).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from overlay_manager.core.validation import MISSING, Reader, is_dns_label, join_key, lower_case_hint, shorten, type_name
from overlay_manager.fleet.model import ROLES, Host, Team

_LABEL_HINT = "not a valid DNS label: use a-z, 0-9 and '-', 1 to 63 characters, not starting or ending with '-'"


def _host_entry(r: Reader, raw: Any, key: str) -> Tuple[str, int]:
    """(name, master_port) from a host entry: "name" or {name: ..., master_port: ...}."""
    if isinstance(raw, str):
        name, port = raw, 11311
    else:
        m = r.mapping(raw, key, {"name", "master_port"}, what="a host name or {name, master_port}")
        name = r.string(m.get("name", MISSING), f"{key}.name")
        port = r.port(m.get("master_port", MISSING), f"{key}.master_port", 11311)
    if not is_dns_label(name):
        raise r.error(key, _LABEL_HINT + lower_case_hint(name), host=name)
    return name, port


def load_teams(r: Reader, raw_teams: Any, raw_hosts: Any) -> Dict[str, Team]:
    """Teams by name, in file order, from the ``teams`` and ``hosts`` sections read through ``r``.

    Raises:
        ConfigError: naming the file, the key and (where it is about one machine) the host.
    """
    if not isinstance(raw_teams, dict) or not raw_teams:
        raise r.error("teams", "required: a mapping of team name -> {master, robots, "
                               f"base_stations, operators}}, got {type_name(raw_teams)}")
    r.mapping(raw_teams, "teams")  # string keys only
    members: Dict[str, List[Host]] = {}
    masters: Dict[str, str] = {}
    seen: Dict[str, str] = {}

    def add(host: Host, key: str) -> None:
        if host.name in seen:
            raise r.error(key, f"duplicate host name (also at {seen[host.name]})", host=host.name)
        seen[host.name] = key
        members[host.team].append(host)

    for tname, traw in raw_teams.items():
        tkey = f"teams.{tname}"
        if not is_dns_label(tname):
            raise r.error(join_key("teams", tname), "team name must be a DNS label")
        tm = r.mapping(traw, tkey, {"master", "robots", "base_stations", "operators"})
        members[tname] = []
        if "master" in tm:
            masters[tname] = r.string(tm["master"], f"{tkey}.master")
        for role in ROLES:
            lst = tm.get(role + "s", [])
            if lst is None:
                lst = []
            if not isinstance(lst, list):
                raise r.error(f"{tkey}.{role}s", f"expected a list of host names, got {type_name(lst)}")
            for i, entry in enumerate(lst):
                hkey = f"{tkey}.{role}s[{i}]"
                hname, port = _host_entry(r, entry, hkey)
                add(Host(hname, tname, role, port), hkey)

    hosts_raw = r.mapping(raw_hosts, "hosts", what="a mapping of host name -> {team, role, master_port}")
    for hname, hraw in hosts_raw.items():
        hkey = join_key("hosts", hname)
        if not is_dns_label(hname):
            raise r.error(hkey, _LABEL_HINT + lower_case_hint(hname), host=hname)
        hm = r.mapping(hraw, hkey, {"team", "role", "master_port"})
        team = r.string(hm.get("team", MISSING), f"{hkey}.team")
        if team not in members:
            raise r.error(f"{hkey}.team", f"unknown team {shorten(team)} (teams: {', '.join(members)})",
                          host=hname)
        role = r.string(hm.get("role", MISSING), f"{hkey}.role", "robot")
        if role not in ROLES:
            raise r.error(f"{hkey}.role", f"expected one of {', '.join(ROLES)}, got {shorten(role)}", host=hname)
        port = r.port(hm.get("master_port", MISSING), f"{hkey}.master_port", 11311)
        add(Host(hname, team, role, port), hkey)

    teams: Dict[str, Team] = {}
    for tname, hosts in members.items():
        if not hosts:
            raise r.error(f"teams.{tname}", "team has no hosts")
        hosts.sort(key=lambda h: ROLES.index(h.role))
        master = masters.get(tname)
        if master is None:
            machines = [h for h in hosts if h.role != "operator"]
            if not machines:
                raise r.error(f"teams.{tname}.master", "required when a team has only operators")
            master = machines[0].name
        else:
            if master not in seen:
                raise r.error(f"teams.{tname}.master", f"unknown host {shorten(master)}", host=master)
            if all(h.name != master for h in hosts):
                raise r.error(f"teams.{tname}.master", "host is not in this team", host=master)
        teams[tname] = Team(tname, master, tuple(hosts))
    return teams
