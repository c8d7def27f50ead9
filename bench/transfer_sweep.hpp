// The tuner's bandwidth guard: copies through ferryd under its running policy, every size from
// 64 KiB to the largest both ways, each size's round trip checked byte for byte.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::bench {

struct Bandwidth {
  size_t bytes = 0;
  std::string direction;  // "h2d" | "d2h"
  double gbps = 0;        // median of `reps` timed batches
};

// Sizes 64 KiB, x16 ..., and max_size (or max_size alone: largest_only); small sizes in batches
// (many in flight, as servers send them), large ones one at a time.
Result<std::vector<Bandwidth>> TransferSweep(const std::string& socket, size_t max_size, int reps,
                                             bool largest_only = false);

}  // namespace ferry::bench
