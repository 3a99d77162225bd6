// Fuzz target: H264Decoder::decode, what a viewer's link_aware_h264 subscriber and the decoder node
// run on every message from the network, plus h264NalTypes and h264FrameCounter (the parsers the
// transports call on the same bytes).
//
// Input: one config byte, then messages separated by the 4 bytes "#AU#" (at most 64), all fed in
// order to ONE decoder, so what it keeps between messages (the wait for an IDR, the reference
// chain, the frame counter, libavcodec's own state) is exercised. Config bits 0-1: output encoding
// (bgr8, rgb8, mono8, bgr8); bit 2: reset() after the first message. Limits are small for speed
// (1920x1088 pixels, 1 MiB a message, 256 NAL units): a 4K seed exercises the refusal.
//
// Checked beyond "no crash, no sanitizer report": a returned picture is within the limits, in the
// encoding asked for, tightly packed (step = width x channels, data = step x height); decode()
// returns true exactly when status() is kFrame; the counters add up to the messages given.
#include "overlay_manager/h264_codec.h"

#include "fuzz_input.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

using overlay_manager::DecodeStatus;

namespace
{
const uint8_t kDelimiter[4] = { '#', 'A', 'U', '#' };
const size_t kMaxMessages = 64;
const char* const kEncodings[4] = { "bgr8", "rgb8", "mono8", "bgr8" };

/// Offset of the first delimiter at or after `from`, else `size` (memchr: a byte loop under the
/// fuzzer's instrumentation cost more than the decoding).
size_t nextDelimiter(const uint8_t* data, size_t size, size_t from)
{
  const uint8_t* p = data + from;
  const uint8_t* const stop = data + size;
  while (p < stop && (p = static_cast<const uint8_t*>(std::memchr(p, kDelimiter[0], stop - p))) != nullptr)
  {
    if (stop - p >= 4 && std::memcmp(p, kDelimiter, 4) == 0)
      return static_cast<size_t>(p - data);
    ++p;
  }
  return size;
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
  if (size < 1)
    return 0;
  const uint8_t config = data[0];
  const std::string encoding = kEncodings[config & 3];
  const int channels = encoding == "mono8" ? 1 : 3;

  overlay_manager::ImageLimits limits;
  limits.max_pixels = 1920ull * 1088ull;
  limits.max_message_bytes = 1u << 20;
  limits.max_nal_units = 256;
  overlay_manager::H264Decoder decoder(encoding, limits);

  uint64_t calls = 0, no_frame = 0;
  size_t pos = 1;
  while (pos <= size && calls < kMaxMessages)
  {
    const size_t end = nextDelimiter(data, size, pos);  // the next message: up to it or the end
    // each message in a heap block of its own size: a read past it is seen by AddressSanitizer
    const std::vector<uint8_t> message(data + pos, data + end);

    overlay_manager::h264NalTypes(message.data(), message.size());
    overlay_manager::FrameCounter counter;
    overlay_manager::h264FrameCounter(message.data(), message.size(), &counter);

    overlay_manager::Frame frame;
    std::string error;
    const bool got = decoder.decode(message.data(), message.size(), &frame, &error);
    ++calls;
    if (got != (decoder.status() == DecodeStatus::kFrame))
      fuzz_input::fail("decode() returned " + std::to_string(got) + " but status() says otherwise");
    if (decoder.status() == DecodeStatus::kNoFrame)
      ++no_frame;
    if (got)
    {
      const uint64_t w = static_cast<uint64_t>(frame.width), h = static_cast<uint64_t>(frame.height);
      if (frame.width <= 0 || frame.height <= 0 || w * h > limits.max_pixels)
        fuzz_input::fail("picture " + std::to_string(frame.width) + "x" + std::to_string(frame.height) +
                         " outside the limits");
      if (frame.encoding != encoding)
        fuzz_input::fail("picture in " + frame.encoding + ", asked for " + encoding);
      if (static_cast<uint64_t>(frame.step) != w * channels || frame.data.size() != w * channels * h)
        fuzz_input::fail("picture " + std::to_string(frame.width) + "x" + std::to_string(frame.height) +
                         " step " + std::to_string(frame.step) + " with " + std::to_string(frame.data.size()) +
                         " bytes is not tightly packed");
    }
    else if (error.empty() && decoder.status() != DecodeStatus::kNoFrame)
    {
      fuzz_input::fail("decode() dropped a message without saying why");
    }
    if (calls == 1 && (config & 4))
      decoder.reset();
    pos = end + 4;
  }
  const overlay_manager::DecodeCounts& c = decoder.counts();
  if (c.frames + c.dropped() + no_frame != calls)
    fuzz_input::fail("counters (" + std::to_string(c.frames) + " frames, " + std::to_string(c.dropped()) +
                     " dropped) and " + std::to_string(no_frame) + " without a picture do not add up to " +
                     std::to_string(calls) + " messages");
  return 0;
}
