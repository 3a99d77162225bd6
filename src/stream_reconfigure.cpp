// A link-aware stream's dynamic_reconfigure server (link_aware_stream.h startReconfigure): the
// generated configs of cfg/LinkAwareJpeg.cfg and cfg/LinkAwareH264.cfg <-> StreamOptions.
#include "overlay_manager/link_aware_stream.h"

#include <overlay_manager/LinkAwareH264Config.h>
#include <overlay_manager/LinkAwareJpegConfig.h>

#include <dynamic_reconfigure/server.h>

#include <algorithm>
#include <memory>
#include <boost/thread/recursive_mutex.hpp>

namespace overlay_manager
{
namespace
{
/// budget parameter suffix -> path word (the order of the cfg files)
const std::pair<const char*, const char*> kBudgetPaths[] = {
  { "derp", paths::kDerp },       { "peer_relay", paths::kPeerRelay }, { "idle", paths::kIdle },
  { "unknown", paths::kUnknown }, { "offline", paths::kOffline },      { "direct", paths::kDirect },
  { "self", paths::kSelf },
};

double budgetOf(const PolicyParams& p, const char* path)
{
  auto it = p.budget_kbps.find(path);
  return it == p.budget_kbps.end() ? 0.0 : it->second;
}

void setBudget(PolicyParams* p, const char* path, double kbps)
{
  if (kbps > 0.0)
    p->budget_kbps[path] = kbps;
  else
    p->budget_kbps.erase(path);
}

/// Settings both configs have. Lower limits above upper ones are lowered to them (the config shown
/// in rqt_reconfigure then says what applies).
template <class Config>
void commonToOptions(Config& c, StreamOptions* o)
{
  c.min_rate = std::min(c.min_rate, c.max_rate);
  o->policy.max_rate_hz = c.max_rate;
  o->policy.min_rate_hz = c.min_rate;
  o->adapt_to_delivery = c.adapt_to_delivery;
  o->max_backlog_ms = c.max_backlog_ms;
  if (c.pacing_factor > 0.0 && c.pacing_factor < 1.0)
    c.pacing_factor = 1.0;  // below its budget a subscriber's connection could not carry its stream
  o->pacing_factor = c.pacing_factor;
}

template <class Config>
void commonFromOptions(const StreamOptions& o, Config* c)
{
  c->max_rate = o.policy.max_rate_hz;
  c->min_rate = o.policy.min_rate_hz;
  c->adapt_to_delivery = o.adapt_to_delivery;
  c->max_backlog_ms = o.max_backlog_ms;
  c->pacing_factor = o.pacing_factor;
}

void toOptions(LinkAwareJpegConfig& c, StreamOptions* o)
{
  commonToOptions(c, o);
  c.min_quality = std::min(c.min_quality, c.max_quality);
  o->policy.max_quality = c.max_quality;
  o->policy.min_quality = c.min_quality;
  o->png_level = c.png_level;
  const double values[] = { c.budget_kbps_derp,    c.budget_kbps_peer_relay, c.budget_kbps_idle, c.budget_kbps_unknown,
                            c.budget_kbps_offline, c.budget_kbps_direct,     c.budget_kbps_self };
  for (size_t i = 0; i < 7; ++i)
    setBudget(&o->policy, kBudgetPaths[i].second, values[i]);
}

void fromOptions(const StreamOptions& o, LinkAwareJpegConfig* c)
{
  commonFromOptions(o, c);
  c->max_quality = o.policy.max_quality;
  c->min_quality = o.policy.min_quality;
  c->png_level = o.png_level;
  double* values[] = { &c->budget_kbps_derp,    &c->budget_kbps_peer_relay, &c->budget_kbps_idle,
                       &c->budget_kbps_unknown, &c->budget_kbps_offline,    &c->budget_kbps_direct,
                       &c->budget_kbps_self };
  for (size_t i = 0; i < 7; ++i)
    *values[i] = budgetOf(o.policy, kBudgetPaths[i].second);
}

void toOptions(LinkAwareH264Config& c, StreamOptions* o)
{
  commonToOptions(c, o);
  c.min_video_kbps = std::min(c.min_video_kbps, c.max_video_kbps);
  o->crf = c.crf;
  o->full_crf = c.full_crf;
  o->gop = c.gop;
  o->policy.max_video_kbps = c.max_video_kbps;
  o->policy.min_video_kbps = c.min_video_kbps;
  o->policy.video_share = c.video_share;
  const double values[] = { c.video_budget_kbps_derp,    c.video_budget_kbps_peer_relay, c.video_budget_kbps_idle,
                            c.video_budget_kbps_unknown, c.video_budget_kbps_offline,    c.video_budget_kbps_direct,
                            c.video_budget_kbps_self };
  for (size_t i = 0; i < 7; ++i)
    setBudget(&o->policy, kBudgetPaths[i].second, values[i]);
}

void fromOptions(const StreamOptions& o, LinkAwareH264Config* c)
{
  commonFromOptions(o, c);
  c->crf = o.crf;
  c->full_crf = o.full_crf;
  c->gop = o.gop;
  c->max_video_kbps = o.policy.max_video_kbps;
  c->min_video_kbps = o.policy.min_video_kbps;
  c->video_share = o.policy.video_share;
  double* values[] = { &c->video_budget_kbps_derp,    &c->video_budget_kbps_peer_relay, &c->video_budget_kbps_idle,
                       &c->video_budget_kbps_unknown, &c->video_budget_kbps_offline,    &c->video_budget_kbps_direct,
                       &c->video_budget_kbps_self };
  for (size_t i = 0; i < 7; ++i)
    *values[i] = budgetOf(o.policy, kBudgetPaths[i].second);
}

/// The server and the mutex it needs, kept alive together.
template <class Config>
struct Reconfigure
{
  boost::recursive_mutex mutex;
  dynamic_reconfigure::Server<Config> server;
  Reconfigure(LinkAwareStream& stream, const ros::NodeHandle& nh) : server(mutex, nh)
  {
    // the parameters the stream read at start (defaults, launch files, the republisher's shared
    // namespace) are what rqt_reconfigure shows first, not the cfg's defaults
    Config now;
    {
      boost::recursive_mutex::scoped_lock lock(mutex);
      server.getConfigDefault(now);
    }
    fromOptions(stream.settings(), &now);
    server.updateConfig(now);
    auto first = std::make_shared<bool>(true);  // setCallback calls it once with the settings above
    server.setCallback([&stream, first](Config& c, uint32_t /*level*/) {
      StreamOptions o = stream.settings();
      toOptions(c, &o);
      stream.applySettings(o);
      if (!*first)
        ROS_INFO("%s: settings changed (dynamic_reconfigure)", stream.topic().c_str());
      *first = false;
    });
  }
};
}  // namespace

std::shared_ptr<void> startReconfigure(LinkAwareStream& stream, const ros::NodeHandle& params)
{
  if (stream.options().format == "h264")
    return std::make_shared<Reconfigure<LinkAwareH264Config>>(stream, params);
  return std::make_shared<Reconfigure<LinkAwareJpegConfig>>(stream, params);
}

}  // namespace overlay_manager
