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
class H264Shaper : public ImageShaper
{
public:
  explicit H264Shaper(ImageSettingsFn settings) : settings_(std::move(settings)) {}

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
        return sensor_msgs::CompressedImagePtr();
      }
      pixels = converted->image.data;
      step = static_cast<int>(converted->image.step[0]);
      size = converted->image.step[0] * static_cast<size_t>(converted->image.rows);
      encoding = converted->encoding;
    }
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
    if (!encoder_.encode(pixels, size, static_cast<int>(image.width), static_cast<int>(image.height), step, encoding,
                         frame_count_++, &packet, error))
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
  const ImageSettingsFn settings_;
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
  kind.make = [settings]() { return std::unique_ptr<ImageShaper>(new H264Shaper(settings)); };
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
