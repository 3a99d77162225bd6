// Topic shaper nodelet: serves one topic of any type to subscribers on relayed paths, fitted to
// their paths (docs/shaping.md). The original topic is left alone: subscribers on this machine
// and on direct paths read it as it is, at full rate and full content.
//
// Topics (relative to the nodelet's namespace; robot.launch remaps `in` to each of shaped_topics)
//   in                          in   any type (topic_tools/ShapeShifter: bytes, never deserialized
//                                    except a PointCloud2 that is to be reduced); subscribed only
//                                    while in/shaped has subscribers
//   in/shaped                   out  overlay_manager/ShapedMessage: the message serialized, reduced
//                                    where the topic allows it, zstd-compressed; at most one message
//                                    queued (latest wins), the rate fitted to the lowest budget of
//                                    its subscribers' paths and to what their connections deliver
//   in/shaped/type              out  overlay_manager/ShapedType (latched): the original type and
//                                    definition, what `unshape` republishes as
//   in/shaped/stream_state      out  overlay_manager/StreamState (latched): decisions, per subscriber
//
// Parameters (private): max_rate (Hz, 0 = none), budget_kbps_<path> (derp 4000, peer_relay 20000,
// idle/unknown/offline 4000; 0 = none), compression (zstd|none), zstd_level (1), lossy
// (none|decimate|voxel), lossy_below_hz (2), max_decimation (64), voxel_m (0.05), max_backlog_ms
// (500), state_period (1 s), peers_topic, host_aliases, max_message_bytes, max_points.
//
// Threads and locks
//   * message thread (the nodelet's single-threaded queue): onMessage and the output's connect and
//     disconnect callbacks (memory only). Takes mutex_ to read the decision and record a message;
//     serializes, reduces, compresses and publishes without it.
//   * control thread (own queue, one-thread AsyncSpinner): the input's (un)subscribe, finding the
//     overlay node, ~peers, master look-ups of subscribers' machines, this node's bus info and
//     socket counters (every 0.5 s), stream_state. Blocking work without mutex_; results swapped
//     in under it. Nothing logs or calls the master while holding mutex_.
#include "overlay_manager/link_aware_stream.h"  // ParamError, readHostAliases
#include "overlay_manager/problem_log.h"
#include "overlay_manager/ros_graph.h"
#include "overlay_manager/stream_policy.h"
#include "overlay_manager/subscriber_hosts.h"
#include "overlay_manager/topic_shaping.h"

#include <nodelet/nodelet.h>
#include <overlay_manager/PeerList.h>
#include <overlay_manager/ShapedMessage.h>
#include <overlay_manager/ShapedType.h>
#include <overlay_manager/StreamState.h>
#include <pluginlib/class_list_macros.hpp>
#include <ros/callback_queue.h>
#include <ros/network.h>
#include <ros/ros.h>
#include <ros/xmlrpc_manager.h>
#include <sensor_msgs/PointCloud2.h>
#include <topic_tools/shape_shifter.h>

#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

namespace overlay_manager
{
namespace
{
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kDeliveryCheckS = 0.5;
const double kDiscoveryRetryS = 10.0;
const char* const kCloudType = "sensor_msgs/PointCloud2";

double nanIfInf(double v)
{
  return std::isinf(v) ? kNaN : v;
}

double steadyNow()
{
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Task : public ros::CallbackInterface
{
public:
  explicit Task(std::function<void()> fn) : fn_(std::move(fn)) {}
  CallResult call() override
  {
    fn_();
    return Success;
  }

private:
  std::function<void()> fn_;
};

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

class TopicShaper : public nodelet::Nodelet
{
public:
  ~TopicShaper() override
  {
    stopping_ = true;
    state_timer_.stop();
    delivery_timer_.stop();
    if (spinner_)
      spinner_->stop();
    control_queue_.disable();
    control_queue_.clear();
  }

private:
  struct Sub
  {
    int connections = 0;
    std::string host;  ///< as the master gave it; "" = not looked up
    std::string path = paths::kUnknown;
    DeliveryCap cap;
    uint32_t backlog_bytes = 0;
    uint32_t prev_backlog_bytes = 0;
    uint64_t acked_bytes = 0;
    double acked_at = 0.0;
    double queue_delay_ms = kNaN;
    ros::WallTime next_lookup;
  };
  struct Delivery
  {
    uint32_t unsent_bytes = 0;
    uint64_t acked_bytes = 0;
    double queue_delay_ms = kNaN;
  };

  void onInit() override
  {
    ros::NodeHandle& nh = getNodeHandle();
    try
    {
      options_ = readShaperOptions(getPrivateNodeHandle());
    }
    catch (const ParamError& e)
    {
      NODELET_FATAL("%s", e.what());
      throw;
    }
    in_topic_ = nh.resolveName("in");
    out_topic_ = in_topic_ + "/shaped";
    own_host_ = ros::network::getHost();
    log_.reset(new ProblemLog(in_topic_));
    policy_.setParams(options_.shaping);
    control_nh_ = nh;
    control_nh_.setCallbackQueue(&control_queue_);
    state_pub_ = control_nh_.advertise<StreamState>(out_topic_ + "/stream_state", 1, true);
    type_pub_ = control_nh_.advertise<ShapedType>(out_topic_ + "/type", 1, true);
    window_start_ = steadyNow();
    ros::SubscriberStatusCallback on_connect = [this](const ros::SingleSubscriberPublisher& ssp) {
      subscriberChanged(ssp.getSubscriberName(), +1);
    };
    ros::SubscriberStatusCallback on_disconnect = [this](const ros::SingleSubscriberPublisher& ssp) {
      subscriberChanged(ssp.getSubscriberName(), -1);
    };
    // queue 1: a connection that cannot keep up gets the newest message next, never a backlog
    out_pub_ = nh.advertise<ShapedMessage>(out_topic_, 1, on_connect, on_disconnect);
    state_timer_ = control_nh_.createWallTimer(ros::WallDuration(options_.state_period), &TopicShaper::onTimer, this);
    delivery_timer_ =
        control_nh_.createWallTimer(ros::WallDuration(kDeliveryCheckS), &TopicShaper::onDeliveryCheck, this);
    spinner_.reset(new ros::AsyncSpinner(1, &control_queue_));
    spinner_->start();
    post([this] { publishState(); });
    NODELET_INFO("shaping %s -> %s (compression %s, lossy %s)", in_topic_.c_str(), out_topic_.c_str(),
                 options_.shaping.compress ? "zstd" : "none", shaping::lossyWord(options_.shaping.lossy));
  }

  void post(std::function<void()> fn)
  {
    if (!stopping_)
      control_queue_.addCallback(boost::make_shared<Task>(std::move(fn)));
  }

  // ---- message thread (connect callbacks: memory only) -----------------------------------------

  void subscriberChanged(const std::string& node, int delta)
  {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::shared_ptr<Sub>& s = subs_[node];
      if (!s)
        s = std::make_shared<Sub>();
      s->connections += delta;
      if (s->connections <= 0)
        subs_.erase(node);
    }
    post([this] { onChange(); });
  }

  void onMessage(const topic_tools::ShapeShifter::ConstPtr& msg)
  {
    const double now = steadyNow();
    shaping::ShapingDecision d;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++window_in_;
      if (!gate_.admit(now, policy_.decision().rate_hz, backed_up_))
        return;
      d = policy_.decision();
    }
    const auto t0 = std::chrono::steady_clock::now();
    const std::string type = msg->getDataType();
    if (type != type_sent_)
    {
      type_sent_ = type;
      has_header_ = startsWithHeader(msg->getMessageDefinition());
      ShapedType t;
      t.topic = in_topic_;
      t.type = type;
      t.md5sum = msg->getMD5Sum();
      t.definition = msg->getMessageDefinition();
      post([this, t] { type_pub_.publish(t); });
    }
    const uint32_t size = msg->size();
    if (size > options_.max_message_bytes)
    {
      log_->report(ros::console::levels::Error, "size",
                   "a message of " + std::to_string(size) + " bytes is over max_message_bytes (" +
                       std::to_string(options_.max_message_bytes) + "): not shaped");
      return;
    }
    bytes_.resize(size);
    ros::serialization::OStream os(bytes_.data(), size);
    msg->write(os);
    const uint8_t* payload = bytes_.data();
    size_t payload_size = size;
    std::string reduction;
    const bool cloud = type == kCloudType;
    uint32_t decimation = 1;
    bool voxel = false;
    if (cloud && (d.decimation > 1 || d.voxel))
    {
      if (reduce(d, &reduction))
      {
        payload = reduced_.data();
        payload_size = reduced_.size();
        decimation = d.voxel ? 1 : d.decimation;
        voxel = d.voxel;
      }
    }
    ShapedMessagePtr out(new ShapedMessage);
    if (!has_header_ || !readHeader(payload, payload_size, &out->header))
      out->header.stamp = ros::Time::now();
    out->type = type;
    out->md5sum = msg->getMD5Sum();
    out->raw_size = static_cast<uint32_t>(payload_size);
    out->original_size = size;
    out->reduction = reduction;
    if (options_.shaping.compress)
    {
      std::string error;
      if (!zstd_.compress(payload, payload_size, options_.shaping.zstd_level, &out->data, &error))
      {
        log_->report(ros::console::levels::Error, "zstd", error);
        return;
      }
      out->encoding = ShapedMessage::ENCODING_ZSTD;
    }
    else
    {
      out->data.assign(payload, payload + payload_size);
      out->encoding = ShapedMessage::ENCODING_RAW;
    }
    const double shape_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const size_t sent = out->data.size();
    out_pub_.publish(out);
    std::lock_guard<std::mutex> lock(mutex_);
    ++window_out_;
    window_bytes_ += sent;
    window_raw_bytes_ += size;
    window_shape_ms_ += shape_ms;
    last_reduction_ = reduction;
    policy_.onMessageSent(sent, decimation, voxel, cloud);
  }

  /// Reduces the cloud in bytes_ into reduced_ (serialized); false (logged) when it cannot be read
  /// or reduced: the cloud then goes out whole.
  bool reduce(const shaping::ShapingDecision& d, std::string* reduction)
  {
    sensor_msgs::PointCloud2 c;
    try
    {
      ros::serialization::IStream is(bytes_.data(), static_cast<uint32_t>(bytes_.size()));
      ros::serialization::deserialize(is, c);
    }
    catch (const std::exception& e)
    {
      log_->report(ros::console::levels::Error, "deserialize", std::string("cannot read a PointCloud2: ") + e.what());
      return false;
    }
    const shaping::CloudLayout layout = layoutOf(c);
    const std::string bad = shaping::checkCloud(layout, c.data.size(), options_.cloud_limits);
    if (!bad.empty())
    {
      log_->report(ros::console::levels::Error, ProblemLog::kindOf(bad),
                   "refuses to reduce a cloud: " + bad + " (sent whole)");
      return false;
    }
    shaping::CloudLayout out_layout;
    std::vector<uint8_t> out_data;
    std::string error;
    if (d.voxel)
    {
      if (!shaping::voxelFilter(layout, c.data.data(), options_.shaping.voxel_m, &out_layout, &out_data, &error))
      {
        log_->report(ros::console::levels::Error, "voxel", "cannot reduce a cloud: " + error + " (sent whole)");
        return false;
      }
      std::ostringstream w;
      w << "voxel " << options_.shaping.voxel_m << " m";
      *reduction = w.str();
    }
    else
    {
      shaping::decimate(layout, c.data.data(), d.decimation, &out_layout, &out_data);
      *reduction = "decimate 1/" + std::to_string(d.decimation);
    }
    c.height = out_layout.height;
    c.width = out_layout.width;
    c.row_step = out_layout.row_step;
    c.is_dense = out_layout.is_dense;
    c.data.swap(out_data);
    reduced_.resize(ros::serialization::serializationLength(c));
    ros::serialization::OStream os(reduced_.data(), static_cast<uint32_t>(reduced_.size()));
    ros::serialization::serialize(os, c);
    return true;
  }

  // ---- control thread ----------------------------------------------------------------------------

  void onChange()
  {
    if (stopping_)
      return;
    updateInput();
    ensurePeers();
    resolveAndDecide();
    publishState();
  }

  void onTimer(const ros::WallTimerEvent&)
  {
    try
    {
      onChange();
    }
    catch (const std::exception& e)
    {
      ROS_ERROR_THROTTLE(10.0, "%s: stream_state period failed: %s", out_topic_.c_str(), e.what());
    }
  }

  void onDeliveryCheck(const ros::WallTimerEvent&)
  {
    try
    {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (subs_.empty() || stopping_ || !options_.adapt_to_delivery)
          return;
      }
      observeDelivery();
      resolveAndDecide();
    }
    catch (const std::exception& e)
    {
      ROS_ERROR_THROTTLE(10.0, "%s: delivery check failed: %s", out_topic_.c_str(), e.what());
    }
  }

  /// Subscribes the input while the output has subscribers (ShapeShifter: any type, one message
  /// queued, so the newest waits while the previous one is shaped).
  void updateInput()
  {
    const bool want = out_pub_.getNumSubscribers() > 0;
    if (want && !in_sub_)
      in_sub_ = getNodeHandle().subscribe(in_topic_, 1, &TopicShaper::onMessage, this);
    else if (!want && in_sub_)
      in_sub_ = ros::Subscriber();
  }

  void ensurePeers()
  {
    const ros::WallTime now = ros::WallTime::now();
    if (peers_sub_ || now < next_discovery_)
      return;
    next_discovery_ = now + ros::WallDuration(kDiscoveryRetryS);
    const PeersSource src = findPeersSource(options_.peers_topic, own_host_);
    if (src.topic.empty())
    {
      if (!warned_no_overlay_)
      {
        warned_no_overlay_ = true;
        ROS_WARN("%s: no overlay node found, so every remote subscriber's path is 'unknown' (tried %s; retrying "
                 "every %.0f s). Fix: start it from robot.launch (shaped_topics:=), or set ~peers_topic",
                 out_topic_.c_str(), src.tried.c_str(), kDiscoveryRetryS);
      }
      return;
    }
    peers_sub_ = control_nh_.subscribe(src.topic, 1, &TopicShaper::onPeers, this);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      peers_topic_ = src.topic;
    }
    ROS_INFO("%s: paths from %s (%s)", out_topic_.c_str(), src.topic.c_str(), src.how.c_str());
  }

  void onPeers(const PeerListConstPtr& msg)
  {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      peers_ = msg;
    }
    resolveAndDecide();
  }

  void resolveAndDecide()
  {
    std::vector<std::string> todo;
    PeerListConstPtr peers;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const ros::WallTime now = ros::WallTime::now();
      for (const auto& kv : subs_)
        if (kv.second->host.empty() && kv.second->next_lookup <= now)
          todo.push_back(kv.first);
      peers = peers_;
    }
    std::map<std::string, std::string> found;
    for (const std::string& node : todo)
      found[node] = nodeHost(node);  // master call: no lock held
    bool changed = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const ros::WallTime now = ros::WallTime::now();
      std::vector<SubscriberView> views;
      for (auto& kv : subs_)
      {
        Sub& s = *kv.second;
        auto f = found.find(kv.first);
        if (f != found.end())
        {
          s.host = f->second;
          if (s.host.empty())
            s.next_lookup = now + ros::WallDuration(5.0);
        }
        const std::string path = pathOfHost(s.host, own_host_, peers.get(), options_.host_aliases);
        if (path != s.path)
        {
          changed = true;
          s.cap.reset();
        }
        s.path = path;
        SubscriberView v;
        v.node = kv.first;
        v.host = shortName(s.host, own_host_, peers.get(), options_.host_aliases);
        v.path = path;
        v.observed_cap_kbps = s.cap.cap();
        views.push_back(v);
      }
      policy_.setSubscribers(views);
    }
    if (changed)
      publishState();
  }

  /// This node's connections on the output (getBusInfo), with each socket's unsent bytes,
  /// acknowledged bytes and queueing delay (the camera stream's delivery signals).
  bool readDelivery(std::map<std::string, Delivery>* out)
  {
    XmlRpc::XmlRpcValue args, result;
    args[0] = ros::this_node::getName();
    ros::XMLRPCManager& xm = *ros::XMLRPCManager::instance();
    XmlRpc::XmlRpcClient* client = xm.getXMLRPCClient(hostOfUri(xm.getServerURI()), xm.getServerPort(), "/");
    const bool ok = client->execute("getBusInfo", args, result);
    xm.releaseXMLRPCClient(client);
    if (!ok || result.getType() != XmlRpc::XmlRpcValue::TypeArray || result.size() < 3 ||
        result[2].getType() != XmlRpc::XmlRpcValue::TypeArray)
    {
      ROS_WARN_THROTTLE(30.0, "%s: getBusInfo on this node failed: delivery is not observed", out_topic_.c_str());
      return false;
    }
    XmlRpc::XmlRpcValue& info = result[2];
    for (int i = 0; i < info.size(); ++i)
    {
      XmlRpc::XmlRpcValue& c = info[i];
      if (c.getType() != XmlRpc::XmlRpcValue::TypeArray || c.size() < 7 ||
          c[2].getType() != XmlRpc::XmlRpcValue::TypeString || static_cast<std::string>(c[2]) != "o" ||
          c[4].getType() != XmlRpc::XmlRpcValue::TypeString || static_cast<std::string>(c[4]) != out_topic_ ||
          c[6].getType() != XmlRpc::XmlRpcValue::TypeString || c[1].getType() != XmlRpc::XmlRpcValue::TypeString)
        continue;
      const int fd = socketOfTransportInfo(static_cast<std::string>(c[6]));
      if (fd < 0)
        continue;
      Delivery& d = (*out)[static_cast<std::string>(c[1])];
      int outq = 0;
      if (ioctl(fd, SIOCOUTQNSD, &outq) == 0 && outq > 0)
        d.unsent_bytes = std::max(d.unsent_bytes, static_cast<uint32_t>(outq));
      struct tcp_info ti = {};
      socklen_t len = sizeof(ti);
      if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        continue;
      if (len >= offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof(ti.tcpi_bytes_acked))
        d.acked_bytes += ti.tcpi_bytes_acked;
      if (len >= offsetof(struct tcp_info, tcpi_min_rtt) + sizeof(ti.tcpi_min_rtt) && ti.tcpi_min_rtt > 0 &&
          ti.tcpi_rtt >= ti.tcpi_min_rtt)
      {
        const double q = (ti.tcpi_rtt - ti.tcpi_min_rtt) / 1000.0;
        d.queue_delay_ms = std::isnan(d.queue_delay_ms) ? q : std::max(d.queue_delay_ms, q);
      }
    }
    return true;
  }

  /// Caps per subscriber from its connection (DeliveryCap, as the camera's), and the skip rule:
  /// while any connection holds more than max_backlog_ms of the stream unsent, nothing new is
  /// published (the message in flight is the newest that matters; more would only queue).
  void observeDelivery()
  {
    std::map<std::string, Delivery> delivery;
    if (!readDelivery(&delivery))
      return;
    const double now = steadyNow();
    std::lock_guard<std::mutex> lock(mutex_);
    // the stream's bitrate; before the first window closes, one message per second
    const double out_kbps = last_bitrate_kbps_ > 0.0 ? last_bitrate_kbps_ : kNaN;
    bool backed_up = false;
    for (auto& kv : subs_)
    {
      Sub& s = *kv.second;
      auto it = delivery.find(kv.first);
      const Delivery got = it == delivery.end() ? Delivery() : it->second;
      s.prev_backlog_bytes = s.backlog_bytes;
      s.backlog_bytes = got.unsent_bytes;
      double delivered_kbps = kNaN;
      const double dt = s.acked_at > 0.0 ? now - s.acked_at : 0.0;
      if (dt > 0.0 && got.acked_bytes > 0 && got.acked_bytes >= s.acked_bytes)
        delivered_kbps = static_cast<double>(got.acked_bytes - s.acked_bytes) * 8.0 / 1000.0 / dt;
      s.acked_bytes = got.acked_bytes;
      s.acked_at = now;
      s.queue_delay_ms = got.queue_delay_ms;
      SubscriberView v;
      v.path = s.path;
      if (out_kbps > 0.0)
        s.cap.update(now, s.backlog_bytes, out_kbps, policy_.budgetFor(v), options_.max_backlog_ms, delivered_kbps,
                     got.queue_delay_ms);
      // a heavy message is one big burst: backed up when what is unsent takes longer than
      // max_backlog_ms at the subscriber's budget (or at the stream's bitrate when it has none)
      const double drain_kbps = std::min(policy_.budgetFor(v), out_kbps > 0.0 ? out_kbps : 1e12);
      backed_up = backed_up || s.backlog_bytes * 8.0 / drain_kbps > options_.max_backlog_ms;
    }
    if (backed_up)
      ++window_skips_;
    backed_up_ = backed_up;
  }

  void publishState()
  {
    if (stopping_)
      return;
    StreamState st;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const double now = steadyNow();
      const double secs = std::max(1e-3, now - window_start_);
      if (secs >= 0.5)
      {
        last_input_rate_ = window_in_ / secs;
        last_output_rate_ = window_out_ / secs;
        last_bitrate_kbps_ = window_bytes_ * 8.0 / 1000.0 / secs;
        last_frame_bytes_ = window_out_ ? static_cast<double>(window_bytes_) / window_out_ : kNaN;
        last_shape_ms_ = window_out_ ? window_shape_ms_ / window_out_ : kNaN;
        last_ratio_ = window_bytes_ ? static_cast<double>(window_raw_bytes_) / window_bytes_ : kNaN;
        last_skips_ = window_skips_;
        window_in_ = window_out_ = 0;
        window_bytes_ = window_raw_bytes_ = 0;
        window_shape_ms_ = 0.0;
        window_skips_ = 0;
        window_start_ = now;
      }
      const shaping::ShapingDecision& d = policy_.decision();
      st.header.stamp = ros::Time::now();
      st.topic = out_topic_;
      st.input_topic = in_topic_;
      st.peers_topic = peers_ ? peers_topic_ : "";
      st.codec = options_.shaping.compress ? shaping::kZstd : shaping::kRaw;
      std::ostringstream fmt;
      fmt << type_sent_;
      if (!last_reduction_.empty())
        fmt << "; " << last_reduction_;
      if (!std::isnan(last_ratio_))
        fmt.precision(3), fmt << "; " << last_ratio_ << ":1";
      st.format = fmt.str();
      st.video_bitrate_kbps = kNaN;
      st.skipped_frames = last_skips_;
      st.rate_hz = nanIfInf(d.rate_hz);
      st.input_rate_hz = last_input_rate_;
      st.output_rate_hz = last_output_rate_;
      st.bitrate_kbps = last_bitrate_kbps_;
      st.frame_bytes = last_frame_bytes_;
      st.encode_ms = last_shape_ms_;
      st.budget_kbps = nanIfInf(d.budget_kbps);
      st.limited_by = d.limited_by;
      st.reason = peers_ ? d.reason : "no overlay node: paths unknown";
      for (const SubscriberView& v : policy_.subscribers())
      {
        StreamSubscriber s;
        s.node = v.node;
        s.host = v.host;
        s.path = v.path;
        s.budget_kbps = nanIfInf(policy_.budgetFor(v));
        s.observed_cap_kbps = v.observed_cap_kbps;
        auto it = subs_.find(v.node);
        s.backlog_bytes = it == subs_.end() ? 0 : it->second->backlog_bytes;
        s.queue_delay_ms = it == subs_.end() ? kNaN : it->second->queue_delay_ms;
        s.codec = st.codec;
        s.codec_reason = "subscribed to " + out_topic_ + " (" + (d.decimation > 1 || d.voxel ? "reduced, " : "full content, ") +
                         (options_.shaping.compress ? "zstd" : "uncompressed") + "; lossy allowed: " +
                         shaping::lossyWord(options_.shaping.lossy) + ")";
        s.rate_hz = st.rate_hz;
        s.bitrate_kbps = last_bitrate_kbps_;
        st.subscribers.push_back(s);
      }
      st.input_subscribed = static_cast<bool>(in_sub_);
    }
    state_pub_.publish(st);
  }

  // configuration (onInit, read-only afterwards)
  ShaperOptions options_;
  std::string in_topic_, out_topic_, own_host_;
  std::unique_ptr<ProblemLog> log_;

  // message thread only
  std::string type_sent_;
  bool has_header_ = false;
  std::vector<uint8_t> bytes_, reduced_;
  shaping::ZstdCodec zstd_;
  ros::Publisher out_pub_;  // publish() is thread-safe

  // control thread only
  ros::CallbackQueue control_queue_;
  ros::NodeHandle control_nh_;
  std::unique_ptr<ros::AsyncSpinner> spinner_;
  ros::Publisher state_pub_, type_pub_;
  ros::Subscriber peers_sub_, in_sub_;
  ros::WallTimer state_timer_, delivery_timer_;
  ros::WallTime next_discovery_;
  bool warned_no_overlay_ = false;
  std::atomic<bool> stopping_{ false };

  mutable std::mutex mutex_;  ///< guards everything below
  shaping::ShapingPolicy policy_;
  shaping::RateGate gate_;
  std::map<std::string, std::shared_ptr<Sub>> subs_;
  PeerListConstPtr peers_;
  std::string peers_topic_;
  bool backed_up_ = false;
  double window_start_ = 0.0;
  uint64_t window_in_ = 0, window_out_ = 0, window_bytes_ = 0, window_raw_bytes_ = 0;
  uint32_t window_skips_ = 0, last_skips_ = 0;
  double window_shape_ms_ = 0.0;
  double last_input_rate_ = 0.0, last_output_rate_ = 0.0, last_bitrate_kbps_ = 0.0;
  double last_frame_bytes_ = kNaN, last_shape_ms_ = kNaN, last_ratio_ = kNaN;
  std::string last_reduction_;
};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::TopicShaper, nodelet::Nodelet)
