// One viewer of a link-aware stream: its subscriptions, a decoder per subscription and, for tiered
// streams, following the stream's directory (TierFollower, tier_follower.h). Shared by the
// image_transport subscriber plugins (link_aware_transport.cpp, whose base subscription is
// image_transport's own: BaseHooks) and the compressed_decoder nodelet (which subscribes to
// everything itself). `Decoder` is H264ViewerDecoder or ImageViewerDecoder (viewer_decoders.h).
//
// Threads: message callbacks run on the node handle's queue, one at a time per subscription (each
// subscription has its own decoder, used by that subscription's callbacks only); start and stop
// on the owner's thread; the subscription map is guarded by a mutex never held during master calls.
#ifndef OVERLAY_MANAGER_TIERED_VIEWER_H
#define OVERLAY_MANAGER_TIERED_VIEWER_H

#include "overlay_manager/tier_follower.h"

#include <ros/ros.h>
#include <sensor_msgs/CompressedImage.h>
#include <sensor_msgs/Image.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace overlay_manager
{

template <class Decoder>
class TieredViewer
{
public:
  /// A fresh decoder for a subscription to `topic`.
  using MakeDecoder = std::function<std::shared_ptr<Decoder>(const std::string& topic)>;
  /// Hands a decoded picture to the viewer.
  using Show = std::function<void(const sensor_msgs::ImagePtr&)>;
  /// The base topic's subscription when the owner makes it (image_transport's own); its messages
  /// come in through onMessage(base, ...).
  struct BaseHooks
  {
    std::function<void()> subscribe;
    std::function<void()> unsubscribe;
    std::function<uint32_t()> publishers;
  };

  /// `base`: the transport topic (resolved). `queue_size`, `hints`, `tracked_object`: those of
  /// every subscription this viewer makes.
  TieredViewer(const ros::NodeHandle& nh, const std::string& base, uint32_t queue_size, MakeDecoder make_decoder,
               Show show, const ros::TransportHints& hints = ros::TransportHints(),
               const ros::VoidConstPtr& tracked_object = ros::VoidConstPtr(), BaseHooks base_hooks = BaseHooks())
    : nh_(nh)
    , base_(base)
    , queue_size_(queue_size)
    , make_decoder_(std::move(make_decoder))
    , show_(std::move(show))
    , hints_(hints)
    , tracked_object_(tracked_object)
    , base_hooks_(std::move(base_hooks))
  {
  }

  ~TieredViewer() { stop(); }

  TieredViewer(const TieredViewer&) = delete;
  TieredViewer& operator=(const TieredViewer&) = delete;

  /// Subscribes to the base topic and, with `follow_tiers`, follows the stream's directory.
  void start(bool follow_tiers)
  {
    open(base_);
    if (!follow_tiers)
      return;
    TierFollower::Hooks hooks;
    hooks.open = [this](const std::string& topic) { open(topic); };
    hooks.close = [this](const std::string& topic) { close(topic); };
    hooks.publishers = [this](const std::string& topic) { return publishers(topic); };
    std::unique_ptr<TierFollower> follower(new TierFollower(nh_, base_, std::move(hooks)));
    follower->start();
    std::lock_guard<std::mutex> lock(mutex_);
    follower_ = std::move(follower);
  }

  /// Leaves the directory and every topic (a message callback running now finishes first).
  void stop()
  {
    std::unique_ptr<TierFollower> follower;
    std::map<std::string, Subscription> subs;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::swap(follower, follower_);
    }
    if (follower)
      follower->stop();  // no more moves
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::swap(subs, subs_);
    }
    for (auto& kv : subs)
      if (kv.first == base_ && base_hooks_.unsubscribe)
        base_hooks_.unsubscribe();
      else
        kv.second.sub.shutdown();
  }

  /// A message of `topic` (the base's through here when the owner subscribes to it): decoded and
  /// shown when it is the topic shown (TierFollowState), else dropped.
  void onMessage(const std::string& topic, const sensor_msgs::CompressedImageConstPtr& message)
  {
    std::shared_ptr<Decoder> decoder;
    TierFollower* follower = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = subs_.find(topic);
      if (it == subs_.end())
        return;  // left
      decoder = it->second.decoder;
      follower = follower_.get();
    }
    // the follower lives until stop(), which waits for this subscription's callback to return
    if (follower && !follower->onMessage(topic))
      return;
    sensor_msgs::ImagePtr image = decoder->decode(*message);
    if (image)
      show_(image);
  }

  /// The topic read now (the base or a tier's).
  std::string topic() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return follower_ ? follower_->current() : base_;
  }

  const std::string& base() const { return base_; }  ///< the transport topic

  /// Publishers of the topic read now.
  uint32_t numPublishers() const { return publishers(topic()); }

private:
  struct Subscription
  {
    ros::Subscriber sub;  ///< empty for the base topic when the owner subscribes to it
    std::shared_ptr<Decoder> decoder;
  };

  void open(const std::string& topic)
  {
    std::shared_ptr<Decoder> decoder = make_decoder_(topic);  // may advertise (H.264 keyframe requests)
    {
      // the decoder first: the first message (a tier's keyframe) may come before subscribe returns
      std::lock_guard<std::mutex> lock(mutex_);
      subs_[topic].decoder = decoder;
    }
    ros::Subscriber sub;
    if (topic == base_ && base_hooks_.subscribe)
      base_hooks_.subscribe();
    else
      sub = nh_.subscribe<sensor_msgs::CompressedImage>(
          topic, queue_size_,
          boost::function<void(const sensor_msgs::CompressedImageConstPtr&)>(
              [this, topic](const sensor_msgs::CompressedImageConstPtr& m) { onMessage(topic, m); }),
          tracked_object_, hints_);
    std::lock_guard<std::mutex> lock(mutex_);
    subs_[topic].sub = sub;
  }

  void close(const std::string& topic)
  {
    Subscription s;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = subs_.find(topic);
      if (it == subs_.end())
        return;
      s = std::move(it->second);
      subs_.erase(it);
    }
    if (topic == base_ && base_hooks_.unsubscribe)
      base_hooks_.unsubscribe();
    else
      s.sub.shutdown();
  }

  uint32_t publishers(const std::string& topic) const
  {
    if (topic == base_ && base_hooks_.publishers)
      return base_hooks_.publishers();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = subs_.find(topic);
    return it == subs_.end() ? 0 : it->second.sub.getNumPublishers();
  }

  ros::NodeHandle nh_;
  const std::string base_;
  const uint32_t queue_size_;
  const MakeDecoder make_decoder_;
  const Show show_;
  const ros::TransportHints hints_;
  const ros::VoidConstPtr tracked_object_;
  const BaseHooks base_hooks_;

  mutable std::mutex mutex_;  ///< guards subs_ and follower_
  std::map<std::string, Subscription> subs_;
  std::unique_ptr<TierFollower> follower_;
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_TIERED_VIEWER_H
