// Master look-ups for the link-aware encoders (see ros_graph.h).
#include "overlay_manager/ros_graph.h"

#include "overlay_manager/subscriber_hosts.h"

#include <ros/master.h>
#include <ros/names.h>
#include <ros/this_node.h>

#include <cstdlib>

namespace overlay_manager
{

bool topicPublishers(std::map<std::string, std::vector<std::string>>* publishers)
{
  XmlRpc::XmlRpcValue args, result, payload;
  args[0] = ros::this_node::getName();
  if (!ros::master::execute("getSystemState", args, result, payload, false))
    return false;
  if (payload.getType() != XmlRpc::XmlRpcValue::TypeArray || payload.size() < 1)
    return false;
  XmlRpc::XmlRpcValue& pubs = payload[0];
  if (pubs.getType() != XmlRpc::XmlRpcValue::TypeArray)
    return false;
  publishers->clear();
  for (int i = 0; i < pubs.size(); ++i)
  {
    XmlRpc::XmlRpcValue& entry = pubs[i];  // [topic, [node, ...]]
    if (entry.getType() != XmlRpc::XmlRpcValue::TypeArray || entry.size() < 2 ||
        entry[0].getType() != XmlRpc::XmlRpcValue::TypeString || entry[1].getType() != XmlRpc::XmlRpcValue::TypeArray)
      continue;
    std::vector<std::string>& nodes = (*publishers)[static_cast<std::string>(entry[0])];
    for (int j = 0; j < entry[1].size(); ++j)
      if (entry[1][j].getType() == XmlRpc::XmlRpcValue::TypeString)
        nodes.push_back(static_cast<std::string>(entry[1][j]));
  }
  return true;
}

std::string nodeHost(const std::string& node)
{
  XmlRpc::XmlRpcValue args, result, payload;
  args[0] = ros::this_node::getName();
  args[1] = node;
  if (ros::master::execute("lookupNode", args, result, payload, false) &&
      payload.getType() == XmlRpc::XmlRpcValue::TypeString)
    return hostOfUri(static_cast<std::string>(payload));
  return "";
}

PeersSource findPeersSource(const std::string& override_topic, const std::string& own_host)
{
  PeersSource src;
  if (!override_topic.empty())
  {
    src.topic = ros::names::resolve(override_topic);
    src.how = "~peers_topic";
    return src;
  }
  const char* ns = std::getenv("OVERLAY_MANAGER_NS");
  if (ns && *ns)
  {
    std::string error;
    const std::string topic = "/" + std::string(ns) + "/overlay_manager/peers";
    if (ros::names::validate(topic, error))
    {
      src.topic = topic;
      src.how = "$OVERLAY_MANAGER_NS=" + std::string(ns);
      return src;
    }
    src.tried = "$OVERLAY_MANAGER_NS='" + std::string(ns) + "' (not a legal ROS name: " + error + "), ";
  }
  else
  {
    src.tried = "$OVERLAY_MANAGER_NS (not set), ";
  }
  src.tried += "the master's overlay_manager/PeerList topics published on this machine (" + own_host + ")";

  XmlRpc::XmlRpcValue args, result, payload;
  args[0] = ros::this_node::getName();
  args[1] = "";
  std::vector<std::string> candidates;
  if (!ros::master::execute("getPublishedTopics", args, result, payload, false) ||
      payload.getType() != XmlRpc::XmlRpcValue::TypeArray)
  {
    src.tried += " (the master did not answer)";
    return src;
  }
  for (int i = 0; i < payload.size(); ++i)
    if (payload[i].size() >= 2 && static_cast<std::string>(payload[i][1]) == "overlay_manager/PeerList")
      candidates.push_back(static_cast<std::string>(payload[i][0]));
  if (candidates.empty())
  {
    src.tried += " (none is published)";
    return src;
  }
  std::map<std::string, std::vector<std::string>> pubs;
  if (!topicPublishers(&pubs))
  {
    src.tried += " (the master did not answer getSystemState)";
    return src;
  }
  std::string fallback;
  for (const std::string& topic : candidates)
    for (const std::string& node : pubs[topic])
    {
      if (pathOfHost(nodeHost(node), own_host, nullptr) != Peer::PATH_SELF)
        continue;
      if (topic == node + "/peers")  // an overlay node's own ~peers
      {
        src.topic = topic;
        src.how = "master: " + node + " on this machine publishes it";
        return src;
      }
      if (fallback.empty())
        fallback = topic;
    }
  if (!fallback.empty())
  {
    src.topic = fallback;
    src.how = "master: an overlay_manager/PeerList published on this machine";
    return src;
  }
  src.tried += " (none of " + std::to_string(candidates.size()) + " is published from this machine)";
  return src;
}

}  // namespace overlay_manager
