#include "common/cuda_status.hpp"

#include <cuda.h>

#include <string>

namespace ferry {

Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return Status::Ok();
  std::string msg = std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  switch (err) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
      return InvalidArgument(msg);
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return Unavailable(msg);
    case cudaErrorNotSupported:
      return NotSupported(msg);
    default:
      return DeviceError(msg);
  }
}

Status CudaAllocationRange(const void* ptr, uintptr_t* base, size_t* size) {
  using Fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<Fn>(nullptr);
    }
    return reinterpret_cast<Fn>(p);
  }();
  if (fn == nullptr) return Unavailable("cuMemGetAddressRange is not available from the driver");
  CUdeviceptr b = 0;
  CUresult r = fn(&b, size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) {
    return InvalidArgument("cuMemGetAddressRange failed (CUresult " + std::to_string(static_cast<int>(r)) +
                           "): not a device pointer of this context");
  }
  *base = static_cast<uintptr_t>(b);
  return Status::Ok();
}

}  // namespace ferry
