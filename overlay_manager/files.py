"""Crash-safe file writes: one atomic writer for the whole project.

:func:`atomic_write` replaces a file by rename: the new content goes to a temporary file in the
same directory, which is fsynced, given its mode, renamed over the target, and then the
directory is fsynced. Readers see either the old or the new file, never a mix, and after a
crash (a killed process or a power loss) the target holds one of the two.

The temporary file has a fixed name per target (``.<name>.overlay_manager-tmp``), so a leftover
from a killed writer is overwritten and renamed away by the next write instead of piling up.
Writers of the same target take turns: each holds an exclusive ``flock`` on the temporary
file while it fills it (and checks that the name still points to the file it locked).

Some files must keep their inode (a bind-mounted file and the source of a bind mount): those are
written in place by :mod:`overlay_manager.hosts`, which uses :func:`fsync_dir` and
:func:`tmp_path_for` from here.
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Union

PathLike = Union[str, "os.PathLike[str]"]

TMP_SUFFIX = ".overlay_manager-tmp"


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


def open_locked_tmp(tmp: str, mode: int) -> int:
    """Open (create) tmp with an exclusive flock, making sure the name still refers to it.

    Another writer may rename the file away between our open and our lock; then retry with a
    fresh file. Returns the fd; the lock goes with it when it is closed.
    """
    while True:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode & 0o777)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = os.fstat(fd)
            try:
                now = os.stat(tmp, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                return fd
        except BaseException:
            os.close(fd)
            raise
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
