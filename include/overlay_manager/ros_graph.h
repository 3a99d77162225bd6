// What the ROS master knows, for the link-aware encoders: who publishes a topic, which machine a
// node runs on, and where this machine's overlay node publishes its ~peers.
//
// Every function here makes XML-RPC calls to the master (or to one node): call them only from a
// thread that may block (the encoders' control thread), never while holding a lock frames need.
#ifndef OVERLAY_MANAGER_ROS_GRAPH_H
#define OVERLAY_MANAGER_ROS_GRAPH_H

#include <map>
#include <string>
#include <vector>

namespace overlay_manager
{

/// Topic -> publishing nodes, from the master's getSystemState. False when the master did not answer.
bool topicPublishers(std::map<std::string, std::vector<std::string>>* publishers);

/// Host part of the XML-RPC URI the master has for `node` ("" when the lookup fails).
std::string nodeHost(const std::string& node);

/// Where the ~peers of this machine's overlay node come from, and what was tried to find it.
struct PeersSource
{
  std::string topic;  ///< resolved overlay_manager/PeerList topic; "" = none found
  std::string how;    ///< how it was found ("~peers_topic", "$OVERLAY_MANAGER_NS=...", "master: ...")
  std::string tried;  ///< what was tried when nothing was found (for the warning)
};

/// The overlay node's ~peers without a parameter: `override_topic` when set; else
/// /<$OVERLAY_MANAGER_NS>/overlay_manager/peers (robot.launch runs the node there; overlay_env
/// exports the variable); else the master's overlay_manager/PeerList topics published by a node on
/// this machine (host `own_host` or loopback), preferring a node's own ~peers. Blocks on the master.
PeersSource findPeersSource(const std::string& override_topic, const std::string& own_host);

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_ROS_GRAPH_H
