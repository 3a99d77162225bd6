"""One validation layer for every YAML file the project reads (robot config, fleet file, lab spec).

Everything here is pure Python (no ROS) and runs on Python 3.8+.

- :class:`ConfigError` is the one error type: ``str()`` is a single line ``FILE: KEY: PROBLEM``
  that names the file and the dotted key path, with values shortened and secrets redacted.
- :func:`load_yaml` reads a file for any input whatsoever (missing, a directory, unreadable,
  binary, empty, deeply nested, duplicate keys, bad YAML) and turns every failure into a
  ConfigError; it never lets a traceback through.
- :class:`Reader` gives typed access to the parsed document: mappings with known keys, strings,
  finite numbers with ranges, integers, booleans, ports, URLs (parsed with urllib.parse),
  host:port pairs, DNS labels and domains, file paths and existing files.
- :func:`redact` is the one redaction function (also used by the tailscale and headscale
  wrappers); :func:`shorten` is how values appear in messages.
- :func:`parse_rfc3339` is the one RFC 3339 timestamp parser (any offset, 'Z', any number of
  fractional digits, on Python 3.8 too).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import reprlib
import stat
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

import yaml

#: A DNS label as used for host names, team names and domain parts: lowercase a-z, 0-9 and '-',
#: 1 to 63 characters, not starting or ending with '-'.
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

#: An ACL tag like ``tag:robot``.
ACL_TAG = re.compile(r"^tag:[A-Za-z0-9][A-Za-z0-9_-]*$")

#: Longest value text shown in a message, in characters (longer ones end in "...").
VALUE_CHARS = 60

#: Longest problem text kept in a message, in characters.
PROBLEM_CHARS = 400

#: Largest YAML file read, in bytes; config files are a few KB.
MAX_FILE_BYTES = 16 * 1024 * 1024

REDACTED = "<redacted>"

_SECRET_RES: Tuple[Tuple["re.Pattern[str]", str], ...] = (
    # PEM private keys (whole block, or a begin line without its end).
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)", re.S),
     REDACTED),
    # Tailscale / Headscale auth keys and API keys.
    (re.compile(r"\b(?:tskey|hskey)-[A-Za-z0-9_*-]+"), REDACTED),
    # Typed key strings of tailscale: privkey:..., nodekey:..., discokey:..., mkey:..., nlpriv:...
    (re.compile(r"\b([a-z]*(?:key|priv|pub)):[0-9a-fA-F]{16,}"), r"\1:" + REDACTED),
)
# Long hex tokens (headscale's legacy 48-hex keys, hashes used as secrets) that hold a digit.
_HEX_RE = re.compile(r"\b[0-9a-fA-F]{32,}\b")
# Long base64/base64url runs that mix upper case, lower case and digits (WireGuard keys, tokens);
# runs with a '/' count only when padded ('='), so file paths stay readable.
_B64_RE = re.compile(r"[A-Za-z0-9+/_-]{32,}={0,2}")


def _hex_sub(match: "re.Match[str]") -> str:
    word = match.group(0)
    return REDACTED if any(c.isdigit() for c in word) else word


def _b64_sub(match: "re.Match[str]") -> str:
    word = match.group(0)
    if "/" in word and not word.endswith("="):  # a file path, not a padded base64 key
        return word
    if any(c.isupper() for c in word) and any(c.islower() for c in word) and any(c.isdigit() for c in word):
        return REDACTED
    return word


def redact(text: str, *secrets: str) -> str:
    """``text`` with every secret replaced by ``<redacted>``.

    Replaced: each of ``secrets`` verbatim, and anything key-shaped: ``tskey-...``,
    ``hskey-...``, ``privkey:HEX`` (and every ``*key:HEX``), PEM private-key blocks, hex runs of
    32+ characters holding a digit and base64 runs of 32+ characters that mix upper case, lower case and digits.
    Over-redacting a harmless token is accepted; letting a key through is not.
    """
    for s in secrets:
        if s:
            text = text.replace(s, REDACTED)
    for pattern, repl in _SECRET_RES:
        text = pattern.sub(repl, text)
    text = _HEX_RE.sub(_hex_sub, text)
    return _B64_RE.sub(_b64_sub, text)


def looks_secret(text: str) -> bool:
    """True when :func:`redact` would change ``text`` (it contains something key-shaped)."""
    return redact(text) != text


_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = 4000
_REPR.maxother = 200
_REPR.maxlong = 80


def shorten(value: Any, limit: int = VALUE_CHARS) -> str:
    """How a value appears in an error: its repr, redacted, at most ``limit`` characters + "...".

    Safe for any value: deep nesting, huge strings and numbers, binary data.
    """
    size = 0
    try:
        if isinstance(value, str):
            size = len(value)
            text = repr(value[:100_000])  # only the head is ever shown
        else:
            text = _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still reported
        text = f"<{type(value).__name__}>"
    text = redact(text)
    if len(text) > limit:
        text = text[:limit] + (f"... ({size} characters)" if size else "...")
    return text


def type_name(value: Any) -> str:
    """Human name of a YAML value's type (``a mapping``, ``a list``, ``a string`` ...)."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


class ConfigError(ValueError):
    """A configuration file (or parameter set) is wrong.

    ``str()`` is one line ``SOURCE: KEY: PROBLEM`` (plus `` (host 'NAME')`` when the problem is
    about one machine), redacted and bounded in length.

    Attributes:
        source: the file (or parameter namespace, or ``<dict>``) the value came from.
        key: dotted key path inside it (``hosts.robot1.team``, ``tags[0]``), or ``(file)``.
        problem: what is wrong and, where useful, how to fix it.
        host: the machine the problem is about ("" if none).
    """

    def __init__(self, source: Any, key: str, problem: str, *, host: str = "") -> None:
        self.source = str(source)
        self.key = key
        self.problem = redact(" ".join(str(problem).split()))[:PROBLEM_CHARS]
        self.host = host
        shown = self.source if self.source.isprintable() else shorten(self.source, 200)
        text = f"{shown}: {key}: {self.problem}"
        if host:
            text += f" (host {shorten(host, 70)})"
        super().__init__(text)

    @property
    def file(self) -> str:
        """Alias of :attr:`source`."""
        return self.source

    @property
    def reason(self) -> str:
        """Alias of :attr:`problem`."""
        return self.problem


# --------------------------------------------------------------------------------------------
# YAML loading


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's pure-Python SafeLoader, used where libyaml is not installed."""


_CLoader: Any = getattr(yaml, "CSafeLoader", None)  # libyaml: about 30x faster on big files

#: Deepest nesting of mappings and lists accepted; config files use 4 or 5 levels.
MAX_DEPTH = 64


def _check_depth(text: str, source: str) -> None:
    """ConfigError when the document nests deeper than :data:`MAX_DEPTH`.

    Runs libyaml's event parser, which is iterative: a deeply nested document costs linear time
    here, while composing it recurses (in C for libyaml, without Python's recursion limit) and
    PyYAML's pure-Python scanner is quadratic in the flow nesting depth.
    """
    loader = _CLoader(text)
    try:
        depth = 0
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ConfigError(source, "(yaml)", f"nested too deeply: more than {MAX_DEPTH} levels "
                                                        f"at line {event.start_mark.line + 1}")
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
    finally:
        loader.dispose()


def _loader_for(text: str, source: str) -> Any:
    """libyaml's loader after :func:`_check_depth`, or the pure-Python one where libyaml is
    missing (its recursion ends in a RecursionError, reported as "nested too deeply")."""
    if _CLoader is None:
        return _UniqueKeyLoader(text)
    _check_depth(text, source)
    return _CLoader(text)


def _scalar_key(node: Any) -> Optional[Tuple[str, str]]:
    if isinstance(node, yaml.ScalarNode):
        return (node.tag, node.value)
    return None


def _check_duplicates(root: Any, source: str) -> None:
    """ConfigError for the first mapping that has the same key twice (names the path and lines)."""
    stack: List[Tuple[Any, str]] = [(root, "")]
    seen_nodes = set()
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:  # anchors/aliases share nodes
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: Dict[Tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                k = _scalar_key(key_node)
                child = path
                if k is not None:
                    if k[1] != "<<":
                        if k in lines:
                            full = f"{path}.{k[1]}" if path else k[1]
                            raise ConfigError(source, shorten(full, 120).strip("'\""),
                                              f"duplicate key (line {lines[k]} and line "
                                              f"{key_node.start_mark.line + 1}); keep one")
                        lines[k] = key_node.start_mark.line + 1
                    child = f"{path}.{k[1]}" if path else k[1]
                stack.append((value_node, child))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                stack.append((item, f"{path}[{i}]"))


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text (one document) with duplicate keys as errors; ConfigError for any failure."""
    try:
        loader = _loader_for(text, source)  # may already reject the text (unprintable characters)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_duplicates(node, source)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}" if mark is not None else "(yaml)"
        what = exc.problem or exc.context or "syntax error"
        raise ConfigError(source, where, f"not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, "(yaml)", f"not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(source, "(yaml)", "not valid here: nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a date like 2026-13-45
        raise ConfigError(source, "(yaml)", f"not valid YAML: bad value ({exc})") from None


def read_text(path: Any, source: Optional[str] = None, *, key: str = "(file)") -> str:
    """A file's UTF-8 text; ConfigError (naming ``source``/``key``) when it cannot be read as text."""
    name = source if source is not None else str(path)
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ConfigError(name, key, "cannot read: the file does not exist") from None
    except PermissionError:
        raise ConfigError(name, key, "cannot read: permission denied") from None
    except OSError as exc:
        raise ConfigError(name, key, f"cannot read: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the path
        raise ConfigError(name, key, "cannot read: the path contains a NUL character") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(name, key, "cannot read: is a directory, not a file")
    if st.st_size > MAX_FILE_BYTES:
        raise ConfigError(name, key, f"cannot read: {st.st_size} bytes, at most {MAX_FILE_BYTES} expected")
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except PermissionError:
        raise ConfigError(name, key, "cannot read: permission denied") from None
    except OSError as exc:
        raise ConfigError(name, key, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:  # a pipe or device that does not end
        raise ConfigError(name, key, f"cannot read: more than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(name, key, f"cannot read: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                                     f"{exc.start}); is this the right file?") from None


def load_yaml(path: Any, source: Optional[str] = None) -> Any:
    """Read and parse a YAML file; ConfigError naming the file for anything that goes wrong.

    Args:
        path: the file.
        source: name used in messages (default: ``str(path)``).
    """
    name = source if source is not None else str(path)
    return parse_yaml(read_text(path, name), name)


# --------------------------------------------------------------------------------------------
# Typed access

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

    def dns_label(self, value: Any, key: str, default: Any = MISSING, *, host: bool = False) -> str:
        """A DNS label; ``host`` = name the value as the host in the error."""
        v = self._given(value, key, default)
        if not is_dns_label(v):
            raise self.error(key, f"{shorten(v)} is not a valid DNS label: use a-z, 0-9 and '-', 1 to 63 "
                                  "characters, not starting or ending with '-'",
                             host=str(v) if host and isinstance(v, (str, int)) else "")
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


# --------------------------------------------------------------------------------------------
# Time

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):?(\d{2}))?$")


def parse_rfc3339(text: str) -> Optional[datetime]:
    """An RFC 3339 timestamp -> aware datetime in UTC; None when ``text`` is not one.

    Accepts 'Z'/'z' or any ``+HH:MM``/``-HH:MM`` offset (converted to UTC, never dropped), and any
    number of fractional digits (rounded down to microseconds). A timestamp without an offset
    is taken as UTC. Works the same on Python 3.8 (whose fromisoformat rejects 'Z' and more
    than six fractional digits).
    """
    m = _RFC3339.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    micro = int((m.group(7) or "0")[:6].ljust(6, "0"))
    leap = second == 60  # a leap second: keep it on the next second
    try:
        t = datetime(year, month, day, hour, minute, 59 if leap else second, micro, tzinfo=timezone.utc)
    except ValueError:
        return None
    if leap:
        t += timedelta(seconds=1)
    if m.group(9):
        offset = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        if offset >= timedelta(hours=24):
            return None
        t -= offset if m.group(9) == "+" else -offset
    return t
