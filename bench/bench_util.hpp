// Small helpers the benchmarks share: random data, sample summaries, a clock, a progress bar.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <cstdio>
#include <string>
#include <vector>

namespace ferry::bench {

// Pseudo-random bytes from `seed` (fast enough for GiBs; the same seed gives the same bytes).
inline void FillRandom(std::byte* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(rng());
}

struct Summary {
  double median = 0, min = 0, max = 0, p99 = 0;
  size_t n = 0;
  size_t outliers = 0;  // beyond 1.5 interquartile ranges from the quartiles (Tukey's fences)
};

inline Summary Summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = v.size();
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  s.min = v.front();
  s.max = v.back();
  s.p99 = v[std::min(v.size() - 1, static_cast<size_t>(static_cast<double>(v.size()) * 0.99))];
  const double q1 = v[v.size() / 4], q3 = v[std::min(v.size() - 1, v.size() * 3 / 4)], iqr = q3 - q1;
  for (double x : v) s.outliers += (x < q1 - 1.5 * iqr || x > q3 + 1.5 * iqr) ? 1 : 0;
  return s;
}

inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A progress bar on stderr when it is a terminal; one line per step otherwise (logs stay short).
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(::isatty(2) != 0) {}
  void Step(const std::string& what) {
    ++done_;
    if (done_ > total_) total_ = done_;  // an estimate that ran short
    if (tty_) {
      const int width = 30;
      const int filled = static_cast<int>(width * done_ / std::max<size_t>(total_, 1));
      std::fprintf(stderr, "\r[%s%s] %3zu%% %-40s", std::string(filled, '#').c_str(),
                   std::string(width - filled, ' ').c_str(), 100 * done_ / std::max<size_t>(total_, 1), what.c_str());
      if (done_ == total_) std::fputc('\n', stderr);
    } else {
      std::fprintf(stderr, "[%zu/%zu] %s\n", done_, total_, what.c_str());
    }
    std::fflush(stderr);
  }

 private:
  size_t total_, done_ = 0;
  bool tty_;
};

}  // namespace ferry::bench
