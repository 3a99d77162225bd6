"""YAML loading for any input whatsoever: every failure is a ConfigError naming the file.

Missing, unreadable, a directory, binary, not UTF-8, empty, bad YAML, several documents,
duplicate keys (named with both lines), nested too deeply: all are one-line errors, never a
traceback. libyaml (C) is used when installed, after an iterative depth check; PyYAML's pure
Python loader otherwise.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Dict, List, Optional, Tuple

import yaml

from overlay_manager.core.validation.errors import ConfigError, shorten

#: Largest YAML file read, in bytes; config files are a few KB.
MAX_FILE_BYTES = 16 * 1024 * 1024



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
