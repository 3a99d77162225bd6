"""The overlay node's topic-link map: ~topic_links (latched) and ~get_topic_links (ROS side).

The map itself is built by ``graph_reader.TopicMapper`` (XML-RPC with bounded timeouts) and
``core.topic_links`` (pure). This class only owns the publisher and the service and runs one build per
cycle on the thread that calls ``cycle`` (the node's overlay-topics worker). Nothing here holds a
lock that publishing ~peers/~status needs; the service handler builds on a rospy service thread.

Each build also tells the monitor which peers carry ROS connections to or from this machine, so
the pinger keeps only those paths fresh (plus node.watch_peers and the master's machine).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional

import rosgraph
import rospy

from overlay_manager.core.topic_links import TopicLink as Link
from overlay_manager.core.topic_links import filter_links, peers_with_links
from overlay_manager.monitor.overlay_monitor import OverlayMonitor
from overlay_manager.msg import TopicLink, TopicLinkList
from overlay_manager.ros.graph_reader import GraphReader, TopicMapper
from overlay_manager.srv import GetTopicLinks, GetTopicLinksResponse

XMLRPC_TIMEOUT_S = 1.0
"""Socket timeout of each XML-RPC call (master and nodes): a dead node costs at most this."""


def link_msg(link: Link) -> TopicLink:
    """core.topic_links.TopicLink -> overlay_manager/TopicLink."""
    return TopicLink(topic=link.topic, type=link.type, publisher_node=link.publisher_node,
                     publisher_host=link.publisher_host, subscriber_node=link.subscriber_node,
                     subscriber_host=link.subscriber_host, local=link.local, path=link.path,
                     endpoint=link.endpoint, bytes_per_second=link.bytes_per_second)


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
        self.pub = rospy.Publisher("~topic_links", TopicLinkList, queue_size=1, latch=True)
        rospy.Service("~get_topic_links", GetTopicLinks, self.srv_get_topic_links)

    def _self_name(self) -> str:
        snap = self.m.snapshot
        return snap.self_peer.name if snap and snap.self_peer else self.m.cfg.hostname

    def build(self) -> List[Link]:
        """Read the graph now; hand the linked peers to the monitor. Returns every link."""
        links = self.mapper.build(self.m.snapshot)
        if self.mapper.built:
            self.m.set_topic_peers(peers_with_links(links, self._self_name()))
        return links

    def cycle(self) -> None:
        """One worker cycle: build, then publish the cross-machine links (latched)."""
        links = self.build()
        if not self.mapper.built:
            return  # the master never answered: nothing to say yet (the error is in the service)
        self.pub.publish(self.list_msg(filter_links(links)))

    @staticmethod
    def list_msg(links: Iterable[Link]) -> TopicLinkList:
        """A TopicLinkList stamped now."""
        msg = TopicLinkList()
        msg.header.stamp = rospy.Time.now()
        msg.links = [link_msg(link) for link in links]
        return msg

    def srv_get_topic_links(self, req: Any) -> GetTopicLinksResponse:
        """~get_topic_links: a fresh map, filtered as asked."""
        links = self.build()
        error = self.mapper.error
        selected = filter_links(links, req.topic, req.host, req.include_local)
        if error:
            return GetTopicLinksResponse(
                ok=False, links=[link_msg(link) for link in selected],
                message=f"cannot read the ROS graph: {error}"
                        + ("; the links are from the last successful read" if self.mapper.built else ""))
        return GetTopicLinksResponse(ok=True, links=[link_msg(link) for link in selected], message="")

    def close(self) -> None:
        """Stop the graph reader's pool."""
        self.mapper.close()

