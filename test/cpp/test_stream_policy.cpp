// Unit tests of the link-aware stream policy (pure logic, linked without roscpp).
#include "overlay_manager/stream_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using overlay_manager::Decision;
using overlay_manager::PolicyParams;
using overlay_manager::StreamPolicy;
using overlay_manager::SubscriberView;

namespace
{
SubscriberView sub(const std::string& host, const std::string& path, double cap = NAN)
{
  SubscriberView v;
  v.node = "/viewer_" + host;
  v.host = host;
  v.path = path;
  v.observed_cap_kbps = cap;
  return v;
}

/// A toy JPEG: frame bytes grow with quality like real 640x480 frames do (about 33 KB at 80).
size_t frameBytes(int quality)
{
  return static_cast<size_t>(8000.0 + 25000.0 * std::pow(quality / 80.0, 2.0));
}

/// Runs the encoder loop for n frames at the input rate and returns the final decision.
Decision run(StreamPolicy& p, int frames)
{
  for (int i = 0; i < frames; ++i)
    p.onFrameEncoded(frameBytes(p.decision().quality), p.decision().quality);
  return p.decision();
}
}  // namespace

TEST(StreamPolicy, DirectAndLocalGetFullRateAndMaxQuality)
{
  StreamPolicy p;
  p.setSubscribers({sub("laptop", "direct"), sub("robot1", "self")});
  const Decision d = run(p, 50);
  EXPECT_EQ(d.quality, p.params().max_quality);
  EXPECT_DOUBLE_EQ(d.rate_hz, p.params().max_rate_hz);
  EXPECT_TRUE(std::isinf(d.budget_kbps));
  EXPECT_EQ(d.limited_by, "");
  EXPECT_EQ(d.reason, "no budget");
}

TEST(StreamPolicy, DerpSubscriberFitsTheBudgetAndNamesTheHost)
{
  PolicyParams params;
  params.budget_kbps["derp"] = 6000.0;
  StreamPolicy p(params);
  p.setSubscribers({sub("laptop", "direct"), sub("base", "derp")});
  const Decision d = run(p, 60);
  EXPECT_EQ(d.limited_by, "base");
  EXPECT_EQ(d.reason, "path derp");
  EXPECT_DOUBLE_EQ(d.budget_kbps, 6000.0);
  EXPECT_LT(d.quality, params.max_quality);
  EXPECT_GE(d.quality, params.min_quality);
  EXPECT_DOUBLE_EQ(d.rate_hz, params.max_rate_hz);  // quality gives way before rate does
  EXPECT_LE(p.predictedKbps(), 6000.0);
  EXPECT_GE(p.predictedKbps(), 6000.0 * params.raise_below * 0.8);  // does not starve either
}

TEST(StreamPolicy, TinyBudgetLowersRateAtMinQuality)
{
  PolicyParams params;
  params.budget_kbps["derp"] = 1000.0;
  StreamPolicy p(params);
  p.setSubscribers({sub("base", "derp")});
  const Decision d = run(p, 100);
  EXPECT_EQ(d.quality, params.min_quality);
  EXPECT_LT(d.rate_hz, params.max_rate_hz);
  EXPECT_GE(d.rate_hz, params.min_rate_hz);
  EXPECT_LE(p.predictedKbps(), 1000.0 * 1.01);
}

TEST(StreamPolicy, BackToDirectRestoresFullStreamAtOnce)
{
  StreamPolicy p;
  p.setSubscribers({sub("base", "derp")});
  run(p, 60);
  ASSERT_LT(p.decision().quality, p.params().max_quality);
  p.setSubscribers({sub("base", "direct")});
  EXPECT_EQ(p.decision().quality, p.params().max_quality);
  EXPECT_DOUBLE_EQ(p.decision().rate_hz, p.params().max_rate_hz);
}

TEST(StreamPolicy, PeerRelayHasItsOwnBudget)
{
  PolicyParams params;
  params.budget_kbps["derp"] = 2000.0;
  params.budget_kbps["peer-relay"] = 7000.0;
  StreamPolicy derp(params), relay(params);
  derp.setSubscribers({sub("a", "derp")});
  relay.setSubscribers({sub("a", "peer-relay")});
  EXPECT_LT(run(derp, 80).quality, run(relay, 80).quality);
  EXPECT_DOUBLE_EQ(relay.decision().budget_kbps, 7000.0);
}

TEST(StreamPolicy, ObservedCapBelowPathBudgetWins)
{
  StreamPolicy p;
  p.setSubscribers({sub("laptop", "direct", 3000.0)});
  EXPECT_DOUBLE_EQ(p.decision().budget_kbps, 3000.0);
  EXPECT_EQ(p.decision().reason, "observed delivery");
  run(p, 80);
  EXPECT_LE(p.predictedKbps(), 3000.0);
}

TEST(StreamPolicy, InputSlowerThanMaxRateIsNotCountedTwice)
{
  PolicyParams params;
  params.budget_kbps["derp"] = 4000.0;
  StreamPolicy fast(params), slow(params);
  fast.setSubscribers({sub("a", "derp")});
  slow.setSubscribers({sub("a", "derp")});
  slow.setInputRate(10.0);
  EXPECT_GT(run(slow, 80).quality, run(fast, 80).quality);
}

TEST(StreamPolicy, NoSubscribers)
{
  StreamPolicy p;
  p.setSubscribers({});
  EXPECT_EQ(p.decision().reason, "no subscribers");
  EXPECT_TRUE(std::isinf(p.decision().budget_kbps));
}

TEST(ObservedCap, BacklogCapsThenDrainedQueueLiftsIt)
{
  using overlay_manager::nextObservedCap;
  const double inf = std::numeric_limits<double>::infinity();
  // 8000 kbit/s = 1000 bytes/ms: 300 KB unsent is 300 ms of stream, over a 200 ms limit
  double cap = nextObservedCap(NAN, 300000, 8000, inf, 200);
  EXPECT_DOUBLE_EQ(cap, 5600.0);
  // still congested at the lower rate: never raised, only lowered
  EXPECT_DOUBLE_EQ(nextObservedCap(cap, 300000, 5600, inf, 200), 0.7 * 5600);
  EXPECT_DOUBLE_EQ(nextObservedCap(1000.0, 300000, 8000, inf, 200), 1000.0);
  // between a quarter and the limit: kept
  EXPECT_DOUBLE_EQ(nextObservedCap(cap, 100000, 5600, inf, 200), cap);
  // drained after a check with more unsent (70 KB = 100 ms of 5600 kbit/s): +15 % a check
  EXPECT_DOUBLE_EQ(nextObservedCap(cap, 0, 5600, inf, 200, 70000), cap * 1.15);
  // drained (under a quarter of the limit, 50 ms = 35 KB) in two checks in a row: the link has
  // room again, the cap comes back faster; a few KB unsent at the instant of a check still counts
  EXPECT_DOUBLE_EQ(nextObservedCap(cap, 0, 5600, inf, 200, 0), cap * 1.5);
  EXPECT_DOUBLE_EQ(nextObservedCap(cap, 5000, 5600, inf, 200, 10000), cap * 1.5);
  // no cap and no backlog: stays without a cap
  EXPECT_TRUE(std::isnan(nextObservedCap(NAN, 0, 8000, inf, 200)));
  // lifted once above the path budget or far above what the stream sends
  EXPECT_TRUE(std::isnan(nextObservedCap(7500.0, 0, 7000, 8000, 200)));
  EXPECT_TRUE(std::isnan(nextObservedCap(3000.0, 0, 800, inf, 200)));
  // no stream in the period: nothing learnt
  EXPECT_DOUBLE_EQ(nextObservedCap(1234.0, 999999, 0, inf, 200), 1234.0);
}

TEST(ObservedCap, BacklogThatDoesNotDrainCapsADirectPathToo)
{
  using overlay_manager::nextObservedCap;
  const double inf = std::numeric_limits<double>::infinity();
  // a direct subscriber (no path budget) at 14.9 Mbit/s with 134 KB unsent: 72 ms of stream, under
  // the 200 ms limit; once is not enough, but the same backlog one period later is a full link
  EXPECT_TRUE(std::isnan(nextObservedCap(NAN, 134000, 14900, inf, 200, 0)));
  EXPECT_DOUBLE_EQ(nextObservedCap(NAN, 134000, 14900, inf, 200, 134000), 0.7 * 14900);
  // a small queue in both periods (under a quarter of the limit) is latency, not congestion
  EXPECT_TRUE(std::isnan(nextObservedCap(NAN, 20000, 14900, inf, 200, 20000)));
}

TEST(ObservedCap, BackedUpCapFollowsTheMeasuredDeliveryWithoutCompounding)
{
  using overlay_manager::kDeliveredShare;
  using overlay_manager::nextObservedCap;
  const double inf = std::numeric_limits<double>::infinity();
  // four 1920 kbit/s streams through a 5 Mbit/s uplink: this one's peer acknowledged 1150 kbit/s
  // while 300 ms of stream waited: the cap is that measurement, not 70 % of what was sent
  double cap = nextObservedCap(NAN, 72000, 1920, inf, 200, 0, 1150);
  EXPECT_DOUBLE_EQ(cap, kDeliveredShare * 1150);
  // the old queue still draining in the next periods: the cap stays at the measured rate instead
  // of compounding (0.7 x 0.7 x ... is how four streams fell to min_video_kbps)
  for (int period = 0; period < 4; ++period)
  {
    cap = nextObservedCap(cap, 60000, 0.8 * cap, inf, 200, 72000, 1150);
    EXPECT_DOUBLE_EQ(cap, kDeliveredShare * 1150);
  }
  // a lower measurement lowers it, a higher one (the link recovered while a queue was left) raises it
  EXPECT_DOUBLE_EQ(nextObservedCap(cap, 72000, 1920, inf, 200, 72000, 600), kDeliveredShare * 600);
  EXPECT_DOUBLE_EQ(nextObservedCap(cap, 72000, 1920, inf, 200, 72000, 3000), kDeliveredShare * 3000);
  // nothing acknowledged (a stalled link) or no counter: the blind cut, 70 % of what was sent, or
  // the lower cap kept
  EXPECT_DOUBLE_EQ(nextObservedCap(NAN, 72000, 1920, inf, 200, 72000, 0), 0.7 * 1920);
  EXPECT_DOUBLE_EQ(nextObservedCap(cap, 72000, 1920, inf, 200, 72000, NAN), cap);
  // not backed up: a measurement does not cap anything
  EXPECT_TRUE(std::isnan(nextObservedCap(NAN, 0, 1920, inf, 200, 0, 1500)));
}

TEST(DeliveryCap, LiftedWhenDrainedTwiceButAtMostOnceEverySpacing)
{
  using overlay_manager::DeliveryCap;
  const double inf = std::numeric_limits<double>::infinity();
  DeliveryCap c;
  // no cap, nothing unsent: nothing to lift
  EXPECT_TRUE(std::isnan(c.update(0.0, 0, 1920, inf, 200, 1900)));
  // a congestion episode: 300 ms unsent, 1150 kbit/s acknowledged
  EXPECT_DOUBLE_EQ(c.update(0.5, 72000, 1920, inf, 200, 1150), overlay_manager::kDeliveredShare * 1150);
  // one drained check after a backed-up one: not yet (the cap is raised as before)
  const double cap = c.cap();
  EXPECT_GT(c.update(1.0, 0, 830, inf, 200, 830), cap);
  // drained twice in a row: lifted, the stream is back at its path budget
  EXPECT_TRUE(std::isnan(c.update(1.5, 0, 830, inf, 200, 830)));
  // the link is still congested: the cap follows the measurement at once
  EXPECT_DOUBLE_EQ(c.update(2.0, 72000, 1920, inf, 200, 1100), overlay_manager::kDeliveredShare * 1100);
  // drained twice again, but within the spacing of the last lift: the cap only climbs
  EXPECT_FALSE(std::isnan(c.update(2.5, 0, 800, inf, 200, 800)));
  EXPECT_FALSE(std::isnan(c.update(3.0, 0, 800, inf, 200, 800)));
  // after the spacing: lifted again
  EXPECT_TRUE(std::isnan(c.update(1.5 + DeliveryCap::kLiftSpacingS, 0, 800, inf, 200, 800)));
  // reset forgets a cap (the path changed)
  c.update(5.0, 72000, 1920, inf, 200, 1100);
  c.reset();
  EXPECT_TRUE(std::isnan(c.cap()));
}

TEST(ObservedCap, AQueueOnThePathCountsAsCongestionWhenTheSocketIsEmpty)
{
  using overlay_manager::kDeliveredShare;
  using overlay_manager::kDrainShare;
  using overlay_manager::nextObservedCap;
  const double inf = std::numeric_limits<double>::infinity();
  // nothing unsent in the socket (a relay's buffers took the bytes), but the round trip is 150 ms
  // above its minimum: congested, capped at what the peer acknowledged
  EXPECT_DOUBLE_EQ(nextObservedCap(NAN, 0, 1920, inf, 200, 0, 1200, 150), kDeliveredShare * 1200);
  // more than max_backlog_ms queued on the path: the cap leaves room for it to drain
  EXPECT_DOUBLE_EQ(nextObservedCap(NAN, 0, 1920, inf, 200, 0, 1200, 900), kDrainShare * 1200);
  // a small path queue (between a quarter and a half of the limit) holds a cap: no raise
  EXPECT_DOUBLE_EQ(nextObservedCap(1000.0, 0, 900, inf, 200, 0, 900, 70), 1000.0);
  // a quiet path (under a quarter) lets it rise as before; unmeasured counts as quiet
  EXPECT_DOUBLE_EQ(nextObservedCap(1000.0, 0, 900, inf, 200, 0, 900, 10), 1500.0);
  EXPECT_DOUBLE_EQ(nextObservedCap(1000.0, 0, 900, inf, 200, 0, 900, NAN), 1500.0);
  // no cap and a quiet path: nothing to do
  EXPECT_TRUE(std::isnan(nextObservedCap(NAN, 0, 1920, inf, 200, 0, 1900, 5)));
}

TEST(DeliveryCap, NoLiftWhileThePathHoldsAQueue)
{
  using overlay_manager::DeliveryCap;
  const double inf = std::numeric_limits<double>::infinity();
  DeliveryCap c;
  c.update(0.0, 72000, 1920, inf, 200, 1150, 20);
  c.update(0.5, 0, 830, inf, 200, 830, 70);
  // drained sockets twice, but 70 ms of queue on the path: held, not lifted
  EXPECT_FALSE(std::isnan(c.update(1.0, 0, 830, inf, 200, 830, 70)));
  // the path queue gone (and the sockets still drained): lifted
  EXPECT_TRUE(std::isnan(c.update(1.5, 0, 830, inf, 200, 830, 5)));
}

TEST(VideoBitrate, FollowsTheBudgetWithinLimits)
{
  PolicyParams params;
  params.max_video_kbps = 6000;
  params.min_video_kbps = 300;
  params.video_share = 0.8;
  StreamPolicy p(params);
  p.setSubscribers({sub("laptop", "direct")});
  EXPECT_DOUBLE_EQ(p.videoBitrateKbps(), 6000.0);  // no budget: the maximum
  p.setSubscribers({sub("laptop", "derp")});       // 8000 budget: 0.8 x 8000 = 6400, capped at 6000
  EXPECT_DOUBLE_EQ(p.videoBitrateKbps(), 6000.0);
  p.setSubscribers({sub("laptop", "direct", 2000.0)});  // observed delivery caps a direct path
  EXPECT_DOUBLE_EQ(p.videoBitrateKbps(), 1600.0);
  p.setSubscribers({sub("laptop", "direct", 100.0)});
  EXPECT_DOUBLE_EQ(p.videoBitrateKbps(), 300.0);  // never below the minimum
  EXPECT_EQ(p.decision().reason, "observed delivery");
}

TEST(SkipRule, SkipsAboveMaxBacklogAndResumesBelowHalfAtTheTarget)
{
  using overlay_manager::resumeAfterSkip;
  using overlay_manager::skipForBacklog;
  // 2000 kbit/s = 2 bits per us: 200 ms of stream is 50,000 bytes
  EXPECT_FALSE(skipForBacklog(50000, 2000.0, 200.0));
  EXPECT_TRUE(skipForBacklog(50001, 2000.0, 200.0));
  EXPECT_FALSE(skipForBacklog(1e9, 0.0, 200.0));  // no stream: nothing to skip
  // resumes below half of max_backlog_ms at the encoder's target (the stream sends nothing meanwhile)
  EXPECT_FALSE(resumeAfterSkip(25000, 2000.0, 200.0));
  EXPECT_TRUE(resumeAfterSkip(24999, 2000.0, 200.0));
  EXPECT_TRUE(resumeAfterSkip(24999, 0.0, 200.0));  // no target: nothing to wait for
}

int main(int argc, char** argv)
{
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
