// The cuda backend's device on the client side: allocations by cudaMalloc, export by CUDA IPC
// memory handle of the allocation's base, interprocess events for GPU-side ordering, and event
// flags written by the recording stream (cuStreamWriteValue32, from the driver by entry point:
// libferry does not link libcuda), into the device memory ferryd shares for them where it does,
// else into the ring segment's flag pages.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

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
    FERRY_RETURN_IF_ERROR(FindWriteValue());
    ScopedDevice on(ordinal_);
    FERRY_RETURN_IF_ERROR(on.status());
    FERRY_ASSIGN_OR_RETURN(const uint64_t dev, RegisterMappedHost(flags, bytes));
    flags_host_ = static_cast<std::byte*>(flags);
    flags_device_ = static_cast<CUdeviceptr>(dev);
    return Status::Ok();
  }
  bool MapsDeviceFlags() const override { return true; }
  Status MapDeviceFlags(void* flags, int fd, size_t bytes) override {
    std::lock_guard<std::mutex> l(flags_mu_);
    FERRY_RETURN_IF_ERROR(FindWriteValue());
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
  void UnmapFlags(void* flags) override {
    if (!device_flags_) {
      cudaHostUnregister(flags);
      return;
    }
    ScopedDevice on(ordinal_);
    std::lock_guard<std::mutex> l(flags_mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    bool done = !keep_device_flags_;
    for (cudaEvent_t written : writes_out_) {
      cudaError_t q;
      while ((q = cudaEventQuery(written)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      done = done && q != cudaErrorNotReady;
    }
    for (cudaEvent_t e : writes_out_) cudaEventDestroy(e);
    for (cudaEvent_t e : writes_done_) cudaEventDestroy(e);
    writes_out_.clear();
    writes_done_.clear();
    if (done) {
      device_flags_ = SharedDeviceMemory();
    } else {
      device_flags_.Keep();
    }
  }
  // Into device flags, each write is followed by an event of its own (an event costs the stream
  // nothing), so that UnmapFlags knows when every one is done whatever stream it went on.
  Status WriteFlag(void* stream, uint32_t* flag, uint32_t value) override {
    const CUdeviceptr at = flags_device_ + static_cast<CUdeviceptr>(reinterpret_cast<std::byte*>(flag) - flags_host_);
    if (!device_flags_) return Written(write_value_(static_cast<CUstream>(stream), at, value, 0));
    std::lock_guard<std::mutex> l(flags_mu_);
    while (!writes_out_.empty() && cudaEventQuery(writes_out_.front()) == cudaSuccess) {
      writes_done_.push_back(writes_out_.front());
      writes_out_.pop_front();
    }
    if (writes_out_.size() > kWritesOutToSweep) {  // a stream held up at the front: sweep them all
      std::erase_if(writes_out_, [&](cudaEvent_t e) {
        if (cudaEventQuery(e) != cudaSuccess) return false;
        writes_done_.push_back(e);
        return true;
      });
    }
    if (writes_done_.empty()) {
      ScopedDevice on(ordinal_);
      FERRY_RETURN_IF_ERROR(on.status());
      cudaEvent_t e;
      FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      writes_done_.push_back(e);
    }
    FERRY_RETURN_IF_ERROR(Written(write_value_(static_cast<CUstream>(stream), at, value, 0)));
    cudaEvent_t e = writes_done_.back();
    if (cudaEventRecord(e, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
      keep_device_flags_ = true;  // a write whose end cannot be seen: never unmapped
      return Status::Ok();
    }
    writes_done_.pop_back();
    writes_out_.push_back(e);
    return Status::Ok();
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

  // Caller holds flags_mu_.
  Status FindWriteValue() {
    if (write_value_ != nullptr) return Status::Ok();
    FERRY_ASSIGN_OR_RETURN(void* fn, DriverFunction("cuStreamWriteValue32"));
    write_value_ = reinterpret_cast<WriteValue32>(fn);
    return Status::Ok();
  }
  static Status Written(CUresult r) {
    if (r != CUDA_SUCCESS) return DeviceError("cuStreamWriteValue32 failed (CUresult " + std::to_string(r) + ")");
    return Status::Ok();
  }

  using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  static constexpr size_t kWritesOutToSweep = 256;
  int ordinal_;
  std::mutex flags_mu_;  // MapFlags runs once (ClientCore), WriteFlag only after it; guards the writes' events
  WriteValue32 write_value_ = nullptr;
  std::byte* flags_host_ = nullptr;
  CUdeviceptr flags_device_ = 0;
  SharedDeviceMemory device_flags_;           // MapDeviceFlags's: flags_device_ points into it
  // Device flags: an event recorded behind each write not yet seen done, oldest first, and spare ones.
  std::deque<cudaEvent_t> writes_out_;
  std::vector<cudaEvent_t> writes_done_;
  bool keep_device_flags_ = false;  // a write went out without its event
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
