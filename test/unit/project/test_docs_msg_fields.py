"""Every message field docs/node.md's topic table names for ``~peers`` (Peer) and
``~path_changes`` (PathChange) exists in the .msg file, and every field of those messages is
named there: the table is the users' field list, so it must not drift from the definitions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Set

import pytest

REPO = Path(__file__).resolve().parents[3]
MSG = REPO / "overlay_msgs" / "msg"


def msg_fields(name: str) -> Dict[str, str]:
    """field name -> type of overlay_msgs/msg/<name>.msg (constants and comments left out)."""
    out: Dict[str, str] = {}
    for line in (MSG / f"{name}.msg").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or "=" in line:
            continue
        typ, field = line.split()[:2]
        out[field] = typ
    return out


def topic_row(topic: str) -> str:
    for line in (REPO / "docs" / "node.md").read_text().splitlines():
        if line.startswith(f"| `{topic}` |"):
            return line
    raise AssertionError(f"docs/node.md has no topic table row for {topic}")


def named_fields(row: str) -> List[str]:
    """The field names in the first parenthesised list of a table row (nested parentheses are
    explanations and are dropped; "a and b" and "rx/tx_bytes" name two fields each)."""
    text = row.split("|")[3]
    start = text.index("(")
    depth, i, body = 0, start, []
    while True:
        c = text[i]
        depth += c == "("
        depth -= c == ")"
        if depth == 1 and c not in "()":
            body.append(c)
        if depth == 0:
            break
        i += 1
    names: List[str] = []
    for part in re.split(r",| and ", "".join(body)):
        word = part.strip().strip("`").split(" ")[0].split("=")[0].strip("`")
        if not word:
            continue
        m = re.fullmatch(r"(\w+)/(\w+)_(\w+)", word)  # rx/tx_bytes
        names.extend([f"{m.group(1)}_{m.group(3)}", f"{m.group(2)}_{m.group(3)}"] if m else [word])
    return names


@pytest.mark.parametrize("topic,msg", [("~peers", "Peer"), ("~path_changes", "PathChange")])
def test_readme_field_lists_match_the_msg_files(topic: str, msg: str) -> None:
    fields = msg_fields(msg)
    named = named_fields(topic_row(topic))
    seen: Set[str] = set()
    for n in named:
        head, _, sub = n.partition(".")
        assert head in fields, f"node.md's {topic} row names {n!r}, which {msg}.msg does not have ({sorted(fields)})"
        if sub:  # header.stamp
            assert fields[head] == "Header" and sub in ("stamp", "seq", "frame_id"), n
        seen.add(head)
    assert set(fields) - seen == set(), f"{msg}.msg fields missing from node.md's {topic} row: {set(fields) - seen}"


def test_named_fields_parser() -> None:
    row = "| `~x` | X | latched; a (b, c (ignored, d), e and f, rx/tx_bytes, `g` = h) tail (z) |"
    assert named_fields(row) == ["b", "c", "e", "f", "rx_bytes", "tx_bytes", "g"]
