// The transports' table of raw encodings (image_rules.h) for every name sensor_msgs/image_encodings
// has, raw frames that lie about their size, and the JPEG/PNG codecs' checks: honest labels,
// truncated files, headers that claim huge pictures. Real scene: OpenCV's vtest.avi.
#include "overlay_manager/image_codec.h"
#include "overlay_manager/image_rules.h"
#include "overlay_manager/problem_log.h"

#include <cv_bridge/cv_bridge.h>
#include <gtest/gtest.h>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>
#include <sensor_msgs/image_encodings.h>

#include <string>
#include <vector>

namespace enc = sensor_msgs::image_encodings;
using overlay_manager::CodecError;
using overlay_manager::EncodingSupport;
using overlay_manager::ImageDecoder;
using overlay_manager::ImageEncoder;
using overlay_manager::ImageLimits;

namespace
{
const std::vector<std::string>& allEncodings()
{
  static const std::vector<std::string> names = {
    enc::RGB8,        enc::RGBA8,       enc::RGB16,       enc::RGBA16,       enc::BGR8,         enc::BGRA8,
    enc::BGR16,       enc::BGRA16,      enc::MONO8,       enc::MONO16,       enc::TYPE_8UC1,    enc::TYPE_8UC2,
    enc::TYPE_8UC3,   enc::TYPE_8UC4,   enc::TYPE_8SC1,   enc::TYPE_8SC2,    enc::TYPE_8SC3,    enc::TYPE_8SC4,
    enc::TYPE_16UC1,  enc::TYPE_16UC2,  enc::TYPE_16UC3,  enc::TYPE_16UC4,   enc::TYPE_16SC1,   enc::TYPE_16SC2,
    enc::TYPE_16SC3,  enc::TYPE_16SC4,  enc::TYPE_32SC1,  enc::TYPE_32SC2,   enc::TYPE_32SC3,   enc::TYPE_32SC4,
    enc::TYPE_32FC1,  enc::TYPE_32FC2,  enc::TYPE_32FC3,  enc::TYPE_32FC4,   enc::TYPE_64FC1,   enc::TYPE_64FC2,
    enc::TYPE_64FC3,  enc::TYPE_64FC4,  enc::BAYER_RGGB8, enc::BAYER_BGGR8,  enc::BAYER_GBRG8,  enc::BAYER_GRBG8,
    enc::BAYER_RGGB16, enc::BAYER_BGGR16, enc::BAYER_GBRG16, enc::BAYER_GRBG16, enc::YUV422,
  };
  return names;
}

/// A real picture (vtest.avi frame 40, or a gradient without opencv-doc) as bgr8 at w x h.
cv::Mat scene(int w, int h)
{
  static cv::Mat frame;
  if (frame.empty())
  {
    cv::VideoCapture cap("/usr/share/doc/opencv-doc/examples/data/vtest.avi");
    for (int i = 0; i < 40 && cap.read(frame); ++i)
    {
    }
    if (frame.empty())
    {
      frame = cv::Mat(480, 640, CV_8UC3);
      for (int y = 0; y < 480; ++y)
        for (int x = 0; x < 640; ++x)
          frame.at<cv::Vec3b>(y, x) = cv::Vec3b(x * 255 / 640, y * 255 / 480, 128);
    }
  }
  cv::Mat out;
  cv::resize(frame, out, cv::Size(w, h), 0, 0, cv::INTER_AREA);
  return out;
}

/// An honest frame of `encoding` made from the scene (colour conversions through cv_bridge).
sensor_msgs::Image frameOf(const std::string& encoding, int w = 64, int h = 48)
{
  cv_bridge::CvImage bgr(std_msgs::Header(), enc::BGR8, scene(w, h));
  sensor_msgs::Image img;
  if (encoding == enc::YUV422)
  {
    img.width = w;
    img.height = h;
    img.encoding = encoding;
    img.step = w * 2;
    img.data.assign(static_cast<size_t>(img.step) * h, 128);  // grey UYVY
    return img;
  }
  if (enc::isBayer(encoding))
  {
    cv::Mat grey;
    cv::cvtColor(bgr.image, grey, cv::COLOR_BGR2GRAY);
    if (enc::bitDepth(encoding) == 16)
      grey.convertTo(grey, CV_16U, 256);
    cv_bridge::CvImage b(std_msgs::Header(), encoding, grey);
    return *b.toImageMsg();
  }
  return *cv_bridge::cvtColor(cv_bridge::toCvCopy(*bgr.toImageMsg()), encoding)->toImageMsg();
}

std::vector<uint8_t> jpegOf(const cv::Mat& bgr)
{
  std::vector<uint8_t> out;
  cv::imencode(".jpg", bgr, out);
  return out;
}

sensor_msgs::CompressedImage compressed(const std::string& format, const std::vector<uint8_t>& data)
{
  sensor_msgs::CompressedImage c;
  c.format = format;
  c.data = data;
  return c;
}

std::string decodeError(const sensor_msgs::CompressedImage& msg, const ImageLimits& limits = ImageLimits())
{
  ImageDecoder dec(limits);
  try
  {
    dec.decode(msg);
  }
  catch (const CodecError& e)
  {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(EncodingRules, EveryEncodingHasOneRuleForBothTransports)
{
  for (const std::string& e : allEncodings())
  {
    const overlay_manager::EncodingRule r = overlay_manager::encodingRule(e);
    const bool picture = enc::isColor(e) || enc::isMono(e) || enc::isBayer(e) || e == enc::YUV422;
    EXPECT_EQ(r.support != EncodingSupport::kRefused, picture) << e;
    EXPECT_EQ(r.bytes_per_pixel, enc::numChannels(e) * enc::bitDepth(e) / 8) << e;
    if (r.support == EncodingSupport::kRefused)
      EXPECT_NE(r.why.find(e), std::string::npos) << "the reason names the encoding: " << r.why;
    if (r.support == EncodingSupport::kConverted)
    {
      // what the H.264 transport does with it: cv_bridge converts an honest frame
      const sensor_msgs::Image img = frameOf(e);
      EXPECT_NO_THROW(cv_bridge::toCvCopy(img, r.converted_to)) << e << " -> " << r.converted_to;
    }
  }
  EXPECT_EQ(overlay_manager::encodingRule("rgb9").support, EncodingSupport::kRefused);
  // sensor_msgs reads the channel count from the name (found by fuzz_image_encode: an overflow)
  EXPECT_EQ(overlay_manager::encodingRule("8UC99999999999").support, EncodingSupport::kRefused);
  EXPECT_EQ(overlay_manager::encodingRule("8UC99999999999").bytes_per_pixel, 0);
  EXPECT_EQ(overlay_manager::encodingRule("32FC0").support, EncodingSupport::kRefused);
  EXPECT_NE(overlay_manager::encodingRule(std::string(10000, 'x')).why.size(), 0u);
  EXPECT_LT(overlay_manager::encodingRule(std::string(10000, 'x')).why.size(), 200u) << "a huge name is cut";
}

TEST(EncodingRules, RawLayoutLiesAreNamed)
{
  const ImageLimits l;
  using overlay_manager::checkRawImage;
  EXPECT_EQ(checkRawImage("bgr8", 640, 480, 1920, 921600, l), "");
  EXPECT_EQ(checkRawImage("bgr8", 640, 480, 2048, 2048 * 480, l), "") << "padded rows";
  EXPECT_EQ(checkRawImage("bgr8", 1920, 1080, 5760, 100, l),
            "data holds 100 bytes, less than step 5760 x height 1080 (6220800)");
  EXPECT_EQ(checkRawImage("rgb8", 640, 480, 0, 1000, l), "step 0 is less than width 640 x 3 bytes per pixel (1920)");
  EXPECT_EQ(checkRawImage("rgb8", 640, 480, 1919, 1919 * 480, l),
            "step 1919 is less than width 640 x 3 bytes per pixel (1920)");
  EXPECT_EQ(checkRawImage("mono8", 0, 480, 0, 0, l), "empty picture 0x480");
  EXPECT_EQ(checkRawImage("mono8", 16000, 16000, 16000, 256000000, l),
            "picture 16000x16000 exceeds max_width 8192 (parameter ~max_width)");
  EXPECT_EQ(checkRawImage("mono8", 7680, 4320, 7680, 7680 * 4320, l),
            "picture 7680x4320 (33177600 pixels) exceeds max_pixels 8847360 (parameter ~max_pixels)");
  // no overflow from the largest uint32 fields
  EXPECT_NE(checkRawImage("rgba16", 4294967295u, 4294967295u, 4294967295u, 10, l), "");
  ImageLimits big;
  big.max_width = big.max_height = 1u << 16;
  big.max_pixels = 1ull << 40;
  EXPECT_EQ(checkRawImage("rgba16", 65536, 65536, 65536u * 8, 1000, big).find("data holds 1000 bytes"), 0u);
}

TEST(JpegEncoder, FramesThatLieAboutTheirSizeAreRefusedNotRead)
{
  ImageEncoder encoder;
  sensor_msgs::CompressedImage out;
  sensor_msgs::Image img = frameOf(enc::RGB8, 640, 480);
  img.data.resize(1000);  // step 1920 x 480 claimed
  EXPECT_THROW(encoder.encodeJpeg(img, 80, out), CodecError);
  img = frameOf(enc::RGB8, 640, 480);
  img.step = 0;  // read 921,600 bytes from a 1,000-byte buffer before
  img.data.resize(1000);
  try
  {
    encoder.encodeJpeg(img, 80, out);
    ADD_FAILURE() << "step 0 accepted";
  }
  catch (const CodecError& e)
  {
    EXPECT_NE(std::string(e.what()).find("JPEG: step 0 is less than width 640"), std::string::npos) << e.what();
  }
  img = frameOf(enc::RGB8, 640, 480);
  img.step = 640;  // less than a row
  EXPECT_THROW(encoder.encodeJpeg(img, 80, out), CodecError);
  EXPECT_THROW(encoder.encodePng(img, 3, out), CodecError);
  img.width = 64;
  img.height = 48;
  img.step = 64 * 4;
  img.encoding = enc::TYPE_32FC1;
  img.data.assign(img.step * img.height, 0);
  EXPECT_THROW(encoder.encodeJpeg(img, 80, out), CodecError);
}

TEST(JpegCodec, EveryTakenEncodingRoundTripsWithAnHonestLabel)
{
  ImageEncoder encoder;
  ImageDecoder decoder;
  for (const std::string& e : allEncodings())
  {
    const overlay_manager::EncodingRule r = overlay_manager::encodingRule(e);
    if (r.support == EncodingSupport::kRefused)
      continue;
    const sensor_msgs::Image img = frameOf(e);
    for (const bool png : { false, true })
    {
      sensor_msgs::CompressedImage c;
      ASSERT_NO_THROW(png ? encoder.encodePng(img, 3, c) : encoder.encodeJpeg(img, 90, c)) << e;
      const sensor_msgs::ImagePtr back = decoder.decode(c);
      ASSERT_TRUE(back) << e;
      EXPECT_EQ(back->width, img.width);
      EXPECT_EQ(back->height, img.height);
      EXPECT_EQ(back->data.size(), static_cast<size_t>(back->step) * back->height) << e;
      // the label says what the data is: channels and bit depth of the decoded picture
      const int channels = enc::numChannels(back->encoding), depth = enc::bitDepth(back->encoding);
      EXPECT_EQ(back->step, back->width * channels * depth / 8) << e << " came back as " << back->encoding;
      EXPECT_TRUE(enc::isColor(back->encoding) || enc::isMono(back->encoding)) << e << " -> " << back->encoding;
      if (!png)
        EXPECT_EQ(depth, 8) << "JPEG is 8-bit: " << e << " must not come back as " << back->encoding;
      if (r.support == EncodingSupport::kDirect && !(png && enc::hasAlpha(e)))
        EXPECT_EQ(back->encoding, e) << (png ? "png" : "jpeg");
      if (png && (enc::isColor(e) || enc::isMono(e)) && !enc::hasAlpha(e))
        EXPECT_EQ(back->encoding, e) << "PNG keeps " << e;
      if (png && enc::hasAlpha(e))  // as compressed_image_transport: colour PNG is bgr8/bgr16
        EXPECT_EQ(back->encoding, enc::bitDepth(e) == 16 ? "bgr16" : "bgr8") << e;
    }
  }
}

TEST(JpegDecoder, ForeignFormatStringsGetHonestLabels)
{
  const cv::Mat bgr = scene(64, 48);
  cv::Mat grey;
  cv::cvtColor(bgr, grey, cv::COLOR_BGR2GRAY);
  ImageDecoder decoder;
  EXPECT_EQ(decoder.decode(compressed("16UC1; jpeg compressed ", jpegOf(grey)))->encoding, "mono8");
  EXPECT_EQ(decoder.decode(compressed("32FC1; jpeg compressed ", jpegOf(grey)))->encoding, "mono8");
  EXPECT_EQ(decoder.decode(compressed("mono16; jpeg compressed ", jpegOf(grey)))->encoding, "mono8");
  EXPECT_EQ(decoder.decode(compressed("bayer_rggb8; jpeg compressed bgr8", jpegOf(bgr)))->encoding, "bgr8");
  EXPECT_EQ(decoder.decode(compressed("rgb16; jpeg compressed bgr8", jpegOf(bgr)))->encoding, "bgr8");
  EXPECT_EQ(decoder.decode(compressed("rgb8; jpeg compressed bgr8", jpegOf(bgr)))->encoding, "rgb8");
  EXPECT_EQ(decoder.decode(compressed("", jpegOf(grey)))->encoding, "mono8");
}

TEST(JpegDecoder, ABadJpegDoesNotStopTheNextGoodOne)
{
  // libturbojpeg kept a failed header's state: every later JPEG failed with the same error
  const std::vector<uint8_t> good = jpegOf(scene(64, 48));
  std::vector<uint8_t> bad = { 0xFF, 0xD8, 0xFF, 0xAA };
  bad.resize(204, 0x55);
  std::vector<uint8_t> half(good.begin(), good.begin() + good.size() / 2);
  ImageDecoder decoder;
  for (const std::vector<uint8_t>* hostile : { &bad, &half })
  {
    EXPECT_THROW(decoder.decode(compressed("bgr8; jpeg compressed bgr8", *hostile)), CodecError);
    const sensor_msgs::ImagePtr next = decoder.decode(compressed("bgr8; jpeg compressed bgr8", good));
    ASSERT_TRUE(next);
    EXPECT_EQ(next->width, 64u);
  }
}

TEST(ProblemLog, KindsAreTemplatesNotCallSites)
{
  using overlay_manager::ProblemLog;
  EXPECT_EQ(ProblemLog::kindOf("data holds 100 bytes, less than step 5760 x height 1080 (6220800)"),
            ProblemLog::kindOf("data holds 7 bytes, less than step 30 x height 2 (60)"));
  EXPECT_NE(ProblemLog::kindOf("'32FC1' is not a picture the link-aware transports encode"),
            ProblemLog::kindOf("'8UC3' is a generic 3-channel type"));
  EXPECT_EQ(ProblemLog::kindOf("'32FC1' is not a picture"), ProblemLog::kindOf("'64FC1' is not a picture"));
  EXPECT_NE(ProblemLog::kindOf("message has more than max_nal_units 1024 NAL units"),
            ProblemLog::kindOf("SPS 0: picture 16000x16000 exceeds max_width 8192"));
  EXPECT_EQ(ProblemLog::kindOf("bad 'x"), "bad ") << "an unclosed quote keeps the words before it";
}

TEST(JpegDecoder, TruncatedAndHugeAndForeignDataAreErrors)
{
  std::vector<uint8_t> jpeg = jpegOf(scene(640, 480));
  // truncated: was shown half grey with no log
  const std::vector<uint8_t> half(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
  EXPECT_EQ(decodeError(compressed("bgr8; jpeg compressed bgr8", half)).find("truncated or corrupt JPEG"), 0u);
  // a header claiming 8192x8192: patch SOF0's height and width
  std::vector<uint8_t> huge = jpeg;
  for (size_t i = 2; i + 8 < huge.size(); ++i)
    if (huge[i] == 0xFF && huge[i + 1] == 0xC0)
    {
      huge[i + 5] = 0x20;  // height 8192
      huge[i + 6] = 0x00;
      huge[i + 7] = 0x20;  // width 8192
      huge[i + 8] = 0x00;
      break;
    }
  EXPECT_EQ(decodeError(compressed("bgr8; jpeg compressed bgr8", huge)),
            "JPEG picture 8192x8192 (67108864 pixels) exceeds max_pixels 8847360 (parameter ~max_pixels)");
  // formats OpenCV would also read (BMP, TIFF, ...) are not taken
  std::vector<uint8_t> bmp;
  cv::imencode(".bmp", scene(8, 8), bmp);
  EXPECT_EQ(decodeError(compressed("bgr8; png compressed bgr8", bmp)).find("data ("), 0u);
  // the message cap
  ImageLimits l;
  l.max_message_bytes = 1000;
  EXPECT_EQ(decodeError(compressed("bgr8; jpeg compressed bgr8", jpeg), l).find("message of"), 0u);
  // a PNG claiming a huge picture in its IHDR
  std::vector<uint8_t> png;
  cv::imencode(".png", scene(8, 8), png);
  png[16] = 0x00;
  png[17] = 0x01;  // width 65536 + 8
  EXPECT_NE(decodeError(compressed("bgr8; png compressed bgr8", png)).find("exceeds max_width"), std::string::npos);
}

int main(int argc, char** argv)
{
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
