// A viewer's moves between a tiered stream's topics (tier_follow.h, no ROS): which topic the
// directory names for a node, the new topic subscribed before the old one is left, the old one shown
// until the new one delivers, and the way back to the base when a tier loses its publisher.
#include "overlay_manager/tier_follow.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using overlay_manager::chooseTier;
using overlay_manager::TierChoice;
using overlay_manager::TierDirectoryEntry;
using overlay_manager::TierFollowState;

namespace
{
const std::string kBase = "/camera/image_raw/link_aware";
const std::string kFull = kBase + "/full";
using Topics = std::vector<std::string>;

bool show(TierFollowState& s, const std::string& topic, TierFollowState::Step* step = nullptr)
{
  bool shown = false;
  TierFollowState::Step st = s.onMessage(topic, &shown);
  if (step)
    *step = st;
  return shown;
}
}  // namespace

TEST(ChooseTier, ANodeReadsTheTopicOfItsOwnEntryElseTheBase)
{
  const std::vector<TierDirectoryEntry> entries = { { "/other", "derp", kBase },
                                                    { "/viewer", "direct", kFull },
                                                    { "/unresolved", "unknown", "" } };
  const TierChoice mine = chooseTier(kBase, "/viewer", entries);
  EXPECT_EQ(mine.topic, kFull);
  EXPECT_EQ(mine.path, "direct");
  EXPECT_EQ(chooseTier(kBase, "/other", entries).topic, kBase);
  // no entry, or one without a topic: the base topic, no path
  EXPECT_EQ(chooseTier(kBase, "/unresolved", entries).topic, kBase);
  EXPECT_EQ(chooseTier(kBase, "/unresolved", entries).path, "");
  EXPECT_EQ(chooseTier(kBase, "/absent", entries).topic, kBase);
  EXPECT_EQ(chooseTier(kBase, "/viewer", {}).topic, kBase);
}

TEST(TierFollowState, StartsOnTheBase)
{
  TierFollowState s(kBase);
  EXPECT_EQ(s.current(), kBase);
  EXPECT_EQ(s.shown(), kBase);
  EXPECT_FALSE(s.onTier());
  EXPECT_EQ(s.subscribed(), Topics{ kBase });
  EXPECT_TRUE(show(s, kBase));
  EXPECT_TRUE(s.moveTo(kBase).open.empty());  // already there: nothing to do
}

TEST(TierFollowState, TheOldTopicIsShownAndKeptUntilTheNewOneDelivers)
{
  TierFollowState s(kBase);
  const TierFollowState::Step to_full = s.moveTo(kFull);
  EXPECT_EQ(to_full.open, Topics{ kFull });
  EXPECT_TRUE(to_full.close.empty());  // the base stays: the publisher never sees the viewer gone
  EXPECT_EQ(s.current(), kFull);
  EXPECT_TRUE(s.onTier());
  EXPECT_EQ(s.subscribed(), (Topics{ kBase, kFull }));
  TierFollowState::Step step;
  EXPECT_TRUE(show(s, kBase, &step));  // no gap: the base's pictures until the tier delivers
  EXPECT_TRUE(step.close.empty());
  EXPECT_TRUE(show(s, kFull, &step));  // the tier's first message: the base goes
  EXPECT_EQ(step.close, Topics{ kBase });
  EXPECT_EQ(s.shown(), kFull);
  EXPECT_EQ(s.subscribed(), Topics{ kFull });
  EXPECT_FALSE(show(s, kBase));  // a base message still queued is dropped
  EXPECT_TRUE(show(s, kFull, &step));
  EXPECT_TRUE(step.close.empty());
}

TEST(TierFollowState, BackToTheBaseTheSameWay)
{
  TierFollowState s(kBase);
  s.moveTo(kFull);
  show(s, kFull);
  const TierFollowState::Step back = s.moveTo(kBase);
  EXPECT_EQ(back.open, Topics{ kBase });  // subscribed again, with a fresh decoder
  EXPECT_TRUE(back.close.empty());
  EXPECT_TRUE(show(s, kFull));  // shown until the base delivers
  TierFollowState::Step step;
  EXPECT_TRUE(show(s, kBase, &step));
  EXPECT_EQ(step.close, Topics{ kFull });
  EXPECT_FALSE(s.onTier());
}

TEST(TierFollowState, AMoveBackBeforeTheNewTopicDeliveredDropsItAndKeepsTheShownOne)
{
  TierFollowState s(kBase);
  s.moveTo(kFull);
  const TierFollowState::Step back = s.moveTo(kBase);
  EXPECT_TRUE(back.open.empty());  // the base is still subscribed: its decoder goes on
  EXPECT_EQ(back.close, Topics{ kFull });
  EXPECT_EQ(s.subscribed(), Topics{ kBase });
  EXPECT_FALSE(show(s, kFull));
  TierFollowState::Step step;
  EXPECT_TRUE(show(s, kBase, &step));
  EXPECT_TRUE(step.close.empty());
}

TEST(TierFollowState, ATierNeverShownIsDroppedWhenTheViewerMovesOnAgain)
{
  const std::string other = kBase + "/other";
  TierFollowState s(kBase);
  s.moveTo(kFull);
  const TierFollowState::Step step = s.moveTo(other);
  EXPECT_EQ(step.open, Topics{ other });
  EXPECT_EQ(step.close, Topics{ kFull });  // never shown: no reason to keep it
  EXPECT_EQ(s.subscribed(), (Topics{ kBase, other }));
  EXPECT_TRUE(show(s, kBase));
  TierFollowState::Step arrived;
  EXPECT_TRUE(show(s, other, &arrived));
  EXPECT_EQ(arrived.close, Topics{ kBase });
}

TEST(TierFollowState, ATierWithoutAPublisherForTwoSecondsSendsTheViewerBack)
{
  TierFollowState s(kBase);
  EXPECT_FALSE(s.orphaned(false, 0.0));  // the base is never left for that
  EXPECT_FALSE(s.orphaned(false, 10.0));
  s.moveTo(kFull);
  show(s, kFull);
  EXPECT_FALSE(s.orphaned(false, 100.0));
  EXPECT_FALSE(s.orphaned(false, 101.0));
  EXPECT_FALSE(s.orphaned(true, 101.5));  // back: the clock starts again
  EXPECT_FALSE(s.orphaned(false, 102.0));
  EXPECT_FALSE(s.orphaned(false, 103.9));
  EXPECT_TRUE(s.orphaned(false, 104.0));
  const TierFollowState::Step back = s.moveTo(kBase);
  EXPECT_EQ(back.open, Topics{ kBase });
  EXPECT_FALSE(s.orphaned(false, 200.0));
}

int main(int argc, char** argv)
{
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
