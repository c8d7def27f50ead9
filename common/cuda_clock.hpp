// Lining a CUDA event up with CLOCK_MONOTONIC, so that GPU times of one process can be set beside
// host times and another process's GPU times (ferryd's engine trace, the overlap bench's steps).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ferry/status.hpp"

namespace ferry {

struct PinnedEventClock {
  uint64_t origin_ns = 0;  // when `origin` happened, on CLOCK_MONOTONIC
  uint64_t window_ns = 0;  // ... known to within half this
};

// Records `origin` on `stream` (a timing event; the stream idle but for what came before) and
// pins down its CLOCK_MONOTONIC time: probe events are recorded after it and polled, each
// one's GPU time lying between the host clock before its record and after it was first seen
// done; the narrowest of 20 such windows wins. Later events' times are then origin_ns plus
// cudaEventElapsedTime from `origin` (float milliseconds: re-pin before they grow past
// seconds, where their resolution coarsens to microseconds).
Result<PinnedEventClock> PinEventToHostClock(cudaEvent_t origin, cudaStream_t stream);

}  // namespace ferry
