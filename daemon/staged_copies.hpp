// One copy stream's copies waiting for the backend's next issue, in the shape the batch-copy call
// takes them, with adjacent copies joined.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ferry::daemon {

// Each copy the engines run costs a few microseconds of setup on the host and on the engine, so
// a client's run of adjacent small copies (a tensor sent in 64 KiB pieces) moves far faster as
// one: on the H200, 1024 x 64 KiB as separate copies went at 28 to 32 GB/s through ferryd, the
// same bytes as one copy at 55 (docs/measurements/h200-breakdown-2026-12-05.txt, run F).
//
// Add joins a copy to the last one staged when the caller vouches that both lie in one host
// registration and one device allocation (`joins`: the scheduler knows the session, region and
// slab of each) and it starts exactly where the last one ends, on both sides. A copy that is
// not batchable (a large one, issued on its own) stays apart.
//
// Not thread-safe: the backend's loop thread owns it.
struct StagedCopies {
  std::vector<std::pair<uint64_t, uint32_t>> done_writes;  // (device address, value), after the copies
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  std::vector<bool> batchable;

  void Add(void* dst, const void* src, size_t size, bool can_batch, bool joins) {
    if (joins && can_batch && !dsts.empty() && batchable.back() &&
        static_cast<const std::byte*>(dsts.back()) + sizes.back() == dst &&
        static_cast<const std::byte*>(srcs.back()) + sizes.back() == src) {
      sizes.back() += size;
      return;
    }
    dsts.push_back(dst);
    srcs.push_back(src);
    sizes.push_back(size);
    batchable.push_back(can_batch);
  }

  // After an issue; the done writes are cleared apart (they follow the fences' pass).
  void ClearCopies() {
    dsts.clear();
    srcs.clear();
    sizes.clear();
    batchable.clear();
  }
};

}  // namespace ferry::daemon
