// Logging for code that runs inside other people's processes (camera drivers, viewers): each kind
// of problem is said once when it first happens, then at most once per period with how often it
// happened since ("... (37 more since the last message)"). Kinds are keyed by what went wrong, not
// by the call site, so a second problem in the same window is never hidden behind the first.
// Thread-safe; the log call happens outside the lock.
#ifndef OVERLAY_MANAGER_PROBLEM_LOG_H
#define OVERLAY_MANAGER_PROBLEM_LOG_H

#include <ros/console.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace overlay_manager
{

class ProblemLog
{
public:
  /// `context` starts every line (e.g. the topic); `period_s` is the least time between two lines of one kind.
  explicit ProblemLog(std::string context, double period_s = 10.0);

  /// Reports one occurrence of `kind` (a short fixed key such as "layout" or "missing reference"):
  /// logs "<context>: <what>" at `level` when this kind is new or its period has passed.
  /// True when it logged.
  bool report(ros::console::levels::Level level, const std::string& kind, const std::string& what);

  /// A kind for a free-text problem: its template, numbers as '#', quoted names as '...', up to the
  /// first parenthesis (the same problem with other sizes or names is one kind, another problem
  /// another kind).
  static std::string kindOf(const std::string& what);

  /// Occurrences of `kind` so far.
  uint64_t count(const std::string& kind) const;

  /// At most 64 kinds are kept (the oldest dropped): a stream of ever-new texts cannot grow memory.
  static const size_t kMaxKinds = 64;

private:
  struct Kind
  {
    uint64_t total = 0;
    uint64_t unsaid = 0;  ///< occurrences since the last line
    std::chrono::steady_clock::time_point said;
    bool ever_said = false;
  };
  const std::string context_;
  const std::chrono::duration<double> period_;
  mutable std::mutex mutex_;
  std::map<std::string, Kind> kinds_;
};

/// Routes libavcodec's log (process-wide, once) into ROS logging through a ProblemLog keyed by the
/// message's template: errors as ROS warnings, at most one line per template per 10 s.
void routeLibavLogToRos();

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_PROBLEM_LOG_H
