// Tests of the H.264 codec with the real libx264 (through libavcodec) and libavcodec's decoder, on
// a real camera scene (OpenCV's vtest.avi, a pedestrian scene, scaled to 640x480) and on a
// synthetic moving pattern.
#include "overlay_manager/h264_codec.h"

#include <gtest/gtest.h>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

using overlay_manager::DecodeStatus;
using overlay_manager::EncoderInput;
using overlay_manager::FrameCounter;
using overlay_manager::Frame;
using overlay_manager::H264Decoder;
using overlay_manager::H264Encoder;
using overlay_manager::H264Params;
using overlay_manager::Packet;
using overlay_manager::ImageLimits;
using overlay_manager::h264FrameCounter;
using overlay_manager::h264NalTypes;

namespace
{
const char* const kVtest = "/usr/share/doc/opencv-doc/examples/data/vtest.avi";
constexpr int kW = 640;
constexpr int kH = 480;

/// The first 240 frames (8 s) of vtest.avi as 640x480 bgr8 (read once). Empty if the file is missing.
const std::vector<cv::Mat>& realScene()
{
  static std::vector<cv::Mat> frames;
  if (frames.empty())
  {
    cv::VideoCapture cap(kVtest);
    cv::Mat raw;
    while (frames.size() < 240 && cap.read(raw))
    {
      cv::Mat scaled;
      cv::resize(raw, scaled, cv::Size(kW, kH), 0, 0, cv::INTER_AREA);
      frames.push_back(scaled);
    }
  }
  return frames;
}

/// A moving synthetic pattern: gradient background, a sliding bar grid and a moving disc.
std::vector<cv::Mat> syntheticScene(int n, int w = kW, int h = kH)
{
  std::vector<cv::Mat> frames;
  for (int i = 0; i < n; ++i)
  {
    cv::Mat m(h, w, CV_8UC3);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        m.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uchar>((x + 3 * i) * 255 / (w + 300)),
                                          static_cast<uchar>(y * 255 / h),
                                          static_cast<uchar>(((x / 40 + y / 40 + i / 10) % 2) ? 200 : 60));
    cv::circle(m, cv::Point(50 + 4 * i % (w - 100), h / 2), 40, cv::Scalar(20, 220, 240), -1);
    cv::putText(m, "frame " + std::to_string(i), cv::Point(20, 40), cv::FONT_HERSHEY_SIMPLEX, 1.0,
                cv::Scalar(255, 255, 255), 2);
    frames.push_back(m);
  }
  return frames;
}

#define REQUIRE_REAL_SCENE()                                                                                  \
  ASSERT_GE(realScene().size(), 240u) << kVtest << " missing or short: install opencv-doc (scripts/setup)"

H264Params params640(int kbps = 1500)
{
  H264Params p;
  p.width = kW;
  p.height = kH;
  p.bitrate_kbps = kbps;
  return p;
}

Packet encodeOne(H264Encoder& enc, const cv::Mat& bgr, int64_t pts)
{
  Packet pkt;
  std::string err;
  EXPECT_TRUE(enc.encode(bgr.data, bgr.step * bgr.rows, static_cast<int>(bgr.step), "bgr8", pts, &pkt, &err)) << err;
  return pkt;
}

std::vector<Packet> encodeAll(const std::vector<cv::Mat>& frames, const H264Params& p)
{
  H264Encoder enc;
  std::string err;
  EXPECT_TRUE(enc.open(p, &err)) << err;
  std::vector<Packet> out;
  for (size_t i = 0; i < frames.size(); ++i)
    out.push_back(encodeOne(enc, frames[i], static_cast<int64_t>(i)));
  return out;
}

bool contains(const std::vector<int>& v, int x)
{
  return std::find(v.begin(), v.end(), x) != v.end();
}

/// SPS, then PPS, then an IDR slice.
bool hasSpsPpsIdr(const Packet& p)
{
  const std::vector<int> t = h264NalTypes(p.data.data(), p.data.size());
  const auto sps = std::find(t.begin(), t.end(), 7), pps = std::find(t.begin(), t.end(), 8),
             idr = std::find(t.begin(), t.end(), 5);
  return sps != t.end() && pps != t.end() && idr != t.end() && sps < pps && pps < idr;
}

cv::Mat asMat(const Frame& f)
{
  const int type = f.encoding == "mono8" ? CV_8UC1 : CV_8UC3;
  return cv::Mat(f.height, f.width, type, const_cast<uint8_t*>(f.data.data()), f.step).clone();
}

/// PSNR over the Y, U and V planes of both pictures in 4:2:0 (weighted by sample count, as
/// ffmpeg's psnr filter's "average"): the codec's own domain, without the colour conversion's loss.
double yuvPsnr(const cv::Mat& bgr_a, const cv::Mat& bgr_b)
{
  cv::Mat a, b;
  cv::cvtColor(bgr_a, a, cv::COLOR_BGR2YUV_I420);
  cv::cvtColor(bgr_b, b, cv::COLOR_BGR2YUV_I420);
  return cv::PSNR(a, b);
}

double averageBytes(const std::vector<Packet>& pkts, size_t from, size_t to)
{
  double sum = 0;
  for (size_t i = from; i < to; ++i)
    sum += pkts[i].data.size();
  return sum / static_cast<double>(to - from);
}
}  // namespace

TEST(H264Encoder, OnePacketPerFrameWithoutDelayOnBothScenes)
{
  REQUIRE_REAL_SCENE();
  const std::vector<cv::Mat> synthetic = syntheticScene(60);
  for (const std::vector<cv::Mat>* scene : { &realScene(), &synthetic })
  {
    H264Encoder enc;
    H264Decoder dec("bgr8");
    std::string err;
    ASSERT_TRUE(enc.open(params640(), &err)) << err;
    for (size_t i = 0; i < 60; ++i)
    {
      Packet pkt;
      ASSERT_TRUE(enc.encode((*scene)[i].data, (*scene)[i].step * (*scene)[i].rows, static_cast<int>((*scene)[i].step), "bgr8", 1000 + i, &pkt, &err))
          << "frame " << i << ": " << err;
      ASSERT_FALSE(pkt.data.empty()) << "frame " << i;
      EXPECT_EQ(pkt.pts, static_cast<int64_t>(1000 + i));
      // exactly one access unit: one picture's slices, never two pictures in one packet
      const std::vector<int> t = h264NalTypes(pkt.data.data(), pkt.data.size());
      EXPECT_TRUE(contains(t, 1) != contains(t, 5)) << "frame " << i;
      // ... and the decoder returns that very picture at once (no reorder/lookahead delay)
      Frame f;
      ASSERT_TRUE(dec.decode(pkt.data.data(), pkt.data.size(), &f, &err)) << "frame " << i << ": " << err;
      EXPECT_EQ(dec.status(), DecodeStatus::kFrame);
      EXPECT_GT(cv::PSNR(asMat(f), (*scene)[i]), 28.0) << "decoded frame " << i << " is not source frame " << i;
    }
  }
}

TEST(H264Encoder, FirstPacketIsIdrWithSpsAndPpsAndGopIsKept)
{
  REQUIRE_REAL_SCENE();
  H264Params p = params640();
  p.gop = 30;
  const std::vector<Packet> pkts = encodeAll(realScene(), p);
  ASSERT_EQ(pkts.size(), realScene().size());
  EXPECT_TRUE(pkts[0].keyframe);
  EXPECT_TRUE(hasSpsPpsIdr(pkts[0]));
  for (size_t i = 0; i < pkts.size(); ++i)
  {
    const std::vector<int> t = h264NalTypes(pkts[i].data.data(), pkts[i].data.size());
    if (i % 30 == 0)
      EXPECT_TRUE(pkts[i].keyframe) << "frame " << i << " should start a GOP";
    if (pkts[i].keyframe)
      EXPECT_TRUE(hasSpsPpsIdr(pkts[i])) << "keyframe " << i << " must repeat SPS/PPS in-band";
    else
      EXPECT_TRUE(contains(t, 1) && !contains(t, 5) && !contains(t, 7)) << "frame " << i;
  }
}

TEST(H264Encoder, RequestKeyframeMakesTheNextPacketAnIdr)
{
  REQUIRE_REAL_SCENE();
  H264Encoder enc;
  std::string err;
  ASSERT_TRUE(enc.open(params640(), &err)) << err;
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(encodeOne(enc, realScene()[i], i).keyframe, i == 0) << "frame " << i;
  enc.requestKeyframe();
  const Packet forced = encodeOne(enc, realScene()[12], 12);
  EXPECT_TRUE(forced.keyframe);
  EXPECT_TRUE(hasSpsPpsIdr(forced));
  EXPECT_FALSE(encodeOne(enc, realScene()[13], 13).keyframe);
}

/// 240 frames of the real scene with the bit rate changed on the fly: 3000, at frame 75 500, at
/// frame 165 3000 again (mid-GOP: a reopen would show as an IDR there). Returns the packets.
std::vector<Packet> encodeWithBitrateSteps(double crf)
{
  H264Encoder enc;
  std::string err;
  H264Params p = params640(3000);
  p.crf = crf;
  EXPECT_TRUE(enc.open(p, &err)) << err;
  const void* context = enc.codecContext();
  std::vector<Packet> pkts;
  for (size_t i = 0; i < 240; ++i)
  {
    if (i == 75)
      enc.setBitrate(500);
    if (i == 165)
      enc.setBitrate(3000);
    pkts.push_back(encodeOne(enc, realScene()[i], static_cast<int64_t>(i)));
    EXPECT_EQ(enc.codecContext(), context) << "frame " << i;
  }
  EXPECT_EQ(enc.params().bitrate_kbps, 3000);
  EXPECT_FALSE(pkts[75].keyframe) << "the bit rate change restarted the encoder";
  EXPECT_FALSE(pkts[165].keyframe) << "the bit rate change restarted the encoder";
  return pkts;
}

double kbpsAt30Hz(double bytes_per_frame)
{
  return bytes_per_frame * 8 * 30 / 1000;
}

TEST(H264Encoder, SetBitrateChangesTheRateWithoutReopening)
{
  REQUIRE_REAL_SCENE();
  const std::vector<Packet> pkts = encodeWithBitrateSteps(0.0);  // average bit rate
  const double high = averageBytes(pkts, 15, 75), low = averageBytes(pkts, 105, 165),
               again = averageBytes(pkts, 180, 240);
  std::printf("[ measured ] ABR, 60-frame windows: 3000 kbit/s target %.0f, then 500: %.0f, then 3000 again: %.0f kbit/s\n",
              kbpsAt30Hz(high), kbpsAt30Hz(low), kbpsAt30Hz(again));
  EXPECT_GT(high, 3.0 * low);
  EXPECT_NEAR(kbpsAt30Hz(high), 3000, 900);
  EXPECT_NEAR(kbpsAt30Hz(low), 500, 150);
  // x264's average-bit-rate control lowers the rate within about half a second (the VBV caps it)
  // but raises it over two to three seconds: the first 2.5 s after the raise already double it
  EXPECT_GT(again, 2.0 * low);
}

TEST(H264Encoder, CappedCrfSpendsWhatTheSceneNeedsAndRecoversAtOnce)
{
  REQUIRE_REAL_SCENE();
  const std::vector<Packet> pkts = encodeWithBitrateSteps(23.0);
  const double high = averageBytes(pkts, 15, 75), low = averageBytes(pkts, 105, 165),
               first_half_second = averageBytes(pkts, 166, 181), again = averageBytes(pkts, 180, 240);
  std::printf("[ measured ] capped CRF 23, 60-frame windows: cap 3000 kbit/s %.0f, cap 500: %.0f, cap 3000 again: "
              "%.0f (first 0.5 s %.0f) kbit/s\n",
              kbpsAt30Hz(high), kbpsAt30Hz(low), kbpsAt30Hz(again), kbpsAt30Hz(first_half_second));
  // under a cap it does not need, the rate is the scene's (well below 3000), never above the cap
  EXPECT_LT(kbpsAt30Hz(high), 3000 * 1.1);
  EXPECT_GT(high, 2.0 * low);
  // the low cap holds
  EXPECT_NEAR(kbpsAt30Hz(low), 500, 150);
  // no debt to repay: the half second after the raise is already at least double the capped rate
  EXPECT_GT(first_half_second, 2.0 * low);
  EXPECT_GT(again, 2.0 * low);
}

TEST(H264Encoder, ResolutionChangeReopensWithAKeyframe)
{
  const std::vector<cv::Mat> big = syntheticScene(5), small = syntheticScene(5, 320, 240);
  H264Encoder enc;
  H264Decoder dec;
  std::string err;
  Packet pkt;
  Frame f;
  H264Params p = params640();
  ASSERT_TRUE(enc.open(p, &err)) << err;
  enc.setBitrate(800);
  for (int i = 0; i < 5; ++i)
  {
    ASSERT_TRUE(enc.encode(big[i].data, big[i].step * big[i].rows, kW, kH, static_cast<int>(big[i].step), "bgr8", i, &pkt, &err)) << err;
    ASSERT_TRUE(dec.decode(pkt.data.data(), pkt.data.size(), &f, &err)) << err;
  }
  for (int i = 0; i < 5; ++i)
  {
    ASSERT_TRUE(enc.encode(small[i].data, small[i].step * small[i].rows, 320, 240, static_cast<int>(small[i].step), "bgr8", 5 + i, &pkt, &err))
        << err;
    EXPECT_EQ(pkt.keyframe, i == 0);
    ASSERT_TRUE(dec.decode(pkt.data.data(), pkt.data.size(), &f, &err)) << err;
    EXPECT_EQ(f.width, 320);
    EXPECT_EQ(f.height, 240);
    EXPECT_GT(cv::PSNR(asMat(f), small[i]), 28.0);
  }
  EXPECT_EQ(enc.params().bitrate_kbps, 800) << "the reopen must keep the requested bit rate";
}

TEST(H264Encoder, OddSizeIsCroppedToEven)
{
  const std::vector<cv::Mat> odd = syntheticScene(3, 641, 481);
  H264Params p;
  p.width = 641;
  p.height = 481;
  H264Encoder enc;
  H264Decoder dec("rgb8");
  std::string err;
  ASSERT_TRUE(enc.open(p, &err)) << err;
  EXPECT_EQ(enc.codedWidth(), 640);
  EXPECT_EQ(enc.codedHeight(), 480);
  for (int i = 0; i < 3; ++i)
  {
    cv::Mat rgb;
    cv::cvtColor(odd[i], rgb, cv::COLOR_BGR2RGB);
    Packet pkt;
    Frame f;
    ASSERT_TRUE(enc.encode(rgb.data, rgb.step * rgb.rows, static_cast<int>(rgb.step), "rgb8", i, &pkt, &err)) << err;
    ASSERT_TRUE(dec.decode(pkt.data.data(), pkt.data.size(), &f, &err)) << err;
    ASSERT_EQ(f.width, 640);
    ASSERT_EQ(f.height, 480);
    EXPECT_EQ(f.encoding, "rgb8");
    EXPECT_GT(cv::PSNR(asMat(f), rgb(cv::Rect(0, 0, 640, 480))), 30.0) << "the crop must keep the top-left pixels";
  }
}

TEST(H264Encoder, OneConvertedFrameFeedsSeveralEncodersAsItsRawFrameWould)
{
  // the tiers of a stream share one conversion a frame: two encoders at different rate factors fed
  // from one EncoderInput must write exactly the pictures they write from the raw frames (the
  // frame counter's stream id differs: compare the decoded pictures), through an odd size (cropped)
  // and a size change (reopened)
  const std::vector<cv::Mat> odd = syntheticScene(4, 641, 481), small = syntheticScene(3, 320, 240);
  std::vector<cv::Mat> frames(odd);
  frames.insert(frames.end(), small.begin(), small.end());
  const double crfs[2] = { 23.0, 16.0 };
  H264Encoder shared[2], own[2];
  H264Decoder dec_shared[2], dec_own[2];
  std::string err;
  for (int k = 0; k < 2; ++k)
  {
    H264Params p = params640(3000);
    p.crf = crfs[k];
    ASSERT_TRUE(shared[k].open(p, &err)) << err;
    ASSERT_TRUE(own[k].open(p, &err)) << err;
  }
  EncoderInput input;
  for (size_t i = 0; i < frames.size(); ++i)
  {
    const cv::Mat& f = frames[i];
    const size_t bytes = f.step * static_cast<size_t>(f.rows);
    ASSERT_TRUE(input.convert(f.data, bytes, f.cols, f.rows, static_cast<int>(f.step), "bgr8", ImageLimits(), &err))
        << err;
    for (int k = 0; k < 2; ++k)
    {
      Packet a, b;
      Frame fa, fb;
      ASSERT_TRUE(shared[k].encode(input, static_cast<int64_t>(i), &a, &err)) << err;
      ASSERT_TRUE(own[k].encode(f.data, bytes, f.cols, f.rows, static_cast<int>(f.step), "bgr8", static_cast<int64_t>(i),
                                &b, &err))
          << err;
      EXPECT_EQ(a.keyframe, b.keyframe) << "frame " << i;
      // the sizes may differ by a few bytes: the random stream id in the counter SEI may need
      // emulation-prevention bytes (00 00 03) in one stream and not in the other
      EXPECT_NEAR(static_cast<double>(a.data.size()), static_cast<double>(b.data.size()), 8.0)
          << "frame " << i << ", crf " << crfs[k];
      ASSERT_TRUE(dec_shared[k].decode(a.data.data(), a.data.size(), &fa, &err)) << err;
      ASSERT_TRUE(dec_own[k].decode(b.data.data(), b.data.size(), &fb, &err)) << err;
      ASSERT_EQ(fa.width, f.cols & ~1);
      ASSERT_EQ(fa.height, f.rows & ~1);
      EXPECT_EQ(fa.data, fb.data) << "frame " << i << ", crf " << crfs[k] << ": the shared conversion changed the picture";
    }
  }
  EXPECT_EQ(shared[0].codedWidth(), 320);
}

TEST(H264Encoder, AConvertedFrameThatIsNotThereOrTooSmallIsRefused)
{
  EncoderInput input;
  std::string err;
  const std::vector<uint8_t> raw(64 * 48 * 3);
  EXPECT_FALSE(input.convert(raw.data(), raw.size() - 1, 64, 48, 64 * 3, "rgb8", ImageLimits(), &err));
  EXPECT_NE(err.find("rgb8"), std::string::npos) << err;
  EXPECT_FALSE(input.convert(raw.data(), raw.size(), 64, 48, 64 * 3, "yuv422", ImageLimits(), &err));
  EXPECT_NE(err.find("yuv422"), std::string::npos) << err;
  // an encoder opened for another size reopens for the input's; an empty input is refused
  H264Encoder enc;
  ASSERT_TRUE(enc.open(params640(), &err)) << err;
  ASSERT_TRUE(input.convert(raw.data(), raw.size(), 64, 48, 64 * 3, "rgb8", ImageLimits(), &err)) << err;
  Packet pkt;
  ASSERT_TRUE(enc.encode(input, 0, &pkt, &err)) << err;
  EXPECT_TRUE(pkt.keyframe);
  EXPECT_EQ(enc.codedWidth(), 64);
  EXPECT_FALSE(enc.encode(EncoderInput(), 1, &pkt, &err));
}

TEST(H264Encoder, AcceptsEveryRawEncodingWithPaddedRows)
{
  const cv::Mat bgr = syntheticScene(1)[0];
  struct Case
  {
    const char* encoding;
    int code;  // cv::cvtColor code from bgr, -1 = none
  };
  for (const Case& c : { Case{ "bgr8", -1 }, Case{ "rgb8", cv::COLOR_BGR2RGB }, Case{ "bgra8", cv::COLOR_BGR2BGRA },
                         Case{ "rgba8", cv::COLOR_BGR2RGBA }, Case{ "mono8", cv::COLOR_BGR2GRAY } })
  {
    cv::Mat img = bgr.clone();
    if (c.code >= 0)
      cv::cvtColor(bgr, img, c.code);
    // rows padded by 64 bytes: the encoder must honour `step`
    cv::Mat padded(kH, kW * static_cast<int>(img.elemSize()) + 64, CV_8UC1, cv::Scalar(0));
    img.copyTo(cv::Mat(kH, kW, img.type(), padded.data, padded.step));
    H264Encoder enc;
    H264Decoder dec(c.code == cv::COLOR_BGR2GRAY ? "mono8" : "bgr8");
    std::string err;
    Packet pkt;
    Frame f;
    ASSERT_TRUE(enc.open(params640(), &err)) << err;
    ASSERT_TRUE(enc.encode(padded.data, padded.step * padded.rows, static_cast<int>(padded.step), c.encoding, 0, &pkt, &err)) << c.encoding << err;
    ASSERT_TRUE(dec.decode(pkt.data.data(), pkt.data.size(), &f, &err)) << c.encoding << err;
    cv::Mat expected = bgr;
    if (c.code == cv::COLOR_BGR2GRAY)
      expected = img;
    EXPECT_GT(cv::PSNR(asMat(f), expected), 28.0) << c.encoding;
  }
}

TEST(H264Encoder, BadInputIsRefusedWithAClearError)
{
  H264Encoder enc;
  std::string err;
  Packet pkt;
  const std::vector<uint8_t> pixels(kW * kH * 3, 128);
  EXPECT_FALSE(enc.encode(pixels.data(), pixels.size(), kW * 3, "bgr8", 0, &pkt, &err));
  EXPECT_NE(err.find("open()"), std::string::npos) << err;
  H264Params p = params640();
  p.preset = "warp-speed";
  EXPECT_FALSE(enc.open(p, &err));
  EXPECT_NE(err.find("warp-speed"), std::string::npos) << err;
  p = params640();
  p.bitrate_kbps = 0;
  EXPECT_FALSE(enc.open(p, &err));
  EXPECT_NE(err.find("bitrate_kbps"), std::string::npos) << err;
  ASSERT_TRUE(enc.open(params640(), &err)) << err;
  EXPECT_FALSE(enc.encode(pixels.data(), pixels.size(), kW * 3, "yuv422", 0, &pkt, &err));
  EXPECT_NE(err.find("yuv422"), std::string::npos) << err;
  EXPECT_FALSE(enc.encode(pixels.data(), pixels.size(), kW * 2, "bgr8", 0, &pkt, &err));
  EXPECT_NE(err.find("step"), std::string::npos) << err;

  H264Decoder dec;
  Frame f;
  const std::vector<uint8_t> garbage = { 0x12, 0x34, 0x56, 0x78, 0x9a };
  EXPECT_FALSE(dec.decode(garbage.data(), garbage.size(), &f, &err));
  EXPECT_EQ(dec.status(), DecodeStatus::kError);
  EXPECT_FALSE(H264Decoder("yuv420").decode(garbage.data(), garbage.size(), &f, &err));
  EXPECT_NE(err.find("yuv420"), std::string::npos) << err;
}

TEST(H264Decoder, RealSceneQualityAt1500Kbps)
{
  REQUIRE_REAL_SCENE();
  const std::vector<Packet> pkts = encodeAll(realScene(), params640(1500));
  H264Decoder dec;
  double rgb = 0, yuv = 0, worst = 1e9;
  size_t bytes = 0;
  for (size_t i = 0; i < pkts.size(); ++i)
  {
    Frame f;
    std::string err;
    ASSERT_TRUE(dec.decode(pkts[i].data.data(), pkts[i].data.size(), &f, &err)) << "frame " << i << ": " << err;
    const double psnr = yuvPsnr(asMat(f), realScene()[i]);
    yuv += psnr;
    worst = std::min(worst, psnr);
    rgb += cv::PSNR(asMat(f), realScene()[i]);
    bytes += pkts[i].data.size();
  }
  const double n = static_cast<double>(pkts.size());
  std::printf("[ measured ] vtest 640x480 1500 kbit/s: %.0f kbit/s, PSNR YUV 4:2:0 mean %.2f dB (worst frame %.2f), "
              "RGB %.2f dB\n",
              bytes * 8.0 * 30 / n / 1000, yuv / n, worst, rgb / n);
  EXPECT_GE(yuv / n, 38.0);
  EXPECT_GE(worst, 36.0);
  EXPECT_GE(rgb / n, 34.0);  // includes the 4:2:0 chroma subsampling of the colour conversion
}

TEST(H264Decoder, LateJoinerWaitsForTheNextKeyframe)
{
  REQUIRE_REAL_SCENE();
  const std::vector<Packet> pkts = encodeAll(realScene(), params640());
  H264Decoder dec;
  std::string err;
  Frame f;
  EXPECT_TRUE(dec.waitingForKeyframe());
  for (size_t i = 10; i < 30; ++i)
  {
    EXPECT_FALSE(dec.decode(pkts[i].data.data(), pkts[i].data.size(), &f, &err)) << "frame " << i;
    EXPECT_EQ(dec.status(), DecodeStatus::kWaitingForKeyframe) << "frame " << i;
    EXPECT_EQ(err, "waiting for keyframe");
    EXPECT_TRUE(f.data.empty()) << "no picture before the keyframe";
  }
  ASSERT_TRUE(pkts[30].keyframe);
  for (size_t i = 30; i < 90; ++i)
  {
    ASSERT_TRUE(dec.decode(pkts[i].data.data(), pkts[i].data.size(), &f, &err)) << "frame " << i << ": " << err;
    EXPECT_EQ(f.keyframe, i % 30 == 0);
    EXPECT_GT(cv::PSNR(asMat(f), realScene()[i]), 34.0) << "frame " << i;
  }
  EXPECT_FALSE(dec.waitingForKeyframe());
}

/// Every packet decoded by a fresh decoder: the uninterrupted reference pictures. A decode error
/// fails the test and ends the list early.
static std::vector<cv::Mat> decodeAllFrames(const std::vector<Packet>& pkts)
{
  H264Decoder full;
  std::vector<cv::Mat> out;
  std::string err;
  for (const Packet& p : pkts)
  {
    Frame f;
    if (!full.decode(p.data.data(), p.data.size(), &f, &err))
    {
      ADD_FAILURE() << "reference decode of frame " << out.size() << ": " << err;
      break;
    }
    out.push_back(asMat(f));
  }
  return out;
}

TEST(H264Decoder, SkippingToTheNextKeyframeGivesExactPictures)
{
  REQUIRE_REAL_SCENE();
  const std::vector<Packet> pkts = encodeAll(realScene(), params640());
  const std::vector<cv::Mat> reference = decodeAllFrames(pkts);  // every packet decoded
  ASSERT_EQ(reference.size(), pkts.size());
  std::string err;
  // a sender that drops frames 10..29 (a congested link) and resumes at the keyframe 30
  H264Decoder dec;
  for (size_t i = 0; i < pkts.size(); ++i)
  {
    if (i >= 10 && i < 30)
      continue;
    Frame f;
    ASSERT_TRUE(dec.decode(pkts[i].data.data(), pkts[i].data.size(), &f, &err)) << "frame " << i << ": " << err;
    const cv::Mat got = asMat(f);
    EXPECT_EQ(cv::norm(got, reference[i], cv::NORM_INF), 0.0)
        << "frame " << i << " differs from an uninterrupted decode";
  }
}

TEST(H264Decoder, PFrameWithoutItsReferenceIsReportedNotShown)
{
  REQUIRE_REAL_SCENE();
  const std::vector<Packet> pkts = encodeAll(realScene(), params640());
  const std::vector<cv::Mat> reference = decodeAllFrames(pkts);  // every packet decoded
  ASSERT_EQ(reference.size(), pkts.size());
  std::string err;
  H264Decoder dec;
  Frame f;
  for (size_t i = 0; i < 10; ++i)
    ASSERT_TRUE(dec.decode(pkts[i].data.data(), pkts[i].data.size(), &f, &err)) << err;
  // frame 10 is lost; 11 refers to it
  f = Frame();
  EXPECT_FALSE(dec.decode(pkts[11].data.data(), pkts[11].data.size(), &f, &err));
  EXPECT_EQ(dec.status(), DecodeStatus::kMissingReference);
  EXPECT_NE(err.find("missing reference"), std::string::npos) << err;
  EXPECT_TRUE(f.data.empty());
  EXPECT_TRUE(dec.waitingForKeyframe());
  for (size_t i = 12; i < 30; ++i)
  {
    EXPECT_FALSE(dec.decode(pkts[i].data.data(), pkts[i].data.size(), &f, &err)) << "frame " << i;
    EXPECT_EQ(dec.status(), DecodeStatus::kWaitingForKeyframe) << "frame " << i;
  }
  for (size_t i = 30; i < 60; ++i)
  {
    ASSERT_TRUE(dec.decode(pkts[i].data.data(), pkts[i].data.size(), &f, &err)) << "frame " << i << ": " << err;
    EXPECT_EQ(cv::norm(asMat(f), reference[i], cv::NORM_INF), 0.0) << "frame " << i;
  }
}

TEST(H264Decoder, RequestedKeyframeLetsALateJoinerStartAtOnce)
{
  REQUIRE_REAL_SCENE();
  H264Encoder enc;
  H264Decoder early, late;
  std::string err;
  ASSERT_TRUE(enc.open(params640(), &err)) << err;
  Frame f;
  for (int i = 0; i < 40; ++i)
  {
    if (i == 17)
      enc.requestKeyframe();  // what the transport does when a subscriber joins
    const Packet p = encodeOne(enc, realScene()[i], i);
    ASSERT_TRUE(early.decode(p.data.data(), p.data.size(), &f, &err)) << err;
    if (i >= 12)
      EXPECT_EQ(late.decode(p.data.data(), p.data.size(), &f, &err), i >= 17) << "frame " << i << ": " << err;
  }
}

// ---- issue-class regressions: valid streams of any size, lying frames, smeared pictures, hostile messages

namespace
{
/// Widths to sweep: $OVERLAY_TEST_WIDTHS ("2,4,648" or "all" = 2..1920 step 2), else a set that
/// covers every width % 16 and the sizes seen to overflow libswscale's output before.
std::vector<int> sweepWidths()
{
  const char* env = std::getenv("OVERLAY_TEST_WIDTHS");
  std::vector<int> widths;
  const std::string spec = env ? env : "";
  if (spec == "all")
  {
    for (int w = 2; w <= 1920; w += 2)
      widths.push_back(w);
    return widths;
  }
  if (!spec.empty())
  {
    std::stringstream in(spec);
    std::string item;
    while (std::getline(in, item, ','))
      widths.push_back(std::atoi(item.c_str()));
    return widths;
  }
  for (int w = 2; w <= 64; w += 2)
    widths.push_back(w);
  for (int w : { 328, 330, 640, 642, 644, 646, 648, 650, 652, 654, 656, 658, 800, 808, 1032, 1280, 1288, 1366,
                 1624, 1920 })
    widths.push_back(w);
  return widths;
}

/// A picture of the real scene (or the synthetic one without it) at w x h.
cv::Mat sceneAt(int w, int h, size_t frame)
{
  const cv::Mat& src = realScene().size() > frame ? realScene()[frame] : syntheticScene(1)[0];
  cv::Mat out;
  cv::resize(src, out, cv::Size(w, h), 0, 0, cv::INTER_AREA);
  return out;
}

/// Minimal H.264 bit writer for hand-made parameter sets.
struct BitWriter
{
  std::vector<uint8_t> bytes;
  int used = 8;
  void bit(int b)
  {
    if (used == 8)
    {
      bytes.push_back(0);
      used = 0;
    }
    bytes.back() |= static_cast<uint8_t>((b & 1) << (7 - used++));
  }
  void bits(uint32_t v, int n)
  {
    for (int k = n - 1; k >= 0; --k)
      bit(static_cast<int>((v >> k) & 1));
  }
  void ue(uint32_t v)
  {
    const uint64_t x = static_cast<uint64_t>(v) + 1;
    int len = 0;
    while ((x >> len) > 1)
      ++len;
    bits(0, len);
    for (int k = len; k >= 0; --k)
      bit(static_cast<int>((x >> k) & 1));
  }
  /// rbsp_trailing_bits, then a NAL unit with a start code and emulation prevention
  std::vector<uint8_t> nal(uint8_t header)
  {
    bit(1);
    used = 8;
    std::vector<uint8_t> out = { 0, 0, 0, 1, header };
    int zeros = 0;
    for (uint8_t b : bytes)
    {
      if (zeros >= 2 && b <= 3)
      {
        out.push_back(3);
        zeros = 0;
      }
      out.push_back(b);
      zeros = b == 0 ? zeros + 1 : 0;
    }
    return out;
  }
};

/// A baseline SPS (id 0) claiming width_mbs x height_mbs macroblocks.
std::vector<uint8_t> hugeSps(uint32_t width_mbs, uint32_t height_mbs)
{
  BitWriter w;
  w.bits(66, 8);  // baseline
  w.bits(0, 8);
  w.bits(51, 8);  // level 5.1
  w.ue(0);        // sps id
  w.ue(0);        // log2_max_frame_num_minus4
  w.ue(2);        // pic_order_cnt_type
  w.ue(1);        // max_num_ref_frames
  w.bit(0);       // gaps
  w.ue(width_mbs - 1);
  w.ue(height_mbs - 1);
  w.bit(1);  // frame_mbs_only
  w.bit(1);  // direct_8x8_inference
  w.bit(0);  // cropping
  w.bit(0);  // vui
  return w.nal(0x67);
}

struct DecodeRun
{
  int shown = 0;
  int refused = 0;
};

/// Feeds `order` (indices into pkts) and checks every picture shown is exactly the uninterrupted
/// decode's picture of that index: a smeared picture fails here.
DecodeRun feed(H264Decoder& dec, const std::vector<Packet>& pkts, const std::vector<cv::Mat>& reference,
               const std::vector<size_t>& order)
{
  DecodeRun run;
  std::string err;
  for (size_t i : order)
  {
    Frame f;
    if (dec.decode(pkts[i].data.data(), pkts[i].data.size(), &f, &err))
    {
      ++run.shown;
      EXPECT_EQ(cv::norm(asMat(f), reference[i], cv::NORM_INF), 0.0) << "picture of frame " << i << " is smeared";
    }
    else
      ++run.refused;
  }
  return run;
}

std::vector<size_t> range(size_t from, size_t to)
{
  std::vector<size_t> v;
  for (size_t i = from; i < to; ++i)
    v.push_back(i);
  return v;
}

std::vector<size_t> concat(std::vector<size_t> a, const std::vector<size_t>& b)
{
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
}  // namespace

TEST(H264Widths, ValidStreamsOfEveryWidthDecodeWithoutOverflow)
{
  // libswscale writes past the last pixel of a row at some widths (648: 8 bytes); into an
  // exact-size Image buffer that corrupted the viewer's heap (malloc aborts; valgrind shows it)
  const std::vector<int> heights = { 2, 90, 480 };
  int streams = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int w : sweepWidths())
    for (int h : heights)
    {
      H264Params p;
      p.width = w;
      p.height = h;
      p.bitrate_kbps = 2000;
      p.crf = 20;
      H264Encoder enc;
      std::string err;
      ASSERT_TRUE(enc.open(p, &err)) << w << "x" << h << ": " << err;
      for (const char* encoding : { "bgr8", "rgb8", "mono8" })
      {
        H264Decoder dec(encoding);
        for (size_t k = 0; k < 2; ++k)
        {
          const cv::Mat bgr = sceneAt(w, h, 40 + k);
          Packet pkt;
          ASSERT_TRUE(enc.encode(bgr.data, bgr.step * bgr.rows, static_cast<int>(bgr.step), "bgr8",
                                 static_cast<int64_t>(k), &pkt, &err))
              << w << "x" << h << ": " << err;
          Frame f;
          ASSERT_TRUE(dec.decode(pkt.data.data(), pkt.data.size(), &f, &err)) << w << "x" << h << " " << encoding << ": " << err;
          const int bpp = std::string(encoding) == "mono8" ? 1 : 3;
          ASSERT_EQ(f.width, w);
          ASSERT_EQ(f.height, h);
          ASSERT_EQ(f.step, w * bpp);
          ASSERT_EQ(f.data.size(), static_cast<size_t>(w) * h * bpp) << "the Image holds exactly its pixels";
          if (w >= 16 && h >= 16 && bpp == 3)
          {
            // in the codec's own domain (YUV 4:2:0): a broken row scores below 20 dB, the codec
            // above 30 on every size of this scene
            cv::Mat got = asMat(f);
            if (std::string(encoding) == "rgb8")
              cv::cvtColor(got, got, cv::COLOR_RGB2BGR);
            EXPECT_GT(yuvPsnr(got, bgr), 30.0) << w << "x" << h << " " << encoding << " frame " << k;
          }
        }
        enc.requestKeyframe();  // the next decoder starts at a keyframe
      }
      ++streams;
    }
  std::printf("[ measured ] %d streams (%zu widths x %zu heights x 3 output encodings) decoded in %.1f s\n", streams,
              sweepWidths().size(), heights.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

TEST(H264Encoder, FramesThatLieAboutTheirSizeAreRefusedNotRead)
{
  H264Encoder enc;
  std::string err;
  Packet pkt;
  // 1920x1080 bgr8 with 100 bytes of data: crashed the driver hosting the plugin (cvtColor read past)
  const std::vector<uint8_t> small(100, 7);
  EXPECT_FALSE(enc.encode(small.data(), small.size(), 1920, 1080, 1920 * 3, "bgr8", 0, &pkt, &err));
  EXPECT_NE(err.find("data holds 100 bytes"), std::string::npos) << err;
  EXPECT_TRUE(pkt.data.empty());
  // one byte short of step x height
  const std::vector<uint8_t> almost(64 * 3 * 48 - 1, 7);
  EXPECT_FALSE(enc.encode(almost.data(), almost.size(), 64, 48, 64 * 3, "rgb8", 0, &pkt, &err));
  EXPECT_NE(err.find("less than step"), std::string::npos) << err;
  // a step shorter than a row, and a zero step
  const std::vector<uint8_t> full(64 * 4 * 48, 7);
  EXPECT_FALSE(enc.encode(full.data(), full.size(), 64, 48, 64 * 3, "bgra8", 0, &pkt, &err));
  EXPECT_NE(err.find("step 192 is less than width 64 x 4"), std::string::npos) << err;
  EXPECT_FALSE(enc.encode(full.data(), full.size(), 64, 48, 0, "mono8", 0, &pkt, &err));
  EXPECT_NE(err.find("step 0"), std::string::npos) << err;
  // a picture over the limits is refused before the encoder allocates for it
  EXPECT_FALSE(enc.encode(full.data(), full.size(), 16000, 16000, 48000, "bgr8", 0, &pkt, &err));
  EXPECT_NE(err.find("max_width"), std::string::npos) << err;
  // and the next honest frame goes through
  const cv::Mat ok = sceneAt(64, 48, 0);
  EXPECT_TRUE(enc.encode(ok.data, ok.step * ok.rows, 64, 48, static_cast<int>(ok.step), "bgr8", 1, &pkt, &err)) << err;
}

TEST(H264Encoder, EveryPacketCarriesTheFrameCounter)
{
  REQUIRE_REAL_SCENE();
  const std::vector<Packet> pkts = encodeAll(std::vector<cv::Mat>(realScene().begin(), realScene().begin() + 40),
                                             params640());
  FrameCounter first;
  ASSERT_TRUE(h264FrameCounter(pkts[0].data.data(), pkts[0].data.size(), &first));
  for (size_t i = 0; i < pkts.size(); ++i)
  {
    FrameCounter c;
    ASSERT_TRUE(h264FrameCounter(pkts[i].data.data(), pkts[i].data.size(), &c)) << "frame " << i;
    EXPECT_EQ(c.stream_id, first.stream_id);
    EXPECT_EQ(c.frame, i);
    // the SEI comes before the picture's slice, after the parameter sets
    const std::vector<int> t = h264NalTypes(pkts[i].data.data(), pkts[i].data.size());
    const auto sei = std::find(t.begin(), t.end(), 6);
    const auto vcl = std::find_if(t.begin(), t.end(), [](int x) { return x == 1 || x == 5; });
    EXPECT_TRUE(sei < vcl) << "frame " << i;
  }
  H264Params plain = params640();
  plain.frame_counter = false;
  const std::vector<Packet> without = encodeAll(std::vector<cv::Mat>(realScene().begin(), realScene().begin() + 2), plain);
  FrameCounter c;
  EXPECT_FALSE(h264FrameCounter(without[1].data.data(), without[1].data.size(), &c));
}

TEST(H264Decoder, DuplicatedFrameIsDroppedAndTheStreamGoesOn)
{
  REQUIRE_REAL_SCENE();
  const std::vector<Packet> pkts = encodeAll(std::vector<cv::Mat>(realScene().begin(), realScene().begin() + 60),
                                             params640());
  const std::vector<cv::Mat> reference = decodeAllFrames(pkts);
  H264Decoder dec;
  // P frame 12 twice, IDR 30 twice
  const DecodeRun run = feed(dec, pkts, reference, concat(concat(range(0, 13), { 12 }), concat(range(13, 31), range(30, 60))));
  EXPECT_EQ(run.shown, 60);
  EXPECT_EQ(dec.counts().duplicates, 2u);
  EXPECT_EQ(dec.counts().missing_reference, 0u);
}

TEST(H264Decoder, MissingExactlyOneGopIsNoticed)
{
  REQUIRE_REAL_SCENE();
  // frame_num repeats every GOP: frame 40 follows frame 9 as frame_num 10 follows 9
  const std::vector<Packet> pkts = encodeAll(std::vector<cv::Mat>(realScene().begin(), realScene().begin() + 90),
                                             params640());
  const std::vector<cv::Mat> reference = decodeAllFrames(pkts);
  H264Decoder dec;
  const DecodeRun run = feed(dec, pkts, reference, concat(range(0, 10), range(40, 90)));
  EXPECT_EQ(run.shown, 10 + 30) << "frames 40..59 must wait for the keyframe at 60";
  EXPECT_EQ(dec.counts().missing_reference, 1u);
  EXPECT_EQ(dec.counts().waiting, 19u);
}

TEST(H264Decoder, BurstLostAcrossAKeyframeIsNoticed)
{
  REQUIRE_REAL_SCENE();
  const std::vector<Packet> pkts = encodeAll(std::vector<cv::Mat>(realScene().begin(), realScene().begin() + 90),
                                             params640());
  const std::vector<cv::Mat> reference = decodeAllFrames(pkts);
  H264Decoder dec;
  const DecodeRun run = feed(dec, pkts, reference, concat(range(0, 25), range(35, 90)));
  EXPECT_EQ(run.shown, 25 + 30);
}

TEST(H264Decoder, WithoutTheCounterARepeatedFrameNumIsALoss)
{
  REQUIRE_REAL_SCENE();
  H264Params p = params640();
  p.frame_counter = false;  // another encoder's stream: frame_num is all there is
  const std::vector<Packet> pkts = encodeAll(std::vector<cv::Mat>(realScene().begin(), realScene().begin() + 60), p);
  const std::vector<cv::Mat> reference = decodeAllFrames(pkts);
  H264Decoder dec;
  const DecodeRun run = feed(dec, pkts, reference, concat(concat(range(0, 13), { 12 }), range(13, 60)));
  EXPECT_EQ(run.shown, 13 + 30);
  EXPECT_EQ(dec.counts().missing_reference, 1u);
}

TEST(H264Decoder, AnotherStreamWithoutAKeyframeIsALoss)
{
  REQUIRE_REAL_SCENE();
  const std::vector<cv::Mat> scene(realScene().begin(), realScene().begin() + 20);
  const std::vector<Packet> a = encodeAll(scene, params640()), b = encodeAll(scene, params640());
  H264Decoder dec;
  Frame f;
  std::string err;
  for (size_t i = 0; i < 5; ++i)
    ASSERT_TRUE(dec.decode(a[i].data.data(), a[i].data.size(), &f, &err)) << err;
  // a restarted publisher's P frame 5 (same frame number, another stream)
  EXPECT_FALSE(dec.decode(b[5].data.data(), b[5].data.size(), &f, &err));
  EXPECT_EQ(dec.status(), DecodeStatus::kMissingReference) << err;
  EXPECT_TRUE(dec.decode(b[0].data.data(), b[0].data.size(), &f, &err)) << "its keyframe starts it: " << err;
}

TEST(H264Decoder, HostileMessagesAreRefusedCheaply)
{
  REQUIRE_REAL_SCENE();
  const std::vector<Packet> pkts = encodeAll(std::vector<cv::Mat>(realScene().begin(), realScene().begin() + 2),
                                             params640());
  Frame f;
  std::string err;
  const auto t0 = std::chrono::steady_clock::now();
  {
    // 8 MB of filler NAL units (type 12): 2 million NAL units took a viewer to 2.6 GB
    std::vector<uint8_t> filler;
    for (int i = 0; i < 2000000; ++i)
      filler.insert(filler.end(), { 0, 0, 1, 0x0c });
    H264Decoder dec;
    EXPECT_FALSE(dec.decode(filler.data(), filler.size(), &f, &err));
    EXPECT_EQ(dec.status(), DecodeStatus::kRefused);
    EXPECT_NE(err.find("max_nal_units 1024"), std::string::npos) << err;
  }
  {
    ImageLimits l;
    l.max_message_bytes = 1000;
    H264Decoder dec("bgr8", l);
    EXPECT_FALSE(dec.decode(pkts[0].data.data(), pkts[0].data.size(), &f, &err));
    EXPECT_EQ(dec.status(), DecodeStatus::kRefused);
    EXPECT_NE(err.find("max_message_bytes 1000 (parameter ~max_message_bytes)"), std::string::npos) << err;
  }
  {
    // an SPS claiming 16000x16000 in front of a real picture
    std::vector<uint8_t> msg = hugeSps(1000, 1000);
    msg.insert(msg.end(), pkts[0].data.begin(), pkts[0].data.end());
    H264Decoder dec;
    EXPECT_FALSE(dec.decode(msg.data(), msg.size(), &f, &err));
    EXPECT_EQ(dec.status(), DecodeStatus::kRefused);
    EXPECT_NE(err.find("picture 16000x16000 exceeds max_width 8192 (parameter ~max_width)"), std::string::npos) << err;
    // 8K fits the sides but not the default pixel count
    msg = hugeSps(480, 270);
    msg.insert(msg.end(), pkts[0].data.begin(), pkts[0].data.end());
    EXPECT_FALSE(dec.decode(msg.data(), msg.size(), &f, &err));
    EXPECT_NE(err.find("exceeds max_pixels"), std::string::npos) << err;
    // the honest stream still decodes afterwards
    EXPECT_TRUE(dec.decode(pkts[0].data.data(), pkts[0].data.size(), &f, &err)) << err;
  }
  {
    // a limit below the stream's own size: refused by the SPS check, before libavcodec allocates
    ImageLimits l;
    l.max_pixels = 320 * 240;
    H264Decoder dec("bgr8", l);
    EXPECT_FALSE(dec.decode(pkts[0].data.data(), pkts[0].data.size(), &f, &err));
    EXPECT_NE(err.find("picture 640x480 (307200 pixels) exceeds max_pixels 76800"), std::string::npos) << err;
  }
  {
    // two pictures in one message
    std::vector<uint8_t> two = pkts[0].data;
    two.insert(two.end(), pkts[1].data.begin(), pkts[1].data.end());
    H264Decoder dec;
    EXPECT_FALSE(dec.decode(two.data(), two.size(), &f, &err));
    EXPECT_EQ(dec.status(), DecodeStatus::kError);
    EXPECT_NE(err.find("2 pictures in one message"), std::string::npos) << err;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ measured ] hostile messages refused in %.3f s\n", s);
}

int main(int argc, char** argv)
{
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
