// Fuzz target: ImageEncoder::encodeJpeg / encodePng, what the link_aware publisher plugin (inside a
// camera driver) and the standalone encoder run on every raw frame a driver publishes: any width,
// height, step, is_bigendian, encoding (every sensor_msgs/image_encodings name and garbage) and a
// data size that need not match them (fuzz_input.h describes the input; flag kAlt picks PNG).
//
// Checked beyond "no crash, no sanitizer report": only CodecError comes out of the encoder (anything
// else escaping is a bug: libFuzzer reports the uncaught exception); a frame it encodes decodes
// again with ImageDecoder (no CodecError) to a picture of the same width and height.
#include "overlay_manager/image_codec.h"

#include "fuzz_input.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
  fuzz_input::RawFrame f;
  if (!fuzz_input::parse(data, size, &f))
    return 0;
  static overlay_manager::ImageEncoder encoder;
  static overlay_manager::ImageDecoder decoder;

  sensor_msgs::Image in;
  in.header.seq = 7;
  in.header.frame_id = "camera";
  in.encoding = f.encoding;
  in.width = f.width;
  in.height = f.height;
  in.step = f.step;
  in.is_bigendian = (f.flags & fuzz_input::kBigEndian) ? 1 : 0;
  in.data.swap(f.data);  // exactly the claimed size

  const bool png = f.flags & fuzz_input::kAlt;
  sensor_msgs::CompressedImage out;
  try
  {
    if (png)
      encoder.encodePng(in, 1 + f.quality % 9, out);
    else
      encoder.encodeJpeg(in, 1 + f.quality % 100, out);
  }
  catch (const overlay_manager::CodecError&)
  {
    return 0;
  }
  const std::string what = std::string(png ? "PNG" : "JPEG") + " of " + f.encoding.substr(0, 40) + " " +
                           std::to_string(f.width) + "x" + std::to_string(f.height);
  if (out.data.empty())
    fuzz_input::fail(what + ": empty message");
  sensor_msgs::ImagePtr back;
  try
  {
    back = decoder.decode(out);
  }
  catch (const overlay_manager::CodecError& e)
  {
    fuzz_input::fail(what + " (format '" + out.format + "') does not decode: " + e.what());
  }
  if (!back || back->width != f.width || back->height != f.height)
    fuzz_input::fail(what + " decodes to " + (back ? std::to_string(back->width) + "x" + std::to_string(back->height)
                                                   : std::string("nothing")));
  return 0;
}
