"""files.atomic_write: content, mode from the first byte, fixed temp name, cleanup on errors."""
import os
import stat

import pytest

from overlay_manager.system import files
from overlay_manager.testing.concurrent_calls import call_concurrently


def _leftovers(d):
    return sorted(f for f in os.listdir(d) if f.endswith(files.TMP_SUFFIX))


def test_writes_bytes_with_mode_and_no_temp(tmp_path):
    p = tmp_path / "f.yaml"
    old = os.umask(0o077)
    try:
        assert files.atomic_write(p, b"a: 1\n", 0o644) is True
    finally:
        os.umask(old)
    assert p.read_bytes() == b"a: 1\n"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o644
    assert _leftovers(tmp_path) == []


def test_only_if_changed_skips_equal_content_but_fixes_mode(tmp_path):
    p = tmp_path / "k"
    files.atomic_write(p, b"x", 0o644)
    ino = os.stat(p).st_ino
    assert files.atomic_write(p, b"x", 0o600, only_if_changed=True) is False
    assert os.stat(p).st_ino == ino and stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert files.atomic_write(p, b"y", 0o600, only_if_changed=True) is True
    assert p.read_bytes() == b"y"


def test_leftover_temp_of_a_killed_writer_is_reused(tmp_path):
    p = tmp_path / "hosts"
    tmp = files.tmp_path_for(p)
    with open(tmp, "wb") as fh:
        fh.write(b"half-written garbage that is longer than the new content\n")
    os.chmod(tmp, 0o666)
    files.atomic_write(p, b"new\n", 0o600)
    assert p.read_bytes() == b"new\n"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert _leftovers(tmp_path) == []


def test_error_removes_temp_and_keeps_target(tmp_path, monkeypatch):
    p = tmp_path / "f"
    p.write_bytes(b"old")

    def boom(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files.os, "fsync", boom)
    with pytest.raises(OSError, match="No space"):
        files.atomic_write(p, b"new", 0o644)
    assert p.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_text_is_refused(tmp_path):
    with pytest.raises(TypeError, match="bytes"):
        files.atomic_write(tmp_path / "f", "text", 0o644)  # type: ignore[arg-type]


def test_concurrent_writers_take_turns(tmp_path):
    p = tmp_path / "f"
    payloads = [bytes([65 + i]) * 200_000 for i in range(6)]
    assert call_concurrently(lambda data: files.atomic_write(p, data, 0o644), payloads, repeat=5) == []
    assert p.read_bytes() in payloads
    assert _leftovers(tmp_path) == []


def test_update_file_in_place_for_a_hard_linked_file_with_other_padding(tmp_path):
    p = tmp_path / "state.json"
    p.write_bytes(b'{"a": "a long value that will shrink"}')
    os.link(p, tmp_path / "other")
    ino = os.stat(p).st_ino
    assert files.update_file(p, lambda old: old.replace(b"a long value that will shrink", b"b"), pad=b" ") is True
    assert p.read_bytes() == b'{"a": "b"}' and os.stat(p).st_ino == ino
    assert files.update_file(p, lambda old: old) is False
    assert sorted(os.listdir(tmp_path)) == ["other", "state.json"]
    with pytest.raises(ValueError, match="one byte"):
        files.update_file(p, lambda old: old, pad=b"  ")


def test_update_file_creates_a_missing_file_and_renames_a_plain_one(tmp_path):
    p = tmp_path / "f"
    assert files.update_file(p, lambda old: old + b"x", create_mode=0o600) is True
    assert p.read_bytes() == b"x" and stat.S_IMODE(os.stat(p).st_mode) == 0o600
    ino = os.stat(p).st_ino
    assert files.update_file(p, lambda old: old + b"y") is True
    assert p.read_bytes() == b"xy" and os.stat(p).st_ino != ino
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600


def test_leftover_temp_is_removed_even_when_nothing_changes(tmp_path):
    p = tmp_path / "f"
    files.atomic_write(p, b"same", 0o644)
    tmp = files.tmp_path_for(p)
    with open(tmp, "wb") as fh:
        fh.write(b"left by a killed writer")
    assert files.atomic_write(p, b"same", 0o644, only_if_changed=True) is False
    assert _leftovers(tmp_path) == []
    with open(tmp, "wb") as fh:
        fh.write(b"left by a killed writer")
    assert files.update_file(p, lambda old: old) is False
    assert _leftovers(tmp_path) == [] and p.read_bytes() == b"same"
    # ...but not while a live writer holds it
    import fcntl
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        files.remove_stale_tmp(p)
        assert _leftovers(tmp_path) == [os.path.basename(tmp)]
    finally:
        os.close(fd)
    files.remove_stale_tmp(p)
    assert _leftovers(tmp_path) == []


def test_a_writer_holding_the_lock_too_long_is_an_error_not_a_hang(tmp_path, monkeypatch):
    import fcntl
    import time
    p = tmp_path / "hosts"
    p.write_bytes(b"x")
    monkeypatch.setattr(files, "LOCK_TIMEOUT_S", 0.3)
    holder = os.open(p, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        t0 = time.monotonic()
        with pytest.raises(OSError, match="another writer has held the lock on .*hosts"):
            files.update_file(p, lambda old: old + b"y")
        assert 0.25 < time.monotonic() - t0 < 3
    finally:
        os.close(holder)
    assert files.update_file(p, lambda old: old + b"y") is True and p.read_bytes() == b"xy"
