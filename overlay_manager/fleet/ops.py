"""Fleet operations on a running deployment: status, revoke, rotate."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional, Set, Tuple, Union

from overlay_manager.fleet.bundle import nodes_named, read_key_record, write_bundle
from overlay_manager.fleet.deploy import Deployment
from overlay_manager.fleet.headscale import HeadscaleCLI, Node
from overlay_manager.fleet.model import FleetConfig, FleetError


@dataclass(frozen=True)
class HostStatus:
    """One row of ``fleet status``.

    Attributes:
        host: short name (for unknown nodes: the node's name).
        team: team name ("" for a node not in the fleet file).
        role: robot | base_station | operator ("" when not in the fleet file).
        state: ``online`` | ``offline`` | ``expired`` (node key expired or revoked) |
            ``never-enrolled`` | ``unknown`` (enrolled but not in the fleet file).
        node_id: headscale node id (0 when never enrolled).
        ip: first overlay address ("" when never enrolled).
        last_seen: last time connected to headscale (None = never/unknown).
        node_expiry: when the node key expires (None = never).
        key_id: the host's current pre-auth key id (0 = none recorded).
        key_expiry: when that pre-auth key stops working (None = never or none).
        tags: the node's tags (or the tags it will get, when never enrolled).
        problems: human-readable problems (tags differ from the fleet file, bundle key expired,
            duplicate nodes).
    """

    host: str
    team: str
    role: str
    state: str
    node_id: int
    ip: str
    last_seen: Optional[datetime]
    node_expiry: Optional[datetime]
    key_id: int
    key_expiry: Optional[datetime]
    tags: Tuple[str, ...]
    problems: Tuple[str, ...] = ()


def fleet_status(dep: Deployment, fleet: FleetConfig, cli: Optional[HeadscaleCLI] = None,
                 now: Optional[datetime] = None) -> List[HostStatus]:
    """Every host of the fleet file (in file order), then enrolled nodes not in the file."""
    cli = cli or dep.cli()
    now = now or datetime.now(timezone.utc)
    nodes = cli.list_nodes()
    keys = {k.id: k for k in cli.list_preauth_keys()}
    rows: List[HostStatus] = []
    claimed: Set[int] = set()
    for name, h in fleet.hosts.items():
        want = tuple(sorted(fleet.host_tags(name)))
        mine = nodes_named(nodes, name)
        claimed.update(n.id for n in mine)
        rec = read_key_record(dep, name)
        key = keys.get(rec[0]) if rec else None
        key_id = rec[0] if rec else 0
        key_exp = key.expiration if key else (rec[1] if rec else None)
        problems: List[str] = []
        live = [n for n in mine if not n.expired(now)]
        node: Optional[Node] = (live or mine or [None])[0]
        if len(live) > 1:
            problems.append(f"{len(live)} live nodes with this name (ids "
                            f"{', '.join(str(n.id) for n in live)}): revoke --delete the stale ones")
        if node is None:
            state = "never-enrolled"
            if rec is None:
                problems.append("no bundle yet: run `fleet bundle " + name + "`")
            elif key is None or not key.usable(now):
                problems.append("bundle key expired or used: run `fleet bundle " + name + "`")
            rows.append(HostStatus(name, h.team, h.role, state, 0, "", None, None, key_id,
                                   key_exp, want, tuple(problems)))
            continue
        if node.expired(now):
            state = "expired"
        else:
            state = "online" if node.online else "offline"
        if tuple(sorted(node.tags)) != want:
            problems.append(f"tags {', '.join(sorted(node.tags)) or 'none'} differ from the "
                            f"fleet file ({', '.join(want)}): rotate it")
        rows.append(HostStatus(name, h.team, h.role, state, node.id,
                               node.ip_addresses[0] if node.ip_addresses else "",
                               node.last_seen, node.expiry, key_id, key_exp,
                               tuple(sorted(node.tags)), tuple(problems)))
    for n in nodes:
        if n.id not in claimed:
            rows.append(HostStatus(n.given_name or n.name, "", "", "unknown", n.id,
                                   n.ip_addresses[0] if n.ip_addresses else "", n.last_seen,
                                   n.expiry, 0, None, tuple(sorted(n.tags)),
                                   ("enrolled but not in the fleet file",)))
    return rows


@dataclass(frozen=True)
class RevokeResult:
    """What :func:`revoke` did: node ids expired, deleted, and pre-auth key ids expired."""

    expired_nodes: Tuple[int, ...]
    deleted_nodes: Tuple[int, ...]
    expired_keys: Tuple[int, ...]


def revoke(dep: Deployment, fleet: Optional[FleetConfig], host: str, *, delete: bool = False,
           cli: Optional[HeadscaleCLI] = None) -> RevokeResult:
    """Cut ``host`` off: expire its node(s) and its recorded pre-auth key.

    Idempotent (an expired node/key is left as is). With ``delete`` the nodes are also
    deleted, so the name is free for a fresh enrolment. ``host`` may also be a node that is
    not in the fleet file (pass ``fleet=None`` or any fleet).

    Raises:
        FleetError: naming the host when nothing by that name exists, or on CLI failure.
    """
    cli = cli or dep.cli()
    try:
        mine = nodes_named(cli.list_nodes(), host)
        in_fleet = fleet is not None and host in fleet.hosts
        if not mine and not in_fleet:
            raise FleetError("no enrolled node and no fleet-file host by this name", host=host)
        expired, deleted, keys_expired = [], [], []
        for n in mine:
            if not n.expired():
                cli.expire_node(n.id)
                expired.append(n.id)
            if delete:
                cli.delete_node(n.id)
                deleted.append(n.id)
        rec = read_key_record(dep, host)
        if rec is not None:
            listed = {k.id: k for k in cli.list_preauth_keys()}
            k = listed.get(rec[0])
            if k is not None and k.usable():
                cli.expire_preauth_key(k.id)
                keys_expired.append(k.id)
    except FleetError as e:
        raise FleetError(e.reason, file=e.file, key=e.key, host=host) from None
    return RevokeResult(tuple(expired), tuple(deleted), tuple(keys_expired))


def rotate(dep: Deployment, fleet: FleetConfig, host: str, outdir: Union[str, Path], *,
           expire_node: bool = False) -> Path:
    """Replace ``host``'s pre-auth key (the old one is expired if unused) and write a new bundle.

    An enrolled, unexpired node keeps running; it can re-enrol with the new key
    (``tailscale up --force-reauth --auth-key=file:auth.key``) and stays the same node. Nodes
    of ``host`` that are expired (revoked) are deleted: headscale 0.29 keeps a tagged node's
    expiry on re-registration, so an expired node could never come back; the machine enrols
    as a fresh node from the new bundle. With ``expire_node`` the live node is expired and
    deleted as well (cut off a lost or compromised machine and issue a fresh bundle).
    Returns the new robot.yaml path.
    """
    fleet.host(host)
    cli = dep.cli()
    try:
        for n in nodes_named(cli.list_nodes(), host):
            if expire_node and not n.expired():
                cli.expire_node(n.id)
            if expire_node or n.expired():
                cli.delete_node(n.id)
    except FleetError as e:
        raise FleetError(e.reason, file=e.file, key=e.key, host=host) from None
    return write_bundle(dep, fleet, host, outdir, force_new_key=True)


def sync_tags(dep: Deployment, fleet: FleetConfig, cli: Optional[HeadscaleCLI] = None) -> List[str]:
    """Give every enrolled, unexpired host of the fleet file the tags the file says it has now.

    headscale keeps a node's tags when it re-enrols, so a host that became a relay (or changed
    team or role) after enrolment keeps its old tags until they are set here. Run after the
    policy that owns the new tags is in force (headscale refuses tags without an owner).

    Returns one line per changed host, e.g. "alpha-base: tags tag:base-station, tag:team-alpha ->
    tag:base-station, tag:relay, tag:relay-alpha-base, tag:team-alpha".

    Raises:
        FleetError: headscale not running or refusing the tags (naming the host).
    """
    cli = cli or dep.cli()
    changed: List[str] = []
    nodes = cli.list_nodes()
    for name in fleet.hosts:
        want = sorted(fleet.host_tags(name))
        for node in nodes_named(nodes, name):
            if node.expired() or sorted(node.tags) == want:
                continue
            try:
                cli.set_tags(node.id, want)
            except FleetError as e:
                raise FleetError(e.reason, file=e.file, key=e.key, host=name) from None
            changed.append(f"{name}: tags {', '.join(sorted(node.tags)) or 'none'} -> {', '.join(want)}")
    return changed
