// The A/B decision rule of `ferryctl tune`: whether a candidate setting (B) beats the current
// one (A), from scores measured in interleaved pairs (lower is better: exposed copy time).
//
// The statistic is the paired difference d_i = b_i - a_i, summarized by Yuen's trimmed paired t:
// the mean of the d_i without the g = floor(0.2 n) smallest and largest, and a Student's t
// interval on it with n - 2g - 1 degrees of freedom from their winsorized variance (at 4 pairs
// nothing is trimmed: the plain paired t). A mode of one run that a busy machine stalled (a
// score off by a scheduler quantum) is trimmed from 5 pairs on instead of widening the interval.
// Both are given as fractions of A's trimmed mean score. Pairs are judged only at the looks:
// min_pairs, then each doubling, and max_pairs. The interval at each look has confidence
// 1 - (1 - confidence) / looks (Bonferroni over the looks), so stopping at the first clear look
// does not raise the chance of a false verdict above 1 - confidence.
// With m = min_effect x |A's mean| (at least min_effect_abs):
//   better              the interval lies below zero and the gain -d is at least m
//   worse               the interval lies above zero
//   not worth changing  the interval lies below zero, the gain less than m (decided early once
//                       the whole interval is within m of zero)
//   unchanged           the interval holds zero: early once it lies within (-m, m) (no effect
//                       as large as m), else at max_pairs (none found)
// Anything else at a look before max_pairs asks for more pairs. Pure: no clock, no randomness.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::bench {

// One interleaved pair: A's score and B's, measured back to back.
struct AbPair {
  double a = 0, b = 0;
};

struct AbRule {
  double min_effect = 0.05;   // a smaller gain, as a fraction of A's mean, is not worth a change
  double min_effect_abs = 0;  // ... and at least this much in the scores' unit
  double confidence = 0.99;   // of the verdict over all looks
  int min_pairs = 4;
  int max_pairs = 16;
};
Status ValidateAbRule(const AbRule& rule);

enum class AbVerdict { kMorePairs, kBetter, kWorse, kNotWorthChanging, kUnchanged };
std::string_view AbVerdictName(AbVerdict v);  // "more pairs", "better", "worse", ...

struct AbResult {
  AbVerdict verdict = AbVerdict::kMorePairs;
  int pairs = 0;
  double mean_a = 0, mean_b = 0;  // trimmed means, in the scores' unit
  // The trimmed mean of b - a and its interval, as fractions of mean_a (-0.10: B takes 10% less).
  double difference = 0, low = 0, high = 0;
  double pair_sd = 0;     // winsorized standard deviation of a pair's difference, as a fraction of mean_a
  double level = 0;       // the interval's confidence at this look
  double min_effect = 0;  // m, as a fraction of A's mean
  bool early = false;     // decided before max_pairs
  std::string reason;     // one line: the verdict, the numbers, and why
};

// The pair counts at which the rule may give a verdict.
std::vector<int> AbLooks(const AbRule& rule);
// The confidence of each look's interval: the rule's confidence shared over its looks (Bonferroni).
double AbLevel(const AbRule& rule);
// The verdict on `pairs` (all of them, in order); kMorePairs when their count is not a look or
// the look is not clear.
AbResult JudgeAb(const std::vector<AbPair>& pairs, const AbRule& rule);
// Measures pair after pair (`measure(i)`, i from 0) until JudgeAb gives a verdict; the pairs
// measured go to `pairs`. An error from `measure` ends it.
Result<AbResult> CompareAb(const std::function<Result<AbPair>(int)>& measure, const AbRule& rule,
                           std::vector<AbPair>* pairs);

// The p-quantile of Student's t distribution with `df` degrees of freedom (0 < p < 1, df >= 1).
double StudentTQuantile(double p, int df);

std::string Pct(double f);                // "+1.2%"
std::string Interval(const AbResult& r);  // "[-3.1%, +0.4%]"

}  // namespace ferry::bench
