// A camera driver for the rostests: publishes ~width x ~height rgb8 frames at ~rate Hz on `image`
// through image_transport::ImageTransport, as real drivers do, so image_transport loads every
// installed publisher plugin in this process (this package's link_aware among them) and each
// encodes only while someone subscribes to its topic.
//
// The frame is a horizontal gradient with noise (large JPEGs), a pure red block at the left and a
// white bar that moves 8 pixels per frame (so video codecs see motion); header.frame_id "camera",
// header.seq counts frames. With ~fresh_noise the noise changes every frame (a scene no codec
// compresses far: video bitrate then follows the encoder's target).
#include <image_transport/image_transport.h>
#include <ros/ros.h>
#include <sensor_msgs/Image.h>
#include <sensor_msgs/image_encodings.h>

#include <random>

int main(int argc, char** argv)
{
  ros::init(argc, argv, "camera_driver");
  ros::NodeHandle nh, pnh("~");
  const int width = pnh.param("width", 640), height = pnh.param("height", 480);
  const double rate = pnh.param("rate", 30.0);
  const bool fresh_noise = pnh.param("fresh_noise", false);
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

  ros::AsyncSpinner spinner(1);  // connect callbacks, as a driver with a spinner thread has
  spinner.start();
  ros::Rate r(rate);
  for (uint32_t seq = 1; ros::ok(); ++seq)
  {
    if (pub.getNumSubscribers() > 0)
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
      const int bar = static_cast<int>((seq * 8) % (width - 100)) + 100;
      for (int y = height / 2; y < height / 2 + 40; ++y)
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
