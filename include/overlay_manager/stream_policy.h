// Link-aware stream policy: which JPEG quality and frame rate a camera stream uses, given the
// overlay paths of its current subscribers and what delivery to them looks like.
//
// Pure logic (no ROS): the encoder nodelet feeds it subscribers and encoded frame sizes and reads
// back one Decision. One ROS publisher sends the same message to every subscriber, so the stream
// fits the most constrained subscriber; that subscriber is named in Decision::limited_by.
//
// Not thread-safe: the caller serialises access (the encoder holds one mutex around every call;
// every method is O(subscribers) and does no I/O).
#ifndef OVERLAY_MANAGER_STREAM_POLICY_H
#define OVERLAY_MANAGER_STREAM_POLICY_H

#include <limits>
#include <map>
#include <string>
#include <vector>

namespace overlay_manager
{

/// Path names: overlay_manager/Peer's PATH_* constants (overlay_msgs/msg/Peer.msg is their one
/// definition; test/unit/project/test_path_words.py checks these literals against it).
namespace paths
{
const char* const kSelf = "self";            ///< subscriber runs on this machine: no overlay link
const char* const kDirect = "direct";        ///< direct WireGuard over UDP
const char* const kDerp = "derp";            ///< relayed through a DERP server (TCP/HTTPS)
const char* const kPeerRelay = "peer-relay"; ///< relayed through a tailscale peer relay (UDP)
const char* const kIdle = "idle";            ///< online, no recent traffic: path not known yet
const char* const kOffline = "offline";      ///< the control server says the peer is offline
const char* const kUnknown = "unknown";      ///< subscriber's machine not resolved (yet)
}  // namespace paths

/// Per-path budgets of an H.264 stream (kbit/s), the defaults of the `video_budget_kbps_<path>`
/// parameters: H.264 needs about a tenth of JPEG's bitrate for the same picture, so it gets its own
/// budgets instead of JPEG's. derp (and idle, unknown, offline) 2400: with video_share 0.8 the
/// encoder targets 1920 kbit/s, over 40 dB PSNR on a real 640x480 scene and under 2 Mbit/s with
/// x264's overshoot; peer-relay 4000; direct and local none (max_video_kbps).
inline std::map<std::string, double> defaultVideoBudgetsKbps()
{
  return { { paths::kDerp, 2400.0 },    { paths::kPeerRelay, 4000.0 }, { paths::kIdle, 2400.0 },
           { paths::kUnknown, 2400.0 }, { paths::kOffline, 2400.0 } };
}

/// Limits and per-path budgets, from the nodelet's ~params. Rates in Hz, bitrates in kbit/s.
struct PolicyParams
{
  double max_rate_hz = 30.0;   ///< never publish faster than this
  double min_rate_hz = 2.0;    ///< never lower the rate below this to meet a budget
  int max_quality = 90;        ///< JPEG quality when nothing limits the stream (1..100)
  int min_quality = 30;        ///< lowest JPEG quality used to meet a budget before dropping rate
  /// Budget per path; a path missing here (self, direct) has no budget (full rate, max quality).
  std::map<std::string, double> budget_kbps = {
      {paths::kDerp, 8000.0},     {paths::kPeerRelay, 20000.0}, {paths::kIdle, 8000.0},
      {paths::kUnknown, 8000.0},  {paths::kOffline, 8000.0}};
  /// Raise quality/rate only while the predicted bitrate stays below this share of the budget
  /// (hysteresis: one quality step changes a JPEG by a few percent).
  double raise_below = 0.75;
  /// Weight of the newest frame in the frame-size average (0..1].
  double size_smoothing = 0.5;
  /// H.264: bitrate (kbit/s) when nothing limits the stream (self, direct without backlog).
  double max_video_kbps = 6000.0;
  /// H.264: lowest bitrate (kbit/s) the encoder is set to, however low the budget.
  double min_video_kbps = 300.0;
  /// H.264: share of the budget the encoder's average bitrate targets (x264's rate control
  /// overshoots on scene changes; the rest is headroom).
  double video_share = 0.8;
};

/// One subscriber as the policy sees it.
struct SubscriberView
{
  std::string node;  ///< caller id of the subscribing node
  std::string host;  ///< short name of its machine ("" = not resolved)
  std::string path;  ///< one of paths::k*
  /// Cap learnt from observed delivery to this subscriber (kbit/s); NaN = no cap observed.
  double observed_cap_kbps = std::numeric_limits<double>::quiet_NaN();
};

/// What the encoder does now.
struct Decision
{
  int quality = 90;                                             ///< JPEG quality (1..100)
  double rate_hz = 30.0;                                        ///< maximum output rate
  double budget_kbps = std::numeric_limits<double>::infinity(); ///< effective budget; inf = none
  std::string limited_by;  ///< host (or node) whose budget applies; "" when nothing limits
  std::string reason;      ///< why: "no budget", "path derp", "observed delivery", ...
};

/// Share of the measured delivery rate a backed-up subscriber's cap is set to (the rest drains
/// its queue).
const double kDeliveredShare = 0.9;
/// The same when the path itself holds more than max_backlog_ms of queue (round trip above its
/// minimum): half, so a standing queue in a relay's buffers drains within seconds.
const double kDrainShare = 0.5;

/// Observed-delivery cap of one subscriber after one period (kbit/s; NaN = no cap).
/// `backlog_bytes`: bytes its TCP connection has not sent yet; `out_kbps`: what the stream sent
/// over the period; `path_budget_kbps`: its path's budget (inf = none); `delivered_kbps`: what its
/// peer acknowledged over the period (TCP_INFO bytes_acked; NaN = not measured);
/// `queue_delay_ms`: its smoothed round trip minus the lowest one seen (TCP_INFO rtt - min_rtt),
/// the time its bytes now wait in queues along the path, e.g. in a DERP relay's buffers, where
/// they are sent as far as the socket is concerned (NaN = not measured).
/// Congested = backed up (`backedUp`) or a queue on the path above half of `max_backlog_ms`: the
/// cap becomes kDeliveredShare x delivered_kbps (kDrainShare above `max_backlog_ms`), a
/// measurement that replaces the old cap (no compounding while an old queue drains); unmeasured,
/// 70 % of out_kbps (or a lower cap kept). A path queue above a quarter of `max_backlog_ms` holds
/// the cap. Otherwise a backlog below a quarter of `max_backlog_ms` raises a cap by 15 % (by 50 %
/// when the backlog one check earlier was below that too), dropping it once it exceeds the path
/// budget or 4 x out_kbps. No stream (out_kbps <= 0): the cap stays as it is.
/// `prev_backlog_bytes`: the backlog one period earlier.
double nextObservedCap(double cap_kbps, double backlog_bytes, double out_kbps, double path_budget_kbps,
                       double max_backlog_ms, double prev_backlog_bytes = 0.0,
                       double delivered_kbps = std::numeric_limits<double>::quiet_NaN(),
                       double queue_delay_ms = std::numeric_limits<double>::quiet_NaN());

/// Whether a backlog counts as backed up (the test nextObservedCap uses): more than
/// `max_backlog_ms` of stream at `out_kbps`, or more than a quarter of that in this period and the
/// one before (a queue that does not drain: the link is full at this bitrate, however short the
/// backlog is in ms of a fast stream).
bool backedUp(double backlog_bytes, double prev_backlog_bytes, double out_kbps, double max_backlog_ms);

/// Skip rule of codecs whose messages depend on earlier ones (H.264): a subscriber's connection
/// holding more than `max_backlog_ms` of a stream of `out_kbps` stops the stream's encoding (a
/// message never made breaks no decoder's reference chain, a message roscpp drops from a full
/// queue does). False without a stream (out_kbps <= 0).
bool skipForBacklog(double backlog_bytes, double out_kbps, double max_backlog_ms);

/// Resume rule after such a skip: encoding resumes once the largest backlog of the stream's
/// connections is below half of `max_backlog_ms` at the encoder's target bitrate `target_kbps`
/// (the stream sends nothing while it skips, so the target is the rate the backlog drains against).
bool resumeAfterSkip(double worst_backlog_bytes, double target_kbps, double max_backlog_ms);

/// One subscriber's observed-delivery cap over successive delivery checks: nextObservedCap, plus
/// the lift. A cap exists because the link could not carry the stream at some moment; once the
/// connection has stayed drained (less than a quarter of `max_backlog_ms` unsent, and no more
/// than that queued on the path) in two checks in a row, the cap is dropped altogether instead of
/// climbing back 50 % a check: after a congestion episode the stream is back at its path budget
/// within a check or two, not after seconds of needlessly coarse pictures. Lifts are at least
/// kLiftSpacingS apart, so on a link that stays congested the stream tries its full budget once
/// every few seconds (and the cap follows the measured delivery again at the next check when that
/// is too much), not at every drained check. (Doubling the spacing after a failed lift, up to 8 s,
/// was tried: on a 20 s episode it lowered latency during it little, 0.6-1.0 s p99 against
/// 0.5-1.2 s, and left the stream coarse for seconds after it.)
class DeliveryCap
{
public:
  /// Shortest time between two lifts (s).
  static constexpr double kLiftSpacingS = 2.0;

  /// One delivery check at `now_s` (s, any monotonic clock); arguments as nextObservedCap's.
  /// Returns the new cap (kbit/s; NaN = none).
  double update(double now_s, double backlog_bytes, double out_kbps, double path_budget_kbps, double max_backlog_ms,
                double delivered_kbps, double queue_delay_ms = std::numeric_limits<double>::quiet_NaN());
  /// The cap now (kbit/s; NaN = none).
  double cap() const { return cap_kbps_; }
  /// Forget the cap (the subscriber's path changed: what was learnt belongs to the old path).
  void reset() { cap_kbps_ = std::numeric_limits<double>::quiet_NaN(); }

private:
  double cap_kbps_ = std::numeric_limits<double>::quiet_NaN();
  double prev_backlog_bytes_ = 0.0;
  double last_lift_s_ = -std::numeric_limits<double>::infinity();
};

/// Chooses quality and rate from subscribers' paths and the sizes of encoded frames.
class StreamPolicy
{
public:
  explicit StreamPolicy(const PolicyParams& params = PolicyParams());

  /// Replace the limits (e.g. after a parameter change); keeps the frame-size estimate.
  void setParams(const PolicyParams& params);
  const PolicyParams& params() const { return params_; }

  /// The budget (kbit/s) of one subscriber: the path's budget, lowered by an observed cap;
  /// infinity when neither applies.
  double budgetFor(const SubscriberView& sub) const;

  /// New set of subscribers: recomputes the effective budget. With no budget the decision jumps
  /// to max quality and max rate at once; with a budget the next frames converge to it.
  void setSubscribers(const std::vector<SubscriberView>& subs);
  const std::vector<SubscriberView>& subscribers() const { return subs_; }

  /// Feed the size (bytes) of a frame just encoded at `quality`; adjusts quality and rate.
  void onFrameEncoded(size_t bytes, int quality);

  /// The rate (Hz) frames arrive at from the raw topic; NaN = unknown (assume max_rate_hz).
  /// The stream cannot be faster than its input, so predictions use the lower of the two.
  void setInputRate(double hz) { input_rate_hz_ = hz; }

  /// Predicted output bitrate (kbit/s) at the current decision from the frame-size estimate;
  /// NaN before the first frame.
  double predictedKbps() const;

  const Decision& decision() const { return decision_; }

  /// H.264 encoder bitrate (kbit/s) for the current budget: video_share of it, between
  /// min_video_kbps and max_video_kbps; max_video_kbps when nothing limits the stream.
  double videoBitrateKbps() const;

private:
  void applyBudget();
  int clampQuality(int q) const;
  double clampRate(double r) const;

  PolicyParams params_;
  std::vector<SubscriberView> subs_;
  Decision decision_;
  double size_bytes_ = std::numeric_limits<double>::quiet_NaN();  ///< smoothed frame size
  double input_rate_hz_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_STREAM_POLICY_H
