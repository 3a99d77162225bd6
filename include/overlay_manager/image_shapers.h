// The image codecs of the link-aware transports as shapers (shaper.h): sensor_msgs/Image in,
// sensor_msgs/CompressedImage out. One file per codec: src/jpeg_shaper.cpp (JPEG and PNG through
// image_codec.h) and src/h264_shaper.cpp (H.264 through h264_codec.h). Every raw frame is checked
// against image_rules.h (encoding, layout, size limits) before a codec reads a byte of it.
#ifndef OVERLAY_MANAGER_IMAGE_SHAPERS_H
#define OVERLAY_MANAGER_IMAGE_SHAPERS_H

#include "overlay_manager/image_rules.h"
#include "overlay_manager/shaper.h"

#include <sensor_msgs/CompressedImage.h>
#include <sensor_msgs/Image.h>

#include <functional>
#include <string>

namespace overlay_manager
{

/// The codec settings of an image stream now (live ones change through dynamic_reconfigure).
struct ImageCodecSettings
{
  std::string format = "jpeg";  ///< jpeg | png | h264
  int png_level = 3;            ///< zlib level 1..9 (png)
  int gop = 30;                 ///< h264: keyframe interval (frames)
  double crf = 23.0;            ///< h264: capped CRF (0 = average bitrate); H264Params::crf
  double full_crf = 16.0;       ///< h264: crf of a tier nothing limits (no budget, no cap); 0 = crf
  double fps = 30.0;            ///< h264: the stream's frame rate cap (the encoder's time base)
  ImageLimits limits;           ///< largest picture encoded
};

/// Reads the settings now; called by a shaper once per frame (frame thread), so it must be cheap.
using ImageSettingsFn = std::function<ImageCodecSettings()>;
using ImageShaper = Shaper<sensor_msgs::Image, sensor_msgs::CompressedImage>;
using ImageShaperKind = ShaperKind<sensor_msgs::Image, sensor_msgs::CompressedImage>;

/// Why image_rules.h refuses `image` under `limits` ("" = a transport may encode it).
std::string refusesImage(const sensor_msgs::Image& image, const ImageLimits& limits);

/// JPEG (kind "jpeg": quality from the policy, which learns frame sizes) or PNG (kind "png", zlib
/// level png_level), compressed_image_transport's format (src/jpeg_shaper.cpp).
ImageShaperKind jpegShaperKind(const std::string& format, ImageSettingsFn settings);

/// H.264 (kind "h264"): one Annex B access unit per message (format "h264", header copied), the
/// encoder's bitrate set on the fly from the tier's target, a keyframe when the core asks (a new
/// subscriber, a skip that ended, a viewer's request), frames skipped while a subscriber's
/// connection is backed up (src/h264_shaper.cpp). The tiers of one kind share one conversion of
/// each frame to the encoders' input (reset by on_message): make one kind per stream, used from
/// that stream's frame thread only.
ImageShaperKind h264ShaperKind(ImageSettingsFn settings);

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_IMAGE_SHAPERS_H
