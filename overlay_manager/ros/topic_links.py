"""The overlay node's topic-link map: ~topic_links (latched) and ~get_topic_links (ROS side).

The map itself is built by ``graph_reader.TopicMapper`` (XML-RPC with bounded timeouts) and
``core.topic_links`` (pure). This class only owns the publisher and the service and runs one build per
cycle on the thread that calls ``cycle`` (the node's overlay-topics worker). Nothing here holds a
lock that publishing ~peers/~status needs; the service handler builds on a rospy service thread.

Each build also tells the monitor which peers carry ROS connections to or from this machine, so
the pinger keeps only those paths fresh (plus node.watch_peers and the master's machine), and
follows the shaped streams' stream_state topics (``ros/stream_states.py``): each link of a shaped
stream carries what its subscriber gets (``TopicLink.shaping_*``, matched by ``core.link_shaping``).
A stream_state topic first followed in one build shows on the links from the next build on.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, FrozenSet, Iterable, List, Mapping, Optional, Tuple

import rosgraph
import rospy

from overlay_manager.core.link_shaping import annotate, states_to_follow, stream_state_topics
from overlay_manager.core.topic_links import TopicLink as Link
from overlay_manager.core.topic_links import filter_links, peers_with_links
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.msg import StreamSubscriber, TopicLink, TopicLinkList
from overlay_manager.ros.graph_reader import GraphReader, TopicMapper
from overlay_manager.ros.stream_states import FollowError, StreamStateFollower
from overlay_manager.srv import GetTopicLinks, GetTopicLinksResponse

XMLRPC_TIMEOUT_S = 1.0
"""Socket timeout of each XML-RPC call (master and nodes): a dead node costs at most this."""


NO_SHAPING = dict(budget_kbps=math.nan, observed_cap_kbps=math.nan, queue_delay_ms=math.nan,
                  rate_hz=math.nan, bitrate_kbps=math.nan, pacing_kbps=math.nan)
"""StreamSubscriber fields of a link without shaping: its floats are unknown (NaN), not 0."""


def link_msg(link: Link) -> TopicLink:
    """core.topic_links.TopicLink -> overlay_manager/TopicLink."""
    msg = TopicLink(topic=link.topic, type=link.type, publisher_node=link.publisher_node,
                    publisher_host=link.publisher_host, subscriber_node=link.subscriber_node,
                    subscriber_host=link.subscriber_host, local=link.local, path=link.path,
                    endpoint=link.endpoint, bytes_per_second=link.bytes_per_second)
    shaping = link.shaping
    if shaping is None:
        msg.shaping = StreamSubscriber(**NO_SHAPING)
    else:
        msg.shaping_state, msg.shaping_format, msg.shaping_reason = (
            shaping.state_topic, shaping.format, shaping.reason)
        msg.shaping = StreamSubscriber(**dataclasses.asdict(shaping.subscriber))
    return msg


class TopicLinkReporter:
    """Publishes ~topic_links and serves ~get_topic_links for the overlay node.

    Args:
        monitor: the node's monitor (its snapshot gives paths; it receives the linked peers).
        aliases: URI host -> machine short name (see parse_host_aliases).
        master_uri: the ROS master (default: this process's ROS_MASTER_URI).
    """

    def __init__(self, monitor: OverlayMonitor, aliases: Optional[Mapping[str, str]] = None,
                 master_uri: Optional[str] = None) -> None:
        """Advertise the topic and the service; nothing is read until cycle() or a request."""
        self.m = monitor
        cfg = monitor.cfg
        reader = GraphReader(master_uri or rosgraph.get_master_uri(), rospy.get_name(),
                             timeout_s=XMLRPC_TIMEOUT_S)
        self.mapper = TopicMapper(reader, (cfg.hostname, cfg.fqdn), aliases)
        self.states = StreamStateFollower()
        self.pub = rospy.Publisher("~topic_links", TopicLinkList, queue_size=1, latch=True)
        rospy.Service("~get_topic_links", GetTopicLinks, self.srv_get_topic_links)

    def _self_name(self) -> str:
        snap = self.m.snapshot
        return snap.self_peer.name if snap and snap.self_peer else self.m.cfg.hostname

    def build(self) -> Tuple[List[Link], FrozenSet[str]]:
        """Read the graph now; hand the linked peers to the monitor. Returns every link (with what
        the followed streams give each subscriber) and the stream_state topics to follow now
        (empty unless the master answered this time)."""
        links = self.mapper.build(self.m.snapshot)
        state = self.mapper.state
        if not self.mapper.built or state is None:
            return links, frozenset()
        me = self._self_name()
        self.m.set_topic_peers(peers_with_links(links, me))
        state_topics = stream_state_topics(state.publishers, state.types)
        links = annotate(links, self.states.views(state_topics))
        if self.mapper.error:
            return links, frozenset()
        return links, states_to_follow(state_topics, links, me, rospy.get_name())

    def follow(self, wanted: FrozenSet[str]) -> None:
        """Follow exactly the wanted stream_state topics, if the master answered (see build).

        Raises:
            FollowError: naming the topics whose subscription failed.
        """
        if not self.mapper.error:
            self.states.follow(wanted)

    def cycle(self) -> None:
        """One worker cycle: build, publish the cross-machine links (latched), then follow the
        stream_state topics the map calls for (they show from the next cycle on)."""
        links, wanted = self.build()
        if not self.mapper.built:
            return  # the master never answered: nothing to say yet (the error is in the service)
        self.pub.publish(self.list_msg(filter_links(links)))
        self.follow(wanted)

    @staticmethod
    def list_msg(links: Iterable[Link]) -> TopicLinkList:
        """A TopicLinkList stamped now."""
        msg = TopicLinkList()
        msg.header.stamp = rospy.Time.now()
        msg.links = [link_msg(link) for link in links]
        return msg

    def srv_get_topic_links(self, req: Any) -> GetTopicLinksResponse:
        """~get_topic_links: a fresh map, filtered as asked. It also follows the stream_state
        topics the map calls for (with ``topic_links_interval`` 0 requests are the only maps)."""
        links, wanted = self.build()
        error = self.mapper.error
        selected = [link_msg(link) for link in filter_links(links, req.topic, req.host, req.include_local)]
        if error:
            return GetTopicLinksResponse(
                ok=False, links=selected,
                message=f"cannot read the ROS graph: {error}"
                        + ("; the links are from the last successful read" if self.mapper.built else ""))
        try:
            self.follow(wanted)
        except FollowError as exc:
            return GetTopicLinksResponse(ok=True, links=selected, message=f"shaping not shown for some streams: {exc}")
        return GetTopicLinksResponse(ok=True, links=selected, message="")

    def close(self) -> None:
        """Stop the graph reader's pool; forget the followed stream_state topics."""
        self.mapper.close()
        self.states.close()

