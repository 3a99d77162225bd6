// sensor_msgs/Image <-> sensor_msgs/CompressedImage in the exact format of
// compressed_image_transport (ROS Noetic), so its stock subscribers, rqt_image_view, image_view
// and web clients decode our messages unchanged and our decoder reads theirs.
//
// CompressedImage.format is "<raw encoding>; jpeg compressed <target>" or
// "<raw encoding>; png compressed <target>", where target is "bgr8" (JPEG, any colour input),
// "bgr8"/"bgr16" (PNG, colour input by bit depth) and empty for mono input (the string then ends
// in "compressed "). The target names the channel order that OpenCV's imdecode returns, which
// decoders undo to get the raw encoding back.
//
// JPEG goes through libturbojpeg straight from rgb8/bgr8/rgba8/bgra8/mono8 pixels (no colour
// conversion copy); other colour encodings go through cv_bridge to bgr8. PNG goes through OpenCV.
// Which raw encodings are taken, and the layout and size checks every frame passes before a codec
// reads it, are image_rules.h's (the same for the H.264 transport).
//
// The decoder reads JPEG (libturbojpeg, stopping at the first warning: a truncated or corrupt
// JPEG is an error, never a half-grey picture) and PNG (OpenCV) only; the picture size in the
// header is checked against ImageLimits before anything is allocated, and the output is labelled
// with what was decoded (image_rules.h decodedEncoding), never a name it does not hold.
#ifndef OVERLAY_MANAGER_IMAGE_CODEC_H
#define OVERLAY_MANAGER_IMAGE_CODEC_H

#include "overlay_manager/image_rules.h"

#include <sensor_msgs/CompressedImage.h>
#include <sensor_msgs/Image.h>

#include <string>

namespace overlay_manager
{

/// Thrown on input a codec cannot handle; the message names the encoding or format.
class CodecError : public std::runtime_error
{
public:
  explicit CodecError(const std::string& what) : std::runtime_error(what) {}
};

/// Encodes raw images. Holds a libturbojpeg handle: one instance per thread.
class ImageEncoder
{
public:
  explicit ImageEncoder(const ImageLimits& limits = ImageLimits());
  ~ImageEncoder();
  ImageEncoder(const ImageEncoder&) = delete;
  ImageEncoder& operator=(const ImageEncoder&) = delete;

  /// The limits of the next frames.
  void setLimits(const ImageLimits& limits) { limits_ = limits; }

  /// JPEG at `quality` (1..100, 4:2:0 chroma as OpenCV's default). Header copied. Throws CodecError
  /// (naming the encoding, the layout numbers or the limit) for a frame image_rules.h refuses.
  void encodeJpeg(const sensor_msgs::Image& in, int quality, sensor_msgs::CompressedImage& out);
  /// PNG at zlib `level` (1..9). Header copied. Throws CodecError.
  void encodePng(const sensor_msgs::Image& in, int level, sensor_msgs::CompressedImage& out);

private:
  void* tj_;  ///< tjhandle (void* keeps turbojpeg.h out of this header)
  ImageLimits limits_;
};

/// Decodes CompressedImage (ours or compressed_image_transport's) back to the raw encoding named
/// before ';' in `format` (rgb8 stays rgb8). Holds a libturbojpeg handle: one instance per thread.
class ImageDecoder
{
public:
  explicit ImageDecoder(const ImageLimits& limits = ImageLimits());
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  /// Throws CodecError when the data is not a whole JPEG or PNG image, or is over a limit.
  sensor_msgs::ImagePtr decode(const sensor_msgs::CompressedImage& in);

private:
  sensor_msgs::ImagePtr decodeJpeg(const sensor_msgs::CompressedImage& in, const std::string& encoding);
  sensor_msgs::ImagePtr decodePng(const sensor_msgs::CompressedImage& in, const std::string& encoding);
  /// A new libturbojpeg handle after an error (the old one keeps the failed state).
  void resetTurbo();
  void* tj_;
  ImageLimits limits_;
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_IMAGE_CODEC_H
