// Following a tiered stream's directory from the viewer's side, the pure part (no roscpp, gtested in
// test/cpp/test_tier_follow.cpp): which topic a viewer should read (chooseTier) and the moves
// between topics (TierFollowState). The roscpp part that subscribes to the directory and the topics
// is TierFollower (tier_follower.h), used by the image_transport subscriber plugins and the
// compressed_decoder nodelet alike.
//
// A move never leaves the viewer without pictures and the publisher never sees it gone: the new
// topic is subscribed first (its own decoder: H.264 starts at that tier's next keyframe), the topic
// shown until then keeps being shown, and it is left (with every other topic) when the first
// message of the new topic arrives; from then on only the new topic is shown.
#ifndef OVERLAY_MANAGER_TIER_FOLLOW_H
#define OVERLAY_MANAGER_TIER_FOLLOW_H

#include <string>
#include <vector>

namespace overlay_manager
{

/// One entry of a stream's directory (overlay_manager/TierEntry, the fields a viewer needs).
struct TierDirectoryEntry
{
  std::string node;   ///< caller id of the subscribing node
  std::string path;   ///< its path (Peer.PATH_*)
  std::string topic;  ///< the topic it should read ("" = the base topic)
};

/// Where a viewer should read.
struct TierChoice
{
  std::string topic;  ///< the topic to read
  std::string path;   ///< the path its directory entry names ("" when the node has no entry with a topic)
};

/// The entry of `node` in a directory (its last one with a topic), else the base topic with no path.
TierChoice chooseTier(const std::string& base, const std::string& node, const std::vector<TierDirectoryEntry>& entries);

/// The topics a viewer of a tiered stream is subscribed to, the one it reads and the one it shows.
/// Not thread-safe (TierFollower holds a lock around it).
class TierFollowState
{
public:
  /// s a tier may be without a publisher before the viewer goes back to the base topic
  static constexpr double kOrphanS = 2.0;

  /// Starts on `base` (the transport topic: subscribed, read and shown).
  explicit TierFollowState(std::string base);

  /// What a move or a message asks of the subscriptions.
  struct Step
  {
    std::vector<std::string> open;   ///< topics to subscribe to now, each with a fresh decoder
    std::vector<std::string> close;  ///< topics to unsubscribe from now
  };

  /// Reads `target` from now on: subscribes it (unless it is still subscribed: its decoder goes on)
  /// and drops at once any topic that is neither the target nor the one shown. Nothing when
  /// `target` is read already.
  Step moveTo(const std::string& target);

  /// A message of `topic` arrived: whether to decode and show it (`*show`), and the topics to
  /// leave (the first message of the topic read: every other one). Messages of the topic shown
  /// until then are shown while the new topic has not delivered; any other topic's are dropped.
  Step onMessage(const std::string& topic, bool* show);

  /// Every check: whether the topic read (a tier) has `has_publisher`, at `now_s` (any monotonic
  /// clock, s). True when a tier has had no publisher for kOrphanS: the caller moves back to the base.
  bool orphaned(bool has_publisher, double now_s);

  const std::string& base() const { return base_; }
  const std::string& current() const { return current_; }  ///< the topic read
  const std::string& shown() const { return shown_; }      ///< the topic whose pictures are shown
  bool onTier() const { return current_ != base_; }
  const std::vector<std::string>& subscribed() const { return subscribed_; }  ///< in subscription order

private:
  bool isSubscribed(const std::string& topic) const;
  void unsubscribe(const std::string& topic);

  std::string base_, current_, shown_;
  std::vector<std::string> subscribed_;
  double orphan_since_s_ = -1.0;  ///< since when the tier read has had no publisher (< 0: it has one)
};

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_TIER_FOLLOW_H
