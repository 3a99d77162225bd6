"""The one error type of the validation layer and the one redaction.

:class:`ConfigError` is what every problem in a robot config, fleet file or lab spec becomes:
one line ``SOURCE: KEY: PROBLEM``. :func:`redact` removes secrets from any text (also used for
tailscale and headscale CLI output); :func:`shorten` is how a value appears in a message.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any, Tuple

#: Longest value text shown in a message, in characters (longer ones end in "...").
VALUE_CHARS = 60

#: Longest problem text kept in a message, in characters.
PROBLEM_CHARS = 400


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


_TYPE_NAMES: Tuple[Tuple[type, str], ...] = (
    (bool, "a boolean"),   # before int: a bool is an int
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (dict, "a mapping"),
    (list, "a list"),
)
"""What errors call the types a YAML document holds, checked in this order."""


def type_name(value: Any) -> str:
    """Human name of a YAML value's type (``a mapping``, ``a list``, ``a string`` ...)."""
    if value is None:
        return "nothing (null)"
    for kind, name in _TYPE_NAMES:
        if isinstance(value, kind):
            return name
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
        self.key = redact(key)  # a key pasted as a mapping key is still a key
        self.problem = redact(" ".join(str(problem).split()))[:PROBLEM_CHARS]
        self.host = host
        shown = self.source if self.source.isprintable() else shorten(self.source, 200)
        text = f"{shown}: {self.key}: {self.problem}"
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
