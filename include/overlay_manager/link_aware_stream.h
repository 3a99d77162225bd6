// One link-aware image stream (see the class): the image layer over the shaping core. Settings
// (StreamOptions, read from parameters and changed live by dynamic_reconfigure), the codec of the
// stream's format as a shaper (image_shapers.h), and the shaped topic (shaped_topic.h) that does
// subscribers, paths, delivery feedback, tiers and stream_state.
//
// Shared by the image_transport plugins (inside a camera driver) and the standalone republisher
// nodelet: the owner advertises each tier's topic, forwards connect/disconnect events with the tier
// and hands every raw frame to offer(). Threads and locks: shaped_topic.h.
#ifndef OVERLAY_MANAGER_LINK_AWARE_STREAM_H
#define OVERLAY_MANAGER_LINK_AWARE_STREAM_H

#include "overlay_manager/image_rules.h"
#include "overlay_manager/image_shapers.h"
#include "overlay_manager/shaped_topic.h"
#include "overlay_manager/stream_policy.h"
#include "overlay_manager/subscriber_hosts.h"

#include <ros/ros.h>
#include <sensor_msgs/CompressedImage.h>
#include <sensor_msgs/Image.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace overlay_manager
{

/// A parameter with a value the stream cannot use; the message names the parameter and the fix.
class ParamError : public std::runtime_error
{
public:
  explicit ParamError(const std::string& what) : std::runtime_error(what) {}
};

/// Settings of one stream (parameter names in docs/camera.md). Rates in Hz, bitrates in kbit/s.
struct StreamOptions
{
  std::string format = "jpeg";  ///< jpeg | png | h264
  int png_level = 3;            ///< zlib level 1..9 (png)
  int gop = 30;                 ///< h264: keyframe interval (frames)
  /// h264: x264's constant rate factor under the bitrate cap ("capped CRF"; 0 = average bitrate
  /// at the cap instead). See H264Params::crf.
  double crf = 23.0;
  /// h264: the rate factor of a tier nothing limits (its subscribers' paths have no budget and no
  /// delivery cap: the full tier on self/direct paths), so it carries full quality; 0 = crf.
  double full_crf = 16.0;
  PolicyParams policy;
  bool adapt_to_delivery = true;  ///< lower a subscriber's budget when its connection backs up
  double max_backlog_ms = 200.0;  ///< unsent bytes (in ms of stream) that count as backing up
  /// budgeted connections paced at this x their budget; 0 = off (kDefaultStreamPacingFactor)
  double pacing_factor = kDefaultStreamPacingFactor;
  double state_period = 1.0;      ///< s between stream_state messages (delivery is checked every 0.5 s)
  std::string peers_topic;        ///< overlay node's ~peers; "" = find it (ros_graph.h)
  HostAliases host_aliases;       ///< ~host_aliases: subscriber host -> machine short name
  /// largest picture encoded (max_width, max_height, max_pixels); a bigger frame is refused
  ImageLimits limits;
  /// ~tiers: serve a full tier (<topic>/full, for subscribers whose path has no budget) beside the
  /// fitted one (<topic>); the transports' subscriber plugin reads <topic>/tiers and switches.
  /// false: one stream on <topic>, fitted to every subscriber.
  bool tiers = true;
};

/// ~host_aliases (a mapping host -> machine short name, as the overlay node's); throws ParamError
/// naming the bad entry.
HostAliases readHostAliases(const ros::NodeHandle& pnh);

/// Reads StreamOptions from `params` (format, png_level, max_rate, min_rate, max_quality, min_quality,
/// budget_kbps_<path>, adapt_to_delivery, max_backlog_ms, state_period, peers_topic, tiers, max_width,
/// max_height, max_pixels; h264: gop, crf, full_crf, max_video_kbps, min_video_kbps, video_share). `format`
/// non-empty fixes the format (the h264 transport) instead of reading it. Throws ParamError naming
/// the parameter.
StreamOptions readStreamOptions(const ros::NodeHandle& params, const std::string& format = "");

/// The parameters directly under `nh`'s namespace, name -> value (none when it has none).
std::map<std::string, XmlRpc::XmlRpcValue> paramsIn(const ros::NodeHandle& nh);

/// Before a stream reads its options from `stream` (its own namespace): copies the `shared`
/// parameters there where the user does not set them, refreshes the copies and dynamic_reconfigure
/// values an earlier run of the node left there, and removes those whose shared key is gone
/// (param_inheritance.h; what the node wrote is remembered in <stream>/inherited_params). `shared`
/// empty: only the leftovers of an earlier run go (the transports, whose streams share nothing).
void inheritParams(const std::map<std::string, XmlRpc::XmlRpcValue>& shared, const ros::NodeHandle& stream);

/// Runs `start_server`, which starts a dynamic_reconfigure server in `ns` (the server writes its
/// values there), then records in <ns>/inherited_params the keys the node owns there: those it owned
/// before and those the server added (param_inheritance.h), which inheritParams refreshes or removes
/// at the next start instead of taking them for the user's.
void startRecordingServerParams(const ros::NodeHandle& ns, const std::function<void()>& start_server);

class LinkAwareStream;

/// Starts `stream`'s dynamic_reconfigure server (LinkAwareJpeg or LinkAwareH264 by its format) in
/// `params`' namespace, on `params`' callback queue, seeded with the stream's settings now; its
/// changes go to applySettings(). The server lives as long as the returned handle
/// (src/stream_reconfigure.cpp).
std::shared_ptr<void> startReconfigure(LinkAwareStream& stream, const ros::NodeHandle& params);

/// One link-aware image stream: a shaped topic (shaped_topic.h) of raw images with the codec of its
/// format (image_shapers.h: JPEG/PNG or H.264), its settings (parameters and dynamic_reconfigure)
/// and, with `tiers` on, a full tier (<topic>/full) beside the fitted one (<topic>).
class LinkAwareStream
{
public:
  /// Publishes one tier's message (the owner's publisher of topicOf(tier)).
  using PublishFn = std::function<void(const std::string& tier, const sensor_msgs::CompressedImagePtr& message)>;

  /// `nh`: where stream_state, the tier directory and ~peers subscriptions are made (its callback
  /// queue is not used); `topic`: the resolved output topic (its fitted tier); `input_topic`: the
  /// raw topic it encodes (for stream_state). Advertises stream_state; start() starts the control thread.
  LinkAwareStream(const ros::NodeHandle& nh, const std::string& topic, const std::string& input_topic,
                  const StreamOptions& options);
  ~LinkAwareStream();
  LinkAwareStream(const LinkAwareStream&) = delete;
  LinkAwareStream& operator=(const LinkAwareStream&) = delete;

  /// Starts the control thread and the reconfigure server: call once, after setControlHook/setOtherTopics.
  void start();

  /// Stops for good: stream_state unadvertised, ~peers unsubscribed, no more hook calls or decisions.
  /// Control thread (from the hook) only: the standalone republisher steps aside with it when another
  /// node serves the same stream.
  void stop();
  bool stopped() const { return shaped_->stopped(); }

  /// The settings the stream started with (live changes: settings()).
  const StreamOptions& options() const { return initial_options_; }
  /// The settings now (a copy: reconfigure may change them from the control thread).
  StreamOptions settings() const;

  /// Namespace of the stream's parameters and of its dynamic_reconfigure server (default: the
  /// topic, as the plugins read them; the republisher gives ~link_aware / ~link_aware_h264). Call
  /// before start().
  void setParamNamespace(const std::string& ns) { param_ns_ = ns; }

  /// New live settings (the reconfigure server's callback, on the control thread): the policy's
  /// limits and budgets apply at once; crf, gop and png_level from the next frame (a new gop reopens
  /// the H.264 encoder: a keyframe); adapt_to_delivery and max_backlog_ms at the next delivery check.
  /// The format, limits, tiers, peers_topic and host_aliases are fixed for the stream's life.
  void applySettings(const StreamOptions& updated);
  const std::string& topic() const { return shaped_->topic(); }
  /// The tiers the stream serves ({""} without tiers, else {"fitted", "full"}; the first is topic()).
  const std::vector<std::string>& tierNames() const { return shaped_->tierNames(); }
  /// Output topic of `tier`.
  std::string topicOf(const std::string& tier) const { return shaped_->topicOf(tier); }

  /// Runs on the control thread after every subscriber change and every state period (before the
  /// decision is made). The standalone republisher (un)subscribes its raw input and checks its
  /// outputs there. Set before start().
  void setControlHook(std::function<void()> hook) { shaped_->setControlHook(std::move(hook)); }
  /// Topics the fitted tier also goes out on (their connections count for delivery, their names go
  /// into stream_state's other_topics). Control thread or before the first subscriber.
  void setOtherTopics(const std::vector<std::string>& topics) { shaped_->setOtherTopics(topics); }

  // ---- any thread, never blocks on I/O ----
  void subscriberConnected(const std::string& tier, const std::string& node) { shaped_->subscriberConnected(tier, node); }
  void subscriberDisconnected(const std::string& tier, const std::string& node)
  {
    shaped_->subscriberDisconnected(tier, node);
  }
  /// Whether the owner reads its raw input now (for stream_state).
  void setInputSubscribed(bool subscribed) { shaped_->setInputSubscribed(subscribed); }

  // ---- frame thread (one frame at a time) ----
  /// One raw frame through every tier with subscribers (ShapedTopic::offer): a frame image_rules.h
  /// refuses is never read (logged once per kind, then throttled); each tier encodes it when due
  /// under its decision and `publish` sends it to that tier's topic.
  void offer(const sensor_msgs::Image& image, const PublishFn& publish);

private:
  ImageCodecSettings codecSettings() const;

  const StreamOptions initial_options_;
  std::string param_ns_;               ///< parameters and reconfigure server ("" = topic)
  std::shared_ptr<void> reconfigure_;  ///< the dynamic_reconfigure server (stream_reconfigure.cpp)
  mutable std::mutex mutex_;           ///< guards options_
  StreamOptions options_;              ///< the settings now (applySettings)
  std::unique_ptr<TierShapers<sensor_msgs::Image, sensor_msgs::CompressedImage>> shapers_;  ///< frame thread
  std::unique_ptr<ShapedTopic> shaped_;
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_LINK_AWARE_STREAM_H
