// What the link-aware transports accept, before any codec reads a byte: the one table of raw
// encodings both transports (JPEG/PNG `link_aware`, H.264 `link_aware_h264`) take or refuse, the
// layout check of a raw frame (width, height, step, data size: a frame that lies about its size is
// refused, never read past its end) and the size limits of pictures and messages on both sides.
// No ROS types: the codecs, their fuzz targets and the ROS adapters share it.
//
// docs/camera.md "What each transport takes" is this file's table in words; the gtest
// test/cpp/test_image_rules.cpp checks every encoding sensor_msgs/image_encodings names.
#ifndef OVERLAY_MANAGER_IMAGE_RULES_H
#define OVERLAY_MANAGER_IMAGE_RULES_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace overlay_manager
{

/// How a transport treats a raw encoding.
enum class EncodingSupport
{
  kDirect,     ///< read as is: rgb8, bgr8, rgba8, bgra8, mono8
  kConverted,  ///< converted first (cv_bridge): 16-bit colour/mono, Bayer, yuv422 -> `converted_to`
  kRefused,    ///< not a picture a viewer shows (depth, float, generic nUCm types) or an unknown name
};

/// One row of the table.
struct EncodingRule
{
  EncodingSupport support = EncodingSupport::kRefused;
  /// kConverted: "bgr8" or "mono8", what the encoder converts to (and what a JPEG viewer gets back)
  std::string converted_to;
  /// bytes of one pixel in the raw frame (0 for an unknown name)
  int bytes_per_pixel = 0;
  /// kRefused: why, in words for an error message ("depth image (16UC1): ...")
  std::string why;
};

/// The rule for `encoding` (a sensor_msgs/image_encodings name).
EncodingRule encodingRule(const std::string& encoding);

/// Caps on what one picture or message may cost. Pixels are width x height of the coded picture;
/// bytes are the message's data. The parameters of the same names (docs/camera.md "Limits") set them.
struct ImageLimits
{
  /// ~max_message_bytes: largest compressed message a decoder reads (32 MiB: a 4K PNG or an 8K
  /// JPEG fits; a message beyond is refused before any parsing)
  uint64_t max_message_bytes = 32ull << 20;
  /// ~max_width, ~max_height: largest picture side in pixels (8192: 8K sensors and panoramas)
  uint32_t max_width = 8192;
  uint32_t max_height = 8192;
  /// ~max_pixels: largest width x height (8,847,360 = 4096 x 2160, DCI 4K). An 8K camera
  /// (7680 x 4320 = 33,177,600) needs it raised: a viewer then holds about 150 MB per picture.
  uint64_t max_pixels = 4096ull * 2160ull;
  /// ~max_nal_units: most H.264 NAL units in one message (x264 writes 3-5 per access unit; a
  /// hardware encoder with one slice per macroblock row at 4K about 140)
  uint32_t max_nal_units = 1024;

  /// "" when a width x height picture is within the limits, else one line naming the limit and
  /// the parameter (e.g. "picture 16000x16000 exceeds max_width 8192 (parameter ~max_width)").
  std::string checkPicture(uint64_t width, uint64_t height) const;
  /// "" when a message of `bytes` is within max_message_bytes, else the one-line error.
  std::string checkMessageBytes(uint64_t bytes) const;
  /// "" when the values are usable (every cap > 0), else the error naming the first bad one.
  std::string validate() const;
};

/// "" when a raw frame's layout is consistent and within `limits`: width and height > 0,
/// step >= width x bytes_per_pixel, data_size >= step x height, the picture within the limits.
/// Else one line naming what is wrong, with the numbers. Arithmetic in 64 bits (no overflow from
/// any uint32 fields).
std::string checkRawLayout(uint64_t width, uint64_t height, uint64_t step, uint64_t data_size,
                           int bytes_per_pixel, const ImageLimits& limits);

/// encodingRule + checkRawLayout for a raw frame: "" when a transport may encode it.
std::string checkRawImage(const std::string& encoding, uint64_t width, uint64_t height, uint64_t step,
                          uint64_t data_size, const ImageLimits& limits);

/// The encoding a JPEG/PNG viewer labels a decoded picture with: the raw encoding named in the
/// message when the decoded pixels are exactly that (channels and bit depth, up to channel order),
/// else the honest name of what was decoded (mono8/mono16/bgr8/bgr16/bgra8/bgra16, OpenCV order).
/// `channels` 1, 3 or 4; `bit_depth` 8 or 16.
std::string decodedEncoding(const std::string& named, int channels, int bit_depth);

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_IMAGE_RULES_H
