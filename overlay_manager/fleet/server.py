"""The fleet file's ``server`` section -> :class:`~overlay_manager.fleet.model.ServerConfig`: the
Headscale control server's URL, listen addresses, TLS, embedded DERP/STUN and overlay prefixes
(``config/fleet.example.yaml`` is the commented reference).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from overlay_manager.core.validation import MISSING, Reader, is_domain, shorten
from overlay_manager.fleet.model import CA_DAYS, SERVER_CERT_DAYS, DerpConfig, ServerConfig, TlsConfig


def load_server(r: Reader, raw: Any, base: Path) -> ServerConfig:
    """The ``server`` section read through ``r``; relative paths (TLS files, DERP maps) are
    resolved against ``base``.

    Raises:
        ConfigError: naming the file and the key (``server.…``).
    """
    m = r.mapping(raw, "server", {"url", "listen", "grpc_listen", "metrics_listen", "tls", "derp",
                                  "prefixes"})
    url = r.url(m.get("url", MISSING), "server.url")
    parts = urlsplit(url)
    default_port = parts.port or (443 if parts.scheme == "https" else 80)
    listen = r.hostport(m.get("listen", MISSING), "server.listen", f"0.0.0.0:{default_port}")

    t = r.mapping(m.get("tls"), "server.tls", {"generate", "cert", "key", "ca", "names", "days",
                                                   "ca_days"})
    names = r.string_list(t.get("names", MISSING), "server.tls.names", [])
    for i, n in enumerate(names):
        if not _is_san(n):
            raise r.error(f"server.tls.names[{i}]", f"{shorten(n)} is not a DNS name or IP address")

    def path(name: str) -> Optional[Path]:
        p = r.path(t.get(name), f"server.tls.{name}", base)
        return Path(p) if p else None

    tls = TlsConfig(
        generate=r.boolean(t.get("generate", MISSING), "server.tls.generate", True),
        cert=path("cert"),
        key=path("key"),
        ca=path("ca"),
        names=tuple(names),
        days=r.integer(t.get("days", MISSING), "server.tls.days", SERVER_CERT_DAYS, lo=1, hi=36500),
        ca_days=r.integer(t.get("ca_days", MISSING), "server.tls.ca_days", CA_DAYS, lo=1, hi=36500),
    )
    if parts.scheme == "https" and not tls.generate and (tls.cert is None or tls.key is None):
        raise r.error("server.tls", "with generate: false, give cert and key (PEM files)")
    if parts.scheme == "http" and (tls.cert or tls.key or tls.ca):
        raise r.error("server.tls", "cert/key/ca given but server.url is http://")

    d = r.mapping(m.get("derp"), "server.derp", {"embedded", "stun_listen", "region_id",
                                                 "region_code", "region_name", "ipv4",
                                                 "extra_maps"})
    extra = r.string_list(d.get("extra_maps", MISSING), "server.derp.extra_maps", [])
    ipv4 = r.string(d.get("ipv4", MISSING), "server.derp.ipv4", "")
    if ipv4:
        try:
            ipaddress.IPv4Address(ipv4)
        except ValueError:
            raise r.error("server.derp.ipv4", f"expected an IPv4 address, got {shorten(ipv4)}") from None
    derp = DerpConfig(
        embedded=r.boolean(d.get("embedded", MISSING), "server.derp.embedded", True),
        stun_listen=r.hostport(d.get("stun_listen", MISSING), "server.derp.stun_listen", "0.0.0.0:3478"),
        region_id=r.integer(d.get("region_id", MISSING), "server.derp.region_id", 999, lo=900, hi=999),
        region_code=r.string(d.get("region_code", MISSING), "server.derp.region_code", "fleet",
                             empty=False, max_len=32),
        region_name=r.string(d.get("region_name", MISSING), "server.derp.region_name",
                             "Fleet embedded DERP", empty=False, max_len=128),
        ipv4=ipv4,
        extra_maps=tuple(Path(r.path(x, f"server.derp.extra_maps[{i}]", base)) for i, x in enumerate(extra)),
    )

    p = r.mapping(m.get("prefixes"), "server.prefixes", {"v4", "v6"})
    v4 = r.string(p.get("v4", MISSING), "server.prefixes.v4", "100.64.0.0/10")
    v6 = r.string(p.get("v6", MISSING), "server.prefixes.v6", "fd7a:115c:a1e0::/48")
    for k, v, ver in (("v4", v4, 4), ("v6", v6, 6)):
        try:
            if ipaddress.ip_network(v).version != ver:
                raise ValueError
        except ValueError:
            raise r.error(f"server.prefixes.{k}", f"expected an IPv{ver} prefix, got {shorten(v)}") from None
    metrics = m.get("metrics_listen")
    return ServerConfig(
        url=url,
        listen=listen,
        grpc_listen=r.hostport(m.get("grpc_listen", MISSING), "server.grpc_listen", "127.0.0.1:50443"),
        metrics_listen=r.hostport(metrics, "server.metrics_listen") if metrics else "",
        tls=tls,
        derp=derp,
        prefixes_v4=v4,
        prefixes_v6=v6,
    )


def _is_san(name: str) -> bool:
    """True for a certificate subject alternative name: an IP address or a DNS name."""
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return is_domain(name.lower().rstrip(".").replace("*.", "", 1), 1)

