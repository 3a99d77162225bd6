// The viewer side of the link-aware transports, shared by the image_transport subscriber plugins
// (inside image_view, rqt_image_view, rviz, recorders) and the compressed_decoder nodelet: one
// subscription's decoder with its limits, its log (each kind of problem said once, then throttled
// with a count: problem_log.h) and, for H.264, keyframe requests to the publisher.
//
// Limits: parameters max_message_bytes, max_width, max_height, max_pixels, max_nal_units
// (image_rules.h ImageLimits) read once per subscription from the viewer's private namespace:
// `~<transport>/max_pixels` for the plugins (e.g. `_link_aware_h264/max_pixels:=33177600` on
// image_view's command line), `~max_pixels` for compressed_decoder.
//
// Keyframe requests: when an H.264 subscription loses the stream (a lost or refused message, a
// decoder error) or waits for a keyframe longer than a few messages, it publishes std_msgs/Empty
// on <transport topic>/keyframe_request (at most once a second); the link-aware publisher answers
// with an IDR (at most one forced keyframe a second for all its subscribers). A publisher that
// does not listen still sends one every GOP.
#ifndef OVERLAY_MANAGER_VIEWER_DECODERS_H
#define OVERLAY_MANAGER_VIEWER_DECODERS_H

#include "overlay_manager/h264_codec.h"
#include "overlay_manager/image_codec.h"
#include "overlay_manager/image_rules.h"
#include "overlay_manager/problem_log.h"

#include <ros/ros.h>
#include <sensor_msgs/CompressedImage.h>
#include <sensor_msgs/Image.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace overlay_manager
{

/// The topic next to an H.264 stream's topic on which viewers ask for a keyframe.
std::string keyframeRequestTopic(const std::string& stream_topic);

/// ImageLimits from the parameters under `nh` (absent ones keep `defaults`). Throws
/// std::invalid_argument naming the parameter and the rule it breaks.
ImageLimits readImageLimits(const ros::NodeHandle& nh, const ImageLimits& defaults = ImageLimits());

/// One H.264 subscription's decoder (one thread at a time, as roscpp calls one subscription).
class H264ViewerDecoder
{
public:
  /// `output_encoding` bgr8/rgb8/mono8; `topic` names the stream in the log.
  H264ViewerDecoder(const std::string& output_encoding, const std::string& topic, const ImageLimits& limits);

  /// Called from decode() when a keyframe is wanted (rate-limited to once a second).
  void setKeyframeRequest(std::function<void()> request) { request_ = std::move(request); }

  /// The picture of one link_aware_h264 message (format "h264"), header copied; null while the
  /// stream is not decodable (logged per kind of problem, counted).
  sensor_msgs::ImagePtr decode(const sensor_msgs::CompressedImage& message);

  const DecodeCounts& counts() const { return decoder_.counts(); }

private:
  void requestKeyframe();

  H264Decoder decoder_;
  ProblemLog log_;
  std::function<void()> request_;
  std::chrono::steady_clock::time_point last_request_;
  bool requested_ = false;
  uint64_t waiting_run_ = 0;  ///< messages in a row spent waiting for a keyframe
};

/// An H.264 subscription's decoder for `topic` that asks for keyframes on keyframeRequestTopic(topic),
/// advertised on `nh` (the advertisement lives as long as the decoder).
std::shared_ptr<H264ViewerDecoder> makeH264ViewerDecoder(const std::string& output_encoding, const std::string& topic,
                                                         const ImageLimits& limits,
                                                         ros::NodeHandle nh = ros::NodeHandle());

/// One JPEG/PNG subscription's decoder.
class ImageViewerDecoder
{
public:
  ImageViewerDecoder(const std::string& topic, const ImageLimits& limits);

  /// The picture, or null when the message is not a whole JPEG/PNG within the limits (logged per kind).
  sensor_msgs::ImagePtr decode(const sensor_msgs::CompressedImage& message);

  uint64_t dropped() const { return dropped_; }

private:
  ImageDecoder decoder_;
  ProblemLog log_;
  uint64_t dropped_ = 0;
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_VIEWER_DECODERS_H
