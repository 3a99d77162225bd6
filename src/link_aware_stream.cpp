// One link-aware image stream (see link_aware_stream.h).
#include "overlay_manager/link_aware_stream.h"

#include "overlay_manager/param_inheritance.h"
#include "overlay_manager/subscriber_hosts.h"
#include "overlay_manager/viewer_decoders.h"

#include <set>
#include <string>

namespace overlay_manager
{

std::map<std::string, XmlRpc::XmlRpcValue> paramsIn(const ros::NodeHandle& nh)
{
  std::map<std::string, XmlRpc::XmlRpcValue> out;
  XmlRpc::XmlRpcValue all;
  if (!nh.getParam(nh.getNamespace(), all) || all.getType() != XmlRpc::XmlRpcValue::TypeStruct)
    return out;
  for (XmlRpc::XmlRpcValue::iterator it = all.begin(); it != all.end(); ++it)
    out.insert(*it);
  return out;
}

namespace
{
/// What the node wrote into `stream`'s namespace last time (key -> value; param_inheritance.h).
std::map<std::string, XmlRpc::XmlRpcValue> remembered(const std::map<std::string, XmlRpc::XmlRpcValue>& params)
{
  std::map<std::string, XmlRpc::XmlRpcValue> out;
  const auto it = params.find(kInheritedParamsKey);
  if (it == params.end() || it->second.getType() != XmlRpc::XmlRpcValue::TypeStruct)
    return out;
  XmlRpc::XmlRpcValue record = it->second;
  for (XmlRpc::XmlRpcValue::iterator r = record.begin(); r != record.end(); ++r)
    out.insert(*r);
  return out;
}

void remember(const ros::NodeHandle& stream, const std::map<std::string, XmlRpc::XmlRpcValue>& written)
{
  if (written.empty())
  {
    stream.deleteParam(kInheritedParamsKey);
    return;
  }
  XmlRpc::XmlRpcValue record;
  for (const auto& kv : written)
    record[kv.first] = kv.second;
  stream.setParam(kInheritedParamsKey, record);
}
}  // namespace

void inheritParams(const std::map<std::string, XmlRpc::XmlRpcValue>& shared, const ros::NodeHandle& stream)
{
  std::map<std::string, XmlRpc::XmlRpcValue> current = paramsIn(stream);
  const std::map<std::string, XmlRpc::XmlRpcValue> before = remembered(current);
  current.erase(kInheritedParamsKey);
  const InheritPlan<XmlRpc::XmlRpcValue> plan = planInherit(shared, current, before);
  // remembered first: a crash in between leaves no copy that would pass for the user's
  remember(stream, plan.set);
  for (const auto& kv : plan.set)
    stream.setParam(kv.first, kv.second);
  for (const std::string& key : plan.erase)
    stream.deleteParam(key);
}

void startRecordingServerParams(const ros::NodeHandle& ns, const std::function<void()>& start_server)
{
  const std::map<std::string, XmlRpc::XmlRpcValue> before = paramsIn(ns);
  std::set<std::string> owned, present;
  for (const auto& kv : remembered(before))
    owned.insert(kv.first);
  for (const auto& kv : before)
    present.insert(kv.first);
  start_server();
  remember(ns, rememberAfterStart(owned, present, paramsIn(ns)));
}

HostAliases readHostAliases(const ros::NodeHandle& pnh)
{
  HostAliases out;
  XmlRpc::XmlRpcValue raw;
  if (!pnh.getParam("host_aliases", raw))
    return out;
  const std::string key = pnh.getNamespace() + "/host_aliases";
  if (raw.getType() == XmlRpc::XmlRpcValue::TypeString && static_cast<std::string>(raw).empty())
    return out;
  if (raw.getType() != XmlRpc::XmlRpcValue::TypeStruct)
    throw ParamError(key + ": must be a mapping host -> machine name, e.g. {\"192.168.1.20\": robot2}");
  for (XmlRpc::XmlRpcValue::iterator it = raw.begin(); it != raw.end(); ++it)
  {
    XmlRpc::XmlRpcValue& v = it->second;
    if (normaliseHost(it->first).empty() || v.getType() != XmlRpc::XmlRpcValue::TypeString ||
        normaliseHost(static_cast<std::string>(v)).empty())
      throw ParamError(key + "/" + it->first + ": must map a host name or address to a machine's short name");
    out[it->first] = static_cast<std::string>(v);
  }
  return out;
}

StreamOptions readStreamOptions(const ros::NodeHandle& pnh, const std::string& format)
{
  StreamOptions o;
  const std::string ns = pnh.getNamespace();
  o.format = format.empty() ? pnh.param<std::string>("format", o.format) : format;
  if (o.format != "jpeg" && o.format != "png" && (o.format != "h264" || format.empty()))
    throw ParamError(ns + "/format: '" + o.format + "' is not jpeg or png (H.264 is the link_aware_h264 transport)");
  o.png_level = pnh.param("png_level", o.png_level);
  o.gop = pnh.param("gop", o.gop);
  if (o.gop < 1)
    throw ParamError(ns + "/gop: the keyframe interval must be >= 1 frame, got " + std::to_string(o.gop));
  o.crf = pnh.param("crf", o.crf);
  if (!(o.crf >= 0.0 && o.crf <= 51.0))
    throw ParamError(ns + "/crf: x264's rate factor must be in [0, 51] (0 = average bitrate), got " +
                     std::to_string(o.crf));
  o.full_crf = pnh.param("full_crf", o.full_crf);
  if (!(o.full_crf >= 0.0 && o.full_crf <= 51.0))
    throw ParamError(ns + "/full_crf: x264's rate factor must be in [0, 51] (0 = crf), got " +
                     std::to_string(o.full_crf));
  PolicyParams& p = o.policy;
  p.max_video_kbps = pnh.param("max_video_kbps", p.max_video_kbps);
  p.min_video_kbps = pnh.param("min_video_kbps", p.min_video_kbps);
  p.video_share = pnh.param("video_share", p.video_share);
  if (!(p.max_video_kbps > 0.0) || !(p.min_video_kbps > 0.0) || !(p.video_share > 0.0 && p.video_share <= 1.0))
    throw ParamError(ns + ": need max_video_kbps > 0, min_video_kbps > 0 and 0 < video_share <= 1");
  p.max_rate_hz = pnh.param("max_rate", p.max_rate_hz);
  p.min_rate_hz = pnh.param("min_rate", p.min_rate_hz);
  p.max_quality = pnh.param("max_quality", p.max_quality);
  p.min_quality = pnh.param("min_quality", p.min_quality);
  const std::map<std::string, std::string> keys = {
      {paths::kDerp, "budget_kbps_derp"},       {paths::kPeerRelay, "budget_kbps_peer_relay"},
      {paths::kIdle, "budget_kbps_idle"},       {paths::kUnknown, "budget_kbps_unknown"},
      {paths::kOffline, "budget_kbps_offline"}, {paths::kDirect, "budget_kbps_direct"},
      {paths::kSelf, "budget_kbps_self"}};
  // H.264 has its own budgets (video_budget_kbps_<path>, defaultVideoBudgetsKbps): JPEG's would give
  // it several times the bitrate it needs; distinct names also let the republisher, whose two
  // streams share one private namespace, set them apart
  const bool h264 = o.format == "h264";
  const std::string prefix = h264 ? "video_" : "";
  if (h264)
    p.budget_kbps = defaultVideoBudgetsKbps();
  for (const auto& kv : keys)
  {
    double dflt = p.budget_kbps.count(kv.first) ? p.budget_kbps[kv.first] : 0.0;
    const std::string old_name = prefix + "budget_kbps_local";
    if (kv.first == paths::kSelf && !pnh.hasParam(prefix + kv.second) && pnh.getParam(old_name, dflt))
      ROS_WARN("%s/%s is the old name of %s%s (the path word is Peer.PATH_SELF, \"self\"): rename the "
               "parameter", ns.c_str(), old_name.c_str(), prefix.c_str(), kv.second.c_str());
    const double v = pnh.param(prefix + kv.second, dflt);
    if (v > 0.0)
      p.budget_kbps[kv.first] = v;
    else
      p.budget_kbps.erase(kv.first);
  }
  if (p.max_rate_hz <= 0.0 || p.min_quality < 1 || p.max_quality > 100 || p.min_quality > p.max_quality)
    throw ParamError(ns + ": bad limits: need max_rate > 0 and 1 <= min_quality <= max_quality <= 100 (got max_rate=" +
                     std::to_string(p.max_rate_hz) + ", min_quality=" + std::to_string(p.min_quality) +
                     ", max_quality=" + std::to_string(p.max_quality) + ")");
  o.adapt_to_delivery = pnh.param("adapt_to_delivery", o.adapt_to_delivery);
  o.max_backlog_ms = pnh.param("max_backlog_ms", o.max_backlog_ms);
  o.pacing_factor = pnh.param("pacing_factor", o.pacing_factor);
  if (!(o.pacing_factor == 0.0 || (o.pacing_factor >= 1.0 && o.pacing_factor <= 100.0)))
    throw ParamError(ns + "/pacing_factor: must be 0 (no pacing) or in 1..100 (x the path's budget), got " +
                     std::to_string(o.pacing_factor));
  o.state_period = pnh.param("state_period", o.state_period);
  if (!(o.state_period > 0.0))
    throw ParamError(ns + "/state_period: must be > 0 s, got " + std::to_string(o.state_period));
  o.peers_topic = pnh.param<std::string>("peers_topic", "");
  o.tiers = pnh.param("tiers", o.tiers);
  o.host_aliases = readHostAliases(pnh);
  try
  {
    o.limits = readImageLimits(pnh);
  }
  catch (const std::invalid_argument& e)
  {
    throw ParamError(e.what());
  }
  return o;
}

namespace
{
TopicOptions topicOptions(const StreamOptions& o)
{
  TopicOptions t;
  t.core.policy = o.policy;
  t.core.adapt_to_delivery = o.adapt_to_delivery;
  t.core.max_backlog_ms = o.max_backlog_ms;
  t.core.pacing_factor = o.pacing_factor;
  t.state_period = o.state_period;
  t.peers_topic = o.peers_topic;
  t.host_aliases = o.host_aliases;
  t.tiers = o.tiers;
  return t;
}
}  // namespace

LinkAwareStream::LinkAwareStream(const ros::NodeHandle& nh, const std::string& topic, const std::string& input_topic,
                                 const StreamOptions& options)
  : initial_options_(options), options_(options)
{
  ImageSettingsFn settings = [this] { return codecSettings(); };
  // the codec of the stream's format: the one place that chooses it
  ImageShaperKind kind = options.format == "h264" ? h264ShaperKind(settings) : jpegShaperKind(options.format, settings);
  const ShaperTraits traits = kind.traits;
  const DescribeFn describe = kind.describe;
  shapers_.reset(new TierShapers<sensor_msgs::Image, sensor_msgs::CompressedImage>(std::move(kind)));
  shaped_.reset(new ShapedTopic(nh, topic, input_topic, traits, topicOptions(options), describe));
}

LinkAwareStream::~LinkAwareStream()
{
  // the reconfigure server first: its shutdown takes its callbacks off the control queue (waiting
  // for one that runs), which must still exist; then the shaped topic joins the control thread
  reconfigure_.reset();
  shaped_.reset();
}

void LinkAwareStream::start()
{
  ros::NodeHandle params(param_ns_.empty() ? topic() : param_ns_);
  params.setCallbackQueue(shaped_->controlQueue());  // reconfigure requests run on the control thread
  // the server writes its values into the namespace: the ones it adds are the node's, not the
  // user's (inheritParams refreshes or removes them at the next start)
  startRecordingServerParams(params, [this, &params] {
    try
    {
      reconfigure_ = startReconfigure(*this, params);
    }
    catch (const std::exception& e)  // a plugin must not take the driver down
    {
      ROS_ERROR("%s: no dynamic_reconfigure server (%s): settings are fixed until a restart", topic().c_str(),
                e.what());
    }
  });
  shaped_->start();
}

void LinkAwareStream::stop()
{
  shaped_->stop();
  reconfigure_.reset();
}

StreamOptions LinkAwareStream::settings() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  return options_;
}

ImageCodecSettings LinkAwareStream::codecSettings() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  ImageCodecSettings s;
  s.format = options_.format;
  s.png_level = options_.png_level;
  s.gop = options_.gop;
  s.crf = options_.crf;
  s.full_crf = options_.full_crf;
  s.fps = options_.policy.max_rate_hz;
  s.limits = options_.limits;
  return s;
}

void LinkAwareStream::applySettings(const StreamOptions& updated)
{
  {
    std::lock_guard<std::mutex> lock(mutex_);
    options_.policy = updated.policy;
    options_.crf = updated.crf;
    options_.full_crf = updated.full_crf;
    options_.gop = updated.gop;
    options_.png_level = updated.png_level;
    options_.adapt_to_delivery = updated.adapt_to_delivery;
    options_.max_backlog_ms = updated.max_backlog_ms;
    options_.pacing_factor = updated.pacing_factor;
  }
  shaped_->applySettings(topicOptions(updated).core);
}

void LinkAwareStream::offer(const sensor_msgs::Image& image, const PublishFn& publish)
{
  shaped_->offer<sensor_msgs::Image, sensor_msgs::CompressedImage>(image, *shapers_, publish);
}

}  // namespace overlay_manager
