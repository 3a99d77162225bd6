// The one interface a codec or shaped topic kind implements to plug into a shaped topic
// (shaped_topic.h): make one tier's outgoing message from one incoming message under the core's
// admission (shaping_core.h), and say what it reports beyond the generic figures. JPEG/PNG
// (image_shapers.h: JpegShaper), H.264 (H264Shaper) and any other kind (e.g. a generic topic shaper
// with topic_tools::ShapeShifter in and out) are one class each.
//
// Threads: a shaper belongs to one tier of one topic and is only called from the frame thread that
// offers messages to the topic (ShapedTopic::offer serialises nothing itself: its caller offers one
// message at a time). A kind's describe function runs on the control thread with a copy of the
// tier's figures.
#ifndef OVERLAY_MANAGER_SHAPER_H
#define OVERLAY_MANAGER_SHAPER_H

#include "overlay_manager/shaping_core.h"

#include <overlay_manager/StreamState.h>

#include <boost/shared_ptr.hpp>

#include <functional>
#include <memory>
#include <string>

namespace overlay_manager
{

/// Makes one tier's messages. `In`: the incoming message type (e.g. sensor_msgs::Image,
/// topic_tools::ShapeShifter); `Out`: what the tier publishes (e.g. sensor_msgs::CompressedImage).
template <class In, class Out>
class Shaper
{
public:
  virtual ~Shaper() = default;

  /// Why `in` must not be read at all ("" = it may): checked once per message, before any tier
  /// admits it (image_rules.h's checks for images). The adapter logs the reason, throttled per kind.
  virtual std::string refuses(const In& /*in*/) const { return ""; }

  /// The tier's message made from `in` under `admission` (its decision: quality, rate, budget, the
  /// codec's target bitrate; keyframe: start a new reference chain). Null with `*error` set when
  /// it cannot be made (the adapter logs it; reference_chain: the next message is a keyframe).
  /// Fills `report` (bytes, quality, keyframe, format); the adapter measures the time itself.
  virtual boost::shared_ptr<Out> shape(const In& in, const Admission& admission, SentReport* report,
                                       std::string* error) = 0;
};

/// Codec-specific figures of one tier into `state` (codec_state key/values, and the image codecs'
/// compatibility fields quality / video_bitrate_kbps); the generic ones are filled already. Runs on
/// the control thread, so it reads only the tier's figures, never a shaper.
using DescribeFn = std::function<void(const TierState& tier, StreamState* state)>;

/// A codec kind: its traits for the core, how to make one shaper per tier (each tier its own
/// encoder state) and what it reports.
template <class In, class Out>
struct ShaperKind
{
  ShaperTraits traits;
  std::function<std::unique_ptr<Shaper<In, Out>>()> make;
  DescribeFn describe;  ///< may be empty
  /// Called by ShapedTopic::offer once per input message, before any tier shapes it (frame thread);
  /// may be empty. A kind whose shapers share work per message (the H.264 kind converts each frame
  /// once for all its tiers) starts that message's shared state here; the core knows nothing of it.
  std::function<void()> on_message;
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_SHAPER_H
