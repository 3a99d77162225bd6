// The ROS side of one shaped topic: a thin adapter around ShapingCore (shaping_core.h, pure) that
// knows ROS but no codec. It finds the overlay node's ~peers, looks subscribers' machines up at the
// master, reads each connection's socket counters (delivery feedback), publishes each tier's
// stream_state and the tier directory, takes viewers' keyframe requests, and runs the one
// admit -> shape -> publish -> sent loop (offer) for any codec or topic kind (shaper.h).
//
// Topics (`topic` = the shaped topic, e.g. /camera/image_raw/link_aware)
//   tierTopic(topic, tier)                 the owner publishes each tier's messages there (it
//                                          advertises them and forwards connect/disconnect events)
//   <tier topic>/stream_state              overlay_manager/StreamState, latched, per tier
//   <topic>/tiers                          overlay_manager/TierDirectory, latched (tiered topics only)
//   <tier topic>/keyframe_request          std_msgs/Empty from viewers (reference_chain kinds only)
//
// Threads and locks
//   * frame thread (the owner's): offer(). Takes the core's mutex only to admit and record a
//     message; shapes and publishes without a lock. One message at a time (the caller serialises).
//   * any thread: subscriberConnected/-Disconnected update the core and post the work to the
//     control thread; they never block on I/O (a camera driver calls them from its own spinner).
//   * control thread (own callback queue + one-thread AsyncSpinner): ~peers, master look-ups,
//     this process's bus info and each connection's socket counters (every 0.5 s; every 0.1 s while
//     a skip gate holds) and each budgeted connection's pace (SO_MAX_PACING_RATE, every 0.5 s),
//     stream_state and the directory, the owner's hook. Blocking work is done
//     without any lock frames take. A master that hangs stalls this thread (stream_state stops),
//     never the frames: they go on with the last decision.
#ifndef OVERLAY_MANAGER_SHAPED_TOPIC_H
#define OVERLAY_MANAGER_SHAPED_TOPIC_H

#include "overlay_manager/problem_log.h"
#include "overlay_manager/shaper.h"
#include "overlay_manager/shaping_core.h"
#include "overlay_manager/subscriber_hosts.h"

#include <overlay_manager/PeerList.h>
#include <overlay_manager/TierDirectory.h>
#include <ros/callback_queue.h>
#include <ros/ros.h>
#include <std_msgs/Empty.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace overlay_manager
{

/// Settings of a shaped topic's adapter (parameter names in docs/camera.md).
struct TopicOptions
{
  CoreSettings core;
  double state_period = 1.0;  ///< s between stream_state messages (delivery is checked every 0.5 s)
  std::string peers_topic;    ///< overlay node's ~peers; "" = find it (ros_graph.h)
  HostAliases host_aliases;   ///< ~host_aliases: subscriber host -> machine short name
  /// Serve tiers: the fitted tier on the topic, the full tier on topic/full, and the directory.
  /// Off: one tier ("") on the topic, fitted to every subscriber.
  bool tiers = false;
};

/// Seconds on the steady clock (the core's time base).
inline double steadyNowS()
{
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// One shaper per tier of a topic, made on a tier's first message and dropped with the tier (frame
/// thread only).
template <class In, class Out>
class TierShapers
{
public:
  explicit TierShapers(ShaperKind<In, Out> kind) : kind_(std::move(kind)) {}
  const ShaperKind<In, Out>& kind() const { return kind_; }
  Shaper<In, Out>& forTier(const std::string& tier)
  {
    std::unique_ptr<Shaper<In, Out>>& s = by_tier_[tier];
    if (!s)
      s = kind_.make();
    return *s;
  }
  /// Drops the shapers (and their encoders) of tiers not in `active`.
  void keepOnly(const std::vector<std::string>& active)
  {
    for (auto it = by_tier_.begin(); it != by_tier_.end();)
      it = std::find(active.begin(), active.end(), it->first) == active.end() ? by_tier_.erase(it) : std::next(it);
  }

private:
  ShaperKind<In, Out> kind_;
  std::map<std::string, std::unique_ptr<Shaper<In, Out>>> by_tier_;
};

class ShapedTopic
{
public:
  /// `nh`: where stream_state, the directory and ~peers are (its callback queue is not used);
  /// `topic`: the resolved shaped topic; `input_topic`: what it shapes (for stream_state);
  /// `describe`: the kind's codec-specific figures (may be empty). Advertises stream_state;
  /// start() starts the control thread.
  ShapedTopic(const ros::NodeHandle& nh, const std::string& topic, const std::string& input_topic,
              const ShaperTraits& traits, const TopicOptions& options, DescribeFn describe = DescribeFn());
  ~ShapedTopic();
  ShapedTopic(const ShapedTopic&) = delete;
  ShapedTopic& operator=(const ShapedTopic&) = delete;

  /// Starts the control thread: call once, after setControlHook/setOtherTopics.
  void start();
  /// Stops for good: stream_state and the directory unadvertised, ~peers unsubscribed, no more hook
  /// calls. Control thread (from the hook) or before start().
  void stop();
  bool stopped() const { return stopping_; }

  const std::string& topic() const { return topic_; }
  /// The tiers this topic serves: {""} or {"fitted", "full"} (the first is the base: `topic`).
  const std::vector<std::string>& tierNames() const { return tier_names_; }
  /// The output topic of `tier`.
  std::string topicOf(const std::string& tier) const { return tierTopic(topic_, tier); }
  ShapingCore& core() { return core_; }
  /// The control thread's queue (an owner's own control-thread services, e.g. dynamic_reconfigure).
  ros::CallbackQueue* controlQueue() { return &control_queue_; }
  const TopicOptions& options() const { return options_; }

  /// New live settings of the core (policy limits and budgets, delivery); stream_state at once.
  void applySettings(const CoreSettings& settings);
  /// A new period of stream_state (s, > 0). Control thread (e.g. a dynamic_reconfigure callback).
  void setStatePeriod(double seconds);

  /// Runs on the control thread after every subscriber change and every state period (before the
  /// decision). Set before start().
  void setControlHook(std::function<void()> hook) { hook_ = std::move(hook); }
  /// Topics the base tier also goes out on (their connections count for delivery, their names go
  /// into stream_state's other_topics). Control thread or before start().
  void setOtherTopics(const std::vector<std::string>& topics);
  /// Whether the owner reads its input now (for stream_state).
  void setInputSubscribed(bool subscribed) { input_subscribed_ = subscribed; }

  // ---- any thread, never blocks on I/O ----
  void subscriberConnected(const std::string& tier, const std::string& node);
  void subscriberDisconnected(const std::string& tier, const std::string& node);

  // ---- frame thread ----
  /// The one loop: for every tier with subscribers, admit `in` (rate cap, skip gate), shape it with
  /// that tier's shaper, publish it with `publish(tier, message)` and record it. A message the
  /// kind refuses is never read (logged once per kind of problem, then throttled).
  template <class In, class Out>
  void offer(const In& in, TierShapers<In, Out>& shapers,
             const std::function<void(const std::string&, const boost::shared_ptr<Out>&)>& publish)
  {
    const std::vector<std::string> active = core_.activeTiers();
    shapers.keepOnly(active);
    if (shapers.kind().on_message)
      shapers.kind().on_message();
    bool checked = false;
    for (const std::string& tier : active)
    {
      Shaper<In, Out>& shaper = shapers.forTier(tier);
      if (!checked)
      {
        checked = true;
        const std::string bad = shaper.refuses(in);
        if (!bad.empty())
        {
          refused(bad);
          return;
        }
      }
      const Admission admission = core_.admit(tier, steadyNowS());
      if (!admission.due)
        continue;
      SentReport report;
      std::string error;
      const auto t0 = std::chrono::steady_clock::now();
      boost::shared_ptr<Out> out = shaper.shape(in, admission, &report, &error);
      if (!out)
      {
        failed(tier, error);
        continue;
      }
      report.encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      publish(tier, out);
      core_.sent(tier, report);
    }
  }

  /// Problems of messages (refused, not shaped), said once per kind then throttled (frame thread).
  ProblemLog& frameLog() { return frame_log_; }

private:
  void post(std::function<void()> fn);
  void refused(const std::string& why);
  void failed(const std::string& tier, const std::string& why);
  void onChange();
  void onTimer(const ros::WallTimerEvent&);
  void onPeers(const PeerListConstPtr& msg);
  void ensurePeers();
  void resolveAndDecide();
  /// One connection of a subscriber: its socket in this process and the subscriber it serves.
  struct Connection
  {
    int fd;
    SubKey key;
    double pace_kbps;  ///< its subscriber's pace (ShapingCore::pacing); 0 = not paced
  };
  bool readDelivery(std::map<SubKey, DeliverySample>* out, std::vector<Connection>* connections = nullptr);
  void applyPacing(const std::vector<Connection>& connections);
  void onDeliveryCheck(const ros::WallTimerEvent&);
  void onRecheck(const ros::WallTimerEvent&);
  void publishState();

  const TopicOptions options_;
  const std::string topic_, input_topic_, own_host_;
  const std::vector<std::string> tier_names_;
  const DescribeFn describe_;
  ShapingCore core_;
  std::function<void()> hook_;
  ProblemLog frame_log_;

  // control thread only
  ros::CallbackQueue control_queue_;
  ros::NodeHandle control_nh_;
  std::unique_ptr<ros::AsyncSpinner> spinner_;
  std::map<std::string, ros::Publisher> state_pubs_;  ///< per tier
  ros::Publisher directory_pub_;
  TierDirectory last_directory_;
  ros::Subscriber peers_sub_;
  std::vector<ros::Subscriber> keyframe_subs_;
  ros::WallTimer timer_, delivery_timer_, recheck_timer_;
  ros::WallTime next_discovery_, peers_subscribed_at_;
  bool warned_no_overlay_ = false, warned_silent_peers_ = false, warned_pacing_ = false;
  std::vector<std::string> other_topics_;
  bool any_paced_ = false;  ///< a connection was paced at the last check (to unpace it when pacing goes off)

  std::atomic<bool> input_subscribed_{ false };
  std::atomic<bool> stopping_{ false };

  mutable std::mutex mutex_;  ///< guards the three below (never held during I/O)
  PeerListConstPtr peers_;
  std::string peers_topic_;  ///< the ~peers subscribed to ("" = none found yet)
  std::vector<std::string> state_other_topics_;
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_SHAPED_TOPIC_H
