// Fuzz target: ImageDecoder::decode, what a viewer's link_aware subscriber and the decoder node run
// on every JPEG/PNG CompressedImage from the network (ours or compressed_image_transport's).
//
// Input: the first byte picks CompressedImage.format among kFormats (what compressed_image_transport
// and this package write, older and foreign formats, garbage); the rest is the message's data.
// One decoder serves every input, as one serves a whole stream in a subscriber. Limits are small
// for speed (1920x1088 pixels, 4 MiB a message).
//
// Checked beyond "no crash, no sanitizer report": only CodecError comes out of decode() (anything
// else escaping is a bug: libFuzzer reports the uncaught exception); a returned image is within
// the limits, labelled with a real sensor_msgs encoding of 1, 3 or 4 channels at 8 or 16 bits, and
// its step and data hold the picture (step >= width x bytes per pixel, data = step x height).
#include "overlay_manager/image_codec.h"

#include "fuzz_input.h"

#include <sensor_msgs/image_encodings.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace
{
const std::vector<std::string> kFormats = {
  // compressed_image_transport (Noetic) and this package
  "rgb8; jpeg compressed bgr8", "bgr8; jpeg compressed bgr8", "rgba8; jpeg compressed bgr8",
  "bgra8; jpeg compressed bgr8", "mono8; jpeg compressed ", "mono16; jpeg compressed ",
  "rgb16; jpeg compressed bgr8", "bayer_rggb8; jpeg compressed bgr8", "yuv422; jpeg compressed bgr8",
  "rgb8; png compressed bgr8", "bgr8; png compressed bgr8", "rgba8; png compressed bgra8",
  "mono8; png compressed ", "mono16; png compressed ", "bgr16; png compressed bgr16",
  "rgb16; png compressed bgr16", "bgra16; png compressed bgra16", "bayer_bggr16; png compressed bgr16",
  // labels that name what the data cannot hold
  "16UC1; jpeg compressed bgr8", "32FC1; png compressed ", "8UC3; jpeg compressed bgr8",
  // older and foreign formats
  "jpeg", "png", "16UC1; compressedDepth", "32FC1; compressedDepth png", "rgb8; tiff compressed bgr8",
  // garbage
  "", ";", "; jpeg compressed ", "rgb8;jpeg compressed bgr8", "rgb8; jpeg compressed bgr8; png compressed ",
  "nonsense; png compressed nonsense", std::string("rgb8\0; png compressed ", 22), std::string(500, ';'),
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
  if (size < 1)
    return 0;
  static overlay_manager::ImageLimits limits = [] {
    overlay_manager::ImageLimits l;
    l.max_pixels = 1920ull * 1088ull;
    l.max_message_bytes = 4u << 20;
    return l;
  }();
  static overlay_manager::ImageDecoder decoder(limits);

  sensor_msgs::CompressedImage msg;
  msg.format = kFormats[data[0] % kFormats.size()];
  msg.data.assign(data + 1, data + size);  // a heap block of its own size
  sensor_msgs::ImagePtr out;
  try
  {
    out = decoder.decode(msg);
  }
  catch (const overlay_manager::CodecError&)
  {
    return 0;
  }
  if (!out)
    fuzz_input::fail("decode() returned no image and threw nothing");
  int channels = 0, depth = 0;
  try
  {
    channels = sensor_msgs::image_encodings::numChannels(out->encoding);
    depth = sensor_msgs::image_encodings::bitDepth(out->encoding);
  }
  catch (const std::exception&)
  {
    fuzz_input::fail("decoded image labelled '" + out->encoding + "', not a sensor_msgs encoding");
  }
  if ((channels != 1 && channels != 3 && channels != 4) || (depth != 8 && depth != 16))
    fuzz_input::fail("decoded image labelled " + out->encoding + " (" + std::to_string(channels) +
                     " channels, " + std::to_string(depth) + " bits): not a picture a JPEG/PNG holds");
  const uint64_t w = out->width, h = out->height, bpp = uint64_t(channels) * depth / 8;
  if (w == 0 || h == 0 || w * h > limits.max_pixels)
    fuzz_input::fail("decoded image " + std::to_string(w) + "x" + std::to_string(h) + " outside the limits");
  if (uint64_t(out->step) < w * bpp || out->data.size() != uint64_t(out->step) * h)
    fuzz_input::fail("decoded " + out->encoding + " image " + std::to_string(w) + "x" + std::to_string(h) +
                     " has step " + std::to_string(out->step) + " and " + std::to_string(out->data.size()) +
                     " bytes");
  return 0;
}
