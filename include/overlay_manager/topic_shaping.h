// Shaping of any topic for a subscriber's path (pure parts, no ROS): lossless compression of a
// serialized message (zstd, with caps a hostile frame cannot pass), point-cloud reduction
// (decimation, voxel grid) on a PointCloud2's bytes after its layout is checked, and the policy
// that turns subscribers' paths, budgets and message sizes into a rate cap and a reduction.
//
// The ROS side (src/topic_shaper.cpp, src/topic_unshaper.cpp) feeds it bytes and reads decisions;
// every function here is O(message) or O(subscribers), does no I/O and is gtested
// (test/cpp/test_topic_shaping.cpp) and fuzzed (test/fuzz/fuzz_shaped_decode.cpp).
//
// Not thread-safe: ZstdCodec and ShapingPolicy are used by one thread at a time (the shaper holds
// a mutex around the policy; each frame thread owns its codec).
#ifndef OVERLAY_MANAGER_TOPIC_SHAPING_H
#define OVERLAY_MANAGER_TOPIC_SHAPING_H

#include "overlay_manager/shaping_core.h"  // CoreSettings
#include "overlay_manager/stream_policy.h"  // paths::k*, SubscriberView (header-only parts)

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace overlay_manager
{
namespace shaping
{

/// Encodings of ShapedMessage.data (overlay_msgs/msg/ShapedMessage.msg ENCODING_*).
const char* const kRaw = "raw";    ///< the serialized message as it is
const char* const kZstd = "zstd";  ///< one zstd frame holding the serialized message

/// Largest serialized message a decoder accepts by default (bytes): 256 MiB, far above a
/// 2-megapixel coloured cloud (64 MB) or a 10,000 x 10,000 grid (100 MB).
const size_t kDefaultMaxMessageBytes = 256u << 20;

/// zstd with one context each way, kept across messages (no allocation per message once warm).
class ZstdCodec
{
public:
  ZstdCodec();
  ~ZstdCodec();
  ZstdCodec(const ZstdCodec&) = delete;
  ZstdCodec& operator=(const ZstdCodec&) = delete;

  /// Compresses `size` bytes at `level` (zstd's levels: 1 fast .. 19; negative = faster still)
  /// into `out` (resized to the frame; the frame records the content size). False with `error`.
  bool compress(const uint8_t* data, size_t size, int level, std::vector<uint8_t>* out, std::string* error);

  /// Decompresses one zstd frame that must hold exactly `expected_size` bytes, at most `max_size`.
  /// Checked before any allocation: the frame header's content size is present and equals
  /// `expected_size`, and `expected_size` <= `max_size`; the frame is single and complete and
  /// carries a checksum (compress() writes one), so corruption is found, not republished. A bomb
  /// (a small frame claiming gigabytes), a lying size, a truncated or corrupt frame: false with
  /// `error`, `out` left empty.
  bool decompress(const uint8_t* data, size_t size, size_t expected_size, size_t max_size, std::vector<uint8_t>* out,
                  std::string* error);

private:
  struct Contexts;
  std::unique_ptr<Contexts> ctx_;
};

/// sensor_msgs/PointField datatypes (its constants), with their sizes in bytes.
enum PointFieldType : uint8_t
{
  kInt8 = 1,
  kUint8 = 2,
  kInt16 = 3,
  kUint16 = 4,
  kInt32 = 5,
  kUint32 = 6,
  kFloat32 = 7,
  kFloat64 = 8
};
/// Size of a PointField datatype in bytes; 0 for an unknown one.
size_t pointFieldSize(uint8_t datatype);

/// One sensor_msgs/PointField.
struct CloudField
{
  std::string name;
  uint32_t offset = 0;
  uint8_t datatype = 0;
  uint32_t count = 1;
};

/// A sensor_msgs/PointCloud2's layout (everything but header and data).
struct CloudLayout
{
  uint32_t height = 0;
  uint32_t width = 0;
  std::vector<CloudField> fields;
  bool is_bigendian = false;
  uint32_t point_step = 0;
  uint32_t row_step = 0;
  bool is_dense = false;
};

/// Transposes `size` bytes by `stride` (byte i of every stride-long element together: the
/// point_step of a cloud puts each field's bytes side by side, which zstd then compresses 1.5x
/// better on real clouds); the tail that fills no whole element is copied as it is. stride < 2
/// copies.
void shuffleBytes(const uint8_t* in, size_t size, uint32_t stride, uint8_t* out);
/// The inverse of shuffleBytes with the same `size` and `stride`.
void unshuffleBytes(const uint8_t* in, size_t size, uint32_t stride, uint8_t* out);

/// Limits a cloud must keep before the shaper reads it.
struct CloudLimits
{
  uint64_t max_points = 50000000ull;  ///< width x height
  uint32_t max_point_step = 4096;     ///< bytes
};

/// "" when `layout` describes `data_size` bytes a reader may walk: point_step > 0 and <= the limit,
/// width x point_step <= row_step, height x row_step <= data_size (overflow-safe: the lie "a
/// million points in 10 bytes" is refused), points within the limit, every field inside a point
/// with a known datatype. Otherwise what is wrong, with the numbers.
std::string checkCloud(const CloudLayout& layout, size_t data_size, const CloudLimits& limits = CloudLimits());

/// Offsets of the float32 x, y and z fields; false when the cloud has not all three (or big-endian
/// data on this little-endian machine).
bool xyzOffsets(const CloudLayout& layout, uint32_t* x, uint32_t* y, uint32_t* z);

/// Keeps every `keep_every`-th point (row by row); the result is unordered (height 1), dense as
/// the input, rows without padding. `layout` must have passed checkCloud. keep_every <= 1 copies.
/// `out_data` is resized in place: a vector reused across calls keeps its buffer.
void decimate(const CloudLayout& layout, const uint8_t* data, uint32_t keep_every, CloudLayout* out_layout,
              std::vector<uint8_t>* out_data);

/// Keeps the first point of every cube of `leaf_m` metres (x, y, z float32 fields; points with a
/// non-finite coordinate are dropped; the result is unordered and dense). False with `error` when
/// the cloud has no float32 x/y/z or leaf_m is not > 0. `layout` must have passed checkCloud.
/// `out_data` is resized in place, as by decimate.
bool voxelFilter(const CloudLayout& layout, const uint8_t* data, double leaf_m, CloudLayout* out_layout,
                 std::vector<uint8_t>* out_data, std::string* error);

/// Lossy reduction a topic allows (ShapingParams::lossy).
enum class Lossy
{
  kNone,      ///< lossless only
  kDecimate,  ///< PointCloud2: keep every n-th point, n chosen to meet the budget (<= max_decimation)
  kVoxel      ///< PointCloud2: one point per voxel_m cube
};
/// "none" | "decimate" | "voxel" -> Lossy; false for anything else.
bool parseLossy(const std::string& word, Lossy* out);
const char* lossyWord(Lossy l);

/// Share of a budget a shaped topic aims at (rate and reduction alike): the rest absorbs the
/// jitter of message sizes.
const double kBudgetShare = 0.9;

/// One shaped topic's settings (parameter names in docs/shaping.md). Rates in Hz, budgets in kbit/s.
struct ShapingParams
{
  double max_rate_hz = 0.0;      ///< never publish faster (0 = no cap: the input's rate)
  /// Budget per path; a path missing here (self, direct) has no budget.
  std::map<std::string, double> budget_kbps = {
      {paths::kDerp, 4000.0},    {paths::kPeerRelay, 20000.0}, {paths::kIdle, 4000.0},
      {paths::kUnknown, 4000.0}, {paths::kOffline, 4000.0}};
  bool compress = true;          ///< zstd (false: raw)
  int zstd_level = 1;            ///< zstd level (1 = fastest of the normal levels)
  Lossy lossy = Lossy::kNone;    ///< what the topic may lose (PointCloud2 only)
  /// Lossy reduction starts only when the lossless stream would be slower than this under the
  /// budget (Hz); the reduction is then chosen to reach it.
  double lossy_below_hz = 2.0;
  uint32_t max_decimation = 64;  ///< decimate: keep at least every max_decimation-th point
  double voxel_m = 0.05;         ///< voxel: cube side (m)
  double size_smoothing = 0.5;   ///< weight of the newest message in the size averages (0..1]
};

/// What the shaper does now.
struct ShapingDecision
{
  double rate_hz = std::numeric_limits<double>::infinity();      ///< rate cap (inf = none)
  double budget_kbps = std::numeric_limits<double>::infinity();  ///< effective budget (inf = none)
  uint32_t decimation = 1;  ///< keep every n-th point (1 = all)
  bool voxel = false;       ///< voxel grid applied
  std::string limited_by;   ///< host (or node) whose budget applies; "" = nothing limits
  std::string reason;       ///< "no budget", "path derp", "observed delivery", "no subscribers"
};

/// Subscribers' budgets and message sizes -> rate cap and reduction. Sizes are of messages as
/// sent (after reduction and compression); the policy normalises them to the full cloud.
class ShapingPolicy
{
public:
  explicit ShapingPolicy(const ShapingParams& params = ShapingParams());
  void setParams(const ShapingParams& params);
  const ShapingParams& params() const { return params_; }

  /// The budget (kbit/s) of one subscriber: its path's, lowered by an observed cap; inf = none.
  double budgetFor(const SubscriberView& sub) const;
  /// New subscribers: the effective budget is the lowest of theirs.
  void setSubscribers(const std::vector<SubscriberView>& subs);
  const std::vector<SubscriberView>& subscribers() const { return subs_; }

  /// The budget of the tier this policy serves (kbit/s; inf = none), when the shaping core decides
  /// who limits it: replaces the subscribers' budgets (setSubscribers).
  void setBudgetKbps(double budget_kbps, const std::string& limited_by);

  /// A message of `input_bytes` (serialized, before shaping) arrives; before the first one is sent
  /// its size is the estimate the reduction is chosen from. `reducible` as in onMessageSent.
  void onInput(size_t input_bytes, bool reducible);

  /// A message was sent: `sent_bytes` on the wire, produced with `decimation` (1 = all points) or
  /// the voxel grid (`voxel`). `reducible`: the message was a cloud the policy may reduce.
  void onMessageSent(size_t sent_bytes, uint32_t decimation, bool voxel, bool reducible);

  const ShapingDecision& decision() const { return decision_; }

  /// Smoothed bytes of a full (unreduced) message as sent; NaN before the first.
  double fullBytes() const { return full_bytes_; }

private:
  void decide();
  ShapingParams params_;
  std::vector<SubscriberView> subs_;
  ShapingDecision decision_;
  bool reducible_ = false;
  bool explicit_budget_ = false;  ///< setBudgetKbps was called: its budget, not the subscribers'
  double budget_kbps_ = std::numeric_limits<double>::infinity();
  std::string limited_by_;
  double full_bytes_ = std::numeric_limits<double>::quiet_NaN();   ///< normalised to decimation 1
  double voxel_bytes_ = std::numeric_limits<double>::quiet_NaN();  ///< messages sent through the voxel grid
  double input_bytes_ = std::numeric_limits<double>::quiet_NaN();  ///< onInput before anything was sent
};

/// The shaping core's settings for a shaped topic: the path budgets of `shaping`, the rate as the
/// only knob (quality pinned), fitted to kBudgetShare of the budget from the last message's size;
/// the skip gate and delivery caps at `max_backlog_ms`, never less than one message of the stream;
/// a budgeted subscriber's connections paced at `pacing_factor` x its path's budget (0 = not paced).
CoreSettings coreSettings(const ShapingParams& shaping, double max_backlog_ms, bool adapt_to_delivery,
                          double pacing_factor);

}  // namespace shaping
}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_TOPIC_SHAPING_H
