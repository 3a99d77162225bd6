// Decoder nodelet: sensor_msgs/CompressedImage (compressed_image_transport's format, e.g. the
// link-aware stream) back to a raw sensor_msgs/Image, for viewers and machines without the
// image_transport plugins (any raw subscriber, web bridges).
//
// Topics (relative to the nodelet's namespace), named like image_transport's republish:
//   in/<transport>  in   sensor_msgs/CompressedImage, subscribed only while `out` has subscribers
//   out             out  sensor_msgs/Image in the raw encoding named by the format (rgb8 stays rgb8)
// Parameter ~transport: compressed (default), link_aware or link_aware_h264 (H.264 from the first
// keyframe on; a lost reference waits for the next keyframe, asked for on the keyframe_request topic
// next to the topic it reads). Limits: ~max_message_bytes, ~max_width, ~max_height, ~max_pixels,
// ~max_nal_units (viewer_decoders.h, docs/camera.md "Limits").
//
// Tiers: with link_aware or link_aware_h264 it follows the stream's directory (in/<transport>/tiers)
// to the tier its node's path calls for, as the image_transport subscriber plugins do (TieredViewer,
// TierFollower): a direct decoder reads the full tier while a relayed viewer reads the fitted one.
// ~tiers (default true): false keeps it on in/<transport> (the fitted tier).
//
// Threads: connect callbacks, the directory and frames all run on the nodelet's single-threaded
// queue; each subscription's decoder (libturbojpeg or libavcodec) is used from that thread only.
#include "overlay_manager/tiered_viewer.h"
#include "overlay_manager/viewer_decoders.h"

#include <nodelet/nodelet.h>
#include <pluginlib/class_list_macros.hpp>
#include <ros/ros.h>
#include <sensor_msgs/Image.h>

#include <memory>
#include <mutex>
#include <stdexcept>

namespace overlay_manager
{

class CompressedDecoder : public nodelet::Nodelet
{
public:
  ~CompressedDecoder() override
  {
    // the connect callbacks go with the publisher, then no subscription outlives the viewer
    pub_.shutdown();
    std::lock_guard<std::mutex> lock(mutex_);
    h264_viewer_.reset();
    image_viewer_.reset();
  }

private:
  void onInit() override
  {
    ros::NodeHandle& nh = getNodeHandle();
    ros::NodeHandle& pnh = getPrivateNodeHandle();
    const std::string transport = pnh.param<std::string>("transport", "compressed");
    if (transport != "compressed" && transport != "link_aware" && transport != "link_aware_h264")
    {
      NODELET_FATAL("~transport: '%s' is not compressed, link_aware or link_aware_h264", transport.c_str());
      throw std::invalid_argument("~transport must be compressed, link_aware or link_aware_h264, got '" + transport +
                                  "'");
    }
    h264_ = transport == "link_aware_h264";
    // only the link-aware streams have tiers
    follow_tiers_ = transport != "compressed" && pnh.param("tiers", true);
    in_topic_ = nh.resolveName("in") + "/" + transport;
    try
    {
      limits_ = readImageLimits(pnh);
    }
    catch (const std::invalid_argument& e)
    {
      NODELET_FATAL("%s", e.what());
      throw;
    }
    ros::SubscriberStatusCallback cb = boost::bind(&CompressedDecoder::onConnection, this);
    std::lock_guard<std::mutex> lock(mutex_);
    pub_ = nh.advertise<sensor_msgs::Image>("out", 1, cb, cb);
    NODELET_INFO("decoding %s -> %s%s", in_topic_.c_str(), pub_.getTopic().c_str(),
                 follow_tiers_ ? " (following its tiers)" : "");
  }

  /// Reads the compressed topic (and its tiers) while the raw output has subscribers.
  void onConnection()
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool want = pub_.getNumSubscribers() > 0;
    const bool reading = h264_viewer_ || image_viewer_;
    if (want && !reading)
    {
      ros::NodeHandle nh = getNodeHandle();
      const ImageLimits limits = limits_;
      ros::Publisher pub = pub_;
      auto show = [pub](const sensor_msgs::ImagePtr& image) { pub.publish(image); };
      if (h264_)
      {
        // a dropped message costs every picture until the next keyframe; a third of a second of
        // queue absorbs a busy moment (the subscriber plugin does the same)
        h264_viewer_.reset(new TieredViewer<H264ViewerDecoder>(
            nh, in_topic_, 10,
            [nh, limits](const std::string& topic) { return makeH264ViewerDecoder("rgb8", topic, limits, nh); },
            show));
        h264_viewer_->start(follow_tiers_);
      }
      else
      {
        image_viewer_.reset(new TieredViewer<ImageViewerDecoder>(
            nh, in_topic_, 1,
            [limits](const std::string& topic) { return std::make_shared<ImageViewerDecoder>(topic, limits); },
            show));
        image_viewer_->start(follow_tiers_);
      }
    }
    else if (!want && reading)
    {
      h264_viewer_.reset();  // leaves every topic and the directory
      image_viewer_.reset();
    }
  }

  std::mutex mutex_;  ///< guards pub_ set-up and the viewers against connect callbacks
  std::string in_topic_;
  bool h264_ = false;
  bool follow_tiers_ = true;
  ImageLimits limits_;
  ros::Publisher pub_;
  std::unique_ptr<TieredViewer<H264ViewerDecoder>> h264_viewer_;  ///< link_aware_h264, while `out` has subscribers
  std::unique_ptr<TieredViewer<ImageViewerDecoder>> image_viewer_;  ///< compressed, link_aware
};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::CompressedDecoder, nodelet::Nodelet)
