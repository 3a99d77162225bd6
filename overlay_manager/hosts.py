"""A managed block of overlay names in a hosts file (pure rendering + a careful writer).

The block looks like::

    # BEGIN overlay_manager managed block: do not edit, rewritten on every peer change
    100.64.0.1 robot1.fleet.internal robot1
    # END overlay_manager managed block

Lines outside the block are kept byte for byte. Writing: when the file is a mount point (a bind
mount, as `ip netns exec` and Docker make of /etc/hosts) it cannot be replaced by rename (EBUSY),
so it is rewritten in place with one write(2) of the whole content; otherwise a temporary file in
the same directory is fsynced and renamed over it. Either way a crash of the node never leaves a
half-written file, and nothing is written when the content would not change.
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterable, List, Sequence, Tuple

BEGIN = "# BEGIN overlay_manager managed block: do not edit, rewritten on every peer change"
END = "# END overlay_manager managed block"


class HostsError(Exception):
    """The hosts file cannot be read, parsed or written; names the file."""


Entry = Tuple[str, Sequence[str]]  # (address, names)


def render_block(entries: Iterable[Entry]) -> str:
    """The managed block for (address, [names]) entries, sorted, one line each, ending in newline."""
    lines = [BEGIN]
    for addr, names in sorted(entries, key=lambda e: (list(e[1])[:1], e[0])):
        clean = [n for n in names if n]
        if addr and clean:
            lines.append(f"{addr} {' '.join(clean)}")
    lines.append(END)
    return "\n".join(lines) + "\n"


def replace_block(content: str, block: str, path: str = "hosts file") -> str:
    """content with its managed block replaced by block (appended when absent).

    Raises:
        HostsError: when the markers are unbalanced (someone edited the block by hand).
    """
    begin = content.find(BEGIN)
    end = content.find(END)
    if begin == -1 and end == -1:
        if content and not content.endswith("\n"):
            content += "\n"
        return content + block
    if begin == -1 or end == -1 or end < begin or content.count(BEGIN) > 1:
        raise HostsError(f"{path}: overlay_manager block markers are unbalanced; fix the file by hand "
                         f"(remove the lines between and including the BEGIN/END markers)")
    end_line = content.find("\n", end)
    after = "" if end_line == -1 else content[end_line + 1:]
    return content[:begin] + block + after


def is_mount_point(path: str) -> bool:
    """True when path is itself a mount point (e.g. a bind-mounted /etc/hosts)."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 4 and parts[4].replace("\\040", " ") == real:
                    return True
    except OSError:
        return False
    return False


def write_hosts(path: str, content: str) -> bool:
    """Write content to the hosts file safely (see module doc). Returns False when unchanged."""
    try:
        with open(path, encoding="utf-8") as fh:
            old = fh.read()
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise HostsError(f"{path}: cannot read: {exc.strerror}") from None
    if old == content:
        return False
    data = content.encode("utf-8")
    try:
        if old is not None and is_mount_point(path):
            fd = os.open(path, os.O_WRONLY)
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise HostsError(f"{path}: short write ({written} of {len(data)} bytes)")
                os.ftruncate(fd, len(data))
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            directory = os.path.dirname(os.path.abspath(path))
            mode = os.stat(path).st_mode & 0o7777 if old is not None else 0o644
            fd, tmp = tempfile.mkstemp(prefix=".hosts.", dir=directory)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.chmod(tmp, mode)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
    except OSError as exc:
        raise HostsError(f"{path}: cannot write: {exc.strerror}") from None
    return True


def update_hosts_file(path: str, entries: Iterable[Entry]) -> bool:
    """Replace the managed block in path with entries. Returns True when the file changed."""
    try:
        with open(path, encoding="utf-8") as fh:
            content = fh.read()
    except FileNotFoundError:
        content = ""
    except OSError as exc:
        raise HostsError(f"{path}: cannot read: {exc.strerror}") from None
    return write_hosts(path, replace_block(content, render_block(entries), path))


def entries_for(peers: Iterable[object]) -> List[Entry]:
    """Hosts entries (every overlay address -> FQDN and short name) for PeerState-like values."""
    out: List[Entry] = []
    for p in peers:
        names = [getattr(p, "dns_name", ""), getattr(p, "name", "")]
        names = [n for i, n in enumerate(names) if n and n not in names[:i]]
        for addr in getattr(p, "addresses", ()):
            out.append((addr, names))
    return out
