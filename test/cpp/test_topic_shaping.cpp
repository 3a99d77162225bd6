// Unit tests of the topic shaper's pure parts (include/overlay_manager/topic_shaping.h): zstd round
// trips and hostile frames, point-cloud layout checks and reductions, the policy's rate and
// reduction decisions.
#include "overlay_manager/topic_shaping.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace overlay_manager;
using namespace overlay_manager::shaping;

namespace
{
/// An organised xyz + rgb cloud (16 bytes a point) of w x h points on a plane, 1 cm apart.
CloudLayout cloudLayout(uint32_t w, uint32_t h)
{
  CloudLayout l;
  l.width = w;
  l.height = h;
  l.point_step = 16;
  l.row_step = w * 16;
  l.fields = { { "x", 0, kFloat32, 1 }, { "y", 4, kFloat32, 1 }, { "z", 8, kFloat32, 1 }, { "rgb", 12, kFloat32, 1 } };
  return l;
}

std::vector<uint8_t> cloudData(const CloudLayout& l)
{
  std::vector<uint8_t> d(static_cast<size_t>(l.row_step) * l.height);
  for (uint32_t r = 0; r < l.height; ++r)
    for (uint32_t c = 0; c < l.width; ++c)
    {
      const float p[4] = { c * 0.01f, r * 0.01f, 1.0f + 0.001f * ((r * 7 + c * 3) % 11), static_cast<float>(r ^ c) };
      std::memcpy(d.data() + r * l.row_step + c * l.point_step, p, 16);
    }
  return d;
}

SubscriberView sub(const std::string& host, const std::string& path, double cap = NAN)
{
  SubscriberView v;
  v.node = "/viewer_" + host;
  v.host = host;
  v.path = path;
  v.observed_cap_kbps = cap;
  return v;
}
}  // namespace

TEST(Zstd, RoundTripIsExact)
{
  const CloudLayout l = cloudLayout(320, 240);
  const std::vector<uint8_t> raw = cloudData(l);
  ZstdCodec codec;
  std::vector<uint8_t> packed, back;
  std::string error;
  ASSERT_TRUE(codec.compress(raw.data(), raw.size(), 1, &packed, &error)) << error;
  EXPECT_LT(packed.size(), raw.size() / 2) << "a regular cloud compresses";
  ASSERT_TRUE(codec.decompress(packed.data(), packed.size(), raw.size(), kDefaultMaxMessageBytes, &back, &error))
      << error;
  EXPECT_EQ(back, raw);
  // the same codec again (contexts reused) and an empty message
  ASSERT_TRUE(codec.compress(raw.data(), 0, 3, &packed, &error)) << error;
  ASSERT_TRUE(codec.decompress(packed.data(), packed.size(), 0, kDefaultMaxMessageBytes, &back, &error)) << error;
  EXPECT_TRUE(back.empty());
}

TEST(Zstd, RefusesLyingAndCorruptFrames)
{
  std::vector<uint8_t> raw(100000);
  std::mt19937 rng(7);
  for (auto& b : raw)
    b = static_cast<uint8_t>(rng() % 4);
  ZstdCodec codec;
  std::vector<uint8_t> packed, back;
  std::string error;
  ASSERT_TRUE(codec.compress(raw.data(), raw.size(), 1, &packed, &error));
  // raw_size that lies (either way)
  EXPECT_FALSE(codec.decompress(packed.data(), packed.size(), raw.size() - 1, kDefaultMaxMessageBytes, &back, &error));
  EXPECT_NE(error.find("raw_size"), std::string::npos) << error;
  EXPECT_FALSE(codec.decompress(packed.data(), packed.size(), raw.size() + 1, kDefaultMaxMessageBytes, &back, &error));
  // over the cap: refused before anything is allocated
  EXPECT_FALSE(codec.decompress(packed.data(), packed.size(), raw.size(), 1000, &back, &error));
  EXPECT_NE(error.find("max_message_bytes"), std::string::npos) << error;
  EXPECT_TRUE(back.empty());
  // truncated, trailing bytes, flipped bytes (the checksum catches what the format does not)
  EXPECT_FALSE(codec.decompress(packed.data(), packed.size() / 2, raw.size(), kDefaultMaxMessageBytes, &back, &error));
  std::vector<uint8_t> longer = packed;
  longer.push_back(0);
  EXPECT_FALSE(codec.decompress(longer.data(), longer.size(), raw.size(), kDefaultMaxMessageBytes, &back, &error));
  for (size_t at : { packed.size() / 3, packed.size() / 2, packed.size() - 2 })
  {
    std::vector<uint8_t> bad = packed;
    bad[at] ^= 0x5a;
    EXPECT_FALSE(codec.decompress(bad.data(), bad.size(), raw.size(), kDefaultMaxMessageBytes, &back, &error)) << at;
    EXPECT_TRUE(back.empty());
  }
  // a frame without a checksum (corruption in it would go unseen)
  {
    std::vector<uint8_t> plain(ZSTD_compressBound(raw.size()));
    plain.resize(ZSTD_compress(plain.data(), plain.size(), raw.data(), raw.size(), 1));
    EXPECT_FALSE(codec.decompress(plain.data(), plain.size(), raw.size(), kDefaultMaxMessageBytes, &back, &error));
    EXPECT_NE(error.find("checksum"), std::string::npos) << error;
  }
  // not zstd at all, and nothing
  const uint8_t junk[] = { 1, 2, 3, 4, 5, 6, 7, 8 };
  EXPECT_FALSE(codec.decompress(junk, sizeof(junk), 8, kDefaultMaxMessageBytes, &back, &error));
  EXPECT_FALSE(codec.decompress(junk, 0, 0, kDefaultMaxMessageBytes, &back, &error));
}

TEST(Zstd, BombIsRefusedBeforeAllocation)
{
  // 1 GiB of zeros streamed into one frame of a few kB whose header claims its size
  const size_t claimed = size_t(1) << 30;
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setPledgedSrcSize(c, claimed);
  std::vector<uint8_t> zeros(1 << 20, 0), frame(ZSTD_compressBound(1 << 20) * 2 + 1024);
  ZSTD_outBuffer out = { frame.data(), frame.size(), 0 };
  for (size_t done = 0; done < claimed; done += zeros.size())
  {
    ZSTD_inBuffer in = { zeros.data(), zeros.size(), 0 };
    const bool last = done + zeros.size() >= claimed;
    while (true)
    {
      const size_t left = ZSTD_compressStream2(c, &out, &in, last ? ZSTD_e_end : ZSTD_e_continue);
      ASSERT_FALSE(ZSTD_isError(left));
      if (last ? left == 0 : in.pos == in.size)
        break;
    }
  }
  ZSTD_freeCCtx(c);
  ASSERT_LT(out.pos, 100000u) << "a bomb is small";
  ZstdCodec codec;
  std::vector<uint8_t> back;
  std::string error;
  EXPECT_FALSE(codec.decompress(frame.data(), out.pos, claimed, kDefaultMaxMessageBytes, &back, &error));
  EXPECT_NE(error.find("over the limit"), std::string::npos) << error;
  EXPECT_EQ(back.capacity(), 0u) << "nothing allocated for it";
}

TEST(Shuffle, RoundTripsAnySizeAndStride)
{
  std::vector<uint8_t> in(1000 * 16 + 7);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<uint8_t>(i * 31 + 7);
  for (uint32_t stride : { 0u, 1u, 2u, 4u, 16u, 32u, 4096u, 100000u })
  {
    std::vector<uint8_t> mid(in.size()), back(in.size());
    shuffleBytes(in.data(), in.size(), stride, mid.data());
    unshuffleBytes(mid.data(), mid.size(), stride, back.data());
    EXPECT_EQ(back, in) << "stride " << stride;
  }
  // a cloud's bytes grouped by their place in the point compress better
  const CloudLayout l = cloudLayout(320, 240);
  const std::vector<uint8_t> raw = cloudData(l);
  std::vector<uint8_t> mid(raw.size()), plain, shuffled;
  shuffleBytes(raw.data(), raw.size(), 16, mid.data());
  ZstdCodec codec;
  std::string error;
  ASSERT_TRUE(codec.compress(raw.data(), raw.size(), 1, &plain, &error));
  ASSERT_TRUE(codec.compress(mid.data(), mid.size(), 1, &shuffled, &error));
  EXPECT_LT(shuffled.size(), plain.size());
}

TEST(Cloud, CheckRefusesLyingLayouts)
{
  CloudLayout l = cloudLayout(100, 10);
  const size_t size = 100 * 10 * 16;
  EXPECT_EQ(checkCloud(l, size), "");
  EXPECT_NE(checkCloud(l, size - 1), "") << "data one byte short";
  CloudLayout big = l;
  big.width = 0x80000000u;
  big.row_step = 0xffffffffu;
  EXPECT_NE(checkCloud(big, size), "") << "width x point_step overflows 32 bits";
  big.height = 0xffffffffu;
  EXPECT_NE(checkCloud(big, size), "");
  CloudLayout zero = l;
  zero.point_step = 0;
  EXPECT_NE(checkCloud(zero, size), "");
  CloudLayout short_row = l;
  short_row.row_step = 100 * 16 - 1;
  EXPECT_NE(checkCloud(short_row, size), "");
  CloudLayout field = l;
  field.fields[3].offset = 14;  // a float at 14 reaches byte 18 of a 16-byte point
  EXPECT_NE(checkCloud(field, size).find("rgb"), std::string::npos);
  field.fields[3] = { "rgb", 12, 99, 1 };
  EXPECT_NE(checkCloud(field, size).find("datatype"), std::string::npos);
  field.fields[3] = { "rgb", 12, kFloat32, 0x40000000u };  // count x size overflows 32 bits
  EXPECT_NE(checkCloud(field, size), "");
  CloudLimits limits;
  limits.max_points = 999;
  EXPECT_NE(checkCloud(l, size, limits).find("limit"), std::string::npos);
}

TEST(Cloud, DecimateKeepsEveryNthPointAndPadding)
{
  CloudLayout l = cloudLayout(10, 3);
  l.row_step = 10 * 16 + 8;  // padded rows
  std::vector<uint8_t> d(l.row_step * 3, 0xee);
  for (uint32_t r = 0; r < 3; ++r)
    for (uint32_t c = 0; c < 10; ++c)
    {
      const float x = static_cast<float>(r * 10 + c);
      std::memcpy(d.data() + r * l.row_step + c * 16, &x, 4);
    }
  ASSERT_EQ(checkCloud(l, d.size()), "");
  CloudLayout out;
  std::vector<uint8_t> od;
  decimate(l, d.data(), 4, &out, &od);
  EXPECT_EQ(out.height, 1u);
  EXPECT_EQ(out.width, 8u);  // points 0, 4, ..., 28
  EXPECT_EQ(out.row_step, 8u * 16);
  ASSERT_EQ(od.size(), 8u * 16);
  EXPECT_EQ(checkCloud(out, od.size()), "");
  for (uint32_t i = 0; i < 8; ++i)
  {
    float x;
    std::memcpy(&x, od.data() + i * 16, 4);
    EXPECT_EQ(x, static_cast<float>(i * 4));
  }
  decimate(l, d.data(), 1, &out, &od);
  EXPECT_EQ(out.width, 30u);
}

TEST(Cloud, VoxelKeepsOnePointPerCubeAndDropsNaN)
{
  const CloudLayout l = cloudLayout(100, 100);  // 1 m x 1 m at 1 cm
  std::vector<uint8_t> d = cloudData(l);
  const float nan = std::nanf("");
  std::memcpy(d.data(), &nan, 4);  // point 0 has no x
  CloudLayout out;
  std::vector<uint8_t> od;
  std::string error;
  ASSERT_TRUE(voxelFilter(l, d.data(), 0.1, &out, &od, &error)) << error;
  EXPECT_EQ(checkCloud(out, od.size()), "");
  EXPECT_GE(out.width, 100u);  // 10 x 10 cells in x/y (z spans 1.0..1.01: one or two cells)
  EXPECT_LE(out.width, 200u);
  EXPECT_TRUE(out.is_dense);
  EXPECT_FALSE(voxelFilter(l, d.data(), 0.0, &out, &od, &error));
  CloudLayout no_z = l;
  no_z.fields.erase(no_z.fields.begin() + 2);
  EXPECT_FALSE(voxelFilter(no_z, d.data(), 0.1, &out, &od, &error));
  EXPECT_NE(error.find("float32"), std::string::npos);
}

// The shaper reduces every cloud into one vector it keeps (no cloud-sized allocation per message):
// the reductions must write into the vector they get, keeping its buffer, not hand back a new one.
TEST(Cloud, ReductionsReuseTheOutputBuffer)
{
  const CloudLayout l = cloudLayout(200, 100);
  const std::vector<uint8_t> d = cloudData(l);
  CloudLayout out;
  std::vector<uint8_t> od;
  decimate(l, d.data(), 4, &out, &od);
  const uint8_t* const buffer = od.data();
  const size_t capacity = od.capacity();
  for (uint32_t keep_every : { 4u, 17u, 4u, 64u })
  {
    decimate(l, d.data(), keep_every, &out, &od);
    EXPECT_EQ(od.size(), static_cast<size_t>(out.width) * 16);
    EXPECT_EQ(od.data(), buffer) << "decimate 1/" << keep_every << " replaced the output buffer";
    EXPECT_EQ(od.capacity(), capacity);
  }
  std::vector<uint8_t> ov;
  std::string error;
  ASSERT_TRUE(voxelFilter(l, d.data(), 0.1, &out, &ov, &error)) << error;
  const uint8_t* const voxel_buffer = ov.data();
  const size_t voxel_capacity = ov.capacity();
  for (double leaf : { 0.1, 0.05, 0.1 })
  {
    ASSERT_TRUE(voxelFilter(l, d.data(), leaf, &out, &ov, &error)) << error;
    EXPECT_EQ(ov.size(), static_cast<size_t>(out.width) * 16);
    EXPECT_EQ(ov.data(), voxel_buffer) << "voxel " << leaf << " m replaced the output buffer";
    EXPECT_EQ(ov.capacity(), voxel_capacity);
  }
}

TEST(Policy, NoBudgetMeansFullRateAndContent)
{
  ShapingParams p;
  p.lossy = Lossy::kDecimate;
  ShapingPolicy policy(p);
  EXPECT_EQ(policy.decision().reason, "no subscribers");
  policy.setSubscribers({ sub("laptop", paths::kDirect), sub("robot1", paths::kSelf) });
  policy.onMessageSent(3000000, 1, false, true);
  EXPECT_TRUE(std::isinf(policy.decision().rate_hz));
  EXPECT_EQ(policy.decision().decimation, 1u);
  EXPECT_EQ(policy.decision().reason, "no budget");
}

TEST(Policy, RelayedSubscriberCapsTheRateByItsBudget)
{
  ShapingParams p;  // derp 4000 kbit/s = 500 kB/s
  p.max_rate_hz = 10.0;
  ShapingPolicy policy(p);
  policy.setSubscribers({ sub("laptop", paths::kDirect), sub("far", paths::kDerp) });
  EXPECT_EQ(policy.decision().limited_by, "far");
  EXPECT_DOUBLE_EQ(policy.decision().rate_hz, 10.0) << "the first message goes out at once";
  policy.onMessageSent(100000, 1, false, false);  // 100 kB -> 4.5 Hz fits kBudgetShare of it
  EXPECT_NEAR(policy.decision().rate_hz, 4.5, 1e-9);
  policy.onMessageSent(10000, 1, false, false);  // smaller messages (smoothed): capped at max_rate
  policy.onMessageSent(10000, 1, false, false);
  policy.onMessageSent(10000, 1, false, false);
  EXPECT_DOUBLE_EQ(policy.decision().rate_hz, 10.0);
  // an observed cap below the path budget wins
  policy.setSubscribers({ sub("far", paths::kDerp, 800.0) });
  EXPECT_EQ(policy.decision().reason, "observed delivery");
  EXPECT_DOUBLE_EQ(policy.decision().budget_kbps, 800.0);
}

TEST(Policy, LossyOnlyWhereAllowedAndOnlyForClouds)
{
  ShapingParams p;
  p.max_rate_hz = 10.0;
  p.lossy_below_hz = 2.0;
  ShapingPolicy lossless(p);
  lossless.setSubscribers({ sub("far", paths::kDerp) });
  lossless.onMessageSent(2500000, 1, false, true);  // 2.5 MB at 0.9 x 500 kB/s: 0.18 Hz
  EXPECT_NEAR(lossless.decision().rate_hz, 0.18, 1e-9);
  EXPECT_EQ(lossless.decision().decimation, 1u) << "lossy not allowed";

  p.lossy = Lossy::kDecimate;
  ShapingPolicy dec(p);
  dec.setSubscribers({ sub("far", paths::kDerp) });
  dec.onMessageSent(2500000, 1, false, false);
  EXPECT_EQ(dec.decision().decimation, 1u) << "not a cloud";
  dec.onMessageSent(2500000, 1, false, true);
  EXPECT_EQ(dec.decision().decimation, 12u);  // 2 Hz wanted / 0.18 Hz
  EXPECT_NEAR(dec.decision().rate_hz, 2.16, 1e-6);
  // decimated messages are normalised back to the full cloud: the decision holds
  dec.onMessageSent(2500000 / 12, 12, false, true);
  EXPECT_EQ(dec.decision().decimation, 12u);
  p.max_decimation = 4;
  dec.setParams(p);
  EXPECT_EQ(dec.decision().decimation, 4u);
  EXPECT_NEAR(dec.decision().rate_hz, 0.72, 1e-3);
  // the path becomes direct: full content again at once
  dec.setSubscribers({ sub("far", paths::kDirect) });
  EXPECT_EQ(dec.decision().decimation, 1u);

  p.lossy = Lossy::kVoxel;
  ShapingPolicy vox(p);
  vox.setSubscribers({ sub("far", paths::kDerp) });
  vox.onMessageSent(2500000, 1, false, true);
  EXPECT_TRUE(vox.decision().voxel);
  EXPECT_DOUBLE_EQ(vox.decision().rate_hz, 2.0);
  vox.onMessageSent(100000, 1, true, true);  // voxel clouds of 100 kB: 4.5 Hz
  EXPECT_NEAR(vox.decision().rate_hz, 4.5, 1e-6);
}

TEST(Policy, BudgetFromTheCoreDrivesTheReduction)
{
  ShapingParams p;
  p.lossy = Lossy::kDecimate;
  p.lossy_below_hz = 2.0;
  ShapingPolicy policy(p);
  policy.setBudgetKbps(4000.0, "far");  // 500 kB/s
  policy.onMessageSent(2500000, 1, false, true);
  EXPECT_EQ(policy.decision().decimation, 12u);
  EXPECT_EQ(policy.decision().limited_by, "far");
  policy.setBudgetKbps(std::numeric_limits<double>::infinity(), "");
  EXPECT_EQ(policy.decision().decimation, 1u) << "no budget: full content";
  EXPECT_EQ(policy.decision().reason, "no budget");
}

TEST(Policy, TheFirstCloudIsReducedFromItsInputSize)
{
  // a 5.69 MB cloud: before the first one is sent, its serialized size is the estimate, so it is
  // reduced like the next ones (sent whole, 1.85 MB compressed, it held a 4 Mbit/s path for 3.7 s)
  ShapingParams p;
  p.lossy = Lossy::kDecimate;
  ShapingPolicy policy(p);
  policy.setBudgetKbps(4000.0, "far");
  EXPECT_EQ(policy.decision().decimation, 1u) << "nothing known: nothing to reduce by";
  policy.onInput(5690000, true);
  EXPECT_EQ(policy.decision().decimation, 26u);  // 2 Hz / (450 kB/s / 5.69 MB) = 25.3
  policy.onMessageSent(1850000 / 26, 26, false, true);  // sent: the compressed size takes over
  policy.onInput(5690000, true);
  EXPECT_EQ(policy.decision().decimation, 9u);  // 2 Hz / (450 kB/s / 1.85 MB) = 8.2
  ShapingPolicy lossless(ShapingParams{});
  lossless.setBudgetKbps(4000.0, "far");
  lossless.onInput(5690000, true);
  EXPECT_EQ(lossless.decision().decimation, 1u) << "lossy not allowed";
}

int main(int argc, char** argv)
{
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
