"""What the link-aware rostest checks share: a bounded wait that fails the test, and the ~peers
message the stand-in overlay node latches (this machine and one laptop on a given path).

A plain module next to the check scripts: rostest runs each script from this directory, so
Python finds it by name.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import rospy

from overlay_manager.msg import Peer, PeerList
from overlay_manager.system import waiting


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 20.0,
             detail: Optional[Callable[[], str]] = None) -> Any:
    """overlay_manager.system.waiting.wait_for every 0.05 s; a timeout (s) fails the test (AssertionError),
    its message ending with ``detail()`` (what was seen instead) when given."""
    return waiting.wait_for(what, predicate, timeout, interval=0.05, detail=detail, error=AssertionError)


def peers_msg(path: str, robot: str = "robot1", laptop: str = "laptop") -> PeerList:
    """~peers of robot (100.64.0.1) with one peer, laptop, on 127.0.0.2 over path."""
    msg = PeerList()
    msg.header.stamp = rospy.Time.now()
    msg.self_peer = Peer(name=robot, dns_name=f"{robot}.fleet.internal", addresses=["100.64.0.1"],
                         online=True, path=Peer.PATH_SELF)
    msg.peers = [Peer(name=laptop, dns_name=f"{laptop}.fleet.internal", addresses=["127.0.0.2"], online=True,
                      active=True, path=path)]
    return msg


class Background:
    """A daemon thread that runs ``loop(stopping)`` (a test's publisher) until :meth:`stop` sets
    the event ``stopping``."""

    def __init__(self, loop: Callable[[threading.Event], None]) -> None:
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=loop, args=(self.stopping,), daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Asks the loop to end and waits for it (at most ``timeout`` s)."""
        self.stopping.set()
        self.thread.join(timeout)
