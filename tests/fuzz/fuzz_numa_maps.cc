// /proc/self/numa_maps text from arbitrary bytes (daemon/numa's ParseNumaMaps): never a crash
// or a hang, and the counts add up: the bytes per node of [0, split) and [split, max) together
// are those of [0, max) (sums stop at UINT64_MAX, so their sum is capped there too).
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string_view>

#include "daemon/numa.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ferry::daemon::ParseNumaMaps;
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr uintptr_t kEnd = std::numeric_limits<uintptr_t>::max();
  const std::map<int, uint64_t> all = ParseNumaMaps(text, 0, kEnd);
  // Split where the mappings of a real process are (the seeds' 7f... addresses), and at an
  // address the input picks.
  for (uintptr_t split : {uintptr_t{0x7f12a0800000}, uintptr_t{size} << 12}) {
    const std::map<int, uint64_t> lo = ParseNumaMaps(text, 0, split), hi = ParseNumaMaps(text, split, kEnd);
    std::map<int, uint64_t> sum = lo;
    for (auto [node, bytes] : hi) {
      uint64_t& s = sum[node];
      s = bytes > kMax - s ? kMax : s + bytes;
    }
    for (auto it = sum.begin(); it != sum.end();) it = it->second == 0 ? sum.erase(it) : std::next(it);
    std::map<int, uint64_t> whole = all;
    for (auto it = whole.begin(); it != whole.end();) it = it->second == 0 ? whole.erase(it) : std::next(it);
    if (sum != whole) __builtin_trap();
  }
  for (auto [node, bytes] : all) {
    if (node < 0) __builtin_trap();  // "N-1=" is not a node
    (void)bytes;
  }
  return 0;
}
