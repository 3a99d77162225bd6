"""The project's one RFC 3339 timestamp parser (tailscale and headscale JSON)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Optional

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
