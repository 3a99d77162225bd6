// A viewer of a tiered link-aware stream follows the stream's directory (<transport topic>/tiers,
// overlay_manager/TierDirectory, latched) to the tier its path calls for, with no parameter of its
// own: the entry of its node names the topic to read. Used by the image_transport subscriber
// plugins (link_aware_transport.cpp) and the compressed_decoder nodelet; the moves themselves are
// TierFollowState's (tier_follow.h): the new topic is subscribed first with a fresh decoder, the
// old one keeps being shown and is left when the new one delivers, and a tier that has had no
// publisher for 2 s (the driver restarted without tiers) sends the viewer back to the base topic.
//
// The owner subscribes to topics through its hooks (its own decoder per topic) and asks onMessage
// whether to show each message. Threads: directory and check callbacks run on the node handle's
// callback queue; hooks run on whichever thread takes a move's turn (one at a time, in the order the
// moves were decided), never while a lock of this class is held, and onMessage never waits for them
// (so a hook may shut down a subscription whose callback is running onMessage).
#ifndef OVERLAY_MANAGER_TIER_FOLLOWER_H
#define OVERLAY_MANAGER_TIER_FOLLOWER_H

#include "overlay_manager/tier_follow.h"

#include <overlay_manager/TierDirectory.h>
#include <ros/ros.h>

#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace overlay_manager
{

/// The directory topic of a tiered stream whose base (transport) topic is `base`.
std::string tierDirectoryTopic(const std::string& base);

class TierFollower
{
public:
  struct Hooks
  {
    /// Subscribe to `topic` with a fresh decoder (not called for a topic still subscribed).
    std::function<void(const std::string& topic)> open;
    /// Unsubscribe from `topic` and drop its decoder.
    std::function<void(const std::string& topic)> close;
    /// Publishers of the subscribed `topic` (the orphan check).
    std::function<uint32_t(const std::string& topic)> publishers;
  };

  /// `base`: the transport topic, which the owner has subscribed to already. `nh`: where the
  /// directory subscription and the check timer run (the owner's callback queue).
  TierFollower(const ros::NodeHandle& nh, const std::string& base, Hooks hooks);
  ~TierFollower();

  TierFollower(const TierFollower&) = delete;
  TierFollower& operator=(const TierFollower&) = delete;

  /// Subscribes to the directory and checks the tier's publisher every second.
  void start();

  /// No more directory or check callbacks and no more hooks; the owner closes what it holds.
  void stop();

  /// A message of `topic` arrived: true to decode and show it. Leaves the topics the move is done
  /// with (through the hooks) when this is the first message of the topic read.
  bool onMessage(const std::string& topic);

  std::string current() const;  ///< the topic read (the base or a tier's)
  const std::string& base() const { return base_; }

private:
  struct Action
  {
    bool open;
    std::string topic;
  };

  void onDirectory(const TierDirectoryConstPtr& dir);
  void onCheck(const ros::WallTimerEvent&);
  /// Queues `step`'s actions (state_mutex_ held by the caller).
  void queue(const TierFollowState::Step& step);
  /// Runs the queued actions unless another thread is running them.
  void runActions();

  ros::NodeHandle nh_;
  const std::string base_;
  const Hooks hooks_;
  ros::Subscriber directory_sub_;
  ros::WallTimer check_timer_;

  mutable std::mutex state_mutex_;  ///< guards state_, actions_, stopped_
  TierFollowState state_;
  std::deque<Action> actions_;  ///< decided, not yet run (in order)
  bool stopped_ = false;
  std::mutex run_mutex_;  ///< held by the thread running the actions
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_TIER_FOLLOWER_H
