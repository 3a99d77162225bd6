// JPEG and PNG as a shaper of image streams (image_shapers.h).
#include "overlay_manager/image_codec.h"
#include "overlay_manager/image_shapers.h"

#include <memory>

namespace overlay_manager
{

std::string refusesImage(const sensor_msgs::Image& image, const ImageLimits& limits)
{
  return checkRawImage(image.encoding, image.width, image.height, image.step, image.data.size(), limits);
}

namespace
{
class JpegShaper : public ImageShaper
{
public:
  JpegShaper(bool png, ImageSettingsFn settings) : png_(png), settings_(std::move(settings)) {}

  std::string refuses(const sensor_msgs::Image& image) const override
  {
    return refusesImage(image, settings_().limits);
  }

  boost::shared_ptr<sensor_msgs::CompressedImage> shape(const sensor_msgs::Image& image, const Admission& admission,
                                                        SentReport* report, std::string* error) override
  {
    const ImageCodecSettings s = settings_();
    sensor_msgs::CompressedImagePtr out(new sensor_msgs::CompressedImage);
    try
    {
      encoder_.setLimits(s.limits);
      if (png_)
        encoder_.encodePng(image, s.png_level, *out);
      else
        encoder_.encodeJpeg(image, admission.decision.quality, *out);
    }
    catch (const std::exception& e)
    {
      *error = e.what();
      return sensor_msgs::CompressedImagePtr();
    }
    report->bytes = out->data.size();
    report->quality = admission.decision.quality;
    report->format = out->format;
    return out;
  }

private:
  const bool png_;
  const ImageSettingsFn settings_;
  ImageEncoder encoder_;
};
}  // namespace

ImageShaperKind jpegShaperKind(const std::string& format, ImageSettingsFn settings)
{
  const bool png = format == "png";
  ImageShaperKind kind;
  kind.traits.kind = png ? "png" : "jpeg";
  kind.traits.unit = "frame";
  kind.traits.size_feedback = !png;  // the policy steps JPEG quality by the sizes it sees
  kind.make = [png, settings]() { return std::unique_ptr<ImageShaper>(new JpegShaper(png, settings)); };
  kind.describe = [png](const TierState& tier, StreamState* st) {
    st->quality = png ? 0 : static_cast<uint8_t>(tier.decision.quality);
    if (!png)
    {
      CodecValue v;
      v.key = "quality";
      v.value = std::to_string(tier.decision.quality);
      st->codec_state.push_back(v);
    }
    for (StreamSubscriber& s : st->subscribers)
    {
      s.quality = st->quality;
      s.codec_reason = "subscribed to " + st->topic + " (JPEG/PNG: every viewer decodes it)";
    }
  };
  return kind;
}

}  // namespace overlay_manager
