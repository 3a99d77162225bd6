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
//   image/link_aware_h264         out  H.264, one Annex B access unit per sensor_msgs/CompressedImage
//                                      (format "h264"), bitrate from the same budgets (~h264, default true)
//   image/link_aware_h264/stream_state  its decisions
//   image/link_aware/full, image/link_aware_h264/full (+ /stream_state) and <stream>/tiers
//                                      the full tier and the tier directory (the streams' tiers
//                                      parameter, default true; docs/camera.md, "Shaping core and tiers")
//
// One publisher per topic: before advertising an output, and every ~check_period while running, it
// asks the master who else publishes it; when another node does (a camera driver using image_transport
// advertises image/compressed, and image/link_aware when this package is installed), it stops its own
// publisher on that topic for good, with one WARN naming the other node.
//
// Parameters (private): compressed (bool, true), h264 (bool, true), check_period (s, 5), and the streams'
// (readStreamOptions: format, png_level, max_rate, min_rate, max_quality, min_quality,
// budget_kbps_<path>, adapt_to_delivery, max_backlog_ms, state_period, peers_topic, limits; h264:
// gop, crf, max_video_kbps, min_video_kbps, video_share). Each stream reads its own namespace,
// ~link_aware/ (JPEG) and ~link_aware_h264/ (H.264), where its dynamic_reconfigure server lives
// too; a parameter set directly under ~ applies to both streams unless set in theirs. The copies the
// node makes there (and its reconfigure servers' values) are remembered in <stream>/inherited_params
// and follow the shared value at every start, also with a master that outlived the node
// (param_inheritance.h); what the user sets in a stream's namespace is kept.
//
// Threads and locks
//   * frame thread (the nodelet's single-threaded queue): image callback and the outputs'
//     connect/disconnect callbacks (both only update memory; see LinkAwareStream). Takes
//     outputs_mutex_ only to copy publisher handles; encodes and publishes without a lock.
//   * the streams' control threads (one per stream): the hook below (raw (un)subscribe, the master
//     check of the outputs) under control_mutex_ (which frames never take), all blocking calls
//     without outputs_mutex_.
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
    // join the control threads before the outputs their hook uses go away
    h264_stream_.reset();
    jpeg_stream_.reset();
  }

private:
  /// One output topic.
  struct Output
  {
    std::string topic;
    LinkAwareStream* stream = nullptr;  ///< the stream it carries
    std::string tier;                   ///< the tier of the stream it carries
    ros::Publisher pub;                 ///< empty when not advertised (yielded to another node)
    bool yielded = false;               ///< another node publishes the topic: never advertised again
  };

  void onInit() override
  {
    ros::NodeHandle& nh = getNodeHandle();
    ros::NodeHandle& pnh = getPrivateNodeHandle();
    StreamOptions jpeg_options, h264_options;
    const ros::NodeHandle jpeg_params(pnh, "link_aware"), h264_params(pnh, "link_aware_h264");
    try
    {
      std::map<std::string, XmlRpc::XmlRpcValue> shared = paramsIn(pnh);  // not the streams' namespaces
      shared.erase("link_aware");
      shared.erase("link_aware_h264");
      inheritParams(shared, jpeg_params);
      inheritParams(shared, h264_params);
      jpeg_options = readStreamOptions(jpeg_params);
      h264_options = readStreamOptions(h264_params, "h264");
    }
    catch (const ParamError& e)
    {
      NODELET_FATAL("%s", e.what());
      throw;
    }
    check_period_ = pnh.param("check_period", 5.0);
    in_topic_ = nh.resolveName("image");
    const std::string main_topic = in_topic_ + "/link_aware";
    {
      std::map<std::string, std::vector<std::string>> pubs;
      if (topicPublishers(&pubs))
        for (const std::string& n : pubs[main_topic])
          if (n != ros::this_node::getName())
          {
            NODELET_WARN("%s is served by %s (a camera driver with the link_aware image_transport plugin): this "
                         "republisher does not start (no outputs, no raw input) and is not needed for that camera",
                         main_topic.c_str(), n.c_str());
            stepped_aside_ = true;
            return;
          }
    }
    jpeg_stream_.reset(new LinkAwareStream(nh, main_topic, in_topic_, jpeg_options));
    jpeg_stream_->setParamNamespace(jpeg_params.getNamespace());
    addOutputs(jpeg_stream_.get());  // outputs_[0]: main_topic, the JPEG stream's base tier
    if (pnh.param("h264", true))
    {
      h264_stream_.reset(new LinkAwareStream(nh, in_topic_ + "/link_aware_h264", in_topic_, h264_options));
      h264_stream_->setParamNamespace(h264_params.getNamespace());
      addOutputs(h264_stream_.get());
    }
    if (pnh.param("compressed", true))
    {
      outputs_.push_back(Output());
      outputs_.back().topic = in_topic_ + "/compressed";
      outputs_.back().stream = jpeg_stream_.get();
      outputs_.back().tier = jpeg_stream_->tierNames().front();
      jpeg_stream_->setOtherTopics({outputs_.back().topic});
    }
    {
      std::lock_guard<std::mutex> lock(control_mutex_);
      checkOutputs();  // before the first advertise: never a second publisher, not even for a moment
    }
    for (LinkAwareStream* s : {jpeg_stream_.get(), h264_stream_.get()})
      if (s)
      {
        s->setControlHook([this] { onControl(); });
        s->start();
      }
    std::string topics;
    for (const Output& o : outputs_)
      topics += " " + o.topic;
    NODELET_INFO("link-aware %s: %s ->%s", jpeg_options.format.c_str(), in_topic_.c_str(), topics.c_str());
  }

  /// One output per tier of `stream`, its base tier first.
  void addOutputs(LinkAwareStream* stream)
  {
    for (const std::string& tier : stream->tierNames())
    {
      outputs_.push_back(Output());
      outputs_.back().topic = stream->topicOf(tier);
      outputs_.back().stream = stream;
      outputs_.back().tier = tier;
    }
  }

  // ---- control threads (and onInit) ---------------------------------------------------------

  void onControl()
  {
    std::lock_guard<std::mutex> lock(control_mutex_);
    if (!stepped_aside_ && ros::WallTime::now() >= next_check_)
      checkOutputs();
    updateInput();
  }

  /// Advertises the outputs no other node publishes; stops (for good) the ones another node
  /// publishes too, with one WARN each. When another node serves <image>/link_aware (a camera driver
  /// with this package's image_transport plugin), the whole republisher steps aside: outputs,
  /// stream_state and raw input. Master calls: no lock frames need is held.
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
        for (LinkAwareStream* s : {jpeg_stream_.get(), h264_stream_.get()})
          if (s)
            s->stop();
        return;
      }
      const bool had = unadvertise(o);
      NODELET_WARN("%s is published by %s: %s here, so its subscribers get one stream (a camera driver that uses "
                   "image_transport serves it itself; link-aware viewers use %s)",
                   o.topic.c_str(), other.c_str(), had ? "stopped publishing it" : "not publishing it",
                   outputs_[0].topic.c_str());
      if (o.stream == h264_stream_.get())
      {
        for (Output& each : outputs_)  // the H.264 stream's other tiers go with it
          if (each.stream == h264_stream_.get())
            unadvertise(each);
        h264_stream_->stop();
      }
      else if (o.stream == jpeg_stream_.get() && o.topic != jpeg_stream_->topic() &&
               o.topic != jpeg_stream_->topicOf(o.tier))
        jpeg_stream_->setOtherTopics({});
    }
  }

  void advertise(Output& o)
  {
    LinkAwareStream* stream = o.stream;
    const std::string tier = o.tier;
    ros::SubscriberStatusCallback on_connect = [stream, tier](const ros::SingleSubscriberPublisher& ssp) {
      stream->subscriberConnected(tier, ssp.getSubscriberName());
    };
    ros::SubscriberStatusCallback on_disconnect = [stream, tier](const ros::SingleSubscriberPublisher& ssp) {
      stream->subscriberDisconnected(tier, ssp.getSubscriberName());
    };
    // h264: a queue of a second of video (roscpp drops the oldest message of a full queue, which
    // would break the decoders' reference chain; the stream stops encoding long before)
    const uint32_t queue =
        o.stream == h264_stream_.get() ? static_cast<uint32_t>(o.stream->options().policy.max_rate_hz) + 1 : 1;
    ros::Publisher pub =
        getNodeHandle().advertise<sensor_msgs::CompressedImage>(o.topic, queue, on_connect, on_disconnect);
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
      // frames come on the nodelet's own queue, not a control thread's
      image_sub_ = getNodeHandle().subscribe(in_topic_, 1, &LinkAwareEncoder::onImage, this);
    }
    else if (!want && image_sub_)
    {
      image_sub_.shutdown();
      image_sub_ = ros::Subscriber();
    }
    for (LinkAwareStream* s : {jpeg_stream_.get(), h264_stream_.get()})
      if (s)
        s->setInputSubscribed(static_cast<bool>(image_sub_));
  }

  std::vector<Output> copyOutputs()
  {
    std::lock_guard<std::mutex> lock(outputs_mutex_);
    return outputs_;
  }

  // ---- frame thread ---------------------------------------------------------------------------

  /// The one loop per stream (LinkAwareStream::offer): every tier with subscribers encodes the
  /// frame when due, and it goes out on that tier's outputs.
  void onImage(const sensor_msgs::ImageConstPtr& img)
  {
    const std::vector<Output> outputs = copyOutputs();
    for (LinkAwareStream* stream : { jpeg_stream_.get(), h264_stream_.get() })
    {
      if (!stream || stream->stopped())
        continue;
      stream->offer(*img, [&](const std::string& tier, const sensor_msgs::CompressedImagePtr& out) {
        for (const Output& o : outputs)
          if (o.pub && o.stream == stream && o.tier == tier)
            o.pub.publish(out);
      });
    }
  }

  double check_period_ = 5.0;
  std::string in_topic_;
  std::unique_ptr<LinkAwareStream> jpeg_stream_, h264_stream_;

  std::mutex control_mutex_;     ///< serialises the control hook of both streams (frames never take it)
  ros::WallTime next_check_;     ///< under control_mutex_
  bool stepped_aside_ = false;   ///< another node serves image/link_aware: this republisher is idle
  ros::Subscriber image_sub_;    ///< under control_mutex_

  std::mutex outputs_mutex_;  ///< guards the publisher handles in outputs_ (topics and streams are constant)
  std::vector<Output> outputs_;
};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwareEncoder, nodelet::Nodelet)
