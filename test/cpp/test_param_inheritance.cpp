// Which keys of a stream namespace are the node's and what they become at the next start
// (param_inheritance.h; values stand in as strings: the logic only compares them).
#include "overlay_manager/param_inheritance.h"

#include <gtest/gtest.h>

using overlay_manager::InheritPlan;
using overlay_manager::planInherit;
using overlay_manager::rememberAfterStart;
using Params = std::map<std::string, std::string>;

TEST(PlanInherit, FirstStartCopiesSharedKeysTheStreamDoesNotSet)
{
  const InheritPlan<std::string> plan = planInherit<std::string>({ { "tiers", "false" }, { "budget", "300" } },
                                                                 { { "budget", "700" } }, {});
  EXPECT_EQ(plan.set, (Params{ { "tiers", "false" } }));  // budget: the user's per-stream value wins
  EXPECT_TRUE(plan.erase.empty());
}

TEST(PlanInherit, RestartRefreshesTheNodesCopiesFromTheNewSharedValue)
{
  // the stale copy of an earlier run (tiers=false) follows the shared value now (true)
  const InheritPlan<std::string> plan =
      planInherit<std::string>({ { "tiers", "true" } }, { { "tiers", "false" } }, { { "tiers", "false" } });
  EXPECT_EQ(plan.set, (Params{ { "tiers", "true" } }));
  EXPECT_TRUE(plan.erase.empty());
}

TEST(PlanInherit, NodesKeysWhoseSharedKeyIsGoneAreRemoved)
{
  // a copy of a shared key no longer set, and a value the reconfigure server wrote as its default
  const InheritPlan<std::string> plan = planInherit<std::string>(
      {}, { { "tiers", "false" }, { "max_rate", "30.0" } }, { { "tiers", "false" }, { "max_rate", "30.0" } });
  EXPECT_TRUE(plan.set.empty());
  EXPECT_EQ(plan.erase, (std::vector<std::string>{ "max_rate", "tiers" }));
}

TEST(PlanInherit, AValueChangedSinceTheNodeWroteItIsTheUsers)
{
  // launch file, rosparam set or rqt_reconfigure changed it after the node wrote 300
  const InheritPlan<std::string> plan =
      planInherit<std::string>({ { "budget", "400" } }, { { "budget", "500" } }, { { "budget", "300" } });
  EXPECT_TRUE(plan.set.empty());
  EXPECT_TRUE(plan.erase.empty());
}

TEST(PlanInherit, ARememberedKeyTheUserDeletedIsCopiedAgain)
{
  const InheritPlan<std::string> plan =
      planInherit<std::string>({ { "budget", "400" } }, {}, { { "budget", "300" }, { "gone", "1" } });
  EXPECT_EQ(plan.set, (Params{ { "budget", "400" } }));
  EXPECT_TRUE(plan.erase.empty());
}

TEST(RememberAfterStart, OwnedKeysAndTheKeysTheServerAddedWithTheirValuesNow)
{
  const Params now = { { "tiers", "false" },       // copied by the node (owned)
                       { "budget", "700" },        // the user's (present before, not owned)
                       { "max_rate", "30.0" },     // added by the reconfigure server
                       { "gop", "60.0" },          // owned, rewritten by the server as a double
                       { overlay_manager::kInheritedParamsKey, "{...}" } };
  EXPECT_EQ(rememberAfterStart<std::string>({ "tiers", "gop" }, { "tiers", "budget", "gop" }, now),
            (Params{ { "tiers", "false" }, { "max_rate", "30.0" }, { "gop", "60.0" } }));
}

int main(int argc, char** argv)
{
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
