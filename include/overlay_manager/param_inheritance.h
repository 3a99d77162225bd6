// Which parameters of a link-aware stream's own namespace the node put there itself, and what they
// become at the next start (pure logic, no ROS: test/cpp/test_param_inheritance.cpp).
//
// A stream namespace (the republisher's ~link_aware/, ~link_aware_h264/, a transport's
// <image>/link_aware/) holds the user's per-stream settings and values the node wrote itself: its
// copies of the shared private parameters and its dynamic_reconfigure server's values. Both stay on
// the parameter server after the process ends, so the node remembers what it wrote, with the value,
// in <namespace>/inherited_params (kInheritedParamsKey). At the next start a key whose value is still
// the one remembered is the node's: it is refreshed from the shared value, or removed when the shared
// key is gone (the default applies again). Any other key present is the user's and wins, including a
// remembered key whose value was changed since (a launch file's <param>, rosparam set, rqt_reconfigure).
// Limits: a per-stream value the user sets equal to the one the node wrote last time passes for the
// node's; a crash between the reconfigure server's first writes and the record that follows them
// (the moment the stream starts) leaves those values looking like the user's.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace overlay_manager
{
/// The parameter (in a stream namespace) that remembers the keys the node wrote there, key -> value.
constexpr const char* kInheritedParamsKey = "inherited_params";

/// What to do to a stream namespace at start.
template <class Value>
struct InheritPlan
{
  std::map<std::string, Value> set;  ///< keys to write with these values (the node's from now on)
  std::vector<std::string> erase;    ///< the node's keys whose shared key is gone: deleted (sorted)
};

/// `shared`: the shared parameters (not the stream namespaces); `current`: the stream namespace now
/// (without kInheritedParamsKey); `remembered`: what the node wrote there last time (key -> value).
/// A key of `current` is the node's when `remembered` has it with the same value.
template <class Value>
InheritPlan<Value> planInherit(const std::map<std::string, Value>& shared, const std::map<std::string, Value>& current,
                               const std::map<std::string, Value>& remembered)
{
  InheritPlan<Value> plan;
  for (const auto& kv : current)
  {
    const auto r = remembered.find(kv.first);
    if (r == remembered.end() || !(r->second == kv.second))
      continue;  // the user's
    const auto s = shared.find(kv.first);
    if (s != shared.end())
      plan.set[kv.first] = s->second;
    else
      plan.erase.push_back(kv.first);
  }
  for (const auto& kv : shared)
    if (!current.count(kv.first))
      plan.set[kv.first] = kv.second;
  return plan;
}

/// What to remember after the stream's dynamic_reconfigure server started: the keys the node owned
/// before it (`owned`) and those the server added (not in `before`), with their values `now`.
template <class Value>
std::map<std::string, Value> rememberAfterStart(const std::set<std::string>& owned, const std::set<std::string>& before,
                                                const std::map<std::string, Value>& now)
{
  std::map<std::string, Value> out;
  for (const auto& kv : now)
    if (kv.first != kInheritedParamsKey && (owned.count(kv.first) || !before.count(kv.first)))
      out.insert(kv);
  return out;
}
}  // namespace overlay_manager
