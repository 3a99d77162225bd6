// Shaping of any topic (see topic_shaping.h). No ROS.
#include "overlay_manager/topic_shaping.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

namespace overlay_manager
{
namespace shaping
{

struct ZstdCodec::Contexts
{
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ~Contexts()
  {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};

ZstdCodec::ZstdCodec() : ctx_(new Contexts)
{
}

ZstdCodec::~ZstdCodec() = default;

bool ZstdCodec::compress(const uint8_t* data, size_t size, int level, std::vector<uint8_t>* out, std::string* error)
{
  if (!ctx_->c)
  {
    *error = "zstd: no compression context (out of memory)";
    return false;
  }
  level = std::max(ZSTD_minCLevel(), std::min(level, ZSTD_maxCLevel()));
  out->resize(ZSTD_compressBound(size));
  ZSTD_CCtx_reset(ctx_->c, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(ctx_->c, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(ctx_->c, ZSTD_c_contentSizeFlag, 1);
  ZSTD_CCtx_setParameter(ctx_->c, ZSTD_c_checksumFlag, 1);  // corruption on the way is found, not republished
  const size_t n = ZSTD_compress2(ctx_->c, out->data(), out->size(), data, size);
  if (ZSTD_isError(n))
  {
    *error = std::string("zstd compression failed: ") + ZSTD_getErrorName(n);
    out->clear();
    return false;
  }
  out->resize(n);
  return true;
}

bool ZstdCodec::decompress(const uint8_t* data, size_t size, size_t expected_size, size_t max_size,
                           std::vector<uint8_t>* out, std::string* error)
{
  out->clear();
  if (!ctx_->d)
  {
    *error = "zstd: no decompression context (out of memory)";
    return false;
  }
  if (expected_size > max_size)
  {
    *error = "message of " + std::to_string(expected_size) + " bytes is over the limit of " +
             std::to_string(max_size) + " bytes (max_message_bytes)";
    return false;
  }
  const unsigned long long content = ZSTD_getFrameContentSize(data, size);
  if (content == ZSTD_CONTENTSIZE_ERROR)
  {
    *error = "not a zstd frame (" + std::to_string(size) + " bytes)";
    return false;
  }
  if (content == ZSTD_CONTENTSIZE_UNKNOWN)
  {
    *error = "zstd frame without its content size (not written by this package's shaper)";
    return false;
  }
  if (content != expected_size)
  {
    *error = "zstd frame holds " + std::to_string(content) + " bytes but the message says raw_size " +
             std::to_string(expected_size);
    return false;
  }
  // RFC 8878 3.1.1: magic number, then the frame header descriptor, whose bit 2 is the
  // Content_Checksum_flag (ZSTD_getFrameContentSize above has checked the magic and the header)
  if (size < 5 || !((data[4] >> 2) & 1))
  {
    *error = "zstd frame without a checksum (not written by this package's shaper: corruption could not be found)";
    return false;
  }
  const size_t frame = ZSTD_findFrameCompressedSize(data, size);
  if (ZSTD_isError(frame) || frame != size)
  {
    *error = ZSTD_isError(frame) ? std::string("truncated or corrupt zstd frame: ") + ZSTD_getErrorName(frame) :
                                   "zstd data is not one frame (" + std::to_string(size - frame) + " bytes after it)";
    return false;
  }
  out->resize(expected_size);
  ZSTD_DCtx_reset(ctx_->d, ZSTD_reset_session_and_parameters);
  // a window bigger than the message is a lie as well: 2^27 covers the 256 MiB default's frames
  ZSTD_DCtx_setParameter(ctx_->d, ZSTD_d_windowLogMax, 27);
  const size_t n = ZSTD_decompressDCtx(ctx_->d, out->data(), out->size(), data, size);
  if (ZSTD_isError(n) || n != expected_size)
  {
    *error = ZSTD_isError(n) ? std::string("corrupt zstd frame: ") + ZSTD_getErrorName(n) :
                               "zstd frame gave " + std::to_string(n) + " bytes, not " + std::to_string(expected_size);
    out->clear();
    return false;
  }
  return true;
}

void shuffleBytes(const uint8_t* in, size_t size, uint32_t stride, uint8_t* out)
{
  if (stride < 2)
  {
    std::memcpy(out, in, size);
    return;
  }
  const size_t n = size / stride;
  for (size_t e = 0; e < n; ++e)
    for (uint32_t b = 0; b < stride; ++b)
      out[b * n + e] = in[e * stride + b];
  std::memcpy(out + n * stride, in + n * stride, size - n * stride);
}

void unshuffleBytes(const uint8_t* in, size_t size, uint32_t stride, uint8_t* out)
{
  if (stride < 2)
  {
    std::memcpy(out, in, size);
    return;
  }
  const size_t n = size / stride;
  for (size_t e = 0; e < n; ++e)
    for (uint32_t b = 0; b < stride; ++b)
      out[e * stride + b] = in[b * n + e];
  std::memcpy(out + n * stride, in + n * stride, size - n * stride);
}

size_t pointFieldSize(uint8_t datatype)
{
  switch (datatype)
  {
    case kInt8:
    case kUint8:
      return 1;
    case kInt16:
    case kUint16:
      return 2;
    case kInt32:
    case kUint32:
    case kFloat32:
      return 4;
    case kFloat64:
      return 8;
    default:
      return 0;
  }
}

std::string checkCloud(const CloudLayout& l, size_t data_size, const CloudLimits& limits)
{
  const std::string dims = std::to_string(l.width) + "x" + std::to_string(l.height) + " points, point_step " +
                           std::to_string(l.point_step) + ", row_step " + std::to_string(l.row_step) + ", " +
                           std::to_string(data_size) + " data bytes";
  if (l.point_step == 0 || l.point_step > limits.max_point_step)
    return "point_step " + std::to_string(l.point_step) + " is not in 1.." + std::to_string(limits.max_point_step) +
           " (" + dims + ")";
  const uint64_t points = static_cast<uint64_t>(l.width) * l.height;
  if (points > limits.max_points)
    return std::to_string(points) + " points are over the limit of " + std::to_string(limits.max_points) + " (" +
           dims + ")";
  if (static_cast<uint64_t>(l.width) * l.point_step > l.row_step)
    return "row_step is shorter than width x point_step (" + dims + ")";
  if (static_cast<uint64_t>(l.height) * l.row_step > data_size)
    return "height x row_step is more than the data holds (" + dims + ")";
  for (const CloudField& f : l.fields)
  {
    const size_t s = pointFieldSize(f.datatype);
    if (s == 0)
      return "field '" + f.name + "' has unknown datatype " + std::to_string(f.datatype);
    if (static_cast<uint64_t>(f.offset) + static_cast<uint64_t>(s) * f.count > l.point_step)
      return "field '" + f.name + "' (offset " + std::to_string(f.offset) + ", count " + std::to_string(f.count) +
             ") reaches past point_step " + std::to_string(l.point_step);
  }
  return "";
}

bool xyzOffsets(const CloudLayout& l, uint32_t* x, uint32_t* y, uint32_t* z)
{
  if (l.is_bigendian)
    return false;
  int found = 0;
  for (const CloudField& f : l.fields)
  {
    if (f.datatype != kFloat32 || f.count < 1)
      continue;
    if (f.name == "x")
      *x = f.offset, found |= 1;
    else if (f.name == "y")
      *y = f.offset, found |= 2;
    else if (f.name == "z")
      *z = f.offset, found |= 4;
  }
  return found == 7;
}

namespace
{
CloudLayout unordered(const CloudLayout& in, uint32_t points)
{
  CloudLayout out = in;
  out.height = 1;
  out.width = points;
  out.row_step = points * in.point_step;
  return out;
}
}  // namespace

void decimate(const CloudLayout& l, const uint8_t* data, uint32_t keep_every, CloudLayout* out_layout,
              std::vector<uint8_t>* out_data)
{
  keep_every = std::max<uint32_t>(1, keep_every);
  const uint64_t total = static_cast<uint64_t>(l.width) * l.height;
  const uint64_t kept = (total + keep_every - 1) / keep_every;
  out_data->resize(kept * l.point_step);
  uint8_t* dst = out_data->data();
  uint64_t n = 0;
  for (uint64_t i = 0; i < total; i += keep_every, ++n)
  {
    const uint64_t row = i / l.width, col = i % l.width;
    std::memcpy(dst + n * l.point_step, data + row * l.row_step + col * l.point_step, l.point_step);
  }
  *out_layout = unordered(l, static_cast<uint32_t>(n));
}

bool voxelFilter(const CloudLayout& l, const uint8_t* data, double leaf_m, CloudLayout* out_layout,
                 std::vector<uint8_t>* out_data, std::string* error)
{
  uint32_t ox = 0, oy = 0, oz = 0;
  if (!xyzOffsets(l, &ox, &oy, &oz))
  {
    *error = "voxel grid needs little-endian float32 fields x, y and z";
    return false;
  }
  if (!(leaf_m > 0.0) || !std::isfinite(leaf_m))
  {
    *error = "voxel_m must be > 0 m, got " + std::to_string(leaf_m);
    return false;
  }
  const double inv = 1.0 / leaf_m;
  // 21 bits per axis: cells beyond +-2^20 leaves (e.g. 52 km at 5 cm) share the edge cells
  const auto cell = [inv](float v) -> uint64_t {
    const double c = std::floor(v * inv);
    const double lim = 1048575.0;
    return static_cast<uint64_t>(static_cast<int64_t>(std::max(-lim, std::min(lim, c))) + 1048576) & 0x1fffff;
  };
  std::unordered_set<uint64_t> seen;
  const uint64_t total = static_cast<uint64_t>(l.width) * l.height;
  seen.reserve(static_cast<size_t>(std::min<uint64_t>(total, 1u << 20)));
  out_data->resize(total * l.point_step);
  uint8_t* dst = out_data->data();
  uint64_t n = 0;
  for (uint32_t row = 0; row < l.height; ++row)
    for (uint32_t col = 0; col < l.width; ++col)
    {
      const uint8_t* p = data + static_cast<uint64_t>(row) * l.row_step + static_cast<uint64_t>(col) * l.point_step;
      float x, y, z;
      std::memcpy(&x, p + ox, 4);
      std::memcpy(&y, p + oy, 4);
      std::memcpy(&z, p + oz, 4);
      if (!std::isfinite(x) || !std::isfinite(y) || !std::isfinite(z))
        continue;
      const uint64_t key = (cell(x) << 42) | (cell(y) << 21) | cell(z);
      if (!seen.insert(key).second)
        continue;
      std::memcpy(dst + n * l.point_step, p, l.point_step);
      ++n;
    }
  out_data->resize(n * l.point_step);
  *out_layout = unordered(l, static_cast<uint32_t>(n));
  out_layout->is_dense = true;
  return true;
}

bool parseLossy(const std::string& word, Lossy* out)
{
  if (word == "none")
    *out = Lossy::kNone;
  else if (word == "decimate")
    *out = Lossy::kDecimate;
  else if (word == "voxel")
    *out = Lossy::kVoxel;
  else
    return false;
  return true;
}

const char* lossyWord(Lossy l)
{
  switch (l)
  {
    case Lossy::kDecimate:
      return "decimate";
    case Lossy::kVoxel:
      return "voxel";
    default:
      return "none";
  }
}

ShapingPolicy::ShapingPolicy(const ShapingParams& params) : params_(params)
{
  decide();
}

void ShapingPolicy::setParams(const ShapingParams& params)
{
  params_ = params;
  decide();
}

double ShapingPolicy::budgetFor(const SubscriberView& sub) const
{
  double b = std::numeric_limits<double>::infinity();
  auto it = params_.budget_kbps.find(sub.path);
  if (it != params_.budget_kbps.end() && it->second > 0.0)
    b = it->second;
  if (sub.observed_cap_kbps > 0.0)  // NaN: false
    b = std::min(b, sub.observed_cap_kbps);
  return b;
}

void ShapingPolicy::setSubscribers(const std::vector<SubscriberView>& subs)
{
  subs_ = subs;
  explicit_budget_ = false;
  decide();
}

void ShapingPolicy::setBudgetKbps(double budget_kbps, const std::string& limited_by)
{
  explicit_budget_ = true;
  subs_.clear();
  budget_kbps_ = budget_kbps > 0.0 ? budget_kbps : std::numeric_limits<double>::infinity();
  limited_by_ = limited_by;
  decide();
}

void ShapingPolicy::onInput(size_t input_bytes, bool reducible)
{
  if (!std::isnan(full_bytes_) || !std::isnan(voxel_bytes_))
    return;  // sizes sent say more
  input_bytes_ = static_cast<double>(input_bytes);
  reducible_ = reducible;
  decide();
}

CoreSettings coreSettings(const ShapingParams& shaping, double max_backlog_ms, bool adapt_to_delivery,
                          double pacing_factor)
{
  CoreSettings c;
  PolicyParams& p = c.policy;
  p.budget_kbps = shaping.budget_kbps;
  p.max_rate_hz = shaping.max_rate_hz > 0.0 ? shaping.max_rate_hz : 1000.0;
  p.min_rate_hz = 0.01;                // a heavy message may be slow: the budget decides
  p.min_quality = p.max_quality = 90;  // no quality steps: the policy fits the rate to the size sent
  p.raise_below = kBudgetShare;        // the rate aims at this share of the budget
  p.size_smoothing = 1.0;              // the rate follows the last size: a reduction step acts at once
  // the skip gate's measure (a budgeted tier's stream) and no cap on a full tier
  p.video_share = 1.0;
  p.min_video_kbps = 1.0;
  p.max_video_kbps = 1e7;
  c.adapt_to_delivery = adapt_to_delivery;
  c.max_backlog_ms = max_backlog_ms;
  c.min_backlog_messages = 1.0;  // the newest message on its way is no backlog
  c.pacing_factor = pacing_factor;
  return c;
}

void ShapingPolicy::onMessageSent(size_t sent_bytes, uint32_t decimation, bool voxel, bool reducible)
{
  reducible_ = reducible;
  const double a = std::max(0.01, std::min(1.0, params_.size_smoothing));
  const auto blend = [a](double old, double now) { return std::isnan(old) ? now : a * now + (1.0 - a) * old; };
  if (voxel)
    voxel_bytes_ = blend(voxel_bytes_, static_cast<double>(sent_bytes));
  else
    full_bytes_ = blend(full_bytes_, static_cast<double>(sent_bytes) * std::max<uint32_t>(1, decimation));
  decide();
}

void ShapingPolicy::decide()
{
  ShapingDecision d;
  const double max_rate = params_.max_rate_hz > 0.0 ? params_.max_rate_hz : std::numeric_limits<double>::infinity();
  d.rate_hz = max_rate;
  if (explicit_budget_)
  {
    d.budget_kbps = budget_kbps_;
    d.limited_by = limited_by_;
    d.reason = "budget";
  }
  else if (subs_.empty())
  {
    d.reason = "no subscribers";
    decision_ = d;
    return;
  }
  for (const SubscriberView& s : subs_)
  {
    const double b = budgetFor(s);
    if (b < d.budget_kbps)
    {
      d.budget_kbps = b;
      d.limited_by = s.host.empty() ? s.node : s.host;
      d.reason = s.observed_cap_kbps > 0.0 && s.observed_cap_kbps <= b ? "observed delivery" : "path " + s.path;
    }
  }
  if (std::isinf(d.budget_kbps))
  {
    d.reason = "no budget";
    decision_ = d;
    return;
  }
  const bool sent_none = std::isnan(full_bytes_) && std::isnan(voxel_bytes_);
  if (sent_none && std::isnan(input_bytes_))
  {
    // nothing seen yet: one message goes out at once, then the rate follows its size
    decision_ = d;
    return;
  }
  // the stream aims at kBudgetShare of the budget, as the shaping core's rate does
  const double budget_bytes_s = kBudgetShare * d.budget_kbps * 1000.0 / 8.0;
  // before the first message is sent, its uncompressed size stands in for it (an upper bound): a
  // cloud's first message is reduced like the next ones instead of going out whole, seconds of
  // the budget at once
  const double full = sent_none ? input_bytes_ : std::isnan(full_bytes_) ? voxel_bytes_ : full_bytes_;
  const double lossless_hz = budget_bytes_s / std::max(1.0, full);
  d.rate_hz = std::min(max_rate, lossless_hz);
  if (reducible_ && params_.lossy != Lossy::kNone && lossless_hz < params_.lossy_below_hz)
  {
    if (params_.lossy == Lossy::kDecimate)
    {
      const double want = std::ceil(params_.lossy_below_hz / lossless_hz);
      d.decimation = static_cast<uint32_t>(std::min<double>(std::max<uint32_t>(1, params_.max_decimation), want));
      d.rate_hz = std::min(max_rate, budget_bytes_s / std::max(1.0, full / d.decimation));
    }
    else
    {
      d.voxel = true;
      // no voxel-grid message measured yet: try the rate asked for, the next size corrects it
      d.rate_hz = std::isnan(voxel_bytes_) ? std::min(max_rate, params_.lossy_below_hz) :
                                             std::min(max_rate, budget_bytes_s / std::max(1.0, voxel_bytes_));
    }
    d.reason += ", lossy";
  }
  decision_ = d;
}

}  // namespace shaping
}  // namespace overlay_manager
