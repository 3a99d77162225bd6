// Unit tests of the shaping core (shaping_core.h): tiers, delivery feedback per tier, the skip gate
// of reference-chain codecs, frame admission and the tier directory. Pure logic, linked without roscpp.
#include "overlay_manager/shaping_core.h"
#include "overlay_manager/topic_shaping.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

using overlay_manager::Admission;
using overlay_manager::CoreSettings;
using overlay_manager::DeliverySample;
using overlay_manager::SentReport;
using overlay_manager::ShaperTraits;
using overlay_manager::ShapingCore;
using overlay_manager::SubKey;
using overlay_manager::TierState;
namespace tiers = overlay_manager::tiers;
namespace paths = overlay_manager::paths;

namespace
{
ShaperTraits jpegTraits()
{
  ShaperTraits t;
  t.kind = "jpeg";
  t.size_feedback = true;
  return t;
}

ShaperTraits h264Traits()
{
  ShaperTraits t;
  t.kind = "h264";
  t.reference_chain = true;
  return t;
}

/// Paths as the adapter would map them from ~peers: node -> (machine, path).
void setPaths(ShapingCore& core, const std::map<std::string, std::string>& path_of_node)
{
  std::map<std::string, std::pair<std::string, std::string>> m;
  for (const auto& kv : path_of_node)
    m[kv.first] = { "host_of" + kv.first, kv.second };
  core.setPaths(m);
}

const TierState* find(const std::vector<TierState>& states, const std::string& tier)
{
  for (const TierState& s : states)
    if (s.tier == tier)
      return &s;
  return nullptr;
}

/// Offers `frames` messages to `tier` at `hz` from `t0`, sending `bytes` per admitted one; returns
/// how many were admitted (skipped ones are not).
int feed(ShapingCore& core, const std::string& tier, int frames, double hz, double t0, size_t bytes,
         int* keyframes = nullptr)
{
  int admitted = 0;
  for (int i = 0; i < frames; ++i)
  {
    const Admission a = core.admit(tier, t0 + i / hz);
    if (!a.due)
      continue;
    ++admitted;
    if (keyframes && a.keyframe)
      ++*keyframes;
    SentReport r;
    r.bytes = bytes;
    r.quality = a.decision.quality;
    r.format = "test";
    core.sent(tier, r);
  }
  return admitted;
}
}  // namespace

TEST(Tiers, PathsWithoutABudgetReadTheFullTierOthersTheFitted)
{
  overlay_manager::PolicyParams p;
  EXPECT_EQ(overlay_manager::tierForPath(paths::kSelf, p), tiers::kFullTier);
  EXPECT_EQ(overlay_manager::tierForPath(paths::kDirect, p), tiers::kFullTier);
  EXPECT_EQ(overlay_manager::tierForPath(paths::kDerp, p), tiers::kFittedTier);
  EXPECT_EQ(overlay_manager::tierForPath(paths::kUnknown, p), tiers::kFittedTier);
  p.budget_kbps[paths::kDirect] = 50000.0;  // a budget for direct: direct is fitted too
  EXPECT_EQ(overlay_manager::tierForPath(paths::kDirect, p), tiers::kFittedTier);
  EXPECT_EQ(overlay_manager::tierTopic("/cam/link_aware", tiers::kFittedTier), "/cam/link_aware");
  EXPECT_EQ(overlay_manager::tierTopic("/cam/link_aware", tiers::kSingleTier), "/cam/link_aware");
  EXPECT_EQ(overlay_manager::tierTopic("/cam/link_aware", tiers::kFullTier), "/cam/link_aware/full");
}

TEST(Tiers, ADirectAndARelayedSubscriberGetDifferentStreamsAtOnce)
{
  ShapingCore core(jpegTraits(), CoreSettings());
  core.connected(tiers::kFullTier, "/direct_viewer");
  core.connected(tiers::kFittedTier, "/relayed_viewer");
  setPaths(core, { { "/direct_viewer", paths::kDirect }, { "/relayed_viewer", paths::kDerp } });
  EXPECT_EQ(core.activeTiers(), (std::vector<std::string>{ tiers::kFittedTier, tiers::kFullTier }));
  // 40 KB frames at 30 Hz = 9.6 Mbit/s: over derp's 8000 kbit/s, nothing for direct
  for (int s = 0; s < 4; ++s)
  {
    feed(core, tiers::kFullTier, 30, 30.0, s, 40000);
    feed(core, tiers::kFittedTier, 30, 30.0, s, 40000);
  }
  const std::vector<TierState> st = core.snapshot(4.0);
  const TierState* full = find(st, tiers::kFullTier);
  const TierState* fitted = find(st, tiers::kFittedTier);
  ASSERT_TRUE(full && fitted);
  EXPECT_TRUE(std::isinf(full->decision.budget_kbps));
  EXPECT_EQ(full->decision.quality, 90);
  EXPECT_DOUBLE_EQ(full->decision.rate_hz, 30.0);
  EXPECT_DOUBLE_EQ(fitted->decision.budget_kbps, 8000.0);
  EXPECT_EQ(fitted->decision.limited_by, "host_of/relayed_viewer");
  EXPECT_LT(fitted->decision.quality, 90);  // the relayed tier stepped its quality down
  ASSERT_EQ(full->subscribers.size(), 1u);
  EXPECT_EQ(full->subscribers[0].node, "/direct_viewer");
  EXPECT_EQ(full->subscribers[0].wanted_tier, tiers::kFullTier);
}

TEST(Tiers, TheFittedTierFitsWhoeverReadsItAndTheDirectorySaysWhereToGo)
{
  ShapingCore core(jpegTraits(), CoreSettings());
  // a local viewer that cannot switch (a plain subscriber of the topic) shares the fitted tier
  // with a relayed one: the tier is fitted to the relayed one, the directory sends the local one
  // to the full tier
  core.connected(tiers::kFittedTier, "/local");
  core.connected(tiers::kFittedTier, "/relayed");
  setPaths(core, { { "/local", paths::kSelf }, { "/relayed", paths::kPeerRelay } });
  const std::vector<TierState> snap_fitted = core.snapshot(0.0);
  const TierState* fitted = find(snap_fitted, tiers::kFittedTier);
  ASSERT_TRUE(fitted);
  EXPECT_DOUBLE_EQ(fitted->decision.budget_kbps, 20000.0);
  const auto dir = core.directory();
  EXPECT_EQ(dir.at("/local"), tiers::kFullTier);
  EXPECT_EQ(dir.at("/relayed"), tiers::kFittedTier);
  // the local viewer moves: subscribes to the full tier, then leaves the fitted one
  core.connected(tiers::kFullTier, "/local");
  core.disconnected(tiers::kFittedTier, "/local");
  const std::vector<TierState> st = core.snapshot(0.0);
  ASSERT_TRUE(find(st, tiers::kFullTier));
  EXPECT_TRUE(std::isinf(find(st, tiers::kFullTier)->decision.budget_kbps));
  EXPECT_EQ(core.directory().at("/local"), tiers::kFullTier);  // the node is still known (one tier left)
  // the last subscriber of a tier takes the tier with it: nothing is encoded for it any more
  core.disconnected(tiers::kFittedTier, "/relayed");
  EXPECT_EQ(core.activeTiers(), std::vector<std::string>{ tiers::kFullTier });
  EXPECT_FALSE(core.admit(tiers::kFittedTier, 1.0).due);
  core.disconnected(tiers::kFullTier, "/local");
  EXPECT_TRUE(core.empty());
  EXPECT_TRUE(core.directory().empty());
}

TEST(Tiers, AViewerThatLeavesItsOldTierBeforeItsNewConnectionArrivesKeepsItsPath)
{
  ShapingCore core(jpegTraits(), CoreSettings());
  core.connected(tiers::kFittedTier, "/local");
  core.setHost("/local", "robot1", 0.0, 5.0);
  setPaths(core, { { "/local", paths::kSelf } });
  core.disconnected(tiers::kFittedTier, "/local");  // the old subscription went first
  EXPECT_TRUE(core.directory().empty());           // gone: not listed
  core.connected(tiers::kFullTier, "/local");
  EXPECT_TRUE(core.unresolved(0.0).empty());  // no new look-up
  EXPECT_EQ(core.directory().at("/local"), tiers::kFullTier);
  const std::vector<TierState> snap_full = core.snapshot(0.0);
  const TierState* full = find(snap_full, tiers::kFullTier);
  ASSERT_TRUE(full);
  EXPECT_EQ(full->subscribers[0].path, paths::kSelf);
}

TEST(Tiers, DeliveryFeedbackOfASubscriberActsOnItsOwnTierOnly)
{
  ShapingCore core(jpegTraits(), CoreSettings());
  core.connected(tiers::kFullTier, "/direct");
  core.connected(tiers::kFittedTier, "/relayed");
  setPaths(core, { { "/direct", paths::kDirect }, { "/relayed", paths::kDerp } });
  feed(core, tiers::kFullTier, 30, 30.0, 0.0, 20000);
  feed(core, tiers::kFittedTier, 30, 30.0, 0.0, 20000);
  core.snapshot(0.0);
  core.snapshot(1.0);  // a window: both tiers sent 4800 kbit/s
  std::map<SubKey, DeliverySample> samples;
  samples[SubKey{ tiers::kFittedTier, "/relayed" }].unsent_bytes = 400000;  // far over 200 ms
  samples[SubKey{ tiers::kFittedTier, "/relayed" }].acked_bytes = 1;
  core.observeDelivery(1.0, samples);
  samples[SubKey{ tiers::kFittedTier, "/relayed" }].acked_bytes = 1 + 125000;  // 2000 kbit/s acknowledged
  core.observeDelivery(1.5, samples);
  const std::vector<TierState> st = core.snapshot(1.5);
  const TierState* fitted = find(st, tiers::kFittedTier);
  const TierState* full = find(st, tiers::kFullTier);
  ASSERT_TRUE(fitted && full);
  EXPECT_NEAR(fitted->subscribers[0].observed_cap_kbps, 0.9 * 2000.0, 1.0);
  EXPECT_EQ(fitted->decision.reason, "observed delivery");
  EXPECT_TRUE(std::isnan(full->subscribers[0].observed_cap_kbps));
  EXPECT_TRUE(std::isinf(full->decision.budget_kbps));
  // a new path: what was learnt on the old one is forgotten
  setPaths(core, { { "/relayed", paths::kPeerRelay } });
  EXPECT_TRUE(std::isnan(find(core.snapshot(1.5), tiers::kFittedTier)->subscribers[0].observed_cap_kbps));
}

TEST(Tiers, WithoutAdaptToDeliveryNothingIsLearnt)
{
  CoreSettings settings;
  settings.adapt_to_delivery = false;
  ShapingCore core(h264Traits(), settings);
  core.connected(tiers::kSingleTier, "/v");
  feed(core, tiers::kSingleTier, 30, 30.0, 0.0, 8000);
  core.snapshot(0.0);
  core.snapshot(1.0);
  std::map<SubKey, DeliverySample> samples;
  samples[SubKey{ tiers::kSingleTier, "/v" }].unsent_bytes = 1000000;
  core.observeDelivery(1.0, samples);
  EXPECT_FALSE(core.anyBackedUp());
}

TEST(SkipGate, ABackedUpSubscriberStopsItsTierUntilTheBacklogDrainsThenAKeyframe)
{
  ShapingCore core(h264Traits(), CoreSettings());
  core.connected(tiers::kFullTier, "/direct");
  core.connected(tiers::kFittedTier, "/relayed");
  setPaths(core, { { "/direct", paths::kDirect }, { "/relayed", paths::kDerp } });
  int keyframes = 0;
  // a new subscriber's tier starts with a keyframe
  EXPECT_EQ(feed(core, tiers::kFittedTier, 30, 30.0, 0.0, 8000, &keyframes), 30);
  EXPECT_EQ(keyframes, 1);
  feed(core, tiers::kFullTier, 30, 30.0, 0.0, 8000);
  core.snapshot(0.0);
  core.snapshot(1.0);  // 1920 kbit/s sent on each tier
  std::map<SubKey, DeliverySample> samples;
  samples[SubKey{ tiers::kFittedTier, "/relayed" }].unsent_bytes = 60000;  // 250 ms at 1920 kbit/s
  core.observeDelivery(1.0, samples);
  EXPECT_TRUE(core.anyBackedUp());
  const Admission skipped = core.admit(tiers::kFittedTier, 1.1);
  EXPECT_FALSE(skipped.due);
  EXPECT_TRUE(skipped.skipped);
  EXPECT_TRUE(core.admit(tiers::kFullTier, 1.1).due);  // the other tier goes on
  // still above half of max_backlog_ms at the fitted tier's target: no resume
  const double target = core.admit(tiers::kFittedTier, 1.2).target_kbps;
  ASSERT_GT(target, 0.0);
  samples[SubKey{ tiers::kFittedTier, "/relayed" }].unsent_bytes = static_cast<uint32_t>(target / 8.0 * 110.0);
  EXPECT_FALSE(core.recheck(1.2, samples));
  samples[SubKey{ tiers::kFittedTier, "/relayed" }].unsent_bytes = static_cast<uint32_t>(target / 8.0 * 90.0);
  EXPECT_TRUE(core.recheck(1.3, samples));
  EXPECT_FALSE(core.anyBackedUp());
  const Admission resumed = core.admit(tiers::kFittedTier, 1.4);
  EXPECT_TRUE(resumed.due);
  EXPECT_TRUE(resumed.keyframe);  // a decoder whose queue overflowed meanwhile is repaired at once
  TierState fitted = *find(core.snapshot(1.5), tiers::kFittedTier);
  EXPECT_GE(fitted.skipped, 2u);
}

TEST(SkipGate, ForcedKeyframesAreRateLimitedPerTier)
{
  ShapingCore core(h264Traits(), CoreSettings());
  core.connected(tiers::kSingleTier, "/v");
  EXPECT_TRUE(core.admit(tiers::kSingleTier, 0.0).keyframe);  // first frame of a new subscriber
  core.requestKeyframe(tiers::kSingleTier, 1.0);
  EXPECT_TRUE(core.admit(tiers::kSingleTier, 1.0).keyframe);
  core.requestKeyframe(tiers::kSingleTier, 1.5);  // within kMinForcedKeyframeS: refused
  EXPECT_FALSE(core.admit(tiers::kSingleTier, 1.5).keyframe);
  core.requestKeyframe(tiers::kSingleTier, 2.1);
  EXPECT_TRUE(core.admit(tiers::kSingleTier, 2.1).keyframe);
  core.failed(tiers::kSingleTier);  // an encode failed: the decoders may have missed a reference
  EXPECT_TRUE(core.admit(tiers::kSingleTier, 2.2).keyframe);
}

TEST(SkipGate, CodecsWithoutAReferenceChainNeverSkipNorAskForKeyframes)
{
  ShapingCore core(jpegTraits(), CoreSettings());
  core.connected(tiers::kSingleTier, "/v");
  EXPECT_FALSE(core.admit(tiers::kSingleTier, 0.0).keyframe);
  feed(core, tiers::kSingleTier, 30, 30.0, 0.1, 8000);
  core.snapshot(0.0);
  core.snapshot(1.0);
  std::map<SubKey, DeliverySample> samples;
  samples[SubKey{ tiers::kSingleTier, "/v" }].unsent_bytes = 1000000;
  core.observeDelivery(1.0, samples);
  EXPECT_FALSE(core.anyBackedUp());
  EXPECT_FALSE(core.admit(tiers::kSingleTier, 1.1).skipped);
}

TEST(Admission, TheRateCapHoldsOnEachTierAndInputBeyondItIsNotEncoded)
{
  CoreSettings settings;
  settings.policy.max_rate_hz = 15.0;
  ShapingCore core(jpegTraits(), settings);
  core.connected(tiers::kSingleTier, "/v");
  EXPECT_EQ(feed(core, tiers::kSingleTier, 60, 30.0, 0.0, 1000), 30);  // 2 s of 30 Hz input at a 15 Hz cap
  const TierState st = core.snapshot(0.0)[0];
  EXPECT_EQ(st.tier, tiers::kSingleTier);
  const TierState later = core.snapshot(2.0)[0];
  EXPECT_NEAR(later.input_rate_hz, 30.0, 0.01);
  EXPECT_NEAR(later.output_rate_hz, 15.0, 0.01);
  EXPECT_NEAR(later.bitrate_kbps, 15 * 1000 * 8 / 1000.0, 0.01);
  EXPECT_EQ(later.format, "test");
}

TEST(Admission, NodesToLookUpAreRetriedAfterAFailure)
{
  ShapingCore core(jpegTraits(), CoreSettings());
  core.connected(tiers::kSingleTier, "/a");
  core.connected(tiers::kSingleTier, "/a");  // a second connection of the same node counts once
  EXPECT_EQ(core.unresolved(0.0), std::vector<std::string>{ "/a" });
  core.setHost("/a", "", 0.0, 5.0);
  EXPECT_TRUE(core.unresolved(1.0).empty());
  EXPECT_EQ(core.unresolved(5.0), std::vector<std::string>{ "/a" });
  core.setHost("/a", "laptop", 5.0, 5.0);
  EXPECT_TRUE(core.unresolved(20.0).empty());
  EXPECT_EQ(core.hosts().at("/a"), "laptop");
  core.disconnected(tiers::kSingleTier, "/a");
  EXPECT_FALSE(core.empty());  // one connection left
  core.disconnected(tiers::kSingleTier, "/a");
  EXPECT_TRUE(core.empty());
}

int main(int argc, char** argv)
{
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

namespace
{
/// A topic shaper's core (topic_shaping.h coreSettings: rate-only fitting, the skip gate).
ShaperTraits shaperTraits()
{
  ShaperTraits t;
  t.kind = "zstd";
  t.size_feedback = true;
  t.reference_chain = true;
  return t;
}

void sendOne(ShapingCore& core, const std::string& tier, size_t bytes)
{
  SentReport r;
  r.bytes = bytes;
  r.quality = 90;
  core.sent(tier, r);
}
}  // namespace

TEST(Admission, ARaisedBudgetActsOnTheNextMessageNotAfterTheOldPeriod)
{
  overlay_manager::shaping::ShapingParams sp;
  sp.budget_kbps[paths::kDerp] = 400.0;
  ShapingCore core(shaperTraits(), overlay_manager::shaping::coreSettings(sp, 500.0, true, 0.0));
  core.connected(tiers::kFittedTier, "/viewer");
  setPaths(core, { { "/viewer", paths::kDerp } });
  ASSERT_TRUE(core.admit(tiers::kFittedTier, 0.0).due);
  sendOne(core, tiers::kFittedTier, 250000);  // 2 Mbit: one message every 5.6 s at 400 kbit/s
  EXPECT_FALSE(core.admit(tiers::kFittedTier, 0.5).due);
  // the budget goes up tenfold (a delivery cap lifted, a live setting): 1.8 Hz from now on
  sp.budget_kbps[paths::kDerp] = 4000.0;
  core.applySettings(overlay_manager::shaping::coreSettings(sp, 500.0, true, 0.0));
  int admitted = 0;
  double first = -1.0;
  for (int i = 6; i <= 50; ++i)  // the 10 Hz input from 0.6 s to 5 s
  {
    const double t = i / 10.0;
    if (!core.admit(tiers::kFittedTier, t).due)
      continue;
    if (first < 0.0)
      first = t;
    ++admitted;
    sendOne(core, tiers::kFittedTier, 250000);
  }
  EXPECT_GE(first, 0.0);
  EXPECT_LE(first, 0.6) << "the next message waited for the old 5.6 s period";
  // 0.9 x 4000 kbit/s / 2 Mbit = 1.8 Hz over 4.4 s: about 8 (the 10 Hz input quantises it)
  EXPECT_GE(admitted, 7);
  EXPECT_LE(admitted, 10);
}

TEST(Delivery, ALargeMessageOnItsWayIsNoBacklogTwoAre)
{
  overlay_manager::shaping::ShapingParams sp;  // derp 4000 kbit/s
  ShapingCore core(shaperTraits(), overlay_manager::shaping::coreSettings(sp, 500.0, true, 0.0));
  core.connected(tiers::kFittedTier, "/viewer");
  setPaths(core, { { "/viewer", paths::kDerp } });
  const SubKey key{ tiers::kFittedTier, "/viewer" };
  core.snapshot(0.0);
  ASSERT_TRUE(core.admit(tiers::kFittedTier, 0.0).due);
  sendOne(core, tiers::kFittedTier, 365000);  // a map at 1 Hz: 2.9 Mbit/s
  core.snapshot(1.0);                         // the stream: 1 message/s
  DeliverySample s;
  s.acked_bytes = 365000;
  core.observeDelivery(1.0, { { key, s } });
  ASSERT_TRUE(core.admit(tiers::kFittedTier, 1.0).due);
  sendOne(core, tiers::kFittedTier, 365000);
  // half a second later 300 KB of it are unsent (822 ms of the stream, above max_backlog_ms):
  // the message is on its way; the link carried 1 Mbit/s of it since it was published
  s.unsent_bytes = 300000;
  s.acked_bytes = 365000 + 65000;
  core.observeDelivery(1.5, { { key, s } });
  std::vector<TierState> st = core.snapshot(1.5);
  ASSERT_EQ(st.size(), 1u);
  ASSERT_EQ(st[0].subscribers.size(), 1u);
  EXPECT_TRUE(std::isnan(st[0].subscribers[0].observed_cap_kbps)) << st[0].subscribers[0].observed_cap_kbps;
  EXPECT_FALSE(st[0].backed_up);
  EXPECT_DOUBLE_EQ(st[0].decision.budget_kbps, 4000.0);
  EXPECT_TRUE(core.admit(tiers::kFittedTier, 2.0).due);
  // more than one message unsent: a backlog, the cap follows what was delivered
  s.unsent_bytes = 800000;
  s.acked_bytes += 125000;
  core.observeDelivery(2.0, { { key, s } });
  st = core.snapshot(2.0);
  EXPECT_LT(st[0].subscribers[0].observed_cap_kbps, 4000.0);
  EXPECT_TRUE(st[0].backed_up);
}

TEST(Pacing, ABudgetedSubscriberIsPacedAtItsPathsBudgetTimesTheFactorOthersNot)
{
  CoreSettings settings;
  settings.pacing_factor = 2.5;
  ShapingCore core(jpegTraits(), settings);
  core.connected(tiers::kFittedTier, "/relayed_viewer");
  core.connected(tiers::kFittedTier, "/unresolved_viewer");
  core.connected(tiers::kFullTier, "/direct_viewer");
  setPaths(core, { { "/relayed_viewer", paths::kDerp }, { "/direct_viewer", paths::kDirect } });
  const double derp = settings.policy.budget_kbps.at(paths::kDerp);
  const double unknown = settings.policy.budget_kbps.at(paths::kUnknown);
  std::map<SubKey, double> pace = core.pacing();
  ASSERT_EQ(pace.size(), 3u);
  EXPECT_DOUBLE_EQ((pace[SubKey{ tiers::kFittedTier, "/relayed_viewer" }]), 2.5 * derp);
  EXPECT_DOUBLE_EQ((pace[SubKey{ tiers::kFittedTier, "/unresolved_viewer" }]), 2.5 * unknown);
  EXPECT_DOUBLE_EQ((pace[SubKey{ tiers::kFullTier, "/direct_viewer" }]), 0.0);  // no budget: not paced

  // stream_state says it per subscriber (NaN = not paced)
  const std::vector<TierState> st = core.snapshot(1.0);
  const TierState* fitted = find(st, tiers::kFittedTier);
  const TierState* full = find(st, tiers::kFullTier);
  ASSERT_TRUE(fitted && full);
  for (const auto& s : fitted->subscribers)
    if (s.node == "/relayed_viewer")
      EXPECT_DOUBLE_EQ(s.pacing_kbps, 2.5 * derp);
  ASSERT_EQ(full->subscribers.size(), 1u);
  EXPECT_TRUE(std::isnan(full->subscribers[0].pacing_kbps));

  // the path turns direct: unpaced; pacing off live: nobody is paced
  setPaths(core, { { "/relayed_viewer", paths::kDirect } });
  EXPECT_DOUBLE_EQ((core.pacing()[SubKey{ tiers::kFittedTier, "/relayed_viewer" }]), 0.0);
  settings.pacing_factor = 0.0;
  core.applySettings(settings);
  for (const auto& kv : core.pacing())
    EXPECT_DOUBLE_EQ(kv.second, 0.0) << kv.first.node;
}

TEST(Pacing, APathBudgetOfZeroOrNoneIsNeverPaced)
{
  CoreSettings settings;
  settings.pacing_factor = 2.0;
  settings.policy.budget_kbps[paths::kPeerRelay] = 20000.0;
  settings.policy.budget_kbps.erase(paths::kDerp);
  EXPECT_DOUBLE_EQ(overlay_manager::pacingKbpsForPath(paths::kPeerRelay, settings), 40000.0);
  EXPECT_DOUBLE_EQ(overlay_manager::pacingKbpsForPath(paths::kDerp, settings), 0.0);
  EXPECT_DOUBLE_EQ(overlay_manager::pacingKbpsForPath(paths::kSelf, settings), 0.0);
  settings.policy.budget_kbps[paths::kDerp] = 0.0;
  EXPECT_DOUBLE_EQ(overlay_manager::pacingKbpsForPath(paths::kDerp, settings), 0.0);
}

TEST(Pacing, AKeyframeLeavesWithinOneFramePeriodWhateverTheFactor)
{
  using overlay_manager::deadlinePaceKbps;
  EXPECT_DOUBLE_EQ(deadlinePaceKbps(40000.0, 30.0), 9600.0);  // 40 KB in 1/30 s
  EXPECT_DOUBLE_EQ(deadlinePaceKbps(40000.0, 0.0), 0.0);      // no output rate yet
  EXPECT_DOUBLE_EQ(deadlinePaceKbps(0.0, 30.0), 0.0);

  CoreSettings settings;
  settings.pacing_factor = 2.5;
  settings.policy.budget_kbps[paths::kDerp] = 1000.0;
  ShapingCore core(h264Traits(), settings);
  core.connected(tiers::kFittedTier, "/viewer");
  core.connected(tiers::kFullTier, "/direct_viewer");
  setPaths(core, { { "/viewer", paths::kDerp }, { "/direct_viewer", paths::kDirect } });
  const SubKey viewer{ tiers::kFittedTier, "/viewer" };
  core.snapshot(0.0);
  // frames of 3 KB at 30 Hz: 3 KB in 1/30 s is 720 kbit/s, below 2.5 x 1000: the factor's pace
  feed(core, tiers::kFittedTier, 30, 30.0, 0.0, 3000);
  std::vector<TierState> st = core.snapshot(1.0);
  ASSERT_DOUBLE_EQ(core.pacing()[viewer], 2500.0);
  // one 40 KB keyframe among them: it leaves within a frame period (9.6 Mbit/s at 30 Hz)
  feed(core, tiers::kFittedTier, 1, 30.0, 1.0, 40000);
  feed(core, tiers::kFittedTier, 29, 30.0, 1.0 + 1.0 / 30.0, 3000);
  st = core.snapshot(2.0);
  EXPECT_NEAR(core.pacing()[viewer], 9600.0, 1.0);
  const TierState* fitted = find(st, tiers::kFittedTier);
  ASSERT_TRUE(fitted);
  ASSERT_EQ(fitted->subscribers.size(), 1u);
  EXPECT_NEAR(fitted->subscribers[0].pacing_kbps, 9600.0, 1.0);  // stream_state says the same
  // a direct subscriber stays unpaced, whatever its tier sends
  feed(core, tiers::kFullTier, 30, 30.0, 2.0, 80000);
  core.snapshot(3.0);
  EXPECT_DOUBLE_EQ((core.pacing()[SubKey{ tiers::kFullTier, "/direct_viewer" }]), 0.0);
  // when it turns derp, the full-size frames it got before do not set its pace: the factor's
  setPaths(core, { { "/direct_viewer", paths::kDerp } });
  const SubKey moved{ tiers::kFullTier, "/direct_viewer" };
  EXPECT_DOUBLE_EQ(core.pacing()[moved], 2500.0);
  // nor does one admitted before the change and reported after it, in the window then open
  SentReport in_flight;
  in_flight.bytes = 80000;
  in_flight.format = "test";
  core.sent(tiers::kFullTier, in_flight);
  feed(core, tiers::kFullTier, 30, 30.0, 3.0, 3000);
  core.snapshot(4.0);
  EXPECT_DOUBLE_EQ(core.pacing()[moved], 2500.0);
  feed(core, tiers::kFullTier, 30, 30.0, 4.0, 3000);
  core.snapshot(5.0);
  EXPECT_DOUBLE_EQ(core.pacing()[moved], 2500.0);
  // the keyframe is remembered for one to two peak windows, then the factor's pace returns
  double t = 5.0;
  for (; t < 2 * overlay_manager::kPeakWindowS + 5.0; t += 1.0)
  {
    feed(core, tiers::kFittedTier, 30, 30.0, t, 3000);
    core.snapshot(t + 1.0);
  }
  EXPECT_DOUBLE_EQ(core.pacing()[viewer], 2500.0);
  // pacing off: the deadline does not pace either
  feed(core, tiers::kFittedTier, 1, 30.0, t, 40000);
  feed(core, tiers::kFittedTier, 29, 30.0, t + 1.0 / 30.0, 3000);
  core.snapshot(t + 1.0);
  EXPECT_GT(core.pacing()[viewer], 2500.0);
  settings.pacing_factor = 0.0;
  core.applySettings(settings);
  EXPECT_DOUBLE_EQ(core.pacing()[viewer], 0.0);
}

TEST(Pacing, WhatThePaceReleasesWithinAllowanceIsNoBacklog)
{
  using overlay_manager::backlogBeyondPace;
  using overlay_manager::kPacedAllowanceS;
  // 2.5 Mbit/s = 312,500 B/s: 31,250 B leave within 0.1 s
  ASSERT_DOUBLE_EQ(kPacedAllowanceS, 0.1);
  EXPECT_EQ(backlogBeyondPace(40000, 2500.0), 40000u - 31250u);  // a 40 KB keyframe: 8,750 B beyond
  EXPECT_EQ(backlogBeyondPace(20000, 2500.0), 0u);
  EXPECT_EQ(backlogBeyondPace(40000, 0.0), 40000u);  // unpaced: all of it counts
  EXPECT_EQ(backlogBeyondPace(40000, std::numeric_limits<double>::quiet_NaN()), 40000u);
  EXPECT_EQ(backlogBeyondPace(0, 2500.0), 0u);
}

TEST(Pacing, AKeyframeHeldByThePaceDoesNotCloseTheSkipGate)
{
  CoreSettings settings;
  settings.pacing_factor = 2.5;
  settings.policy.budget_kbps[paths::kDerp] = 1000.0;
  // the same stream, its 40 KB keyframe read whole (unpaced) or less what the pace releases
  for (const bool paced : { true, false })
  {
    ShapingCore core(h264Traits(), settings);
    core.connected(tiers::kFittedTier, "/viewer");
    setPaths(core, { { "/viewer", paths::kDerp } });
    feed(core, tiers::kFittedTier, 30, 30.0, 0.0, 3000);
    core.snapshot(0.0);
    core.snapshot(1.0);  // 720 kbit/s sent: 40 KB are 444 ms of it, over max_backlog_ms (200)
    const double pace = core.pacing()[SubKey{ tiers::kFittedTier, "/viewer" }];
    ASSERT_DOUBLE_EQ(pace, 2500.0);
    std::map<SubKey, DeliverySample> samples;
    samples[SubKey{ tiers::kFittedTier, "/viewer" }].unsent_bytes =
        paced ? overlay_manager::backlogBeyondPace(40000, pace) : 40000u;
    core.observeDelivery(1.0, samples);
    EXPECT_EQ(core.anyBackedUp(), !paced) << (paced ? "the keyframe on its way at the pace is no backlog" :
                                                      "counted whole it is one");
  }
}
