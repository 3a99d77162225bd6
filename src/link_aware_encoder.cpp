// Link-aware image encoder nodelet: raw sensor_msgs/Image in, sensor_msgs/CompressedImage out on
// <image>/compressed (compressed_image_transport's format), with JPEG quality and frame rate fitted
// to the overlay paths of the subscribers.
//
// Topics (relative to the nodelet's namespace)
//   image                          in   sensor_msgs/Image, subscribed only while the output has subscribers
//   image/compressed               out  sensor_msgs/CompressedImage
//   image/compressed/stream_state  out  overlay_manager/StreamState (latched), decisions per subscriber
//   ~peers_topic                   in   overlay_manager/PeerList of this machine's overlay node
//
// Parameters (private): format (jpeg|png), png_level, max_rate, min_rate, max_quality,
// min_quality, budget_kbps_<path> for derp, peer_relay, idle, unknown, offline, direct, local
// (0 = no budget), adapt_to_delivery, max_backlog_ms, state_period (s), peers_topic.
//
// Threads and locks
//   * frame thread (the nodelet's single-threaded queue): image callback. Takes mutex_ only to read
//     the decision and to record the encoded size; encodes and publishes without it.
//   * control thread (own queue + one-thread AsyncSpinner): connect/disconnect callbacks, ~peers,
//     the state timer. It does the blocking work (master lookupNode and (un)subscribing, bus info,
//     ioctl), all without mutex_, and then swaps results in under mutex_. Nothing logs or calls
//     the master while holding mutex_. A master that hangs stalls this thread (stream_state
//     stops), never the frames: they flow on the frame thread with the last decision.
#include "overlay_manager/image_codec.h"
#include "overlay_manager/stream_policy.h"
#include "overlay_manager/subscriber_hosts.h"

#include <nodelet/nodelet.h>
#include <overlay_manager/PeerList.h>
#include <overlay_manager/StreamState.h>
#include <pluginlib/class_list_macros.hpp>
#include <ros/callback_queue.h>
#include <ros/master.h>
#include <ros/network.h>
#include <ros/ros.h>
#include <ros/xmlrpc_manager.h>
#include <sensor_msgs/CompressedImage.h>
#include <sensor_msgs/Image.h>

#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <set>

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

class LinkAwareEncoder : public nodelet::Nodelet
{
public:
  ~LinkAwareEncoder() override
  {
    if (spinner_)
      spinner_->stop();
  }

private:
  /// One subscribing node (several connections from one node count once).
  struct Sub
  {
    int connections = 0;
    std::string host;               ///< short name or address as the master gave it; "" = not looked up
    std::string path = paths::kUnknown;
    double observed_cap_kbps = kNaN;
    uint32_t backlog_bytes = 0;
    ros::WallTime next_lookup;      ///< retry time after a failed lookupNode
  };

  void onInit() override
  {
    ros::NodeHandle& nh = getNodeHandle();
    ros::NodeHandle& pnh = getPrivateNodeHandle();
    format_ = pnh.param<std::string>("format", "jpeg");
    if (format_ != "jpeg" && format_ != "png")
    {
      NODELET_FATAL("~format: '%s' is not jpeg or png", format_.c_str());
      throw std::invalid_argument("~format must be jpeg or png, got '" + format_ + "'");
    }
    png_level_ = pnh.param("png_level", 3);
    PolicyParams p;
    p.max_rate_hz = pnh.param("max_rate", p.max_rate_hz);
    p.min_rate_hz = pnh.param("min_rate", p.min_rate_hz);
    p.max_quality = pnh.param("max_quality", p.max_quality);
    p.min_quality = pnh.param("min_quality", p.min_quality);
    const std::map<std::string, std::string> keys = {
        {paths::kDerp, "budget_kbps_derp"},       {paths::kPeerRelay, "budget_kbps_peer_relay"},
        {paths::kIdle, "budget_kbps_idle"},       {paths::kUnknown, "budget_kbps_unknown"},
        {paths::kOffline, "budget_kbps_offline"}, {paths::kDirect, "budget_kbps_direct"},
        {paths::kLocal, "budget_kbps_local"}};
    for (const auto& kv : keys)
    {
      const double dflt = p.budget_kbps.count(kv.first) ? p.budget_kbps[kv.first] : 0.0;
      const double v = pnh.param(kv.second, dflt);
      if (v > 0.0)
        p.budget_kbps[kv.first] = v;
      else
        p.budget_kbps.erase(kv.first);
    }
    if (p.max_rate_hz <= 0.0 || p.min_quality < 1 || p.max_quality > 100 || p.min_quality > p.max_quality)
    {
      NODELET_FATAL("bad limits: need max_rate > 0 and 1 <= min_quality <= max_quality <= 100 (got max_rate=%g, "
                    "min_quality=%d, max_quality=%d)", p.max_rate_hz, p.min_quality, p.max_quality);
      throw std::invalid_argument("bad ~max_rate/~min_quality/~max_quality");
    }
    policy_.setParams(p);
    adapt_to_delivery_ = pnh.param("adapt_to_delivery", true);
    max_backlog_ms_ = pnh.param("max_backlog_ms", 200.0);
    const double state_period = pnh.param("state_period", 1.0);
    const std::string peers_topic = pnh.param<std::string>("peers_topic", "/overlay_manager/peers");
    own_host_ = ros::network::getHost();

    in_topic_ = nh.resolveName("image");
    out_topic_ = in_topic_ + "/compressed";

    control_nh_ = nh;
    control_nh_.setCallbackQueue(&control_queue_);
    ros::AdvertiseOptions ao = ros::AdvertiseOptions::create<sensor_msgs::CompressedImage>(
        out_topic_, 1, boost::bind(&LinkAwareEncoder::onConnect, this, boost::placeholders::_1),
        boost::bind(&LinkAwareEncoder::onDisconnect, this, boost::placeholders::_1), ros::VoidConstPtr(),
        &control_queue_);
    pub_ = nh.advertise(ao);
    state_pub_ = control_nh_.advertise<StreamState>(out_topic_ + "/stream_state", 1, true);
    peers_sub_ = control_nh_.subscribe(peers_topic, 1, &LinkAwareEncoder::onPeers, this);
    timer_ = control_nh_.createWallTimer(ros::WallDuration(state_period), &LinkAwareEncoder::onTimer, this);
    window_start_ = ros::WallTime::now();
    spinner_.reset(new ros::AsyncSpinner(1, &control_queue_));
    spinner_->start();
    NODELET_INFO("link-aware %s: %s -> %s (peers from %s)", format_.c_str(), in_topic_.c_str(), out_topic_.c_str(),
                 ros::names::resolve(peers_topic).c_str());
  }

  // ---- control thread -------------------------------------------------------------------------

  void onConnect(const ros::SingleSubscriberPublisher& ssp)
  {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      subs_[ssp.getSubscriberName()].connections++;
    }
    updateInput();
    resolveAndDecide();
    publishState();
  }

  void onDisconnect(const ros::SingleSubscriberPublisher& ssp)
  {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = subs_.find(ssp.getSubscriberName());
      if (it != subs_.end() && --it->second.connections <= 0)
        subs_.erase(it);
    }
    updateInput();
    resolveAndDecide();
    publishState();
  }

  /// Subscribe to the raw topic while the output has subscribers, unsubscribe when it has none.
  /// Control thread only; subscribe/shutdown talk to the master, so nothing that reporting needs
  /// is held meanwhile (publishState reads input_subscribed_).
  void updateInput()
  {
    const bool want = pub_.getNumSubscribers() > 0;
    std::lock_guard<std::mutex> lock(input_mutex_);
    if (want && !image_sub_)
    {
      // frames come on the nodelet's own queue, not the control thread's
      image_sub_ = getNodeHandle().subscribe(in_topic_, 1, &LinkAwareEncoder::onImage, this);
      input_subscribed_ = true;
      NODELET_DEBUG("subscribed to %s", in_topic_.c_str());
    }
    else if (!want && image_sub_)
    {
      image_sub_.shutdown();
      image_sub_ = ros::Subscriber();
      input_subscribed_ = false;
      NODELET_DEBUG("unsubscribed from %s", in_topic_.c_str());
    }
  }

  void onPeers(const PeerListConstPtr& msg)
  {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      peers_ = msg;
    }
    resolveAndDecide();
  }

  void onTimer(const ros::WallTimerEvent&)
  {
    updateInput();  // catches a missed disconnect (getNumSubscribers is the truth)
    if (adapt_to_delivery_)
      observeDelivery();
    resolveAndDecide();
    publishState();
  }

  /// Look up unresolved subscribers' machines (master lookupNode, blocking: no lock held), then map
  /// every subscriber to a path with the latest ~peers and hand the result to the policy.
  void resolveAndDecide()
  {
    std::vector<std::string> todo;
    PeerListConstPtr peers;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const ros::WallTime now = ros::WallTime::now();
      for (const auto& kv : subs_)
        if (kv.second.host.empty() && kv.second.next_lookup <= now)
          todo.push_back(kv.first);
      peers = peers_;
    }
    std::map<std::string, std::string> found;
    for (const std::string& node : todo)
    {
      XmlRpc::XmlRpcValue args, result, payload;
      args[0] = ros::this_node::getName();
      args[1] = node;
      std::string host;
      if (ros::master::execute("lookupNode", args, result, payload, false) && payload.getType() == XmlRpc::XmlRpcValue::TypeString)
        host = hostOfUri(static_cast<std::string>(payload));
      found[node] = host;
      if (host.empty())
        NODELET_WARN_THROTTLE(10.0, "cannot look up the machine of subscriber %s: treated as path unknown",
                              node.c_str());
    }
    std::vector<SubscriberView> views;
    bool changed = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const ros::WallTime now = ros::WallTime::now();
      for (auto& kv : subs_)
      {
        auto f = found.find(kv.first);
        if (f != found.end())
        {
          kv.second.host = f->second;
          if (f->second.empty())
            kv.second.next_lookup = now + ros::WallDuration(5.0);
        }
        const std::string path = pathOfHost(kv.second.host, own_host_, peers.get());
        if (path != kv.second.path)
        {
          changed = true;
          kv.second.observed_cap_kbps = kNaN;  // learnt on the old path
        }
        kv.second.path = path;
        SubscriberView v;
        v.node = kv.first;
        v.host = shortName(kv.second.host, peers.get());
        v.path = path;
        v.observed_cap_kbps = kv.second.observed_cap_kbps;
        views.push_back(v);
      }
      policy_.setSubscribers(views);
    }
    if (changed)
      publishState();
  }

  /// Per subscriber: bytes its TCP connection has not sent yet (SIOCOUTQNSD on the socket of its
  /// connection, found through this process's bus info). Unsent bytes pile up only when the
  /// connection cannot carry what the stream makes (bytes in flight on a long round trip do not
  /// count: those are latency, not a lack of capacity). A backlog above ~max_backlog_ms of
  /// stream lowers that subscriber's cap to 70 % of what the stream sends now; a drained queue
  /// lets the cap grow 15 % per period until it no longer limits. A path change forgets the cap.
  void observeDelivery()
  {
    // This process's own getBusInfo (the XML-RPC call rosnode info makes), answered by roscpp's
    // XML-RPC thread: connection id, subscriber caller id, direction, transport, topic, connected,
    // transport info with the socket.
    XmlRpc::XmlRpcValue args, result, info;
    args[0] = ros::this_node::getName();
    ros::XMLRPCManager& xm = *ros::XMLRPCManager::instance();
    XmlRpc::XmlRpcClient* client = xm.getXMLRPCClient(hostOfUri(xm.getServerURI()), xm.getServerPort(), "/");
    const bool ok = client->execute("getBusInfo", args, result);
    xm.releaseXMLRPCClient(client);
    if (!ok || result.getType() != XmlRpc::XmlRpcValue::TypeArray || result.size() < 3 ||
        result[2].getType() != XmlRpc::XmlRpcValue::TypeArray)
    {
      NODELET_WARN_THROTTLE(30.0, "getBusInfo on this node failed: delivery is not observed");
      return;
    }
    info = result[2];
    std::map<std::string, uint32_t> backlog;
    for (int i = 0; i < info.size(); ++i)
    {
      XmlRpc::XmlRpcValue& c = info[i];
      if (c.size() < 7 || static_cast<std::string>(c[2]) != "o" || static_cast<std::string>(c[4]) != out_topic_)
        continue;
      const int fd = socketOfTransportInfo(static_cast<std::string>(c[6]));
      int outq = 0;
      if (fd >= 0 && ioctl(fd, SIOCOUTQNSD, &outq) == 0 && outq > 0)
      {
        uint32_t& b = backlog[static_cast<std::string>(c[1])];
        b = std::max(b, static_cast<uint32_t>(outq));
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    const double out_kbps = last_bitrate_kbps_;
    for (auto& kv : subs_)
    {
      Sub& s = kv.second;
      auto b = backlog.find(kv.first);
      s.backlog_bytes = b == backlog.end() ? 0 : b->second;
      SubscriberView v;
      v.path = s.path;
      s.observed_cap_kbps = nextObservedCap(s.observed_cap_kbps, s.backlog_bytes, out_kbps, policy_.budgetFor(v),
                                            max_backlog_ms_);
    }
  }

  void publishState()
  {
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
        window_in_ = window_out_ = 0;
        window_bytes_ = 0;
        window_encode_ms_ = 0.0;
        window_start_ = now;
        policy_.setInputRate(last_input_rate_ > 0.0 ? last_input_rate_ : kNaN);
      }
      const Decision& d = policy_.decision();
      st.header.stamp = ros::Time::now();
      st.topic = out_topic_;
      st.input_topic = in_topic_;
      st.format = last_format_;
      st.quality = static_cast<uint8_t>(d.quality);
      st.rate_hz = d.rate_hz;
      st.input_rate_hz = last_input_rate_;
      st.output_rate_hz = last_output_rate_;
      st.bitrate_kbps = last_bitrate_kbps_;
      st.frame_bytes = last_frame_bytes_;
      st.encode_ms = last_encode_ms_;
      st.budget_kbps = nanIfInf(d.budget_kbps);
      st.limited_by = d.limited_by;
      st.reason = d.reason;
      for (const SubscriberView& v : policy_.subscribers())
      {
        StreamSubscriber s;
        s.node = v.node;
        s.host = v.host;
        s.path = v.path;
        s.budget_kbps = nanIfInf(policy_.budgetFor(v));
        s.observed_cap_kbps = v.observed_cap_kbps;
        auto it = subs_.find(v.node);
        s.backlog_bytes = it == subs_.end() ? 0 : it->second.backlog_bytes;
        s.quality = st.quality;
        s.rate_hz = d.rate_hz;
        s.bitrate_kbps = last_bitrate_kbps_;
        st.subscribers.push_back(s);
      }
    }
    st.input_subscribed = input_subscribed_.load();
    state_pub_.publish(st);
  }

  // ---- frame thread ---------------------------------------------------------------------------

  void onImage(const sensor_msgs::ImageConstPtr& img)
  {
    const ros::WallTime now = ros::WallTime::now();
    int quality;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++window_in_;
      const Decision& d = policy_.decision();
      quality = d.quality;
      // Frame gate: pass a frame when it is due; a 20 % early tolerance keeps a 30 Hz input at
      // 30 Hz under a 30 Hz cap despite arrival jitter.
      const double period = 1.0 / d.rate_hz;
      if (now.toSec() < next_due_ - 0.2 * period)
        return;
      next_due_ = std::max(next_due_ + period, now.toSec());
      if (next_due_ > now.toSec() + period)
        next_due_ = now.toSec() + period;
    }
    sensor_msgs::CompressedImagePtr out(new sensor_msgs::CompressedImage);
    const auto t0 = std::chrono::steady_clock::now();
    try
    {
      if (format_ == "png")
        encoder_.encodePng(*img, png_level_, *out);
      else
        encoder_.encodeJpeg(*img, quality, *out);
    }
    catch (const std::exception& e)
    {
      NODELET_ERROR_THROTTLE(10.0, "%s: cannot encode frame from %s: %s", out_topic_.c_str(), in_topic_.c_str(),
                             e.what());
      return;
    }
    const double encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const size_t bytes = out->data.size();
    const std::string format = out->format;
    pub_.publish(out);
    std::lock_guard<std::mutex> lock(mutex_);
    ++window_out_;
    window_bytes_ += bytes;
    window_encode_ms_ += encode_ms;
    last_format_ = format;
    if (format_ == "jpeg")
      policy_.onFrameEncoded(bytes, quality);
  }

  // configuration (set in onInit, read-only afterwards)
  std::string format_;
  int png_level_ = 3;
  bool adapt_to_delivery_ = true;
  double max_backlog_ms_ = 200.0;
  std::string in_topic_, out_topic_, own_host_;

  ros::CallbackQueue control_queue_;
  ros::NodeHandle control_nh_;
  std::unique_ptr<ros::AsyncSpinner> spinner_;
  ros::Publisher pub_, state_pub_;
  ros::Subscriber peers_sub_;
  ros::WallTimer timer_;
  ImageEncoder encoder_;  ///< frame thread only

  std::mutex input_mutex_;   ///< guards image_sub_ (control thread only; held during master calls)
  ros::Subscriber image_sub_;
  std::atomic<bool> input_subscribed_{false};  ///< image_sub_ is live, for reporting without input_mutex_

  std::mutex mutex_;  ///< guards everything below
  StreamPolicy policy_;
  std::map<std::string, Sub> subs_;
  PeerListConstPtr peers_;
  double next_due_ = 0.0;
  ros::WallTime window_start_;
  uint64_t window_in_ = 0, window_out_ = 0, window_bytes_ = 0;
  double window_encode_ms_ = 0.0;
  double last_input_rate_ = 0.0, last_output_rate_ = 0.0, last_bitrate_kbps_ = 0.0;
  double last_frame_bytes_ = kNaN, last_encode_ms_ = kNaN;
  std::string last_format_;
};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::LinkAwareEncoder, nodelet::Nodelet)
