// Topic shaper nodelet: serves one topic of any type to subscribers on relayed paths, fitted to
// their paths (docs/shaping.md). The original topic is left alone: subscribers on this machine
// and on direct paths read it as it is, at full rate and full content.
//
// A kind of shaped topic on the shaping core (shaper.h, shaped_topic.h): the core and its ROS
// adapter keep the subscribers per tier, their paths and budgets, delivery feedback and the skip
// gate, stream_state per tier and the tier directory; this file adds what is particular to it: any
// type in (topic_tools/ShapeShifter), ShapedMessage out, zstd and cloud reduction (topic_shaping.h).
//
// Topics (relative to the nodelet's namespace; robot.launch remaps `in` to each of shaped_topics)
//   in                          in   any type (bytes, never deserialized except a PointCloud2 that
//                                    is to be reduced); subscribed only while a tier has subscribers
//   in/shaped                   out  overlay_manager/ShapedMessage, the fitted tier: zstd (a cloud
//                                    byte-shuffled by its point_step first), reduced where the topic
//                                    allows it, rate fitted to the lowest budget of its subscribers'
//                                    paths and to what their connections deliver; queue 1 and no new
//                                    message while a connection is backed up (latest wins)
//   in/shaped/full              out  the full tier (~tiers, default true): the message as it is
//                                    (encoding raw), full rate, for subscribers without a budget
//   in/shaped/tiers             out  overlay_manager/TierDirectory (latched): which tier each
//                                    subscriber should read (unshape follows it)
//   in/shaped/type              out  overlay_manager/ShapedType (latched): the original type
//   <tier topic>/stream_state   out  overlay_manager/StreamState (latched), per tier
//
// Parameters (private): max_rate (Hz, 0 = none), budget_kbps_<path> (derp 4000, peer_relay 20000,
// idle/unknown/offline 4000; 0 = none), compression (zstd|none), zstd_level (1), lossy
// (none|decimate|voxel), lossy_below_hz (2), max_decimation (64), voxel_m (0.05), max_backlog_ms
// (500), adapt_to_delivery, pacing_factor (2.5), state_period (1 s), tiers (true), peers_topic, host_aliases,
// max_message_bytes, max_points. All but topics, compression, tiers, peers_topic and host_aliases are
// live: a dynamic_reconfigure server per shaped topic (cfg/TopicShaper.cfg) in its namespace.
//
// Threads: the message thread (the nodelet's single-threaded queue) runs onMessage and the
// ShapedTopic loop (shapers per tier, publish); the adapter's control thread runs the rest and the
// hook that (un)subscribes the input (shaped_topic.h, "Threads and locks").
#include "overlay_manager/link_aware_stream.h"  // ParamError, readHostAliases, inheritance
#include "overlay_manager/param_inheritance.h"
#include "overlay_manager/shaped_topic.h"
#include "overlay_manager/shaper.h"
#include "overlay_manager/problem_log.h"
#include "overlay_manager/topic_shaping.h"

#include <nodelet/nodelet.h>
#include <overlay_manager/PeerList.h>
#include <overlay_manager/ShapedMessage.h>
#include <overlay_manager/ShapedType.h>
#include <overlay_manager/CodecValue.h>
#include <overlay_manager/StreamState.h>
#include <overlay_manager/TopicShaperConfig.h>
#include <dynamic_reconfigure/server.h>
#include <boost/thread/recursive_mutex.hpp>
#include <pluginlib/class_list_macros.hpp>
#include <ros/ros.h>
#include <sensor_msgs/PointCloud2.h>
#include <topic_tools/shape_shifter.h>


#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

namespace overlay_manager
{
namespace
{
const char* const kCloudType = "sensor_msgs/PointCloud2";

/// True when a message definition's first field is a std_msgs/Header (its bytes start with one).
bool startsWithHeader(const std::string& definition)
{
  std::istringstream lines(definition);
  for (std::string line; std::getline(lines, line);)
  {
    const size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos || line[b] == '#')
      continue;
    std::istringstream words(line.substr(b));
    std::string type, name;
    words >> type >> name;
    return (type == "Header" || type == "std_msgs/Header") && name == "header";
  }
  return false;
}

/// The header at the start of `data` (seq, stamp, frame_id); false when the bytes cannot hold it.
bool readHeader(const uint8_t* data, size_t size, std_msgs::Header* h)
{
  if (size < 16)
    return false;
  uint32_t v[4];
  std::memcpy(v, data, 16);
  if (v[3] > size - 16 || v[3] > 4096)
    return false;
  h->seq = v[0];
  h->stamp.sec = v[1];
  h->stamp.nsec = v[2];
  h->frame_id.assign(reinterpret_cast<const char*>(data) + 16, v[3]);
  return true;
}

shaping::CloudLayout layoutOf(const sensor_msgs::PointCloud2& c)
{
  shaping::CloudLayout l;
  l.height = c.height;
  l.width = c.width;
  l.is_bigendian = c.is_bigendian;
  l.point_step = c.point_step;
  l.row_step = c.row_step;
  l.is_dense = c.is_dense;
  for (const sensor_msgs::PointField& f : c.fields)
    l.fields.push_back({ f.name, f.offset, f.datatype, f.count });
  return l;
}

double readDouble(const ros::NodeHandle& pnh, const std::string& name, double dflt)
{
  double v = dflt;
  if (!pnh.getParam(name, v))
  {
    int i;
    if (pnh.getParam(name, i))
      v = i;
    else if (pnh.hasParam(name))
      throw ParamError(pnh.getNamespace() + "/" + name + ": must be a number");
  }
  return v;
}
}  // namespace

/// The shaper's settings (the parameters in the header above); throws ParamError naming the parameter.
struct ShaperOptions
{
  shaping::ShapingParams shaping;
  shaping::CloudLimits cloud_limits;
  size_t max_message_bytes = shaping::kDefaultMaxMessageBytes;
  double max_backlog_ms = 500.0;
  double state_period = 1.0;
  bool adapt_to_delivery = true;
  double pacing_factor = kDefaultPacingFactor;  ///< budgeted connections paced at this x their budget; 0 = off
  std::string peers_topic;
  HostAliases host_aliases;
};

ShaperOptions readShaperOptions(const ros::NodeHandle& pnh)
{
  ShaperOptions o;
  const std::string ns = pnh.getNamespace();
  shaping::ShapingParams& p = o.shaping;
  p.max_rate_hz = readDouble(pnh, "max_rate", p.max_rate_hz);
  if (!(p.max_rate_hz >= 0.0))
    throw ParamError(ns + "/max_rate: must be >= 0 Hz (0 = no cap), got " + std::to_string(p.max_rate_hz));
  const std::map<std::string, std::string> keys = {
      {paths::kDerp, "budget_kbps_derp"},       {paths::kPeerRelay, "budget_kbps_peer_relay"},
      {paths::kIdle, "budget_kbps_idle"},       {paths::kUnknown, "budget_kbps_unknown"},
      {paths::kOffline, "budget_kbps_offline"}, {paths::kDirect, "budget_kbps_direct"},
      {paths::kSelf, "budget_kbps_self"}};
  for (const auto& kv : keys)
  {
    const double v = readDouble(pnh, kv.second, p.budget_kbps.count(kv.first) ? p.budget_kbps[kv.first] : 0.0);
    if (v < 0.0 || std::isnan(v))
      throw ParamError(ns + "/" + kv.second + ": must be >= 0 kbit/s (0 = no budget), got " + std::to_string(v));
    if (v > 0.0)
      p.budget_kbps[kv.first] = v;
    else
      p.budget_kbps.erase(kv.first);
  }
  const std::string compression = pnh.param<std::string>("compression", "zstd");
  if (compression != "zstd" && compression != "none")
    throw ParamError(ns + "/compression: '" + compression + "' is not zstd or none");
  p.compress = compression == "zstd";
  p.zstd_level = pnh.param("zstd_level", p.zstd_level);
  if (p.zstd_level < -7 || p.zstd_level > 19)
    throw ParamError(ns + "/zstd_level: must be in -7..19 (1 = fast), got " + std::to_string(p.zstd_level));
  const std::string lossy = pnh.param<std::string>("lossy", "none");
  if (!shaping::parseLossy(lossy, &p.lossy))
    throw ParamError(ns + "/lossy: '" + lossy + "' is not none, decimate or voxel (point clouds only)");
  p.lossy_below_hz = readDouble(pnh, "lossy_below_hz", p.lossy_below_hz);
  const int max_dec = pnh.param("max_decimation", static_cast<int>(p.max_decimation));
  if (max_dec < 1)
    throw ParamError(ns + "/max_decimation: must be >= 1, got " + std::to_string(max_dec));
  p.max_decimation = static_cast<uint32_t>(max_dec);
  p.voxel_m = readDouble(pnh, "voxel_m", p.voxel_m);
  if (!(p.voxel_m > 0.0) || !(p.lossy_below_hz > 0.0))
    throw ParamError(ns + ": voxel_m (m) and lossy_below_hz (Hz) must be > 0");
  o.max_backlog_ms = readDouble(pnh, "max_backlog_ms", o.max_backlog_ms);
  o.state_period = readDouble(pnh, "state_period", o.state_period);
  if (!(o.state_period > 0.0) || !(o.max_backlog_ms > 0.0))
    throw ParamError(ns + ": state_period (s) and max_backlog_ms (ms) must be > 0");
  o.adapt_to_delivery = pnh.param("adapt_to_delivery", o.adapt_to_delivery);
  o.pacing_factor = readDouble(pnh, "pacing_factor", o.pacing_factor);
  if (!(o.pacing_factor == 0.0 || (o.pacing_factor >= 1.0 && o.pacing_factor <= 100.0)))
    throw ParamError(ns + "/pacing_factor: must be 0 (no pacing) or in 1..100 (x the path's budget), got " +
                     std::to_string(o.pacing_factor));
  const double max_bytes = readDouble(pnh, "max_message_bytes", static_cast<double>(o.max_message_bytes));
  if (!(max_bytes >= 1024.0 && max_bytes <= 4294967295.0))
    throw ParamError(ns + "/max_message_bytes: must be in 1024..4294967295, got " + std::to_string(max_bytes));
  o.max_message_bytes = static_cast<size_t>(max_bytes);
  const double max_points = readDouble(pnh, "max_points", static_cast<double>(o.cloud_limits.max_points));
  if (!(max_points >= 1.0))
    throw ParamError(ns + "/max_points: must be >= 1");
  o.cloud_limits.max_points = static_cast<uint64_t>(max_points);
  o.peers_topic = pnh.param<std::string>("peers_topic", "");
  o.host_aliases = readHostAliases(pnh);
  return o;
}

namespace
{
/// budget parameter suffix -> path word (the order of cfg/TopicShaper.cfg)
const std::pair<const char*, const char*> kBudgetPaths[] = {
  { "derp", paths::kDerp },       { "peer_relay", paths::kPeerRelay }, { "idle", paths::kIdle },
  { "unknown", paths::kUnknown }, { "offline", paths::kOffline },      { "direct", paths::kDirect },
  { "self", paths::kSelf },
};

/// The live settings of `o` as cfg/TopicShaper.cfg's config (what rqt_reconfigure shows).
void toConfig(const ShaperOptions& o, TopicShaperConfig* c)
{
  const shaping::ShapingParams& p = o.shaping;
  c->max_rate = p.max_rate_hz;
  double* budgets[] = { &c->budget_kbps_derp,    &c->budget_kbps_peer_relay, &c->budget_kbps_idle,
                        &c->budget_kbps_unknown, &c->budget_kbps_offline,    &c->budget_kbps_direct,
                        &c->budget_kbps_self };
  for (size_t i = 0; i < 7; ++i)
  {
    const auto it = p.budget_kbps.find(kBudgetPaths[i].second);
    *budgets[i] = it == p.budget_kbps.end() ? 0.0 : it->second;
  }
  c->zstd_level = p.zstd_level;
  c->lossy = shaping::lossyWord(p.lossy);
  c->lossy_below_hz = p.lossy_below_hz;
  c->max_decimation = static_cast<int>(p.max_decimation);
  c->voxel_m = p.voxel_m;
  c->max_message_bytes = static_cast<double>(o.max_message_bytes);
  c->max_points = static_cast<double>(o.cloud_limits.max_points);
  c->adapt_to_delivery = o.adapt_to_delivery;
  c->max_backlog_ms = o.max_backlog_ms;
  c->pacing_factor = o.pacing_factor;
  c->state_period = o.state_period;
}

/// `base` with the live settings of `c`; throws ParamError naming the parameter (in `ns`) of a value
/// readShaperOptions would refuse (the cfg's ranges hold the others: dynamic_reconfigure clamps).
ShaperOptions fromConfig(const TopicShaperConfig& c, const ShaperOptions& base, const std::string& ns)
{
  ShaperOptions o = base;
  shaping::ShapingParams& p = o.shaping;
  if (!(c.max_rate >= 0.0))
    throw ParamError(ns + "/max_rate: must be >= 0 Hz (0 = no cap), got " + std::to_string(c.max_rate));
  p.max_rate_hz = c.max_rate;
  const double budgets[] = { c.budget_kbps_derp,    c.budget_kbps_peer_relay, c.budget_kbps_idle, c.budget_kbps_unknown,
                             c.budget_kbps_offline, c.budget_kbps_direct,     c.budget_kbps_self };
  for (size_t i = 0; i < 7; ++i)
  {
    if (!(budgets[i] >= 0.0))
      throw ParamError(ns + "/budget_kbps_" + kBudgetPaths[i].first + ": must be >= 0 kbit/s (0 = no budget), got " +
                       std::to_string(budgets[i]));
    if (budgets[i] > 0.0)
      p.budget_kbps[kBudgetPaths[i].second] = budgets[i];
    else
      p.budget_kbps.erase(kBudgetPaths[i].second);
  }
  if (c.zstd_level < -7 || c.zstd_level > 19)
    throw ParamError(ns + "/zstd_level: must be in -7..19 (1 = fast), got " + std::to_string(c.zstd_level));
  p.zstd_level = c.zstd_level;
  if (!shaping::parseLossy(c.lossy, &p.lossy))
    throw ParamError(ns + "/lossy: '" + c.lossy + "' is not none, decimate or voxel (point clouds only)");
  if (c.max_decimation < 1)
    throw ParamError(ns + "/max_decimation: must be >= 1, got " + std::to_string(c.max_decimation));
  p.max_decimation = static_cast<uint32_t>(c.max_decimation);
  if (!(c.voxel_m > 0.0))
    throw ParamError(ns + "/voxel_m: must be > 0 m, got " + std::to_string(c.voxel_m));
  if (!(c.lossy_below_hz > 0.0))
    throw ParamError(ns + "/lossy_below_hz: must be > 0 Hz, got " + std::to_string(c.lossy_below_hz));
  p.voxel_m = c.voxel_m;
  p.lossy_below_hz = c.lossy_below_hz;
  if (!(c.max_message_bytes >= 1024.0 && c.max_message_bytes <= 4294967295.0))
    throw ParamError(ns + "/max_message_bytes: must be in 1024..4294967295, got " + std::to_string(c.max_message_bytes));
  o.max_message_bytes = static_cast<size_t>(c.max_message_bytes);
  if (!(c.max_points >= 1.0))
    throw ParamError(ns + "/max_points: must be >= 1");
  o.cloud_limits.max_points = static_cast<uint64_t>(c.max_points);
  if (!(c.state_period > 0.0) || !(c.max_backlog_ms > 0.0))
    throw ParamError(ns + ": state_period (s) and max_backlog_ms (ms) must be > 0");
  o.state_period = c.state_period;
  o.max_backlog_ms = c.max_backlog_ms;
  o.adapt_to_delivery = c.adapt_to_delivery;
  if (!(c.pacing_factor == 0.0 || (c.pacing_factor >= 1.0 && c.pacing_factor <= 100.0)))
    throw ParamError(ns + "/pacing_factor: must be 0 (no pacing) or in 1..100 (x the path's budget), got " +
                     std::to_string(c.pacing_factor));
  o.pacing_factor = c.pacing_factor;
  return o;
}
}  // namespace

/// A shaped topic's settings now, shared by the control thread (writes them: dynamic_reconfigure)
/// and the frame thread (reads a snapshot per message; no lock held while it encodes).
class LiveOptions
{
public:
  explicit LiveOptions(const ShaperOptions& o) : now_(std::make_shared<const ShaperOptions>(o)) {}
  std::shared_ptr<const ShaperOptions> snapshot() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return now_;
  }
  void set(const ShaperOptions& o)
  {
    auto next = std::make_shared<const ShaperOptions>(o);
    std::lock_guard<std::mutex> lock(mutex_);
    now_ = std::move(next);
  }

private:
  mutable std::mutex mutex_;
  std::shared_ptr<const ShaperOptions> now_;
};

/// The zstd kind of shaped topic (shaper.h): one tier's ShapedMessage from one message of any type.
/// A tier without a budget (the full tier: self and direct paths) gets the message as it is
/// (encoding raw: no CPU spent where the link carries it); a budgeted tier gets it zstd-compressed
/// (a point cloud byte-shuffled by its point_step first) and, where the topic allows it, a cloud
/// reduced to reach lossy_below_hz under the tier's budget (ShapingPolicy).
class ZstdShaper : public Shaper<topic_tools::ShapeShifter, ShapedMessage>
{
public:
  ZstdShaper(std::shared_ptr<const LiveOptions> live, const std::string& in_topic)
    : live_(std::move(live)), in_topic_(in_topic)
  {
    options_ = live_->snapshot();
    policy_.setParams(options_->shaping);
  }

  std::string refuses(const topic_tools::ShapeShifter& in) const override
  {
    const size_t max_bytes = live_->snapshot()->max_message_bytes;
    if (in.size() > max_bytes)
      return "a message of " + std::to_string(in.size()) + " bytes is over max_message_bytes (" +
             std::to_string(max_bytes) + "): not shaped";
    return "";
  }

  boost::shared_ptr<ShapedMessage> shape(const topic_tools::ShapeShifter& in, const Admission& a, SentReport* report,
                                         std::string* error) override
  {
    // this message's settings: a live change applies from the next message on
    std::shared_ptr<const ShaperOptions> now = live_->snapshot();
    if (now != options_)
    {
      options_ = std::move(now);
      policy_.setParams(options_->shaping);
    }
    const std::string type = in.getDataType();
    if (type != type_)
    {
      type_ = type;
      has_header_ = startsWithHeader(in.getMessageDefinition());
    }
    const uint32_t size = in.size();
    const bool budgeted = !std::isinf(a.decision.budget_kbps);
    if (budgeted)
      policy_.onInput(size, cloudReducible(type));
    if (!budgeted || !options_->shaping.compress)
    {
      if (!budgeted)
        policy_.setBudgetKbps(a.decision.budget_kbps, a.decision.limited_by);
      if (!budgeted || !(cloudReducible(type)))
        return passThrough(in, type, size, report);
    }
    bytes_.resize(size);
    ros::serialization::OStream os(bytes_.data(), size);
    in.write(os);
    const bool cloud = type == kCloudType;
    policy_.setBudgetKbps(a.decision.budget_kbps, a.decision.limited_by);
    const shaping::ShapingDecision d = policy_.decision();
    const uint8_t* payload = bytes_.data();
    size_t payload_size = size;
    uint32_t point_step = 0;
    std::string reduction;
    uint32_t decimation = 1;
    bool voxel = false;
    if (cloud && budgeted && (d.decimation > 1 || d.voxel) && reduce(d, &reduction, &point_step))
    {
      payload = reduced_.data();
      payload_size = reduced_.size();
      decimation = d.voxel ? 1 : d.decimation;
      voxel = d.voxel;
    }
    else if (cloud && budgeted)
    {
      point_step = pointStepOf(bytes_);
    }
    boost::shared_ptr<ShapedMessage> out(new ShapedMessage);
    if (!has_header_ || !readHeader(payload, payload_size, &out->header))
      out->header.stamp = ros::Time::now();
    out->type = type;
    out->md5sum = in.getMD5Sum();
    out->raw_size = static_cast<uint32_t>(payload_size);
    out->original_size = size;
    out->reduction = reduction;
    if (budgeted && options_->shaping.compress)
    {
      const uint8_t* src = payload;
      if (point_step >= 2)
      {
        shuffled_.resize(payload_size);
        shaping::shuffleBytes(payload, payload_size, point_step, shuffled_.data());
        src = shuffled_.data();
        out->shuffle = point_step;
      }
      if (!zstd_.compress(src, payload_size, options_->shaping.zstd_level, &out->data, error))
        return boost::shared_ptr<ShapedMessage>();
      out->encoding = ShapedMessage::ENCODING_ZSTD;
    }
    else
    {
      out->data.assign(payload, payload + payload_size);
      out->encoding = ShapedMessage::ENCODING_RAW;
    }
    policy_.onMessageSent(out->data.size(), decimation, voxel, cloud);
    report->bytes = out->data.size();
    report->quality = a.decision.quality;
    std::ostringstream fmt;
    fmt << type << "; " << out->encoding;
    if (!reduction.empty())
      fmt << "; " << reduction;
    fmt.precision(3);
    fmt << "; " << (out->data.empty() ? 0.0 : static_cast<double>(size) / out->data.size()) << ":1";
    report->format = fmt.str();
    return out;
  }

private:
  /// Whether messages of `type` may be reduced under this topic's settings.
  bool cloudReducible(const std::string& type) const
  {
    return type == kCloudType && options_->shaping.lossy != shaping::Lossy::kNone;
  }

  /// The message as it is (encoding raw), serialized straight into the outgoing message: one copy.
  boost::shared_ptr<ShapedMessage> passThrough(const topic_tools::ShapeShifter& in, const std::string& type,
                                               uint32_t size, SentReport* report)
  {
    boost::shared_ptr<ShapedMessage> out(new ShapedMessage);
    out->data.resize(size);
    ros::serialization::OStream os(out->data.data(), size);
    in.write(os);
    if (!has_header_ || !readHeader(out->data.data(), out->data.size(), &out->header))
      out->header.stamp = ros::Time::now();
    out->type = type;
    out->md5sum = in.getMD5Sum();
    out->encoding = ShapedMessage::ENCODING_RAW;
    out->raw_size = size;
    out->original_size = size;
    policy_.onMessageSent(size, 1, false, type == kCloudType);
    report->bytes = size;
    report->format = type + "; raw; 1:1";
    return out;
  }

  /// point_step of the serialized PointCloud2 in `b` (0 when it cannot be read).
  static uint32_t pointStepOf(const std::vector<uint8_t>& b)
  {
    try
    {
      sensor_msgs::PointCloud2 c;
      // the fields before data only: header, height, width, fields, is_bigendian, point_step
      ros::serialization::IStream is(const_cast<uint8_t*>(b.data()), static_cast<uint32_t>(b.size()));
      ros::serialization::deserialize(is, c.header);
      ros::serialization::deserialize(is, c.height);
      ros::serialization::deserialize(is, c.width);
      ros::serialization::deserialize(is, c.fields);
      ros::serialization::deserialize(is, c.is_bigendian);
      ros::serialization::deserialize(is, c.point_step);
      return c.point_step <= 4096 ? c.point_step : 0;
    }
    catch (const std::exception&)
    {
      return 0;
    }
  }

  /// Reduces the cloud in bytes_ into reduced_ (serialized); false (logged) when it cannot be read
  /// or reduced: the cloud then goes out whole. The cloud and the reduced points are read and written
  /// into members whose capacity stays from one message to the next: no cloud-sized allocation per
  /// message (a freed multi-MB block would make the allocator keep it, and the RSS step up).
  bool reduce(const shaping::ShapingDecision& d, std::string* reduction, uint32_t* point_step)
  {
    sensor_msgs::PointCloud2& c = cloud_;
    try
    {
      ros::serialization::IStream is(bytes_.data(), static_cast<uint32_t>(bytes_.size()));
      ros::serialization::deserialize(is, c);
    }
    catch (const std::exception& e)
    {
      log_.report(ros::console::levels::Error, "deserialize", std::string("cannot read a PointCloud2: ") + e.what());
      return false;
    }
    const shaping::CloudLayout layout = layoutOf(c);
    const std::string bad = shaping::checkCloud(layout, c.data.size(), options_->cloud_limits);
    if (!bad.empty())
    {
      log_.report(ros::console::levels::Error, ProblemLog::kindOf(bad),
                  "refuses to reduce a cloud: " + bad + " (sent whole)");
      return false;
    }
    shaping::CloudLayout out_layout;
    std::string error;
    if (d.voxel)
    {
      if (!shaping::voxelFilter(layout, c.data.data(), options_->shaping.voxel_m, &out_layout, &points_, &error))
      {
        log_.report(ros::console::levels::Error, "voxel", "cannot reduce a cloud: " + error + " (sent whole)");
        return false;
      }
      std::ostringstream w;
      w << "voxel " << options_->shaping.voxel_m << " m";
      *reduction = w.str();
    }
    else
    {
      shaping::decimate(layout, c.data.data(), d.decimation, &out_layout, &points_);
      *reduction = "decimate 1/" + std::to_string(d.decimation);
    }
    c.height = out_layout.height;
    c.width = out_layout.width;
    c.row_step = out_layout.row_step;
    c.is_dense = out_layout.is_dense;
    *point_step = c.point_step;
    // serialized with the reduced points, then each buffer back where it is reused
    c.data.swap(points_);
    reduced_.resize(ros::serialization::serializationLength(c));
    ros::serialization::OStream os(reduced_.data(), static_cast<uint32_t>(reduced_.size()));
    ros::serialization::serialize(os, c);
    c.data.swap(points_);
    return true;
  }

  const std::shared_ptr<const LiveOptions> live_;
  std::shared_ptr<const ShaperOptions> options_;  ///< the settings of the message being shaped
  const std::string in_topic_;
  ProblemLog log_{ in_topic_ };
  shaping::ShapingPolicy policy_;
  shaping::ZstdCodec zstd_;
  std::string type_;
  bool has_header_ = false;
  std::vector<uint8_t> bytes_, reduced_, shuffled_;
  sensor_msgs::PointCloud2 cloud_;  ///< the cloud being reduced (its data keeps its capacity)
  std::vector<uint8_t> points_;     ///< the reduced points (keeps its capacity)
};

class TopicShaper : public nodelet::Nodelet
{
public:
  ~TopicShaper() override
  {
    // the reconfigure server first: its shutdown takes its callbacks off the control queue; then the
    // shaped topic joins the control thread before the publishers its hook uses go away
    reconfigure_.reset();
    topic_.reset();
  }

private:
  void onInit() override
  {
    ros::NodeHandle& nh = getNodeHandle();
    ros::NodeHandle& pnh = getPrivateNodeHandle();
    ShaperOptions options;
    bool tiered = true;
    try
    {
      options = readShaperOptions(pnh);
      tiered = pnh.param("tiers", true);
    }
    catch (const ParamError& e)
    {
      NODELET_FATAL("%s", e.what());
      throw;
    }
    in_topic_ = nh.resolveName("in");
    const std::string out_topic = in_topic_ + "/shaped";
    TopicOptions o;
    o.core = shaping::coreSettings(options.shaping, options.max_backlog_ms, options.adapt_to_delivery,
                                   options.pacing_factor);
    o.state_period = options.state_period;
    o.peers_topic = options.peers_topic;
    o.host_aliases = options.host_aliases;
    o.tiers = tiered;
    ShaperKind<topic_tools::ShapeShifter, ShapedMessage> kind;
    kind.traits.kind = options.shaping.compress ? shaping::kZstd : shaping::kRaw;
    kind.traits.size_feedback = true;
    // skip, never queue: while a subscriber's connection holds more than max_backlog_ms of its
    // tier's stream nothing new is made (the core's skip gate); the keyframe flags it raises mean
    // nothing to this kind
    kind.traits.reference_chain = true;
    const std::string lossy = shaping::lossyWord(options.shaping.lossy);
    live_ = std::make_shared<LiveOptions>(options);
    std::shared_ptr<const LiveOptions> live = live_;
    kind.make = [live, this] {
      return std::unique_ptr<Shaper<topic_tools::ShapeShifter, ShapedMessage>>(new ZstdShaper(live, in_topic_));
    };
    kind.describe = [live](const TierState& t, StreamState* st) {
      CodecValue v;
      v.key = "lossy_allowed";
      v.value = shaping::lossyWord(live->snapshot()->shaping.lossy);
      st->codec_state.push_back(v);
      v.key = "budgeted";
      v.value = std::isinf(t.decision.budget_kbps) ? "false" : "true";
      st->codec_state.push_back(v);
    };
    shapers_.reset(new TierShapers<topic_tools::ShapeShifter, ShapedMessage>(kind));
    topic_.reset(new ShapedTopic(nh, out_topic, in_topic_, kind.traits, o, kind.describe));
    type_pub_ = nh.advertise<ShapedType>(out_topic + "/type", 1, true);
    for (const std::string& tier : topic_->tierNames())
    {
      ros::SubscriberStatusCallback on_connect = [this, tier](const ros::SingleSubscriberPublisher& ssp) {
        topic_->subscriberConnected(tier, ssp.getSubscriberName());
      };
      ros::SubscriberStatusCallback on_disconnect = [this, tier](const ros::SingleSubscriberPublisher& ssp) {
        topic_->subscriberDisconnected(tier, ssp.getSubscriberName());
      };
      // queue 1: a connection that cannot keep up gets the newest message next, never a backlog
      pubs_[tier] = nh.advertise<ShapedMessage>(topic_->topicOf(tier), 1, on_connect, on_disconnect);
    }
    topic_->setControlHook([this] { updateInput(); });
    // live settings (cfg/TopicShaper.cfg) in the namespace the parameters were read from, served on
    // the control thread; the values the server writes there are recorded as the node's (the
    // topic_shaper node refreshes or removes them at its next start: param_inheritance.h)
    ros::NodeHandle params(pnh.getNamespace());
    params.setCallbackQueue(topic_->controlQueue());
    startRecordingServerParams(params, [this, &params] { startReconfigure(params); });
    topic_->start();
    NODELET_INFO("shaping %s -> %s%s (compression %s, lossy %s)", in_topic_.c_str(), out_topic.c_str(),
                 tiered ? " and its full tier" : "", options.shaping.compress ? "zstd" : "none", lossy.c_str());
  }

  /// Starts the dynamic_reconfigure server in `params`' namespace, seeded with the settings read at
  /// start; its requests run on the control thread. A value readShaperOptions would refuse is
  /// refused (logged, naming the parameter and the topic) and the settings stay as they were.
  void startReconfigure(const ros::NodeHandle& params)
  {
    reconfigure_.reset(new dynamic_reconfigure::Server<TopicShaperConfig>(reconfigure_mutex_, params));
    TopicShaperConfig now;
    {
      boost::recursive_mutex::scoped_lock lock(reconfigure_mutex_);
      reconfigure_->getConfigDefault(now);
    }
    toConfig(*live_->snapshot(), &now);
    reconfigure_->updateConfig(now);
    const std::string ns = params.getNamespace();
    auto first = std::make_shared<bool>(true);  // setCallback calls it once with the settings above
    reconfigure_->setCallback([this, ns, first](TopicShaperConfig& c, uint32_t /*level*/) {
      const std::shared_ptr<const ShaperOptions> old = live_->snapshot();
      ShaperOptions next;
      try
      {
        next = fromConfig(c, *old, ns);
      }
      catch (const ParamError& e)
      {
        NODELET_ERROR("%s: refused a new setting: %s; the settings stay as they were", in_topic_.c_str(), e.what());
        toConfig(*old, &c);  // what the server shows and writes back: the settings that apply
        return;
      }
      live_->set(next);
      topic_->applySettings(
          shaping::coreSettings(next.shaping, next.max_backlog_ms, next.adapt_to_delivery, next.pacing_factor));
      if (next.state_period != old->state_period)
        topic_->setStatePeriod(next.state_period);
      if (!*first)
        NODELET_INFO("%s: settings changed (dynamic_reconfigure)", in_topic_.c_str());
      *first = false;
    });
  }

  /// Control thread: subscribes the input while a tier has subscribers (ShapeShifter: any type,
  /// one message queued, so the newest waits while the previous one is shaped).
  void updateInput()
  {
    const bool want = !topic_->core().empty();
    if (want && !in_sub_)
      in_sub_ = getNodeHandle().subscribe(in_topic_, 1, &TopicShaper::onMessage, this);
    else if (!want && in_sub_)
      in_sub_ = ros::Subscriber();
    topic_->setInputSubscribed(static_cast<bool>(in_sub_));
  }

  /// Message thread (the nodelet's single-threaded queue): the core's loop.
  void onMessage(const topic_tools::ShapeShifter::ConstPtr& msg)
  {
    if (msg->getDataType() != type_sent_)
    {
      type_sent_ = msg->getDataType();
      ShapedType t;
      t.topic = in_topic_;
      t.type = msg->getDataType();
      t.md5sum = msg->getMD5Sum();
      t.definition = msg->getMessageDefinition();
      type_pub_.publish(t);
    }
    topic_->offer<topic_tools::ShapeShifter, ShapedMessage>(
        *msg, *shapers_, [this](const std::string& tier, const boost::shared_ptr<ShapedMessage>& m) {
          auto it = pubs_.find(tier);
          if (it != pubs_.end())
            it->second.publish(m);
        });
  }

  std::string in_topic_;
  std::map<std::string, ros::Publisher> pubs_;  ///< per tier; made in onInit, read-only afterwards
  ros::Publisher type_pub_;
  std::unique_ptr<TierShapers<topic_tools::ShapeShifter, ShapedMessage>> shapers_;  ///< message thread
  std::string type_sent_;                                                             ///< message thread
  ros::Subscriber in_sub_;                                                            ///< control thread
  std::unique_ptr<ShapedTopic> topic_;
  std::shared_ptr<LiveOptions> live_;  ///< the settings now (written by the reconfigure callback)
  boost::recursive_mutex reconfigure_mutex_;
  std::unique_ptr<dynamic_reconfigure::Server<TopicShaperConfig>> reconfigure_;  ///< control thread's requests
};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::TopicShaper, nodelet::Nodelet)
