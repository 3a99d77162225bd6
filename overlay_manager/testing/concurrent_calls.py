"""Run one function from several threads at once, for the "concurrent writers take turns" tests."""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Sequence


def call_concurrently(func: Callable[[Any], Any], args: Sequence[Any], repeat: int) -> List[BaseException]:
    """Start one thread per item of ``args``, each calling ``func(item)`` ``repeat`` times in a row
    (a thread stops at its first exception); wait for all. Returns the exceptions raised (empty:
    every call returned)."""
    errors: List[BaseException] = []

    def run(arg: Any) -> None:
        try:
            for _ in range(repeat):
                func(arg)
        except Exception as exc:  # noqa: BLE001 - collected for the test to assert on
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
