"""Every test module has a basename of its own.

pytest imports test modules by basename (rootdir-relative "rootdir/conftest" import mode, no
``__init__.py`` in test folders), so two test modules of one name in different tiers stop the whole run at
collection with "import file mismatch" — only when both tiers are collected together, as
``scripts/test`` does.
"""
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[3]


def test_every_test_module_basename_is_unique() -> None:
    """No two test modules (or their helper modules beside them) share a file name."""
    seen: Dict[str, List[str]] = defaultdict(list)
    for path in sorted((ROOT / "test").rglob("test_*.py")):
        seen[path.name].append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"test modules with the same basename (rename one): {clashes}"
