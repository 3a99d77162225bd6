// One link-aware image stream (see link_aware_stream.h).
#include "overlay_manager/link_aware_stream.h"

#include "overlay_manager/ros_graph.h"
#include "overlay_manager/subscriber_hosts.h"
#include "overlay_manager/viewer_decoders.h"

#include <cv_bridge/cv_bridge.h>
#include <overlay_manager/StreamState.h>
#include <sensor_msgs/image_encodings.h>
#include <ros/network.h>
#include <ros/xmlrpc_manager.h>

#include <linux/sockios.h>
#include <netinet/in.h>  // IPPROTO_TCP
#include <linux/tcp.h>    // struct tcp_info with tcpi_bytes_acked (Linux >= 4.1; glibc's lacks it)
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cmath>

namespace overlay_manager
{

namespace
{
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kDiscoveryRetryS = 10.0;  ///< s between attempts to find the overlay node
const char* const kNoOverlay = "no overlay node: paths unknown";
const double kRecheckS = 0.1;             ///< h264: s between backlog checks while frames are skipped
const double kMinForcedKeyframeS = 1.0;   ///< h264: at most one keyframe forced by a backlog per second
const double kDeliveryCheckS = 0.5;       ///< s between delivery checks (adapt_to_delivery)

double nanIfInf(double v)
{
  return std::isinf(v) ? kNaN : v;
}

/// A function run on a callback queue.
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
}  // namespace

/// One subscribing node (several connections from one node count once).
struct LinkAwareStream::Sub
{
  int connections = 0;
  std::string host;  ///< short name or address as the master gave it; "" = not looked up
  std::string path = paths::kUnknown;
  DeliveryCap cap;  ///< cap learnt from delivery to it (observeDelivery)
  uint32_t backlog_bytes = 0;
  uint64_t acked_bytes = 0;         ///< bytes its peer acknowledged (all its connections), last check
  double queue_delay_ms = kNaN;     ///< round trip above its minimum, last check (NaN = unknown)
  ros::SteadyTime acked_at;         ///< when acked_bytes was read; zero = never
  ros::WallTime next_lookup;  ///< retry time after a failed lookupNode
};

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
  o.state_period = pnh.param("state_period", o.state_period);
  if (!(o.state_period > 0.0))
    throw ParamError(ns + "/state_period: must be > 0 s, got " + std::to_string(o.state_period));
  o.peers_topic = pnh.param<std::string>("peers_topic", "");
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

LinkAwareStream::LinkAwareStream(const ros::NodeHandle& nh, const std::string& topic, const std::string& input_topic,
                                 const StreamOptions& options)
  : initial_options_(options)
  , topic_(topic)
  , input_topic_(input_topic)
  , own_host_(ros::network::getHost())
  , policy_(options.policy)
  , frame_log_(topic)
  , options_(options)
  , last_frame_bytes_(kNaN)
  , last_encode_ms_(kNaN)
{
  control_nh_ = nh;
  control_nh_.setCallbackQueue(&control_queue_);
  window_start_ = ros::WallTime::now();
  state_pub_ = control_nh_.advertise<StreamState>(topic_ + "/stream_state", 1, true);
  timer_ = control_nh_.createWallTimer(ros::WallDuration(options_.state_period), &LinkAwareStream::onTimer, this);
  // always made: adapt_to_delivery may be switched on and off live (onDeliveryCheck reads it)
  delivery_timer_ =
      control_nh_.createWallTimer(ros::WallDuration(kDeliveryCheckS), &LinkAwareStream::onDeliveryCheck, this);
  if (options_.format == "h264")
  {
    recheck_timer_ = control_nh_.createWallTimer(ros::WallDuration(kRecheckS), &LinkAwareStream::onRecheck, this);
    keyframe_sub_ = control_nh_.subscribe(keyframeRequestTopic(topic_), 4, &LinkAwareStream::onKeyframeRequest, this);
  }
  spinner_.reset(new ros::AsyncSpinner(1, &control_queue_));
}

void LinkAwareStream::start()
{
  ros::NodeHandle params(param_ns_.empty() ? topic_ : param_ns_);
  params.setCallbackQueue(&control_queue_);  // reconfigure requests run on the control thread
  try
  {
    reconfigure_ = startReconfigure(*this, params);
  }
  catch (const std::exception& e)  // a plugin must not take the driver down
  {
    ROS_ERROR("%s: no dynamic_reconfigure server (%s): settings are fixed until a restart", topic_.c_str(), e.what());
  }
  spinner_->start();
  post([this] { publishState(); });
}

StreamOptions LinkAwareStream::settings() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  return options_;
}

void LinkAwareStream::applySettings(const StreamOptions& updated)
{
  {
    std::lock_guard<std::mutex> lock(mutex_);
    options_.policy = updated.policy;
    options_.crf = updated.crf;
    options_.gop = updated.gop;
    options_.png_level = updated.png_level;
    options_.adapt_to_delivery = updated.adapt_to_delivery;
    options_.max_backlog_ms = updated.max_backlog_ms;
    policy_.setParams(updated.policy);
  }
  publishState();
}

LinkAwareStream::~LinkAwareStream()
{
  stopping_ = true;
  timer_.stop();
  delivery_timer_.stop();
  recheck_timer_.stop();
  if (spinner_)
    spinner_->stop();  // joins the control thread
  control_queue_.disable();
  control_queue_.clear();
}

void LinkAwareStream::stop()
{
  stopping_ = true;
  timer_.stop();
  delivery_timer_.stop();
  recheck_timer_.stop();
  state_pub_.shutdown();
  peers_sub_.shutdown();
  keyframe_sub_.shutdown();
  reconfigure_.reset();
}

void LinkAwareStream::setOtherTopics(const std::vector<std::string>& topics)
{
  other_topics_ = topics;
  std::lock_guard<std::mutex> lock(mutex_);
  state_other_topics_ = topics;
}

void LinkAwareStream::post(std::function<void()> fn)
{
  if (!stopping_)
    control_queue_.addCallback(boost::make_shared<Task>(std::move(fn)));
}

// ---- any thread -------------------------------------------------------------------------------

void LinkAwareStream::subscriberConnected(const std::string& node)
{
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<Sub>& s = subs_[node];
    if (!s)
      s = std::make_shared<Sub>();
    s->connections++;
  }
  keyframe_wanted_ = true;  // h264: the new subscriber decodes from the next frame on
  post([this] { onChange(); });
}

void LinkAwareStream::subscriberDisconnected(const std::string& node)
{
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = subs_.find(node);
    if (it != subs_.end() && --it->second->connections <= 0)
      subs_.erase(it);
  }
  post([this] { onChange(); });
}

// ---- control thread ---------------------------------------------------------------------------

void LinkAwareStream::onChange()
{
  if (stopping_)
    return;
  if (hook_)
    hook_();
  if (stopping_)  // the hook may have stopped the stream
    return;
  ensurePeers();
  resolveAndDecide();
  publishState();
}

void LinkAwareStream::onTimer(const ros::WallTimerEvent&)
{
  try
  {
    bool any;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      any = !subs_.empty();
    }
    if (hook_)
      hook_();
    if (stopping_)
      return;
    if (any)
    {
      ensurePeers();
      resolveAndDecide();
    }
    publishState();
  }
  catch (const std::exception& e)
  {
    ROS_ERROR_THROTTLE(10.0, "%s: stream_state period failed: %s", topic_.c_str(), e.what());
  }
}

/// Every kDeliveryCheckS while someone subscribes: what each connection has unsent and what its
/// peer acknowledged, the caps learnt from that, and a new decision. Twice as often as stream_state
/// by default, so a congested link is noticed (and a recovered one used again) within half a second.
void LinkAwareStream::onDeliveryCheck(const ros::WallTimerEvent&)
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
    ROS_ERROR_THROTTLE(10.0, "%s: delivery check failed: %s", topic_.c_str(), e.what());
  }
}

/// Finds the overlay node's ~peers (once there is a subscriber; retried every kDiscoveryRetryS) and
/// subscribes to it; one warning when there is none, one when the topic stays silent.
void LinkAwareStream::ensurePeers()
{
  const ros::WallTime now = ros::WallTime::now();
  if (peers_sub_)
  {
    bool have;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      have = static_cast<bool>(peers_);
    }
    if (!have && !warned_silent_peers_ && now - peers_subscribed_at_ > ros::WallDuration(kDiscoveryRetryS))
    {
      warned_silent_peers_ = true;
      ROS_WARN("%s: nothing arrived on %s for %.0f s (%u publishers): is the overlay node running? Until it "
               "publishes, every remote subscriber's path is 'unknown'",
               topic_.c_str(), peers_sub_.getTopic().c_str(), kDiscoveryRetryS, peers_sub_.getNumPublishers());
    }
    return;
  }
  if (now < next_discovery_)
    return;
  next_discovery_ = now + ros::WallDuration(kDiscoveryRetryS);
  const PeersSource src = findPeersSource(options_.peers_topic, own_host_);
  if (src.topic.empty())
  {
    if (!warned_no_overlay_)
    {
      warned_no_overlay_ = true;
      ROS_WARN("%s: no overlay node found, so every remote subscriber's path is 'unknown' (tried %s; retrying every "
               "%.0f s). Fix: run under robot.launch with overlay_env's environment (the overlay node is "
               "/$OVERLAY_MANAGER_NS/overlay_manager), or set the parameter peers_topic to its ~peers",
               topic_.c_str(), src.tried.c_str(), kDiscoveryRetryS);
    }
    return;
  }
  peers_sub_ = control_nh_.subscribe(src.topic, 1, &LinkAwareStream::onPeers, this);
  peers_subscribed_at_ = now;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peers_topic_ = src.topic;
  }
  ROS_INFO("%s: paths from %s (%s)", topic_.c_str(), src.topic.c_str(), src.how.c_str());
}

void LinkAwareStream::onPeers(const PeerListConstPtr& msg)
{
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peers_ = msg;
  }
  resolveAndDecide();
}

/// Looks up unresolved subscribers' machines (master lookupNode, blocking: no lock held), then maps
/// every subscriber to a path with the latest ~peers and hands the result to the policy.
void LinkAwareStream::resolveAndDecide()
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
  {
    const std::string host = nodeHost(node);
    found[node] = host;
    if (host.empty())
      ROS_WARN_THROTTLE(10.0, "%s: cannot look up the machine of subscriber %s: treated as path unknown",
                        topic_.c_str(), node.c_str());
  }
  std::vector<SubscriberView> views;
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const ros::WallTime now = ros::WallTime::now();
    for (auto& kv : subs_)
    {
      Sub& s = *kv.second;
      auto f = found.find(kv.first);
      if (f != found.end())
      {
        s.host = f->second;
        if (f->second.empty())
          s.next_lookup = now + ros::WallDuration(5.0);
      }
      const std::string path = pathOfHost(s.host, own_host_, peers.get(), options_.host_aliases);
      if (path != s.path)
      {
        changed = true;
        s.cap.reset();  // learnt on the old path
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

/// Per subscriber, from the kernel's view of its TCP connections (the sockets named by this
/// process's bus info): bytes not sent yet (SIOCOUTQNSD, the largest of its connections), bytes its
/// peer acknowledged (TCP_INFO tcpi_bytes_acked, summed; 0 when the kernel does not say) and how
/// long its bytes wait in queues on the path (TCP_INFO rtt - min_rtt, the largest). Unsent bytes
/// pile up when the connection cannot carry what the stream makes; a relay with deep buffers
/// (tailscaled's DERP connection) takes such bytes anyway, and they show only as a longer round
/// trip. A round trip that is merely long (a distant peer) is in min_rtt and does not count.
/// nextObservedCap turns these into the subscriber's cap; every path is watched, direct included.
bool LinkAwareStream::readDelivery(std::map<std::string, Delivery>* out)
{
  // This process's own getBusInfo (the XML-RPC call rosnode info makes), answered by roscpp's
  // XML-RPC thread: connection id, subscriber caller id, direction, transport, topic, connected,
  // transport info with the socket.
  XmlRpc::XmlRpcValue args, result;
  args[0] = ros::this_node::getName();
  ros::XMLRPCManager& xm = *ros::XMLRPCManager::instance();
  XmlRpc::XmlRpcClient* client = xm.getXMLRPCClient(hostOfUri(xm.getServerURI()), xm.getServerPort(), "/");
  const bool ok = client->execute("getBusInfo", args, result);
  xm.releaseXMLRPCClient(client);
  if (!ok || result.getType() != XmlRpc::XmlRpcValue::TypeArray || result.size() < 3 ||
      result[2].getType() != XmlRpc::XmlRpcValue::TypeArray)
  {
    ROS_WARN_THROTTLE(30.0, "%s: getBusInfo on this node failed: delivery is not observed", topic_.c_str());
    return false;
  }
  XmlRpc::XmlRpcValue& info = result[2];
  for (int i = 0; i < info.size(); ++i)
  {
    XmlRpc::XmlRpcValue& c = info[i];
    if (c.getType() != XmlRpc::XmlRpcValue::TypeArray || c.size() < 7 || static_cast<std::string>(c[2]) != "o")
      continue;
    const std::string topic = static_cast<std::string>(c[4]);
    if (topic != topic_ && std::find(other_topics_.begin(), other_topics_.end(), topic) == other_topics_.end())
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
    // smoothed round trip over the lowest one seen (Linux >= 4.10): time spent in queues on the way
    if (len >= offsetof(struct tcp_info, tcpi_min_rtt) + sizeof(ti.tcpi_min_rtt) && ti.tcpi_min_rtt > 0 &&
        ti.tcpi_rtt >= ti.tcpi_min_rtt)
    {
      const double queued_ms = (ti.tcpi_rtt - ti.tcpi_min_rtt) / 1000.0;
      d.queue_delay_ms = std::isnan(d.queue_delay_ms) ? queued_ms : std::max(d.queue_delay_ms, queued_ms);
    }
  }
  return true;
}

void LinkAwareStream::observeDelivery()
{
  std::map<std::string, Delivery> delivery;
  if (!readDelivery(&delivery))
    return;
  const ros::SteadyTime now = ros::SteadyTime::now();  // rates and lift spacing: no wall-clock jumps
  std::lock_guard<std::mutex> lock(mutex_);
  const double out_kbps = last_bitrate_kbps_;
  bool backed_up = false;
  for (auto& kv : subs_)
  {
    Sub& s = *kv.second;
    auto d = delivery.find(kv.first);
    const Delivery got = d == delivery.end() ? Delivery() : d->second;
    s.backlog_bytes = got.unsent_bytes;
    // acknowledged since the last check, in kbit/s; unknown on the first check, when the kernel
    // gives no counter, or when a connection came or went (the sum went down)
    double delivered_kbps = kNaN;
    const double dt = s.acked_at.isZero() ? 0.0 : (now - s.acked_at).toSec();
    if (dt > 0.0 && got.acked_bytes > 0 && got.acked_bytes >= s.acked_bytes)
      delivered_kbps = static_cast<double>(got.acked_bytes - s.acked_bytes) * 8.0 / 1000.0 / dt;
    s.acked_bytes = got.acked_bytes;
    s.acked_at = now;
    SubscriberView v;
    v.path = s.path;
    v.observed_cap_kbps = kNaN;
    s.queue_delay_ms = got.queue_delay_ms;
    s.cap.update(now.toSec(), s.backlog_bytes, out_kbps, policy_.budgetFor(v), options_.max_backlog_ms,
                 delivered_kbps, got.queue_delay_ms);
    // h264 skips frames while a queue holds more than max_backlog_ms of stream
    backed_up = backed_up || (out_kbps > 0.0 && s.backlog_bytes * 8.0 / out_kbps > options_.max_backlog_ms);
  }
  if (options_.format == "h264")
  {
    if (backed_up_ && !backed_up)
      resumeLocked();
    backed_up_ = backed_up;
  }
}

/// h264 while frames are skipped: re-reads the backlogs every kRecheckS and resumes encoding as soon
/// as every connection holds less than half of max_backlog_ms at the encoder's target bitrate,
/// instead of waiting for the next state period (a skip used to last at least one period, 1 s).
void LinkAwareStream::onRecheck(const ros::WallTimerEvent&)
{
  try
  {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!backed_up_ || stopping_)
        return;
    }
    std::map<std::string, Delivery> delivery;
    if (!readDelivery(&delivery))
      return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!backed_up_)
      return;
    const double kbps = policy_.videoBitrateKbps();
    uint32_t worst = 0;
    for (const auto& kv : subs_)
    {
      auto d = delivery.find(kv.first);
      const uint32_t bytes = d == delivery.end() ? 0 : d->second.unsent_bytes;
      kv.second->backlog_bytes = bytes;
      worst = std::max(worst, bytes);
    }
    if (worst * 8.0 / kbps < options_.max_backlog_ms / 2.0)
    {
      backed_up_ = false;
      resumeLocked();
    }
  }
  catch (const std::exception& e)
  {
    ROS_ERROR_THROTTLE(10.0, "%s: backlog re-check failed: %s", topic_.c_str(), e.what());
  }
}

/// Encoding resumes after a skip (mutex_ held). Frames were skipped, not dropped, so every decoder's
/// reference chain is whole unless roscpp's queue for a subscriber overflowed meanwhile; a keyframe
/// repairs that one at once instead of at the next GOP. Forced keyframes are rate-limited
/// (kMinForcedKeyframeS): each costs several frames' worth of bytes on the link that just backed up.
void LinkAwareStream::resumeLocked()
{
  const ros::WallTime now = ros::WallTime::now();
  if (last_forced_keyframe_.isZero() || (now - last_forced_keyframe_).toSec() >= kMinForcedKeyframeS)
  {
    keyframe_wanted_ = true;
    last_forced_keyframe_ = now;
  }
}

/// h264: a viewer lost the stream and asks for a keyframe; forced keyframes stay at most one per
/// kMinForcedKeyframeS for all subscribers together.
void LinkAwareStream::onKeyframeRequest(const std_msgs::EmptyConstPtr&)
{
  if (stopping_)
    return;
  std::lock_guard<std::mutex> lock(mutex_);
  const ros::WallTime now = ros::WallTime::now();
  if (last_forced_keyframe_.isZero() || (now - last_forced_keyframe_).toSec() >= kMinForcedKeyframeS)
  {
    keyframe_wanted_ = true;
    last_forced_keyframe_ = now;
  }
}

void LinkAwareStream::publishState()
{
  if (stopping_)
    return;
  StreamState st;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const ros::WallTime now = ros::WallTime::now();
    const double secs = std::max(1e-3, (now - window_start_).toSec());
    if (secs >= 0.5)  // a fresh window at most twice a second; connect events reuse the last one
    {
      last_input_rate_ = window_in_ / secs;
      last_output_rate_ = window_out_ / secs;
      last_bitrate_kbps_ = window_bytes_ * 8.0 / 1000.0 / secs;
      last_frame_bytes_ = window_out_ ? static_cast<double>(window_bytes_) / window_out_ : kNaN;
      last_encode_ms_ = window_out_ ? window_encode_ms_ / window_out_ : kNaN;
      last_keyframes_ = window_keyframes_;
      last_skipped_ = window_skipped_;
      window_keyframes_ = window_skipped_ = 0;
      window_in_ = window_out_ = 0;
      window_bytes_ = 0;
      window_encode_ms_ = 0.0;
      window_start_ = now;
      policy_.setInputRate(last_input_rate_ > 0.0 ? last_input_rate_ : kNaN);
    }
    const Decision& d = policy_.decision();
    st.header.stamp = ros::Time::now();
    st.topic = topic_;
    st.other_topics = state_other_topics_;
    st.input_topic = input_topic_;
    st.peers_topic = peers_ ? peers_topic_ : "";
    const bool jpeg = options_.format == "jpeg";
    const bool h264 = options_.format == "h264";
    st.codec = options_.format;
    st.format = last_format_;
    st.quality = jpeg ? static_cast<uint8_t>(d.quality) : 0;
    st.video_bitrate_kbps = h264 ? policy_.videoBitrateKbps() : kNaN;
    st.keyframes = last_keyframes_;
    st.skipped_frames = last_skipped_;
    st.rate_hz = d.rate_hz;
    st.input_rate_hz = last_input_rate_;
    st.output_rate_hz = last_output_rate_;
    st.bitrate_kbps = last_bitrate_kbps_;
    st.frame_bytes = last_frame_bytes_;
    st.encode_ms = last_encode_ms_;
    st.budget_kbps = nanIfInf(d.budget_kbps);
    st.limited_by = d.limited_by;
    st.reason = peers_ ? d.reason : kNoOverlay;
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
      s.quality = st.quality;
      s.codec = options_.format;
      s.codec_reason = h264 ? "subscribed to the link_aware_h264 transport (" + topic_ +
                                  "); H.264 budgets video_budget_kbps_<path>" :
                              "subscribed to " + topic_ + " (JPEG/PNG: every viewer decodes it)";
      s.rate_hz = d.rate_hz;
      s.bitrate_kbps = last_bitrate_kbps_;
      st.subscribers.push_back(s);
    }
  }
  st.input_subscribed = input_subscribed_.load();
  state_pub_.publish(st);
}

// ---- frame thread -----------------------------------------------------------------------------

bool LinkAwareStream::admitFrame(int* quality)
{
  const double now = ros::WallTime::now().toSec();
  std::lock_guard<std::mutex> lock(mutex_);
  ++window_in_;
  const Decision& d = policy_.decision();
  *quality = d.quality;
  if (backed_up_)
  {
    ++window_skipped_;
    return false;
  }
  // Frame gate: pass a frame when it is due; a 20 % early tolerance keeps a 30 Hz input at 30 Hz
  // under a 30 Hz cap despite arrival jitter.
  const double period = 1.0 / d.rate_hz;
  if (now < next_due_ - 0.2 * period)
    return false;
  next_due_ = std::min(std::max(next_due_ + period, now), now + period);
  return true;
}

void LinkAwareStream::frameSent(size_t bytes, int quality, double encode_ms, const std::string& format,
                                bool keyframe)
{
  std::lock_guard<std::mutex> lock(mutex_);
  ++window_out_;
  window_keyframes_ += keyframe ? 1 : 0;
  window_bytes_ += bytes;
  window_encode_ms_ += encode_ms;
  if (last_format_ != format)
    last_format_ = format;
  if (options_.format == "jpeg")
    policy_.onFrameEncoded(bytes, quality);
}

sensor_msgs::CompressedImagePtr LinkAwareStream::encode(const sensor_msgs::Image& image, ImageEncoder& encoder,
                                                        int* quality, double* encode_ms)
{
  if (refuses(image) || !admitFrame(quality))
    return sensor_msgs::CompressedImagePtr();
  sensor_msgs::CompressedImagePtr out(new sensor_msgs::CompressedImage);
  int png_level;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    png_level = options_.png_level;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try
  {
    encoder.setLimits(options_.limits);
    if (options_.format == "png")
      encoder.encodePng(image, png_level, *out);
    else
      encoder.encodeJpeg(image, *quality, *out);
  }
  catch (const std::exception& e)
  {
    const std::string what = e.what();
    frame_log_.report(ros::console::levels::Error, ProblemLog::kindOf(what),
                      "cannot encode a frame from " + input_topic_ + ": " + what);
    return sensor_msgs::CompressedImagePtr();
  }
  *encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

bool LinkAwareStream::refuses(const sensor_msgs::Image& image)
{
  const std::string bad =
      checkRawImage(image.encoding, image.width, image.height, image.step, image.data.size(), options_.limits);
  if (bad.empty())
    return false;
  frame_log_.report(ros::console::levels::Error, ProblemLog::kindOf(bad),
                    "refuses a frame from " + input_topic_ + ": " + bad + " (the next frames are checked again)");
  return true;
}

sensor_msgs::CompressedImagePtr LinkAwareStream::encodeH264(const sensor_msgs::Image& image, H264Encoder& encoder,
                                                            bool* keyframe, double* encode_ms)
{
  int quality = 0;
  if (refuses(image) || !admitFrame(&quality))
    return sensor_msgs::CompressedImagePtr();
  double kbps, crf, fps;
  int gop;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    kbps = policy_.videoBitrateKbps();
    crf = options_.crf;
    gop = options_.gop;
    fps = options_.policy.max_rate_hz;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const uint8_t* pixels = image.data.data();
  size_t size = image.data.size();
  int step = static_cast<int>(image.step);
  std::string encoding = image.encoding;
  cv_bridge::CvImageConstPtr converted;
  const EncodingRule rule = encodingRule(encoding);
  if (rule.support == EncodingSupport::kConverted)
  {
    try
    {
      converted = cv_bridge::toCvCopy(image, rule.converted_to);
    }
    catch (const std::exception& e)
    {
      frame_log_.report(ros::console::levels::Error, "convert " + encoding,
                        "cannot convert a '" + encoding + "' frame to " + rule.converted_to + " for H.264: " + e.what());
      return sensor_msgs::CompressedImagePtr();
    }
    pixels = converted->image.data;
    step = static_cast<int>(converted->image.step[0]);
    size = converted->image.step[0] * static_cast<size_t>(converted->image.rows);
    encoding = converted->encoding;
  }
  std::string error;
  // a new gop, or a switch between capped CRF and average bitrate, reopens the encoder (the next
  // packet is a keyframe); a new crf or bitrate applies on the fly
  if (!encoder.isOpen() || encoder.params().gop != gop || (encoder.params().crf > 0.0) != (crf > 0.0))
  {
    H264Params params;
    params.width = static_cast<int>(image.width);
    params.height = static_cast<int>(image.height);
    params.fps = fps;
    params.bitrate_kbps = static_cast<int>(kbps);
    params.gop = gop;
    params.crf = crf;
    params.limits = options_.limits;
    if (!encoder.open(params, &error))
    {
      frame_log_.report(ros::console::levels::Error, "open: " + ProblemLog::kindOf(error),
                        "cannot open the H.264 encoder: " + error);
      return sensor_msgs::CompressedImagePtr();
    }
    applied_kbps_ = static_cast<int>(kbps);
    applied_crf_ = crf;
  }
  else
  {
    if (std::abs(kbps - applied_kbps_) > 0.05 * applied_kbps_)
    {
      encoder.setBitrate(static_cast<int>(kbps));  // on the fly: the same encoder, no reopen
      applied_kbps_ = static_cast<int>(kbps);
    }
    if (crf != applied_crf_)
    {
      encoder.setCrf(crf);  // on the fly as well (x264_encoder_reconfig)
      applied_crf_ = crf;
    }
  }
  if (keyframe_wanted_.exchange(false))
    encoder.requestKeyframe();
  Packet packet;
  if (!encoder.encode(pixels, size, static_cast<int>(image.width), static_cast<int>(image.height), step, encoding,
                      frame_count_++, &packet, &error))
  {
    frame_log_.report(ros::console::levels::Error, ProblemLog::kindOf(error),
                      "cannot encode a frame from " + input_topic_ + ": " + error);
    keyframe_wanted_ = true;  // the decoders may have missed a reference
    return sensor_msgs::CompressedImagePtr();
  }
  sensor_msgs::CompressedImagePtr out(new sensor_msgs::CompressedImage);
  out->header = image.header;
  out->format = "h264";
  out->data.swap(packet.data);
  *keyframe = packet.keyframe;
  *encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace overlay_manager
