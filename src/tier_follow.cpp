#include "overlay_manager/tier_follow.h"

#include <algorithm>
#include <utility>

namespace overlay_manager
{

TierChoice chooseTier(const std::string& base, const std::string& node, const std::vector<TierDirectoryEntry>& entries)
{
  TierChoice choice{ base, "" };
  for (const TierDirectoryEntry& e : entries)
    if (e.node == node && !e.topic.empty())
      choice = TierChoice{ e.topic, e.path };
  return choice;
}

TierFollowState::TierFollowState(std::string base)
  : base_(std::move(base)), current_(base_), shown_(base_), subscribed_{ base_ }
{
}

bool TierFollowState::isSubscribed(const std::string& topic) const
{
  return std::find(subscribed_.begin(), subscribed_.end(), topic) != subscribed_.end();
}

void TierFollowState::unsubscribe(const std::string& topic)
{
  subscribed_.erase(std::remove(subscribed_.begin(), subscribed_.end(), topic), subscribed_.end());
}

TierFollowState::Step TierFollowState::moveTo(const std::string& target)
{
  Step step;
  if (target == current_)
    return step;
  orphan_since_s_ = -1.0;
  if (!isSubscribed(target))
  {
    step.open.push_back(target);
    subscribed_.push_back(target);
  }
  for (const std::string& t : subscribed_)
    if (t != target && t != shown_)
      step.close.push_back(t);  // a topic that was to be read but never shown
  for (const std::string& t : step.close)
    unsubscribe(t);
  current_ = target;
  return step;
}

TierFollowState::Step TierFollowState::onMessage(const std::string& topic, bool* show)
{
  Step step;
  *show = false;
  if (topic == current_)
  {
    *show = true;
    if (shown_ != current_)
    {
      shown_ = current_;  // the new topic delivers: the others go
      for (const std::string& t : subscribed_)
        if (t != current_)
          step.close.push_back(t);
      for (const std::string& t : step.close)
        unsubscribe(t);
    }
  }
  else if (topic == shown_ && isSubscribed(topic))
    *show = true;  // the old topic until the new one delivers: never a gap
  return step;
}

bool TierFollowState::orphaned(bool has_publisher, double now_s)
{
  if (!onTier() || has_publisher)
  {
    orphan_since_s_ = -1.0;
    return false;
  }
  if (orphan_since_s_ < 0.0)
    orphan_since_s_ = now_s;
  return now_s - orphan_since_s_ >= kOrphanS;
}

}  // namespace overlay_manager
