"""The shaped streams' stream_state topics the overlay node follows for ~topic_links (ROS side of
``core.link_shaping``).

The node subscribes to a ``<tier topic>/stream_state`` (overlay_manager/StreamState, latched) only
while ``core.link_shaping.states_to_follow`` says so (its publisher sends something across this
machine's boundary) and unsubscribes when it no longer does or the topic went away: a robot
nobody watches from another machine costs nothing, and each followed stream costs one small
latched message per state period (1 s by default).

Threads and locks:
- :meth:`StreamStateFollower.follow` runs on the thread that builds the map (overlay-topics, or a
  rospy service thread for ~get_topic_links) under ``_follow_lock``, which nothing else takes. It
  subscribes and unsubscribes (XML-RPC calls to the master that rospy makes while holding its
  topic manager's lock, which publishing does not take, and retries for as long as the master does
  not answer) only after the master answered ``getPid`` within MASTER_TIMEOUT_S.
- :meth:`StreamStateFollower._on_state` runs on rospy's receive threads: it turns a message into a
  ``StreamStateView`` and stores it under ``_lock``.
- ``_lock`` guards ``_subs`` and ``_views`` (dict updates only: no I/O, no logging under it);
  :meth:`views` copies under it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import rosgraph
import rospy

from overlay_manager.core.link_shaping import StreamStateView, current_views
from overlay_manager.msg import StreamState
from overlay_manager.ros.graph_reader import master_error

MASTER_TIMEOUT_S = 1.0
"""Seconds the master may take to answer getPid before stream_state topics are (un)subscribed."""
MAX_FOLLOWED = 64
"""At most this many stream_state topics are followed (the first in name order): a bound on what
one overlay node subscribes to, whatever the graph holds (a camera with both link-aware transports
and tiers has four)."""


class FollowError(Exception):
    """Subscribing to some stream_state topics failed; the message names each topic and why (they
    are tried again at the next map)."""


class StreamStateFollower:
    """Subscribes to the stream_state topics worth following and keeps their latest messages.

    Args:
        make_subscriber: default rospy.Subscriber (same arguments).
        ask_master: () -> "" when the master answers, else why not (default: getPid with
            MASTER_TIMEOUT_S).
    """

    def __init__(self, make_subscriber: Optional[Callable[..., Any]] = None,
                 ask_master: Optional[Callable[[], str]] = None) -> None:
        """Nothing is subscribed until follow()."""
        self._make = make_subscriber or rospy.Subscriber
        self._ask_master = ask_master or (
            lambda: master_error(rosgraph.get_master_uri(), rospy.get_name(), MASTER_TIMEOUT_S))
        self._follow_lock = threading.Lock()   # one follow() at a time (held across master I/O)
        self._lock = threading.Lock()          # guards _subs and _views; no I/O under it
        self._subs: Dict[str, Any] = {}        # followed topic -> its subscriber (None while it is made)
        self._views: Dict[Tuple[str, str], StreamStateView] = {}  # (topic, publisher) -> latest

    def followed(self) -> List[str]:
        """The stream_state topics subscribed now, sorted."""
        with self._lock:
            return sorted(t for t, sub in self._subs.items() if sub is not None)

    def follow(self, wanted: Iterable[str]) -> None:
        """Subscribe to the wanted topics not followed yet (at most MAX_FOLLOWED in all) and
        unsubscribe from the others; nothing when the master does not answer (tried again next
        time).

        Raises:
            FollowError: naming the topics whose subscription failed (the others are in force).
        """
        want = set(sorted(set(wanted))[:MAX_FOLLOWED])
        with self._follow_lock:
            with self._lock:
                current = set(self._subs)
            add, drop = sorted(want - current), sorted(current - want)
            if not add and not drop:
                return
            if self._ask_master():
                return  # the map says why the master is unreachable; try again at the next one
            for topic in drop:
                with self._lock:
                    sub = self._subs.pop(topic, None)
                    for key in [k for k in self._views if k[0] == topic]:
                        del self._views[key]
                if sub is not None:
                    sub.unregister()
            failed = []
            for topic in add:
                with self._lock:
                    self._subs[topic] = None  # a latched message may arrive before the constructor returns
                try:
                    sub = self._make(topic, StreamState, self._on_state, callback_args=topic, queue_size=1)
                except Exception as exc:  # noqa: BLE001 - named in FollowError, retried next time
                    with self._lock:
                        self._subs.pop(topic, None)
                        self._views = {k: v for k, v in self._views.items() if k[0] != topic}
                    failed.append(f"{topic}: {exc or type(exc).__name__}")
                    continue
                with self._lock:
                    self._subs[topic] = sub
        if failed:
            raise FollowError("cannot subscribe to " + "; ".join(failed))

    def _on_state(self, msg: Any, topic: str) -> None:
        """A StreamState on a followed topic (rospy receive thread)."""
        header = getattr(msg, "_connection_header", None) or {}
        view = StreamStateView.from_message(topic, header.get("callerid", ""), msg)
        with self._lock:
            if topic in self._subs:  # not a late message of a topic just dropped
                self._views[(topic, view.publisher)] = view

    def views(self, state_topics: Mapping[str, Sequence[str]]) -> List[StreamStateView]:
        """The latest message of every followed topic's publishers that still publish it (the
        master's ``state_topics``: topic -> publishers), sorted by topic and publisher."""
        with self._lock:
            views = list(self._views.values())
        return current_views(views, state_topics)

    def close(self) -> None:
        """Forget every subscription and message (no I/O: rospy unregisters a node's subscriptions
        when it shuts down, and a master that is gone must not hold the node's shutdown)."""
        with self._lock:
            self._subs, self._views = {}, {}
