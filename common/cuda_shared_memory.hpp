// Device memory one process allocates and another maps, through a CUDA shareable handle (a POSIX
// fd of the driver's virtual memory management), not a legacy IPC handle: the physical pages live
// while any process still maps them, so the owner may free its side whenever it likes without
// the other's mapping pointing at memory handed to someone else (freeing memory shared by
// cudaIpcGetMemHandle before the importer closes it is undefined). ferryd shares its sessions'
// device event flags this way. Driver functions by entry point, as in cuda_status.hpp.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "common/fd.hpp"
#include "ferry/status.hpp"

namespace ferry {

// Device memory mapped into this process, read-write for its device; unmapped and released on
// destruction (the pages go once no process maps them).
class SharedDeviceMemory {
 public:
  SharedDeviceMemory() = default;
  SharedDeviceMemory(SharedDeviceMemory&& other) noexcept { *this = std::move(other); }
  SharedDeviceMemory& operator=(SharedDeviceMemory&& other) noexcept;
  SharedDeviceMemory(const SharedDeviceMemory&) = delete;
  SharedDeviceMemory& operator=(const SharedDeviceMemory&) = delete;
  ~SharedDeviceMemory() { Reset(); }

  // At least `bytes` (rounded up to the device's granularity) on device `ordinal`, which must be
  // the calling thread's current device, zeroed; shareable as an fd (Export).
  static Result<SharedDeviceMemory> Create(int ordinal, size_t bytes);
  // What another process exported (Export): `bytes` of it, on device `ordinal` (current).
  static Result<SharedDeviceMemory> Map(int ordinal, int fd, size_t bytes);
  // A new fd for the memory, to send to the process that maps it.
  Result<UniqueFd> Export() const;

  // Lets go of the memory without unmapping it: it stays mapped for the process's life (where
  // work still queued may touch it).
  void Keep() {
    have_handle_ = mapped_ = false;
    va_ = 0;
    bytes_ = 0;
  }

  CUdeviceptr address() const { return va_; }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return va_ != 0; }

 private:
  Status MapHandle(const CUmemAllocationProp& prop, size_t granularity);
  void Reset();
  CUmemGenericAllocationHandle handle_ = 0;
  bool have_handle_ = false;
  CUdeviceptr va_ = 0;
  size_t bytes_ = 0;
  bool mapped_ = false;
};

}  // namespace ferry
