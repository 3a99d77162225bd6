// Fuzz target: what a viewer's unshape node runs on every ShapedMessage from the network
// (src/topic_unshaper.cpp), and what the robot's shaper runs on every cloud it reduces
// (src/topic_shaper.cpp), on bytes an attacker chooses.
//
// Input: 4 bytes of the claimed raw_size (little-endian; capped at the 4 MiB limit used here, so a
// bomb is refused by size and a lie by the frame's content size), then the zstd frame. The same
// bytes, when at least 32 long, also describe a point cloud's layout (width, height, point_step,
// row_step, three fields) checked by checkCloud and, when it passes, reduced by decimate and
// voxelFilter over the input as data.
//
// Checked beyond "no crash, no sanitizer report": a decompression that succeeds gives exactly
// raw_size bytes; a cloud reduced from a checked layout is a valid layout over its output.
#include "overlay_manager/topic_shaping.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

using namespace overlay_manager::shaping;

namespace
{
uint32_t u32(const uint8_t* p)
{
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void fail(const char* what)
{
  std::fprintf(stderr, "fuzz_shaped_decode: %s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
  if (size < 4)
    return 0;
  static ZstdCodec codec;  // one codec for the whole run, as one serves a whole stream
  const size_t kMax = 4u << 20;
  std::vector<uint8_t> out;
  std::string error;
  const uint32_t raw_size = u32(data);
  if (codec.decompress(data + 4, size - 4, raw_size, kMax, &out, &error) && out.size() != raw_size)
    fail("decompress gave a size other than raw_size");

  if (size < 32)
    return 0;
  CloudLayout l;
  l.width = u32(data) % 4096;
  l.height = u32(data + 4) % 64;
  l.point_step = u32(data + 8) % 64;
  l.row_step = u32(data + 12) % 65536;
  for (int i = 0; i < 3; ++i)
    l.fields.push_back({ std::string(1, static_cast<char>('x' + i)), data[16 + i] % 64u, static_cast<uint8_t>(data[19 + i] % 10), 1u });
  CloudLimits limits;
  limits.max_points = 100000;
  if (!checkCloud(l, size, limits).empty())
    return 0;
  CloudLayout r;
  std::vector<uint8_t> rd;
  decimate(l, data, 1 + data[22] % 8, &r, &rd);
  if (!checkCloud(r, rd.size(), limits).empty())
    fail("decimate made an invalid layout");
  if (voxelFilter(l, data, 0.01 + data[23] / 100.0, &r, &rd, &error) && !checkCloud(r, rd.size(), limits).empty())
    fail("voxelFilter made an invalid layout");
  return 0;
}
