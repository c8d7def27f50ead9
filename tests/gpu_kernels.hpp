#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferry::testing {
// After ~spin_cycles of GPU clock, writes `value` into dst[0, n).
cudaError_t LaunchSpinThenFill(void* dst, size_t n, uint8_t value, long long spin_cycles, cudaStream_t stream);
cudaError_t LaunchSpin(long long spin_cycles, cudaStream_t stream);
}  // namespace ferry::testing
