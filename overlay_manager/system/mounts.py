"""Which mounts pin a file's inode: the mount tables of every mount namespace on this machine.

A file bind-mounted over another path (``ip netns exec`` binds /etc/netns/<ns>/hosts over
/etc/hosts in a new mount namespace; Docker binds a per-container file over /etc/hosts) must be
updated in place: renaming over the mount target fails with EBUSY, and renaming over the source
leaves every process that sees the mount reading the old file. Such mounts usually live in other
mount namespaces than the writer's, so /proc/self/mountinfo alone does not show them.
"""

from __future__ import annotations

import os
import re
from typing import List, Optional, Set, Tuple

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


def bind_source(real: str, st: os.stat_result, proc: str = "/proc") -> Optional[str]:
    """When real is a mount point here whose source file is visible in this mount namespace too
    (the same inode under another path: /etc/netns/<ns>/hosts for ``ip netns exec``), that path;
    else None."""
    text = _read(f"{proc}/self/mountinfo") or ""
    mounts = _mountinfo(text)
    here = [m for m in mounts if m[2] == real]
    if not here:
        return None
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
            return cand
    return None
