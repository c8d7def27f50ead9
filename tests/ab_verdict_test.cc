// The tuner's A/B decision rule (bench/ab_verdict) on synthetic pairs drawn from known
// distributions with fixed seeds: what it must find, what it must ignore, when it stops.
#include "bench/ab_verdict.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

namespace ferry::bench {
namespace {

// Scores of a machine whose runs drift together: each pair shares a random level (the machine's
// state, sd `shared`), and each score has its own noise (sd `own`), both relative to `base`.
// B's true mean is A's times (1 + effect).
class PairSource {
 public:
  PairSource(uint64_t seed, double effect, double own, double shared = 0.05, double base = 0.170)
      : rng_(seed), effect_(effect), own_(own), shared_(shared), base_(base) {}
  Result<AbPair> operator()(int) {
    const double level = base_ * (1 + shared_ * normal_(rng_));
    return AbPair{level * (1 + own_ * normal_(rng_)), level * (1 + effect_) * (1 + own_ * normal_(rng_))};
  }

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0, 1};
  double effect_, own_, shared_, base_;
};

AbResult Compare(PairSource source, const AbRule& rule) {
  std::vector<AbPair> pairs;
  auto r = CompareAb(std::ref(source), rule, &pairs);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(static_cast<int>(pairs.size()), r->pairs);
  return *r;
}

// Verdicts over `trials` comparisons, each from its own seed.
std::map<AbVerdict, int> Verdicts(uint64_t seed, int trials, double effect, double own, const AbRule& rule) {
  std::map<AbVerdict, int> count;
  for (int t = 0; t < trials; ++t)
    ++count[Compare(PairSource(seed + static_cast<uint64_t>(t), effect, own), rule).verdict];
  return count;
}

TEST(StudentT, QuantilesMatchTheTables) {
  EXPECT_NEAR(StudentTQuantile(0.975, 1), 12.706, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 3), 3.182, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 10), 2.228, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.995, 3), 5.841, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.995, 30), 2.750, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.025, 10), -2.228, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.5, 7), 0.0, 1e-9);
}

TEST(AbRule, LooksAreTheFewestPairsThenDoublingsThenTheMost) {
  EXPECT_EQ(AbLooks(AbRule{0.05, 0, 0.99, 4, 12}), (std::vector<int>{4, 8, 12}));
  EXPECT_EQ(AbLooks(AbRule{0.05, 0, 0.99, 4, 16}), (std::vector<int>{4, 8, 16}));
  EXPECT_EQ(AbLooks(AbRule{0.05, 0, 0.99, 5, 5}), (std::vector<int>{5}));
}

TEST(AbRule, BadRulesAreRefused) {
  EXPECT_FALSE(ValidateAbRule(AbRule{-0.01, 0, 0.95, 4, 12}).ok());
  EXPECT_FALSE(ValidateAbRule(AbRule{0.05, 0, 1.0, 4, 12}).ok());
  EXPECT_FALSE(ValidateAbRule(AbRule{0.05, 0, 0.99, 1, 12}).ok());
  EXPECT_FALSE(ValidateAbRule(AbRule{0.05, 0, 0.99, 8, 4}).ok());
  std::vector<AbPair> pairs;
  EXPECT_FALSE(CompareAb(PairSource(1, 0, 0.01), AbRule{0.05, 0, 0.99, 8, 4}, &pairs).ok());
  EXPECT_TRUE(ValidateAbRule(AbRule{}).ok());
}

// A candidate 20% faster, with 5% noise per score: found in every trial, and the interval holds
// the true effect.
TEST(AbVerdict, ARealEffectIsFound) {
  const AbRule rule;
  int covered = 0;
  for (int t = 0; t < 200; ++t) {
    const AbResult r = Compare(PairSource(1000 + static_cast<uint64_t>(t), -0.20, 0.05), rule);
    ASSERT_EQ(r.verdict, AbVerdict::kBetter) << r.reason;
    EXPECT_LT(r.high, 0);
    covered += r.low <= -0.20 && -0.20 <= r.high;
  }
  EXPECT_GE(covered, 198);  // 99% intervals
  const AbResult r = Compare(PairSource(1000, -0.20, 0.05), rule);
  EXPECT_NE(r.reason.find("better: -"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("minimum effect 5.0%"), std::string::npos) << r.reason;
}

// The same effect with 2% noise is clear at the first look: the comparison stops there.
TEST(AbVerdict, AClearEffectStopsAtTheFirstLook) {
  for (int t = 0; t < 50; ++t) {
    const AbResult r = Compare(PairSource(1500 + static_cast<uint64_t>(t), -0.20, 0.02), AbRule{});
    ASSERT_EQ(r.verdict, AbVerdict::kBetter) << r.reason;
    EXPECT_EQ(r.pairs, 4);
    EXPECT_TRUE(r.early);
  }
}

// A candidate 15% slower: worse, never kept.
TEST(AbVerdict, ASlowerCandidateIsWorse) {
  const auto v = Verdicts(2000, 200, +0.15, 0.05, AbRule{});
  EXPECT_EQ(v.count(AbVerdict::kBetter), 0u);
  EXPECT_GE(v.at(AbVerdict::kWorse), 190);
}

// No effect, with the noise the H200 showed (5% shared, 8% per score): "unchanged" in at least
// 99% of trials (the rule's confidence), kept as better in at most 1%.
TEST(AbVerdict, NoEffectGivesUnchanged) {
  const auto v = Verdicts(3000, 400, 0.0, 0.08, AbRule{});
  EXPECT_GE(v.at(AbVerdict::kUnchanged), 396);
  EXPECT_LE(v.count(AbVerdict::kBetter) ? v.at(AbVerdict::kBetter) : 0, 4);
  EXPECT_EQ(v.count(AbVerdict::kMorePairs), 0u);
}

// No effect and little noise: unchanged at the first look, the interval well inside +-5%.
TEST(AbVerdict, NoEffectWithLittleNoiseStopsAtTheFirstLook) {
  const AbResult r = Compare(PairSource(4000, 0.0, 0.005), AbRule{});
  EXPECT_EQ(r.verdict, AbVerdict::kUnchanged);
  EXPECT_EQ(r.pairs, 4);
  EXPECT_TRUE(r.early);
  EXPECT_GT(r.low, -0.05);
  EXPECT_LT(r.high, 0.05);
  EXPECT_NE(r.reason.find("no effect as large as 5.0%"), std::string::npos) << r.reason;
}

// Noise too large to tell: the most pairs are measured, and the verdict says nothing was found.
TEST(AbVerdict, NoisyPairsRunToTheMostAndFindNothing) {
  const AbResult r = Compare(PairSource(5000, 0.0, 0.30), AbRule{});
  EXPECT_EQ(r.verdict, AbVerdict::kUnchanged);
  EXPECT_EQ(r.pairs, 16);
  EXPECT_FALSE(r.early);
  EXPECT_NE(r.reason.find("no difference found"), std::string::npos) << r.reason;
}

// A busy machine stalls one mode of one run: a score off by a scheduler quantum. From 5 pairs on
// it is trimmed, and a 20% gain is still found at the second look.
TEST(AbVerdict, OneStalledScoreDoesNotHideAGain) {
  PairSource source(7000, -0.20, 0.01);
  std::vector<AbPair> pairs;
  auto r = CompareAb(
      [&](int i) -> Result<AbPair> {
        AbPair p = *source(i);
        if (i == 1) p.b += 0.170;  // B's run doubled
        return p;
      },
      AbRule{}, &pairs);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->verdict, AbVerdict::kBetter) << r->reason;
  EXPECT_EQ(r->pairs, 8) << r->reason;
  EXPECT_LT(r->low, -0.15);
  EXPECT_GT(r->high, -0.25);
}

// A real 2% gain with 0.2% noise and a 5% minimum effect: found, and not worth a change.
TEST(AbVerdict, AnEffectBelowTheMinimumIsNotWorthChanging) {
  const auto v = Verdicts(6000, 200, -0.02, 0.002, AbRule{});
  EXPECT_EQ(v.count(AbVerdict::kBetter), 0u);
  EXPECT_GE(v.at(AbVerdict::kNotWorthChanging), 190);
  const AbResult r = Compare(PairSource(6000, -0.02, 0.002), AbRule{});
  EXPECT_LT(r.high, 0);
  EXPECT_GT(r.low, -0.05);
  EXPECT_NE(r.reason.find("below the minimum effect 5.0%"), std::string::npos) << r.reason;
  // The same gain passes a 1% minimum.
  EXPECT_EQ(Compare(PairSource(6000, -0.02, 0.002), AbRule{0.01, 0, 0.99, 4, 12}).verdict, AbVerdict::kBetter);
}

// The minimum effect in the scores' unit where A's mean is about zero.
TEST(AbVerdict, TheAbsoluteFloorAppliesWhereAsMeanIsZero) {
  std::vector<AbPair> pairs{{0.0, -1e-6}, {0.0, -1.1e-6}, {0.0, -0.9e-6}, {0.0, -1e-6}};
  AbRule rule{0.05, 5e-6, 0.99, 4, 4};
  EXPECT_EQ(JudgeAb(pairs, rule).verdict, AbVerdict::kNotWorthChanging);
  rule.min_effect_abs = 0.5e-6;
  EXPECT_EQ(JudgeAb(pairs, rule).verdict, AbVerdict::kBetter);
}

// Between the looks no verdict is given, however clear the pairs.
TEST(AbVerdict, OnlyTheLooksGiveVerdicts) {
  std::vector<AbPair> pairs(5, AbPair{1.0, 0.5});
  pairs[0].b = 0.51;
  EXPECT_EQ(JudgeAb(pairs, AbRule{}).verdict, AbVerdict::kMorePairs);
  pairs.pop_back();
  EXPECT_EQ(JudgeAb(pairs, AbRule{}).verdict, AbVerdict::kBetter);
  EXPECT_EQ(JudgeAb({}, AbRule{}).verdict, AbVerdict::kMorePairs);
}

}  // namespace
}  // namespace ferry::bench
