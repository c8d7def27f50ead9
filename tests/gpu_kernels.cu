// Kernels for the GPU tests: work that takes a known while on the device, so a test can tell
// whether a copy was really ordered behind it (or ahead of it) on the GPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_kernels.hpp"

namespace {

__global__ void SpinThenFill(uint8_t* dst, size_t n, uint8_t value, long long spin_cycles) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const long long start = clock64();
    while (clock64() - start < spin_cycles) {
    }
  }
  __syncthreads();  // one block: every thread writes only after thread 0 has spun
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) dst[i] = value;
}

__global__ void Spin(long long spin_cycles) {
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
}

}  // namespace

namespace ferry::testing {

cudaError_t LaunchSpinThenFill(void* dst, size_t n, uint8_t value, long long spin_cycles, cudaStream_t stream) {
  SpinThenFill<<<1, 1024, 0, stream>>>(static_cast<uint8_t*>(dst), n, value, spin_cycles);
  return cudaGetLastError();
}

cudaError_t LaunchSpin(long long spin_cycles, cudaStream_t stream) {
  Spin<<<1, 1, 0, stream>>>(spin_cycles);
  return cudaGetLastError();
}

}  // namespace ferry::testing
