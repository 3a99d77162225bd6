// The topic shaper as a node (docs/shaping.md): one TopicShaper nodelet per topic of ~topics, in
// this process.
//
//   rosrun overlay_manager topic_shaper _topics:="/robot1/points /robot1/scan"
//   rosrun overlay_manager topic_shaper in:=/robot1/points
//
// ~topics is a space-separated string, or a list whose entries are topic names or mappings
// {topic: NAME, <parameter>: value, ...} (config/shaping.example.yaml); each nodelet is named
// <node>/<topic with '/' -> '_'> and reads the node's other private parameters, overridden by its
// entry's. Without ~topics one nodelet runs under the node's own name (remap `in`).
//
// Each nodelet serves its settings with dynamic_reconfigure in its namespace, which writes them
// there; the node remembers what it wrote (<namespace>/inherited_params, param_inheritance.h), so a
// restart against a running master takes the node's and the entries' parameters as they are now,
// not the values an earlier run left.
#include "overlay_manager/link_aware_stream.h"  // inheritParams
#include "overlay_manager/param_inheritance.h"

#include <nodelet/loader.h>
#include <ros/ros.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

namespace
{
/// glibc's mmap threshold, fixed (bytes). roscpp receives every message of the input into a fresh
/// buffer (a 5.7 MB cloud at 10 Hz is two such buffers per message); glibc's default threshold
/// raises itself to the size of the last mapped block freed and then serves such blocks from a
/// thread arena, where freed ones stayed resident as the arena grew (the RSS stepped up by a cloud at
/// a time). Fixing the threshold turns that adjustment off; at 32 MiB (above any cloud) the buffers
/// come from the arena and are reused there (flat over ten minutes at 8.4 % of a core), where 1 MiB
/// mapped and unmapped each one (flat too, but 15.2 %: page faults). Only the standalone node sets
/// it: a nodelet manager's process is its owner's to tune (docs/shaping.md).
const int kMmapThresholdBytes = 32 << 20;

/// Fixes the allocator's mmap threshold unless the environment sets one (MALLOC_MMAP_THRESHOLD_, or
/// glibc.malloc.mmap_threshold in GLIBC_TUNABLES).
void fixMmapThreshold()
{
#ifdef __GLIBC__
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
      (tunables != nullptr && std::strstr(tunables, "glibc.malloc.mmap_threshold") != nullptr))
    return;
  if (mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes) != 1)
    ROS_WARN("could not set the allocator's mmap threshold to %d bytes: large freed buffers may stay resident",
             kMmapThresholdBytes);
#endif
}

/// One topic to shape and the parameters its entry sets.
struct Entry
{
  std::string topic;
  XmlRpc::XmlRpcValue params;  ///< a struct, or invalid when the entry sets none
};

/// ~topics -> entries; false (with the error) when it is neither a string nor a list of names or
/// mappings with a `topic` string.
bool readEntries(XmlRpc::XmlRpcValue& raw, std::vector<Entry>* out, std::string* error)
{
  if (raw.getType() == XmlRpc::XmlRpcValue::TypeString)
  {
    std::istringstream words(static_cast<std::string>(raw));
    for (std::string t; words >> t;)
      out->push_back({ t, XmlRpc::XmlRpcValue() });
    return true;
  }
  if (raw.getType() != XmlRpc::XmlRpcValue::TypeArray)
  {
    *error = "must be a space-separated string or a list of topics";
    return false;
  }
  for (int i = 0; i < raw.size(); ++i)
  {
    XmlRpc::XmlRpcValue& e = raw[i];
    if (e.getType() == XmlRpc::XmlRpcValue::TypeString)
    {
      out->push_back({ static_cast<std::string>(e), XmlRpc::XmlRpcValue() });
      continue;
    }
    if (e.getType() != XmlRpc::XmlRpcValue::TypeStruct || !e.hasMember("topic") ||
        e["topic"].getType() != XmlRpc::XmlRpcValue::TypeString)
    {
      *error = "entry " + std::to_string(i) + " must be a topic name or a mapping with a 'topic' name";
      return false;
    }
    out->push_back({ static_cast<std::string>(e["topic"]), e });
  }
  return true;
}
}  // namespace

int main(int argc, char** argv)
{
  ros::init(argc, argv, "topic_shaper");
  fixMmapThreshold();
  ros::NodeHandle pnh("~");
  nodelet::Loader loader(false);
  const nodelet::V_string my_argv(argv + 1, argv + argc);
  const char* const kClass = "overlay_manager/TopicShaper";
  std::vector<Entry> entries;
  XmlRpc::XmlRpcValue raw;
  if (pnh.getParam("topics", raw))
  {
    std::string error;
    if (!readEntries(raw, &entries, &error))
    {
      ROS_FATAL("%s/topics: %s", pnh.getNamespace().c_str(), error.c_str());
      return 1;
    }
  }
  if (entries.empty())
  {
    overlay_manager::inheritParams({}, pnh);  // the values an earlier run's reconfigure server left go
    if (!loader.load(ros::this_node::getName(), kClass, ros::names::getRemappings(), my_argv))
    {
      ROS_FATAL("could not load nodelet %s (see the messages above)", kClass);
      return 1;
    }
    ros::spin();
    return 0;
  }
  XmlRpc::XmlRpcValue shared;
  pnh.getParam("", shared);
  for (const Entry& e : entries)
  {
    std::string error;
    if (!ros::names::validate(e.topic, error))
    {
      ROS_FATAL("%s/topics: '%s' is not a ROS name: %s", pnh.getNamespace().c_str(), e.topic.c_str(), error.c_str());
      return 1;
    }
    std::string leaf = ros::names::resolve(e.topic);
    for (char& c : leaf)
      if (c == '/')
        c = '_';
    const std::string name = ros::this_node::getName() + "/" + leaf.substr(1);
    // the node's private parameters, overridden by the entry's, copied into the nodelet's
    // namespace (refreshing the copies and reconfigure values an earlier run left there)
    std::map<std::string, XmlRpc::XmlRpcValue> params;
    if (shared.getType() == XmlRpc::XmlRpcValue::TypeStruct)
      for (auto& kv : shared)
        if (kv.first != "topics" && kv.first != overlay_manager::kInheritedParamsKey &&
            (kv.second.getType() != XmlRpc::XmlRpcValue::TypeStruct || kv.first == "host_aliases"))
          params[kv.first] = kv.second;
    if (e.params.getType() == XmlRpc::XmlRpcValue::TypeStruct)
      for (auto& kv : const_cast<XmlRpc::XmlRpcValue&>(e.params))
        if (kv.first != "topic")
          params[kv.first] = kv.second;
    overlay_manager::inheritParams(params, ros::NodeHandle(name));
    nodelet::M_string remap = ros::names::getRemappings();
    remap[ros::this_node::getName() + "/in"] = ros::names::resolve(e.topic);
    if (!loader.load(name, kClass, remap, my_argv))
    {
      ROS_FATAL("could not load nodelet %s for %s (see the messages above)", kClass, e.topic.c_str());
      return 1;
    }
  }
  ros::spin();
  return 0;
}
