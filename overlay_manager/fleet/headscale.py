"""Thin typed wrapper around the ``headscale`` CLI (``-o json``); never opens its database.

The CLI talks gRPC to a running headscale over the unix socket named in its config. Errors are
:class:`FleetError`; a pre-auth key never appears in an error (command lines carry no key, and
the output of ``preauthkeys create`` is never quoted).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from overlay_manager.core.rfc3339 import parse_rfc3339
from overlay_manager.core.validation import redact, shorten
from overlay_manager.fleet.model import FleetError

#: Seconds one CLI call may take before it is abandoned.
CLI_TIMEOUT_S = 30.0

#: headscale versions the fleet tool supports: at least the first, below the second. The config
#: it writes, the CLI flags it passes and the JSON it reads are headscale 0.29's.
SUPPORTED_VERSIONS = ((0, 29, 0), (0, 30, 0))
#: The version the tests run against (scripts/setup builds it; docs/fleet.md installs it).
TESTED_VERSION = "v0.29.0"
_VERSION = re.compile(r"(?<![\w.])v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?")

def _checkout_headscale() -> Optional[str]:
    """``<repo>/.tools/bin/headscale`` when running from a source checkout, else None."""
    repo = Path(__file__).resolve().parents[2]
    if (repo / "package.xml").is_file() and (repo / "scripts" / "setup").is_file():
        return str(repo / ".tools" / "bin" / "headscale")
    return None


def find_headscale(explicit: Union[str, Path, None] = None, needed_for: str = "") -> str:
    """Path of the headscale binary.

    Order: ``explicit``; ``$HEADSCALE_BIN``; ``<repo>/.tools/bin/headscale`` (scripts/setup's
    pinned build) only when running from a source checkout; ``headscale`` on PATH. An installed
    package never looks next to its own files.

    Args:
        explicit: a path given by the caller (``--headscale``) or recorded in the deployment.
        needed_for: what needs it (e.g. "`fleet status`"), named in the error.

    Raises:
        FleetError: none exists; one line naming ``--headscale`` and ``HEADSCALE_BIN``.
    """
    candidates: List[str] = []
    if explicit:
        candidates.append(str(explicit))
    if os.environ.get("HEADSCALE_BIN"):
        candidates.append(os.environ["HEADSCALE_BIN"])
    checkout = _checkout_headscale()
    if checkout:
        candidates.append(checkout)
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    found = shutil.which("headscale")
    if found:
        return found
    tried = f" ({explicit} is not an executable file)" if explicit else ""
    raise FleetError(f"{needed_for or 'this command'} needs the headscale binary (v0.29), which "
                     f"was not found{tried}: pass --headscale PATH or set HEADSCALE_BIN=PATH (or put "
                     "headscale on PATH; in a source checkout scripts/setup builds .tools/bin/headscale)")


def supported_range() -> str:
    """The supported headscale versions in words: ``>= 0.29.0, < 0.30.0; tested: v0.29.0``."""
    low, high = (".".join(map(str, v)) for v in SUPPORTED_VERSIONS)
    return f">= {low}, < {high}; tested: {TESTED_VERSION}"


def parse_version(text: str) -> Optional[Tuple[Tuple[int, int, int], bool]]:
    """The version in ``headscale version``'s output: ((major, minor, patch), pre-release), or None.

    Reads the first line that names a version: ``headscale version v0.29.0`` (0.26 and later),
    ``v0.22.3`` (older releases), ``0.29.1-beta.1``; a build without a version says ``dev``: None.
    A ``-dirty`` suffix (a build from a modified tree) is not a pre-release.
    """
    for line in text.splitlines():
        m = _VERSION.search(line)
        if m:
            suffix = re.sub(r"-?dirty$", "", m.group(4) or "")
            return (int(m.group(1)), int(m.group(2)), int(m.group(3))), bool(suffix)
    return None


def version_problem(binary: Union[str, Path], timeout: float = 10.0) -> Optional[str]:
    """One line saying what is wrong with ``binary``'s version, or None when it is supported.

    Runs ``binary version``. Outside :data:`SUPPORTED_VERSIONS` (a pre-release counts as below
    its version), not answering, or answering something without a version (a ``go build`` in the
    module directory prints ``dev``): the line names the binary, what it reported and
    :func:`supported_range`. The fleet tool prints it as a warning: headscale may still work.
    """
    def line(found: str, why: str = "") -> str:
        return (f"{binary}{found} (supported: {supported_range()}){why}: install headscale "
                f"{TESTED_VERSION} (docs/fleet.md, \"Install the control server\")")

    try:
        proc = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=timeout,
                              env={k: v for k, v in os.environ.items() if not k.startswith("HEADSCALE_")},
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        why = f"no answer within {timeout:.0f} s" if isinstance(e, subprocess.TimeoutExpired) \
            else (e.strerror or str(e))
        return line(f": cannot tell its version: `headscale version` failed: {why}")
    out = (proc.stdout or "") + (proc.stderr or "")
    parsed = parse_version(out) if proc.returncode == 0 else None
    if parsed is None:
        first = next((s.strip() for s in out.splitlines() if s.strip()), "")
        status = f", exit status {proc.returncode}" if proc.returncode else ""
        return line(f": cannot tell its version: `headscale version` printed {shorten(first, 80)}{status}")
    number, pre = parsed
    low, high = SUPPORTED_VERSIONS
    if low <= number < high and not (pre and number == low):
        return None
    found = "v" + ".".join(map(str, number)) + (" (a pre-release)" if pre else "")
    return line(f" is headscale {found}, which fleet does not support",
                "; the config it writes, the CLI flags it passes and the JSON it reads are 0.29's")


def parse_time(value: Any) -> Optional[datetime]:
    """A protobuf JSON timestamp (``{"seconds": N, "nanos": M}`` or RFC 3339) -> aware UTC.

    None for a missing or zero timestamp (headscale's "never") and for text that is not RFC 3339.
    Offsets are converted, never dropped (``02:44:23+02:00`` is 00:44:23 UTC).
    """
    if value in (None, "", {}):
        return None
    if isinstance(value, dict):
        secs = int(value.get("seconds", 0) or 0)
        if secs <= 0:
            return None
        return datetime.fromtimestamp(secs + int(value.get("nanos", 0) or 0) / 1e9, timezone.utc)
    if isinstance(value, str):
        t = parse_rfc3339(value)
        if t is None or t.year <= 1:
            return None
        return t
    return None


@dataclass(frozen=True)
class PreAuthKey:
    """A pre-auth key as listed by headscale (the secret itself is not kept here).

    Attributes:
        id: numeric identifier.
        tags: ACL tags nodes enrolled with it get.
        reusable: may enrol more than one node.
        used: has enrolled a node.
        expiration: when it stops working (None = never).
    """

    id: int
    tags: Tuple[str, ...]
    reusable: bool
    used: bool
    expiration: Optional[datetime]

    def usable(self, now: Optional[datetime] = None, margin_s: float = 0.0) -> bool:
        """True when the key can still enrol a node for at least ``margin_s`` seconds."""
        now = now or datetime.now(timezone.utc)
        if self.used and not self.reusable:
            return False
        return self.expiration is None or (self.expiration - now).total_seconds() > margin_s


@dataclass(frozen=True)
class Node:
    """An enrolled node as listed by headscale.

    Attributes:
        id: numeric identifier.
        name: the hostname the client reported.
        given_name: the MagicDNS short name headscale gave it (normally == name).
        tags: its ACL tags.
        online: connected to headscale now.
        last_seen: last time it was connected (None = never/unknown).
        expiry: when its node key expires (None = never).
        ip_addresses: overlay addresses.
        user: owning user name ("tagged-devices" for tagged nodes).
    """

    id: int
    name: str
    given_name: str
    tags: Tuple[str, ...]
    online: bool
    last_seen: Optional[datetime]
    expiry: Optional[datetime]
    ip_addresses: Tuple[str, ...]
    user: str

    def expired(self, now: Optional[datetime] = None) -> bool:
        """True when the node key has expired (the node is cut off)."""
        now = now or datetime.now(timezone.utc)
        return self.expiry is not None and self.expiry <= now


class HeadscaleCLI:
    """Runs ``headscale --config CONFIG <args> -o json`` and parses the result.

    Args:
        binary: headscale executable.
        config_path: the deployment's headscale config.yaml.
        timeout: seconds one call may take.
    """

    def __init__(self, binary: Union[str, Path], config_path: Union[str, Path],
                 timeout: float = CLI_TIMEOUT_S) -> None:
        self.binary = str(binary)
        self.config_path = str(config_path)
        self.timeout = timeout

    def _env(self) -> Dict[str, str]:
        # HEADSCALE_CLI_* in the caller's environment would send us to another server.
        return {k: v for k, v in os.environ.items() if not k.startswith("HEADSCALE_")}

    def run(self, args: List[str], *, secret_output: bool = False, json_output: bool = True
            ) -> Any:
        """Run one CLI command; return its parsed JSON output (or text if not json_output).

        ``secret_output``: the output holds a secret; it is never put in an error message.
        Raises FleetError on a failure, naming the command (never its output if secret).
        """
        argv = [self.binary, "--config", self.config_path, *args]
        if json_output:
            argv += ["-o", "json"]
        what = "headscale " + " ".join(args)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout,
                                  env=self._env(), stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError:
            raise FleetError(f"headscale binary not found: {self.binary}",
                             file=self.config_path) from None
        except subprocess.TimeoutExpired:
            raise FleetError(f"`{what}` did not answer within {self.timeout:.0f} s",
                             file=self.config_path) from None
        if proc.returncode != 0:
            detail = proc.stderr.strip() if secret_output else (proc.stderr or proc.stdout).strip()
            raise FleetError(redact(self._explain(what, detail)), file=self.config_path)
        if not json_output:
            return proc.stdout
        text = proc.stdout.strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            if secret_output:
                raise FleetError(f"`{what}` printed something that is not JSON",
                                 file=self.config_path) from None
            raise FleetError(f"`{what}` printed something that is not JSON: {redact(text)[:200]}",
                             file=self.config_path) from None

    @staticmethod
    def _explain(what: str, detail: str) -> str:
        """An error message for a failed command, with a hint for the common causes."""
        low = detail.lower()
        try:  # `-o json` errors look like {"error": "..."}
            obj = json.loads(detail)
            if isinstance(obj, dict) and "error" in obj:
                detail = str(obj["error"])
                low = detail.lower()
        except (json.JSONDecodeError, ValueError):
            pass
        detail = detail[-600:]
        if ("connecting to headscale" in low or "deadline exceeded" in low
                or "connection refused" in low or "no such file or directory" in low
                and "sock" in low):
            return (f"`{what}`: headscale is not running or not reachable on its unix socket "
                    f"(start it with `fleet serve`): {detail}")
        return f"`{what}` failed: {detail}"

    # --- pre-auth keys -----------------------------------------------------------------
    @staticmethod
    def _key(k: Dict[str, Any]) -> PreAuthKey:
        return PreAuthKey(id=int(k.get("id", 0)), tags=tuple(k.get("acl_tags") or ()),
                          reusable=bool(k.get("reusable", False)), used=bool(k.get("used", False)),
                          expiration=parse_time(k.get("expiration")))

    def list_preauth_keys(self) -> List[PreAuthKey]:
        """Every pre-auth key (without secrets)."""
        return [self._key(k) for k in self.run(["preauthkeys", "list"]) or []]

    def create_preauth_key(self, tags: List[str], expiration_s: int, *, reusable: bool = False,
                           user_id: Optional[int] = None) -> Tuple[PreAuthKey, str]:
        """Create a tagged pre-auth key valid for ``expiration_s`` seconds.

        Returns (key metadata, secret key). The secret must only go to a 0600 file.
        """
        args = ["preauthkeys", "create", "--expiration", f"{int(expiration_s)}s",
                "--tags", ",".join(tags)]
        if reusable:
            args.append("--reusable")
        if user_id is not None:
            args += ["--user", str(user_id)]
        out = self.run(args, secret_output=True)
        if not isinstance(out, dict) or not out.get("key"):
            raise FleetError("`headscale preauthkeys create` returned no key", file=self.config_path)
        return self._key(out), str(out["key"])

    def expire_preauth_key(self, key_id: int) -> None:
        """Expire pre-auth key ``key_id`` (it can no longer enrol nodes)."""
        self.run(["preauthkeys", "expire", "--id", str(key_id)])

    # --- nodes -------------------------------------------------------------------------
    @staticmethod
    def _node(n: Dict[str, Any]) -> Node:
        user = n.get("user") or {}
        return Node(id=int(n.get("id", 0)), name=str(n.get("name", "")),
                    given_name=str(n.get("given_name", "") or n.get("name", "")),
                    tags=tuple(n.get("tags") or ()), online=bool(n.get("online", False)),
                    last_seen=parse_time(n.get("last_seen")), expiry=parse_time(n.get("expiry")),
                    ip_addresses=tuple(n.get("ip_addresses") or ()),
                    user=str(user.get("name", "")) if isinstance(user, dict) else "")

    def list_nodes(self) -> List[Node]:
        """Every enrolled node."""
        return [self._node(n) for n in self.run(["nodes", "list"]) or []]

    def expire_node(self, node_id: int) -> None:
        """Expire node ``node_id``'s key now: it is cut off until it enrols again."""
        self.run(["nodes", "expire", "--identifier", str(node_id)])

    def delete_node(self, node_id: int) -> None:
        """Delete node ``node_id`` from headscale."""
        self.run(["nodes", "delete", "--identifier", str(node_id), "--force"])

    def set_tags(self, node_id: int, tags: List[str]) -> None:
        """Replace node ``node_id``'s ACL tags (every tag must have an owner in the policy in
        force: apply the policy first)."""
        self.run(["nodes", "tag", "--identifier", str(node_id), "--tags", ",".join(tags)])

    # --- policy ------------------------------------------------------------------------
    def check_policy(self, policy_file: Union[str, Path]) -> None:
        """Ask the running headscale whether ``policy_file`` is valid; FleetError if not."""
        self.run(["policy", "check", "--file", str(policy_file)], json_output=False)

    def check_policy_offline(self, policy_file: Union[str, Path]) -> None:
        """Validate ``policy_file`` while headscale is NOT running (reads its database
        read-only through headscale itself; never run it while the server runs)."""
        self.run(["policy", "check", "--file", str(policy_file),
                  "--bypass-grpc-and-access-database-directly", "--force"], json_output=False)

    def health(self) -> bool:
        """True when a headscale answers on the unix socket."""
        try:
            self.run(["users", "list"])
        except FleetError:
            return False
        return True
