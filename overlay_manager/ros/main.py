"""Entry point of ``rosrun overlay_manager overlay_manager_node`` (see node.py for the node).

Reads ~config and the node.* ~private parameters (a bad config exits with code 2 and one FATAL
line), starts the node and a thread that enrols tailscaled once it answers.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Dict

import rospy

from overlay_manager.core.config import NodeSettings, apply_overrides, load_robot_config, override_master
from overlay_manager.core.topic_links import parse_host_aliases
from overlay_manager.core.validation.errors import ConfigError
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.ros.node import OverlayNode
from overlay_manager.system.workers import LOG_ERROR, LOG_INFO, LogQueue, describe
from overlay_manager.tailscaled.enrolment import ensure_enrolled
from overlay_manager.tailscaled.localapi import EnrolError, LocalAPI, TailscaleError

ENROL_RETRY_S = 30.0
"""Seconds between enrolment attempts after an enrolment error (bad or used key, other server):
slow enough not to hammer the control server, fast enough to pick up a fixed key file."""


def _ros_log(level: str, text: str) -> None:
    """LogQueue writer: one rospy log call (may block on the master; only overlay-log waits)."""
    {"debug": rospy.logdebug, "info": rospy.loginfo, "warn": rospy.logwarn}.get(level, rospy.logerr)(text)


def _read_overrides() -> Dict[str, Any]:
    """node.* settings given as ~private params."""
    out: Dict[str, Any] = {}
    for name in NodeSettings.__dataclass_fields__:
        if rospy.has_param("~" + name):
            out[name] = rospy.get_param("~" + name)
    return out


def main() -> None:
    """Entry point of overlay_manager_node."""
    rospy.init_node("overlay_manager")
    path = rospy.get_param("~config", os.environ.get("OVERLAY_MANAGER_CONFIG", ""))
    if not path:
        rospy.logfatal("overlay_manager: parameter ~config (robot config file) is required; "
                       "e.g. roslaunch overlay_manager robot.launch config:=/etc/overlay_manager/robot.yaml")
        sys.exit(2)
    try:
        cfg = load_robot_config(path)
        cfg = apply_overrides(cfg, _read_overrides(), f"{rospy.get_name()} private parameters")
        cfg = override_master(cfg, rospy.get_param("~master", ""), f"{rospy.get_name()} private parameters")
        aliases = parse_host_aliases(rospy.get_param("~host_aliases", None),
                                     f"{rospy.get_name()} private parameters")
    except ConfigError as exc:
        rospy.logfatal("overlay_manager: bad config: %s", exc)
        sys.exit(2)
    api = LocalAPI(cfg.tailscale.socket)
    monitor = OverlayMonitor(cfg, api)
    log = LogQueue(_ros_log)
    node = OverlayNode(monitor, log, host_aliases=aliases)
    rospy.on_shutdown(node.shutdown)
    stop = threading.Event()
    rospy.on_shutdown(stop.set)
    threading.Thread(target=_enrol_loop, args=(api, cfg, monitor, log, stop), name="overlay-enrol",
                     daemon=True).start()
    rospy.spin()


def _enrol_loop(api: LocalAPI, cfg: Any, monitor: OverlayMonitor, log: LogQueue, stop: threading.Event) -> None:
    """Enrol once tailscaled answers. A missing daemon is retried every 2 s; an enrolment error
    (bad or used key, other login server) is shown as ERROR on /diagnostics (monitor.enrol_error)
    and retried every ENROL_RETRY_S s, so a fixed key file is picked up. The node never exits for
    it: a robot's bringup must not go down because the overlay cannot enrol."""
    reported = ""
    while not stop.is_set():
        try:
            result = ensure_enrolled(api, cfg)
            monitor.enrol_error = ""
            log(LOG_INFO, f"overlay_manager: {result.message}")
            return
        except EnrolError as exc:
            monitor.enrol_error = str(exc)
            if str(exc) != reported:
                log(LOG_ERROR, f"overlay_manager: enrolment failed: {exc} (retrying every "
                               f"{ENROL_RETRY_S:.0f} s; the node keeps running)")
                reported = str(exc)
            stop.wait(ENROL_RETRY_S)
            continue
        except TailscaleError as exc:
            if str(exc) != reported:
                log(LOG_ERROR, f"overlay_manager: {exc} (retrying every 2 s)")
                reported = str(exc)
        except Exception as exc:  # noqa: BLE001 - keep trying; the poll thread reports tailscaled's state
            text = describe(exc)
            if text != reported:
                log(LOG_ERROR, f"overlay_manager: enrolment check failed: {text} (retrying every 2 s)")
                reported = text
        stop.wait(2.0)
