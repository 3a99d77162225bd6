// A camera driver for the rostests: publishes ~width x ~height rgb8 frames at ~rate Hz on `image`
// through image_transport::ImageTransport, as real drivers do, so image_transport loads every
// installed publisher plugin in this process (this package's link_aware among them) and each
// encodes only while someone subscribes to its topic.
//
// The frame is a horizontal gradient with noise (large JPEGs), a pure red block at the left and a
// white bar that moves 8 pixels per frame (so video codecs see motion); header.frame_id "camera",
// header.seq counts frames. With ~fresh_noise the noise changes every frame (a scene no codec
// compresses far: video bitrate then follows the encoder's target).
//
// ~lie (space-separated kinds): instead of the camera frame, publish these frames in turn, one per
// period, each with header.frame_id = its kind (test_video_e2e.py: a driver hosting the plugins must
// survive frames that lie about their size, and the plugins refuse them):
//   short_data        1920x1080 bgr8 with 100 bytes of data
//   zero_step         ~width x ~height rgb8 with step 0 (data of the full size)
//   step_lt_width     rgb8 with step one byte less than width x 3 (data step x height)
//   huge              16000x16000 rgb8 claimed, 1000 bytes of data
//   unknown_encoding  an honest rgb8 layout named "no_such_encoding"
//   32FC1             an honest 32FC1 frame (a float image: not a picture the transports encode)
//   yuv422            the camera picture, honest yuv422 (UYVY, BT.601 limited range)
//   bayer_rggb8       the camera picture, honest bayer_rggb8
// The last two are honest: both transports take them (converted to bgr8).
#include <image_transport/image_transport.h>
#include <ros/ros.h>
#include <sensor_msgs/Image.h>
#include <sensor_msgs/image_encodings.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace
{
uint8_t clamp8(double v)
{
  return static_cast<uint8_t>(std::max(0.0, std::min(255.0, v + 0.5)));
}

/// One ~lie frame of `kind` from the rgb8 camera picture `base`; null for an unknown kind.
sensor_msgs::ImagePtr lyingFrame(const std::string& kind, const sensor_msgs::Image& base)
{
  namespace enc = sensor_msgs::image_encodings;
  const uint32_t w = base.width, h = base.height;
  sensor_msgs::ImagePtr img(new sensor_msgs::Image);
  img->header.frame_id = kind;
  img->width = w;
  img->height = h;
  img->encoding = enc::RGB8;
  img->step = w * 3;
  if (kind == "short_data")
  {
    img->width = 1920;
    img->height = 1080;
    img->encoding = enc::BGR8;
    img->step = 1920 * 3;
    img->data.assign(100, 128);
  }
  else if (kind == "zero_step")
  {
    img->step = 0;
    img->data = base.data;
  }
  else if (kind == "step_lt_width")
  {
    img->step = w * 3 - 1;
    img->data.assign(static_cast<size_t>(img->step) * h, 128);
  }
  else if (kind == "huge")
  {
    img->width = img->height = 16000;
    img->step = 16000 * 3;
    img->data.assign(1000, 128);
  }
  else if (kind == "unknown_encoding")
  {
    img->encoding = "no_such_encoding";
    img->data = base.data;
  }
  else if (kind == "32FC1")
  {
    img->encoding = enc::TYPE_32FC1;
    img->step = w * 4;
    std::vector<float> depth(static_cast<size_t>(w) * h, 1.5f);
    img->data.resize(depth.size() * 4);
    std::memcpy(img->data.data(), depth.data(), img->data.size());
  }
  else if (kind == "yuv422")
  {
    // UYVY: per pair of pixels U Y0 V Y1, chroma from the pair's mean
    img->encoding = enc::YUV422;
    img->step = w * 2;
    img->data.assign(static_cast<size_t>(img->step) * h, 128);
    for (uint32_t y = 0; y < h; ++y)
      for (uint32_t x = 0; x + 1 < w; x += 2)
      {
        const uint8_t* p = &base.data[(static_cast<size_t>(y) * w + x) * 3];
        double ys[2], u = 128, v = 128;
        for (int k = 0; k < 2; ++k)
        {
          const double r = p[3 * k], g = p[3 * k + 1], b = p[3 * k + 2];
          ys[k] = 16 + (65.481 * r + 128.553 * g + 24.966 * b) / 255.0;
          u += (-37.797 * r - 74.203 * g + 112.0 * b) / 255.0 / 2;
          v += (112.0 * r - 93.786 * g - 18.214 * b) / 255.0 / 2;
        }
        uint8_t* q = &img->data[static_cast<size_t>(y) * img->step + x * 2];
        q[0] = clamp8(u);
        q[1] = clamp8(ys[0]);
        q[2] = clamp8(v);
        q[3] = clamp8(ys[1]);
      }
  }
  else if (kind == "bayer_rggb8")
  {
    // R G on even rows, G B on odd rows
    img->encoding = enc::BAYER_RGGB8;
    img->step = w;
    img->data.resize(static_cast<size_t>(w) * h);
    for (uint32_t y = 0; y < h; ++y)
      for (uint32_t x = 0; x < w; ++x)
      {
        const int c = (y % 2 == 0) ? (x % 2 == 0 ? 0 : 1) : (x % 2 == 0 ? 1 : 2);
        img->data[static_cast<size_t>(y) * w + x] = base.data[(static_cast<size_t>(y) * w + x) * 3 + c];
      }
  }
  else
    return sensor_msgs::ImagePtr();
  return img;
}
}  // namespace

int main(int argc, char** argv)
{
  ros::init(argc, argv, "camera_driver");
  ros::NodeHandle nh, pnh("~");
  const int width = pnh.param("width", 640), height = pnh.param("height", 480);
  const double rate = pnh.param("rate", 30.0);
  const bool fresh_noise = pnh.param("fresh_noise", false);
  std::vector<std::string> lies;
  {
    std::istringstream words(pnh.param<std::string>("lie", ""));
    for (std::string w; words >> w;)
      lies.push_back(w);
  }
  image_transport::ImageTransport it(nh);
  image_transport::Publisher pub = it.advertise("image", 1);

  sensor_msgs::Image base;
  base.width = width;
  base.height = height;
  base.encoding = sensor_msgs::image_encodings::RGB8;
  base.step = width * 3;
  base.header.frame_id = "camera";
  base.data.resize(static_cast<size_t>(base.step) * height);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> noise(-60, 60);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c)
      {
        int v = 255 * x / width + noise(rng);
        if (x < 80)
          v = c == 0 ? 255 : 0;
        base.data[(static_cast<size_t>(y) * width + x) * 3 + c] = static_cast<uint8_t>(std::max(0, std::min(255, v)));
      }

  for (const std::string& kind : lies)
    if (!lyingFrame(kind, base))
    {
      ROS_FATAL("~lie: unknown kind '%s' (short_data zero_step step_lt_width huge unknown_encoding 32FC1 yuv422 "
                "bayer_rggb8)",
                kind.c_str());
      return 2;
    }

  ros::AsyncSpinner spinner(1);  // connect callbacks, as a driver with a spinner thread has
  spinner.start();
  ros::Rate r(rate);
  for (uint32_t seq = 1; ros::ok(); ++seq)
  {
    if (pub.getNumSubscribers() > 0 && !lies.empty())
    {
      sensor_msgs::ImagePtr img = lyingFrame(lies[(seq - 1) % lies.size()], base);
      img->header.seq = seq;
      img->header.stamp = ros::Time::now();
      pub.publish(img);
    }
    else if (pub.getNumSubscribers() > 0)
    {
      sensor_msgs::ImagePtr img(new sensor_msgs::Image(base));
      if (fresh_noise)
      {
        uint32_t x = seq * 2654435761u + 1;
        for (size_t i = 0; i < img->data.size(); i += 3)
        {
          x ^= x << 13;
          x ^= x >> 17;
          x ^= x << 5;
          if ((i / 3) % width >= 80)  // keep the red block
          {
            const int d = static_cast<int>(x & 63) - 32;
            for (size_t c = 0; c < 3; ++c)
              img->data[i + c] = static_cast<uint8_t>(std::max(0, std::min(255, img->data[i + c] + d)));
          }
        }
      }
      const int bar = width > 116 ? static_cast<int>((seq * 8) % (width - 100)) + 100 : width;  // none when tiny
      for (int y = height / 2; y < std::min(height, height / 2 + 40); ++y)
        for (int x = bar; x < std::min(width, bar + 16); ++x)
          for (int c = 0; c < 3; ++c)
            img->data[(static_cast<size_t>(y) * width + x) * 3 + c] = 255;
      img->header.seq = seq;
      img->header.stamp = ros::Time::now();
      pub.publish(img);
    }
    r.sleep();
  }
  return 0;
}
