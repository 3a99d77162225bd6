// Image <-> CompressedImage in compressed_image_transport's format (see image_codec.h).
#include "overlay_manager/image_codec.h"

#include <cv_bridge/cv_bridge.h>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sensor_msgs/image_encodings.h>
#include <turbojpeg.h>

#include <algorithm>
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

uint32_t bigEndian32(const uint8_t* p)
{
  return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
         (static_cast<uint32_t>(p[2]) << 8) | static_cast<uint32_t>(p[3]);
}

bool isJpeg(const std::vector<uint8_t>& d)
{
  return d.size() >= 4 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF;
}

bool isPng(const std::vector<uint8_t>& d)
{
  static const uint8_t magic[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n' };
  return d.size() >= 8 && std::equal(magic, magic + 8, d.begin());
}

/// The raw frame a codec reads: the message's own pixels (a direct encoding) or a conversion of
/// them to `rule.converted_to` (cv_bridge: 16-bit, Bayer, yuv422). Throws CodecError.
struct Pixels
{
  const unsigned char* data = nullptr;
  int pitch = 0;
  std::string encoding;  ///< of `data`
  cv_bridge::CvImageConstPtr converted;
};

Pixels rawPixels(const sensor_msgs::Image& in, const std::string& codec, const ImageLimits& limits,
                 const std::string& convert_to)
{
  const std::string bad = checkRawImage(in.encoding, in.width, in.height, in.step, in.data.size(), limits);
  if (!bad.empty())
    throw CodecError(codec + ": " + bad);
  Pixels px;
  if (convert_to.empty() || convert_to == in.encoding)
  {
    px.data = in.data.data();
    px.pitch = static_cast<int>(in.step);
    px.encoding = in.encoding;
    return px;
  }
  try
  {
    px.converted = cv_bridge::toCvCopy(in, convert_to);
  }
  catch (const std::exception& e)  // cv_bridge::Exception, cv::Exception
  {
    throw CodecError(codec + ": cannot convert '" + in.encoding + "' to " + convert_to + ": " + e.what());
  }
  px.data = px.converted->image.data;
  px.pitch = static_cast<int>(px.converted->image.step[0]);
  px.encoding = convert_to;
  return px;
}
}  // namespace

ImageEncoder::ImageEncoder(const ImageLimits& limits) : tj_(tjInitCompress()), limits_(limits)
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
  const EncodingRule rule = encodingRule(in.encoding);
  // direct encodings as they are; the others as what they become (bgr8 or mono8), announced as
  // such so every viewer labels the 8-bit picture it decodes correctly
  const Pixels px = rawPixels(in, "JPEG", limits_, rule.support == EncodingSupport::kConverted ? rule.converted_to : "");
  out.header = in.header;
  // Same string as compressed_image_transport: colour input is announced as decoding to bgr8.
  out.format = px.encoding + "; jpeg compressed " + (enc::isColor(px.encoding) ? "bgr8" : "");
  const int pixel_format = turboPixelFormat(px.encoding);
  const int subsamp = pixel_format == TJPF_GRAY ? TJSAMP_GRAY : TJSAMP_420;
  unsigned long size = tjBufSize(static_cast<int>(in.width), static_cast<int>(in.height), subsamp);
  out.data.resize(size);
  unsigned char* dst = out.data.data();
  if (tjCompress2(static_cast<tjhandle>(tj_), px.data, static_cast<int>(in.width), px.pitch,
                  static_cast<int>(in.height), pixel_format, &dst, &size, subsamp, std::max(1, std::min(100, quality)),
                  TJFLAG_NOREALLOC) != 0)
    throw CodecError("libturbojpeg: " + turboError(tj_));
  out.data.resize(size);
}

void ImageEncoder::encodePng(const sensor_msgs::Image& in, int level, sensor_msgs::CompressedImage& out)
{
  const EncodingRule rule = encodingRule(in.encoding);
  // PNG keeps bit depth: colour as bgr8/bgr16 (OpenCV's order), mono as it is, Bayer and yuv422
  // debayered/converted to colour of their depth
  std::string target;
  if (rule.support != EncodingSupport::kRefused && !enc::isMono(in.encoding))
    target = enc::bitDepth(in.encoding) == 16 ? enc::BGR16 : enc::BGR8;
  const Pixels px = rawPixels(in, "PNG", limits_, target);
  out.header = in.header;
  const std::string announced = enc::isColor(in.encoding) || enc::isMono(in.encoding) ? in.encoding : px.encoding;
  out.format = announced + "; png compressed " + target;
  try
  {
    const int type = enc::bitDepth(px.encoding) == 16 ? CV_16UC(enc::numChannels(px.encoding)) :
                                                         CV_8UC(enc::numChannels(px.encoding));
    const cv::Mat image(static_cast<int>(in.height), static_cast<int>(in.width), type,
                        const_cast<unsigned char*>(px.data), static_cast<size_t>(px.pitch));
    cv::Mat bgr = image;
    if (px.encoding == enc::RGB8 || px.encoding == enc::RGB16)
      cv::cvtColor(image, bgr, cv::COLOR_RGB2BGR);
    else if (px.encoding == enc::RGBA8 || px.encoding == enc::RGBA16)
      cv::cvtColor(image, bgr, cv::COLOR_RGBA2BGR);
    else if (px.encoding == enc::BGRA8 || px.encoding == enc::BGRA16)
      cv::cvtColor(image, bgr, cv::COLOR_BGRA2BGR);
    std::vector<int> params = { cv::IMWRITE_PNG_COMPRESSION, std::max(0, std::min(9, level)) };
    if (!cv::imencode(".png", bgr, out.data, params))
      throw CodecError("PNG: OpenCV could not encode a '" + in.encoding + "' image");
  }
  catch (const cv::Exception& e)
  {
    throw CodecError(std::string("PNG: ") + e.what());
  }
}

ImageDecoder::ImageDecoder(const ImageLimits& limits) : tj_(tjInitDecompress()), limits_(limits)
{
  if (!tj_)
    throw CodecError("libturbojpeg: cannot create a decompressor");
}

ImageDecoder::~ImageDecoder()
{
  tjDestroy(static_cast<tjhandle>(tj_));
}

void ImageDecoder::resetTurbo()
{
  // libturbojpeg (2.1) keeps a failed header's state in its handle: every later JPEG then fails
  // with the same error. A new handle forgets it.
  tjhandle fresh = tjInitDecompress();
  if (!fresh)
    return;  // keep the old one: out of memory is not this message's fault
  tjDestroy(static_cast<tjhandle>(tj_));
  tj_ = fresh;
}

sensor_msgs::ImagePtr ImageDecoder::decodeJpeg(const sensor_msgs::CompressedImage& in, const std::string& encoding)
{
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  unsigned char* src = const_cast<unsigned char*>(in.data.data());
  const unsigned long len = in.data.size();
  if (tjDecompressHeader3(static_cast<tjhandle>(tj_), src, len, &width, &height, &subsamp, &colorspace) != 0)
  {
    const std::string why = turboError(tj_);
    resetTurbo();
    throw CodecError("corrupt JPEG header (" + std::to_string(len) + " bytes): " + why);
  }
  const std::string over = limits_.checkPicture(static_cast<uint64_t>(std::max(width, 0)),
                                                static_cast<uint64_t>(std::max(height, 0)));
  if (width <= 0 || height <= 0 || !over.empty())
    throw CodecError("JPEG " + (over.empty() ? "of no pixels" : over));
  // the named raw encoding when libturbojpeg writes it directly, else what the picture is
  std::string out_encoding = encoding;
  if (encodingRule(encoding).support != EncodingSupport::kDirect)
    out_encoding = colorspace == TJCS_GRAY ? enc::MONO8 : enc::BGR8;
  const int pixel_format = turboPixelFormat(out_encoding);
  sensor_msgs::ImagePtr out(new sensor_msgs::Image);
  out->header = in.header;
  out->width = static_cast<uint32_t>(width);
  out->height = static_cast<uint32_t>(height);
  out->encoding = out_encoding;
  out->is_bigendian = 0;
  out->step = static_cast<uint32_t>(width * tjPixelSize[pixel_format]);
  out->data.resize(static_cast<size_t>(out->step) * static_cast<size_t>(height));
  // a warning (a truncated file, a corrupt segment) stops the decoder: never a half-grey picture
  if (tjDecompress2(static_cast<tjhandle>(tj_), src, len, out->data.data(), width, static_cast<int>(out->step),
                    height, pixel_format, TJFLAG_STOPONWARNING) != 0)
  {
    const std::string why = turboError(tj_);
    resetTurbo();
    throw CodecError("truncated or corrupt JPEG (" + std::to_string(len) + " bytes, " + std::to_string(width) + "x" +
                     std::to_string(height) + "): " + why);
  }
  return out;
}

sensor_msgs::ImagePtr ImageDecoder::decodePng(const sensor_msgs::CompressedImage& in, const std::string& encoding)
{
  // IHDR first (8-byte signature, chunk length, "IHDR", width, height): the size before any pixel
  const std::vector<uint8_t>& d = in.data;
  if (d.size() < 33 || std::string(d.begin() + 12, d.begin() + 16) != "IHDR")
    throw CodecError("corrupt PNG: no IHDR chunk (" + std::to_string(d.size()) + " bytes)");
  const uint32_t width = bigEndian32(&d[16]), height = bigEndian32(&d[20]);
  const std::string over = limits_.checkPicture(width, height);
  if (width == 0 || height == 0 || !over.empty())
    throw CodecError("PNG " + (over.empty() ? "of no pixels" : over));
  cv::Mat image;
  try
  {
    image = cv::imdecode(cv::Mat(1, static_cast<int>(d.size()), CV_8UC1, const_cast<uint8_t*>(d.data())),
                         cv::IMREAD_UNCHANGED);
  }
  catch (const cv::Exception& e)
  {
    throw CodecError(std::string("corrupt PNG: ") + e.what());
  }
  if (image.empty() || image.cols != static_cast<int>(width) || image.rows != static_cast<int>(height))
    throw CodecError("truncated or corrupt PNG (" + std::to_string(d.size()) + " bytes, " + std::to_string(width) + "x" +
                     std::to_string(height) + ")");
  if (image.channels() != 1 && image.channels() != 3 && image.channels() != 4)
    throw CodecError("PNG with " + std::to_string(image.channels()) + " channels: not a picture the viewer shows");
  const int depth = image.depth() == CV_16U ? 16 : 8;
  if (image.depth() != CV_8U && image.depth() != CV_16U)
    image.convertTo(image, CV_8U);
  // OpenCV returns BGR(A) or grey; the named encoding when the picture is exactly that
  const std::string label = decodedEncoding(encoding, image.channels(), depth);
  cv_bridge::CvImage cv;
  cv.header = in.header;
  cv.encoding = label;
  if (label == enc::RGB8 || label == enc::RGB16)
    cv::cvtColor(image, cv.image, cv::COLOR_BGR2RGB);
  else if (label == enc::RGBA8 || label == enc::RGBA16)
    cv::cvtColor(image, cv.image, cv::COLOR_BGRA2RGBA);
  else
    cv.image = image;
  return cv.toImageMsg();
}

sensor_msgs::ImagePtr ImageDecoder::decode(const sensor_msgs::CompressedImage& in)
{
  const std::string too_big = limits_.checkMessageBytes(in.data.size());
  if (!too_big.empty())
    throw CodecError(too_big);
  // "<raw encoding>; <jpeg|png> compressed <target>" (compressed_image_transport); the target names
  // OpenCV's channel order, which is what imdecode returns anyway
  const size_t split = in.format.find(';');
  const std::string encoding = split == std::string::npos ? "" : in.format.substr(0, split);
  if (isJpeg(in.data))
    return decodeJpeg(in, encoding);
  if (isPng(in.data))
    return decodePng(in, encoding);
  throw CodecError("data (" + std::to_string(in.data.size()) + " bytes, format '" + in.format.substr(0, 64) +
                   "') is not a JPEG or PNG image");
}

}  // namespace overlay_manager
