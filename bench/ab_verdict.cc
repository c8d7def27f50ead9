#include "bench/ab_verdict.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ferry::bench {
namespace {

// The continued fraction of the regularized incomplete beta function (modified Lentz).
double BetaFraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 300; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
    for (int step = 0; step < 2; ++step) {
      d = 1 + aa * d;
      if (std::fabs(d) < kTiny) d = kTiny;
      c = 1 + aa / c;
      if (std::fabs(c) < kTiny) c = kTiny;
      d = 1 / d;
      h *= d * c;
      aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
    }
    if (std::fabs(d * c - 1) < 1e-15) break;
  }
  return h;
}

// I_x(a, b).
double RegularizedBeta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * BetaFraction(a, b, x) / a;
  return 1 - front * BetaFraction(b, a, 1 - x) / b;
}

double StudentTCdf(double t, int df) {
  const double v = df;
  const double tail = 0.5 * RegularizedBeta(v / 2, 0.5, v / (v + t * t));
  return t >= 0 ? 1 - tail : tail;
}

// The mean of v without its g smallest and g largest values.
double TrimmedMean(std::vector<double> v, int g) {
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (size_t i = static_cast<size_t>(g); i + static_cast<size_t>(g) < v.size(); ++i) sum += v[i];
  return sum / static_cast<double>(v.size() - 2 * static_cast<size_t>(g));
}

// The sample variance of v with its g smallest values raised to the next and its g largest
// lowered to the one before.
double WinsorizedVariance(std::vector<double> v, int g) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size(), k = static_cast<size_t>(g);
  for (size_t i = 0; i < k; ++i) v[i] = v[k], v[n - 1 - i] = v[n - 1 - k];
  double mean = 0;
  for (double x : v) mean += x / static_cast<double>(n);
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return ss / static_cast<double>(n - 1);
}

}  // namespace

std::string Pct(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.1f%%", f * 100);
  return b;
}

std::string Interval(const AbResult& r) { return std::string("[").append(Pct(r.low)).append(", ").append(Pct(r.high)).append("]"); }

double StudentTQuantile(double p, int df) {
  if (p < 0.5) return -StudentTQuantile(1 - p, df);
  double lo = 0, hi = 1;
  while (StudentTCdf(hi, df) < p && hi < 1e12) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = (lo + hi) / 2;
    (StudentTCdf(mid, df) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

Status ValidateAbRule(const AbRule& r) {
  if (!(r.min_effect >= 0 && r.min_effect < 1)) return InvalidArgument("the minimum effect must be in [0%, 100%)");
  if (!(r.min_effect_abs >= 0)) return InvalidArgument("the minimum absolute effect must not be negative");
  if (!(r.confidence > 0.5 && r.confidence < 1)) return InvalidArgument("the confidence must be in (0.5, 1)");
  if (r.min_pairs < 2) return InvalidArgument("an interval needs at least 2 pairs");
  if (r.max_pairs < r.min_pairs) return InvalidArgument("the most pairs must be at least the fewest");
  if (r.max_pairs > 1000) return InvalidArgument("at most 1000 pairs");
  return Status::Ok();
}

std::string_view AbVerdictName(AbVerdict v) {
  switch (v) {
    case AbVerdict::kMorePairs:
      return "more pairs";
    case AbVerdict::kBetter:
      return "better";
    case AbVerdict::kWorse:
      return "worse";
    case AbVerdict::kNotWorthChanging:
      return "not worth changing";
    case AbVerdict::kUnchanged:
      return "unchanged";
  }
  return "?";
}

double AbLevel(const AbRule& rule) {
  return 1 - (1 - rule.confidence) / static_cast<double>(AbLooks(rule).size());
}

std::vector<int> AbLooks(const AbRule& r) {
  std::vector<int> looks;
  for (int n = r.min_pairs; n < r.max_pairs; n *= 2) looks.push_back(n);
  looks.push_back(r.max_pairs);
  return looks;
}

AbResult JudgeAb(const std::vector<AbPair>& pairs, const AbRule& rule) {
  AbResult r;
  const int n = static_cast<int>(pairs.size());
  r.pairs = n;
  if (n < 2) return r;
  // Yuen's trimmed paired t: g = floor(0.2 n) pairs off each end of the sorted differences.
  std::vector<double> diffs, as, bs;
  for (const AbPair& p : pairs) diffs.push_back(p.b - p.a), as.push_back(p.a), bs.push_back(p.b);
  const int g = n / 5, h = n - 2 * g;
  r.mean_a = TrimmedMean(as, g);
  r.mean_b = TrimmedMean(bs, g);
  const double d = TrimmedMean(diffs, g);
  const double sd = std::sqrt(WinsorizedVariance(diffs, g));
  const double se = std::sqrt(static_cast<double>(n - 1) * sd * sd / (static_cast<double>(h) * (h - 1)));
  const std::vector<int> looks = AbLooks(rule);
  r.level = AbLevel(rule);
  const double half = StudentTQuantile(1 - (1 - r.level) / 2, h - 1) * se;
  // Everything relative to A's mean; the absolute floor of the minimum effect where that is ~0.
  const double scale = std::fabs(r.mean_a) > 0 ? std::fabs(r.mean_a) : 1;
  const double m = std::max(rule.min_effect * std::fabs(r.mean_a), rule.min_effect_abs);
  r.difference = d / scale;
  r.low = (d - half) / scale;
  r.high = (d + half) / scale;
  r.pair_sd = sd / scale;
  r.min_effect = m / scale;
  const bool last = n >= rule.max_pairs;
  if (!last && std::find(looks.begin(), looks.end(), n) == looks.end()) return r;

  const std::string numbers =
      Pct(r.difference) + " " + Interval(r) + " over " + std::to_string(n) + " pairs";
  const std::string min = Pct(r.min_effect).substr(1);
  if (d + half < 0 && -d >= m) {
    r.verdict = AbVerdict::kBetter;
    r.reason = "better: " + numbers + "; the interval excludes zero and the gain passes the minimum effect " + min;
  } else if (d - half > 0) {
    r.verdict = AbVerdict::kWorse;
    r.reason = "worse: " + numbers + "; the interval excludes zero";
  } else if (d + half < 0 && (d - half > -m || last)) {
    r.verdict = AbVerdict::kNotWorthChanging;
    r.reason = "not worth changing: " + numbers + "; a real gain, below the minimum effect " + min;
  } else if (d - half > -m && d + half < m) {
    r.verdict = AbVerdict::kUnchanged;
    r.reason = "unchanged: " + numbers + "; the interval holds zero and no effect as large as " + min;
  } else if (last) {
    r.verdict = AbVerdict::kUnchanged;
    r.reason = "unchanged: " + numbers + "; the interval holds zero (no difference found)";
  } else {
    return r;
  }
  r.early = !last;
  return r;
}

Result<AbResult> CompareAb(const std::function<Result<AbPair>(int)>& measure, const AbRule& rule,
                           std::vector<AbPair>* pairs) {
  if (Status st = ValidateAbRule(rule); !st.ok()) return st;
  pairs->clear();
  for (int i = 0; i < rule.max_pairs; ++i) {
    Result<AbPair> p = measure(i);
    if (!p.ok()) return p.status();
    pairs->push_back(*p);
    AbResult r = JudgeAb(*pairs, rule);
    if (r.verdict != AbVerdict::kMorePairs) return r;
  }
  return Internal("no verdict after the most pairs");  // JudgeAb decides at max_pairs
}

}  // namespace ferry::bench
