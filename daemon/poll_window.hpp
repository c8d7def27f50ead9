// How long ferryd's event loop keeps polling after its last activity before it sleeps.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace ferry::daemon {

// A request that finds ferryd asleep waits for it to wake (~100 us on the H200's host), so
// sleeping between requests that come every few milliseconds costs each of them that much;
// polling through every quiet stretch costs a core. The window adapts: it is twice the longest
// of the last kRemembered quiet gaps that a window of at most `max_ns` would have bridged, and
// never less than `base_ns` (spin_us). Gaps longer than `max_ns` (the client went quiet) count
// as nothing, so after a few of them ferryd is back to polling `base_ns` after a burst; with
// `max_ns` 0 the window is always `base_ns`.
//
// Not thread-safe: the event loop owns it.
class PollWindow {
 public:
  static constexpr size_t kRemembered = 8;

  PollWindow(uint64_t base_ns, uint64_t max_ns) : base_(base_ns), max_(max_ns), window_(base_ns) {}

  // New requests came after `gap_ns` with nothing at all to do.
  void OnQuietGap(uint64_t gap_ns) {
    if (max_ == 0 || gap_ns <= base_) return;  // polling bridged it anyway: no news
    recent_[next_++ % kRemembered] = gap_ns <= max_ ? gap_ns : 0;
    const uint64_t longest = *std::max_element(recent_.begin(), recent_.end());
    window_ = std::clamp(2 * longest, base_, std::max(base_, max_));
  }

  uint64_t ns() const { return window_; }

 private:
  const uint64_t base_, max_;
  uint64_t window_;
  std::array<uint64_t, kRemembered> recent_{};  // 0: empty, or a gap too long to bridge
  size_t next_ = 0;
};

}  // namespace ferry::daemon
