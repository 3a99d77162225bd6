"""Managed hosts block: lines outside stay byte for byte, idempotent, balanced markers."""
import os

import pytest

from overlay_manager import hosts as H

OUTSIDE = "127.0.0.1\tlocalhost\n# keep me   exactly\n::1 ip6-localhost\n"


def test_append_replace_remove_keeps_outside_bytes():
    block = H.render_block([("100.64.0.2", ["robot2.fleet.internal", "robot2"]),
                            ("100.64.0.1", ["robot1.fleet.internal", "robot1"])])
    assert block.splitlines()[1].startswith("100.64.0.1 ")
    once = H.replace_block(OUTSIDE, block)
    assert once.startswith(OUTSIDE)
    twice = H.replace_block(once, H.render_block([("100.64.0.9", ["x.fleet.internal", "x"])]))
    assert twice.startswith(OUTSIDE) and "robot1" not in twice and "100.64.0.9" in twice
    assert H.replace_block(twice, "") == OUTSIDE  # an empty block removes it
    # block in the middle: text after it survives too
    middle = OUTSIDE + block + "10.0.0.1 after\n"
    assert H.replace_block(middle, H.render_block([])).endswith("10.0.0.1 after\n")


def test_unbalanced_markers_are_refused():
    with pytest.raises(H.HostsError, match="unbalanced"):
        H.replace_block(OUTSIDE + H.BEGIN + "\n", H.render_block([]), "/etc/hosts")


def test_file_without_trailing_newline():
    assert H.replace_block("127.0.0.1 localhost", H.render_block([])).startswith("127.0.0.1 localhost\n#")


def test_update_file_atomic_and_unchanged_skip(tmp_path):
    p = tmp_path / "hosts"
    p.write_text(OUTSIDE)
    os.chmod(p, 0o644)
    assert H.update_hosts_file(str(p), [("100.64.0.1", ["a.x", "a"])]) is True
    assert p.read_text().startswith(OUTSIDE) and "100.64.0.1 a.x a" in p.read_text()
    assert oct(os.stat(p).st_mode & 0o777) == "0o644"
    assert H.update_hosts_file(str(p), [("100.64.0.1", ["a.x", "a"])]) is False
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".hosts.")]


def test_entries_for_peer_values():
    class P:
        name, dns_name, addresses = "r1", "r1.fleet.internal", ("100.64.0.1", "fd7a:115c:a1e0::1")
    assert H.entries_for([P()]) == [("100.64.0.1", ["r1.fleet.internal", "r1"]),
                                    ("fd7a:115c:a1e0::1", ["r1.fleet.internal", "r1"])]
