// Fuzz target: H264Encoder::encode, what the link_aware_h264 publisher plugin (inside a camera
// driver) and the standalone encoder run on every raw frame a driver publishes: any width, height,
// step, encoding (every sensor_msgs/image_encodings name and garbage) and a data size that need not
// match them (fuzz_input.h describes the input). A frame the encoder refuses must say why and must
// not be read past its data; a frame it takes must come out as one access unit that a decoder turns
// into a picture of the coded size.
//
// Speed: honest pictures are at most 96x96; encoders are kept between inputs, one per picture size
// (the 32 used last, and one for all kBigSides inputs; flag kFresh uses a fresh one instead), each
// with a decoder that follows its stream.
//
// Checked beyond "no crash, no sanitizer report": a refusal has a reason; a packet is non-empty,
// carries the pts, is an IDR with SPS and PPS when a keyframe was due; its decoder returns a
// picture of the encoder's coded size for every packet (never "missing reference" or an error).
#include "overlay_manager/h264_codec.h"

#include "fuzz_input.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace
{
struct Stream
{
  overlay_manager::H264Encoder encoder;
  overlay_manager::H264Decoder decoder{ "bgr8" };
  bool keyframe_due = true;  ///< the next packet must be an IDR
};

std::unique_ptr<Stream> openStream()
{
  std::unique_ptr<Stream> s(new Stream);
  overlay_manager::H264Params params;
  params.width = 16;
  params.height = 16;
  params.gop = 10;
  params.bitrate_kbps = 500;
  std::string error;
  if (!s->encoder.open(params, &error))
    fuzz_input::fail("the encoder does not open at 16x16: " + error);
  return s;
}

bool has(const std::vector<int>& v, int x)
{
  return std::find(v.begin(), v.end(), x) != v.end();
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***)
{
  // libav's log through the sink the ROS adapters use (to nowhere: stderr at 50,000 lines/s slows
  // the fuzzer and buries its report)
  overlay_manager::setLibavLogSink([](int, const void*, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
  fuzz_input::RawFrame f;
  if (!fuzz_input::parse(data, size, &f))
    return 0;
  static std::map<std::pair<uint32_t, uint32_t>, std::unique_ptr<Stream>> streams;
  static std::list<std::pair<uint32_t, uint32_t>> recent;  // keys of `streams`, the last used first
  static int64_t pts = 0;

  std::unique_ptr<Stream> fresh;
  Stream* s = nullptr;
  if (f.flags & fuzz_input::kFresh)
  {
    fresh = openStream();
    s = fresh.get();
  }
  else
  {
    // lying sides share one encoder (most are refused); honest sizes keep one each
    const auto key = (f.flags & fuzz_input::kBigSides) ? std::make_pair(0xffffffffu, 0xffffffffu)
                                                       : std::make_pair(f.width, f.height);
    auto it = streams.find(key);
    if (it == streams.end())
    {
      if (streams.size() >= 32)
      {
        streams.erase(recent.back());
        recent.pop_back();
      }
      it = streams.emplace(key, openStream()).first;
    }
    else
    {
      recent.remove(key);
    }
    recent.push_front(key);
    s = it->second.get();
  }
  if (f.flags & fuzz_input::kBitrate)
    s->encoder.setBitrate(50 + 40 * f.quality);
  if (f.flags & fuzz_input::kKeyframe)
  {
    s->encoder.requestKeyframe();
    s->keyframe_due = true;
  }
  // as the transports pass a sensor_msgs/Image's uint32 fields
  const int width = static_cast<int>(f.width), height = static_cast<int>(f.height);
  const int step = static_cast<int>(f.step);
  const int open_w = s->encoder.codedWidth(), open_h = s->encoder.codedHeight();

  overlay_manager::Packet packet;
  std::string error;
  ++pts;
  if (!s->encoder.encode(f.data.data(), f.data.size(), width, height, step, f.encoding, pts, &packet, &error))
  {
    if (error.empty())
      fuzz_input::fail("encode() refused a " + f.encoding + " frame without saying why");
    return 0;
  }
  if (s->encoder.codedWidth() != open_w || s->encoder.codedHeight() != open_h)
    s->keyframe_due = true;  // reopened for the new size
  if (packet.data.empty() || packet.pts != pts)
    fuzz_input::fail("empty packet or pts changed (" + std::to_string(packet.pts) + " for " + std::to_string(pts) + ")");
  const std::vector<int> types = overlay_manager::h264NalTypes(packet.data.data(), packet.data.size());
  if (s->keyframe_due && !(packet.keyframe && has(types, 5) && has(types, 7) && has(types, 8)))
    fuzz_input::fail("a keyframe was due but the packet is no IDR with SPS and PPS");
  s->keyframe_due = false;

  overlay_manager::Frame frame;
  if (!s->decoder.decode(packet.data.data(), packet.data.size(), &frame, &error))
    fuzz_input::fail("the encoder's own stream did not decode (" + f.encoding + " " + std::to_string(width) + "x" +
                     std::to_string(height) + "): " + error);
  if (frame.width != s->encoder.codedWidth() || frame.height != s->encoder.codedHeight())
    fuzz_input::fail("decoded " + std::to_string(frame.width) + "x" + std::to_string(frame.height) + ", coded " +
                     std::to_string(s->encoder.codedWidth()) + "x" + std::to_string(s->encoder.codedHeight()));
  return 0;
}
