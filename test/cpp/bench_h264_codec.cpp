// Benchmark of the H.264 codec (not a test; docs/bench.md "H.264 codec"): encodes a real video
// scaled to 640x480 at several bit rates and reports the produced bit rate, the quality (PSNR of
// the decoded frames against the raw scaled frames) and the encoder's time and CPU share.
//
//   rosrun overlay_manager bench_h264_codec [--video PATH] [--frames N] [--fps 30]
//       [--bitrates 800,1500,3000] [--preset ultrafast] [--tune zerolatency] [--gop 30] [--realtime]
//       [--encoding rgb8|bgr8] [--vbv 0.25]
//
// --realtime paces the frames at --fps (cold caches between frames, like a camera); without it the
// frames go back to back. CPU time is the process's, every thread (CLOCK_PROCESS_CPUTIME_ID), around
// encode(), which includes the conversion from --encoding (bgr8 default; rgb8 is what most cameras and
// the lab's camera send) to YUV 4:2:0; "% core" = CPU time per frame x fps.
#include "overlay_manager/h264_codec.h"

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace
{
/// CPU time of the whole process (every thread: OpenCV's colour conversion may run on its pool).
/// Nothing else runs while encode() does, so the difference around it is the encoder's.
double processCpuSeconds()
{
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double lumaPsnr(const cv::Mat& a, const cv::Mat& b)
{
  cv::Mat ya, yb;
  cv::cvtColor(a, ya, cv::COLOR_BGR2GRAY);
  cv::cvtColor(b, yb, cv::COLOR_BGR2GRAY);
  return cv::PSNR(ya, yb);
}

int usage(const char* why)
{
  std::fprintf(stderr,
               "bench_h264_codec: %s\nusage: bench_h264_codec [--video PATH] [--frames N] [--fps F] "
               "[--bitrates K1,K2,..] [--preset P] [--tune T] [--gop N] [--realtime] [--encoding rgb8|bgr8] [--vbv S]\n",
               why);
  return 2;
}
}  // namespace

int main(int argc, char** argv)
{
  std::string video = "/usr/share/doc/opencv-doc/examples/data/vtest.avi";
  int max_frames = 0;  // 0 = the whole video
  double fps = 30;
  std::vector<int> bitrates = { 800, 1500, 3000 };
  overlay_manager::H264Params base;
  base.width = 640;
  base.height = 480;
  bool realtime = false;
  std::string encoding = "bgr8";
  for (int i = 1; i < argc; ++i)
  {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--video")
      video = next();
    else if (a == "--frames")
      max_frames = std::atoi(next().c_str());
    else if (a == "--fps")
      fps = std::atof(next().c_str());
    else if (a == "--preset")
      base.preset = next();
    else if (a == "--tune")
      base.tune = next();
    else if (a == "--gop")
      base.gop = std::atoi(next().c_str());
    else if (a == "--crf")
      base.crf = std::atof(next().c_str());
    else if (a == "--vbv")
      base.vbv_s = std::atof(next().c_str());
    else if (a == "--encoding")
      encoding = next();
    else if (a == "--realtime")
      realtime = true;
    else if (a == "--bitrates")
    {
      bitrates.clear();
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ','))
        bitrates.push_back(std::atoi(item.c_str()));
    }
    else
      return usage(("unknown argument " + a).c_str());
  }
  if (fps <= 0 || bitrates.empty())
    return usage("--fps must be positive and --bitrates non-empty");
  if (encoding != "bgr8" && encoding != "rgb8")
    return usage("--encoding must be rgb8 or bgr8");
  base.fps = fps;

  std::vector<cv::Mat> frames;
  cv::VideoCapture cap(video);
  cv::Mat raw;
  while ((max_frames <= 0 || static_cast<int>(frames.size()) < max_frames) && cap.read(raw))
  {
    cv::Mat scaled;
    cv::resize(raw, scaled, cv::Size(base.width, base.height), 0, 0, cv::INTER_AREA);
    frames.push_back(scaled);
  }
  std::vector<cv::Mat> inputs;  // what the encoder gets, in --encoding (frames stay bgr8: the reference)
  for (const cv::Mat& m : frames)
  {
    cv::Mat in;
    if (encoding == "rgb8")
      cv::cvtColor(m, in, cv::COLOR_BGR2RGB);
    else
      in = m;
    inputs.push_back(in);
  }
  if (frames.empty())
  {
    std::fprintf(stderr, "bench_h264_codec: cannot read frames from %s (install opencv-doc or pass --video)\n",
                 video.c_str());
    return 1;
  }
  std::printf("video %s: %zu frames scaled to %dx%d, played at %.0f Hz%s; preset %s, tune %s, gop %d, "
              "threads %d, input %s, VBV %.2f s\n",
              video.c_str(), frames.size(), base.width, base.height, fps, realtime ? " (paced)" : " (back to back)",
              base.preset.c_str(), base.tune.c_str(), base.gop, base.threads, encoding.c_str(), base.vbv_s);
  std::printf("| target kbit/s | produced kbit/s | PSNR RGB mean / worst (dB) | PSNR Y mean (dB) | "
              "encode ms/frame (mean / p95 wall) | encode CPU ms/frame | %% of one core | decode ms/frame |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int kbps : bitrates)
  {
    overlay_manager::H264Params p = base;
    p.bitrate_kbps = kbps;
    overlay_manager::H264Encoder enc;
    overlay_manager::H264Decoder dec("bgr8");
    std::string err;
    if (!enc.open(p, &err))
    {
      std::fprintf(stderr, "bench_h264_codec: %s\n", err.c_str());
      return 1;
    }
    size_t bytes = 0;
    double cpu = 0, psnr_sum = 0, psnr_worst = 1e9, luma_sum = 0, decode_wall = 0;
    std::vector<double> wall;
    cv::Mat staging;
    auto tick = std::chrono::steady_clock::now();
    const auto period = std::chrono::duration<double>(1.0 / fps);
    for (size_t i = 0; i < frames.size(); ++i)
    {
      if (realtime)
      {
        tick += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
        std::this_thread::sleep_until(tick);
      }
      // a camera hands over a frame it has just written (its driver or roscpp's deserialisation), so
      // the picture is in the cache when encode() reads it: copied untimed into one staging picture
      inputs[i].copyTo(staging);
      overlay_manager::Packet pkt;
      const double c0 = processCpuSeconds();
      const auto w0 = std::chrono::steady_clock::now();
      if (!enc.encode(staging.data, staging.step * staging.rows, static_cast<int>(staging.step), encoding, static_cast<int64_t>(i), &pkt, &err))
      {
        std::fprintf(stderr, "bench_h264_codec: frame %zu: %s\n", i, err.c_str());
        return 1;
      }
      const auto w1 = std::chrono::steady_clock::now();
      cpu += processCpuSeconds() - c0;
      wall.push_back(std::chrono::duration<double, std::milli>(w1 - w0).count());
      bytes += pkt.data.size();
      overlay_manager::Frame f;
      const auto d0 = std::chrono::steady_clock::now();
      if (!dec.decode(pkt.data.data(), pkt.data.size(), &f, &err))
      {
        std::fprintf(stderr, "bench_h264_codec: decoding frame %zu: %s\n", i, err.c_str());
        return 1;
      }
      decode_wall += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count();
      const cv::Mat got(f.height, f.width, CV_8UC3, f.data.data(), f.step);
      const double psnr = cv::PSNR(got, frames[i]);
      psnr_sum += psnr;
      psnr_worst = std::min(psnr_worst, psnr);
      luma_sum += lumaPsnr(got, frames[i]);
    }
    const double n = static_cast<double>(frames.size());
    std::vector<double> sorted = wall;
    std::sort(sorted.begin(), sorted.end());
    double wall_mean = 0;
    for (double w : wall)
      wall_mean += w / n;
    const double cpu_ms = cpu * 1000 / n;
    std::printf("| %d | %.0f | %.2f / %.2f | %.2f | %.2f / %.2f | %.2f | %.1f %% | %.2f |\n", kbps,
                bytes * 8.0 * fps / n / 1000, psnr_sum / n, psnr_worst, luma_sum / n, wall_mean,
                sorted[static_cast<size_t>(0.95 * (n - 1))], cpu_ms, cpu_ms * fps / 10, decode_wall / n);
    std::fflush(stdout);
  }
  return 0;
}
