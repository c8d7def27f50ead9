// What the client library needs from the device it shares with ferryd, behind one interface:
// host_device.cc (the host backend's stand-in: sealed memfds) and cuda_device.cc (CUDA IPC).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/fd.hpp"
#include "common/wire.hpp"
#include "ferry/status.hpp"

namespace ferry::detail {

struct DeviceAllocationState {
  void* ptr = nullptr;
  size_t size = 0;
  bool host_visible = false;
  UniqueFd fd;      // host backend: the memfd behind ptr
  Mapping mapping;  // host backend: its mapping
  std::function<void()> release;  // cuda: cudaFree
  ~DeviceAllocationState() {
    if (release) release();
  }
};

struct ExportedMemory {
  wire::RegisterDeviceRequest request{};
  int fd = -1;                 // borrowed; sent along when >= 0
  uint64_t offset_in_base = 0; // where the exported pointer sits in the allocation sent
};

// The allocation a device pointer lies in, and an id no other allocation of this process has
// had or will have (a new allocation at a freed one's address gets a new id).
struct AllocationInfo {
  uintptr_t base = 0;
  size_t size = 0;
  uint64_t id = 0;
};

struct DeviceEvent {
  void* event = nullptr;  // cudaEvent_t on cuda, unused on host
  wire::RegisterEventRequest request{};
};

class ClientDevice {
 public:
  virtual ~ClientDevice() = default;
  virtual Result<std::shared_ptr<DeviceAllocationState>> Allocate(size_t bytes) = 0;
  // What tells ferryd which GPU this is (kUseGpu): the UUID on cuda, the ordinal on the host backend.
  virtual Result<wire::UseGpuRequest> Identify() = 0;
  virtual Result<ExportedMemory> Export(void* ptr, size_t bytes) = 0;
  virtual Result<AllocationInfo> AllocationOf(const void* ptr) = 0;
  virtual Result<DeviceEvent> CreateEvent() = 0;
  virtual void DestroyEvent(void* event) = 0;
  virtual Status RecordEvent(void* event, void* stream) = 0;
  virtual Status StreamWaitEvent(void* stream, void* event) = 0;
  // A stream of libferry's own (nullptr on the host backend, where nothing runs on streams).
  virtual Result<void*> CreateStream() = 0;
  virtual void DestroyStream(void* stream) = 0;
  // GPU-side "after": the session's event flags (its ring segment's flag pages) made writable
  // by the device, once, before the first WriteFlag; let go before the pages are unmapped.
  virtual Status MapFlags(void* flags, size_t bytes) = 0;
  // Or: ferryd keeps them in device memory it shared as `fd` (`bytes` of it), where WriteFlag then
  // writes the word standing for each of `flags` (RegisterEventReply::flag_place).
  virtual bool MapsDeviceFlags() const { return false; }
  virtual Status MapDeviceFlags(void* flags, int fd, size_t bytes) {
    (void)flags, (void)fd, (void)bytes;
    return NotSupported("event flags in device memory on a device without CUDA");
  }
  // Lets go of the flags' mapping; device flags only once every write enqueued into them is done
  // (a stream that got to one later would write into unmapped memory): those still queued after
  // a second keep them mapped for the process's life.
  virtual void UnmapFlags(void* flags) = 0;
  // Writes `value` into `flag` once `stream`'s earlier work is done (on the host: at once).
  virtual Status WriteFlag(void* stream, uint32_t* flag, uint32_t value) = 0;
  virtual bool StreamWaitIsHostWait() const = 0;
  // Timing events, to measure how long a stream stalled on a StreamWaitEvent (the GPU-side
  // exposed time). Only called where StreamWaitIsHostWait() is false.
  virtual Result<void*> CreateTimingEvent() { return NotSupported("no timing events on this device"); }
  // Nanoseconds from `start` to `end` once `end` has happened; -1 while it has not.
  virtual Result<int64_t> ElapsedIfDone(void* start, void* end) {
    (void)start, (void)end;
    return NotSupported("no timing events on this device");
  }
};

// The host backend's stand-in for simulated GPU `ordinal`.
std::unique_ptr<ClientDevice> MakeHostClientDevice(int ordinal = 0);
// NotSupported when built without CUDA.
Result<std::unique_ptr<ClientDevice>> MakeCudaClientDevice(int device_ordinal);
// The calling thread's current CUDA device (cudaGetDevice); NotSupported without CUDA.
Result<int> CurrentCudaDevice();

}  // namespace ferry::detail
