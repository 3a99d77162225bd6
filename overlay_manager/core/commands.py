"""How the product's messages and docs name its own root commands: one form, printed everywhere.

``overlay_env``'s root steps (``--enrol``, ``--write-hosts``, ``--install-ca``,
``--rosbridge-firewall``) run through sudo, and sudo resets the environment: ROS_PACKAGE_PATH,
CMAKE_PREFIX_PATH and PYTHONPATH are dropped (``sudo -E`` too drops PYTHONPATH and LD_*), so
``sudo rosrun overlay_manager ...`` finds no package built in a workspace, and PATH becomes sudo's
``secure_path`` (on Ubuntu without /opt/ros/noetic/bin: "sudo: rosrun: command not found").

``rosrun --prefix CMD`` finds the executable as the user, in the user's environment, and runs
``CMD <executable> ARGS``; as root the script needs only the workspace's Python path, which
``sudo env PYTHONPATH=...`` gives it (the shell expands ``$PYTHONPATH`` when the line is run).
The docs print the same form; test/integration/test_docs_sudo.py runs every one of them through
sudo as an ordinary user with a workspace-built package.
"""

from __future__ import annotations

OVERLAY_ENV_AS_ROOT = 'rosrun --prefix "sudo env PYTHONPATH=$PYTHONPATH" overlay_manager overlay_env'
"""``overlay_env`` as root, as a user with the workspace sourced types it (arguments follow)."""


def overlay_env_as_root(args: str) -> str:
    """The command line that runs ``overlay_env ARGS`` as root (ARGS as written, e.g. ``--install-ca``)."""
    return f"{OVERLAY_ENV_AS_ROOT} {args.strip()}".rstrip()
