// One link-aware image stream: its subscribers, the overlay path to each, what delivery to them
// looks like, the policy's decision (quality, rate, budget) and its stream_state topic.
//
// Shared by the image_transport publisher plugin (inside a camera driver) and the standalone
// republisher nodelet: the owner advertises the stream's topic, forwards connect/disconnect events
// and, per frame, asks admitFrame() for the decision and reports frameSent().
//
// Threads and locks
//   * frame thread(s) (the owner's): admitFrame, frameSent. They take mutex_ only to read the
//     decision and record a frame; no I/O under it.
//   * any thread: subscriberConnected/-Disconnected update the subscriber map under mutex_ and post
//     the work to the control thread; they never block on I/O (a camera driver calls them from its
//     own spinner).
//   * control thread (own callback queue + one-thread AsyncSpinner): finding the overlay node, ~peers,
//     master lookups of subscribers' machines, this process's bus info and each connection's socket
//     counters (the delivery timer, every 0.5 s: unsent bytes and bytes acknowledged), the state
//     timer and the owner's hook. It does the blocking work without mutex_ and swaps the
//     results in under it. Nothing logs or calls the master while holding mutex_. A master that hangs
//     stalls this thread (stream_state stops), never the frames: they go on with the last decision.
#ifndef OVERLAY_MANAGER_LINK_AWARE_STREAM_H
#define OVERLAY_MANAGER_LINK_AWARE_STREAM_H

#include "overlay_manager/h264_codec.h"
#include "overlay_manager/image_codec.h"
#include "overlay_manager/image_rules.h"
#include "overlay_manager/problem_log.h"
#include "overlay_manager/stream_policy.h"
#include "overlay_manager/subscriber_hosts.h"

#include <overlay_manager/PeerList.h>
#include <ros/callback_queue.h>
#include <ros/ros.h>
#include <sensor_msgs/CompressedImage.h>
#include <sensor_msgs/Image.h>
#include <std_msgs/Empty.h>

#include <atomic>
#include <functional>
#include <limits>
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
  PolicyParams policy;
  bool adapt_to_delivery = true;  ///< lower a subscriber's budget when its connection backs up
  double max_backlog_ms = 200.0;  ///< unsent bytes (in ms of stream) that count as backing up
  double state_period = 1.0;      ///< s between stream_state messages (delivery is checked every 0.5 s)
  std::string peers_topic;        ///< overlay node's ~peers; "" = find it (ros_graph.h)
  HostAliases host_aliases;       ///< ~host_aliases: subscriber host -> machine short name
  /// largest picture encoded (max_width, max_height, max_pixels); a bigger frame is refused
  ImageLimits limits;
};

/// ~host_aliases (a mapping host -> machine short name, as the overlay node's); throws ParamError
/// naming the bad entry.
HostAliases readHostAliases(const ros::NodeHandle& pnh);

/// Reads StreamOptions from `params` (format, png_level, max_rate, min_rate, max_quality, min_quality,
/// budget_kbps_<path>, adapt_to_delivery, max_backlog_ms, state_period, peers_topic, max_width,
/// max_height, max_pixels; h264: gop, crf, max_video_kbps, min_video_kbps, video_share). `format`
/// non-empty fixes the format (the h264 transport) instead of reading it. Throws ParamError naming
/// the parameter.
StreamOptions readStreamOptions(const ros::NodeHandle& params, const std::string& format = "");

class LinkAwareStream;

/// Starts `stream`'s dynamic_reconfigure server (LinkAwareJpeg or LinkAwareH264 by its format) in
/// `params`' namespace, on `params`' callback queue, seeded with the stream's settings now; its
/// changes go to applySettings(). The server lives as long as the returned handle
/// (src/stream_reconfigure.cpp).
std::shared_ptr<void> startReconfigure(LinkAwareStream& stream, const ros::NodeHandle& params);

class LinkAwareStream
{
public:
  /// `nh`: where stream_state and ~peers subscriptions are made (its callback queue is not used);
  /// `topic`: the resolved output topic (decisions on topic + "/stream_state"); `input_topic`: the
  /// raw topic it encodes (for stream_state). Advertises stream_state; start() starts the control thread.
  LinkAwareStream(const ros::NodeHandle& nh, const std::string& topic, const std::string& input_topic,
                  const StreamOptions& options);
  ~LinkAwareStream();
  LinkAwareStream(const LinkAwareStream&) = delete;
  LinkAwareStream& operator=(const LinkAwareStream&) = delete;

  /// Starts the control thread: call once, after setControlHook/setOtherTopics.
  void start();

  /// Stops for good: stream_state unadvertised, ~peers unsubscribed, no more hook calls or decisions.
  /// Control thread (from the hook) only: the standalone republisher steps aside with it when another
  /// node serves the same stream.
  void stop();

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
  /// The format, limits, peers_topic and host_aliases are fixed for the stream's life.
  void applySettings(const StreamOptions& updated);
  const std::string& topic() const { return topic_; }

  /// Runs on the control thread after every subscriber change and every state period (before the
  /// decision is made). The standalone republisher (un)subscribes its raw input and checks its
  /// outputs there. Set before the first subscriber connects.
  void setControlHook(std::function<void()> hook) { hook_ = std::move(hook); }
  /// Topics the same stream also goes out on (their connections count for delivery, their names go
  /// into stream_state's other_topics). Control thread or before the first subscriber.
  void setOtherTopics(const std::vector<std::string>& topics);

  // ---- any thread, never blocks on I/O ----
  void subscriberConnected(const std::string& node);
  void subscriberDisconnected(const std::string& node);
  /// Whether the owner reads its raw input now (for stream_state).
  void setInputSubscribed(bool subscribed) { input_subscribed_ = subscribed; }

  // ---- frame thread ----
  /// Counts an arriving raw frame; true when it is due under the decided rate, with the decided
  /// JPEG quality in *quality.
  bool admitFrame(int* quality);
  /// Records a frame published: its size, the quality it was encoded at, encode time and format.
  void frameSent(size_t bytes, int quality, double encode_ms, const std::string& format, bool keyframe = false);
  /// admitFrame + encode (jpeg at the decided quality, or png) into a new message; null when the frame
  /// is not due or cannot be encoded. A frame image_rules.h refuses (an encoding the transports do
  /// not take, a layout that lies about its size, a picture over the limits) is never read: the
  /// problem is logged once per kind (then throttled with a count) and the next frame goes on.
  /// The caller publishes and calls frameSent.
  sensor_msgs::CompressedImagePtr encode(const sensor_msgs::Image& image, ImageEncoder& encoder, int* quality,
                                         double* encode_ms);
  /// The same for h264: admitFrame (which also skips frames while a subscriber's connection is backed
  /// up: a frame never encoded leaves every decoder's reference chain whole), the encoder's bitrate
  /// set on the fly from the budget (no reopen), a keyframe when a subscriber connected or a backlog
  /// cleared, one Annex B access unit per message (format "h264", header copied).
  sensor_msgs::CompressedImagePtr encodeH264(const sensor_msgs::Image& image, H264Encoder& encoder, bool* keyframe,
                                             double* encode_ms);

private:
  struct Sub;
  /// One subscriber's connections as the kernel sees them (readDelivery).
  struct Delivery
  {
    uint32_t unsent_bytes = 0;  ///< largest unsent queue of its connections (SIOCOUTQNSD)
    uint64_t acked_bytes = 0;   ///< bytes acknowledged by its peer, summed (TCP_INFO)
    /// largest round trip above its minimum (ms, TCP_INFO rtt - min_rtt); NaN = unknown
    double queue_delay_ms = std::numeric_limits<double>::quiet_NaN();
  };
  void post(std::function<void()> fn);
  void onChange();
  void onTimer(const ros::WallTimerEvent&);
  void onPeers(const PeerListConstPtr& msg);
  void ensurePeers();
  void resolveAndDecide();
  void observeDelivery();
  bool readDelivery(std::map<std::string, Delivery>* out);
  void onDeliveryCheck(const ros::WallTimerEvent&);
  void onRecheck(const ros::WallTimerEvent&);
  void resumeLocked();
  void publishState();
  void onKeyframeRequest(const std_msgs::EmptyConstPtr&);
  /// True (and the problem logged through frame_log_) when image_rules.h refuses `image`.
  bool refuses(const sensor_msgs::Image& image);

  // configuration (set in the constructor, read-only afterwards)
  const StreamOptions initial_options_;
  const std::string topic_, input_topic_, own_host_;
  std::function<void()> hook_;
  std::string param_ns_;                  ///< parameters and reconfigure server ("" = topic_)
  std::shared_ptr<void> reconfigure_;     ///< the dynamic_reconfigure server (stream_reconfigure.cpp)

  // control thread only
  ros::CallbackQueue control_queue_;
  ros::NodeHandle control_nh_;
  std::unique_ptr<ros::AsyncSpinner> spinner_;
  ros::Publisher state_pub_;
  ros::Subscriber peers_sub_;
  ros::Subscriber keyframe_sub_;  ///< h264: viewers' keyframe requests
  ros::WallTimer timer_;
  ros::WallTimer delivery_timer_;  ///< delivery checks (adapt_to_delivery)
  ros::WallTimer recheck_timer_;  ///< h264: backlog re-checks while frames are skipped
  ros::WallTime next_discovery_, peers_subscribed_at_;
  bool warned_no_overlay_ = false, warned_silent_peers_ = false;
  std::vector<std::string> other_topics_;

  std::atomic<bool> input_subscribed_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> keyframe_wanted_{true};  ///< h264: next frame an IDR (new subscriber, backlog cleared)
  int64_t frame_count_ = 0;                  ///< h264 pts (frame thread)
  int applied_kbps_ = 0;                     ///< bitrate last given to the h264 encoder (frame thread)
  double applied_crf_ = 0.0;                 ///< crf last given to the h264 encoder (frame thread)
  ProblemLog frame_log_;                     ///< frames refused or not encodable (frame thread)

  mutable std::mutex mutex_;  ///< guards everything below
  StreamOptions options_;  ///< the settings now (applySettings); format, limits, peers_topic, host_aliases fixed
  StreamPolicy policy_;
  std::map<std::string, std::shared_ptr<Sub>> subs_;
  PeerListConstPtr peers_;
  std::string peers_topic_;   ///< the ~peers subscribed to ("" = none found yet)
  std::vector<std::string> state_other_topics_;
  double next_due_ = 0.0;
  bool backed_up_ = false;  ///< h264: a subscriber's connection is backed up: frames are skipped
  ros::WallTime last_forced_keyframe_;  ///< h264: last keyframe forced when a skip ended
  uint32_t window_keyframes_ = 0, window_skipped_ = 0, last_keyframes_ = 0, last_skipped_ = 0;
  ros::WallTime window_start_;
  uint64_t window_in_ = 0, window_out_ = 0, window_bytes_ = 0;
  double window_encode_ms_ = 0.0;
  double last_input_rate_ = 0.0, last_output_rate_ = 0.0, last_bitrate_kbps_ = 0.0;
  double last_frame_bytes_, last_encode_ms_;
  std::string last_format_;
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_LINK_AWARE_STREAM_H
