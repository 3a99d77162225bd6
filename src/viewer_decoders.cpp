// Viewer-side decoding of the link-aware transports (viewer_decoders.h).
#include "overlay_manager/viewer_decoders.h"

#include <std_msgs/Empty.h>

#include <stdexcept>

namespace overlay_manager
{
namespace
{
const double kRequestSpacingS = 1.0;   ///< least time between two keyframe requests of one subscription
const uint64_t kWaitingBeforeRequest = 5;  ///< messages waited for a keyframe before asking for one

uint64_t readCap(const ros::NodeHandle& nh, const std::string& name, uint64_t dflt, uint64_t max)
{
  XmlRpc::XmlRpcValue v;
  if (!nh.getParam(name, v))
    return dflt;
  double x = 0.0;
  if (v.getType() == XmlRpc::XmlRpcValue::TypeInt)
    x = static_cast<int>(v);
  else if (v.getType() == XmlRpc::XmlRpcValue::TypeDouble)
    x = static_cast<double>(v);
  else
    throw std::invalid_argument(nh.resolveName(name) + ": must be a number, got a " +
                                (v.getType() == XmlRpc::XmlRpcValue::TypeString ? "string" : "non-number"));
  if (!(x >= 1.0) || x > static_cast<double>(max))
    throw std::invalid_argument(nh.resolveName(name) + ": must be between 1 and " + std::to_string(max) + ", got " +
                                std::to_string(x));
  return static_cast<uint64_t>(x);
}

const char* kindOf(DecodeStatus s)
{
  switch (s)
  {
    case DecodeStatus::kWaitingForKeyframe: return "waiting for keyframe";
    case DecodeStatus::kMissingReference: return "missing reference";
    case DecodeStatus::kDuplicate: return "duplicate";
    case DecodeStatus::kRefused: return "over a limit";
    case DecodeStatus::kError: return "undecodable";
    default: return "no picture";
  }
}
}  // namespace

std::string keyframeRequestTopic(const std::string& stream_topic)
{
  return stream_topic + "/keyframe_request";
}

std::shared_ptr<H264ViewerDecoder> makeH264ViewerDecoder(const std::string& output_encoding, const std::string& topic,
                                                         const ImageLimits& limits, ros::NodeHandle nh)
{
  auto decoder = std::make_shared<H264ViewerDecoder>(output_encoding, topic, limits);
  ros::Publisher pub = nh.advertise<std_msgs::Empty>(keyframeRequestTopic(topic), 1);
  decoder->setKeyframeRequest([pub]() { pub.publish(std_msgs::Empty()); });
  return decoder;
}

ImageLimits readImageLimits(const ros::NodeHandle& nh, const ImageLimits& defaults)
{
  ImageLimits l = defaults;
  l.max_message_bytes = readCap(nh, "max_message_bytes", l.max_message_bytes, 1ull << 31);
  l.max_width = static_cast<uint32_t>(readCap(nh, "max_width", l.max_width, 1u << 16));
  l.max_height = static_cast<uint32_t>(readCap(nh, "max_height", l.max_height, 1u << 16));
  l.max_pixels = readCap(nh, "max_pixels", l.max_pixels, 1ull << 30);
  l.max_nal_units = static_cast<uint32_t>(readCap(nh, "max_nal_units", l.max_nal_units, 1u << 20));
  return l;
}

H264ViewerDecoder::H264ViewerDecoder(const std::string& output_encoding, const std::string& topic,
                                     const ImageLimits& limits)
  : decoder_(output_encoding, limits), log_(topic)
{
  routeLibavLogToRos();
}

void H264ViewerDecoder::requestKeyframe()
{
  const auto now = std::chrono::steady_clock::now();
  if (!request_ || (requested_ && std::chrono::duration<double>(now - last_request_).count() < kRequestSpacingS))
    return;
  requested_ = true;
  last_request_ = now;
  request_();
}

sensor_msgs::ImagePtr H264ViewerDecoder::decode(const sensor_msgs::CompressedImage& message)
{
  if (message.format != "h264")
  {
    log_.report(ros::console::levels::Error, "format",
                "format '" + message.format.substr(0, 64) + "' is not h264: is this the link_aware_h264 topic?");
    return sensor_msgs::ImagePtr();
  }
  Frame frame;
  std::string error;
  if (!decoder_.decode(message.data.data(), message.data.size(), &frame, &error))
  {
    const DecodeStatus s = decoder_.status();
    const DecodeCounts& c = decoder_.counts();
    switch (s)
    {
      case DecodeStatus::kNoFrame:
        break;
      case DecodeStatus::kWaitingForKeyframe:
        if (++waiting_run_ >= kWaitingBeforeRequest)
          requestKeyframe();
        log_.report(ros::console::levels::Debug, kindOf(s), error);
        break;
      case DecodeStatus::kDuplicate:
        log_.report(ros::console::levels::Warn, kindOf(s),
                    error + " (" + std::to_string(c.duplicates) + " duplicates so far)");
        break;
      default:  // a loss: no picture until the next keyframe
        requestKeyframe();
        log_.report(ros::console::levels::Warn, std::string(kindOf(s)) + ": " + ProblemLog::kindOf(error),
                    error + " (dropped so far: " + std::to_string(c.dropped()) + " of " +
                        std::to_string(c.dropped() + c.frames) + " messages; " + std::to_string(c.missing_reference) +
                        " losses, " + std::to_string(c.refused) + " over a limit, " + std::to_string(c.errors) +
                        " undecodable)");
        break;
    }
    return sensor_msgs::ImagePtr();
  }
  waiting_run_ = 0;
  sensor_msgs::ImagePtr out(new sensor_msgs::Image);
  out->header = message.header;
  out->width = static_cast<uint32_t>(frame.width);
  out->height = static_cast<uint32_t>(frame.height);
  out->encoding = frame.encoding;
  out->step = static_cast<uint32_t>(frame.step);
  out->is_bigendian = 0;
  out->data.swap(frame.data);
  return out;
}

ImageViewerDecoder::ImageViewerDecoder(const std::string& topic, const ImageLimits& limits)
  : decoder_(limits), log_(topic)
{
}

sensor_msgs::ImagePtr ImageViewerDecoder::decode(const sensor_msgs::CompressedImage& message)
{
  try
  {
    return decoder_.decode(message);
  }
  catch (const CodecError& e)
  {
    ++dropped_;
    log_.report(ros::console::levels::Warn, ProblemLog::kindOf(e.what()),
                std::string("cannot decode a frame: ") + e.what() + " (" + std::to_string(dropped_) + " dropped so far)");
  }
  catch (const std::exception& e)  // OpenCV or memory: a viewer keeps running
  {
    ++dropped_;
    log_.report(ros::console::levels::Error, "exception", std::string("cannot decode a frame: ") + e.what());
  }
  return sensor_msgs::ImagePtr();
}

}  // namespace overlay_manager
