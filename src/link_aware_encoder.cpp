// Standalone link-aware republisher nodelet, for camera drivers that do not publish through
// image_transport (a driver that does serves the `link_aware` transport itself through this
// package's image_transport plugin: no raw hop to another process). Raw sensor_msgs/Image in,
// sensor_msgs/CompressedImage out, JPEG quality and frame rate fitted to the overlay paths of the
// subscribers (LinkAwareStream).
//
// Topics (relative to the nodelet's namespace)
//   image                         in   sensor_msgs/Image, subscribed only while an output has subscribers
//   image/link_aware              out  sensor_msgs/CompressedImage (compressed_image_transport's format)
//   image/compressed              out  the same messages, for viewers with only the stock compressed
//                                      transport; only while no other node advertises the topic (~compressed)
//   image/link_aware/stream_state out  overlay_manager/StreamState (latched), decisions per subscriber
//
// One publisher per topic: before advertising an output, and every ~check_period while running, it
// asks the master who else publishes it; when another node does (a camera driver using image_transport
// advertises image/compressed, and image/link_aware when this package is installed), it stops its own
// publisher on that topic for good, with one WARN naming the other node.
//
// Parameters (private): compressed (bool, true), check_period (s, 5), and the stream's
// (readStreamOptions: format, png_level, max_rate, min_rate, max_quality, min_quality,
// budget_kbps_<path>, adapt_to_delivery, max_backlog_ms, state_period, peers_topic).
//
// Threads and locks
//   * frame thread (the nodelet's single-threaded queue): image callback and the outputs'
//     connect/disconnect callbacks (both only update memory; see LinkAwareStream). Takes
//     outputs_mutex_ only to copy publisher handles; encodes and publishes without a lock.
//   * the stream's control thread: the hook below (raw (un)subscribe, the master check of the
//     outputs), all blocking calls without outputs_mutex_.
#include "overlay_manager/link_aware_stream.h"
#include "overlay_manager/ros_graph.h"

#include <nodelet/nodelet.h>
#include <pluginlib/class_list_macros.hpp>
#include <ros/ros.h>
#include <sensor_msgs/CompressedImage.h>
#include <sensor_msgs/Image.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

namespace overlay_manager
{

class LinkAwareEncoder : public nodelet::Nodelet
{
public:
  ~LinkAwareEncoder() override
  {
    stream_.reset();  // joins the control thread before the outputs its hook uses go away
  }

private:
  /// One output topic of the stream.
  struct Output
  {
    std::string topic;
    ros::Publisher pub;      ///< empty when not advertised (yielded to another node)
    bool yielded = false;    ///< another node publishes the topic: never advertised again
  };

  void onInit() override
  {
    ros::NodeHandle& nh = getNodeHandle();
    ros::NodeHandle& pnh = getPrivateNodeHandle();
    StreamOptions options;
    try
    {
      options = readStreamOptions(pnh);
    }
    catch (const ParamError& e)
    {
      NODELET_FATAL("%s", e.what());
      throw;
    }
    check_period_ = pnh.param("check_period", 5.0);
    in_topic_ = nh.resolveName("image");
    outputs_.resize(pnh.param("compressed", true) ? 2 : 1);
    outputs_[0].topic = in_topic_ + "/link_aware";
    if (outputs_.size() > 1)
      outputs_[1].topic = in_topic_ + "/compressed";

    {
      std::map<std::string, std::vector<std::string>> pubs;
      if (topicPublishers(&pubs))
        for (const std::string& n : pubs[outputs_[0].topic])
          if (n != ros::this_node::getName())
          {
            NODELET_WARN("%s is served by %s (a camera driver with the link_aware image_transport plugin): this "
                         "republisher does not start (no outputs, no raw input) and is not needed for that camera",
                         outputs_[0].topic.c_str(), n.c_str());
            stepped_aside_ = true;
            return;
          }
    }
    stream_.reset(new LinkAwareStream(nh, outputs_[0].topic, in_topic_, options));
    std::vector<std::string> others;
    for (size_t i = 1; i < outputs_.size(); ++i)
      others.push_back(outputs_[i].topic);
    stream_->setOtherTopics(others);
    checkOutputs();  // before the first advertise: never a second publisher, not even for a moment
    stream_->setControlHook([this] { onControl(); });
    stream_->start();
    NODELET_INFO("link-aware %s: %s -> %s%s", options.format.c_str(), in_topic_.c_str(), outputs_[0].topic.c_str(),
                 outputs_.size() > 1 ? (" and " + outputs_[1].topic).c_str() : "");
  }

  // ---- control thread (and onInit) ----------------------------------------------------------

  void onControl()
  {
    if (!stepped_aside_ && ros::WallTime::now() >= next_check_)
      checkOutputs();
    updateInput();
  }

  /// Advertises the outputs no other node publishes; stops (for good) the ones another node
  /// publishes too, with one WARN each. When another node serves <image>/link_aware (a camera driver
  /// with this package's image_transport plugin), the whole republisher steps aside: outputs,
  /// stream_state and raw input. Master calls: no lock held. Control thread (or onInit).
  void checkOutputs()
  {
    next_check_ = ros::WallTime::now() + ros::WallDuration(check_period_);
    std::map<std::string, std::vector<std::string>> pubs;
    if (!topicPublishers(&pubs))
    {
      NODELET_WARN_THROTTLE(60.0, "the master did not answer getSystemState: outputs not checked for other publishers");
      return;  // nothing advertised blind; the next check retries
    }
    const std::string me = ros::this_node::getName();
    for (size_t i = 0; i < outputs_.size() && !stepped_aside_; ++i)
    {
      Output& o = outputs_[i];
      if (o.yielded)
        continue;
      std::string other;
      for (const std::string& n : pubs[o.topic])
        if (n != me)
          other = n;
      if (other.empty())
      {
        if (!o.pub)
          advertise(o);
        continue;
      }
      if (i == 0)
      {
        NODELET_WARN("%s is served by %s (a camera driver with the link_aware image_transport plugin): this "
                     "republisher steps aside (no outputs, no raw input) and is not needed for that camera",
                     o.topic.c_str(), other.c_str());
        stepped_aside_ = true;
        for (Output& each : outputs_)
          unadvertise(each);
        stream_->stop();
        return;
      }
      const bool had = unadvertise(o);
      NODELET_WARN("%s is published by %s: %s here, so its subscribers get one stream (a camera driver that uses "
                   "image_transport serves it itself; link-aware viewers use %s)",
                   o.topic.c_str(), other.c_str(), had ? "stopped publishing it" : "not publishing it",
                   outputs_[0].topic.c_str());
      std::vector<std::string> rest;
      for (size_t j = 1; j < outputs_.size(); ++j)
        if (!outputs_[j].yielded)
          rest.push_back(outputs_[j].topic);
      stream_->setOtherTopics(rest);
    }
  }

  void advertise(Output& o)
  {
    ros::SubscriberStatusCallback on_connect = [this](const ros::SingleSubscriberPublisher& ssp) {
      stream_->subscriberConnected(ssp.getSubscriberName());
    };
    ros::SubscriberStatusCallback on_disconnect = [this](const ros::SingleSubscriberPublisher& ssp) {
      stream_->subscriberDisconnected(ssp.getSubscriberName());
    };
    ros::Publisher pub = getNodeHandle().advertise<sensor_msgs::CompressedImage>(o.topic, 1, on_connect, on_disconnect);
    std::lock_guard<std::mutex> lock(outputs_mutex_);
    o.pub = pub;
  }

  /// Stops publishing `o` for good; true when it was advertised.
  bool unadvertise(Output& o)
  {
    ros::Publisher old;
    {
      std::lock_guard<std::mutex> lock(outputs_mutex_);
      std::swap(old, o.pub);
      o.yielded = true;
    }
    const bool had = static_cast<bool>(old);
    old.shutdown();  // master call: outside the lock
    return had;
  }

  /// Subscribe to the raw topic while an output has subscribers, unsubscribe when none has.
  void updateInput()
  {
    bool want = false;
    for (const Output& o : copyOutputs())
      want = want || (o.pub && o.pub.getNumSubscribers() > 0);
    if (want && !image_sub_)
    {
      // frames come on the nodelet's own queue, not the control thread's
      image_sub_ = getNodeHandle().subscribe(in_topic_, 1, &LinkAwareEncoder::onImage, this);
      stream_->setInputSubscribed(true);
    }
    else if (!want && image_sub_)
    {
      image_sub_.shutdown();
      image_sub_ = ros::Subscriber();
      stream_->setInputSubscribed(false);
    }
  }

  std::vector<Output> copyOutputs()
  {
    std::lock_guard<std::mutex> lock(outputs_mutex_);
    return outputs_;
  }

  // ---- frame thread ---------------------------------------------------------------------------

  void onImage(const sensor_msgs::ImageConstPtr& img)
  {
    int quality = 0;
    double encode_ms = 0.0;
    sensor_msgs::CompressedImagePtr out = stream_->encode(*img, encoder_, &quality, &encode_ms);
    if (!out)
      return;
    for (const Output& o : copyOutputs())
      if (o.pub && o.pub.getNumSubscribers() > 0)
        o.pub.publish(out);
    stream_->frameSent(out->data.size(), quality, encode_ms, out->format);
  }

  double check_period_ = 5.0;
  std::string in_topic_;
  std::unique_ptr<LinkAwareStream> stream_;
  ImageEncoder encoder_;  ///< frame thread only
  ros::WallTime next_check_;     ///< control thread (onInit before it starts)
  bool stepped_aside_ = false;   ///< another node serves image/link_aware: this republisher is idle

  std::mutex outputs_mutex_;  ///< guards the publisher handles in outputs_ (topics are constant)
  std::vector<Output> outputs_;

  ros::Subscriber image_sub_;  ///< control thread only
};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwareEncoder, nodelet::Nodelet)
