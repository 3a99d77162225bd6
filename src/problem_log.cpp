// Problems said once per kind, then throttled with a count (problem_log.h); libav's log into ROS.
#include "overlay_manager/problem_log.h"

#include "overlay_manager/h264_codec.h"

#include <cstdio>
#include <memory>

namespace overlay_manager
{

ProblemLog::ProblemLog(std::string context, double period_s) : context_(std::move(context)), period_(period_s) {}

bool ProblemLog::report(ros::console::levels::Level level, const std::string& kind, const std::string& what)
{
  uint64_t more = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    auto it = kinds_.find(kind);
    if (it == kinds_.end())
    {
      if (kinds_.size() >= kMaxKinds)
      {
        auto oldest = kinds_.begin();
        for (auto k = kinds_.begin(); k != kinds_.end(); ++k)
          if (k->second.said < oldest->second.said)
            oldest = k;
        kinds_.erase(oldest);
      }
      it = kinds_.emplace(kind, Kind()).first;
    }
    Kind& k = it->second;
    ++k.total;
    if (k.ever_said && now - k.said < period_)
    {
      ++k.unsaid;
      return false;
    }
    more = k.unsaid;
    k.unsaid = 0;
    k.said = now;
    k.ever_said = true;
  }
  if (more > 0)
    ROS_LOG(level, ROSCONSOLE_DEFAULT_NAME, "%s: %s (%llu more since the last message)", context_.c_str(),
            what.c_str(), static_cast<unsigned long long>(more));
  else
    ROS_LOG(level, ROSCONSOLE_DEFAULT_NAME, "%s: %s", context_.c_str(), what.c_str());
  return true;
}

std::string ProblemLog::kindOf(const std::string& what)
{
  // the message's template: numbers -> '#', quoted names -> '...', nothing after a parenthesis
  std::string kind;
  for (size_t i = 0; i < what.size() && kind.size() < 200; ++i)
  {
    const char c = what[i];
    if (c == '(')
      break;
    if (c >= '0' && c <= '9')
    {
      while (i + 1 < what.size() && what[i + 1] >= '0' && what[i + 1] <= '9')
        ++i;
      kind += '#';
    }
    else if (c == '\'' || c == '"')
    {
      const size_t end = what.find(c, i + 1);
      if (end == std::string::npos)
        break;
      kind += "'...'";
      i = end;
    }
    else
      kind += c;
  }
  return kind;
}

uint64_t ProblemLog::count(const std::string& kind) const
{
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = kinds_.find(kind);
  return it == kinds_.end() ? 0 : it->second.total;
}

void routeLibavLogToRos()
{
  static std::once_flag once;
  std::call_once(once, [] {
    auto log = std::make_shared<ProblemLog>("libavcodec");
    setLibavLogSink([log](int level, const void* key, const std::string& line) {
      char id[32];
      std::snprintf(id, sizeof(id), "%p", key);  // the message's template: same text, other numbers
      log->report(level <= 8 ? ros::console::levels::Error : ros::console::levels::Warn, id, line);
    });
  });
}

}  // namespace overlay_manager
