"""Managed hosts block: bytes outside kept exactly, split horizon, crash-safe writer, kill injection."""
import os
import stat

import pytest

from overlay_manager.system import files as F
from overlay_manager.system import hosts as H
from overlay_manager.system import mounts as M
from overlay_manager.testing import hosts_kill as K
from overlay_manager.testing.concurrent_calls import call_concurrently

OUTSIDE = b"127.0.0.1\tlocalhost\n# keep me   exactly\n::1 ip6-localhost\n"
FQDN_A = ["a.fleet.internal", "a"]


def _block(entries, nl=b"\n"):
    return H.render_block(entries, nl)


# ----- pure ------------------------------------------------------------------------------------
def test_append_replace_remove_keeps_outside_bytes():
    block = _block([("100.64.0.2", ["robot2.fleet.internal", "robot2"]),
                    ("100.64.0.1", ["robot1.fleet.internal", "robot1"])])
    assert block.splitlines()[1].startswith(b"100.64.0.1 ")
    once = H.replace_block(OUTSIDE, block)
    assert once == OUTSIDE + block
    twice = H.replace_block(once, _block([("100.64.0.9", ["x.fleet.internal", "x"])]))
    assert twice.startswith(OUTSIDE) and b"robot1" not in twice and b"100.64.0.9" in twice
    assert H.replace_block(twice, b"") == OUTSIDE  # an empty block removes it
    middle = OUTSIDE + block + b"10.0.0.1 after\n"
    assert H.replace_block(middle, _block([])) == OUTSIDE + _block([]) + b"10.0.0.1 after\n"


@pytest.mark.parametrize("text", [
    OUTSIDE + H.BEGIN + b"\n",                                   # BEGIN without END
    OUTSIDE + H.END + b"\n",                                     # END without BEGIN
    OUTSIDE + H.END + b"\n" + H.BEGIN + b"\n",                   # reversed
    OUTSIDE + _block([]) + H.END + b"\n",                        # a second END (a torn old write)
    OUTSIDE + _block([]) + _block([]),                           # two blocks
])
def test_unbalanced_markers_are_refused_naming_the_file(text):
    with pytest.raises(H.HostsError, match=r"^/etc/hosts: .*unbalanced"):
        H.replace_block(text, _block([]), "/etc/hosts")


def test_crlf_file_keeps_crlf_and_block_uses_it():
    crlf = b"127.0.0.1 localhost\r\n10.1.1.1 a b\r\n"
    assert H.newline_of(crlf) == b"\r\n" and H.newline_of(OUTSIDE) == b"\n" and H.newline_of(b"") == b"\n"
    out = H.replace_block(crlf, _block([("100.64.0.1", FQDN_A)], H.newline_of(crlf)))
    assert out.startswith(crlf)
    assert b"\n" not in out.replace(b"\r\n", b"")          # every line ends in CRLF
    again = H.replace_block(out, _block([("100.64.0.3", FQDN_A)], b"\r\n"))
    assert again == crlf + _block([("100.64.0.3", FQDN_A)], b"\r\n")
    # a marker line written with CRLF is recognised, trailing blanks too
    assert H.replace_block(crlf + H.BEGIN + b" \r\n" + H.END + b"\r\n", b"X\n") == crlf + b"X\n"


@pytest.mark.parametrize("outside", [
    b"127.0.0.1 localhost # caf\xe9 (Latin-1)\n",
    b"127.0.0.1 localhost\n# \xff\xfe\xc3( invalid UTF-8\n\x00\n",
    b"",
])
def test_any_bytes_outside_the_block_survive(outside, tmp_path):
    p = tmp_path / "hosts"
    p.write_bytes(outside)
    assert H.update_hosts_file(str(p), [("100.64.0.1", FQDN_A)]) is True
    assert p.read_bytes() == outside + _block([("100.64.0.1", FQDN_A)])
    p.write_bytes(p.read_bytes() + b"after \xe9\n")
    assert H.update_hosts_file(str(p), [("100.64.0.2", FQDN_A)]) is True
    assert p.read_bytes() == outside + _block([("100.64.0.2", FQDN_A)]) + b"after \xe9\n"


def test_file_without_trailing_newline_gets_one_before_the_block():
    assert H.replace_block(b"127.0.0.1 localhost", _block([])) == b"127.0.0.1 localhost\n" + _block([])
    assert H.replace_block(b"a\r\nb", _block([], b"\r\n")) == b"a\r\nb\r\n" + _block([], b"\r\n")
    # ...but text after the block without a final newline stays as it is
    text = _block([]) + b"10.0.0.1 last"
    new = _block([("100.64.0.1", FQDN_A)])
    assert H.replace_block(text, new) == new + b"10.0.0.1 last"


def test_block_grows_and_shrinks_in_a_file(tmp_path):
    p = tmp_path / "hosts"
    p.write_bytes(OUTSIDE + b"# tail\n")
    for entries in (K.FEW, K.MANY, K.FEW, [], K.MANY):
        H.update_hosts_file(str(p), entries)
        assert p.read_bytes() == OUTSIDE + b"# tail\n" + _block(entries)


# ----- split horizon -------------------------------------------------------------------------
class _P:
    def __init__(self, name, dns, addrs):
        self.name, self.dns_name, self.addresses = name, dns, addrs


def test_split_horizon_own_names_to_loopback_others_to_overlay():
    me = _P("robot1", "robot1.fleet.internal.", ("100.64.0.1", "fd7a:115c:a1e0::1"))
    other = _P("robot2", "robot2.fleet.internal.", ("100.64.0.2", "fd7a:115c:a1e0::2"))
    assert H.own_names(me, "robot1.fleet.internal") == ["robot1.fleet.internal", "robot1"]
    own = H.own_names(me, "robot1.fleet.internal", [other])
    assert own == ["robot1.fleet.internal", "robot1"]
    # renamed by tailscale after a name clash: the config's name belongs to the other machine
    renamed = _P("robot2-1", "robot2-1.fleet.internal.", ("100.64.0.3",))
    assert H.own_names(renamed, "robot2.fleet.internal", [other]) == ["robot2-1.fleet.internal", "robot2-1"]
    assert H.own_names(renamed, "robot9.fleet.internal", [other]) == [
        "robot2-1.fleet.internal", "robot2-1", "robot9.fleet.internal", "robot9"]
    entries = H.entries_for([me, other], own)   # this machine among the peers is skipped
    assert entries == [(H.LOOPBACK, ["robot1.fleet.internal", "robot1"]),
                       ("100.64.0.2", ["robot2.fleet.internal", "robot2"]),
                       ("fd7a:115c:a1e0::2", ["robot2.fleet.internal", "robot2"])]
    assert H.LOOPBACK.startswith("127.")
    block = H.render_block(entries)
    assert block.splitlines()[1] == b"127.0.1.1 robot1.fleet.internal robot1"
    # before tailscaled knows this machine: the config's name
    assert H.own_names(None, "robot1.fleet.internal") == ["robot1.fleet.internal", "robot1"]
    assert H.entries_for([other]) == [("100.64.0.2", ["robot2.fleet.internal", "robot2"]),
                                      ("fd7a:115c:a1e0::2", ["robot2.fleet.internal", "robot2"])]


def test_wanted_entries_are_own_names_then_others_as_tuples():
    me = _P("robot1", "robot1.fleet.internal.", ("100.64.0.1",))
    other = _P("robot2", "robot2.fleet.internal.", ("100.64.0.2",))
    assert H.wanted_entries(me, "robot1.fleet.internal", [me, other]) == [
        (H.LOOPBACK, ("robot1.fleet.internal", "robot1")), ("100.64.0.2", ("robot2.fleet.internal", "robot2"))]


# ----- the writer ------------------------------------------------------------------------------
def test_managed_hosts_writes_only_changes_and_returns_errors(tmp_path):
    """ManagedHosts (the node's overlay-hosts thread): a write only when the entries change; a
    failure comes back as one line naming the file, and the same entries are tried again."""
    p = tmp_path / "hosts"
    p.write_bytes(OUTSIDE)
    kept = H.ManagedHosts(str(p))
    entries = [("100.64.0.2", ("robot2.fleet.internal", "robot2"))]
    assert kept.write(entries) == ""
    assert p.read_bytes() == OUTSIDE + _block(entries)
    p.write_bytes(OUTSIDE)                                   # not rewritten: the entries did not change
    assert kept.write(list(entries)) == "" and p.read_bytes() == OUTSIDE
    bad = H.ManagedHosts(str(tmp_path / "missing-dir" / "hosts"))
    error = bad.write(entries)
    assert error.startswith(str(tmp_path / "missing-dir" / "hosts") + ": cannot update")
    (tmp_path / "missing-dir").mkdir()
    assert bad.write(entries) == "" and (tmp_path / "missing-dir" / "hosts").read_bytes() == _block(entries)


def test_plain_file_is_replaced_by_rename_keeping_mode_unchanged_skip(tmp_path):
    p = tmp_path / "hosts"
    p.write_bytes(OUTSIDE)
    os.chmod(p, 0o640)
    ino = os.stat(p).st_ino
    assert H.update_hosts_file(str(p), [("100.64.0.1", FQDN_A)]) is True
    assert p.read_bytes() == OUTSIDE + _block([("100.64.0.1", FQDN_A)])
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640
    assert os.stat(p).st_ino != ino          # renamed: readers saw old or new, never a mix
    mtime = os.stat(p).st_mtime_ns
    assert H.update_hosts_file(str(p), [("100.64.0.1", FQDN_A)]) is False
    assert os.stat(p).st_mtime_ns == mtime
    assert os.listdir(tmp_path) == ["hosts"]


def test_missing_file_is_created(tmp_path):
    p = tmp_path / "hosts"
    assert H.update_hosts_file(str(p), [("100.64.0.1", FQDN_A)]) is True
    assert p.read_bytes() == _block([("100.64.0.1", FQDN_A)])


def test_hard_linked_file_keeps_its_inode(tmp_path):
    p = tmp_path / "hosts"
    p.write_bytes(OUTSIDE)
    os.link(p, tmp_path / "other-name")
    ino = os.stat(p).st_ino
    H.update_hosts_file(str(p), K.MANY)
    H.update_hosts_file(str(p), K.FEW)
    assert os.stat(p).st_ino == ino
    assert (tmp_path / "other-name").read_bytes() == OUTSIDE + _block(K.FEW)
    assert sorted(os.listdir(tmp_path)) == ["hosts", "other-name"]


def test_symlink_is_followed(tmp_path):
    real = tmp_path / "real-hosts"
    real.write_bytes(OUTSIDE)
    (tmp_path / "hosts").symlink_to(real)
    H.update_hosts_file(str(tmp_path / "hosts"), K.FEW)
    assert os.path.islink(tmp_path / "hosts") and real.read_bytes() == OUTSIDE + _block(K.FEW)


def test_unreadable_or_unbalanced_file_is_a_clear_error(tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    with pytest.raises(H.HostsError, match=f"^{d}: cannot update"):
        H.update_hosts_file(str(d), K.FEW)
    p = tmp_path / "hosts"
    p.write_bytes(OUTSIDE + H.BEGIN + b"\n")
    with pytest.raises(H.HostsError, match=f"^{p}: .*unbalanced"):
        H.update_hosts_file(str(p), K.FEW)
    assert p.read_bytes() == OUTSIDE + H.BEGIN + b"\n"   # nothing written


def test_leftover_journal_with_torn_file_is_finished(tmp_path):
    """A journal plus a file torn by a kill inside the write: the next update completes it."""
    p = tmp_path / "hosts"
    old, new = K.content(K.MANY), K.content(K.FEW)
    torn = new[:50] + old[50:]
    p.write_bytes(torn)
    F._write_journal(F.journal_path(str(p), os.stat(p)), old, new)
    assert H.update_hosts_file(str(p), K.FEW) is True
    assert p.read_bytes() == new and os.listdir(tmp_path) == ["hosts"]
    # a power loss: sectors of the one write landed out of order (and past the old end: zeros)
    grown = K.content(K.MANY + K.OWN)
    padded = new + b"\n" * (len(old) - len(new))
    shrink = bytes(padded[i] if (i // 512) % 2 else old[i] for i in range(len(old)))
    grow = bytes(grown[i] if (i // 512) % 2 == 0 else (old[i] if i < len(old) else 0) for i in range(len(grown)))
    for cur, after, entries in ((shrink, new, K.FEW), (grow, grown, K.MANY + K.OWN)):
        p.write_bytes(cur)
        F._write_journal(F.journal_path(str(p), os.stat(p)), old, after)
        H.update_hosts_file(str(p), entries)
        assert p.read_bytes() == after
        assert os.listdir(tmp_path) == ["hosts"]


def test_torn_journal_is_discarded_and_edited_file_is_not_replayed(tmp_path):
    p = tmp_path / "hosts"
    old, new = K.content(K.MANY), K.content(K.FEW)
    p.write_bytes(old)
    jpath = F.journal_path(str(p), os.stat(p))
    F._write_journal(jpath, old, new)
    with open(jpath, "r+b") as fh:
        fh.truncate(os.path.getsize(jpath) - 3)        # killed while writing the journal
    assert H.update_hosts_file(str(p), K.MANY) is False and p.read_bytes() == old
    assert os.listdir(tmp_path) == ["hosts"]
    # someone edited the file after a crash: the journal must not overwrite their edit
    edited = old.replace(b"10.0.0.7 printer", b"10.0.0.8 printer")
    p.write_bytes(edited)
    F._write_journal(jpath, old, new)
    H.update_hosts_file(str(p), K.MANY)
    assert p.read_bytes() == edited and os.listdir(tmp_path) == ["hosts"]


def test_stale_temp_files_of_older_versions_are_removed(tmp_path):
    p = tmp_path / "hosts"
    p.write_bytes(OUTSIDE)
    stale, fresh, other = tmp_path / ".hosts.ab12cd_9", tmp_path / ".hosts.zz99zz99", tmp_path / ".hosts.keep.me"
    for f in (stale, fresh, other):
        f.write_bytes(b"x")
    os.utime(stale, (1, 1))
    H.update_hosts_file(str(p), K.FEW)
    assert not stale.exists() and fresh.exists() and other.exists()


def test_concurrent_updaters_take_turns(tmp_path):
    p = tmp_path / "hosts"
    p.write_bytes(OUTSIDE)
    sets = [K.FEW, K.MANY, [("100.64.0.5", FQDN_A)]]
    assert call_concurrently(lambda entries: H.update_hosts_file(str(p), entries), sets, repeat=20) == []
    assert p.read_bytes() in [OUTSIDE + _block(s) for s in sets]
    assert os.listdir(tmp_path) == ["hosts"]


# ----- kill injection: SIGKILL at every step of the update --------------------------------------
@pytest.mark.parametrize("in_place", [False, True], ids=["rename", "in-place"])
@pytest.mark.parametrize("change", ["shrink", "grow"])
def test_sigkill_at_every_step_then_next_update_repairs(tmp_path, monkeypatch, in_place, change):
    if in_place:  # the path a bind-mounted file takes (the real mounts: test/integration)
        monkeypatch.setattr(F, "keeps_inode", lambda real, st: True)
    old, new = (K.MANY + K.OWN, K.FEW + K.OWN) if change == "shrink" else (K.FEW + K.OWN, K.MANY + K.OWN)
    p = str(tmp_path / "hosts")
    r = K.scenario(p, old, new, keep=["hosts"], same_inode=in_place)
    print(f"{'in-place' if in_place else 'rename'} {change}: killed at {r['steps']} steps {r['calls']}, "
          f"{r['torn']} torn writes")
    assert r["failures"] == []
    assert "pwrite" in r["calls"] and ("replace" in r["calls"]) != in_place
    assert r["torn"] == 3 * r["calls"].count("pwrite")


@pytest.mark.parametrize("in_place", [False, True], ids=["rename", "in-place"])
def test_sigkill_at_random_moments_then_next_update_repairs(tmp_path, monkeypatch, in_place):
    if in_place:
        monkeypatch.setattr(F, "keeps_inode", lambda real, st: True)
    r = K.random_kills(str(tmp_path / "hosts"), keep=["hosts"], kills=60)
    print(f"{'in-place' if in_place else 'rename'}: {r['kills']} random SIGKILLs, file after the kill: {r['mid']}")
    assert r["failures"] == []
    if not in_place:
        assert "torn" not in r["mid"] and "padded" not in r["mid"]   # rename: old or new, nothing else


def _fake_proc(tmp_path, own, others):
    """A /proc with self/mountinfo = own and one process per entry of others (its mountinfo)."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(own)
    for i, text in enumerate(others, start=100):
        d = proc / str(i)
        (d / "ns").mkdir(parents=True)
        os.symlink(f"mnt:[{4026530000 + i}]", d / "ns" / "mnt")
        (d / "mountinfo").write_text(text)
    return str(proc)


def test_bind_mounted_reads_every_mount_namespace(tmp_path):
    d = tmp_path / "my ns"
    d.mkdir()
    (d / "hosts").write_bytes(b"")
    src = str(d / "hosts")
    st = os.stat(src)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    root_line = f"1 0 {dev} / / rw - ext4 /dev/vda rw\n"           # the file's fs at / (rel = path)
    bind = f"9 1 {dev} {src.replace(' ', chr(92) + '040')} /fake/etc/hosts rw - ext4 /dev/vda rw\n"
    proc = _fake_proc(tmp_path, root_line, [root_line, root_line + bind])
    assert M.bind_mounted(src, st, proc) is True                         # bound in another namespace
    other = str(tmp_path / "other")
    (tmp_path / "other").write_bytes(b"")
    assert M.bind_mounted(other, os.stat(other), proc) is False          # not bound anywhere
    here = _fake_proc(tmp_path / "b", root_line + bind, [])
    assert M.bind_mounted("/fake/etc/hosts", st, here) is True           # a mount point here
    # the journal: next to the source, from either side
    want = str(d / f".hosts.{st.st_ino}.overlay_manager-journal")
    assert F.journal_path("/fake/etc/hosts", st, here) == want == F.journal_path(src, st, proc)
    other_dev = _fake_proc(tmp_path / "c", "1 0 7:77 / / rw - ext4 /dev/x rw\n", [])
    assert M.bind_mounted(src, st, other_dev) is True                    # cannot place the file: in place
    assert M.bind_mounted(src, st, str(tmp_path / "no-proc")) is True    # no mount table: in place
