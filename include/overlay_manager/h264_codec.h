// Low-latency H.264 for the link-aware camera: an encoder on libavcodec's libx264 wrapper (OpenCV
// converts its input to YUV) and a decoder on libavcodec's h264 decoder (libswscale converts its
// output, following the matrix and range the stream signals). No ROS types.
//
// Encoder settings (see docs/camera.md): x264 preset/tune from H264Params (ultrafast + zerolatency:
// no B-frames, no lookahead, one frame in -> one access unit out), closed GOP of `gop` frames,
// constant rate factor capped by a VBV of max rate = bit rate and a buffer of vbv_s seconds
// (or an average bit rate at that cap with crf 0), SPS and PPS repeated
// in-band before every IDR, Annex B start codes, BT.601 limited-range YUV 4:2:0.
// Odd widths/heights are CROPPED to even (the last column/row is dropped): 4:2:0 chroma and the
// SPS cropping units (2 pixels) cannot describe an odd size, and cropping invents no pixels.
//
// Every access unit the encoder writes carries a frame counter in an SEI message
// (user_data_unregistered with this package's UUID; stock decoders skip it): a stream id drawn when
// the encoder opens and the number of the frame since then. 24 bytes, about 6 kbit/s at 30 Hz.
//
// Decoder: never shows a broken picture. It feeds libavcodec only from the first IDR on (earlier
// packets are reported as "waiting for keyframe", never decoded into a grey/garbage picture).
// libavcodec conceals a lost reference frame silently (it repeats the last reference), so the
// decoder checks the reference chain itself: with the frame counter, a picture is shown only when
// it is the next frame of the same stream after the last one decoded (a gap of any length, a whole
// GOP included, or a new stream id is "missing reference"; a repeated frame is dropped as
// "duplicate"); a stream without the counter (another encoder) is checked by frame_num, which
// cannot see a loss of a multiple of its period. After a loss it waits for the next IDR.
// Before libavcodec sees a byte, a message is checked against ImageLimits (bytes, NAL units, the
// picture size its SPS claims): one message cannot make a viewer allocate gigabytes.
#ifndef OVERLAY_MANAGER_H264_CODEC_H
#define OVERLAY_MANAGER_H264_CODEC_H

#include "overlay_manager/image_rules.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace overlay_manager
{

/// Encoder settings. Sizes in pixels, fps in frames per second, bit rate in kbit/s.
struct H264Params
{
  int width = 0;
  int height = 0;
  double fps = 30;
  int bitrate_kbps = 1500;
  int gop = 30;  ///< keyframe (IDR) interval in frames
  std::string preset = "ultrafast";
  std::string tune = "zerolatency";
  int threads = 1;  ///< x264 threads (sliced threads with zerolatency: no added delay)
  /// VBV buffer in seconds of the bit rate: the most a burst (a keyframe) can exceed the average.
  /// Real 640x480 scene at 1.76 Mbit/s: 1 s gives keyframes of ~59 KB (a quarter second of stream
  /// in one message, a latency spike at the viewer), 0.5 s ~38 KB, 0.25 s ~27 KB but 1.2 dB less
  /// luma PSNR (bench_h264_codec --vbv).
  double vbv_s = 0.5;
  /// x264's constant rate factor (0..51, lower = better), capped by the VBV at `bitrate_kbps`
  /// ("capped CRF"): the picture gets the bits its content needs up to the cap, and a new cap
  /// applies from the next frame. 0 = average bitrate (ABR) at `bitrate_kbps`, which spends the
  /// whole bitrate on any content and, after the bitrate changes, repays the bits it overspent
  /// earlier: on the real scene, ABR recovered over 1 s after 400 -> 1920 kbit/s, capped CRF 23
  /// within 0.5 s; at a 1920 cap CRF 23 used 1574 kbit/s with a better worst frame (35.0 against
  /// 33.4 dB RGB PSNR) than ABR's 1931 kbit/s (bench_h264_codec --crf).
  double crf = 23.0;
  /// Write the frame counter SEI into every access unit (see the top of this file).
  bool frame_counter = true;
  /// Largest picture the encoder accepts (width, height, pixels; the message limits are unused).
  ImageLimits limits;
};

/// One encoded picture.
struct Packet
{
  std::vector<uint8_t> data;  ///< Annex B byte stream, exactly one access unit
  bool keyframe = false;      ///< IDR picture, preceded by SPS and PPS in `data`
  int64_t pts = 0;            ///< the pts passed to encode(), unchanged
};

/// One decoded picture (tightly packed rows: step = width * channels).
struct Frame
{
  int width = 0;
  int height = 0;
  std::string encoding;  ///< sensor_msgs encoding: rgb8, bgr8 or mono8
  int step = 0;          ///< bytes per row
  std::vector<uint8_t> data;
  bool keyframe = false;  ///< decoded from an IDR access unit
};

/// One raw frame converted to what the encoder codes (BT.601 limited-range I420 of its even-cropped
/// size): converted once, it can be encoded by any number of encoders of that size (the tiers of a
/// stream share one conversion a frame). Plain data: one thread at a time.
struct EncoderInput
{
  int width = 0;   ///< the raw frame's width in pixels (the coded width is width & ~1)
  int height = 0;  ///< the raw frame's height in pixels
  /// I420 planes of (width & ~1) x (height & ~1) pixels, packed: luma, then U, then V rows
  std::vector<uint8_t> i420;

  /// Converts a frame of width x height pixels from `size` bytes at `data` (`step` bytes per row,
  /// `encoding` one of rgb8, bgr8, mono8, rgba8, bgra8). False with *error set when the encoding is
  /// unsupported, or the step or size cannot hold the picture, or it exceeds `limits` (nothing is
  /// read past data + size).
  bool convert(const uint8_t* data, size_t size, int width, int height, int step, const std::string& encoding,
               const ImageLimits& limits, std::string* error);
};

/// Encodes raw frames to H.264. encode()/open() from one thread; setBitrate() and
/// requestKeyframe() may be called from any thread (they take effect at the next encode()).
class H264Encoder
{
public:
  H264Encoder();
  ~H264Encoder();
  H264Encoder(const H264Encoder&) = delete;
  H264Encoder& operator=(const H264Encoder&) = delete;

  /// Opens (or reopens, e.g. for a new resolution) the encoder. The next packet is an IDR.
  /// False with *error set (naming the bad setting) when libx264 refuses the parameters.
  bool open(const H264Params& params, std::string* error);
  bool isOpen() const;
  /// The parameters of the open encoder (bit rate: the last one requested).
  H264Params params() const;
  /// The size actually encoded: params' width/height rounded down to even.
  int codedWidth() const;
  int codedHeight() const;

  /// Target average bit rate in kbit/s from the next frame on, without reopening: libavcodec's
  /// libx264 wrapper calls x264_encoder_reconfig when the context's bit rate changes.
  void setBitrate(int kbps);
  /// x264's constant rate factor from the next frame on, without reopening (capped CRF only: a
  /// switch to or from average bitrate, crf 0, needs open()). Any thread.
  void setCrf(double crf);
  /// The next frame is coded as an IDR with SPS/PPS in front.
  void requestKeyframe();

  /// Encodes one frame of params().width x params().height pixels from `size` bytes at `data`;
  /// `step` is bytes per row, `encoding` one of rgb8, bgr8, mono8, rgba8, bgra8. Exactly one
  /// packet comes out per frame. A frame whose step or size cannot hold the picture is refused
  /// (false, *error says which numbers disagree): nothing is read past data + size.
  bool encode(const uint8_t* data, size_t size, int step, const std::string& encoding, int64_t pts, Packet* out,
              std::string* error);
  /// Same, for a frame of width x height: reopens the encoder (keeping the bit rate and the
  /// other settings) when the size differs from the open one.
  bool encode(const uint8_t* data, size_t size, int width, int height, int step, const std::string& encoding,
              int64_t pts, Packet* out, std::string* error);
  /// Same, for a frame converted already (EncoderInput::convert): reopens the encoder when the
  /// size differs from the open one, as the overload above.
  bool encode(const EncoderInput& input, int64_t pts, Packet* out, std::string* error);

  /// Identity of the libavcodec context (for checking that a change did not reopen it).
  const void* codecContext() const;

private:
  /// Encodes `input` with the open encoder (its coded size must match).
  bool encodeOpen(const EncoderInput& input, int64_t pts, Packet* out, std::string* error);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// What the last H264Decoder::decode() call did.
enum class DecodeStatus
{
  kFrame,               ///< a complete picture is in *out
  kNoFrame,             ///< accepted, but no picture (e.g. parameter sets only)
  kWaitingForKeyframe,  ///< dropped: no IDR seen yet since the start or the last loss
  kMissingReference,    ///< dropped: a frame before it was lost (or a new stream began); waiting for an IDR
  kDuplicate,           ///< dropped: the same frame again (the stream stays in sync)
  kRefused,             ///< dropped: over an ImageLimits cap (bytes, NAL units, picture size); waiting for an IDR
  kError,               ///< the data is not decodable H.264; waiting for an IDR
};

/// What a decoder did with the messages it was given, since it was made.
struct DecodeCounts
{
  uint64_t frames = 0;             ///< pictures returned
  uint64_t waiting = 0;            ///< dropped before an IDR (start, or after a loss)
  uint64_t missing_reference = 0;  ///< losses noticed (each starts a wait for an IDR)
  uint64_t duplicates = 0;         ///< repeated frames dropped
  uint64_t refused = 0;            ///< over a limit
  uint64_t errors = 0;             ///< not decodable
  /// all messages that gave no picture except parameter-set-only ones
  uint64_t dropped() const { return waiting + missing_reference + duplicates + refused + errors; }
};

/// Decodes Annex B access units (one per call, as H264Encoder produces them) to rgb8/bgr8/mono8.
/// One instance per stream and thread.
class H264Decoder
{
public:
  /// `encoding` of the output frames: rgb8, bgr8 or mono8; `limits` caps what one message may cost.
  explicit H264Decoder(const std::string& encoding = "bgr8", const ImageLimits& limits = ImageLimits());
  ~H264Decoder();
  H264Decoder(const H264Decoder&) = delete;
  H264Decoder& operator=(const H264Decoder&) = delete;

  /// True when *out holds a complete picture. False otherwise, with *error saying why
  /// ("waiting for keyframe", "missing reference ...", or a decoder error); status() tells which.
  bool decode(const uint8_t* data, size_t size, Frame* out, std::string* error);
  DecodeStatus status() const;
  /// Counters since construction.
  const DecodeCounts& counts() const;
  /// True until the first IDR and after every loss until the next IDR.
  bool waitingForKeyframe() const;
  /// Forget the stream (e.g. on a new publisher): wait for the next IDR.
  void reset();

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// NAL unit types of an Annex B buffer, in order (helper for tests and transports).
std::vector<int> h264NalTypes(const uint8_t* data, size_t size);

/// The frame counter SEI of an access unit, when it has one.
struct FrameCounter
{
  uint32_t stream_id = 0;  ///< drawn when the encoder opened
  uint64_t frame = 0;      ///< frames encoded since then (0 = the first, an IDR)
};
bool h264FrameCounter(const uint8_t* data, size_t size, FrameCounter* out);

/// Where libavcodec's log lines go: `level` is libav's (AV_LOG_ERROR = 16, AV_LOG_WARNING = 24),
/// `key` identifies the message's template (the same text with other numbers has the same key),
/// `line` is the formatted text without the trailing newline. Called from libav's threads.
using LibavLogSink = std::function<void(int level, const void* key, const std::string& line)>;
/// Routes libavcodec's log (process-wide) into `sink` from now on, at `max_level` and below
/// (AV_LOG_ERROR by default: x264's banner and statistics are INFO). An empty sink restores libav's
/// own logger (stderr).
void setLibavLogSink(LibavLogSink sink, int max_level = 16);

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_H264_CODEC_H
