#include "common/cuda_shared_memory.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda_status.hpp"
#include "common/status_macros.hpp"

namespace ferry {
namespace {

// The driver's virtual memory management, looked up once.
struct Vmm {
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*export_handle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                            unsigned long long) = nullptr;
  CUresult (*import_handle)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  Status status;
};

template <typename F>
Status Look(F& fn, const char* name) {
  FERRY_ASSIGN_OR_RETURN(void* p, DriverFunction(name));
  fn = reinterpret_cast<F>(p);
  return Status::Ok();
}

const Vmm& TheVmm() {
  static const Vmm vmm = [] {
    Vmm v;
    v.status = [&]() -> Status {
      FERRY_RETURN_IF_ERROR(Look(v.granularity, "cuMemGetAllocationGranularity"));
      FERRY_RETURN_IF_ERROR(Look(v.create, "cuMemCreate"));
      FERRY_RETURN_IF_ERROR(Look(v.release, "cuMemRelease"));
      FERRY_RETURN_IF_ERROR(Look(v.reserve, "cuMemAddressReserve"));
      FERRY_RETURN_IF_ERROR(Look(v.address_free, "cuMemAddressFree"));
      FERRY_RETURN_IF_ERROR(Look(v.map, "cuMemMap"));
      FERRY_RETURN_IF_ERROR(Look(v.unmap, "cuMemUnmap"));
      FERRY_RETURN_IF_ERROR(Look(v.set_access, "cuMemSetAccess"));
      FERRY_RETURN_IF_ERROR(Look(v.export_handle, "cuMemExportToShareableHandle"));
      FERRY_RETURN_IF_ERROR(Look(v.import_handle, "cuMemImportFromShareableHandle"));
      FERRY_RETURN_IF_ERROR(Look(v.device_get, "cuDeviceGet"));
      FERRY_RETURN_IF_ERROR(Look(v.attribute, "cuDeviceGetAttribute"));
      return Status::Ok();
    }();
    return v;
  }();
  return vmm;
}

Status Driver(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  return DeviceError(std::string(what) + " failed (CUresult " + std::to_string(r) + ")");
}

CUmemAllocationProp PropertiesOn(int ordinal) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

}  // namespace

SharedDeviceMemory& SharedDeviceMemory::operator=(SharedDeviceMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    handle_ = std::exchange(other.handle_, 0);
    have_handle_ = std::exchange(other.have_handle_, false);
    va_ = std::exchange(other.va_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    mapped_ = std::exchange(other.mapped_, false);
  }
  return *this;
}

void SharedDeviceMemory::Reset() {
  const Vmm& v = TheVmm();
  if (mapped_) v.unmap(va_, bytes_);
  if (va_ != 0) v.address_free(va_, bytes_);
  if (have_handle_) v.release(handle_);
  handle_ = 0;
  have_handle_ = false;
  va_ = 0;
  bytes_ = 0;
  mapped_ = false;
}

Result<SharedDeviceMemory> SharedDeviceMemory::Create(int ordinal, size_t bytes) {
  const Vmm& v = TheVmm();
  FERRY_RETURN_IF_ERROR(v.status);
  CUdevice device = 0;
  FERRY_RETURN_IF_ERROR(Driver(v.device_get(&device, ordinal), "cuDeviceGet"));
  int vmm = 0, fds = 0;
  FERRY_RETURN_IF_ERROR(Driver(v.attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device),
                               "cuDeviceGetAttribute"));
  FERRY_RETURN_IF_ERROR(
      Driver(v.attribute(&fds, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device),
             "cuDeviceGetAttribute"));
  if (!vmm || !fds) return NotSupported("the device cannot share memory by a file descriptor");
  const CUmemAllocationProp prop = PropertiesOn(ordinal);
  size_t granularity = 0;
  FERRY_RETURN_IF_ERROR(
      Driver(v.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity"));
  if (granularity == 0) return DeviceError("the device's allocation granularity is 0");
  SharedDeviceMemory m;
  m.bytes_ = (bytes + granularity - 1) / granularity * granularity;
  FERRY_RETURN_IF_ERROR(Driver(v.create(&m.handle_, m.bytes_, &prop, 0), "cuMemCreate"));
  m.have_handle_ = true;
  FERRY_RETURN_IF_ERROR(m.MapHandle(prop, granularity));
  // Zeroed by a copy from the host (a memset kernel could queue behind a client's long kernels),
  // on a stream of its own that is waited for: from pageable memory the copy's call may return
  // before the data lands.
  const std::vector<uint8_t> zeros(m.bytes_, 0);
  cudaStream_t s = nullptr;
  FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Status zeroed =
      CudaStatus(cudaMemcpyAsync(reinterpret_cast<void*>(m.va_), zeros.data(), m.bytes_, cudaMemcpyHostToDevice, s),
                 "zeroing shared device memory");
  if (zeroed.ok()) zeroed = CudaStatus(cudaStreamSynchronize(s), "zeroing shared device memory");
  cudaStreamDestroy(s);
  FERRY_RETURN_IF_ERROR(zeroed);
  return m;
}

Result<SharedDeviceMemory> SharedDeviceMemory::Map(int ordinal, int fd, size_t bytes) {
  const Vmm& v = TheVmm();
  FERRY_RETURN_IF_ERROR(v.status);
  const CUmemAllocationProp prop = PropertiesOn(ordinal);
  size_t granularity = 0;
  FERRY_RETURN_IF_ERROR(
      Driver(v.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity"));
  if (granularity == 0 || bytes == 0 || bytes % granularity != 0) {
    return InvalidArgument("shared device memory of " + std::to_string(bytes) + " bytes: not a multiple of the " +
                           std::to_string(granularity) + "-byte allocation granularity");
  }
  SharedDeviceMemory m;
  m.bytes_ = bytes;
  FERRY_RETURN_IF_ERROR(Driver(v.import_handle(&m.handle_, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                               "cuMemImportFromShareableHandle"));
  m.have_handle_ = true;
  FERRY_RETURN_IF_ERROR(m.MapHandle(prop, granularity));
  return m;
}

// Address space for the handle's bytes_, the handle mapped there, read-write for its device.
Status SharedDeviceMemory::MapHandle(const CUmemAllocationProp& prop, size_t granularity) {
  const Vmm& v = TheVmm();
  FERRY_RETURN_IF_ERROR(Driver(v.reserve(&va_, bytes_, granularity, 0, 0), "cuMemAddressReserve"));
  FERRY_RETURN_IF_ERROR(Driver(v.map(va_, bytes_, 0, handle_, 0), "cuMemMap"));
  mapped_ = true;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return Driver(v.set_access(va_, bytes_, &access, 1), "cuMemSetAccess");
}

Result<UniqueFd> SharedDeviceMemory::Export() const {
  const Vmm& v = TheVmm();
  FERRY_RETURN_IF_ERROR(v.status);
  if (!have_handle_) return Internal("no device memory to share");
  int fd = -1;
  FERRY_RETURN_IF_ERROR(Driver(v.export_handle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                               "cuMemExportToShareableHandle"));
  return UniqueFd(fd);
}

}  // namespace ferry
