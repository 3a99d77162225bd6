"""The dashboard's model: a QObject that owns the ROS side and tells the view through Signals.

It subscribes to one overlay_manager node's ``~peers``, ``~status``, ``~path_changes`` and
``~topic_links``, notes when the node last spoke (to mark it stale), calls its
``~ping_peer``, ``~measure_link`` and ``~wait_for_peer`` services on worker threads (never on the
GUI thread), looks for overlay_manager nodes on the graph, and keeps per-peer history.

ROS callbacks and workers run on other threads; they only emit Signals. Connect the view to them
with ``Qt.QueuedConnection`` so every slot runs on the GUI thread (as rqt_robot_monitor does).
The model never calls ``rospy.init_node``: rqt does that, and so does ``standalone``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import rospy
from python_qt_binding.QtCore import QObject, QTimer, Signal

from overlay_manager.msg import OverlayStatus, PathChange, PeerList, TopicLinkList
from overlay_manager.srv import MeasureLink, PingPeer, WaitForPeer
from overlay_manager.view import text as fmt
from overlay_manager.view.state import (
    Freshness,
    HistoryStore,
    nodes_from_topics,
    normalise_node,
)

ACTION_PING = "ping"
ACTION_MEASURE = "measure"
ACTION_WAIT_DIRECT = "wait_direct"

SERVICE_WAIT_S = 3.0  # how long an action waits for the service to be advertised


@dataclass(frozen=True)
class ActionResult:
    """Outcome of one action on a peer.

    ``response`` is the service response (None when the call failed before one arrived);
    ``verdict`` is the line the view shows; ``elapsed`` is wall time in seconds.
    """

    action: str
    node: str
    peer: str
    ok: bool
    verdict: fmt.Verdict
    response: Any
    elapsed: float


class OverlayModel(QObject):
    """Subscribers, service proxies and history for one selected overlay_manager node."""

    nodes_changed = Signal(list)          # [node name, ...] found on the graph
    node_changed = Signal(str)            # the selected node ("" = none)
    peers_received = Signal(object)       # overlay_manager/PeerList
    status_received = Signal(object)      # overlay_manager/OverlayStatus
    path_change_received = Signal(object) # overlay_manager/PathChange
    topic_links_received = Signal(object) # overlay_manager/TopicLinkList
    action_started = Signal(str, str)     # action, peer
    action_finished = Signal(object)      # ActionResult
    error = Signal(str)                   # something the operator should see

    def __init__(self, parent: Optional[QObject] = None, discovery_period_s: float = 2.0,
                 history_samples: int = 600) -> None:
        """Nothing runs until start(); discovery_period_s is how often the master is asked."""
        super().__init__(parent)
        self._lock = threading.Lock()
        self._node = ""
        self._subscribers: List[rospy.Subscriber] = []
        self._history = HistoryStore(history_samples)
        self._freshness = Freshness()
        self._closed = False
        self._discovering = False
        self._nodes: List[str] = []
        self._timer = QTimer(self)
        self._timer.setInterval(int(discovery_period_s * 1000))
        self._timer.timeout.connect(self.refresh_nodes)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Begin looking for overlay_manager nodes on the graph (periodically)."""
        self._timer.start()
        self.refresh_nodes()

    def shutdown(self) -> None:
        """Unregister every subscriber and stop emitting (pending service calls are abandoned)."""
        with self._lock:
            self._closed = True
            subs, self._subscribers = self._subscribers, []
        self._timer.stop()
        for sub in subs:
            sub.unregister()

    def _emit(self, signal: Any, *args: Any) -> None:
        """Emit unless shut down (workers may finish after the view is gone)."""
        if not self._closed:
            signal.emit(*args)

    # ------------------------------------------------------------------ discovery
    def nodes(self) -> List[str]:
        """overlay_manager nodes found by the last discovery."""
        return list(self._nodes)

    def refresh_nodes(self) -> None:
        """Ask the master for overlay_manager nodes on a worker thread; emits nodes_changed."""
        with self._lock:
            if self._discovering or self._closed:
                return
            self._discovering = True
        threading.Thread(target=self._discover, name="overlay_dashboard_discovery",
                         daemon=True).start()

    def _discover(self) -> None:
        try:
            topics = rospy.get_published_topics()
        except (OSError, rospy.ROSException) as exc:  # master gone or unreachable
            self._emit(self.error, f"cannot reach the ROS master: {exc}")
            return
        finally:
            with self._lock:
                self._discovering = False
        nodes = nodes_from_topics(topics)
        if nodes != self._nodes:
            self._nodes = nodes
            self._emit(self.nodes_changed, nodes)

    # ------------------------------------------------------------------ selected node
    def node(self) -> str:
        """The selected node's name ("" = none)."""
        return self._node

    def set_node(self, name: str) -> None:
        """Show another node: drop the old subscribers and history, subscribe to the new one."""
        name = normalise_node(name)
        with self._lock:
            if self._closed or name == self._node:
                return
            old, self._subscribers = self._subscribers, []
            self._node = name
        for sub in old:
            sub.unregister()
        self._history.clear()
        self._freshness.clear()
        # announce the change before subscribing: rospy hands a new subscriber the latched
        # messages it already holds at once, and they must land after the views were cleared
        self._emit(self.node_changed, name)
        if name:
            subs = [
                rospy.Subscriber(f"{name}/peers", PeerList, self._on_peers, callback_args=name,
                                 queue_size=5),
                rospy.Subscriber(f"{name}/status", OverlayStatus, self._on_status,
                                 callback_args=name, queue_size=5),
                rospy.Subscriber(f"{name}/path_changes", PathChange, self._on_path_change,
                                 callback_args=name, queue_size=50),
                rospy.Subscriber(f"{name}/topic_links", TopicLinkList, self._on_topic_links,
                                 callback_args=name, queue_size=2),
            ]
            with self._lock:
                if self._node == name and not self._closed:
                    self._subscribers = subs
                    subs = []
            for sub in subs:  # another node was selected meanwhile
                sub.unregister()

    def _current(self, name: str) -> bool:
        return name == self._node and not self._closed

    def _on_peers(self, msg: PeerList, name: str) -> None:
        if not self._current(name):
            return
        self._freshness.note(time.monotonic())
        t = msg.header.stamp.to_sec() or time.time()
        for p in msg.peers:
            self._history.add_counters(p.name, t, p.latency_ms, p.rx_bytes, p.tx_bytes)
        self._emit(self.peers_received, msg)

    def _on_status(self, msg: OverlayStatus, name: str) -> None:
        if self._current(name):
            self._freshness.note(time.monotonic())
            self._emit(self.status_received, msg)

    def _on_topic_links(self, msg: TopicLinkList, name: str) -> None:
        if self._current(name):
            self._emit(self.topic_links_received, msg)

    # ------------------------------------------------------------------ staleness
    def stale_for(self) -> Optional[float]:
        """Seconds since the selected node last published ~peers/~status when that is more than
        three of its publish periods (it died, or its master went away); None = fresh or nothing
        received yet."""
        return self._freshness.stale(time.monotonic())

    def stale_after(self) -> float:
        """Seconds of silence after which the selected node counts as stale."""
        return self._freshness.stale_after()

    def _on_path_change(self, msg: PathChange, name: str) -> None:
        if self._current(name):
            self._emit(self.path_change_received, msg)

    # ------------------------------------------------------------------ history
    def history(self, peer: str) -> list:
        """The peer's latency/rate samples (state.Sample), oldest first."""
        return self._history.samples(peer)

    def rates(self, peer: str) -> tuple:
        """Last (rx, tx) byte rates of a peer; None = not known yet."""
        return self._history.rates(peer)

    # ------------------------------------------------------------------ actions
    def ping(self, peer: str, count: int = 3, timeout_s: float = 5.0) -> None:
        """Disco-ping a peer through ``~ping_peer``; emits action_finished."""
        def done(resp: Any) -> fmt.Verdict:
            if resp.ok:
                self._history.add_latency(peer, time.time(), resp.latency_mean_ms)
            return fmt.ping_text(peer, resp)

        self._run(ACTION_PING, peer, "ping_peer", PingPeer, done,
                  {"name": peer, "count": count, "timeout": timeout_s})

    def measure_link(self, peer: str, duration_s: float = 3.0, udp_mbps: float = 0.0) -> None:
        """iperf3 + ping against the peer through ``~measure_link``; emits action_finished."""
        self._run(ACTION_MEASURE, peer, "measure_link", MeasureLink,
                  lambda resp: fmt.measure_text(peer, resp),
                  {"peer": peer, "duration": duration_s, "udp_bitrate": udp_mbps})

    def wait_for_direct(self, peer: str, timeout_s: float = 30.0) -> None:
        """Wait until the link to the peer is direct through ``~wait_for_peer``."""
        self._run(ACTION_WAIT_DIRECT, peer, "wait_for_peer", WaitForPeer,
                  lambda resp: fmt.wait_text(peer, resp, require_direct=True),
                  {"name": peer, "timeout": timeout_s, "require_direct": True})

    def _run(self, action: str, peer: str, service: str, srv_type: Any,
             verdict: Callable[[Any], fmt.Verdict], request: Dict[str, Any]) -> None:
        node = self._node
        if not node:
            self._emit(self.error, "no overlay_manager node selected")
            return
        self._emit(self.action_started, action, peer)
        threading.Thread(target=self._call, name=f"overlay_dashboard_{action}", daemon=True,
                         args=(action, node, peer, f"{node}/{service}", srv_type, verdict,
                               request)).start()

    def _call(self, action: str, node: str, peer: str, service: str, srv_type: Any,
              verdict: Callable[[Any], fmt.Verdict], request: Dict[str, Any]) -> None:
        start = time.monotonic()
        resp = None
        try:
            rospy.wait_for_service(service, timeout=SERVICE_WAIT_S)
            resp = rospy.ServiceProxy(service, srv_type)(**request)
        except (rospy.ServiceException, OSError) as exc:  # ServiceException is a ROSException
            result = fmt.Verdict(f"{action} {peer}: {service} failed: {exc}", fmt.LEVEL_ERROR)
        except rospy.ROSException as exc:  # the wait for the service timed out
            result = fmt.Verdict(f"{action} {peer}: {service} not available: {exc}", fmt.LEVEL_ERROR)
        else:
            result = verdict(resp)
        ok = resp is not None and bool(getattr(resp, "ok", False))
        self._emit(self.action_finished, ActionResult(action, node, peer, ok, result, resp,
                                                      time.monotonic() - start))
