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
// calls for (LinkAwareSubscriberBase, through TieredViewer as compressed_decoder does).
#include "overlay_manager/link_aware_stream.h"
#include "overlay_manager/tiered_viewer.h"
#include "overlay_manager/viewer_decoders.h"

#include <image_transport/simple_publisher_plugin.h>
#include <image_transport/simple_subscriber_plugin.h>
#include <pluginlib/class_list_macros.hpp>
#include <overlay_manager/TierDirectory.h>
#include <sensor_msgs/CompressedImage.h>
#include <std_msgs/Empty.h>

#include <algorithm>
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

/// What the two subscribers share: the viewer (TieredViewer: a decoder per subscription, limits
/// from the viewer's private parameters ~<transport>/max_pixels etc., viewer_decoders.h; for H.264
/// keyframe requests to the publisher) made when the subscription is, following the stream's tiers:
/// it reads the stream's directory (<transport topic>/tiers, latched; only tiered streams publish
/// it) and, when the entry of its own node names another tier's topic, subscribes there (a new
/// decoder, which waits for the tier's next keyframe), keeps showing the old topic until the new one
/// delivers and then leaves it, so the viewer is never without a stream and the publisher never sees
/// it gone (TierFollower). ~<transport>/tiers: false keeps the viewer on the transport topic (the
/// fitted tier). The transport topic's subscription is image_transport's own.
template <class Decoder>
class LinkAwareSubscriberBase : public image_transport::SimpleSubscriberPlugin<sensor_msgs::CompressedImage>
{
public:
  ~LinkAwareSubscriberBase() override { shutdown(); }

  std::string getTopic() const override
  {
    std::lock_guard<std::mutex> lock(viewer_mutex_);
    return viewer_ ? viewer_->topic() : SimpleSubscriberPlugin::getTopic();
  }

  uint32_t getNumPublishers() const override
  {
    std::lock_guard<std::mutex> lock(viewer_mutex_);
    return viewer_ ? viewer_->numPublishers() : SimpleSubscriberPlugin::getNumPublishers();
  }

  void shutdown() override
  {
    std::unique_ptr<TieredViewer<Decoder>> viewer;
    {
      std::lock_guard<std::mutex> lock(viewer_mutex_);
      std::swap(viewer, viewer_);
    }
    if (viewer)
      viewer->stop();  // leaves every tier and the directory
    SimpleSubscriberPlugin::shutdown();
  }

protected:
  /// Makes a subscription's decoder for `topic` (the transport topic or a tier's) with `limits`.
  virtual std::shared_ptr<Decoder> makeDecoder(const std::string& topic, const ImageLimits& limits) = 0;

  /// roscpp's queue for this subscription (the viewer's by default).
  virtual uint32_t queueSize(uint32_t requested) const { return requested; }

  void subscribeImpl(ros::NodeHandle& nh, const std::string& base_topic, uint32_t queue_size, const Callback& callback,
                     const ros::VoidPtr& tracked_object, const image_transport::TransportHints& hints) override
  {
    shutdown();  // a plugin subscribed again starts over
    const std::string topic = nh.resolveName(getTopicToSubscribe(base_topic));
    const ros::NodeHandle params("~" + getTransportName());
    ImageLimits limits;
    try
    {
      limits = readImageLimits(params);
    }
    catch (const std::invalid_argument& e)
    {
      // a plugin must not take the viewer down: say what is wrong and decode with the defaults
      ROS_ERROR("%s; %s decodes with the default limits until this is fixed", e.what(), topic.c_str());
    }
    const uint32_t queue = queueSize(queue_size);
    typename TieredViewer<Decoder>::BaseHooks base;
    ros::NodeHandle base_nh = nh;
    base.subscribe = [this, base_nh, base_topic, queue, callback, tracked_object, hints]() mutable {
      SimpleSubscriberPlugin::subscribeImpl(base_nh, base_topic, queue, callback, tracked_object, hints);
    };
    base.unsubscribe = [this]() { SimpleSubscriberPlugin::shutdown(); };
    base.publishers = [this]() { return SimpleSubscriberPlugin::getNumPublishers(); };
    std::unique_ptr<TieredViewer<Decoder>> viewer(new TieredViewer<Decoder>(
        nh, topic, queue, [this, limits](const std::string& t) { return makeDecoder(t, limits); },
        [callback](const sensor_msgs::ImagePtr& image) { callback(image); }, hints.getRosHints(), tracked_object,
        std::move(base)));
    TieredViewer<Decoder>* v = viewer.get();
    {
      std::lock_guard<std::mutex> lock(viewer_mutex_);
      viewer_ = std::move(viewer);
    }
    v->start(params.param("tiers", true));
  }

  /// The transport topic's messages (image_transport's subscription), through the viewer.
  void internalCallback(const sensor_msgs::CompressedImageConstPtr& message, const Callback& /*user_cb*/) override
  {
    TieredViewer<Decoder>* viewer = nullptr;
    {
      std::lock_guard<std::mutex> lock(viewer_mutex_);
      viewer = viewer_.get();
    }
    // the viewer lives until shutdown(), which waits for this subscription's callback to return
    if (viewer)
      viewer->onMessage(viewer->base(), message);
  }

private:
  mutable std::mutex viewer_mutex_;  ///< guards viewer_ (not held while it subscribes or decodes)
  std::unique_ptr<TieredViewer<Decoder>> viewer_;
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

  std::shared_ptr<H264ViewerDecoder> makeDecoder(const std::string& topic, const ImageLimits& limits) override
  {
    return makeH264ViewerDecoder("bgr8", topic, limits);
  }
};

/// Decodes <image>/link_aware back to sensor_msgs/Image (the raw encoding named in the format when
/// the picture holds it, else what it holds).
class LinkAwareSubscriber : public LinkAwareSubscriberBase<ImageViewerDecoder>
{
public:
  std::string getTransportName() const override { return "link_aware"; }

protected:
  std::shared_ptr<ImageViewerDecoder> makeDecoder(const std::string& topic, const ImageLimits& limits) override
  {
    return std::make_shared<ImageViewerDecoder>(topic, limits);
  }
};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwarePublisher, image_transport::PublisherPlugin)
PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwareSubscriber, image_transport::SubscriberPlugin)
PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwareH264Publisher, image_transport::PublisherPlugin)
PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwareH264Subscriber, image_transport::SubscriberPlugin)
