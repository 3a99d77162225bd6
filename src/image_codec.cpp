// Image <-> CompressedImage in compressed_image_transport's format (see image_codec.h).
#include "overlay_manager/image_codec.h"

#include <cv_bridge/cv_bridge.h>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sensor_msgs/image_encodings.h>
#include <turbojpeg.h>

#include <vector>

namespace enc = sensor_msgs::image_encodings;

namespace overlay_manager
{
namespace
{
/// libturbojpeg pixel format for an 8-bit encoding it reads directly; -1 = none.
int turboPixelFormat(const std::string& encoding)
{
  if (encoding == enc::RGB8)
    return TJPF_RGB;
  if (encoding == enc::BGR8)
    return TJPF_BGR;
  if (encoding == enc::RGBA8)
    return TJPF_RGBA;
  if (encoding == enc::BGRA8)
    return TJPF_BGRA;
  if (encoding == enc::MONO8)
    return TJPF_GRAY;
  return -1;
}

std::string turboError(void* tj)
{
  return tjGetErrorStr2(static_cast<tjhandle>(tj));
}
}  // namespace

ImageEncoder::ImageEncoder() : tj_(tjInitCompress())
{
  if (!tj_)
    throw CodecError("libturbojpeg: cannot create a compressor");
}

ImageEncoder::~ImageEncoder()
{
  tjDestroy(static_cast<tjhandle>(tj_));
}

void ImageEncoder::encodeJpeg(const sensor_msgs::Image& in, int quality, sensor_msgs::CompressedImage& out)
{
  const int bit_depth = enc::bitDepth(in.encoding);  // throws std::runtime_error on unknown names
  if (bit_depth != 8 && bit_depth != 16)
    throw CodecError("JPEG needs an 8- or 16-bit image, got encoding '" + in.encoding + "'");
  if (in.width == 0 || in.height == 0)
    throw CodecError("JPEG: empty image (" + std::to_string(in.width) + "x" + std::to_string(in.height) + ")");
  out.header = in.header;
  // Same string as compressed_image_transport: colour input is announced as decoding to bgr8.
  out.format = in.encoding + "; jpeg compressed " + (enc::isColor(in.encoding) ? "bgr8" : "");

  const unsigned char* pixels = in.data.data();
  int pitch = static_cast<int>(in.step);
  int pixel_format = turboPixelFormat(in.encoding);
  cv_bridge::CvImageConstPtr converted;
  if (pixel_format < 0)
  {
    if (!enc::isColor(in.encoding) && !enc::isMono(in.encoding))
      throw CodecError("JPEG: unsupported encoding '" + in.encoding + "' (colour or mono, 8/16 bit)");
    // 16-bit colour/mono and Bayer etc.: the same conversion compressed_image_transport does.
    converted = cv_bridge::toCvCopy(in, enc::isColor(in.encoding) ? enc::BGR8 : enc::MONO8);
    pixels = converted->image.data;
    pitch = static_cast<int>(converted->image.step[0]);
    pixel_format = enc::isColor(in.encoding) ? TJPF_BGR : TJPF_GRAY;
  }
  if (static_cast<size_t>(pitch) * in.height > in.data.size() && !converted)
    throw CodecError("JPEG: image data (" + std::to_string(in.data.size()) + " bytes) shorter than step x height");

  const int subsamp = pixel_format == TJPF_GRAY ? TJSAMP_GRAY : TJSAMP_420;
  unsigned long size = tjBufSize(static_cast<int>(in.width), static_cast<int>(in.height), subsamp);
  out.data.resize(size);
  unsigned char* dst = out.data.data();
  if (tjCompress2(static_cast<tjhandle>(tj_), pixels, static_cast<int>(in.width), pitch,
                  static_cast<int>(in.height), pixel_format, &dst, &size, subsamp, quality,
                  TJFLAG_NOREALLOC) != 0)
    throw CodecError("libturbojpeg: " + turboError(tj_));
  out.data.resize(size);
}

void ImageEncoder::encodePng(const sensor_msgs::Image& in, int level, sensor_msgs::CompressedImage& out)
{
  const int bit_depth = enc::bitDepth(in.encoding);
  if (bit_depth != 8 && bit_depth != 16)
    throw CodecError("PNG needs an 8- or 16-bit image, got encoding '" + in.encoding + "'");
  out.header = in.header;
  std::string target;
  if (enc::isColor(in.encoding))
    target = "bgr" + std::to_string(bit_depth);
  out.format = in.encoding + "; png compressed " + target;
  try
  {
    cv_bridge::CvImageConstPtr cv = cv_bridge::toCvCopy(in, target);
    std::vector<int> params = {cv::IMWRITE_PNG_COMPRESSION, level};
    if (!cv::imencode(".png", cv->image, out.data, params))
      throw CodecError("PNG: OpenCV could not encode a '" + in.encoding + "' image");
  }
  catch (const cv_bridge::Exception& e)
  {
    throw CodecError(std::string("PNG: ") + e.what());
  }
  catch (const cv::Exception& e)
  {
    throw CodecError(std::string("PNG: ") + e.what());
  }
}

ImageDecoder::ImageDecoder() : tj_(tjInitDecompress())
{
  if (!tj_)
    throw CodecError("libturbojpeg: cannot create a decompressor");
}

ImageDecoder::~ImageDecoder()
{
  tjDestroy(static_cast<tjhandle>(tj_));
}

sensor_msgs::ImagePtr ImageDecoder::decodeTurbo(const sensor_msgs::CompressedImage& in, const std::string& encoding)
{
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  unsigned char* src = const_cast<unsigned char*>(in.data.data());
  const unsigned long len = in.data.size();
  if (tjDecompressHeader3(static_cast<tjhandle>(tj_), src, len, &width, &height, &subsamp, &colorspace) != 0)
    return sensor_msgs::ImagePtr();
  std::string out_encoding = encoding;
  int pixel_format = turboPixelFormat(encoding);
  if (encoding.empty())  // old publishers did not say: grey stays grey, colour becomes rgb8
  {
    out_encoding = colorspace == TJCS_GRAY ? enc::MONO8 : enc::RGB8;
    pixel_format = turboPixelFormat(out_encoding);
  }
  if (pixel_format < 0)
    return sensor_msgs::ImagePtr();
  sensor_msgs::ImagePtr out(new sensor_msgs::Image);
  out->header = in.header;
  out->width = width;
  out->height = height;
  out->encoding = out_encoding;
  out->is_bigendian = 0;
  out->step = width * tjPixelSize[pixel_format];
  out->data.resize(static_cast<size_t>(out->step) * height);
  if (tjDecompress2(static_cast<tjhandle>(tj_), src, len, out->data.data(), width, out->step, height, pixel_format, 0) != 0)
    return sensor_msgs::ImagePtr();
  return out;
}

sensor_msgs::ImagePtr ImageDecoder::decode(const sensor_msgs::CompressedImage& in)
{
  std::string encoding;
  std::string compressed;
  const size_t split = in.format.find(';');
  if (split != std::string::npos)
  {
    encoding = in.format.substr(0, split);
    compressed = in.format.substr(split);
  }
  if (in.data.size() > 4 && in.data[0] == 0xFF && in.data[1] == 0xD8)
  {
    sensor_msgs::ImagePtr out = decodeTurbo(in, encoding);
    if (out)
      return out;
  }
  // PNG, 16-bit and anything libturbojpeg declined: OpenCV, then undo its BGR channel order.
  cv_bridge::CvImage cv;
  cv.header = in.header;
  try
  {
    cv.image = cv::imdecode(cv::Mat(in.data), cv::IMREAD_UNCHANGED);
  }
  catch (const cv::Exception& e)
  {
    throw CodecError(std::string("decode: ") + e.what());
  }
  if (cv.image.empty())
    throw CodecError("decode: data (" + std::to_string(in.data.size()) + " bytes, format '" + in.format +
                     "') is not a JPEG or PNG image");
  if (encoding.empty())
  {
    encoding = cv.image.channels() == 1 ? enc::MONO8 : enc::BGR8;
  }
  else if (enc::isColor(encoding))
  {
    const bool bgr = compressed.find("compressed bgr") != std::string::npos;
    if (bgr && (encoding == enc::RGB8 || encoding == enc::RGB16))
      cv::cvtColor(cv.image, cv.image, cv::COLOR_BGR2RGB);
    else if (bgr && (encoding == enc::RGBA8 || encoding == enc::RGBA16))
      cv::cvtColor(cv.image, cv.image, cv::COLOR_BGR2RGBA);
    else if (bgr && (encoding == enc::BGRA8 || encoding == enc::BGRA16))
      cv::cvtColor(cv.image, cv.image, cv::COLOR_BGR2BGRA);
    else if (!bgr && (encoding == enc::BGR8 || encoding == enc::BGR16))
      cv::cvtColor(cv.image, cv.image, cv::COLOR_RGB2BGR);
  }
  cv.encoding = encoding;
  return cv.toImageMsg();
}

}  // namespace overlay_manager
