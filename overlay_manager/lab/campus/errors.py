"""Typed errors of the campus lab; every message names what is wrong and where."""
from __future__ import annotations

from typing import List

from overlay_manager.core.validation import ConfigError


class LabError(Exception):
    """Base class: the lab could not do what was asked (message says what and where)."""


class SpecError(LabError, ConfigError):
    """A lab spec is invalid: the validation layer's ConfigError (``SOURCE: KEY: PROBLEM``, named
    file or ``<dict>`` and key path, values shortened and redacted) that is also a LabError."""


class LabTimeout(LabError):
    """A bounded wait ran out; the message says what was waited for and the last state seen."""


class CommandError(LabError):
    """A command run by the lab (in a namespace or on the host) failed."""

    def __init__(self, where: str, argv: List[str], returncode: int, output: str) -> None:
        self.where = where
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        tail = output.strip().splitlines()[-5:]
        super().__init__(
            f"[{where}] {' '.join(argv)} exited {returncode}" + (": " + " | ".join(tail) if tail else "")
        )
