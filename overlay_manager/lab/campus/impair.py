"""Link impairments: tc netem where the kernel has it, otherwise tbf (rate) + nftables (loss).

Some kernels (e.g. the Firecracker VMs this project was built on) lack sch_netem
(CONFIG_NET_SCH_NETEM unset). There the lab still offers ``rate_mbit`` (tc tbf on each end's
egress) and ``loss_pct`` (an nftables netdev ingress chain on each end dropping a random share of
packets); ``delay_ms``/``jitter_ms`` raise LabError because nothing else in such a kernel can
hold packets back. All functions here are pure (they return argv lists and ruleset text).
"""
from __future__ import annotations

from typing import List, Optional

from overlay_manager.lab.campus.spec_model import Impairment

IMPAIR_TABLE = "netdev olab_impair"
LOSS_SCALE = 1_000_000
"""Loss is drawn as ``numgen random mod LOSS_SCALE < threshold`` (ppm resolution)."""


def netem_argv(ifname: str, imp: Impairment) -> List[str]:
    """``tc`` argv that installs netem with all of ``imp`` on ``ifname``'s egress."""
    return ["tc", "qdisc", "replace", "dev", ifname, "root", "netem", *imp.netem_args()]


def tbf_argv(ifname: str, rate_mbit: float) -> List[str]:
    """``tc`` argv that limits ``ifname``'s egress to ``rate_mbit`` Mbit/s with a token bucket."""
    burst_bytes = max(int(rate_mbit * 1e6 / 8 / 250), 16 * 1024)  # 4 ms worth, at least 16 KiB
    return ["tc", "qdisc", "replace", "dev", ifname, "root", "tbf", "rate", f"{rate_mbit:g}mbit",
            "burst", str(burst_bytes), "latency", "50ms"]


def clear_qdisc_argv(ifname: str) -> List[str]:
    """``tc`` argv that removes whatever root qdisc ``ifname`` has (fails harmlessly if none)."""
    return ["tc", "qdisc", "del", "dev", ifname, "root"]


def loss_ruleset(ifname: str, loss_pct: float) -> str:
    """nft text that (re)creates the ingress loss chain of ``ifname``; loss_pct 0 removes it."""
    chain = f"loss_{ifname}"
    lines = [f"table {IMPAIR_TABLE}",
             f"add chain {IMPAIR_TABLE} {chain} {{ type filter hook ingress device \"{ifname}\" priority 0; }}",
             f"flush chain {IMPAIR_TABLE} {chain}",
             f"delete chain {IMPAIR_TABLE} {chain}"]
    if loss_pct > 0:
        threshold = round(loss_pct / 100 * LOSS_SCALE)
        match = f"numgen random mod {LOSS_SCALE} < {threshold} " if threshold < LOSS_SCALE else ""
        lines += [f"add chain {IMPAIR_TABLE} {chain} {{ type filter hook ingress device \"{ifname}\" priority 0; }}",
                  f"add rule {IMPAIR_TABLE} {chain} {match}drop comment \"lab impair loss {loss_pct:g}%\""]
    return "\n".join(lines) + "\n"


def fallback_supported(imp: Impairment) -> Optional[str]:
    """None when ``imp`` can be built without netem; otherwise the reason it cannot."""
    if imp.delay_ms or imp.jitter_ms:
        return ("delay/jitter need tc netem, and this kernel has no sch_netem "
                "(CONFIG_NET_SCH_NETEM); rate_mbit and loss_pct still work")
    return None
