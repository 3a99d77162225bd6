// Unshape nodelet, the viewer's side of a shaped topic (docs/shaping.md): overlay_manager/ShapedMessage
// in, the original message out, with its own type, so rviz, rostopic and rosbag use it as they
// would the robot's topic.
//
//   rosrun overlay_manager unshape in:=/robot1/points/shaped out:=/robot1/points_view
//
// Topics
//   in        in   overlay_manager/ShapedMessage (a robot's <topic>/shaped)
//   in/type   in   overlay_manager/ShapedType (latched): the original type and definition
//   in/tiers  in   overlay_manager/TierDirectory (latched): the tier this node should read; the
//                  data subscription moves to it (in, or in/full for a path without a budget:
//                  the message as published, no decompression)
//   out       out  the original type (advertised once the type is known; a publisher whose type
//                  changes is refused with one error, the first type stays)
//
// Parameters (private): max_message_bytes (bytes, 268435456): the largest message decompressed;
// queue_size (1: latest wins).
//
// Hostile input never crashes this node: a frame whose content size is missing, differs from
// raw_size or is over max_message_bytes, a truncated or corrupt frame, a type that differs from
// in/type's: the message is dropped and the problem logged once per kind (then throttled).
//
// Threads: everything runs on the nodelet's single-threaded queue.
#include "overlay_manager/problem_log.h"
#include "overlay_manager/topic_shaping.h"

#include <nodelet/nodelet.h>
#include <overlay_manager/ShapedMessage.h>
#include <overlay_manager/ShapedType.h>
#include <overlay_manager/TierDirectory.h>
#include <pluginlib/class_list_macros.hpp>
#include <ros/ros.h>
#include <topic_tools/shape_shifter.h>

#include <memory>

namespace overlay_manager
{

class TopicUnshaper : public nodelet::Nodelet
{
private:
  void onInit() override
  {
    ros::NodeHandle& nh = getNodeHandle();
    ros::NodeHandle& pnh = getPrivateNodeHandle();
    double max_bytes = static_cast<double>(shaping::kDefaultMaxMessageBytes);
    if (!pnh.getParam("max_message_bytes", max_bytes))
    {
      int i;
      if (pnh.getParam("max_message_bytes", i))
        max_bytes = i;
    }
    if (!(max_bytes >= 1024.0 && max_bytes <= 4294967295.0))
    {
      NODELET_FATAL("%s/max_message_bytes: must be in 1024..4294967295, got %.0f", pnh.getNamespace().c_str(),
                    max_bytes);
      throw std::invalid_argument("max_message_bytes out of range");
    }
    max_bytes_ = static_cast<size_t>(max_bytes);
    const int queue = pnh.param("queue_size", 1);
    in_topic_ = nh.resolveName("in");
    out_topic_ = nh.resolveName("out");
    log_.reset(new ProblemLog(in_topic_));
    queue_ = std::max(1, queue);
    type_sub_ = nh.subscribe(in_topic_ + "/type", 1, &TopicUnshaper::onType, this);
    tiers_sub_ = nh.subscribe(in_topic_ + "/tiers", 1, &TopicUnshaper::onTiers, this);
    reading_ = in_topic_;
    sub_ = nh.subscribe(reading_, queue_, &TopicUnshaper::onShaped, this);
    NODELET_INFO("unshaping %s -> %s (type from %s/type)", in_topic_.c_str(), out_topic_.c_str(), in_topic_.c_str());
  }

  void onType(const ShapedTypeConstPtr& t)
  {
    if (pub_)
    {
      if (t->type != type_->type || t->md5sum != type_->md5sum)
        log_->report(ros::console::levels::Error, "type changed",
                     "the shaped topic's type changed to " + t->type + " (" + t->md5sum + ") but " + out_topic_ +
                         " is advertised as " + type_->type + ": restart unshape to follow it");
      return;
    }
    if (t->type.empty() || t->md5sum.empty() || t->type.size() > 256 || t->md5sum.size() > 64)
    {
      log_->report(ros::console::levels::Error, "bad type", "ignores a ShapedType without a usable type or md5sum");
      return;
    }
    type_ = t;
    shifter_.morph(t->md5sum, t->type, t->definition, "false");
    pub_ = shifter_.advertise(getNodeHandle(), out_topic_, 1);
    NODELET_INFO("%s: advertising %s as %s", in_topic_.c_str(), out_topic_.c_str(), t->type.c_str());
  }

  /// The shaper's directory: read the tier it names for this node (only this topic's own tiers).
  void onTiers(const TierDirectoryConstPtr& d)
  {
    for (const TierEntry& e : d->entries)
    {
      if (e.node != ros::this_node::getName())
        continue;
      if (e.topic != in_topic_ && e.topic != in_topic_ + "/full")
      {
        log_->report(ros::console::levels::Warn, "foreign tier",
                     "ignores a tier directory entry pointing outside " + in_topic_ + ": " + e.topic.substr(0, 256));
        return;
      }
      if (e.topic != reading_)
      {
        NODELET_INFO("%s: path %s: reading tier '%s' on %s", in_topic_.c_str(), e.path.c_str(), e.tier.c_str(),
                     e.topic.c_str());
        reading_ = e.topic;
        sub_ = getNodeHandle().subscribe(reading_, queue_, &TopicUnshaper::onShaped, this);
      }
      return;
    }
  }

  void onShaped(const ShapedMessageConstPtr& m)
  {
    if (!pub_)
    {
      log_->report(ros::console::levels::Warn, "no type",
                   "a message arrived before the type on " + in_topic_ + "/type: dropped until it does");
      return;
    }
    if (m->type != type_->type || m->md5sum != type_->md5sum)
    {
      log_->report(ros::console::levels::Error, "wrong type",
                   "drops a message of type " + m->type.substr(0, 256) + ": " + out_topic_ + " carries " + type_->type);
      return;
    }
    const std::vector<uint8_t>* bytes = &m->data;
    if (m->encoding == ShapedMessage::ENCODING_ZSTD)
    {
      std::string error;
      if (!zstd_.decompress(m->data.data(), m->data.size(), m->raw_size, max_bytes_, &buffer_, &error))
      {
        log_->report(ros::console::levels::Error, ProblemLog::kindOf(error), "drops a message: " + error);
        return;
      }
      bytes = &buffer_;
      if (m->shuffle >= 2)
      {
        if (m->shuffle > 4096)
        {
          log_->report(ros::console::levels::Error, "shuffle", "drops a message with shuffle stride " +
                                                                   std::to_string(m->shuffle) + " (over 4096)");
          return;
        }
        unshuffled_.resize(buffer_.size());
        shaping::unshuffleBytes(buffer_.data(), buffer_.size(), m->shuffle, unshuffled_.data());
        bytes = &unshuffled_;
      }
    }
    else if (m->encoding != ShapedMessage::ENCODING_RAW)
    {
      log_->report(ros::console::levels::Error, "encoding",
                   "drops a message with encoding '" + m->encoding.substr(0, 64) + "' (not raw or zstd)");
      return;
    }
    else if (m->data.size() > max_bytes_)
    {
      log_->report(ros::console::levels::Error, "size", "drops a raw message over max_message_bytes");
      return;
    }
    boost::shared_ptr<topic_tools::ShapeShifter> out(new topic_tools::ShapeShifter);
    out->morph(type_->md5sum, type_->type, type_->definition, "false");
    try
    {
      ros::serialization::IStream is(const_cast<uint8_t*>(bytes->data()), static_cast<uint32_t>(bytes->size()));
      out->read(is);
    }
    catch (const std::exception& e)
    {
      log_->report(ros::console::levels::Error, "read", std::string("drops a message: ") + e.what());
      return;
    }
    pub_.publish(out);
  }

  size_t max_bytes_ = shaping::kDefaultMaxMessageBytes;
  std::string in_topic_, out_topic_;
  std::unique_ptr<ProblemLog> log_;
  ros::Subscriber sub_, type_sub_, tiers_sub_;
  std::string reading_;  ///< the tier topic subscribed to now
  int queue_ = 1;
  ros::Publisher pub_;
  ShapedTypeConstPtr type_;
  topic_tools::ShapeShifter shifter_;
  shaping::ZstdCodec zstd_;
  std::vector<uint8_t> buffer_, unshuffled_;
};

}  // namespace overlay_manager

PLUGINLIB_EXPORT_CLASS(overlay_manager::TopicUnshaper, nodelet::Nodelet)
