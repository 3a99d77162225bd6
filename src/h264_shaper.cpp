// H.264 as a shaper of image streams (image_shapers.h).
#include "overlay_manager/h264_codec.h"
#include "overlay_manager/image_shapers.h"

#include <cv_bridge/cv_bridge.h>

#include <cmath>
#include <memory>
#include <sstream>

namespace overlay_manager
{
namespace
{
/// The frame converted for the encoders, shared by the shapers (tiers) of one stream: the first
/// tier that shapes a message converts it, the others encode the same picture. Frame thread only
/// (ShapedTopic::offer shapes one message at a time). A message is the same only when
/// ShaperKind::on_message has not run since and it is the same Image with the same pixels; a
/// shaper used without on_message (outside offer) converts every frame.
struct SharedInput
{
  uint64_t message = 0;        ///< messages started by on_message; 0 = none (no sharing)
  uint64_t converted_for = 0;  ///< the message `input` holds (0 = nothing valid)
  const sensor_msgs::Image* image = nullptr;  ///< that message's address
  const uint8_t* pixels = nullptr;            ///< and its pixels' address
  EncoderInput input;
};

class H264Shaper : public ImageShaper
{
public:
  H264Shaper(ImageSettingsFn settings, std::shared_ptr<SharedInput> shared)
    : settings_(std::move(settings)), shared_(std::move(shared))
  {
  }

  std::string refuses(const sensor_msgs::Image& image) const override
  {
    return refusesImage(image, settings_().limits);
  }

  boost::shared_ptr<sensor_msgs::CompressedImage> shape(const sensor_msgs::Image& image, const Admission& admission,
                                                        SentReport* report, std::string* error) override
  {
    const ImageCodecSettings s = settings_();
    const double kbps = admission.target_kbps;
    // a tier nothing limits (no path budget, no delivery cap: the full tier of self/direct
    // subscribers) gets full quality, full_crf, under the same bitrate cap (max_video_kbps)
    const bool unlimited = std::isinf(admission.decision.budget_kbps);
    const double crf = s.crf > 0.0 && unlimited && s.full_crf > 0.0 ? s.full_crf : s.crf;
    SharedInput& in = *shared_;
    const bool converted = in.message != 0 && in.converted_for == in.message && in.image == &image &&
                           in.pixels == image.data.data();
    if (!converted && !convert(image, s, &in, error))
      return sensor_msgs::CompressedImagePtr();
    // a new gop, or a switch between capped CRF and average bitrate, reopens the encoder (the next
    // packet is a keyframe); a new crf or bitrate applies on the fly
    if (!encoder_.isOpen() || encoder_.params().gop != s.gop || (encoder_.params().crf > 0.0) != (crf > 0.0))
    {
      H264Params params;
      params.width = static_cast<int>(image.width);
      params.height = static_cast<int>(image.height);
      params.fps = s.fps;
      params.bitrate_kbps = static_cast<int>(kbps);
      params.gop = s.gop;
      params.crf = crf;
      params.limits = s.limits;
      if (!encoder_.open(params, error))
      {
        *error = "cannot open the H.264 encoder: " + *error;
        return sensor_msgs::CompressedImagePtr();
      }
      applied_kbps_ = static_cast<int>(kbps);
      applied_crf_ = crf;
    }
    else
    {
      if (std::abs(kbps - applied_kbps_) > 0.05 * applied_kbps_)
      {
        encoder_.setBitrate(static_cast<int>(kbps));  // on the fly: the same encoder, no reopen
        applied_kbps_ = static_cast<int>(kbps);
      }
      if (crf != applied_crf_)
      {
        encoder_.setCrf(crf);  // on the fly as well (x264_encoder_reconfig)
        applied_crf_ = crf;
      }
    }
    if (admission.keyframe)
      encoder_.requestKeyframe();
    Packet packet;
    if (!encoder_.encode(in.input, frame_count_++, &packet, error))
      return sensor_msgs::CompressedImagePtr();  // the core asks for a keyframe next
    sensor_msgs::CompressedImagePtr out(new sensor_msgs::CompressedImage);
    out->header = image.header;
    out->format = "h264";
    out->data.swap(packet.data);
    report->bytes = out->data.size();
    report->keyframe = packet.keyframe;
    report->format = out->format;
    return out;
  }

private:
  /// Converts `image` (through cv_bridge first for the encodings H.264 takes converted) into
  /// in->input for the current message.
  static bool convert(const sensor_msgs::Image& image, const ImageCodecSettings& s, SharedInput* in,
                      std::string* error)
  {
    in->converted_for = 0;
    const uint8_t* pixels = image.data.data();
    size_t size = image.data.size();
    int step = static_cast<int>(image.step);
    std::string encoding = image.encoding;
    cv_bridge::CvImageConstPtr converted;
    const EncodingRule rule = encodingRule(encoding);
    if (rule.support == EncodingSupport::kConverted)
    {
      try
      {
        converted = cv_bridge::toCvCopy(image, rule.converted_to);
      }
      catch (const std::exception& e)
      {
        *error = "cannot convert a '" + encoding + "' frame to " + rule.converted_to + " for H.264: " + e.what();
        return false;
      }
      pixels = converted->image.data;
      step = static_cast<int>(converted->image.step[0]);
      size = converted->image.step[0] * static_cast<size_t>(converted->image.rows);
      encoding = converted->encoding;
    }
    if (!in->input.convert(pixels, size, static_cast<int>(image.width), static_cast<int>(image.height), step, encoding,
                           s.limits, error))
      return false;
    in->converted_for = in->message;
    in->image = &image;
    in->pixels = image.data.data();
    return true;
  }

  const ImageSettingsFn settings_;
  const std::shared_ptr<SharedInput> shared_;
  H264Encoder encoder_;
  int64_t frame_count_ = 0;    ///< pts
  int applied_kbps_ = 0;       ///< bitrate last given to the encoder
  double applied_crf_ = 0.0;   ///< crf last given to the encoder
};
}  // namespace

ImageShaperKind h264ShaperKind(ImageSettingsFn settings)
{
  ImageShaperKind kind;
  kind.traits.kind = "h264";
  kind.traits.unit = "frame";
  kind.traits.reference_chain = true;
  // one conversion of each frame for all the tiers (a codec detail: the core only calls on_message)
  const std::shared_ptr<SharedInput> shared = std::make_shared<SharedInput>();
  kind.make = [settings, shared]() { return std::unique_ptr<ImageShaper>(new H264Shaper(settings, shared)); };
  kind.on_message = [shared]() { ++shared->message; };
  kind.describe = [](const TierState& tier, StreamState* st) {
    st->video_bitrate_kbps = tier.target_kbps;
    CodecValue v;
    v.key = "video_bitrate_kbps";
    std::ostringstream text;
    text << tier.target_kbps;
    v.value = text.str();
    st->codec_state.push_back(v);
    v.key = "skipping";
    v.value = tier.backed_up ? "true" : "false";
    st->codec_state.push_back(v);
    for (StreamSubscriber& s : st->subscribers)
      s.codec_reason = "subscribed to the link_aware_h264 transport (" + st->topic +
                       "); H.264 budgets video_budget_kbps_<path>";
  };
  return kind;
}

}  // namespace overlay_manager
