"""One path vocabulary: overlay_msgs/msg/Peer.msg's PATH_* constants are the definition; the
Python constants, the C++ header's literals, the dashboard's tables and the other messages' docs
use exactly those words (one word for "this machine": ``self``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict

from overlay_manager.core import peers
from overlay_manager.view import text

ROOT = Path(__file__).resolve().parents[3]


def msg_constants() -> Dict[str, str]:
    """PATH_* name -> word, parsed from Peer.msg (``string PATH_X=word``)."""
    out = {}
    for line in (ROOT / "overlay_msgs" / "msg" / "Peer.msg").read_text().splitlines():
        m = re.match(r"\s*string\s+(PATH_[A-Z_]+)\s*=\s*(\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


WORDS = set(msg_constants().values())


def test_peer_msg_defines_the_words() -> None:
    assert msg_constants() == {"PATH_UNKNOWN": "unknown", "PATH_IDLE": "idle", "PATH_DIRECT": "direct",
                               "PATH_DERP": "derp", "PATH_PEER_RELAY": "peer-relay",
                               "PATH_OFFLINE": "offline", "PATH_SELF": "self"}


def test_python_constants_are_the_msg_constants() -> None:
    py = {k: v for k, v in vars(peers).items() if k.startswith("PATH_") and isinstance(v, str)}
    assert py == msg_constants()
    assert set(peers.PATHS) | {peers.PATH_SELF} == WORDS


def test_cpp_header_literals_are_the_msg_words() -> None:
    header = (ROOT / "include" / "overlay_manager" / "stream_policy.h").read_text()
    block = re.search(r"namespace paths\s*\{(.*?)\}\s*//\s*namespace paths", header, re.S)
    assert block, "stream_policy.h has no `namespace paths { ... }  // namespace paths` block"
    literals = re.findall(r'const char\* const k\w+ = "([^"]*)";', block.group(1))
    assert sorted(literals) == sorted(WORDS)


def test_cpp_sources_name_no_path_word_of_their_own() -> None:
    """subscriber_hosts and ros_graph take the words from Peer.msg (Peer::PATH_*), never spelled out."""
    for name in ("subscriber_hosts.cpp", "ros_graph.cpp", "link_aware_stream.cpp"):
        src = (ROOT / "src" / name).read_text()
        spelled = {w for w in re.findall(r'"([a-z-]+)"', src) if w in WORDS | {"local"}}
        assert not spelled, f"src/{name} spells path words {sorted(spelled)}: use Peer::PATH_* or paths::k*"


def test_dashboard_tables_cover_exactly_the_words() -> None:
    for table in (text.PATH_COLOURS, text.PATH_TINTS, text.PATH_DESCRIPTIONS):
        assert set(table) == WORDS


def test_message_docs_quote_only_the_words() -> None:
    """The path fields' comments in the other messages quote words of Peer.msg only."""
    for name in ("TopicLink.msg", "StreamSubscriber.msg", "PathChange.msg"):
        doc = (ROOT / "overlay_msgs" / "msg" / name).read_text()
        m = re.search(r"^string path\b(.*?)(?=^\S)", doc, re.M | re.S) or re.search(
            r"^string (?:old|new)_path\b(.*?)(?=^\S)", doc, re.M | re.S)
        assert m, f"{name} has no path field"
        quoted = set(re.findall(r'"([a-z-]+)"', m.group(1)))
        assert quoted <= WORDS, f"{name}: {sorted(quoted - WORDS)} are not Peer.msg path words"
        assert "local" not in quoted
