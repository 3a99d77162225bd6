// Runs one of this package's nodelets as a standalone node (what `nodelet standalone` does, in one
// process without a manager): `rosrun overlay_manager link_aware_encoder image:=/camera/image_raw`.
// NODELET_CLASS is set per executable in CMakeLists.txt.
#include <nodelet/loader.h>
#include <ros/ros.h>

int main(int argc, char** argv)
{
  ros::init(argc, argv, NODELET_DEFAULT_NAME);
  nodelet::Loader loader(false);  // no manager services: one nodelet in this process
  const nodelet::M_string remappings(ros::names::getRemappings());
  const nodelet::V_string my_argv(argv + 1, argv + argc);
  if (!loader.load(ros::this_node::getName(), NODELET_CLASS, remappings, my_argv))
  {
    ROS_FATAL("could not load nodelet %s (see the messages above)", NODELET_CLASS);
    return 1;
  }
  ros::spin();
  return 0;
}
