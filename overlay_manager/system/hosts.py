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

What the writer guarantees (:func:`update_hosts_file`, built on
:func:`overlay_manager.system.files.update_file`, which says exactly what survives a crash):

- Bytes outside the block are kept exactly (the file is handled as bytes: any encoding, invalid
  UTF-8, CRLF). The block uses the file's own line ending (CRLF when the file's first line ends
  in CRLF). The one change outside the block: a last line without a newline gets one when the
  block is first appended after it.
- Nothing is written when the content would not change.
- A plain file is replaced by rename: readers see the old or the new file, never a mix.
- A bind-mount target (``ip netns exec`` and Docker mount a file over /etc/hosts), the source of
  a bind mount in any mount namespace (``/etc/netns/<ns>/hosts``), a hard-linked file or one owned
  by another user keeps its inode: it is updated in place, journaled, padded with newlines
  (blank lines) instead of shrinking mid-update. After a kill at any step the file holds exactly
  one block (old, new, or new plus blank lines), and the next update writes exactly the
  expected file.
- Temporary files have fixed names, so nothing piles up after kills; temp files of earlier
  versions (``.hosts.XXXXXXXX``) older than a minute are removed.
- The node and ``overlay_env --write-hosts`` take turns (an exclusive ``flock`` on the file).
- A block with unbalanced markers (edited by hand) is refused with an error naming the file.
"""

from __future__ import annotations

import os
import re
import time
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from overlay_manager.system.files import update_file

BEGIN = b"# BEGIN overlay_manager managed block: do not edit, rewritten on every peer change"
END = b"# END overlay_manager managed block"
LOOPBACK = "127.0.1.1"
"""Address of this machine's own overlay names: loopback, Debian's address for the host's name."""
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


def wanted_entries(self_peer: Optional[object], fqdn: str, peers: Sequence[object]) -> List[Entry]:
    """The block's entries for a status: this machine's names (:func:`own_names`) -> loopback, every
    other machine -> its overlay addresses (:func:`entries_for`); names as tuples, so two lists
    compare equal exactly when the block would be the same."""
    return [(a, tuple(n)) for a, n in entries_for(peers, own_names(self_peer, fqdn, peers))]


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


def has_block(path: str) -> bool:
    """True when the file at path exists and holds a managed block (BEGIN marker)."""
    try:
        with open(path, "rb") as fh:
            return bool(_marker_lines(fh.read())[0])
    except OSError:
        return False


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
    try:
        _clean_old_temps(os.path.realpath(path), time.time())
        return update_file(path, make, pad=b"\n")
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and exc.filename != path else ""
        raise HostsError(f"{path}: cannot update{where}: {exc.strerror or exc}") from None


class ManagedHosts:
    """The managed block of one hosts file, kept in step with the tailnet (split horizon): this
    machine's own names -> loopback, so its own ROS graph never depends on tailscaled; every
    other machine -> its overlay addresses (:func:`wanted_entries`). Written only when the
    entries change. One thread uses it (the node's overlay-hosts)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._entries: Optional[List[Entry]] = None  # last written

    def write(self, entries: List[Entry]) -> str:
        """Write the block with these entries if they changed; returns the error ("" = ok)."""
        if entries == self._entries:
            return ""
        try:
            update_hosts_file(self.path, entries)
        except HostsError as exc:
            return str(exc)
        self._entries = entries
        return ""

