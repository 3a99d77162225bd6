#include "overlay_manager/tier_follower.h"

#include <chrono>
#include <exception>
#include <utility>

namespace overlay_manager
{

std::string tierDirectoryTopic(const std::string& base)
{
  return base + "/tiers";
}

TierFollower::TierFollower(const ros::NodeHandle& nh, const std::string& base, Hooks hooks)
  : nh_(nh), base_(base), hooks_(std::move(hooks)), state_(base)
{
}

TierFollower::~TierFollower()
{
  stop();
}

void TierFollower::start()
{
  directory_sub_ = nh_.subscribe<TierDirectory>(tierDirectoryTopic(base_), 1, &TierFollower::onDirectory, this);
  check_timer_ = nh_.createWallTimer(ros::WallDuration(1.0), &TierFollower::onCheck, this);
}

void TierFollower::stop()
{
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    stopped_ = true;
    actions_.clear();
  }
  check_timer_.stop();
  directory_sub_.shutdown();
  std::lock_guard<std::mutex> wait(run_mutex_);  // a hook running on another thread has returned
}

std::string TierFollower::current() const
{
  std::lock_guard<std::mutex> lock(state_mutex_);
  return state_.current();
}

bool TierFollower::onMessage(const std::string& topic)
{
  bool show = false;
  bool leave = false;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (stopped_)
      return topic == state_.shown();
    const TierFollowState::Step step = state_.onMessage(topic, &show);
    leave = !step.close.empty();
    queue(step);
  }
  if (leave)
    runActions();
  return show;
}

void TierFollower::onDirectory(const TierDirectoryConstPtr& dir)
{
  std::vector<TierDirectoryEntry> entries;
  entries.reserve(dir->entries.size());
  for (const TierEntry& e : dir->entries)
    entries.push_back(TierDirectoryEntry{ e.node, e.path, e.topic });
  const TierChoice choice = chooseTier(base_, ros::this_node::getName(), entries);
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (stopped_ || choice.topic == state_.current())
      return;
    queue(state_.moveTo(choice.topic));
  }
  if (choice.path.empty())
    ROS_INFO("%s: reading %s again (%s has no entry for %s)", base_.c_str(), choice.topic.c_str(),
             tierDirectoryTopic(base_).c_str(), ros::this_node::getName().c_str());
  else
    ROS_INFO("%s: reading %s (the tier for path %s, from %s)", base_.c_str(), choice.topic.c_str(),
             choice.path.c_str(), tierDirectoryTopic(base_).c_str());
  runActions();
}

void TierFollower::onCheck(const ros::WallTimerEvent&)
{
  std::string tier;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (stopped_ || !state_.onTier())
      return;
    tier = state_.current();
  }
  // a master-free count of the subscription's connections; no lock held while asking
  const bool has_publisher = hooks_.publishers(tier) > 0;
  const double now_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (stopped_ || state_.current() != tier || !state_.orphaned(has_publisher, now_s))
      return;
    queue(state_.moveTo(base_));
  }
  ROS_INFO("%s: reading %s again (%s has had no publisher for %.0f s)", base_.c_str(), base_.c_str(), tier.c_str(),
           TierFollowState::kOrphanS);
  runActions();
}

void TierFollower::queue(const TierFollowState::Step& step)
{
  for (const std::string& t : step.open)
    actions_.push_back(Action{ true, t });
  for (const std::string& t : step.close)
    actions_.push_back(Action{ false, t });
}

void TierFollower::runActions()
{
  for (;;)
  {
    std::unique_lock<std::mutex> run(run_mutex_, std::try_to_lock);
    if (!run.owns_lock())
      return;  // the thread running them runs ours too (it looks again before it lets go)
    for (;;)
    {
      Action a;
      {
        std::lock_guard<std::mutex> lock(state_mutex_);
        if (stopped_ || actions_.empty())
          break;
        a = actions_.front();
        actions_.pop_front();
      }
      try
      {
        if (a.open)
          hooks_.open(a.topic);
        else
          hooks_.close(a.topic);
      }
      catch (const std::exception& e)
      {
        // a viewer must not go down over a subscription: it keeps what it reads
        ROS_ERROR("%s: could not %s %s: %s", base_.c_str(), a.open ? "subscribe to" : "unsubscribe from",
                  a.topic.c_str(), e.what());
      }
    }
    run.unlock();
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (stopped_ || actions_.empty())
      return;
  }
}

}  // namespace overlay_manager
