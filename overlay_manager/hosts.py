"""A managed block of overlay names in a hosts file: split-horizon entries and a crash-safe writer.

The block looks like::

    # BEGIN overlay_manager managed block: do not edit, rewritten on every peer change
    127.0.1.1 robot1.fleet.internal robot1
    100.64.0.2 robot2.fleet.internal robot2
    # END overlay_manager managed block

Split horizon: on each machine the block maps the machine's OWN overlay names to loopback
(:data:`LOOPBACK`, Debian's address for the machine's own name) and every other machine's names
to its overlay addresses. ROS nodes bind their XML-RPC and TCPROS servers to all addresses
(``0.0.0.0``) whenever ROS_HOSTNAME is a name rather than ``localhost``/``127.x``, so other
machines still reach them over the overlay, while connections between nodes of this machine go
over loopback and survive a restart or crash of tailscaled.

What the writer guarantees (see :func:`update_hosts_file`):

- Bytes outside the block are kept exactly (the file is handled as bytes: any encoding, invalid
  UTF-8, CRLF). The block uses the file's own line ending (CRLF when the file's first line ends
  in CRLF). The one change outside the block: a last line without a newline gets one when the
  block is first appended after it.
- Nothing is written when the content would not change.
- A plain file is replaced by rename (:func:`overlay_manager.files.atomic_write`): readers see
  the old or the new file, never a mix.
- A file whose inode must stay the same is rewritten in place: a bind-mount target (``ip netns
  exec`` and Docker mount a file over /etc/hosts; renaming over it fails with EBUSY), the SOURCE
  of a bind mount in any mount namespace (e.g. ``/etc/netns/<ns>/hosts``: a rename would leave
  the processes inside reading the old file), a file with several hard links, or one owned by
  another user. The in-place update is journaled: old and new content go to
  ``.<name>.<inode>.overlay_manager-journal`` next to the file, or next to the bind mount's
  source when that is visible (see :func:`journal_path`), fsynced, with a checksum, before the
  file is touched; the new content is then written with one pwrite from offset 0, padded with newlines to
  the old length when the file shrinks, then truncated and fsynced, and the journal removed. A
  process killed at any step leaves the old content, the new content, or the new content followed
  by blank lines (all with exactly one block); the next update finishes or discards the journal
  first. A kill inside the one pwrite (the kernel may stop a large write between pages) or a
  power loss can leave a mix of old and new bytes; the next update restores the new content from
  the journal, unless the file was edited by someone else in between (then it is left as it is).
  When the journal cannot be created (directory not writable), the same in-place sequence runs
  without it.
- Temporary files have fixed names (``.<name>.overlay_manager-tmp`` and the journal), so a
  leftover of a killed writer is reused or consumed by the next update, never piled up.
- Concurrent updaters (the node and ``overlay_env --write-hosts``) take turns with an exclusive
  ``flock`` on the hosts file.
- A block with unbalanced markers (edited by hand) is refused with an error naming the file.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import time
from typing import Callable, Iterable, List, Optional, Sequence, Set, Tuple

from .files import atomic_write, fsync_dir, tmp_path_for, write_all

BEGIN = b"# BEGIN overlay_manager managed block: do not edit, rewritten on every peer change"
END = b"# END overlay_manager managed block"
LOOPBACK = "127.0.1.1"
"""Address of this machine's own overlay names: loopback, Debian's address for the host's name."""
JOURNAL_SUFFIX = ".overlay_manager-journal"
_JOURNAL_MAGIC = b"overlay_manager hosts journal 1"
_LINE = re.compile(rb"[^\n]*\n|[^\n]+")


class HostsError(Exception):
    """The hosts file cannot be read, parsed or written; names the file."""


Entry = Tuple[str, Sequence[str]]  # (address, names)


# ----- pure: entries, rendering, block replacement --------------------------------------------
def entries_for(peers: Iterable[object], own_names: Sequence[str] = ()) -> List[Entry]:
    """Split-horizon hosts entries for PeerState-like values.

    Args:
        peers: values with ``dns_name``, ``name`` and ``addresses`` (other machines; a value
            whose names are all in own_names is this machine and is skipped).
        own_names: this machine's overlay names (FQDN and short), mapped to :data:`LOOPBACK`.

    Returns:
        (address, names) pairs: own names first, then every address of every other machine.
    """
    own = [n for i, n in enumerate(own_names) if n and n not in own_names[:i]]
    out: List[Entry] = [(LOOPBACK, own)] if own else []
    for p in peers:
        names = [getattr(p, "dns_name", "").rstrip("."), getattr(p, "name", "")]
        names = [n for i, n in enumerate(names) if n and n not in names[:i]]
        if own and names and all(n in own for n in names):
            continue
        names = [n for n in names if n not in own]
        for addr in getattr(p, "addresses", ()):
            out.append((addr, names))
    return out


def own_names(self_peer: Optional[object], fqdn: str = "", others: Iterable[object] = ()) -> List[str]:
    """This machine's overlay names: tailscaled's own FQDN and short name when known, plus fqdn
    (from the config, what ROS_HOSTNAME is before tailscaled answers) and its first label unless
    another machine (in others) carries that name, e.g. after tailscale renamed us on a clash."""
    names: List[str] = []
    if self_peer is not None:
        names = [getattr(self_peer, "dns_name", "").rstrip("."), getattr(self_peer, "name", "")]
    taken = {n for p in others for n in (getattr(p, "dns_name", "").rstrip("."), getattr(p, "name", ""))}
    names += [n for n in (fqdn.rstrip("."), fqdn.split(".", 1)[0]) if n not in taken]
    return [n for i, n in enumerate(names) if n and n not in names[:i]]


def newline_of(content: bytes) -> bytes:
    """The file's line ending: CRLF when its first line ends in CRLF, else LF."""
    first = content.find(b"\n")
    return b"\r\n" if first > 0 and content[first - 1:first] == b"\r" else b"\n"


def render_block(entries: Iterable[Entry], newline: bytes = b"\n") -> bytes:
    """The managed block for (address, [names]) entries: own (loopback) line first, then sorted by
    first name; one line each, every line ending in newline."""
    def key(e: Entry) -> Tuple[int, List[str], str]:
        return (0 if e[0] == LOOPBACK else 1, list(e[1])[:1], e[0])
    lines = [BEGIN]
    for addr, names in sorted(entries, key=key):
        clean = [n for n in names if n]
        if addr and clean:
            lines.append(f"{addr} {' '.join(clean)}".encode("ascii", "replace"))
    lines.append(END)
    return newline.join(lines) + newline


def _marker_lines(content: bytes) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """(start, end) byte spans of the BEGIN and END marker lines (newline included)."""
    begins: List[Tuple[int, int]] = []
    ends: List[Tuple[int, int]] = []
    for m in _LINE.finditer(content):
        text = m.group().rstrip(b"\r\n").rstrip(b" \t")
        if text == BEGIN:
            begins.append(m.span())
        elif text == END:
            ends.append(m.span())
    return begins, ends


def replace_block(content: bytes, block: bytes, path: str = "hosts file") -> bytes:
    """content with its managed block replaced by block (appended when absent; b"" removes it).

    Raises:
        HostsError: when the markers are unbalanced (someone edited the block by hand).
    """
    begins, ends = _marker_lines(content)
    if not begins and not ends:
        if content and not content.endswith(b"\n"):
            content += newline_of(content)
        return content + block
    if len(begins) != 1 or len(ends) != 1 or ends[0][0] < begins[0][1]:
        raise HostsError(f"{path}: overlay_manager block markers are unbalanced ({len(begins)} BEGIN, "
                         f"{len(ends)} END); fix the file by hand (remove the lines between and "
                         f"including the BEGIN/END markers)")
    return content[:begins[0][0]] + block + content[ends[0][1]:]


# ----- which files must keep their inode -------------------------------------------------------
_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _mountinfo(text: str) -> List[Tuple[str, str, str]]:
    """(major:minor, root, mount point) of each line of a /proc/<pid>/mountinfo."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) > 4:
            out.append((parts[2], _unescape(parts[3]), _unescape(parts[4])))
    return out


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            return fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _under(path: str, mount_point: str) -> bool:
    return mount_point == "/" or path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def bind_mounted(real: str, st: os.stat_result, proc: str = "/proc") -> bool:
    """True when the file real (a resolved path) is a mount point here or is bind-mounted
    anywhere: in the mount table of any mount namespace on this machine.

    Errs on the safe side: True whenever the mount tables cannot be read or the file's place in
    its file system cannot be worked out.
    """
    own = _read(f"{proc}/self/mountinfo")
    if own is None:
        return True
    mounts = _mountinfo(own)
    if any(mp == real for _, _, mp in mounts):
        return True
    majmin = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    containing = [m for m in mounts if _under(real, m[2])]
    if not containing:
        return True
    dev, root, mp = max(reversed(containing), key=lambda m: len(m[2]))  # the top one of stacked mounts
    if dev != majmin:
        return True
    rel = os.path.normpath(os.path.join(root, os.path.relpath(real, mp)))
    seen: Set[str] = set()
    try:
        pids = [d for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            ns = os.readlink(f"{proc}/{pid}/ns/mnt")
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError:
            ns = f"pid {pid}"  # namespace not identifiable: read this process's table anyway
        if ns in seen:
            continue
        seen.add(ns)
        try:
            text = _read(f"{proc}/{pid}/mountinfo")
        except OSError:
            return True  # a mount table we may not read
        if text is None:
            continue
        if any(d == majmin and r == rel for d, r, _ in _mountinfo(text)):
            return True
    return False


def journal_path(real: str, st: os.stat_result, proc: str = "/proc") -> str:
    """Where the in-place update of real keeps its journal: ``.<name>.<inode>.overlay_manager-journal``
    next to the file, or next to the bind mount's source when real is a mount target whose source
    is visible here (``ip netns exec``: /etc/netns/<ns>/hosts, not the machine's shared /etc).

    Writers through either side of the mount, and in every namespace, agree on the path; files of
    different namespaces never share one.
    """
    text = _read(f"{proc}/self/mountinfo") or ""
    mounts = _mountinfo(text)
    here = [m for m in mounts if m[2] == real]
    where = real
    if here:
        dev, root, _ = here[-1]
        for d, r, mp in sorted(mounts, key=lambda m: -len(m[1])):
            if d != dev or mp == real or not _under(root, r):
                continue
            cand = os.path.normpath(os.path.join(mp, os.path.relpath(root, r)))
            try:
                cs = os.stat(cand)
            except OSError:
                continue
            if cand != real and (cs.st_dev, cs.st_ino) == (st.st_dev, st.st_ino):
                where = cand
                break
    return tmp_path_for(where, f".{st.st_ino}{JOURNAL_SUFFIX}")


def keeps_inode(real: str, st: os.stat_result) -> bool:
    """True when real must be updated in place (same inode) rather than replaced by rename."""
    return (st.st_nlink > 1 or st.st_uid != os.geteuid() or st.st_gid != os.getegid()
            or bind_mounted(real, st))


# ----- the writer --------------------------------------------------------------------------
def _open_locked(real: str) -> Optional[int]:
    """The hosts file opened read-write with an exclusive flock (None when it does not exist)."""
    while True:
        try:
            fd = os.open(real, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = os.fstat(fd)
            try:
                now = os.stat(real)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # replaced by another writer while we waited: lock the new file


def _read_fd(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, max(size - offset, 65536), offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _padded(old: bytes, new: bytes) -> bytes:
    """new, padded with newlines (blank lines) to old's length when it is shorter."""
    return new + b"\n" * (len(old) - len(new)) if len(new) < len(old) else new


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


def _torn(cur: bytes, old: bytes, new: bytes) -> bool:
    """True when cur is what a write of new over old, stopped part-way, can leave:
    W[:p] + old[p:] with W = new padded to old's length (see :func:`_padded`)."""
    w = _padded(old, new)
    p = 0
    limit = min(len(cur), len(w))
    while p < limit and cur[p] == w[p]:
        p += 1
    return len(cur) == max(len(old), p) and cur[p:] == old[p:]


def _in_place(fd: int, old: bytes, new: bytes) -> None:
    """Rewrite the open file from old to new keeping its inode: one pwrite of new padded to the old
    length, truncate, fsync. Every step leaves old, new, or new + blank lines."""
    padded = _padded(old, new)
    write_all(fd, padded, 0)
    if len(padded) != len(new):
        os.ftruncate(fd, len(new))
    os.fsync(fd)


def _recover(fd: int, jpath: str) -> None:
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
        if cur not in (old, new) and _torn(cur, old, new):
            _in_place(fd, cur, new)
    # a torn journal means the file was not touched yet (the journal is fsynced first)
    os.unlink(jpath)
    fsync_dir(os.path.dirname(jpath))


def _clean_old_temps(real: str, now: float) -> None:
    """Remove temp files of earlier versions (``.<name>.XXXXXXXX`` from mkstemp) older than 60 s."""
    directory, name = os.path.split(real)
    pattern = re.compile(re.escape(f".{name}.") + r"[a-z0-9_]{8}$")
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for n in names:
        if pattern.match(n):
            p = os.path.join(directory, n)
            try:
                if now - os.lstat(p).st_mtime > 60:
                    os.unlink(p)
            except OSError:
                pass


def write_hosts(path: str, content: bytes) -> bool:
    """Make the hosts file hold exactly content (see the module doc). False when unchanged."""
    return _update(path, lambda _old: content)


def update_hosts_file(path: str, entries: Iterable[Entry]) -> bool:
    """Replace the managed block in path with entries (crash-safe, see the module doc).

    Returns:
        True when the file changed.

    Raises:
        HostsError: the file cannot be read or written, or its markers are unbalanced; the
            message names the file.
    """
    items = list(entries)
    return _update(path, lambda old: replace_block(old, render_block(items, newline_of(old)), path))


def _update(path: str, make: Callable[[bytes], bytes]) -> bool:
    real = os.path.realpath(path)
    try:
        _clean_old_temps(real, time.time())
        fd = _open_locked(real)
        if fd is None:
            atomic_write(real, make(b""), 0o644)
            return True
        try:
            jpath = journal_path(real, os.fstat(fd))
            _recover(fd, jpath)
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
            _in_place(fd, old, new)
            if journaled:
                os.unlink(jpath)
                fsync_dir(os.path.dirname(jpath))
            return True
        finally:
            os.close(fd)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and exc.filename != path else ""
        raise HostsError(f"{path}: cannot update{where}: {exc.strerror or exc}") from None

