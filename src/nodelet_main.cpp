// Runs this package's nodelets as a standalone node (what `nodelet standalone` does, in one process
// without a manager):
//
//   rosrun overlay_manager link_aware_encoder image:=/camera/image_raw
//   rosrun overlay_manager link_aware_encoder _images:="/front/image_raw /rear/image_raw"
//
// With ~images (space-separated raw topics) one nodelet per topic is loaded in this process, named
// <node>/<topic with '/' -> '_'>, with `image` remapped to the topic; the node's other private
// parameters (budgets, limits, peers_topic, host_aliases, the streams' ~link_aware/ and
// ~link_aware_h264/ namespaces) are copied to every nodelet (run one process per setting to give
// topics different limits).
// NODELET_CLASS is set per executable in CMakeLists.txt.
#include <nodelet/loader.h>
#include <ros/ros.h>

#include <sstream>

int main(int argc, char** argv)
{
  ros::init(argc, argv, NODELET_DEFAULT_NAME);
  ros::NodeHandle pnh("~");
  nodelet::Loader loader(false);  // no manager services: the nodelets live in this process only
  const nodelet::V_string my_argv(argv + 1, argv + argc);
  std::string images;
  pnh.param<std::string>("images", images, "");
  std::vector<std::string> topics;
  std::istringstream words(images);
  for (std::string t; words >> t;)
    topics.push_back(t);
  if (topics.empty())
  {
    if (!loader.load(ros::this_node::getName(), NODELET_CLASS, ros::names::getRemappings(), my_argv))
    {
      ROS_FATAL("could not load nodelet %s (see the messages above)", NODELET_CLASS);
      return 1;
    }
  }
  XmlRpc::XmlRpcValue shared;
  pnh.getParam("", shared);  // the node's private parameters, copied below
  for (const std::string& topic : topics)
  {
    std::string leaf = ros::names::resolve(topic);
    for (char& c : leaf)
      if (c == '/')
        c = '_';
    const std::string name = ros::this_node::getName() + "/" + leaf.substr(1);
    ros::NodeHandle child(name);
    if (shared.getType() == XmlRpc::XmlRpcValue::TypeStruct)
      for (auto& kv : shared)
        if (kv.first != "images" && (kv.second.getType() != XmlRpc::XmlRpcValue::TypeStruct ||
                                     kv.first == "link_aware" || kv.first == "link_aware_h264" ||
                                     kv.first == "host_aliases"))
          child.setParam(kv.first, kv.second);  // always: a restart with new values must not keep old ones
    nodelet::M_string remap = ros::names::getRemappings();
    // a nodelet's `image` resolves in the parent namespace of its name, i.e. this node's name
    remap[ros::this_node::getName() + "/image"] = ros::names::resolve(topic);
    if (!loader.load(name, NODELET_CLASS, remap, my_argv))
    {
      ROS_FATAL("could not load nodelet %s for %s (see the messages above)", NODELET_CLASS, topic.c_str());
      return 1;
    }
  }
  ros::spin();
  return 0;
}
