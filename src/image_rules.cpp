// The transports' table of raw encodings, raw frame layout checks and size limits (image_rules.h).
#include "overlay_manager/image_rules.h"

#include <sensor_msgs/image_encodings.h>  // header only: names, channels, bit depth

namespace enc = sensor_msgs::image_encodings;

namespace overlay_manager
{
namespace
{
std::string num(uint64_t v)
{
  return std::to_string(v);
}

bool startsWith(const std::string& s, const std::string& prefix)
{
  return s.compare(0, prefix.size(), prefix) == 0;
}
}  // namespace

EncodingRule encodingRule(const std::string& encoding)
{
  EncodingRule r;
  int channels = 0, depth = 0;
  try
  {
    channels = enc::numChannels(encoding);
    depth = enc::bitDepth(encoding);
  }
  catch (const std::exception&)
  {
    r.why = "unknown encoding '" + encoding.substr(0, 64) + "' (not a sensor_msgs/image_encodings name)";
    return r;
  }
  // sensor_msgs parses the channel count of "8UC<n>" from the name: 1215752191 for "8UC99999999999"
  if (channels < 1 || channels > 4 || (depth != 8 && depth != 16 && depth != 32 && depth != 64))
  {
    r.why = "unknown encoding '" + encoding.substr(0, 64) + "' (" + std::to_string(channels) + " channels of " +
            std::to_string(depth) + " bits: not a sensor_msgs/image_encodings picture)";
    return r;
  }
  r.bytes_per_pixel = channels * depth / 8;
  if (encoding == enc::RGB8 || encoding == enc::BGR8 || encoding == enc::RGBA8 || encoding == enc::BGRA8 ||
      encoding == enc::MONO8)
  {
    r.support = EncodingSupport::kDirect;
    return r;
  }
  if (enc::isColor(encoding) || enc::isBayer(encoding) || encoding == enc::YUV422)
  {
    r.support = EncodingSupport::kConverted;
    r.converted_to = enc::BGR8;
    return r;
  }
  if (encoding == enc::MONO16)
  {
    r.support = EncodingSupport::kConverted;
    r.converted_to = enc::MONO8;
    return r;
  }
  // 8UC1 .. 64FC4: depth maps, disparity, float images. A lossy 8-bit picture of them would be
  // wrong data, not a smaller picture.
  r.why = "'" + encoding + "' is not a picture the link-aware transports encode (depth, float or generic type; " +
          "colour, mono, Bayer and yuv422 are): subscribe to the raw topic or a depth transport";
  if (startsWith(encoding, "8U") || startsWith(encoding, "8S"))
    r.why = "'" + encoding + "' is a generic " + num(channels) +
            "-channel type the link-aware transports do not guess colours for (name the frame rgb8/bgr8/mono8)";
  return r;
}

std::string ImageLimits::checkPicture(uint64_t width, uint64_t height) const
{
  const std::string size = num(width) + "x" + num(height);
  if (width > max_width)
    return "picture " + size + " exceeds max_width " + num(max_width) + " (parameter ~max_width)";
  if (height > max_height)
    return "picture " + size + " exceeds max_height " + num(max_height) + " (parameter ~max_height)";
  if (width * height > max_pixels)  // both <= 2^32 after the checks above: no overflow
    return "picture " + size + " (" + num(width * height) + " pixels) exceeds max_pixels " + num(max_pixels) +
           " (parameter ~max_pixels)";
  return "";
}

std::string ImageLimits::checkMessageBytes(uint64_t bytes) const
{
  if (bytes > max_message_bytes)
    return "message of " + num(bytes) + " bytes exceeds max_message_bytes " + num(max_message_bytes) +
           " (parameter ~max_message_bytes)";
  return "";
}

std::string ImageLimits::validate() const
{
  if (max_message_bytes == 0)
    return "max_message_bytes must be > 0";
  if (max_width == 0 || max_height == 0)
    return "max_width and max_height must be > 0";
  if (max_pixels == 0)
    return "max_pixels must be > 0";
  if (max_nal_units == 0)
    return "max_nal_units must be > 0";
  return "";
}

std::string checkRawLayout(uint64_t width, uint64_t height, uint64_t step, uint64_t data_size, int bytes_per_pixel,
                           const ImageLimits& limits)
{
  const std::string size = num(width) + "x" + num(height);
  if (width == 0 || height == 0)
    return "empty picture " + size;
  const std::string over = limits.checkPicture(width, height);
  if (!over.empty())
    return over;
  // width <= max_width (uint32) and bytes_per_pixel <= 32: no overflow in 64 bits
  const uint64_t row = width * static_cast<uint64_t>(bytes_per_pixel);
  if (step < row)
    return "step " + num(step) + " is less than width " + num(width) + " x " + num(bytes_per_pixel) +
           " bytes per pixel (" + num(row) + ")";
  if (step > data_size || height > data_size / step)  // step * height without overflow
    return "data holds " + num(data_size) + " bytes, less than step " + num(step) + " x height " + num(height) +
           " (" + (step <= (~0ull) / height ? num(step * height) : std::string("more than 2^64")) + ")";
  return "";
}

std::string checkRawImage(const std::string& encoding, uint64_t width, uint64_t height, uint64_t step,
                          uint64_t data_size, const ImageLimits& limits)
{
  const EncodingRule rule = encodingRule(encoding);
  if (rule.support == EncodingSupport::kRefused)
    return rule.why;
  return checkRawLayout(width, height, step, data_size, rule.bytes_per_pixel, limits);
}

std::string decodedEncoding(const std::string& named, int channels, int bit_depth)
{
  const EncodingRule rule = encodingRule(named);
  if (rule.support != EncodingSupport::kRefused)
  {
    int named_channels = 0, named_depth = 0;
    try
    {
      named_channels = enc::numChannels(named);
      named_depth = enc::bitDepth(named);
    }
    catch (const std::exception&)
    {
    }
    const bool picture = enc::isColor(named) || enc::isMono(named);
    if (picture && named_channels == channels && named_depth == bit_depth)
      return named;
  }
  const std::string bits = bit_depth == 16 ? "16" : "8";
  if (channels == 1)
    return "mono" + bits;
  if (channels == 4)
    return "bgra" + bits;
  return "bgr" + bits;
}

}  // namespace overlay_manager
