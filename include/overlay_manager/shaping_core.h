// The shaping core of a link-aware topic, knowing nothing of images nor of ROS: who subscribes to
// which tier of the topic, the overlay path to each subscriber's machine, what delivery to each
// looks like (socket backlog, bytes acknowledged, queueing on the path), the policy's decision per
// tier, the skip/resume gate of codecs that keep a reference chain, frame admission, and the
// figures stream_state reports. Pure C++ (no roscpp): the ROS adapter (shaped_topic.h) feeds it
// connect events, looked-up paths and kernel counters and reads decisions and snapshots back.
//
// Tiers: one shaped topic goes out as one or more tiers, each its own output (its own ROS topic)
// with its own subscribers, policy, frame gate, delivery feedback and figures. Every subscriber
// belongs to the tier whose output it is connected to; each tier is fitted to its own subscribers
// (the most constrained of them), so a subscriber on the wrong tier never gets more than its path
// carries. Which tier a path should read is tierForPath(): the "full" tier for paths without a
// budget (self, direct by default), the "fitted" tier for every budgeted path. A topic without
// tiers has one tier, kSingleTier (""), and fits every subscriber as before.
//
// Threads: every method takes the core's own mutex, does no I/O and is O(subscribers); frame
// threads call admit/sent, the control thread the rest.
#ifndef OVERLAY_MANAGER_SHAPING_CORE_H
#define OVERLAY_MANAGER_SHAPING_CORE_H

#include "overlay_manager/stream_policy.h"

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace overlay_manager
{

/// Tier names. A tier's output topic is the shaped topic for kSingleTier and kFittedTier (what a
/// plain subscriber gets), the topic + "/" + name for the others (tierTopic()).
namespace tiers
{
const char* const kSingleTier = "";       ///< a topic without tiers: one output, fitted to everyone
const char* const kFullTier = "full";     ///< paths without a budget (self, direct): nothing limits it
const char* const kFittedTier = "fitted"; ///< budgeted paths (derp, peer-relay, unknown, ...)
}  // namespace tiers

/// The tier a subscriber on `path` should read under `params`: kFullTier when the path has no
/// budget, kFittedTier otherwise.
std::string tierForPath(const std::string& path, const PolicyParams& params);

/// Output topic of `tier` of the shaped topic `topic`: `topic` itself for the single and the
/// fitted tier, `topic`/<tier> for the others (e.g. /camera/image_raw/link_aware/full).
std::string tierTopic(const std::string& topic, const std::string& tier);

/// What a codec or topic kind tells the core about itself (the only codec knowledge in it).
struct ShaperTraits
{
  std::string kind;  ///< stream_state's codec: "jpeg", "png", "h264", "zstd", ...
  std::string unit = "message";  ///< what one message is called in logs ("frame" for images)
  /// Messages depend on earlier ones (H.264's reference chain): while a subscriber's connection
  /// is backed up the core skips messages instead of letting roscpp drop queued ones (a skipped
  /// message is never made, so every decoder stays whole), and it asks for a keyframe when a new
  /// subscriber connects or a skip ends (rate-limited).
  bool reference_chain = false;
  /// The policy learns the message size at each quality from what was sent (JPEG's quality steps).
  bool size_feedback = false;
};

/// Settings of the core (a copy of the stream's; applySettings replaces them live).
struct CoreSettings
{
  PolicyParams policy;
  bool adapt_to_delivery = true;  ///< caps learnt from delivery lower a subscriber's budget
  double max_backlog_ms = 200.0;  ///< unsent bytes (in ms of stream) that count as backing up
  /// max_backlog_ms is at least this many messages of a tier's stream (its period at the output
  /// rate of the last window): a stream of large, infrequent messages (a 365 KB map at 1 Hz) holds
  /// its newest message in its connection for a while after every send, which is that message on
  /// its way, not a backlog; counted as one it cut the stream's cap to a fraction of its budget.
  /// 0 = max_backlog_ms alone (images).
  double min_backlog_messages = 0.0;
  /// A budgeted subscriber's connections are paced at this multiple of its path's budget (the
  /// kernel's TCP pacing, SO_MAX_PACING_RATE): a large message leaves as a stream at that rate
  /// instead of a burst at whatever the link takes, so the queue it would build at a relayed link's
  /// bottleneck (where a teleop topic's packets wait behind it) stays short. 0 = not paced.
  double pacing_factor = 0.0;
};

/// Default pacing_factor of shaped topics: a message of a stream at its budget leaves in 40 % of
/// its period.
constexpr double kDefaultPacingFactor = 2.5;

/// Default pacing_factor of the link-aware camera streams: not paced. A camera's frames are small
/// against a relayed uplink (a 30-50 KB H.264 keyframe is 8-13 ms at 30 Mbit/s), and pacing them
/// cost the fleet benchmark's latency p99 about 100 ms (four relayed cameras: median 346 ms paced
/// against 236 ms unpaced, five alternating runs each) where nothing else shared the uplink. The
/// bursts that hold a robot's teleop back are its clouds and maps, which the topic shaper paces.
constexpr double kDefaultStreamPacingFactor = 0.0;

/// A paced subscriber's pace is never below what sends its tier's largest recent message within
/// one period of the tier's output rate (deadlinePaceKbps): a video keyframe, several times the
/// size of the frames around it, then leaves before the next frame is due instead of holding the
/// frames behind it in the connection. "Recent" is the last kPeakWindowS to 2 x kPeakWindowS, and
/// since the last path change of one of the tier's subscribers.
constexpr double kPeakWindowS = 5.0;

/// The pace (kbit/s) that sends a message of `peak_bytes` within one period of a stream at
/// `output_hz` messages a second; 0 when either is unknown (0).
double deadlinePaceKbps(double peak_bytes, double output_hz);

/// The rate (kbit/s) a subscriber on `path` is paced at under `settings`: pacing_factor x the
/// path's budget; 0 = not paced (no budget on that path, or pacing off).
double pacingKbpsForPath(const std::string& path, const CoreSettings& settings);

/// What a paced connection holds because of its pace is not backlog: the bytes its pace releases
/// within kPacedAllowanceS. A keyframe or a cloud just written to a paced socket waits there (it
/// leaves at the pace instead of in a burst), where an unpaced one sat in the relay's buffer out
/// of sight; counted as backlog it would close the skip gate of a stream that keeps up.
constexpr double kPacedAllowanceS = 0.1;

/// `unsent_bytes` of a connection paced at `pacing_kbps` (0 = not paced) less what its pace
/// releases within kPacedAllowanceS.
uint32_t backlogBeyondPace(uint32_t unsent_bytes, double pacing_kbps);

/// One subscriber's connections as the kernel sees them at one delivery check.
struct DeliverySample
{
  uint32_t unsent_bytes = 0;  ///< largest unsent queue of its connections (SIOCOUTQNSD)
  uint64_t acked_bytes = 0;   ///< bytes acknowledged by its peer, summed over its connections (TCP_INFO)
  /// largest round trip above its minimum (ms); NaN = unknown
  double queue_delay_ms = std::numeric_limits<double>::quiet_NaN();
};

/// Key of a subscriber: the tier it reads and its node (a node on two tiers counts on each).
struct SubKey
{
  std::string tier, node;
  bool operator<(const SubKey& o) const { return tier != o.tier ? tier < o.tier : node < o.node; }
};

/// What the frame thread is told for one message of one tier.
struct Admission
{
  bool due = false;          ///< make and send this message
  bool skipped = false;      ///< not due because the tier's skip gate holds (reference_chain)
  bool keyframe = false;     ///< the codec should start a new reference chain with it
  Decision decision;         ///< the tier's decision now (quality, rate, budget)
  double target_kbps = 0.0;  ///< the tier's codec bitrate target (StreamPolicy::videoBitrateKbps)
};

/// What was sent for one admitted message.
struct SentReport
{
  size_t bytes = 0;         ///< size on the wire (payload)
  int quality = 0;          ///< quality it was made at (size_feedback codecs)
  double encode_ms = 0.0;   ///< time spent making it
  bool keyframe = false;    ///< it starts a reference chain
  std::string format;       ///< its format string (e.g. CompressedImage.format)
};

/// One subscriber in a snapshot.
struct SubscriberState
{
  std::string tier, node, host, path;
  std::string wanted_tier;  ///< the tier its path calls for (tierForPath)
  double budget_kbps = std::numeric_limits<double>::quiet_NaN();  ///< NaN = none
  double observed_cap_kbps = std::numeric_limits<double>::quiet_NaN();
  uint32_t backlog_bytes = 0;
  double queue_delay_ms = std::numeric_limits<double>::quiet_NaN();
  double pacing_kbps = std::numeric_limits<double>::quiet_NaN();  ///< its connections' pace; NaN = not paced
};

/// One tier's figures over the last window (what stream_state reports).
struct TierState
{
  std::string tier;
  Decision decision;
  double target_kbps = 0.0;        ///< codec bitrate target now
  double input_rate_hz = 0.0;      ///< messages offered per second
  double output_rate_hz = 0.0;     ///< messages sent per second
  double bitrate_kbps = 0.0;       ///< bytes sent, kbit/s
  double frame_bytes = std::numeric_limits<double>::quiet_NaN();  ///< mean message size
  double encode_ms = std::numeric_limits<double>::quiet_NaN();    ///< mean time to make one
  uint32_t keyframes = 0, skipped = 0;
  std::string format;              ///< format of the last message
  bool backed_up = false;          ///< the skip gate holds (reference_chain)
  std::vector<SubscriberState> subscribers;  ///< sorted by node
};

/// The core of one shaped topic (see the file comment).
class ShapingCore
{
public:
  /// Shortest time between two keyframes forced by the core (s): each costs several messages'
  /// worth of bytes on a link that may just have backed up.
  static constexpr double kMinForcedKeyframeS = 1.0;
  /// Nodes whose machine and path are kept after their last connection closed (a node that moves
  /// between tiers keeps its path); beyond it the departed ones are forgotten.
  static constexpr size_t kMaxKnownNodes = 256;

  ShapingCore(const ShaperTraits& traits, const CoreSettings& settings);

  const ShaperTraits& traits() const { return traits_; }
  CoreSettings settings() const;
  /// New live settings: the policy's limits and budgets apply at once, delivery ones at the next check.
  void applySettings(const CoreSettings& settings);

  // ---- subscribers (any thread) ----
  /// A connection from `node` to `tier`'s output; a tier is made at its first subscriber. Returns
  /// true when the node is new on that tier. reference_chain: the tier's next message is a keyframe.
  bool connected(const std::string& tier, const std::string& node);
  /// A connection closed; the subscriber goes when its last one does, the tier with its last subscriber.
  void disconnected(const std::string& tier, const std::string& node);
  bool empty() const;
  /// Tiers with subscribers now (sorted).
  std::vector<std::string> activeTiers() const;
  /// Nodes whose machine is not known yet and whose retry time (s) is due at `now_s`.
  std::vector<std::string> unresolved(double now_s) const;
  /// Machine looked up for `node` ("" = lookup failed: retry `retry_s` later).
  void setHost(const std::string& node, const std::string& host, double now_s, double retry_s);
  /// Raw host of every subscriber (for path mapping by the adapter).
  std::map<std::string, std::string> hosts() const;
  /// Path (and short machine name) of every subscriber's machine, as the adapter mapped them from
  /// ~peers; recomputes every tier's decision. Returns true when a path changed (a cap learnt on
  /// the old path is forgotten).
  bool setPaths(const std::map<std::string, std::pair<std::string, std::string>>& machine_and_path);

  // ---- delivery (control thread) ----
  /// One delivery check at `now_s` (monotonic s): each subscriber's sample (missing = nothing
  /// unsent) updates its cap and backlog; a reference_chain tier's skip gate closes while one of its
  /// subscribers holds more than max_backlog_ms of the tier's stream and opens (with a keyframe,
  /// rate-limited) when none does. Does nothing when adapt_to_delivery is off.
  void observeDelivery(double now_s, const std::map<SubKey, DeliverySample>& samples);
  /// The pace (kbit/s) of every subscriber's connections now; 0 = not paced: pacingKbpsForPath,
  /// raised to its tier's deadlinePaceKbps (largest recent message, output rate of the last window).
  std::map<SubKey, double> pacing() const;
  /// Whether a skip gate holds on some tier (the adapter then re-checks often: recheck()).
  bool anyBackedUp() const;
  /// Fast re-check while a gate holds: a tier resumes as soon as every connection of it holds less
  /// than half of max_backlog_ms at the tier's target bitrate. Returns true when a tier resumed.
  bool recheck(double now_s, const std::map<SubKey, DeliverySample>& samples);
  /// A decoder of `tier` lost the chain and asks for a keyframe (reference_chain; at most one
  /// forced keyframe per kMinForcedKeyframeS and tier).
  void requestKeyframe(const std::string& tier, double now_s);

  // ---- frame threads ----
  /// A message arrives for `tier` at `now_s`: due under the tier's rate cap and skip gate?
  Admission admit(const std::string& tier, double now_s);
  /// A message admitted on `tier` was sent.
  void sent(const std::string& tier, const SentReport& report);
  /// A message admitted could not be made: a reference_chain tier's next one is a keyframe.
  void failed(const std::string& tier);

  // ---- state (control thread) ----
  /// The tiers' figures; closes the counting window when at least 0.5 s old (else reuses the
  /// last one's rates). Also feeds each tier's policy its input rate.
  std::vector<TierState> snapshot(double now_s);
  /// Where each subscriber should read (node -> tier), from its path: the tier directory the
  /// adapter publishes for subscribers that can switch (the image transports' subscriber plugin).
  std::map<std::string, std::string> directory() const;

private:
  struct Sub;
  struct Tier;
  Tier& tierLocked(const std::string& name);
  void decideLocked();
  bool forceKeyframeLocked(Tier& t, double now_s);
  /// max_backlog_ms for `t`, at least min_backlog_messages of its stream.
  double backlogLimitMs(const Tier& t) const;
  /// The pace (kbit/s, 0 = not paced) of a subscriber of `t` (nullptr = unknown tier) on `path`.
  double paceLocked(const Tier* t, const std::string& path) const;

  const ShaperTraits traits_;
  mutable std::mutex mutex_;
  CoreSettings settings_;
  std::map<SubKey, std::shared_ptr<Sub>> subs_;
  std::map<std::string, std::shared_ptr<Tier>> tiers_;
  /// per node: raw host ("" = not known), next lookup time, machine short name, path
  struct NodeInfo
  {
    std::string host, machine, path = paths::kUnknown;
    double next_lookup_s = 0.0;
    int refs = 0;
  };
  std::map<std::string, NodeInfo> nodes_;
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_SHAPING_CORE_H
