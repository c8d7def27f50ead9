// The one place where CUDA errors become ferry Statuses, and where the few driver-API calls
// ferry needs are reached (through the runtime's entry points, so nothing links libcuda and
// binaries start on machines without a driver).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

#include "common/status_macros.hpp"
#include "ferry/status.hpp"

namespace ferry {

Status CudaStatus(cudaError_t err, std::string_view what);
// A driver-API function by name, through the runtime's entry points: the query's error, or
// NotSupported where the driver lacks the function.
Result<void*> DriverFunction(const char* name);
// Pins `bytes` of host memory at `host` for every context, mapped, and says where the current
// device's engines see it (for cuStreamWriteValue32 / cuStreamWaitValue32 on a host word).
// Nothing stays registered on failure; cudaHostUnregister(host) undoes it.
Result<uint64_t> RegisterMappedHost(void* host, size_t bytes);
// The allocation that contains `ptr`: its base and size (cuMemGetAddressRange).
Status CudaAllocationRange(const void* ptr, uintptr_t* base, size_t* size);
// The allocation's buffer id (CU_POINTER_ATTRIBUTE_BUFFER_ID): unique for the process's life.
Status CudaBufferId(const void* ptr, uint64_t* id);

}  // namespace ferry

#define FERRY_CUDA_RETURN_IF_ERROR(call) FERRY_RETURN_IF_ERROR(::ferry::CudaStatus((call), #call))
