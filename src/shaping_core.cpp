// The shaping core of a link-aware topic (see shaping_core.h). No ROS, no I/O.
#include "overlay_manager/shaping_core.h"

#include <algorithm>
#include <cmath>

namespace overlay_manager
{
namespace
{
const double kNaN = std::numeric_limits<double>::quiet_NaN();

double nanIfInf(double v)
{
  return std::isinf(v) ? kNaN : v;
}
}  // namespace

std::string tierForPath(const std::string& path, const PolicyParams& params)
{
  return params.budget_kbps.count(path) ? tiers::kFittedTier : tiers::kFullTier;
}

double pacingKbpsForPath(const std::string& path, const CoreSettings& settings)
{
  if (!(settings.pacing_factor > 0.0))
    return 0.0;
  auto it = settings.policy.budget_kbps.find(path);
  if (it == settings.policy.budget_kbps.end() || !(it->second > 0.0) || std::isinf(it->second))
    return 0.0;
  return settings.pacing_factor * it->second;
}

double deadlinePaceKbps(double peak_bytes, double output_hz)
{
  if (!(peak_bytes > 0.0) || !(output_hz > 0.0) || std::isinf(peak_bytes) || std::isinf(output_hz))
    return 0.0;
  return peak_bytes * 8.0 / 1000.0 * output_hz;
}

uint32_t backlogBeyondPace(uint32_t unsent_bytes, double pacing_kbps)
{
  if (!(pacing_kbps > 0.0) || std::isinf(pacing_kbps))
    return unsent_bytes;
  const double allowance = pacing_kbps * 1000.0 / 8.0 * kPacedAllowanceS;
  return unsent_bytes > allowance ? static_cast<uint32_t>(unsent_bytes - allowance) : 0u;
}

std::string tierTopic(const std::string& topic, const std::string& tier)
{
  if (tier.empty() || tier == tiers::kFittedTier)
    return topic;
  return topic + "/" + tier;
}

/// One subscribing node on one tier (several connections from one node count once).
struct ShapingCore::Sub
{
  int connections = 0;
  DeliveryCap cap;               ///< cap learnt from delivery to it
  uint32_t backlog_bytes = 0;    ///< unsent bytes, last check
  uint64_t acked_bytes = 0;      ///< bytes its peer acknowledged, last check
  double acked_at_s = kNaN;      ///< when acked_bytes was read; NaN = never
  double queue_delay_ms = kNaN;  ///< round trip above its minimum, last check
};

/// One tier: its policy, frame gate, skip gate and counting window.
struct ShapingCore::Tier
{
  explicit Tier(const PolicyParams& p) : policy(p) {}
  StreamPolicy policy;
  /// Time slot of the last message let through (s): the next is due one period of the rate now
  /// after it, whatever the rate was when this one passed.
  double last_slot_s = -std::numeric_limits<double>::infinity();
  bool backed_up = false;      ///< reference_chain: a subscriber's connection is backed up
  bool keyframe_wanted = true; ///< reference_chain: the next message starts a chain
  double last_forced_keyframe_s = -std::numeric_limits<double>::infinity();
  double window_start_s = kNaN;
  uint64_t in = 0, out = 0, bytes = 0;
  double encode_ms = 0.0;
  uint32_t keyframes = 0, skipped = 0;
  double last_in_hz = 0.0, last_out_hz = 0.0, last_kbps = 0.0, last_bytes = kNaN, last_encode_ms = kNaN;
  uint32_t last_keyframes = 0, last_skipped = 0;
  std::string format;
  /// largest message sent in this peak window and in the one before (bytes); windows of kPeakWindowS
  size_t peak_bytes = 0, last_peak_bytes = 0;
  double peak_window_start_s = kNaN;
  bool peak_restart = false;  ///< a subscriber's path changed: the peak starts again when this window closes
};

ShapingCore::ShapingCore(const ShaperTraits& traits, const CoreSettings& settings)
  : traits_(traits), settings_(settings)
{
}

CoreSettings ShapingCore::settings() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  return settings_;
}

void ShapingCore::applySettings(const CoreSettings& settings)
{
  std::lock_guard<std::mutex> lock(mutex_);
  settings_ = settings;
  for (auto& kv : tiers_)
    kv.second->policy.setParams(settings.policy);
  decideLocked();
}

ShapingCore::Tier& ShapingCore::tierLocked(const std::string& name)
{
  std::shared_ptr<Tier>& t = tiers_[name];
  if (!t)
    t = std::make_shared<Tier>(settings_.policy);
  return *t;
}

bool ShapingCore::connected(const std::string& tier, const std::string& node)
{
  std::lock_guard<std::mutex> lock(mutex_);
  Tier& t = tierLocked(tier);
  t.keyframe_wanted = true;  // the new subscriber decodes from the next message on
  std::shared_ptr<Sub>& s = subs_[SubKey{ tier, node }];
  const bool fresh = !s;
  if (fresh)
  {
    s = std::make_shared<Sub>();
    nodes_[node].refs++;
  }
  s->connections++;
  if (fresh)
    decideLocked();
  return fresh;
}

void ShapingCore::disconnected(const std::string& tier, const std::string& node)
{
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = subs_.find(SubKey{ tier, node });
  if (it == subs_.end() || --it->second->connections > 0)
    return;
  subs_.erase(it);
  // A node's machine and path outlive its last connection for a while: a viewer that moves to
  // another tier leaves the old one before its new connection reaches this process, and must not
  // come back as "unknown" (the directory would send it back)
  auto n = nodes_.find(node);
  if (n != nodes_.end())
    n->second.refs = std::max(0, n->second.refs - 1);
  if (nodes_.size() > kMaxKnownNodes)
    for (auto it = nodes_.begin(); it != nodes_.end();)
      it = it->second.refs <= 0 ? nodes_.erase(it) : std::next(it);
  bool tier_used = false;
  for (const auto& kv : subs_)
    tier_used = tier_used || kv.first.tier == tier;
  if (!tier_used)
    tiers_.erase(tier);
  decideLocked();
}

bool ShapingCore::empty() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  return subs_.empty();
}

std::vector<std::string> ShapingCore::activeTiers() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& kv : tiers_)
    out.push_back(kv.first);
  return out;
}

std::vector<std::string> ShapingCore::unresolved(double now_s) const
{
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& kv : nodes_)
    if (kv.second.refs > 0 && kv.second.host.empty() && kv.second.next_lookup_s <= now_s)
      out.push_back(kv.first);
  return out;
}

void ShapingCore::setHost(const std::string& node, const std::string& host, double now_s, double retry_s)
{
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node);
  if (it == nodes_.end())
    return;  // gone meanwhile
  it->second.host = host;
  if (host.empty())
    it->second.next_lookup_s = now_s + retry_s;
}

std::map<std::string, std::string> ShapingCore::hosts() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, std::string> out;
  for (const auto& kv : nodes_)
    if (kv.second.refs > 0)
      out[kv.first] = kv.second.host;
  return out;
}

bool ShapingCore::setPaths(const std::map<std::string, std::pair<std::string, std::string>>& machine_and_path)
{
  std::lock_guard<std::mutex> lock(mutex_);
  bool changed = false;
  for (auto& kv : nodes_)
  {
    auto f = machine_and_path.find(kv.first);
    if (f == machine_and_path.end())
      continue;
    kv.second.machine = f->second.first;
    if (f->second.second != kv.second.path)
    {
      changed = true;
      kv.second.path = f->second.second;
      for (auto& s : subs_)
        if (s.first.node == kv.first)
        {
          s.second->cap.reset();  // learnt on the old path
          // the messages of the old path's stream (a direct viewer's full-size frames) do not set
          // the pace of the new one: a new peak window, from the end of the counting window now
          // open (a message admitted before the change may still be reported in it)
          auto t = tiers_.find(s.first.tier);
          if (t != tiers_.end())
          {
            t->second->peak_bytes = t->second->last_peak_bytes = 0;
            t->second->peak_restart = true;
          }
        }
    }
  }
  decideLocked();
  return changed;
}

void ShapingCore::decideLocked()
{
  std::map<std::string, std::vector<SubscriberView>> views;
  for (const auto& kv : subs_)
  {
    const NodeInfo& n = nodes_[kv.first.node];
    SubscriberView v;
    v.node = kv.first.node;
    v.host = n.machine;
    v.path = n.path;
    v.observed_cap_kbps = kv.second->cap.cap();
    views[kv.first.tier].push_back(v);
  }
  for (auto& kv : tiers_)
    kv.second->policy.setSubscribers(views[kv.first]);
}

double ShapingCore::backlogLimitMs(const Tier& t) const
{
  // one message of the tier's stream is last_out_hz's period long, in ms of the stream
  const double message_ms = t.last_out_hz > 0.0 ? 1000.0 / t.last_out_hz : 0.0;
  return std::max(settings_.max_backlog_ms, settings_.min_backlog_messages * message_ms);
}

bool ShapingCore::forceKeyframeLocked(Tier& t, double now_s)
{
  if (now_s - t.last_forced_keyframe_s < kMinForcedKeyframeS)
    return false;
  t.keyframe_wanted = true;
  t.last_forced_keyframe_s = now_s;
  return true;
}

void ShapingCore::observeDelivery(double now_s, const std::map<SubKey, DeliverySample>& samples)
{
  std::lock_guard<std::mutex> lock(mutex_);
  if (!settings_.adapt_to_delivery)
    return;
  std::map<std::string, bool> backed_up;
  for (auto& kv : subs_)
  {
    Sub& s = *kv.second;
    Tier& t = tierLocked(kv.first.tier);
    auto d = samples.find(kv.first);
    const DeliverySample got = d == samples.end() ? DeliverySample() : d->second;
    s.backlog_bytes = got.unsent_bytes;
    // acknowledged since the last check, in kbit/s; unknown on the first check, when the kernel
    // gives no counter, or when a connection came or went (the sum went down)
    double delivered_kbps = kNaN;
    const double dt = std::isnan(s.acked_at_s) ? 0.0 : now_s - s.acked_at_s;
    if (dt > 0.0 && got.acked_bytes > 0 && got.acked_bytes >= s.acked_bytes)
      delivered_kbps = static_cast<double>(got.acked_bytes - s.acked_bytes) * 8.0 / 1000.0 / dt;
    s.acked_bytes = got.acked_bytes;
    s.acked_at_s = now_s;
    s.queue_delay_ms = got.queue_delay_ms;
    SubscriberView v;
    v.path = nodes_[kv.first.node].path;
    const double out_kbps = t.last_kbps;
    const double max_backlog_ms = backlogLimitMs(t);
    s.cap.update(now_s, s.backlog_bytes, out_kbps, t.policy.budgetFor(v), max_backlog_ms, delivered_kbps,
                 got.queue_delay_ms);
    bool& b = backed_up[kv.first.tier];
    b = b || skipForBacklog(s.backlog_bytes, out_kbps, max_backlog_ms);
  }
  if (traits_.reference_chain)
    for (auto& kv : tiers_)
    {
      Tier& t = *kv.second;
      const bool now_backed = backed_up[kv.first];
      if (t.backed_up && !now_backed)
        forceKeyframeLocked(t, now_s);
      t.backed_up = now_backed;
    }
  decideLocked();
}

bool ShapingCore::anyBackedUp() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& kv : tiers_)
    if (kv.second->backed_up)
      return true;
  return false;
}

bool ShapingCore::recheck(double now_s, const std::map<SubKey, DeliverySample>& samples)
{
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, uint32_t> worst;
  for (auto& kv : subs_)
  {
    auto d = samples.find(kv.first);
    const uint32_t bytes = d == samples.end() ? 0 : d->second.unsent_bytes;
    kv.second->backlog_bytes = bytes;
    worst[kv.first.tier] = std::max(worst[kv.first.tier], bytes);
  }
  bool resumed = false;
  for (auto& kv : tiers_)
  {
    Tier& t = *kv.second;
    if (t.backed_up &&
        resumeAfterSkip(worst[kv.first], t.policy.videoBitrateKbps(), backlogLimitMs(t)))
    {
      t.backed_up = false;
      forceKeyframeLocked(t, now_s);
      resumed = true;
    }
  }
  return resumed;
}

void ShapingCore::requestKeyframe(const std::string& tier, double now_s)
{
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = tiers_.find(tier);
  if (traits_.reference_chain && it != tiers_.end())
    forceKeyframeLocked(*it->second, now_s);
}

Admission ShapingCore::admit(const std::string& tier, double now_s)
{
  std::lock_guard<std::mutex> lock(mutex_);
  Admission a;
  auto it = tiers_.find(tier);
  if (it == tiers_.end())
    return a;  // nobody reads this tier
  Tier& t = *it->second;
  ++t.in;
  a.decision = t.policy.decision();
  a.target_kbps = t.policy.videoBitrateKbps();
  if (t.backed_up)
  {
    ++t.skipped;
    a.skipped = true;
    return a;
  }
  // Frame gate: pass a message when it is due one period of the rate NOW after the last one's
  // slot (a rate raised since, e.g. once a large first message is followed by reduced ones or a
  // delivery cap is lifted, takes effect at once instead of after the old, longer period); a 20 %
  // early tolerance keeps a 30 Hz input at 30 Hz under a 30 Hz cap despite arrival jitter. The
  // slot keeps the phase of the schedule, at most one period behind the message.
  const double period = 1.0 / a.decision.rate_hz;
  if (now_s < t.last_slot_s + 0.8 * period)
    return a;
  t.last_slot_s = std::isinf(t.last_slot_s) ? now_s : std::min(std::max(t.last_slot_s + period, now_s - period), now_s);
  a.due = true;
  if (traits_.reference_chain && t.keyframe_wanted)
  {
    a.keyframe = true;
    t.keyframe_wanted = false;
  }
  return a;
}

void ShapingCore::sent(const std::string& tier, const SentReport& report)
{
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = tiers_.find(tier);
  if (it == tiers_.end())
    return;
  Tier& t = *it->second;
  ++t.out;
  t.keyframes += report.keyframe ? 1 : 0;
  t.bytes += report.bytes;
  t.encode_ms += report.encode_ms;
  t.peak_bytes = std::max(t.peak_bytes, report.bytes);
  if (t.format != report.format)
    t.format = report.format;
  if (traits_.size_feedback)
    t.policy.onFrameEncoded(report.bytes, report.quality);
}

void ShapingCore::failed(const std::string& tier)
{
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = tiers_.find(tier);
  if (it != tiers_.end() && traits_.reference_chain)
    it->second->keyframe_wanted = true;  // the decoders may have missed a reference
}

std::vector<TierState> ShapingCore::snapshot(double now_s)
{
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TierState> out;
  for (auto& kv : tiers_)
  {
    Tier& t = *kv.second;
    if (std::isnan(t.window_start_s))
      t.window_start_s = now_s;
    const double secs = std::max(1e-3, now_s - t.window_start_s);
    if (secs >= 0.5)  // a fresh window at most twice a second; connect events reuse the last one
    {
      t.last_in_hz = t.in / secs;
      t.last_out_hz = t.out / secs;
      t.last_kbps = t.bytes * 8.0 / 1000.0 / secs;
      t.last_bytes = t.out ? static_cast<double>(t.bytes) / t.out : kNaN;
      t.last_encode_ms = t.out ? t.encode_ms / t.out : kNaN;
      t.last_keyframes = t.keyframes;
      t.last_skipped = t.skipped;
      t.in = t.out = t.bytes = 0;
      t.keyframes = t.skipped = 0;
      t.encode_ms = 0.0;
      t.window_start_s = now_s;
      t.policy.setInputRate(t.last_in_hz > 0.0 ? t.last_in_hz : kNaN);
      if (std::isnan(t.peak_window_start_s))
        t.peak_window_start_s = now_s;
      if (t.peak_restart)
      {
        t.peak_bytes = t.last_peak_bytes = 0;
        t.peak_window_start_s = now_s;
        t.peak_restart = false;
      }
      else if (now_s - t.peak_window_start_s >= kPeakWindowS)
      {
        t.last_peak_bytes = t.peak_bytes;
        t.peak_bytes = 0;
        t.peak_window_start_s = now_s;
      }
    }
    TierState st;
    st.tier = kv.first;
    st.decision = t.policy.decision();
    st.target_kbps = t.policy.videoBitrateKbps();
    st.input_rate_hz = t.last_in_hz;
    st.output_rate_hz = t.last_out_hz;
    st.bitrate_kbps = t.last_kbps;
    st.frame_bytes = t.last_bytes;
    st.encode_ms = t.last_encode_ms;
    st.keyframes = t.last_keyframes;
    st.skipped = t.last_skipped;
    st.format = t.format;
    st.backed_up = t.backed_up;
    for (const SubscriberView& v : t.policy.subscribers())
    {
      SubscriberState s;
      s.tier = kv.first;
      s.node = v.node;
      s.host = v.host;
      s.path = v.path;
      s.wanted_tier = tierForPath(v.path, settings_.policy);
      s.budget_kbps = nanIfInf(t.policy.budgetFor(v));
      s.observed_cap_kbps = v.observed_cap_kbps;
      auto it = subs_.find(SubKey{ kv.first, v.node });
      if (it != subs_.end())
      {
        s.backlog_bytes = it->second->backlog_bytes;
        s.queue_delay_ms = it->second->queue_delay_ms;
      }
      const double pace = paceLocked(&t, v.path);
      s.pacing_kbps = pace > 0.0 ? pace : kNaN;
      st.subscribers.push_back(s);
    }
    out.push_back(st);
  }
  return out;
}

std::map<SubKey, double> ShapingCore::pacing() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<SubKey, double> out;
  for (const auto& kv : subs_)
  {
    auto node = nodes_.find(kv.first.node);
    const std::string path = node == nodes_.end() ? std::string(paths::kUnknown) : node->second.path;
    auto tier = tiers_.find(kv.first.tier);
    out[kv.first] = paceLocked(tier == tiers_.end() ? nullptr : tier->second.get(), path);
  }
  return out;
}

double ShapingCore::paceLocked(const Tier* t, const std::string& path) const
{
  const double pace = pacingKbpsForPath(path, settings_);
  if (!(pace > 0.0) || !t)
    return pace;
  const double peak = static_cast<double>(std::max(t->peak_bytes, t->last_peak_bytes));
  return std::max(pace, deadlinePaceKbps(peak, t->last_out_hz));
}

std::map<std::string, std::string> ShapingCore::directory() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, std::string> out;
  for (const auto& kv : nodes_)
    if (kv.second.refs > 0)
      out[kv.first] = tierForPath(kv.second.path, settings_.policy);
  return out;
}

}  // namespace overlay_manager
