// Decoder nodelet: sensor_msgs/CompressedImage (compressed_image_transport's format, e.g. the
// link-aware stream) back to a raw sensor_msgs/Image, for viewers and machines without the
// image_transport plugins (any raw subscriber, web bridges).
//
// Topics (relative to the nodelet's namespace), named like image_transport's republish:
//   in/<transport>  in   sensor_msgs/CompressedImage, subscribed only while `out` has subscribers
//   out             out  sensor_msgs/Image in the raw encoding named by the format (rgb8 stays rgb8)
// Parameter ~transport: compressed (default), link_aware or link_aware_h264 (H.264 from the first
// keyframe on; a lost reference waits for the next keyframe).
//
// Threads: connect callbacks and frames both run on the nodelet's single-threaded queue; the
// decoder's libturbojpeg handle is used from that thread only.
#include "overlay_manager/image_codec.h"
#include "overlay_manager/link_aware_stream.h"

#include <nodelet/nodelet.h>
#include <pluginlib/class_list_macros.hpp>
#include <ros/ros.h>
#include <sensor_msgs/CompressedImage.h>
#include <sensor_msgs/Image.h>

#include <mutex>
#include <stdexcept>

namespace overlay_manager
{

class CompressedDecoder : public nodelet::Nodelet
{
private:
  void onInit() override
  {
    ros::NodeHandle& nh = getNodeHandle();
    const std::string transport = getPrivateNodeHandle().param<std::string>("transport", "compressed");
    if (transport != "compressed" && transport != "link_aware" && transport != "link_aware_h264")
    {
      NODELET_FATAL("~transport: '%s' is not compressed, link_aware or link_aware_h264", transport.c_str());
      throw std::invalid_argument("~transport must be compressed, link_aware or link_aware_h264, got '" + transport +
                                  "'");
    }
    h264_ = transport == "link_aware_h264";
    in_topic_ = nh.resolveName("in") + "/" + transport;
    ros::SubscriberStatusCallback cb = boost::bind(&CompressedDecoder::onConnection, this);
    std::lock_guard<std::mutex> lock(mutex_);
    pub_ = nh.advertise<sensor_msgs::Image>("out", 1, cb, cb);
    NODELET_INFO("decoding %s -> %s", in_topic_.c_str(), pub_.getTopic().c_str());
  }

  /// Subscribe to the compressed topic while the raw output has subscribers.
  void onConnection()
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool want = pub_.getNumSubscribers() > 0;
    if (want && !sub_)
      sub_ = getNodeHandle().subscribe(in_topic_, 1, &CompressedDecoder::onImage, this);
    else if (!want && sub_)
    {
      sub_.shutdown();
      sub_ = ros::Subscriber();
    }
  }

  void onImage(const sensor_msgs::CompressedImageConstPtr& msg)
  {
    if (h264_)
    {
      sensor_msgs::ImagePtr image = decodeH264(*msg, h264_decoder_, in_topic_);
      if (image)
        pub_.publish(image);
      return;
    }
    try
    {
      pub_.publish(decoder_.decode(*msg));
    }
    catch (const std::exception& e)
    {
      NODELET_ERROR_THROTTLE(10.0, "%s: %s", in_topic_.c_str(), e.what());
    }
  }

  std::mutex mutex_;  ///< guards sub_ and pub_ set-up against connect callbacks
  std::string in_topic_;
  ros::Publisher pub_;
  ros::Subscriber sub_;
  ImageDecoder decoder_;
  bool h264_ = false;
  H264Decoder h264_decoder_{"rgb8"};
};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::CompressedDecoder, nodelet::Nodelet)
