// Link-aware stream policy (see stream_policy.h).
#include "overlay_manager/stream_policy.h"

#include <algorithm>
#include <cmath>

namespace overlay_manager
{

namespace
{
/// Unsent bytes in ms of a stream of out_kbps (kbit/s = bit/ms).
double backlogMs(double bytes, double out_kbps)
{
  return bytes * 8.0 / out_kbps;
}

/// Less than a quarter of max_backlog_ms unsent: the connection keeps up with the stream.
bool drainedOnce(double bytes, double out_kbps, double max_backlog_ms)
{
  return backlogMs(bytes, out_kbps) < max_backlog_ms / 4.0;
}

/// A queue on the path above half of max_backlog_ms: congested, whatever the socket holds.
bool queueBuilt(double queue_delay_ms, double max_backlog_ms)
{
  return queue_delay_ms > max_backlog_ms / 2.0;  // NaN (not measured): false
}

/// At most a quarter of max_backlog_ms queued on the path: room to raise or lift a cap.
bool queueQuiet(double queue_delay_ms, double max_backlog_ms)
{
  return !(queue_delay_ms >= max_backlog_ms / 4.0);  // NaN (not measured): quiet
}
}  // namespace

bool backedUp(double backlog_bytes, double prev_backlog_bytes, double out_kbps, double max_backlog_ms)
{
  if (!(out_kbps > 0.0))
    return false;
  const double backlog_ms = backlogMs(backlog_bytes, out_kbps);
  const double prev_ms = backlogMs(prev_backlog_bytes, out_kbps);
  return backlog_ms > max_backlog_ms || (backlog_ms > max_backlog_ms / 4.0 && prev_ms > max_backlog_ms / 4.0);
}

bool skipForBacklog(double backlog_bytes, double out_kbps, double max_backlog_ms)
{
  return out_kbps > 0.0 && backlogMs(backlog_bytes, out_kbps) > max_backlog_ms;
}

bool resumeAfterSkip(double worst_backlog_bytes, double target_kbps, double max_backlog_ms)
{
  return !(target_kbps > 0.0) || backlogMs(worst_backlog_bytes, target_kbps) < max_backlog_ms / 2.0;
}

double nextObservedCap(double cap_kbps, double backlog_bytes, double out_kbps, double path_budget_kbps,
                       double max_backlog_ms, double prev_backlog_bytes, double delivered_kbps, double queue_delay_ms)
{
  if (!(out_kbps > 0.0))
    return cap_kbps;
  if (backedUp(backlog_bytes, prev_backlog_bytes, out_kbps, max_backlog_ms) ||
      queueBuilt(queue_delay_ms, max_backlog_ms))
  {
    // The connection had bytes waiting (in its socket, or in a queue on the path that its round
    // trip shows), so what its peer acknowledged over the period is what the link carries for it
    // now: the cap follows that measurement (kDeliveredShare of it, the rest drains the queue;
    // kDrainShare when the path holds more than max_backlog_ms) instead of cutting again for
    // every period an old queue takes to drain, which compounded a 5 Mbit/s congestion episode
    // of four streams down to min_video_kbps.
    if (delivered_kbps > 0.0)
      return (queue_delay_ms > max_backlog_ms ? kDrainShare : kDeliveredShare) * delivered_kbps;
    const double cap = 0.7 * out_kbps;  // no measurement: a blind cut
    return std::isnan(cap_kbps) ? cap : std::min(cap_kbps, cap);
  }
  if (!queueQuiet(queue_delay_ms, max_backlog_ms))
    return cap_kbps;  // some queue on the path: hold
  if (!std::isnan(cap_kbps) && drainedOnce(backlog_bytes, out_kbps, max_backlog_ms))
  {
    // Drained in two checks in a row (less than a quarter of max_backlog_ms unsent, as in this
    // one): the link has room again (a congestion episode ended); +50 % a check gets a cap learnt
    // during the episode back to the path budget in a few checks, so a viewer does not watch a
    // needlessly low bitrate long after the link recovered (DeliveryCap also lifts the cap). A
    // backlog that was larger one check earlier: +15 %. Through a relayed tunnel a few hundred
    // bytes are often unsent at any instant, so "drained" is not "nothing unsent".
    const double step = drainedOnce(prev_backlog_bytes, out_kbps, max_backlog_ms) ? 1.5 : 1.15;
    const double raised = cap_kbps * step;
    if (raised > path_budget_kbps || raised > 4.0 * out_kbps)
      return std::numeric_limits<double>::quiet_NaN();
    return raised;
  }
  return cap_kbps;
}

constexpr double DeliveryCap::kLiftSpacingS;

double DeliveryCap::update(double now_s, double backlog_bytes, double out_kbps, double path_budget_kbps,
                           double max_backlog_ms, double delivered_kbps, double queue_delay_ms)
{
  const double prev = prev_backlog_bytes_;
  prev_backlog_bytes_ = backlog_bytes;
  const bool drained = out_kbps > 0.0 && drainedOnce(backlog_bytes, out_kbps, max_backlog_ms) &&
                       drainedOnce(prev, out_kbps, max_backlog_ms) && queueQuiet(queue_delay_ms, max_backlog_ms);
  if (!std::isnan(cap_kbps_) && drained && now_s - last_lift_s_ >= kLiftSpacingS)
  {
    last_lift_s_ = now_s;
    cap_kbps_ = std::numeric_limits<double>::quiet_NaN();
    return cap_kbps_;
  }
  cap_kbps_ = nextObservedCap(cap_kbps_, backlog_bytes, out_kbps, path_budget_kbps, max_backlog_ms, prev,
                              delivered_kbps, queue_delay_ms);
  return cap_kbps_;
}

StreamPolicy::StreamPolicy(const PolicyParams& params) : params_(params)
{
  decision_.quality = params_.max_quality;
  decision_.rate_hz = params_.max_rate_hz;
  decision_.reason = "no subscribers";
}

void StreamPolicy::setParams(const PolicyParams& params)
{
  params_ = params;
  applyBudget();
}

double StreamPolicy::budgetFor(const SubscriberView& sub) const
{
  double budget = std::numeric_limits<double>::infinity();
  auto it = params_.budget_kbps.find(sub.path);
  if (it != params_.budget_kbps.end() && it->second > 0.0)
    budget = it->second;
  if (!std::isnan(sub.observed_cap_kbps) && sub.observed_cap_kbps > 0.0)
    budget = std::min(budget, sub.observed_cap_kbps);
  return budget;
}

void StreamPolicy::setSubscribers(const std::vector<SubscriberView>& subs)
{
  subs_ = subs;
  applyBudget();
}

void StreamPolicy::applyBudget()
{
  double budget = std::numeric_limits<double>::infinity();
  std::string limited_by;
  std::string reason = subs_.empty() ? "no subscribers" : "no budget";
  for (const SubscriberView& sub : subs_)
  {
    const double b = budgetFor(sub);
    if (b < budget)
    {
      budget = b;
      limited_by = sub.host.empty() ? sub.node : sub.host;
      const bool observed = !std::isnan(sub.observed_cap_kbps) && sub.observed_cap_kbps > 0.0 &&
                            sub.observed_cap_kbps <= b;
      reason = observed ? "observed delivery" : "path " + sub.path;
    }
  }
  decision_.budget_kbps = budget;
  decision_.limited_by = limited_by;
  decision_.reason = reason;
  if (std::isinf(budget))
  {
    decision_.quality = params_.max_quality;
    decision_.rate_hz = params_.max_rate_hz;
  }
  else
  {
    decision_.quality = clampQuality(decision_.quality);
    decision_.rate_hz = clampRate(decision_.rate_hz);
    // Jump straight to a rate that fits when the estimate already says the stream is too big:
    // waiting for frames to step quality down would send a second of frames the link cannot carry.
    const double pred = predictedKbps();
    if (!std::isnan(pred) && pred > budget && decision_.quality <= params_.min_quality)
      decision_.rate_hz = clampRate(budget * 1000.0 / (size_bytes_ * 8.0));
    // And back up at once when the budget rises (a delivery cap lifted, a new budget set) on a
    // stream at full quality: waiting for the next message to raise the rate meant waiting one
    // period of the old, low rate (seconds on a stream of large messages).
    else if (!std::isnan(pred) && pred < params_.raise_below * budget && decision_.quality >= params_.max_quality &&
             decision_.rate_hz < params_.max_rate_hz)
      decision_.rate_hz =
          std::max(decision_.rate_hz, clampRate(params_.raise_below * budget * 1000.0 / (size_bytes_ * 8.0)));
  }
}

int StreamPolicy::clampQuality(int q) const
{
  const int lo = std::max(1, std::min(params_.min_quality, params_.max_quality));
  const int hi = std::min(100, std::max(params_.min_quality, params_.max_quality));
  return std::max(lo, std::min(hi, q));
}

double StreamPolicy::clampRate(double r) const
{
  const double hi = params_.max_rate_hz;
  const double lo = std::min(params_.min_rate_hz, hi);
  if (std::isnan(r))
    return hi;
  return std::max(lo, std::min(hi, r));
}

double StreamPolicy::videoBitrateKbps() const
{
  const double hi = params_.max_video_kbps;
  const double lo = std::min(params_.min_video_kbps, hi);
  if (std::isinf(decision_.budget_kbps))
    return hi;
  return std::max(lo, std::min(hi, params_.video_share * decision_.budget_kbps));
}

double StreamPolicy::predictedKbps() const
{
  if (std::isnan(size_bytes_))
    return std::numeric_limits<double>::quiet_NaN();
  double rate = decision_.rate_hz;
  if (!std::isnan(input_rate_hz_) && input_rate_hz_ > 0.0)
    rate = std::min(rate, input_rate_hz_);
  return size_bytes_ * 8.0 * rate / 1000.0;
}

void StreamPolicy::onFrameEncoded(size_t bytes, int quality)
{
  const double a = std::max(0.01, std::min(1.0, params_.size_smoothing));
  // A frame encoded at another quality than the current decision (a decision changed while it
  // was being encoded) still says something about the scene; weigh it like any other.
  (void)quality;
  size_bytes_ = std::isnan(size_bytes_) ? static_cast<double>(bytes) : a * bytes + (1.0 - a) * size_bytes_;

  const double budget = decision_.budget_kbps;
  if (std::isinf(budget))
  {
    decision_.quality = params_.max_quality;
    decision_.rate_hz = params_.max_rate_hz;
    return;
  }
  const double pred = predictedKbps();
  const double frame_bits = size_bytes_ * 8.0;
  if (pred > budget)
  {
    if (decision_.quality > params_.min_quality)
    {
      // JPEG size falls slowly with quality near the top and fast in the middle: take bigger
      // steps the further over budget the stream is, so a switch to derp settles in ~10 frames.
      const double over = pred / budget;
      const int step = over > 2.0 ? 10 : (over > 1.3 ? 5 : 2);
      decision_.quality = clampQuality(decision_.quality - step);
    }
    else
    {
      decision_.rate_hz = clampRate(budget * 1000.0 / frame_bits);
    }
  }
  else if (pred < params_.raise_below * budget)
  {
    if (decision_.rate_hz < params_.max_rate_hz)
      decision_.rate_hz = clampRate(params_.raise_below * budget * 1000.0 / frame_bits);
    else if (decision_.quality < params_.max_quality)
      decision_.quality = clampQuality(decision_.quality + 1);
  }
}

}  // namespace overlay_manager
