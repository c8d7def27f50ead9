// The cuda backend's device on the client side: allocations by cudaMalloc, export by CUDA IPC
// memory handle of the allocation's base, interprocess events for GPU-side ordering, and event
// flags written by the recording stream (cuStreamWriteValue32, from the driver by entry point:
// libferry does not link libcuda).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "client/device_api.hpp"
#include "common/cuda_shared_memory.hpp"
#include "common/cuda_status.hpp"
#include "common/status_macros.hpp"

namespace ferry::detail {
namespace {

// Makes the client's GPU current for one call and puts the calling thread's current device back
// after it: libferry never changes which GPU the caller's later allocations and launches go to
// (a process with a client per GPU calls them all from one thread).
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != ordinal) {
      status_ = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice");
      switched_ = status_.ok() && previous_ >= 0;
    }
  }
  ~ScopedDevice() {
    if (switched_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  Status status_;
};

class CudaClientDevice : public ClientDevice {
 public:
  explicit CudaClientDevice(int ordinal) : ordinal_(ordinal) {}

  Result<wire::UseGpuRequest> Identify() override {
    cudaDeviceProp prop{};
    FERRY_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal_));
    wire::UseGpuRequest r{};
    r.ordinal = ordinal_;
    static_assert(sizeof prop.uuid.bytes == wire::kGpuUuidBytes);
    std::memcpy(r.uuid, prop.uuid.bytes, sizeof r.uuid);
    return r;
  }

  Result<std::shared_ptr<DeviceAllocationState>> Allocate(size_t bytes) override {
    ScopedDevice on(ordinal_);
    FERRY_RETURN_IF_ERROR(on.status());
    void* p = nullptr;
    FERRY_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    auto s = std::make_shared<DeviceAllocationState>();
    s->ptr = p;
    s->size = bytes;
    s->release = [p] { cudaFree(p); };
    return s;
  }

  Result<ExportedMemory> Export(void* ptr, size_t bytes) override {
    uintptr_t base = 0;
    size_t size = 0;
    FERRY_RETURN_IF_ERROR(CudaAllocationRange(ptr, &base, &size));
    const uint64_t off = reinterpret_cast<uintptr_t>(ptr) - base;
    if (off > size || bytes > size - off) return InvalidArgument("range runs past the end of its allocation");
    cudaPointerAttributes attr{};
    FERRY_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, ptr));
    if (attr.type != cudaMemoryTypeDevice) return InvalidArgument("not device memory (cudaMalloc it)");
    if (attr.device != ordinal_) {
      return InvalidArgument("memory is on CUDA device " + std::to_string(attr.device) + "; this client copies to device " +
                             std::to_string(ordinal_) + " (connect a client per GPU: ConnectOptions::device)");
    }
    cudaIpcMemHandle_t h;
    FERRY_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)));
    ExportedMemory e;
    e.request.kind = static_cast<uint32_t>(wire::DeviceHandleKind::kCudaIpc);
    e.request.device_ordinal = ordinal_;
    e.request.size = size;
    std::memcpy(e.request.handle, &h, sizeof h);
    e.offset_in_base = off;
    return e;
  }

  Result<AllocationInfo> AllocationOf(const void* ptr) override {
    AllocationInfo a;
    FERRY_RETURN_IF_ERROR(CudaAllocationRange(ptr, &a.base, &a.size));
    FERRY_RETURN_IF_ERROR(CudaBufferId(ptr, &a.id));
    return a;
  }

  Result<DeviceEvent> CreateEvent() override {
    ScopedDevice on(ordinal_);
    FERRY_RETURN_IF_ERROR(on.status());
    cudaEvent_t ev;
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcEventHandle_t h;
    Status st = CudaStatus(cudaIpcGetEventHandle(&h, ev), "cudaIpcGetEventHandle");
    if (!st.ok()) {
      cudaEventDestroy(ev);
      return st;
    }
    DeviceEvent e;
    e.event = ev;
    e.request.kind = static_cast<uint32_t>(wire::EventHandleKind::kCudaIpc);
    std::memcpy(e.request.handle, &h, sizeof h);
    return e;
  }
  void DestroyEvent(void* ev) override { cudaEventDestroy(static_cast<cudaEvent_t>(ev)); }
  Status RecordEvent(void* ev, void* stream) override {
    return CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(ev), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  }
  Status StreamWaitEvent(void* stream, void* ev) override {
    return CudaStatus(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(ev), 0),
                      "cudaStreamWaitEvent");
  }
  Result<void*> CreateStream() override {
    ScopedDevice on(ordinal_);
    FERRY_RETURN_IF_ERROR(on.status());
    cudaStream_t s;
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return static_cast<void*>(s);
  }
  void DestroyStream(void* s) override { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }
  bool StreamWaitIsHostWait() const override { return false; }

  Status MapFlags(void* flags, size_t bytes) override {
    std::lock_guard<std::mutex> l(flags_mu_);
    if (write_value_ == nullptr) {
      FERRY_ASSIGN_OR_RETURN(void* fn, DriverFunction("cuStreamWriteValue32"));
      write_value_ = reinterpret_cast<WriteValue32>(fn);
    }
    ScopedDevice on(ordinal_);
    FERRY_RETURN_IF_ERROR(on.status());
    FERRY_ASSIGN_OR_RETURN(const uint64_t dev, RegisterMappedHost(flags, bytes));
    flags_host_ = static_cast<std::byte*>(flags);
    flags_device_ = static_cast<CUdeviceptr>(dev);
    return Status::Ok();
  }
  Status MapDeviceFlags(void* flags, int fd, size_t bytes) override {
    std::lock_guard<std::mutex> l(flags_mu_);
    if (write_value_ == nullptr) {
      FERRY_ASSIGN_OR_RETURN(void* fn, DriverFunction("cuStreamWriteValue32"));
      write_value_ = reinterpret_cast<WriteValue32>(fn);
    }
    ScopedDevice on(ordinal_);
    FERRY_RETURN_IF_ERROR(on.status());
    FERRY_ASSIGN_OR_RETURN(device_flags_, SharedDeviceMemory::Map(ordinal_, fd, bytes));
    if (device_flags_.bytes() < wire::kEventFlagsBytes) {
      device_flags_ = SharedDeviceMemory();
      return ProtocolError("ferryd shared " + std::to_string(bytes) + " bytes of device memory for the event flags");
    }
    flags_host_ = static_cast<std::byte*>(flags);
    flags_device_ = device_flags_.address();
    return Status::Ok();
  }
  // Device flags are unmapped only once every write enqueued into them is done: a stream that
  // gets to its write later would write into unmapped memory and fault the caller's context.
  // A stream still held after a second keeps them mapped for the process's life instead.
  void UnmapFlags(void* flags) override {
    if (!device_flags_) {
      cudaHostUnregister(flags);
      return;
    }
    ScopedDevice on(ordinal_);
    std::lock_guard<std::mutex> l(flags_mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    bool done = true;
    for (const auto& [stream, written] : flag_writes_) {
      cudaError_t q;
      while ((q = cudaEventQuery(written)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      done = done && q != cudaErrorNotReady;
    }
    cudaGetLastError();
    for (const auto& [stream, written] : flag_writes_) cudaEventDestroy(written);
    flag_writes_.clear();
    if (done) {
      device_flags_ = SharedDeviceMemory();
    } else {
      device_flags_.Keep();
    }
  }
  Status WriteFlag(void* stream, uint32_t* flag, uint32_t value) override {
    const CUdeviceptr at = flags_device_ + static_cast<CUdeviceptr>(reinterpret_cast<std::byte*>(flag) - flags_host_);
    const CUresult r = write_value_(static_cast<CUstream>(stream), at, value, 0);
    if (r != CUDA_SUCCESS) return DeviceError("cuStreamWriteValue32 failed (CUresult " + std::to_string(r) + ")");
    if (!device_flags_) return Status::Ok();
    // Device flags: an event behind the write, for UnmapFlags (an event costs the stream nothing).
    std::lock_guard<std::mutex> l(flags_mu_);
    auto [it, fresh] = flag_writes_.try_emplace(stream, nullptr);
    if (fresh) {
      ScopedDevice on(ordinal_);
      if (Status st = on.status(); !st.ok()) return st;
      if (const cudaError_t e = cudaEventCreateWithFlags(&it->second, cudaEventDisableTiming); e != cudaSuccess) {
        flag_writes_.erase(it);
        return CudaStatus(e, "cudaEventCreateWithFlags");
      }
    }
    return CudaStatus(cudaEventRecord(it->second, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  }
  Result<void*> CreateTimingEvent() override { return NewEvent(cudaEventDefault); }
  Result<int64_t> ElapsedIfDone(void* start, void* end) override {
    const cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(end));
    if (q == cudaErrorNotReady) return int64_t{-1};
    FERRY_CUDA_RETURN_IF_ERROR(q);
    float ms = 0;
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
    return static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  }

 private:
  // An event of this process on the client's GPU.
  Result<void*> NewEvent(unsigned int flags) {
    ScopedDevice on(ordinal_);
    FERRY_RETURN_IF_ERROR(on.status());
    cudaEvent_t ev;
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ev, flags));
    return static_cast<void*>(ev);
  }

  using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  int ordinal_;
  std::mutex flags_mu_;  // MapFlags runs once (ClientCore), WriteFlag only after it; guards flag_writes_
  WriteValue32 write_value_ = nullptr;
  std::byte* flags_host_ = nullptr;
  CUdeviceptr flags_device_ = 0;
  SharedDeviceMemory device_flags_;           // MapDeviceFlags's: flags_device_ points into it
  std::map<void*, cudaEvent_t> flag_writes_;  // by stream: recorded after its last flag write
};

}  // namespace

Result<int> CurrentCudaDevice() {
  int d = 0;
  FERRY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&d));
  return d;
}

Result<std::unique_ptr<ClientDevice>> MakeCudaClientDevice(int ordinal) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || ordinal >= count) {
    cudaGetLastError();
    return Unavailable("ferryd runs the cuda backend, but this process sees no CUDA device " + std::to_string(ordinal));
  }
  return std::unique_ptr<ClientDevice>(std::make_unique<CudaClientDevice>(ordinal));
}

}  // namespace ferry::detail
