#include "common/cuda_status.hpp"

#include <cuda.h>

#include <string>

namespace ferry {

Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return Status::Ok();
  // The runtime also keeps a failed call's error as the thread's "last error" (unless it is
  // sticky): clear it, or the application's next launch check (PyTorch checks cudaGetLastError
  // after every kernel) reports ferry's failure as its own.
  cudaGetLastError();
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

namespace {

// A driver-API function by name, or nullptr where the driver lacks it.
template <typename Fn>
Fn DriverFunction(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace

Status CudaBufferId(const void* ptr, uint64_t* id) {
  using Fn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  static const Fn fn = DriverFunction<Fn>("cuPointerGetAttribute");
  if (fn == nullptr) return Unavailable("cuPointerGetAttribute is not available from the driver");
  unsigned long long v = 0;
  CUresult r = fn(&v, CU_POINTER_ATTRIBUTE_BUFFER_ID, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) {
    return InvalidArgument("cuPointerGetAttribute(BUFFER_ID) failed (CUresult " + std::to_string(static_cast<int>(r)) +
                           "): not a device pointer of this context");
  }
  *id = v;
  return Status::Ok();
}

Status CudaAllocationRange(const void* ptr, uintptr_t* base, size_t* size) {
  using Fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static const Fn fn = DriverFunction<Fn>("cuMemGetAddressRange");
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
