"""What this machine's NAT allows, from tailscale's netcheck report, in plain words (pure).

``tailscale netcheck --format json`` gives a netcheck.Report: UDP works or not, whether the NAT's
mapping varies by destination (a hard NAT: direct links to peers behind hard or port-restricted
NATs fail and are relayed), the preferred DERP region and its latency. The DERP map names the
regions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from overlay_manager.core.json_fields import finite_ms, str_field, uint_field


def derp_region_names(derp_map: Mapping[str, Any]) -> Dict[int, Tuple[str, str]]:
    """tailcfg.DERPMap dict -> {region id: (region code, readable name)} (name "" when absent)."""
    out: Dict[int, Tuple[str, str]] = {}
    regions = derp_map.get("Regions")
    if isinstance(regions, dict):
        for key, reg in regions.items():
            if isinstance(reg, dict):
                try:
                    rid = int(reg.get("RegionID", key))
                except (TypeError, ValueError, OverflowError):
                    continue
                out[rid] = (str_field(reg, "RegionCode") or str(rid), str_field(reg, "RegionName"))
    return out


def derp_regions(derp_map: Mapping[str, Any]) -> Dict[int, str]:
    """tailcfg.DERPMap dict -> {region id: region code}."""
    return {rid: code for rid, (code, _name) in derp_region_names(derp_map).items()}



@dataclass(frozen=True)
class NatInfo:
    """What this machine's NAT allows, from a netcheck report (netcheck.Report JSON)."""

    known: bool = False
    udp: bool = False
    hard_nat: bool = False
    hard_nat_known: bool = False
    preferred_derp: str = ""
    preferred_derp_latency_ms: float = math.nan
    summary: str = "NAT not checked yet"
    preferred_derp_name: str = ""
    """Readable name of the home region ("" = unknown)."""
    region_latency: Tuple[Tuple[str, str, float], ...] = ()
    """(code, name, latency ms) of every region the check reached, lowest latency first."""


def _opt_bool(v: Any) -> Optional[bool]:
    """Go's opt.Bool JSON ("true"/"false"/"" or a bool) -> bool or None (unknown)."""
    if isinstance(v, bool):
        return v
    if v == "true":
        return True
    if v == "false":
        return False
    return None


def parse_netcheck(report: Mapping[str, Any], regions: Mapping[int, str],
                   names: Optional[Mapping[int, str]] = None) -> NatInfo:
    """netcheck.Report dict (+ DERP region codes, and names by region id) -> NatInfo with a
    plain-words summary and the latency to every region it reached."""
    udp = report.get("UDP") is True
    varies = _opt_bool(report.get("MappingVariesByDestIP"))
    pref_id = uint_field(report, "PreferredDERP")
    pref = regions.get(pref_id, str(pref_id) if pref_id else "")
    latency = math.nan
    lat_map = report.get("RegionLatency")
    if isinstance(lat_map, dict) and pref_id:
        latency = finite_ms(lat_map.get(str(pref_id)), 1e-6)  # Go time.Duration: nanoseconds
    if not udp:
        summary = "UDP blocked: every link will be relayed through DERP"
    elif varies is True:
        summary = ("hard NAT (mapping varies by destination): links to peers behind "
                   "port-restricted or hard NATs will be relayed")
    elif varies is False:
        summary = "easy NAT (endpoint-independent mapping): direct links are possible"
    else:
        summary = "UDP works; NAT mapping behaviour unknown"
    names = names or {}
    per_region = []
    if isinstance(lat_map, dict):
        for key, ns in lat_map.items():
            try:
                rid = int(key)
            except (TypeError, ValueError):
                continue
            ms = finite_ms(ns, 1e-6)
            if not math.isnan(ms):
                per_region.append((regions.get(rid, str(rid)), names.get(rid, ""), ms))
    per_region.sort(key=lambda x: (x[2], x[0]))
    pref_name = names.get(pref_id, "") if pref_id else ""
    if pref:
        lat = "" if math.isnan(latency) else f" ({latency:.1f} ms)"
        label = f"{pref} ({pref_name})" if pref_name and pref_name != pref else pref
        summary += f"; home DERP {label}{lat}"
    return NatInfo(
        known=True,
        udp=udp,
        hard_nat=varies is True,
        hard_nat_known=varies is not None,
        preferred_derp=pref,
        preferred_derp_latency_ms=latency,
        summary=summary,
        preferred_derp_name=pref_name,
        region_latency=tuple(per_region),
    )
