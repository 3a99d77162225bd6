"""Crash-safe file writes: one atomic writer for the whole project.

:func:`atomic_write` replaces a file by rename: the new content goes to a temporary file in the
same directory, which is fsynced, given its mode, renamed over the target, and then the
directory is fsynced. Readers see either the old or the new file, never a mix, and after a
crash (a killed process or a power loss) the target holds one of the two.

The temporary file has a fixed name per target (``.<name>.overlay_manager-tmp``), so a leftover
from a killed writer is overwritten and renamed away by the next write instead of piling up.
Writers of the same target take turns: each holds an exclusive ``flock`` on the temporary
file while it fills it (and checks that the name still points to the file it locked).

Some files must keep their inode (a bind-mount target, the source of a bind mount, a hard-linked
file): :func:`update_file` reads, changes and writes a file, by rename when it may and otherwise in
place with a journal; see its docstring for exactly what survives a crash.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import time
from pathlib import Path
from typing import Callable, Optional, Tuple, Union

from overlay_manager.system.mounts import bind_mounted, bind_source

PathLike = Union[str, "os.PathLike[str]"]

TMP_SUFFIX = ".overlay_manager-tmp"
LOCK_TIMEOUT_S = 5.0
"""Seconds a writer waits for another writer of the same file (whose update takes milliseconds)
before giving up with an error, so a hung writer elsewhere never hangs this one."""
JOURNAL_SUFFIX = ".overlay_manager-journal"
_JOURNAL_MAGIC = b"overlay_manager journal 1"


def tmp_path_for(path: PathLike, suffix: str = TMP_SUFFIX) -> str:
    """The fixed sibling name used for path's temporary file: ``<dir>/.<name><suffix>``."""
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}{suffix}")


def fsync_dir(directory: PathLike) -> None:
    """fsync a directory so a rename or unlink in it survives a power loss.

    File systems that cannot fsync a directory (EINVAL) are accepted silently.
    """
    fd = os.open(os.fspath(directory), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes, offset: int = 0) -> None:
    """Write all of data at offset (pwrite, repeated on short writes)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, "write returned 0 bytes")
        done += n


def lock(fd: int, what: str, timeout_s: Optional[float] = None) -> None:
    """Take an exclusive flock on fd, waiting at most timeout_s seconds (None: LOCK_TIMEOUT_S).

    Raises:
        OSError: (ETIMEDOUT) another process held the lock for the whole time; names what.
    """
    timeout_s = LOCK_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise OSError(errno.ETIMEDOUT, f"another writer has held the lock on {what} for "
                                               f"{timeout_s:g} s", what) from None
            time.sleep(0.01)


def _lock_if_current(fd: int, path: str, follow_symlinks: bool) -> bool:
    """Take fd's exclusive flock; True when path still names fd's file afterwards. When False,
    fd is closed (another writer renamed the file away meanwhile: open it again). On an error fd
    is closed and the error raised."""
    try:
        lock(fd, path)
        st = os.fstat(fd)
        try:
            now = os.stat(path, follow_symlinks=follow_symlinks)
        except FileNotFoundError:
            now = None
    except BaseException:
        os.close(fd)
        raise
    if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
        return True
    os.close(fd)
    return False


def open_locked_tmp(tmp: str, mode: int) -> int:
    """Open (create) tmp with an exclusive flock, making sure the name still refers to it.

    Another writer may rename the file away between our open and our lock; then retry with a
    fresh file. Returns the fd; the lock goes with it when it is closed.
    """
    while True:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode & 0o777)
        if _lock_if_current(fd, tmp, follow_symlinks=False):
            return fd


def remove_stale_tmp(path: PathLike) -> None:
    """Remove path's temporary file left by a killed writer (one a live writer holds locked is
    left alone)."""
    tmp = tmp_path_for(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a writer is filling it right now
        st = os.fstat(fd)
        try:
            now = os.stat(tmp, follow_symlinks=False)
        except FileNotFoundError:
            return
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            os.unlink(tmp)
    finally:
        os.close(fd)


def atomic_write(path: PathLike, data: bytes, mode: int = 0o644, only_if_changed: bool = False) -> bool:
    """Replace path with data by rename (see the module doc); True when the file was written.

    Args:
        path: the file to write; its directory must exist. A symlink at path is replaced, not
            followed.
        data: the complete new content.
        mode: permission bits of the new file, applied before any byte is written (so a 0600
            secret is never readable by others, whatever the umask).
        only_if_changed: when the file already holds exactly data, only fix its mode and return
            False.

    Raises:
        OSError: the file could not be written; the target is unchanged and the temporary file
            removed.
    """
    path = os.fspath(path)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"atomic_write({path!r}): data must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if only_if_changed:
        try:
            with open(path, "rb") as fh:
                same = fh.read() == data
            if same:
                if os.stat(path).st_mode & 0o7777 != mode:
                    os.chmod(path, mode)
                remove_stale_tmp(path)
                return False
        except OSError:
            pass
    tmp = tmp_path_for(path)
    fd = open_locked_tmp(tmp, mode)
    try:
        try:
            os.fchmod(fd, mode)       # before the data: a leftover may have had other bits
            os.ftruncate(fd, 0)       # a leftover of a killed writer
            write_all(fd, data)
            os.fsync(fd)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    return True


def journal_path(real: str, st: os.stat_result, proc: str = "/proc") -> str:
    """Where the in-place update of real keeps its journal: ``.<name>.<inode>.overlay_manager-journal``
    next to the file, or next to the bind mount's source when real is a mount target whose source
    is visible here (``ip netns exec``: /etc/netns/<ns>/hosts, not the machine's shared /etc).

    Writers through either side of the mount, and in every namespace, agree on the path; files of
    different namespaces never share one.
    """
    return tmp_path_for(bind_source(real, st, proc) or real, f".{st.st_ino}{JOURNAL_SUFFIX}")


def keeps_inode(real: str, st: os.stat_result) -> bool:
    """True when real must be updated in place (same inode) rather than replaced by rename."""
    return (st.st_nlink > 1 or st.st_uid != os.geteuid() or st.st_gid != os.getegid()
            or bind_mounted(real, st))


# ----- in-place updates ---------------------------------------------------------------------
def _open_locked(real: str) -> Optional[int]:
    """real opened read-write with an exclusive flock (None when it does not exist)."""
    while True:
        try:
            fd = os.open(real, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        if _lock_if_current(fd, real, follow_symlinks=True):
            return fd
        # replaced by another writer while we waited: lock the new file


def _read_fd(fd: int) -> bytes:
    """The whole content of the open file, from offset 0."""
    size = os.fstat(fd).st_size
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, max(size - offset, 65536), offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _padded(old: bytes, new: bytes, pad: bytes = b"\n") -> bytes:
    """new, padded with the byte pad (newlines: blank lines) to old's length when it is shorter."""
    return new + pad * (len(old) - len(new)) if len(new) < len(old) else new


def _write_journal(jpath: str, old: bytes, new: bytes) -> bool:
    """Write and fsync the journal; False when it cannot be created (directory not writable)."""
    digest = hashlib.sha256(old + new).hexdigest().encode("ascii")
    head = b"%s %d %d %s\n" % (_JOURNAL_MAGIC, len(old), len(new), digest)
    try:
        fd = os.open(jpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return False
        raise
    try:
        write_all(fd, head + old + new)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(jpath))
    return True


def _parse_journal(data: bytes) -> Optional[Tuple[bytes, bytes]]:
    """(old, new) from a complete journal; None when it is torn or not ours."""
    head, sep, body = data.partition(b"\n")
    parts = head.split(b" ")
    if not sep or b" ".join(parts[:-3]) != _JOURNAL_MAGIC or len(parts) < 4:
        return None
    try:
        n_old, n_new = int(parts[-3]), int(parts[-2])
    except ValueError:
        return None
    if n_old < 0 or n_new < 0 or len(body) != n_old + n_new:
        return None
    if hashlib.sha256(body).hexdigest().encode("ascii") != parts[-1]:
        return None
    return body[:n_old], body[n_old:]


def _torn(cur: bytes, old: bytes, new: bytes, pad: bytes = b"\n") -> bool:
    """True when cur can be what writing new over old (W = new padded to old's length, see
    :func:`_padded`) leaves when stopped part-way or cut by a power loss: every byte is W's or
    old's at that position (pages and sectors may land in any order), or zero where the file
    grew, and the length lies between the shortest and the longest of old, W and new. An edit
    by someone else almost never fits."""
    w = _padded(old, new, pad)
    if not min(len(old), len(new)) <= len(cur) <= max(len(old), len(w)):
        return False
    n_w, n_old = len(w), len(old)
    for i, c in enumerate(cur):
        if (i < n_w and c == w[i]) or (i < n_old and c == old[i]) or (i >= n_old and c == 0):
            continue
        return False
    return True


def _in_place(fd: int, old: bytes, new: bytes, pad: bytes = b"\n") -> None:
    """Rewrite the open file from old to new keeping its inode: one pwrite of new padded to the old
    length, truncate, fsync. Every step leaves old, new, or new + padding."""
    padded = _padded(old, new, pad)
    write_all(fd, padded, 0)
    if len(padded) != len(new):
        os.ftruncate(fd, len(new))
    os.fsync(fd)


def _recover(fd: int, jpath: str, pad: bytes) -> None:
    """Finish or discard a journal left by a killed update (called with the file locked)."""
    try:
        with open(jpath, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return
    parsed = _parse_journal(data)
    if parsed is not None:
        old, new = parsed
        cur = _read_fd(fd)
        if cur not in (old, new) and _torn(cur, old, new, pad):
            _in_place(fd, cur, new, pad)
    # a torn journal means the file was not touched yet (the journal is fsynced first)
    os.unlink(jpath)
    fsync_dir(os.path.dirname(jpath))


def write_text(path: PathLike, text: str, mode: int = 0o644) -> bool:
    """Write text (UTF-8) to path with :func:`atomic_write`, creating parent directories; False
    when the file already held it (then only its mode is fixed)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, text.encode("utf-8"), mode, only_if_changed=True)


def update_file(path: PathLike, make: Callable[[bytes], bytes], pad: bytes = b"\n",
                create_mode: int = 0o644) -> bool:
    """Read path, compute its new content with make(old bytes), and write it crash-safely.

    Returns True when the file changed. What is guaranteed:

    - Nothing is written when make returns the old content.
    - A plain file is replaced by rename (:func:`atomic_write`, keeping its mode): readers see the
      old or the new file, never a mix. A missing file is created (create_mode).
    - A file whose inode must stay the same (:func:`keeps_inode`: a bind-mount target, the source
      of a bind mount in any mount namespace, several hard links, another owner) is updated in
      place, journaled: old and new content go to :func:`journal_path` (fsynced, with a checksum)
      before the file is touched; then one pwrite of the new content from offset 0, padded with
      ``pad`` bytes to the old length when it shrinks (never shrink-then-write), truncate, fsync,
      journal removed. A process killed at any step leaves the old content, the new content, or
      the new content followed by padding. The next update first finishes the journal: a file
      torn by a kill inside the pwrite (the kernel may stop a large write between pages) or by
      a power loss gets the new content, unless it was edited by someone else in between (then
      it is left as it is); a torn journal means the file was not touched yet and is discarded.
      Without a writable directory for the journal the same steps run unjournaled.
    - Temporary files have fixed names, so leftovers of a killed update are reused or consumed
      by the next one.
    - Concurrent updaters of one file take turns (an exclusive ``flock`` on it).

    Raises:
        OSError: the file cannot be read or written (whatever make raises passes through).
    """
    if len(pad) != 1:
        raise ValueError(f"update_file({path!r}): pad must be one byte, not {pad!r}")
    real = os.path.realpath(os.fspath(path))
    fd = _open_locked(real)
    if fd is None:
        atomic_write(real, make(b""), create_mode)
        return True
    try:
        jpath = journal_path(real, os.fstat(fd))
        _recover(fd, jpath, pad)
        remove_stale_tmp(real)
        old = _read_fd(fd)
        new = make(old)
        if new == old:
            return False
        st = os.fstat(fd)
        if not keeps_inode(real, st):
            try:
                atomic_write(real, new, st.st_mode & 0o7777)
                return True
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.EXDEV, errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
        journaled = _write_journal(jpath, old, new)
        _in_place(fd, old, new, pad)
        if journaled:
            os.unlink(jpath)
            fsync_dir(os.path.dirname(jpath))
        return True
    finally:
        os.close(fd)
