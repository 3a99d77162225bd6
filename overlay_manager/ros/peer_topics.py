"""Per-peer topics ``~links/<ROS name of the peer>`` (overlay_manager/Peer), so that rqt_plot and
PlotJuggler plot one link by peer name: ``rqt_plot /alpha_laptop/overlay_manager/links/alpha_robot1/latency_ms``.

Which peers get one: monitor/peer_topics.py (pure). Two threads, so that reporting never waits on
the ROS master:

- overlay-links (:meth:`PeerTopics.cycle`, every LINKS_INTERVAL_S) plans the topics from the last
  reading, advertises the new ones and unregisters the old ones. Both are XML-RPC calls to the
  master that rospy makes while holding its topic manager's lock, and rospy retries a registration
  for as long as the master does not answer; so they happen only here, only after the master
  answered ``getPid`` within XMLRPC_TIMEOUT_S, and a topic taken away is unregistered one cycle
  later, when the reporting thread no longer publishes on it. The publishers in force are handed
  over as one dict, replaced whole, never changed in place.
- overlay-report (:meth:`PeerTopics.publish`) publishes each chosen peer's ``Peer`` message, the
  very object ``~peers`` carries (built once per changed PeerState), on its topic whenever it publishes
  ``~peers``: a dictionary lookup per peer and a non-blocking publish per topic.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import rosgraph
import rospy

from overlay_manager.core.identity import peer_key
from overlay_manager.core.peers import PeerState
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.monitor.peer_topics import ACTIVE, EMPTY, PREFIX, WATCHED, TopicPlan, plan_topics
from overlay_manager.msg import Peer
from overlay_manager.ros.graph_reader import master_error
from overlay_manager.system.workers import LOG_INFO, LOG_WARN, LogFn

LINKS_INTERVAL_S = 1.0
"""Seconds between plans of the per-peer topics (a new topic appears within this of its peer
being chosen, plus one registration with the master)."""
MASTER_TIMEOUT_S = 1.0
"""Seconds the master may take to answer getPid before topics are advertised or unregistered."""
TOPIC_PREFIX = "~" + PREFIX
"""Topic names as the node's publish faults name them: ``~links/alpha_robot1``."""

Send = Callable[[Any, Any, str], None]
"""(publisher, message, topic name for faults) -> None: the reporting thread's publish."""


class PeerTopics:
    """The node's ``~links/<peer>`` publishers.

    Args:
        monitor: the node's monitor (its reading gives the peers; cfg.node the mode and the cap).
        log: the node's log queue.
        make_publisher: default rospy.Publisher (tests pass a fake).
        ask_master: () -> "" when the master answers, else why not (default: getPid with
            MASTER_TIMEOUT_S).
    """

    def __init__(self, monitor: OverlayMonitor, log: LogFn, make_publisher: Optional[Callable[..., Any]] = None,
                 ask_master: Optional[Callable[[], str]] = None) -> None:
        n = monitor.cfg.node
        self.m = monitor
        self.mode, self.cap = n.link_topics, n.max_link_topics
        self.log = log
        self._make = make_publisher or rospy.Publisher
        self._ask_master = ask_master or (
            lambda: master_error(rosgraph.get_master_uri(), rospy.get_name(), MASTER_TIMEOUT_S))
        # peer key -> (publisher, "~links/<name>"); read by overlay-report, replaced whole by overlay-links
        self.publishers: Mapping[str, Tuple[Any, str]] = {}
        self._plan: TopicPlan = EMPTY      # overlay-links only: what self.publishers holds
        self._retired: List[Any] = []      # overlay-links only: unregistered on the next cycle
        self._master_note = ""             # overlay-links only: the master problem last logged
        self._failed: Dict[str, str] = {}  # overlay-links only: topic -> why advertising it failed (logged)

    @property
    def enabled(self) -> bool:
        """node.link_topics is not "none" and node.max_link_topics is not 0."""
        return self.mode in (WATCHED, ACTIVE) and self.cap > 0

    def cycle(self) -> None:
        """overlay-links: plan, then advertise and unregister (see the module docstring)."""
        snap = self.m.reading.snapshot
        plan = plan_topics(snap.peers if snap else (), self.mode, self.cap, self._plan, time.monotonic())
        if plan.topics == self._plan.topics and not self._retired:
            self._plan = plan
            return
        problem = self._ask_master()
        if problem:
            if problem != self._master_note:
                self.log(LOG_WARN, f"overlay_manager: {TOPIC_PREFIX}* topics wait for the ROS master: {problem}")
            self._master_note = problem
            return
        self._master_note = ""
        for pub in self._retired:
            try:
                pub.unregister()
            except Exception:  # noqa: BLE001 - rospy logs it; the topic goes with the node anyway
                pass
        self._retired = []
        pubs: Dict[str, Tuple[Any, str]] = dict(self.publishers)
        for key, topic in self._plan.topics.items():
            if plan.topics.get(key) != topic and key in pubs:
                self._retired.append(pubs.pop(key)[0])
                self.log(LOG_INFO, f"overlay_manager: no longer publishing peer {topic.host} on ~{topic.name}")
        topics = dict(plan.topics)
        for key, topic in plan.topics.items():
            if key in pubs:
                continue
            name = "~" + topic.name
            try:
                pubs[key] = (self._make(name, Peer, queue_size=2, latch=True), name)
            except Exception as exc:  # noqa: BLE001 - tried again next cycle, logged once
                del topics[key]
                text = f"overlay_manager: cannot advertise {name} (peer {topic.host}): {exc}"
                if self._failed.get(name) != text:
                    self.log(LOG_WARN, text)
                self._failed[name] = text
                continue
            self._failed.pop(name, None)
            self.log(LOG_INFO, f"overlay_manager: publishing peer {topic.host} on {name} (overlay_manager/Peer)")
        self.publishers = pubs
        self._plan = TopicPlan(topics, {k: plan.chosen_at[k] for k in topics})

    def publish(self, peers: Sequence[PeerState], msgs: Sequence[Any], send: Send) -> None:
        """overlay-report: msgs[i] (peers[i]'s Peer message) on peers[i]'s topic, if it has one."""
        pubs = self.publishers
        if not pubs:
            return
        for p, m in zip(peers, msgs):
            entry = pubs.get(p.node_id or peer_key(p))
            if entry is not None:
                send(entry[0], m, entry[1])

    def topic_names(self) -> List[str]:
        """The topics in force (``~links/...``), for pruning publish faults of retired ones."""
        return [name for _, name in self.publishers.values()]
