"""The systemd unit of a deployment's headscale, from ``config/systemd/headscale.service.in``.

The template is a file of the package (installed with ``config/``), so the unit can be read and
changed without touching code; ``@NAME@`` fields are filled here, like CMake's configure_file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional

from overlay_manager.fleet.model import FleetError

TEMPLATE = "headscale.service.in"
_FIELD = re.compile(r"@([A-Z_]+)@")


def template_path(start: Optional[Path] = None, name: str = TEMPLATE) -> Path:
    """``config/systemd/<name>`` of this package (default: headscale's unit template): the source
    checkout's (``<repo>/config``, next to package.xml) or an installed copy's
    (``<prefix>/share/overlay_manager/config``: a catkin install space, or the prefix a pip install
    put the package in, such as a venv, /usr/local or ~/.local).

    Raises:
        FleetError: naming where it looked.
    """
    here = (start or Path(__file__)).resolve()
    looked: List[str] = []
    for d in here.parents:
        for cand in (d / "config" / "systemd" / name,
                     d / "share" / "overlay_manager" / "config" / "systemd" / name):
            if cand.is_file() and (cand.parents[2] / "package.xml").is_file():
                return cand
            looked.append(str(cand))
    raise FleetError(f"the unit template {name} is missing from this installation (looked in "
                     f"{looked[0]} and share/overlay_manager/config/systemd of every directory "
                     "above it); reinstall overlay_manager")


def _systemd_quote(arg: str) -> str:
    """One ExecStart argument, double-quoted when it holds spaces, quotes, backslashes or $ (%
    is systemd's specifier character and is doubled)."""
    arg = arg.replace("%", "%%")
    if arg and not re.search(r'[\s"\'\\$;]', arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$") + '"'


def render_unit(fleet_name: str, argv: List[str], template: Optional[Path] = None) -> str:
    """The unit text for headscale run as ``argv`` for fleet ``fleet_name``.

    Raises:
        FleetError: the template is missing, unreadable, or has a field this code does not fill.
    """
    path = template or template_path()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        raise FleetError(f"cannot read the unit template: {e}", file=path) from None
    values: Dict[str, str] = {"FLEET": fleet_name,
                              "EXEC_START": " ".join(_systemd_quote(a) for a in argv)}
    unknown = sorted(set(_FIELD.findall(text)) - set(values))
    if unknown:
        raise FleetError(f"unknown template field(s) {', '.join('@' + u + '@' for u in unknown)} "
                         f"(known: {', '.join('@' + k + '@' for k in values)})", file=path)
    return _FIELD.sub(lambda m: values[m.group(1)], text)
