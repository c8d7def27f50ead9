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

Result<void*> DriverFunction(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  FERRY_CUDA_RETURN_IF_ERROR(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return NotSupported(std::string("the CUDA driver has no ") + name);
  }
  return fn;
}

Result<uint64_t> RegisterMappedHost(void* host, size_t bytes) {
  FERRY_CUDA_RETURN_IF_ERROR(cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  void* dev = nullptr;
  if (Status st = CudaStatus(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer"); !st.ok()) {
    cudaHostUnregister(host);
    return st;
  }
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(dev));
}

Status CudaBufferId(const void* ptr, uint64_t* id) {
  using Fn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  static const Result<void*> found = DriverFunction("cuPointerGetAttribute");
  if (!found.ok()) return Unavailable("cuPointerGetAttribute is not available from the driver");
  const auto fn = reinterpret_cast<Fn>(*found);
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
  static const Result<void*> found = DriverFunction("cuMemGetAddressRange");
  if (!found.ok()) return Unavailable("cuMemGetAddressRange is not available from the driver");
  const auto fn = reinterpret_cast<Fn>(*found);
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
