// Decoder nodelet: sensor_msgs/CompressedImage (compressed_image_transport's format, e.g. the
// link-aware stream) back to a raw sensor_msgs/Image, for viewers and machines without the
// image_transport plugins (any raw subscriber, web bridges).
//
// Topics (relative to the nodelet's namespace), named like image_transport's republish:
//   in/<transport>  in   sensor_msgs/CompressedImage, subscribed only while `out` has subscribers
//   out             out  sensor_msgs/Image in the raw encoding named by the format (rgb8 stays rgb8)
// Parameter ~transport: compressed (default), link_aware or link_aware_h264 (H.264 from the first
// keyframe on; a lost reference waits for the next keyframe, asked for on
// in/link_aware_h264/keyframe_request). Limits: ~max_message_bytes, ~max_width, ~max_height,
// ~max_pixels, ~max_nal_units (viewer_decoders.h, docs/camera.md "Limits").
//
// Threads: connect callbacks and frames both run on the nodelet's single-threaded queue; the
// decoder's libturbojpeg handle is used from that thread only.
#include "overlay_manager/viewer_decoders.h"

#include <nodelet/nodelet.h>
#include <pluginlib/class_list_macros.hpp>
#include <ros/ros.h>
#include <sensor_msgs/CompressedImage.h>
#include <sensor_msgs/Image.h>
#include <std_msgs/Empty.h>

#include <memory>
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
    ImageLimits limits;
    try
    {
      limits = readImageLimits(getPrivateNodeHandle());
    }
    catch (const std::invalid_argument& e)
    {
      NODELET_FATAL("%s", e.what());
      throw;
    }
    if (h264_)
    {
      h264_decoder_.reset(new H264ViewerDecoder("rgb8", in_topic_, limits));
      request_pub_ = nh.advertise<std_msgs::Empty>(keyframeRequestTopic(in_topic_), 1);
      ros::Publisher pub = request_pub_;
      h264_decoder_->setKeyframeRequest([pub]() { pub.publish(std_msgs::Empty()); });
    }
    else
      decoder_.reset(new ImageViewerDecoder(in_topic_, limits));
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
      // H.264: a dropped message costs every picture until the next keyframe; a third of a second
      // of queue absorbs a busy moment (the subscriber plugin does the same)
      sub_ = getNodeHandle().subscribe(in_topic_, h264_ ? 10 : 1, &CompressedDecoder::onImage, this);
    else if (!want && sub_)
    {
      sub_.shutdown();
      sub_ = ros::Subscriber();
    }
  }

  void onImage(const sensor_msgs::CompressedImageConstPtr& msg)
  {
    sensor_msgs::ImagePtr image = h264_ ? h264_decoder_->decode(*msg) : decoder_->decode(*msg);
    if (image)
      pub_.publish(image);
  }

  std::mutex mutex_;  ///< guards sub_ and pub_ set-up against connect callbacks
  std::string in_topic_;
  ros::Publisher pub_;
  ros::Subscriber sub_;
  ros::Publisher request_pub_;  ///< link_aware_h264: keyframe requests to the publisher
  bool h264_ = false;
  std::unique_ptr<ImageViewerDecoder> decoder_;      ///< compressed, link_aware
  std::unique_ptr<H264ViewerDecoder> h264_decoder_;  ///< link_aware_h264
};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::CompressedDecoder, nodelet::Nodelet)
