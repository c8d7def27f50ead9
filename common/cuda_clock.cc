#include "common/cuda_clock.hpp"

#include "common/cuda_status.hpp"
#include "common/fd.hpp"

namespace ferry {

Result<PinnedEventClock> PinEventToHostClock(cudaEvent_t origin, cudaStream_t stream) {
  cudaEvent_t probe = nullptr;
  FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&probe));
  Status st = CudaStatus(cudaEventRecord(origin, stream), "clock origin");
  if (st.ok()) st = CudaStatus(cudaEventSynchronize(origin), "clock origin");
  PinnedEventClock pinned;
  pinned.window_ns = UINT64_MAX;
  for (int i = 0; i < 20 && st.ok(); ++i) {
    const uint64_t before = MonotonicNanos();
    st = CudaStatus(cudaEventRecord(probe, stream), "clock probe");
    cudaError_t q = cudaErrorNotReady;
    while (st.ok() && (q = cudaEventQuery(probe)) == cudaErrorNotReady) {
    }
    const uint64_t after = MonotonicNanos();
    float ms = 0;
    if (st.ok()) st = CudaStatus(q, "clock probe");
    if (st.ok()) st = CudaStatus(cudaEventElapsedTime(&ms, origin, probe), "clock probe");
    if (st.ok() && after - before < pinned.window_ns) {
      pinned.window_ns = after - before;
      pinned.origin_ns = before + (after - before) / 2 - static_cast<uint64_t>(static_cast<double>(ms) * 1e6);
    }
  }
  cudaEventDestroy(probe);
  FERRY_RETURN_IF_ERROR(st);
  return pinned;
}

}  // namespace ferry
