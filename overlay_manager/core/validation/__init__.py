"""One validation layer for every YAML file the project reads (robot config, fleet file, lab spec).

Everything here is pure Python (no ROS) and runs on Python 3.8+.

Modules: ``errors`` (ConfigError, redact, shorten), ``loading`` (YAML files), ``reader`` (typed
access, DNS labels, URLs, files). Import from the package.

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
"""

from __future__ import annotations

from overlay_manager.core.validation.errors import (
    PROBLEM_CHARS,
    REDACTED,
    VALUE_CHARS,
    ConfigError,
    looks_secret,
    redact,
    shorten,
    type_name,
)
from overlay_manager.core.validation.loading import MAX_DEPTH, MAX_FILE_BYTES, load_yaml, parse_yaml, read_text
from overlay_manager.core.validation.reader import (
    ACL_TAG,
    DNS_LABEL,
    MISSING,
    Reader,
    is_dns_label,
    is_domain,
    join_key,
    lower_case_hint,
    require_file,
)

__all__ = [
    "ACL_TAG", "DNS_LABEL", "MAX_DEPTH", "MAX_FILE_BYTES", "MISSING", "PROBLEM_CHARS", "REDACTED",
    "VALUE_CHARS", "ConfigError", "Reader", "is_dns_label", "is_domain", "join_key", "load_yaml",
    "looks_secret", "lower_case_hint", "parse_yaml", "read_text", "redact", "require_file", "shorten",
    "type_name",
]
