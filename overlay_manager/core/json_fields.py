"""Reading fields of tailscaled's (and derper's) JSON defensively: a value of the wrong type,
out of range or not encodable becomes the field's empty value instead of an exception, so one
malformed field never takes a whole status read down. Pure; used by peers, nat, relay and derper.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Tuple

from overlay_manager.core.rfc3339 import parse_rfc3339

UINT64_MAX = 2 ** 64 - 1
TIME_MAX = 2 ** 32 - 1      # ROS 1 time: uint32 seconds since the epoch


def parse_time(value: Any) -> float:
    """RFC 3339 time from Go's JSON -> POSIX seconds; 0.0 for zero, missing or malformed."""
    if not isinstance(value, str) or not value or value.startswith("0001-01-01"):
        return 0.0
    dt = parse_rfc3339(value)
    if dt is None:
        return 0.0
    try:
        ts = dt.timestamp()
    except (OverflowError, OSError):
        return 0.0
    return ts if 0.0 < ts <= TIME_MAX else 0.0


def clean_str(v: str) -> str:
    """v with anything that cannot be encoded as UTF-8 (lone surrogates from JSON escapes)
    replaced, so the ROS serializer never fails on it."""
    try:
        v.encode("utf-8")
        return v
    except UnicodeEncodeError:
        return v.encode("utf-8", "replace").decode("utf-8")


def str_field(d: Mapping[str, Any], key: str) -> str:
    """d[key] when it is a string (cleaned for UTF-8), else ""."""
    v = d.get(key)
    return clean_str(v) if isinstance(v, str) else ""


def clamp_uint64(v: Any) -> int:
    """A JSON number as a uint64 message field: 0..2^64-1; NaN, inf, negatives and non-numbers -> 0,
    finite values above the range -> 2^64-1."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return 0
    if isinstance(v, float) and not math.isfinite(v):
        return 0
    if v <= 0:
        return 0
    return UINT64_MAX if v >= UINT64_MAX else int(v)


def uint_field(d: Mapping[str, Any], key: str) -> int:
    """d[key] as a uint64 field (clamp_uint64; missing or not a number -> 0)."""
    return clamp_uint64(d.get(key))


def finite_ms(v: Any, scale: float = 1.0) -> float:
    """v * scale as a latency in ms: NaN unless v is a finite number >= 0 (and so is the product)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    try:
        ms = float(v) * scale
    except OverflowError:
        return math.nan
    return ms if math.isfinite(ms) and ms >= 0 else math.nan


def str_list_field(d: Mapping[str, Any], key: str) -> Tuple[str, ...]:
    """The strings of the list d[key] (cleaned for UTF-8); () when it is not a list."""
    v = d.get(key)
    if not isinstance(v, list):
        return ()
    return tuple(clean_str(x) for x in v if isinstance(x, str))


def json_kind(v: Any) -> str:
    """JSON kind of a decoded value, for messages about malformed fields."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    return "a list" if isinstance(v, list) else "an object"
