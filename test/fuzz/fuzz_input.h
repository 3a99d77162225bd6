// What the fuzz targets of test/fuzz share: the list of encoding names they try, and the raw-frame
// header of the two encode targets (fuzz_h264_encode.cpp, fuzz_image_encode.cpp), so one seed
// format (test/fuzz/make_corpus.py writes it) drives both.
//
// Raw-frame input: 8 header bytes, then pixel bytes.
//   [0] encoding: index into kEncodings (every sensor_msgs/image_encodings name, then garbage)
//   [1] width, [2] height: 0..96 (value % 97); with flag kBigSides, an entry of kBigSides instead
//   [3] step: low 3 bits the mode (exact, padded, short, 0, arbitrary, huge, doubled, negative as
//       int), high 5 bits the amount
//   [4] data size: low 3 bits the mode (exact step*height, short, long, 0, arbitrary, the bytes
//       left in the input, half, width*bpp*height ignoring step), high 5 bits the amount
//   [5] flags (kBigSides, kBigEndian, kAlt: PNG instead of JPEG, kKeyframe: request an IDR,
//       kBitrate: change the bit rate first, kFresh: a fresh H.264 encoder)
//   [6] quality (JPEG 1..100, PNG level 1..9, H.264 bit rate)
//   [7] unused (kept for later fields)
// The data buffer has exactly the claimed size (a heap block of its own, so AddressSanitizer sees a
// read past it) and is filled by repeating the pixel bytes; its size is independent of
// width/height/step unless the mode says exact: the sizes lie.
#ifndef OVERLAY_MANAGER_TEST_FUZZ_INPUT_H
#define OVERLAY_MANAGER_TEST_FUZZ_INPUT_H

#include <sensor_msgs/image_encodings.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace fuzz_input
{

/// Every name of sensor_msgs/image_encodings.h, then names a camera driver might send by mistake.
inline const std::vector<std::string>& encodings()
{
  static const std::vector<std::string> names = {
    "rgb8", "rgba8", "rgb16", "rgba16", "bgr8", "bgra8", "bgr16", "bgra16", "mono8", "mono16",
    "8UC1", "8UC2", "8UC3", "8UC4", "8SC1", "8SC2", "8SC3", "8SC4",
    "16UC1", "16UC2", "16UC3", "16UC4", "16SC1", "16SC2", "16SC3", "16SC4",
    "32SC1", "32SC2", "32SC3", "32SC4", "32FC1", "32FC2", "32FC3", "32FC4", "64FC1", "64FC2", "64FC3", "64FC4",
    "bayer_rggb8", "bayer_bggr8", "bayer_gbrg8", "bayer_grbg8",
    "bayer_rggb16", "bayer_bggr16", "bayer_gbrg16", "bayer_grbg16", "yuv422",
    // garbage and near misses
    "", "RGB8", "rgb", "bgr", "jpeg", "8UC", "8UC0", "8UC5", "8UC99999999999", "32FC", "16UC-1", "mono", "mono12",
    "yuv422_yuy2", "nv12", "bayer_rggb", "rgb8 ", " rgb8", std::string("rgb8\0x", 6), "bgr8; jpeg compressed bgr8",
    std::string(300, 'x'),
  };
  return names;
}

/// Picture sides a lying message may claim (as uint32; some are negative as int).
inline const std::vector<uint32_t>& bigSides()
{
  static const std::vector<uint32_t> sides = { 0u, 1u, 2u, 97u, 1920u, 3840u, 8192u, 8193u, 16000u, 65535u,
                                               0x7fffffffu, 0x80000000u, 0xffffffffu };
  return sides;
}

enum Flags : uint8_t
{
  kBigSides = 1,
  kBigEndian = 2,
  kAlt = 4,
  kKeyframe = 8,
  kBitrate = 16,
  kFresh = 32,
};

/// Bytes of one pixel, as sensor_msgs says (3 for a name it does not know: a plausible guess).
inline uint64_t bytesPerPixel(const std::string& encoding)
{
  try
  {
    return static_cast<uint64_t>(sensor_msgs::image_encodings::numChannels(encoding)) *
           static_cast<uint64_t>(sensor_msgs::image_encodings::bitDepth(encoding)) / 8;
  }
  catch (const std::exception&)
  {
    return 3;
  }
}

/// Largest data buffer a target allocates (a claimed size above it is cut here: still a lie).
constexpr uint64_t kMaxData = 4ull << 20;

/// One raw frame as an encoder is handed it.
struct RawFrame
{
  std::string encoding;
  uint32_t width = 0;
  uint32_t height = 0;
  uint32_t step = 0;
  uint8_t flags = 0;
  uint8_t quality = 0;
  std::vector<uint8_t> data;  ///< exactly the claimed size
};

constexpr size_t kHeaderBytes = 8;

/// False when the input is shorter than the header.
inline bool parse(const uint8_t* in, size_t size, RawFrame* f)
{
  if (size < kHeaderBytes)
    return false;
  const std::vector<std::string>& names = encodings();
  f->encoding = names[in[0] % names.size()];
  f->flags = in[5];
  f->quality = in[6];
  if (f->flags & kBigSides)
  {
    f->width = bigSides()[in[1] % bigSides().size()];
    f->height = bigSides()[in[2] % bigSides().size()];
  }
  else
  {
    f->width = in[1] % 97;
    f->height = in[2] % 97;
  }
  const uint64_t row = static_cast<uint64_t>(f->width) * bytesPerPixel(f->encoding);
  const uint32_t step_amount = in[3] >> 3;
  uint64_t step = row;
  switch (in[3] & 7)
  {
    case 0: step = row; break;
    case 1: step = row + step_amount; break;
    case 2: step = row > step_amount ? row - step_amount - 1 : 0; break;
    case 3: step = 0; break;
    case 4: step = uint64_t(step_amount) * 4; break;
    case 5: step = 0x7fffffffu; break;
    case 6: step = row * 2; break;
    default: step = 0xffffffffu - step_amount; break;  // -1 - amount as int
  }
  f->step = static_cast<uint32_t>(step);  // a row wider than 4 GiB wraps: another lie
  const uint64_t exact = uint64_t(f->step) * f->height;
  const uint64_t size_amount = in[4] >> 3;
  const size_t pixels = size - kHeaderBytes;
  uint64_t bytes = exact;
  switch (in[4] & 7)
  {
    case 0: bytes = exact; break;
    case 1: bytes = exact > size_amount ? exact - size_amount - 1 : 0; break;
    case 2: bytes = exact + size_amount; break;
    case 3: bytes = 0; break;
    case 4: bytes = size_amount * size_amount * 16; break;
    case 5: bytes = pixels; break;
    case 6: bytes = exact / 2; break;
    default: bytes = row * f->height; break;
  }
  if (bytes > kMaxData)
    bytes = kMaxData;
  f->data.resize(static_cast<size_t>(bytes));
  // the pixel bytes repeated: one copy, then doubling (a byte loop here was most of the run time)
  uint8_t* out = f->data.data();
  const size_t n = f->data.size();
  size_t filled = std::min(n, pixels);
  if (filled > 0)
    std::memcpy(out, in + kHeaderBytes, filled);
  while (filled > 0 && filled < n)
  {
    const size_t chunk = std::min(filled, n - filled);
    std::memcpy(out + filled, out, chunk);
    filled += chunk;
  }
  return true;
}

/// A broken promise of the code under test (not an input it may refuse): print and abort, so
/// libFuzzer keeps the input as a crash.
[[noreturn]] inline void fail(const std::string& what)
{
  std::fprintf(stderr, "FUZZ CHECK FAILED: %s\n", what.c_str());
  std::abort();
}

}  // namespace fuzz_input

#endif  // OVERLAY_MANAGER_TEST_FUZZ_INPUT_H
