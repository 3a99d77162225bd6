"""What the node benchmark's parts share (scripts/bench_node): paths, progress lines, child env.

The benchmark itself is described in overlay_manager/lab/bench/node/main.py (its CLI).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, Optional

from overlay_manager.system.waiting import tail

REPO = Path(__file__).resolve().parents[4]
PY = "/usr/bin/python3"


def say(msg: str) -> None:
    """Progress line on stderr (stdout carries the table)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def child_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Our environment with this clone first on PYTHONPATH (generated messages still come from
    the devel space: overlay_manager/__init__.py extends its __path__)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def tail_lines(path: Path, n: int = 30) -> str:
    """The last ``n`` lines of a log, one per line (overlay_manager.system.waiting.tail)."""
    return tail(path, n, sep="\n")
