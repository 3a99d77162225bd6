"""Typed access to a parsed YAML document: every error names the file and the dotted key.

:class:`Reader` checks mappings with known keys, strings, finite numbers with ranges, integers,
booleans, ports, URLs (urllib.parse), host:port pairs, DNS labels and domains, file paths and
existing files. :data:`DNS_LABEL` is the project's one DNS-label pattern.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import stat
from typing import Any, Dict, Iterable, List, Mapping, Optional, Pattern, Sequence
from urllib.parse import urlsplit

from overlay_manager.core.validation.errors import ConfigError, looks_secret, shorten, type_name

#: A DNS label as used for host names, team names and domain parts: lowercase a-z, 0-9 and '-',
#: 1 to 63 characters, not starting or ending with '-'.
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

#: An ACL tag like ``tag:robot``.
ACL_TAG = re.compile(r"^tag:[A-Za-z0-9][A-Za-z0-9_-]*$")


MISSING: Any = object()
"""Marker for "key not given" (distinct from an explicit null)."""


def join_key(prefix: str, key: Any) -> str:
    """Dotted key path ``prefix.key`` (``key`` alone when there is no prefix)."""
    k = key if isinstance(key, str) else str(key)
    k = shorten(k, 80)[1:-1] if len(k) > 80 or not k.isprintable() else k
    return f"{prefix}.{k}" if prefix else k


def is_dns_label(name: Any) -> bool:
    """True when ``name`` is a lowercase DNS label (see :data:`DNS_LABEL`)."""
    return isinstance(name, str) and bool(DNS_LABEL.match(name))


def lower_case_hint(name: Any, pattern: Pattern[str] = DNS_LABEL) -> str:
    """`` (write it in lower case: 'alpha-robot1')`` when ``name`` matches ``pattern`` once lower-cased,
    else "": host names are case-insensitive and tailscale and headscale show them in lower case,
    so configuration files must use that form."""
    if isinstance(name, str) and name != name.lower() and pattern.match(name.lower()):
        return f" (write it in lower case: {name.lower()!r})"
    return ""


def is_domain(name: Any, min_labels: int = 2) -> bool:
    """True when ``name`` is at least ``min_labels`` dot-separated DNS labels, at most 253 chars."""
    if not isinstance(name, str) or len(name) > 253:
        return False
    parts = name.split(".")
    return len(parts) >= min_labels and all(DNS_LABEL.match(p) for p in parts)


class Reader:
    """Typed, validated access to one parsed YAML document; every error names file and key.

    Methods take the value (``m.get(name, MISSING)``) and its dotted key path. A MISSING value
    gets the ``default`` when one is given, else "missing (required)".
    """

    def __init__(self, source: Any) -> None:
        self.source = str(source)

    def error(self, key: str, problem: str, host: str = "") -> ConfigError:
        """A ConfigError for ``key`` of this document."""
        return ConfigError(self.source, key, problem, host=host)

    def _given(self, value: Any, key: str, default: Any) -> Any:
        if value is MISSING:
            if default is MISSING:
                raise self.error(key, "missing (required)")
            return default
        return value

    def mapping(self, value: Any, key: str, allowed: Optional[Iterable[str]] = None,
                *, what: str = "a mapping") -> Dict[str, Any]:
        """``value`` as a dict with string keys ({} for null/missing); unknown keys are errors.

        Args:
            allowed: the known keys (None = any string key).
            what: how to describe the expected mapping in the message.
        """
        if value is None or value is MISSING:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(key or "(top level)", f"must be {what}, got {type_name(value)} {shorten(value)}")
        known = None if allowed is None else set(allowed)
        for k in value:
            if not isinstance(k, str):
                raise self.error(join_key(key, k), f"keys must be strings, got {type_name(k)} {shorten(k)}"
                                 " (quote it)")
            if known is not None and k not in known:
                raise self.error(join_key(key, k), f"unknown key (allowed: {', '.join(sorted(known))})")
        return dict(value)

    def string(self, value: Any, key: str, default: Any = MISSING, *, empty: bool = True,
               max_len: int = 4096) -> str:
        """A string (``empty`` = whether "" is allowed), at most ``max_len`` characters."""
        v = self._given(value, key, default)
        if v is None and default is MISSING:
            raise self.error(key, "missing (required)")
        if not isinstance(v, str):
            raise self.error(key, f"must be a string, got {type_name(v)} {shorten(v)}")
        if not empty and not v:
            raise self.error(key, "must not be empty")
        if len(v) > max_len:
            raise self.error(key, f"is {len(v)} characters long; at most {max_len} expected")
        return v

    def boolean(self, value: Any, key: str, default: Any = MISSING) -> bool:
        """true or false (not 'yes', 1 or a string)."""
        v = self._given(value, key, default)
        if not isinstance(v, bool):
            raise self.error(key, f"must be a boolean (true or false), got {type_name(v)} {shorten(v)}")
        return v

    def integer(self, value: Any, key: str, default: Any = MISSING, *, lo: Optional[int] = None,
                hi: Optional[int] = None) -> int:
        """An integer in [lo, hi]."""
        v = self._given(value, key, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(key, f"must be an integer, got {type_name(v)} {shorten(v)}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise self.error(key, f"must be an integer in [{'' if lo is None else lo}, "
                                  f"{'' if hi is None else hi}], got {shorten(v)}")
        return v

    def number(self, value: Any, key: str, default: Any = MISSING, *, lo: Optional[float] = None,
               hi: Optional[float] = None, lo_open: bool = False) -> float:
        """A finite number in [lo, hi] (``(lo, hi]`` with ``lo_open``), as float."""
        v = self._given(value, key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.error(key, f"must be a number, got {type_name(v)} {shorten(v)}")
        try:
            f = float(v)
        except OverflowError:
            raise self.error(key, f"must be a finite number, got {shorten(v)} (too large)") from None
        if not math.isfinite(f):
            raise self.error(key, f"must be a finite number, got {f} (.nan and .inf are not allowed)")
        if lo is not None and (f <= lo if lo_open else f < lo):
            if lo == 0 and not lo_open:
                raise self.error(key, f"must not be negative, got {f:g}")
            raise self.error(key, f"must be {'>' if lo_open else '>='} {lo:g}, got {f:g}")
        if hi is not None and f > hi:
            raise self.error(key, f"must be <= {hi:g}, got {f:g}")
        return f

    def port(self, value: Any, key: str, default: Any = MISSING) -> int:
        """A TCP/UDP port number 1..65535."""
        v = self._given(value, key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
            raise self.error(key, f"must be a port number 1..65535, got {shorten(v)}")
        return v

    def string_list(self, value: Any, key: str, default: Any = MISSING) -> List[str]:
        """A list of non-empty strings (null = [])."""
        v = self._given(value, key, default)
        if v is None:
            return []
        if not isinstance(v, list):
            raise self.error(key, f"must be a list of strings, got {type_name(v)} {shorten(v)}")
        for i, item in enumerate(v):
            if not isinstance(item, str) or not item:
                raise self.error(f"{key}[{i}]", f"must be a non-empty string, got {shorten(item)}")
        return list(v)

    def choice(self, value: Any, key: str, choices: Sequence[str], default: Any = MISSING) -> str:
        """One of ``choices``."""
        v = self._given(value, key, default)
        if not isinstance(v, str) or v not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {shorten(v)}")
        return v

    def domain(self, value: Any, key: str, default: Any = MISSING, *, min_labels: int = 2) -> str:
        """A DNS domain (trailing dot removed) of at least ``min_labels`` labels."""
        v = self.string(value, key, default).rstrip(".")
        if not is_domain(v, min_labels):
            raise self.error(key, f"{shorten(v)} is not a DNS domain like fleet.internal "
                                  "(lowercase labels separated by dots)")
        return v

    def url(self, value: Any, key: str, default: Any = MISSING,
            schemes: Sequence[str] = ("http", "https")) -> str:
        """A base URL ``scheme://host[:port]`` (no path, query, fragment, user, spaces); no trailing /."""
        v = self.string(value, key, default, empty=False, max_len=2048)
        example = f"expected {schemes[-1]}://HOST:PORT"
        if any(c.isspace() or ord(c) < 32 for c in v):
            raise self.error(key, f"{shorten(v)} contains spaces or control characters; {example}")
        try:
            parts = urlsplit(v)
            port = parts.port
        except ValueError as exc:
            raise self.error(key, f"{shorten(v)} is not a valid URL ({exc}); {example}") from None
        if parts.scheme not in schemes:
            raise self.error(key, f"{shorten(v)} is not an {'/'.join(schemes)} URL; {example}")
        if not parts.hostname:
            raise self.error(key, f"{shorten(v)} has no host; {example}")
        if parts.username is not None or parts.password is not None:
            raise self.error(key, "must not contain user:password@; " + example)
        if port is not None and not 1 <= port <= 65535:
            raise self.error(key, f"port {port} is not in 1..65535")
        if parts.path not in ("", "/") or parts.query or parts.fragment or v.endswith(("?", "#")):
            raise self.error(key, f"{shorten(v)} must not have a path, query or fragment; {example}")
        return v.rstrip("/")

    def hostport(self, value: Any, key: str, default: Any = MISSING) -> str:
        """``host:port`` (host: IP address, [IPv6], DNS name, or empty for all addresses)."""
        v = self.string(value, key, default)
        host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise self.error(key, f"expected host:port with a port 1..65535, got {shorten(v)}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if host:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                if not is_domain(host, 1):
                    raise self.error(key, f"bad host in {shorten(v)}") from None
        return v

    def path(self, value: Any, key: str, base: Any, default: Any = "") -> str:
        """A file path ("" when not given); relative paths resolve against ``base``; ~ expands."""
        v = self._given(value, key, default)
        if v is None or v == "":
            return ""
        if not isinstance(v, str):
            raise self.error(key, f"must be a file path, got {type_name(v)} {shorten(v)}")
        if looks_secret(v):
            raise self.error(key, "looks like a key, not a file path: put the key into a file "
                                  "(mode 0600) and give the file's path here")
        if "\0" in v or len(v) > 4096:
            raise self.error(key, f"is not a usable file path: {shorten(v)}")
        p = os.path.expanduser(v)
        return p if os.path.isabs(p) else os.path.normpath(os.path.join(os.fspath(base), p))

    def existing_file(self, path: Any, key: str, *, what: str = "file") -> None:
        """ConfigError unless ``path`` is an existing, readable regular file."""
        require_file(self.source, key, path, what=what)


def require_file(source: Any, key: str, path: Any, *, what: str = "file") -> None:
    """ConfigError (naming source and key) unless ``path`` is an existing, readable regular file."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ConfigError(source, key, f"{what} {shorten(p, 200)} does not exist") from None
    except OSError as exc:
        raise ConfigError(source, key, f"{what} {shorten(p, 200)} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(source, key, f"{what} {shorten(p, 200)} is not a regular file")
    if not os.access(p, os.R_OK):
        raise ConfigError(source, key, f"{what} {shorten(p, 200)} is not readable by this user")
