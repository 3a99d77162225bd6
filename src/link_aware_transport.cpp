// image_transport plugins of the `link_aware` and `link_aware_h264` transports: a camera driver that publishes through
// image_transport::ImageTransport serves <image>/link_aware itself (sensor_msgs/CompressedImage,
// compressed_image_transport's JPEG format, quality and rate fitted to the overlay paths of its
// subscribers), beside raw and compressed, with no raw hop to another process; viewers subscribe with
// `_image_transport:=link_aware` and get sensor_msgs/Image back.
//
// Publisher: parameters under <image>/link_aware/ (the names of readStreamOptions, e.g.
// /camera/image_raw/link_aware/budget_kbps_derp); decisions on <image>/link_aware/stream_state.
// image_transport calls publish() only while the topic has subscribers, so an unwatched camera costs
// nothing but an idle control thread. Threads: publish() runs on the driver's thread(s) and encodes
// there (one frame at a time, encode_mutex_); connect/disconnect callbacks run on the driver's
// spinner and only update memory; master look-ups, ~peers and delivery checks run on the stream's
// own control thread (LinkAwareStream), so a driver never waits on them.
//
// link_aware_h264: <image>/link_aware_h264, sensor_msgs/CompressedImage with format "h264", data one
// H.264 Annex B access unit per message (keyframes carry SPS/PPS), header copied from the raw image;
// parameters under <image>/link_aware_h264/, decisions on <image>/link_aware_h264/stream_state. The
// encoder's bitrate follows the budget on the fly; a new subscriber gets a keyframe with the next
// frame; while a subscriber's connection is backed up frames are not encoded at all (decodable).
//
// Tiers (the stream parameter `tiers`, default true): the publisher also advertises <transport topic>/full, and
// the subscriber follows the stream's directory (<transport topic>/tiers) to the tier its path
// calls for (LinkAwareSubscriberBase).
#include "overlay_manager/link_aware_stream.h"
#include "overlay_manager/viewer_decoders.h"

#include <image_transport/simple_publisher_plugin.h>
#include <image_transport/simple_subscriber_plugin.h>
#include <pluginlib/class_list_macros.hpp>
#include <overlay_manager/TierDirectory.h>
#include <sensor_msgs/CompressedImage.h>
#include <std_msgs/Empty.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>

namespace overlay_manager
{
namespace
{
/// roscpp queue of an H.264 subscription at least (messages; 10 = 1/3 s at 30 Hz)
const uint32_t kH264ViewerQueue = 10;
}  // namespace

/// What the two publishers share: the stream (subscribers, tiers, paths, decisions, stream_state)
/// made from the parameters under the transport's topic, the connect/disconnect callbacks of each
/// tier's topic, and one frame at a time through the stream's shapers. The fitted tier goes out on
/// the transport's topic (image_transport's own publisher), every other tier (the full one) on a
/// publisher of its own; getNumSubscribers counts them all, so image_transport hands frames over
/// while any tier has subscribers. A transport adds its name and its stream format.
class LinkAwarePublisherBase : public image_transport::SimplePublisherPlugin<sensor_msgs::CompressedImage>
{
public:
  ~LinkAwarePublisherBase() override
  {
    shutdown();       // no more connect callbacks
    stream_.reset();  // then the control thread ends
  }

  uint32_t getNumSubscribers() const override
  {
    uint32_t n = SimplePublisherPlugin::getNumSubscribers();
    for (const auto& kv : tier_pubs_)
      n += kv.second.getNumSubscribers();
    return n;
  }

  void shutdown() override
  {
    for (auto& kv : tier_pubs_)
      kv.second.shutdown();
    SimplePublisherPlugin::shutdown();
  }

protected:
  /// The stream format readStreamOptions reads the parameters for ("" = JPEG/PNG, "h264").
  virtual std::string streamFormat() const = 0;

  /// roscpp's per-subscriber queue for this transport (the caller's by default).
  virtual uint32_t queueSize(uint32_t requested, const StreamOptions& /*options*/) const { return requested; }

  void advertiseImpl(ros::NodeHandle& nh, const std::string& base_topic, uint32_t queue_size,
                     const image_transport::SubscriberStatusCallback& user_connect_cb,
                     const image_transport::SubscriberStatusCallback& user_disconnect_cb,
                     const ros::VoidPtr& tracked_object, bool latch) override
  {
    const std::string topic = nh.resolveName(getTopicToAdvertise(base_topic));
    StreamOptions options;
    options.format = streamFormat().empty() ? options.format : streamFormat();
    try
    {
      // the values an earlier run's reconfigure server left there are not the user's
      inheritParams({}, ros::NodeHandle(topic));
      options = readStreamOptions(ros::NodeHandle(topic), streamFormat());
    }
    catch (const ParamError& e)
    {
      // a plugin must not take the camera driver down: say what is wrong and stream with the defaults
      ROS_ERROR("%s; %s uses the default settings until this is fixed", e.what(), topic.c_str());
    }
    stream_.reset(new LinkAwareStream(nh, topic, nh.resolveName(base_topic), options));
    base_tier_ = stream_->tierNames().front();
    const uint32_t queue = queueSize(queue_size, options);
    LinkAwareStream* stream = stream_.get();
    for (const std::string& tier : stream_->tierNames())
    {
      if (tier == base_tier_)
        continue;
      ros::SubscriberStatusCallback on_connect = [stream, tier](const ros::SingleSubscriberPublisher& ssp) {
        stream->subscriberConnected(tier, ssp.getSubscriberName());
      };
      ros::SubscriberStatusCallback on_disconnect = [stream, tier](const ros::SingleSubscriberPublisher& ssp) {
        stream->subscriberDisconnected(tier, ssp.getSubscriberName());
      };
      tier_pubs_[tier] = nh.advertise<sensor_msgs::CompressedImage>(stream_->topicOf(tier), queue, on_connect,
                                                                    on_disconnect, tracked_object, latch);
    }
    stream_->start();
    SimplePublisherPlugin::advertiseImpl(nh, base_topic, queue, user_connect_cb, user_disconnect_cb, tracked_object,
                                         latch);
  }

  void connectCallback(const ros::SingleSubscriberPublisher& pub) override
  {
    if (stream_)
      stream_->subscriberConnected(base_tier_, pub.getSubscriberName());  // H.264: also a keyframe
  }

  void disconnectCallback(const ros::SingleSubscriberPublisher& pub) override
  {
    if (stream_)
      stream_->subscriberDisconnected(base_tier_, pub.getSubscriberName());
  }

  void publish(const sensor_msgs::Image& message, const PublishFn& publish_fn) const override
  {
    if (!stream_)
      return;
    std::lock_guard<std::mutex> lock(encode_mutex_);
    stream_->offer(message, [&](const std::string& tier, const sensor_msgs::CompressedImagePtr& out) {
      if (tier == base_tier_)
        publish_fn(*out);
      else
      {
        auto it = tier_pubs_.find(tier);
        if (it != tier_pubs_.end())
          it->second.publish(out);
      }
    });
  }

  std::unique_ptr<LinkAwareStream> stream_;
  std::string base_tier_;
  std::map<std::string, ros::Publisher> tier_pubs_;  ///< tiers other than the base; fixed after advertiseImpl
  mutable std::mutex encode_mutex_;  ///< one frame at a time through the stream's shapers
};

/// The link_aware (JPEG) publisher.
class LinkAwarePublisher : public LinkAwarePublisherBase
{
public:
  std::string getTransportName() const override { return "link_aware"; }

protected:
  std::string streamFormat() const override { return ""; }
};

/// The link_aware_h264 publisher.
class LinkAwareH264Publisher : public LinkAwarePublisherBase
{
public:
  std::string getTransportName() const override { return "link_aware_h264"; }

protected:
  std::string streamFormat() const override { return "h264"; }

  uint32_t queueSize(uint32_t requested, const StreamOptions& options) const override
  {
    // roscpp drops the oldest message of a full per-subscriber queue, which would break the
    // decoder's reference chain: a queue of a second of video absorbs bursts, and the stream stops
    // encoding (decodably) long before it fills (max_backlog_ms of unsent bytes)
    return std::max<uint32_t>(requested, static_cast<uint32_t>(options.policy.max_rate_hz) + 1);
  }
};

/// What the two subscribers share: a decoder made when the subscription is (limits from the
/// viewer's private parameters ~<transport>/max_pixels etc., viewer_decoders.h), its log, the
/// keyframe request publisher (H.264), and following the stream's tiers: the plugin reads the
/// stream's directory (<transport topic>/tiers, latched; only tiered streams publish it) and, when
/// the entry of its own node names another tier's topic, subscribes there (a new decoder, which
/// waits for the tier's next keyframe) and leaves the old one when the first message of the new
/// one arrives, so the viewer is never without a stream and the publisher never sees it gone.
/// Messages of the subscription it is leaving are dropped. ~<transport>/tiers: false keeps the
/// viewer on the transport topic (the fitted tier).
template <class Decoder>
class LinkAwareSubscriberBase : public image_transport::SimpleSubscriberPlugin<sensor_msgs::CompressedImage>
{
public:
  std::string getTopic() const override
  {
    std::lock_guard<std::mutex> lock(switch_mutex_);
    return current_.empty() ? SimpleSubscriberPlugin::getTopic() : current_;
  }

  uint32_t getNumPublishers() const override
  {
    std::lock_guard<std::mutex> lock(switch_mutex_);
    return on_tier_ ? tier_sub_.getNumPublishers() : SimpleSubscriberPlugin::getNumPublishers();
  }

  void shutdown() override
  {
    check_timer_.stop();
    directory_sub_.shutdown();
    ros::Subscriber tier, leaving;
    {
      std::lock_guard<std::mutex> lock(switch_mutex_);
      std::swap(tier, tier_sub_);
      std::swap(leaving, leaving_);
      on_tier_ = false;
    }
    tier.shutdown();
    leaving.shutdown();
    request_pub_.shutdown();
    SimpleSubscriberPlugin::shutdown();
  }

protected:
  /// Makes the subscription's decoder for `topic` (the transport topic) with `limits`.
  virtual std::unique_ptr<Decoder> makeDecoder(const std::string& topic, const ImageLimits& limits) = 0;

  /// roscpp's queue for this subscription (the viewer's by default).
  virtual uint32_t queueSize(uint32_t requested) const { return requested; }

  void subscribeImpl(ros::NodeHandle& nh, const std::string& base_topic, uint32_t queue_size, const Callback& callback,
                     const ros::VoidPtr& tracked_object, const image_transport::TransportHints& hints) override
  {
    const std::string topic = nh.resolveName(getTopicToSubscribe(base_topic));
    const ros::NodeHandle params("~" + getTransportName());
    try
    {
      limits_ = readImageLimits(params);
    }
    catch (const std::invalid_argument& e)
    {
      // a plugin must not take the viewer down: say what is wrong and decode with the defaults
      ROS_ERROR("%s; %s decodes with the default limits until this is fixed", e.what(), topic.c_str());
    }
    {
      std::lock_guard<std::mutex> lock(decoder_mutex_);
      decoder_ = makeDecoder(topic, limits_);
    }
    nh_ = nh;
    base_topic_ = base_topic;
    queue_size_ = queueSize(queue_size);
    callback_ = callback;
    tracked_object_ = tracked_object;
    hints_ = hints;
    {
      std::lock_guard<std::mutex> lock(switch_mutex_);
      base_ = topic;
      current_ = topic;
      on_tier_ = false;
      arrived_ = true;
    }
    SimpleSubscriberPlugin::subscribeImpl(nh, base_topic, queue_size_, callback, tracked_object, hints);
    base_subscribed_ = true;
    if (params.param("tiers", true))
    {
      directory_sub_ = nh_.subscribe<TierDirectory>(topic + "/tiers", 1, &LinkAwareSubscriberBase::onDirectory, this);
      check_timer_ = nh_.createWallTimer(ros::WallDuration(1.0), &LinkAwareSubscriberBase::onCheck, this);
    }
  }

  /// The base subscription's messages (image_transport's); dropped once the viewer reads a tier.
  void internalCallback(const sensor_msgs::CompressedImageConstPtr& message, const Callback& user_cb) override
  {
    {
      std::lock_guard<std::mutex> lock(switch_mutex_);
      if (on_tier_)
        return;
    }
    arrivedOnCurrent();
    deliver(message, user_cb);
  }

  void deliver(const sensor_msgs::CompressedImageConstPtr& message, const Callback& user_cb)
  {
    sensor_msgs::ImagePtr image;
    {
      std::lock_guard<std::mutex> lock(decoder_mutex_);
      if (decoder_)
        image = decoder_->decode(*message);
    }
    if (image)
      user_cb(image);
  }

  std::mutex decoder_mutex_;  ///< a re-subscription swaps the decoder while a callback may run
  std::unique_ptr<Decoder> decoder_;
  ros::Publisher request_pub_;

private:
  /// The stream's directory: the topic this node should read (the base when it is not listed).
  void onDirectory(const TierDirectoryConstPtr& dir)
  {
    const std::string me = ros::this_node::getName();
    std::string target, base, current;
    {
      std::lock_guard<std::mutex> lock(switch_mutex_);
      base = base_;
      current = current_;
    }
    target = base;
    std::string path;
    for (const TierEntry& e : dir->entries)
      if (e.node == me && !e.topic.empty())
      {
        target = e.topic;
        path = e.path;
      }
    if (target != current)
      switchTo(target, path);
  }

  /// Every second: a tier whose publisher has been gone for kOrphanS (the camera driver restarted
  /// without tiers, or another node now publishes the transport topic) sends the viewer back to the
  /// transport topic.
  void onCheck(const ros::WallTimerEvent&)
  {
    std::string base;
    bool orphan = false;
    {
      std::lock_guard<std::mutex> lock(switch_mutex_);
      base = base_;
      if (on_tier_ && tier_sub_.getNumPublishers() == 0)
      {
        const ros::WallTime now = ros::WallTime::now();
        if (orphan_since_.isZero())
          orphan_since_ = now;
        orphan = (now - orphan_since_).toSec() >= kOrphanS;
      }
      else
        orphan_since_ = ros::WallTime();
    }
    if (orphan)
      switchTo(base, "");
  }

  /// Reads `target` from now on (the base topic or a tier's).
  void switchTo(const std::string& target, const std::string& path)
  {
    std::string base, current;
    {
      std::lock_guard<std::mutex> lock(switch_mutex_);
      base = base_;
      current = current_;
      orphan_since_ = ros::WallTime();
    }
    // the new subscription first (master calls: no lock held), then the old one goes
    ros::Subscriber next;
    if (target != base)
      next = nh_.subscribe<sensor_msgs::CompressedImage>(
          target, queue_size_,
          boost::function<void(const sensor_msgs::CompressedImageConstPtr&)>(
              [this, target](const sensor_msgs::CompressedImageConstPtr& m) { onTierMessage(target, m); }),
          tracked_object_, hints_.getRosHints());
    std::unique_ptr<Decoder> decoder = makeDecoder(target, limits_);  // may advertise: no lock held
    {
      std::lock_guard<std::mutex> lock(decoder_mutex_);
      decoder_.swap(decoder);  // the new stream starts at its next keyframe
    }
    const bool was_on_tier = current != base;
    if (target == base && !base_subscribed_)
    {
      SimpleSubscriberPlugin::subscribeImpl(nh_, base_topic_, queue_size_, callback_, tracked_object_, hints_);
      base_subscribed_ = true;
    }
    ros::Subscriber dropped;
    {
      std::lock_guard<std::mutex> lock(switch_mutex_);
      if (was_on_tier)
      {
        std::swap(dropped, leaving_);  // a tier left before is dropped now
        leaving_ = tier_sub_;          // leaves once the new topic delivers
      }
      tier_sub_ = next;
      current_ = target;
      on_tier_ = target != base;
      leave_base_ = !was_on_tier;
      arrived_ = false;
    }
    dropped.shutdown();
    if (path.empty())
      ROS_INFO("%s: reading %s again (the tier's publisher is gone)", base.c_str(), target.c_str());
    else
      ROS_INFO("%s: reading %s (the tier for path %s, from %s/tiers)", base.c_str(), target.c_str(), path.c_str(),
               base.c_str());
  }

  void onTierMessage(const std::string& topic, const sensor_msgs::CompressedImageConstPtr& message)
  {
    {
      std::lock_guard<std::mutex> lock(switch_mutex_);
      if (!on_tier_ || current_ != topic)
        return;
    }
    arrivedOnCurrent();
    deliver(message, callback_);
  }

  /// The topic read now delivered: the one it left goes (master calls: no lock held).
  void arrivedOnCurrent()
  {
    ros::Subscriber leaving;
    bool leave_base = false;
    {
      std::lock_guard<std::mutex> lock(switch_mutex_);
      if (arrived_)
        return;
      arrived_ = true;
      std::swap(leaving, leaving_);
      leave_base = leave_base_ && on_tier_;
      leave_base_ = false;
    }
    leaving.shutdown();
    if (leave_base && base_subscribed_)
    {
      base_subscribed_ = false;
      SimpleSubscriberPlugin::shutdown();  // getTopic() answers current_
    }
  }

  // set in subscribeImpl (the viewer's thread), read by the directory callback (the viewer's queue)
  ros::NodeHandle nh_;
  std::string base_topic_;
  uint32_t queue_size_ = 1;
  Callback callback_;
  ros::VoidPtr tracked_object_;
  image_transport::TransportHints hints_;
  ImageLimits limits_;
  ros::Subscriber directory_sub_;
  ros::WallTimer check_timer_;
  /// s a tier may be without a publisher before the viewer goes back to the transport topic
  static constexpr double kOrphanS = 2.0;

  /// the base topic is subscribed (image_transport's subscription); the viewer's callback thread(s)
  std::atomic<bool> base_subscribed_{ false };

  mutable std::mutex switch_mutex_;  ///< guards the members below
  std::string base_, current_;       ///< the transport topic and the topic read now
  bool on_tier_ = false;             ///< reading a tier other than the base
  bool arrived_ = true;              ///< the topic read now has delivered since the switch
  bool leave_base_ = false;          ///< leave the base topic once the tier delivers
  ros::WallTime orphan_since_;       ///< since when the tier read has no publisher (zero: it has one)
  ros::Subscriber tier_sub_;         ///< the tier read now (on_tier_)
  ros::Subscriber leaving_;          ///< the tier being left, until the new topic delivers
};

/// Decodes <image>/link_aware_h264 to sensor_msgs/Image (bgr8). Frames before the first keyframe
/// and after a lost reference are dropped until the next keyframe, which it asks the publisher for:
/// never a smeared picture.
class LinkAwareH264Subscriber : public LinkAwareSubscriberBase<H264ViewerDecoder>
{
public:
  std::string getTransportName() const override { return "link_aware_h264"; }

protected:
  /// image_view, rqt_image_view and republish subscribe with a queue of 1: roscpp then drops a
  /// message whenever the viewer falls one frame behind, and a dropped H.264 frame costs every
  /// picture until the next keyframe. A third of a second of queue absorbs a busy moment; decoding
  /// catches up at about 1 ms a frame.
  uint32_t queueSize(uint32_t requested) const override { return std::max<uint32_t>(requested, kH264ViewerQueue); }

  std::unique_ptr<H264ViewerDecoder> makeDecoder(const std::string& topic, const ImageLimits& limits) override
  {
    std::unique_ptr<H264ViewerDecoder> d(new H264ViewerDecoder("bgr8", topic, limits));
    request_pub_ = ros::NodeHandle().advertise<std_msgs::Empty>(keyframeRequestTopic(topic), 1);
    ros::Publisher pub = request_pub_;
    d->setKeyframeRequest([pub]() { pub.publish(std_msgs::Empty()); });
    return d;
  }

};

/// Decodes <image>/link_aware back to sensor_msgs/Image (the raw encoding named in the format when
/// the picture holds it, else what it holds).
class LinkAwareSubscriber : public LinkAwareSubscriberBase<ImageViewerDecoder>
{
public:
  std::string getTransportName() const override { return "link_aware"; }

protected:
  std::unique_ptr<ImageViewerDecoder> makeDecoder(const std::string& topic, const ImageLimits& limits) override
  {
    return std::unique_ptr<ImageViewerDecoder>(new ImageViewerDecoder(topic, limits));
  }

};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwarePublisher, image_transport::PublisherPlugin)
PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwareSubscriber, image_transport::SubscriberPlugin)
PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwareH264Publisher, image_transport::PublisherPlugin)
PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwareH264Subscriber, image_transport::SubscriberPlugin)
