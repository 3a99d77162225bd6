"""Bounded polling for tools and tests: one ``wait_for`` and one log ``tail``.

Every wait in the lab, the benchmarks and the system/integration tests goes through
:func:`wait_for`, so each timeout message has the same shape: what was waited for, for how long,
the last error a check raised and (``detail``) the last state seen. :func:`tail` gives that state
for the common case "a daemon's log file".
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Tuple, Type, TypeVar, Union

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A bounded wait ran out; the message says what was waited for and the last state seen."""


def wait_for(what: str, check: Callable[[], Optional[T]], timeout: float, interval: float = 0.1,
             detail: Optional[Callable[[], str]] = None,
             fatal: Tuple[Type[BaseException], ...] = (),
             error: Type[Exception] = WaitTimeout) -> T:
    """Poll ``check`` until it returns a truthy value and return that value.

    Args:
        what: names the awaited condition in the timeout message ("headscale to listen on ...").
        check: called every ``interval`` seconds. Exceptions of a ``fatal`` type end the wait at
            once (e.g. "the daemon exited"); other exceptions count as "not yet" and the last one
            is reported on timeout.
        timeout: seconds until ``error`` is raised (``check`` runs at least once).
        interval: seconds between calls.
        detail: called once on timeout; its text is added as "last state".
        fatal: exception types that propagate from ``check`` immediately.
        error: the exception type raised on timeout (WaitTimeout, a TimeoutError, by default).
    """
    deadline = time.monotonic() + timeout
    last_exc: Optional[BaseException] = None
    while True:
        try:
            result = check()
            if result:
                return result
        except fatal:
            raise
        except Exception as exc:  # noqa: BLE001 - reported below if the wait times out
            last_exc = exc
        if time.monotonic() >= deadline:
            extra = f"; last error: {last_exc}" if last_exc else ""
            if detail is not None:
                try:
                    extra += f"; last state: {detail()}"
                except Exception as exc:  # noqa: BLE001 - only for the message
                    extra += f"; (state unavailable: {exc})"
            raise error(f"timed out after {timeout:g}s waiting for {what}{extra}")
        time.sleep(interval)


def tail(path: Union[str, Path], lines: int = 5, sep: str = " | ") -> str:
    """The last ``lines`` lines of a text file joined by ``sep`` (``"(no PATH)"`` when unreadable)."""
    try:
        text = Path(path).read_text(errors="replace").strip()
    except OSError:
        return f"(no {path})"
    return sep.join(text.splitlines()[-lines:])
