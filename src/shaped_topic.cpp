// The ROS adapter of a shaped topic (see shaped_topic.h).
#include "overlay_manager/shaped_topic.h"

#include "overlay_manager/ros_graph.h"
#include "overlay_manager/subscriber_hosts.h"
#include "overlay_manager/viewer_decoders.h"

#include <overlay_manager/StreamState.h>
#include <ros/network.h>
#include <ros/xmlrpc_manager.h>

#include <linux/sockios.h>
#include <netinet/in.h>  // IPPROTO_TCP
#include <linux/tcp.h>    // struct tcp_info with tcpi_bytes_acked (Linux >= 4.1; glibc's lacks it)
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstring>

namespace overlay_manager
{

namespace
{
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kDiscoveryRetryS = 10.0;  ///< s between attempts to find the overlay node
const double kLookupRetryS = 5.0;      ///< s before a failed master lookup of a subscriber is retried
const char* const kNoOverlay = "no overlay node: paths unknown";
const double kRecheckS = 0.1;        ///< s between backlog checks while a skip gate holds
const double kDeliveryCheckS = 0.5;  ///< s between delivery checks (adapt_to_delivery)

double nanIfInf(double v)
{
  return std::isinf(v) ? kNaN : v;
}

/// The port of `fd`'s peer (IPv4 or IPv6); -1 when it has none.
int peerPortOfSocket(int fd)
{
  struct sockaddr_storage addr = {};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0)
    return -1;
  if (addr.ss_family == AF_INET)
    return ntohs(reinterpret_cast<const struct sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<const struct sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

std::vector<std::string> tierNamesFor(bool tiered)
{
  if (tiered)
    return { tiers::kFittedTier, tiers::kFullTier };
  return { tiers::kSingleTier };
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

ShapedTopic::ShapedTopic(const ros::NodeHandle& nh, const std::string& topic, const std::string& input_topic,
                         const ShaperTraits& traits, const TopicOptions& options, DescribeFn describe)
  : options_(options)
  , topic_(topic)
  , input_topic_(input_topic)
  , own_host_(ros::network::getHost())
  , tier_names_(tierNamesFor(options.tiers))
  , describe_(std::move(describe))
  , core_(traits, options.core)
  , frame_log_(topic)
{
  control_nh_ = nh;
  control_nh_.setCallbackQueue(&control_queue_);
  for (const std::string& tier : tier_names_)
    state_pubs_[tier] = control_nh_.advertise<StreamState>(topicOf(tier) + "/stream_state", 1, true);
  if (options_.tiers)
    directory_pub_ = control_nh_.advertise<TierDirectory>(topic_ + "/tiers", 1, true);
  timer_ = control_nh_.createWallTimer(ros::WallDuration(options_.state_period), &ShapedTopic::onTimer, this);
  // always made: adapt_to_delivery may be switched on and off live (the core reads it)
  delivery_timer_ = control_nh_.createWallTimer(ros::WallDuration(kDeliveryCheckS), &ShapedTopic::onDeliveryCheck, this);
  if (traits.reference_chain)
  {
    recheck_timer_ = control_nh_.createWallTimer(ros::WallDuration(kRecheckS), &ShapedTopic::onRecheck, this);
    for (const std::string& tier : tier_names_)
      keyframe_subs_.push_back(control_nh_.subscribe<std_msgs::Empty>(
          keyframeRequestTopic(topicOf(tier)), 4, [this, tier](const std_msgs::EmptyConstPtr&) {
            if (!stopping_)
              core_.requestKeyframe(tier, steadyNowS());
          }));
  }
  spinner_.reset(new ros::AsyncSpinner(1, &control_queue_));
}

ShapedTopic::~ShapedTopic()
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

void ShapedTopic::start()
{
  spinner_->start();
  post([this] { publishState(); });
}

void ShapedTopic::stop()
{
  stopping_ = true;
  timer_.stop();
  delivery_timer_.stop();
  recheck_timer_.stop();
  for (auto& kv : state_pubs_)
    kv.second.shutdown();
  directory_pub_.shutdown();
  peers_sub_.shutdown();
  for (ros::Subscriber& s : keyframe_subs_)
    s.shutdown();
}

void ShapedTopic::applySettings(const CoreSettings& settings)
{
  core_.applySettings(settings);
  post([this] { publishState(); });
}

void ShapedTopic::setStatePeriod(double seconds)
{
  timer_.setPeriod(ros::WallDuration(seconds));
}

void ShapedTopic::setOtherTopics(const std::vector<std::string>& topics)
{
  other_topics_ = topics;
  std::lock_guard<std::mutex> lock(mutex_);
  state_other_topics_ = topics;
}

void ShapedTopic::post(std::function<void()> fn)
{
  if (!stopping_)
    control_queue_.addCallback(boost::make_shared<Task>(std::move(fn)));
}

void ShapedTopic::refused(const std::string& why)
{
  frame_log_.report(ros::console::levels::Error, ProblemLog::kindOf(why),
                    "refuses a " + core_.traits().unit + " from " + input_topic_ + ": " + why +
                        " (the next ones are checked again)");
}

void ShapedTopic::failed(const std::string& tier, const std::string& why)
{
  core_.failed(tier);
  frame_log_.report(ros::console::levels::Error, ProblemLog::kindOf(why),
                    "cannot shape a " + core_.traits().unit + " from " + input_topic_ + " for " + topicOf(tier) +
                        ": " + why);
}

// ---- any thread -------------------------------------------------------------------------------

void ShapedTopic::subscriberConnected(const std::string& tier, const std::string& node)
{
  core_.connected(tier, node);
  post([this] { onChange(); });
}

void ShapedTopic::subscriberDisconnected(const std::string& tier, const std::string& node)
{
  core_.disconnected(tier, node);
  post([this] { onChange(); });
}

// ---- control thread ---------------------------------------------------------------------------

void ShapedTopic::onChange()
{
  if (stopping_)
    return;
  if (hook_)
    hook_();
  if (stopping_)  // the hook may have stopped the topic
    return;
  ensurePeers();
  resolveAndDecide();
  publishState();
}

void ShapedTopic::onTimer(const ros::WallTimerEvent&)
{
  try
  {
    const bool any = !core_.empty();
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
/// peer acknowledged, the caps learnt from that (ShapingCore::observeDelivery), and a new decision.
void ShapedTopic::onDeliveryCheck(const ros::WallTimerEvent&)
{
  try
  {
    if (core_.empty() || stopping_)
      return;
    const CoreSettings settings = core_.settings();
    if (!settings.adapt_to_delivery && !(settings.pacing_factor > 0.0) && !any_paced_)
      return;
    std::map<SubKey, DeliverySample> samples;
    std::vector<Connection> connections;
    if (!readDelivery(&samples, &connections))
      return;
    applyPacing(connections);
    if (!settings.adapt_to_delivery)
      return;
    core_.observeDelivery(steadyNowS(), samples);
    resolveAndDecide();
  }
  catch (const std::exception& e)
  {
    ROS_ERROR_THROTTLE(10.0, "%s: delivery check failed: %s", topic_.c_str(), e.what());
  }
}

/// Sets each connection's pace to what the core says for its subscriber (Connection::pace_kbps,
/// from ShapingCore::pacing): the kernel then sends a large message at that rate instead of in one
/// burst. Only sockets whose pace differs are touched; a connection whose subscriber has no budget
/// is unpaced again.
void ShapedTopic::applyPacing(const std::vector<Connection>& connections)
{
  bool any_paced = false;
  for (const Connection& c : connections)
  {
    // bytes per second; ~0U = no limit (the kernel's "unpaced")
    const unsigned int rate =
        c.pace_kbps > 0.0 ? static_cast<unsigned int>(std::min(c.pace_kbps * 125.0, 4.0e9)) : ~0U;
    any_paced = any_paced || rate != ~0U;
    unsigned int current = ~0U;
    socklen_t len = sizeof(current);
    if (getsockopt(c.fd, SOL_SOCKET, SO_MAX_PACING_RATE, &current, &len) == 0 && current == rate)
      continue;
    if (setsockopt(c.fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)) != 0)
    {
      if (!warned_pacing_)
        ROS_WARN("%s: cannot pace the connection to %s (SO_MAX_PACING_RATE: %s): its messages leave in bursts",
                 topic_.c_str(), c.key.node.c_str(), std::strerror(errno));
      warned_pacing_ = true;
      continue;
    }
    ROS_DEBUG("%s: connection to %s (%s tier) paced at %s", topic_.c_str(), c.key.node.c_str(), c.key.tier.c_str(),
              rate == ~0U ? "no limit" : (std::to_string(c.pace_kbps) + " kbit/s").c_str());
  }
  any_paced_ = any_paced;
}

/// While a skip gate holds: re-reads the backlogs every kRecheckS so encoding resumes as soon as
/// the core's rule allows (ShapingCore::recheck), not at the next delivery check.
void ShapedTopic::onRecheck(const ros::WallTimerEvent&)
{
  try
  {
    if (stopping_ || !core_.anyBackedUp())
      return;
    std::map<SubKey, DeliverySample> samples;
    if (readDelivery(&samples))
      core_.recheck(steadyNowS(), samples);
  }
  catch (const std::exception& e)
  {
    ROS_ERROR_THROTTLE(10.0, "%s: backlog re-check failed: %s", topic_.c_str(), e.what());
  }
}

/// Finds the overlay node's ~peers (once there is a subscriber; retried every kDiscoveryRetryS) and
/// subscribes to it; one warning when there is none, one when the topic stays silent.
void ShapedTopic::ensurePeers()
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
  peers_sub_ = control_nh_.subscribe(src.topic, 1, &ShapedTopic::onPeers, this);
  peers_subscribed_at_ = now;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peers_topic_ = src.topic;
  }
  ROS_INFO("%s: paths from %s (%s)", topic_.c_str(), src.topic.c_str(), src.how.c_str());
}

void ShapedTopic::onPeers(const PeerListConstPtr& msg)
{
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peers_ = msg;
  }
  resolveAndDecide();
}

/// Looks up unresolved subscribers' machines (master lookupNode, blocking: no lock held), then maps
/// every subscriber to a path with the latest ~peers and hands the result to the core.
void ShapedTopic::resolveAndDecide()
{
  for (const std::string& node : core_.unresolved(steadyNowS()))
  {
    const std::string host = nodeHost(node);
    if (host.empty())
      ROS_WARN_THROTTLE(10.0, "%s: cannot look up the machine of subscriber %s: treated as path unknown",
                        topic_.c_str(), node.c_str());
    core_.setHost(node, host, steadyNowS(), kLookupRetryS);
  }
  PeerListConstPtr peers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peers = peers_;
  }
  std::map<std::string, std::pair<std::string, std::string>> mapped;
  for (const auto& kv : core_.hosts())
    mapped[kv.first] = { shortName(kv.second, own_host_, peers.get(), options_.host_aliases),
                         pathOfHost(kv.second, own_host_, peers.get(), options_.host_aliases) };
  if (core_.setPaths(mapped))
    publishState();
}

/// Per subscriber and tier, from the kernel's view of its TCP connections (the sockets named by
/// this process's bus info): bytes not sent yet (SIOCOUTQNSD, the largest of its connections), bytes
/// its peer acknowledged (TCP_INFO tcpi_bytes_acked, summed; 0 when the kernel does not say) and how
/// long its bytes wait in queues on the path (TCP_INFO rtt - min_rtt, the largest). Unsent bytes
/// pile up when the connection cannot carry what the tier makes; a relay with deep buffers
/// (tailscaled's DERP connection) takes such bytes anyway, and they show only as a longer round
/// trip. A round trip that is merely long (a distant peer) is in min_rtt and does not count.
bool ShapedTopic::readDelivery(std::map<SubKey, DeliverySample>* out, std::vector<Connection>* connections)
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
  std::map<std::string, std::string> tier_of_topic;  // output topic -> tier
  for (const std::string& tier : tier_names_)
    tier_of_topic[topicOf(tier)] = tier;
  for (const std::string& t : other_topics_)
    tier_of_topic[t] = tier_names_.front();
  const std::map<SubKey, double> pace = core_.pacing();
  XmlRpc::XmlRpcValue& info = result[2];
  for (int i = 0; i < info.size(); ++i)
  {
    XmlRpc::XmlRpcValue& c = info[i];
    if (c.getType() != XmlRpc::XmlRpcValue::TypeArray || c.size() < 7 || static_cast<std::string>(c[2]) != "o")
      continue;
    auto tier = tier_of_topic.find(static_cast<std::string>(c[4]));
    if (tier == tier_of_topic.end())
      continue;
    const std::string transport_info = static_cast<std::string>(c[6]);
    const int fd = socketOfTransportInfo(transport_info);
    // the descriptor must still be that connection (it may have closed, and its number been reused,
    // since roscpp answered): the socket's peer port is the one the transport info names
    if (fd < 0 || peerPortOfSocket(fd) != peerPortOfTransportInfo(transport_info))
      continue;
    const SubKey key{ tier->second, static_cast<std::string>(c[1]) };
    auto p = pace.find(key);
    const double pace_kbps = p == pace.end() ? 0.0 : p->second;
    if (connections)
      connections->push_back(Connection{ fd, key, pace_kbps });
    DeliverySample& d = (*out)[key];
    int outq = 0;
    if (ioctl(fd, SIOCOUTQNSD, &outq) == 0 && outq > 0)
    {
      // a paced connection's first kPacedAllowanceS at its pace is pacing, not backlog
      const uint32_t beyond = backlogBeyondPace(static_cast<uint32_t>(outq), pace_kbps);
      d.unsent_bytes = std::max(d.unsent_bytes, beyond);
    }
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

/// One StreamState per tier (a tier without subscribers says so), and the directory when it changed.
void ShapedTopic::publishState()
{
  if (stopping_)
    return;
  const std::vector<TierState> snapshot = core_.snapshot(steadyNowS());
  const CoreSettings settings = core_.settings();
  PeerListConstPtr peers;
  std::string peers_topic;
  std::vector<std::string> other_topics;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peers = peers_;
    peers_topic = peers_topic_;
    other_topics = state_other_topics_;
  }
  std::vector<std::string> tier_topics;
  for (const TierState& t : snapshot)
    tier_topics.push_back(topicOf(t.tier));
  const ros::Time stamp = ros::Time::now();
  const std::string codec = core_.traits().kind;
  for (const std::string& tier : tier_names_)
  {
    TierState t;
    auto it = std::find_if(snapshot.begin(), snapshot.end(), [&](const TierState& s) { return s.tier == tier; });
    if (it != snapshot.end())
      t = *it;
    else
    {
      // no subscribers on this tier: what a first subscriber would get
      StreamPolicy idle(settings.policy);
      idle.setSubscribers({});
      t.tier = tier;
      t.decision = idle.decision();
      t.target_kbps = idle.videoBitrateKbps();
    }
    StreamState st;
    st.header.stamp = stamp;
    st.topic = topicOf(tier);
    st.tier = tier;
    st.tier_topics = tier_topics;
    st.other_topics = tier == tier_names_.front() ? other_topics : std::vector<std::string>();
    st.input_topic = input_topic_;
    st.input_subscribed = input_subscribed_.load();
    st.peers_topic = peers ? peers_topic : "";
    st.codec = codec;
    st.format = t.format;
    st.quality = 0;
    st.video_bitrate_kbps = kNaN;
    st.keyframes = t.keyframes;
    st.skipped_frames = t.skipped;
    st.rate_hz = t.decision.rate_hz;
    st.input_rate_hz = t.input_rate_hz;
    st.output_rate_hz = t.output_rate_hz;
    st.bitrate_kbps = t.bitrate_kbps;
    st.frame_bytes = t.frame_bytes;
    st.encode_ms = t.encode_ms;
    st.budget_kbps = nanIfInf(t.decision.budget_kbps);
    st.limited_by = t.decision.limited_by;
    st.reason = peers ? t.decision.reason : kNoOverlay;
    for (const SubscriberState& v : t.subscribers)
    {
      StreamSubscriber s;
      s.node = v.node;
      s.host = v.host;
      s.path = v.path;
      s.tier = v.tier;
      s.wanted_tier = options_.tiers ? v.wanted_tier : "";
      s.budget_kbps = v.budget_kbps;
      s.observed_cap_kbps = v.observed_cap_kbps;
      s.backlog_bytes = v.backlog_bytes;
      s.queue_delay_ms = v.queue_delay_ms;
      s.pacing_kbps = v.pacing_kbps;
      s.codec = codec;
      s.rate_hz = t.decision.rate_hz;
      s.bitrate_kbps = t.bitrate_kbps;
      st.subscribers.push_back(s);
    }
    if (describe_)
      describe_(t, &st);  // codec fields; may fill each subscriber's codec_reason and quality
    state_pubs_[tier].publish(st);
  }
  if (!options_.tiers)
    return;
  TierDirectory dir;
  dir.topic = topic_;
  dir.tier_topics = tier_topics;
  std::map<std::string, std::string> paths_by_node;
  for (const TierState& t : snapshot)
    for (const SubscriberState& v : t.subscribers)
      paths_by_node[v.node] = v.path;
  for (const auto& kv : core_.directory())
  {
    TierEntry e;
    e.node = kv.first;
    e.path = paths_by_node.count(kv.first) ? paths_by_node[kv.first] : std::string(paths::kUnknown);
    e.tier = kv.second;
    e.topic = topicOf(kv.second);
    dir.entries.push_back(e);
  }
  if (dir.entries != last_directory_.entries || dir.tier_topics != last_directory_.tier_topics ||
      last_directory_.topic.empty())
  {
    dir.header.stamp = stamp;
    last_directory_ = dir;
    directory_pub_.publish(dir);
  }
}

}  // namespace overlay_manager
