// The cuda backend: the pool registered slab by slab with cudaHostRegister (a reclaimed slab gets
// fresh pages, so it is unregistered and registered again on its own), per-direction copy streams
// (stream 0 at the highest priority, for latency-class copies), device memory opened from CUDA
// IPC handles (once per handle, shared by refcount), interprocess events for GPU-side ordering,
// and fences (no CPU thread blocks on the GPU): where the device has stream memory operations,
// each copy stream writes a sequence number into a word of a mapped page this backend owns
// after a group's copies, and the loop reads the word (a load, where cudaEventQuery or
// cudaStreamQuery cost 0.2 to 1.3 us a call on the H200's host, paid on every turn while a copy
// is out); else events polled with cudaEventQuery. FERRY_FENCES=events keeps events, for
// comparison.
// "After" a client's event, where the device has stream memory operations: a lane (a stream of
// its own per session and direction) waits on the event's flag with cuStreamWaitValue32, then
// copies; ferryd never waits on another process's event on the GPU (a cross-context wait cost
// 0.4 ms a hand-off on the H200). The flags a lane waits on live in device memory ferryd shares
// with the session by fd (a wait on a device word costs the engines less than on a host word),
// or in the ring segment's host pages: FERRY_EVENT_FLAGS=device or host picks, for comparison
// (kDeviceFlagsByDefault without it). The driver's entry
// points are looked up, not linked.
// With the engine trace on, each stream's share of a group is bracketed by timing events and its
// timeline logged when it is seen done (see CopySpan).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "common/cuda_clock.hpp"
#include "common/cuda_shared_memory.hpp"
#include "common/cuda_status.hpp"
#include "common/environment.hpp"
#include "common/fd.hpp"
#include "common/gpu_uuid.hpp"
#include "common/log.hpp"
#include "common/status_macros.hpp"
#include "daemon/backend.hpp"
#include "daemon/issue_crew.hpp"
#include "daemon/numa.hpp"
#include "daemon/staged_copies.hpp"

namespace ferry::daemon {
namespace {

using HandleKey = std::string;  // the 64 handle bytes

struct OpenedMemory {
  void* ptr = nullptr;
  uint64_t size = 0;
  int refs = 0;
};

class CudaBackend;

class CudaRegion : public DeviceRegion {
 public:
  CudaRegion(CudaBackend* owner, HandleKey key, std::byte* base, uint64_t size)
      : owner_(owner), key_(std::move(key)), base_(base), size_(size) {}
  ~CudaRegion() override;
  std::byte* base() const override { return base_; }
  uint64_t size() const override { return size_; }

 private:
  CudaBackend* owner_;
  HandleKey key_;
  std::byte* base_;
  uint64_t size_;
};

class CudaEvent : public SharedEvent {
 public:
  explicit CudaEvent(cudaEvent_t e) : e_(e) {}
  ~CudaEvent() override { cudaEventDestroy(e_); }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_;
};

class CudaBackend : public Backend {
 public:
  CudaBackend(GpuLocation where, uint32_t streams, bool trace, CrewPlacement crew, uint32_t issue_threads_asked)
      : device_(where.ordinal),
        where_(std::move(where)),
        streams_per_dir_(streams),
        trace_(trace),
        crew_(crew.threads, crew.cpus),
        crew_cpus_(crew.cpus.size()),
        issue_threads_asked_(issue_threads_asked) {}

  // ferryd drives all its GPUs from the same threads: every call that enqueues, opens or
  // registers something makes this backend's device current first. Remembered per thread, so a
  // switch happens only when another GPU's backend ran on this thread since.
  cudaError_t MakeCurrent() const {
    thread_local int current = -1;
    if (current == device_) return cudaSuccess;
    const cudaError_t e = cudaSetDevice(device_);
    current = e == cudaSuccess ? device_ : -1;
    return e;
  }

  Status Init() {
    FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
    cudaDeviceProp prop{};
    FERRY_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    const std::string uuid = FormatGpuUuid(reinterpret_cast<const uint8_t*>(prop.uuid.bytes));
    info_ = DeviceInfo{"cuda", device_, prop.name, uuid, driver, runtime, "", where_.numa_node, where_.pci_bus_id};
    describe_ = std::string("cuda: ") + prop.name + " (sm_" + std::to_string(prop.major) +
                std::to_string(prop.minor) + ", " + uuid + ", NUMA node " + std::to_string(info_.numa_node) +
                "), " + std::to_string(prop.asyncEngineCount) +
                " copy engines, CUDA driver " + environment::CudaVersionText(driver) + ", runtime " +
                environment::CudaVersionText(runtime);
    int lo = 0, hi = 0;
    FERRY_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    for (int d = 0; d < 2; ++d) {
      for (uint32_t i = 0; i < streams_per_dir_; ++i) {
        cudaStream_t s;
        FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, StreamHasGreatestPriority(i) ? hi : lo));
        streams_[d].push_back(s);
      }
    }
    if (trace_) FERRY_RETURN_IF_ERROR(StartTrace());
    if (Status st = ProbeFlagWaits(); !st.ok()) {
      cudaGetLastError();
      FERRY_LOG(kWarning) << "stream memory operations unusable (" << st.message()
                          << "): copies ordered after a client's event are handed off on the host";
    } else {
      flag_waits_ = true;
    }
    if (const char* delay = std::getenv("FERRY_PART_DELAY_MS")) {
      part_delay_ms_ = static_cast<uint32_t>(std::clamp(std::atoi(delay), 0, 10'000));
    }
    if (const char* fail = std::getenv("FERRY_PART_FAIL")) {
      part_to_fail_ = std::clamp(std::atoi(fail), -1, static_cast<int>(kMaxIssueThreads));
    }
    const char* fences = std::getenv("FERRY_FENCES");
    if (flag_waits_ && !trace_ && (fences == nullptr || std::strcmp(fences, "events") != 0)) {
      if (Status st = AllocateFenceWords(); !st.ok()) {
        cudaGetLastError();
        FERRY_LOG(kWarning) << "fence words unusable (" << st.message() << "): copies are seen done by events";
      }
    }
    describe_ += fence_page_ ? "; copies seen done by fence words" : "; copies seen done by events";
    const char* flags = std::getenv("FERRY_EVENT_FLAGS");
    const bool device_flags = flags == nullptr ? kDeviceFlagsByDefault : std::strcmp(flags, "device") == 0;
    if (flags != nullptr && std::strcmp(flags, "device") != 0 && std::strcmp(flags, "host") != 0) {
      FERRY_LOG(kWarning) << "FERRY_EVENT_FLAGS is '" << flags << "', neither 'device' nor 'host': event flags in "
                          << (device_flags ? "device" : "host") << " memory";
    }
    if (flag_waits_ && device_flags) {
      if (Status st = ProbeDeviceFlags(); !st.ok()) {
        cudaGetLastError();
        FERRY_LOG(kWarning) << "event flags in device memory unusable (" << st.message()
                            << "): lanes wait on flags in host memory";
      }
    }
    if (flag_waits_) describe_ += device_flags_on_ ? "; event flags in device memory" : "; event flags in host memory";
    describe_ += crew_.threads() > 1 ? "; lists of small host-to-device copies issued by " +
                                           std::to_string(crew_.threads()) + " threads at once"
                                     : "; copies issued by the event loop alone";
    if (crew_.threads() < issue_threads_asked_) {
      describe_ += " (issue_threads is " + std::to_string(issue_threads_asked_) + "; the helpers may run on " +
                   std::to_string(crew_cpus_) + " CPUs)";
    }
    return Status::Ok();
  }

  // The page of fence words, one a copy stream ([direction * 32 + stream]), zero to start.
  Status AllocateFenceWords() {
    fence_page_.reset(static_cast<uint32_t*>(std::aligned_alloc(kFencePageBytes, kFencePageBytes)));
    if (!fence_page_) return ResourceExhausted("no memory for the fence words");
    std::memset(fence_page_.get(), 0, kFencePageBytes);
    auto dev = RegisterMappedHost(fence_page_.get(), kFencePageBytes);
    if (!dev.ok()) {
      fence_page_.reset();
      return dev.status();
    }
    fence_dev_ = static_cast<CUdeviceptr>(*dev);
    return Status::Ok();
  }

  // Whether this device can share device memory by fd and wait on it: a stream for the flag
  // writes that let an ended session's lanes go, and one shared allocation made and exported,
  // written, waited on and freed.
  Status ProbeDeviceFlags() {
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&flag_stream_, cudaStreamNonBlocking));
    FERRY_ASSIGN_OR_RETURN(SharedDeviceMemory m, SharedDeviceMemory::Create(device_, wire::kEventFlagsBytes));
    FERRY_ASSIGN_OR_RETURN(UniqueFd fd, m.Export());
    FERRY_RETURN_IF_ERROR(DriverStatus(write_value_(flag_stream_, m.address(), 7, 0), "cuStreamWriteValue32"));
    FERRY_RETURN_IF_ERROR(DriverStatus(wait_value_(flag_stream_, m.address(), 7, CU_STREAM_WAIT_VALUE_GEQ),
                                       "cuStreamWaitValue32"));
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(flag_stream_));
    uint32_t word = 0;
    FERRY_CUDA_RETURN_IF_ERROR(cudaMemcpy(&word, reinterpret_cast<void*>(m.address()), sizeof word, cudaMemcpyDeviceToHost));
    if (word != 7) return Internal("the probe's write did not land");
    device_flags_on_ = true;
    return Status::Ok();
  }

  uint32_t FenceWord(uint32_t index) const {
    return std::atomic_ref<uint32_t>(fence_page_.get()[index]).load(std::memory_order_acquire);
  }

  // Whether a stream can wait on a word of host memory that a stream writes: the driver's entry
  // points, and one write then wait on a registered page, done.
  Status ProbeFlagWaits() {
    int can_register = 0, same_address = 0;
    FERRY_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&can_register, cudaDevAttrHostRegisterSupported, device_));
    if (!can_register) return NotSupported("the device cannot register host memory");
    FERRY_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&same_address, cudaDevAttrCanUseHostPointerForRegisteredMem, device_));
    FERRY_ASSIGN_OR_RETURN(void* wait_value, DriverFunction("cuStreamWaitValue32"));
    FERRY_ASSIGN_OR_RETURN(void* write_value, DriverFunction("cuStreamWriteValue32"));
    wait_value_ = reinterpret_cast<decltype(wait_value_)>(wait_value);
    write_value_ = reinterpret_cast<decltype(write_value_)>(write_value);
    constexpr size_t kPage = 4096;
    std::unique_ptr<uint32_t, decltype(&std::free)> page(static_cast<uint32_t*>(std::aligned_alloc(kPage, kPage)),
                                                         &std::free);
    if (!page) return ResourceExhausted("no memory for the probe page");
    *page = 0;
    FERRY_ASSIGN_OR_RETURN(const uint64_t dev, RegisterMappedHost(page.get(), kPage));
    cudaStream_t s = streams_[0][0];
    Status st = DriverStatus(write_value_(s, static_cast<CUdeviceptr>(dev), 7, 0), "cuStreamWriteValue32");
    if (st.ok()) {
      st = DriverStatus(wait_value_(s, static_cast<CUdeviceptr>(dev), 7, CU_STREAM_WAIT_VALUE_GEQ),
                        "cuStreamWaitValue32");
    }
    if (st.ok()) st = CudaStatus(cudaStreamSynchronize(s), "probe of stream memory operations");
    if (st.ok() && std::atomic_ref<uint32_t>(*page).load() != 7) st = Internal("the probe's write did not land");
    cudaHostUnregister(page.get());
    return st;
  }

  static Status DriverStatus(CUresult r, const char* what) {
    if (r == CUDA_SUCCESS) return Status::Ok();
    return DeviceError(std::string(what) + " failed (CUresult " + std::to_string(r) + ")");
  }

  // Time zero of the trace: an event on an idle stream, lined up with CLOCK_MONOTONIC
  // (PinEventToHostClock). Pinned again once the engines are idle a while after traced copies
  // (MaybeRepinTrace): times are float milliseconds from time zero, whose resolution coarsens as
  // they grow (about 2 us after 30 s).
  Status StartTrace() {
    if (trace_origin_ == nullptr) FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&trace_origin_));
    FERRY_ASSIGN_OR_RETURN(const PinnedEventClock pinned, PinEventToHostClock(trace_origin_, streams_[0][0]));
    trace_origin_ns_ = pinned.origin_ns;
    trace_pinned_ns_ = MonotonicNanos();
    traced_since_pin_ = false;
    const std::string zero = std::to_string(trace_origin_ns_) +
                             " ns on CLOCK_MONOTONIC (GPU and host clocks lined up to within " +
                             std::to_string((pinned.window_ns + 999) / 2000) + " us)";
    if (trace_pins_++ == 0) {
      FERRY_LOG(kInfo) << "engine trace on: each copy group's issue, engine start and end, and when ferryd saw it "
                          "done are logged, in microseconds from time zero, "
                       << zero;
    } else {
      FERRY_LOG(kInfo) << "engine trace: time zero moved to " << zero;
    }
    return Status::Ok();
  }

  void MaybeRepinTrace() {
    if (!trace_ || !traced_since_pin_ || !pending_.empty()) return;
    if (MonotonicNanos() - trace_pinned_ns_ < kTraceRepinNs) return;
    if (Status st = StartTrace(); !st.ok()) {
      cudaGetLastError();
      traced_since_pin_ = false;  // keep the old time zero; try again after the next copies
      FERRY_LOG(kWarning) << "engine trace: time zero not moved: " << st.message();
    }
  }

  ~CudaBackend() override {
    MakeCurrent();
    cudaDeviceSynchronize();
    for (auto& g : pending_) {
      for (cudaEvent_t e : g.events) free_events_.push_back(e);
      for (const CopySpan& sp : g.spans) {
        free_events_.push_back(sp.start);
        free_events_.insert(free_events_.end(), sp.part_starts.begin(), sp.part_starts.end());
      }
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (auto& d : streams_) for (cudaStream_t s : d) cudaStreamDestroy(s);
    for (auto& [priority, own] : part_streams_)
      for (cudaStream_t s : own) cudaStreamDestroy(s);
    for (cudaEvent_t e : part_events_) cudaEventDestroy(e);
    for (auto& [key, lane] : lanes_) cudaStreamDestroy(lane);
    for (auto& [key, own] : lane_parts_)
      for (cudaStream_t s : own) cudaStreamDestroy(s);
    if (lane_fork_ != nullptr) cudaEventDestroy(lane_fork_);
    for (auto& [host, page] : flag_pages_) {
      if (page.registered_here) cudaHostUnregister(host);
    }
    {
      std::lock_guard<std::mutex> l(registered_mu_);
      for (void* p : registered_) cudaHostUnregister(p);
    }
    if (whole_ != nullptr) cudaHostUnregister(whole_);
    if (trace_origin_ != nullptr) cudaEventDestroy(trace_origin_);
    if (fence_page_) cudaHostUnregister(fence_page_.get());
    device_flags_.clear();
    if (flag_stream_ != nullptr) cudaStreamDestroy(flag_stream_);
  }

  wire::BackendKind kind() const override { return wire::BackendKind::kCuda; }
  std::string Describe() const override { return describe_; }
  DeviceInfo device_info() const override { return info_; }
  int device_ordinal() const override { return device_; }
  uint32_t streams_per_direction() const override { return streams_per_dir_; }

  // Slab by slab (pool.register): a reclaimed slab gets fresh pages (PinnedPool), and only a
  // slab registered on its own can be unregistered and registered again; copies are then cut at
  // slab boundaries (pieces_stay_in_one_slab). Whole: one registration, reclaimed slabs are
  // zeroed in place; should the driver refuse the range as a whole, slab by slab after all.
  Status RegisterPool(std::byte* base, size_t length, size_t slab_bytes, bool slab_by_slab) override {
    FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
    if (!slab_by_slab) {
      const cudaError_t e = cudaHostRegister(base, length, cudaHostRegisterPortable);
      if (e == cudaSuccess) {
        whole_ = base;
        FERRY_LOG(kInfo) << "pool registered whole: reclaimed slabs are zeroed in place (pool.register)";
        return Status::Ok();
      }
      cudaGetLastError();
      FERRY_LOG(kWarning) << "cudaHostRegister of the whole pool failed (" << cudaGetErrorString(e)
                          << "); registering slab by slab";
    }
    for (size_t off = 0; off < length; off += slab_bytes) FERRY_RETURN_IF_ERROR(PinSlab(base + off, slab_bytes));
    per_slab_ = true;
    // The pool chose its reclaim (fresh pages or zeroing in place) from pool.register before this.
    FERRY_LOG(kInfo) << "pool registered slab by slab (" << length / slab_bytes << " slabs): reclaimed slabs "
                     << (slab_by_slab ? "get fresh pages" : "are zeroed in place (pool.register whole asked)");
    return Status::Ok();
  }
  bool pins_pool() const override { return true; }
  // Called on the pool's zeroer thread (and at start); the CUDA runtime is thread-safe, the
  // device is per thread.
  Status UnpinSlab(std::byte* slab, size_t bytes) override {
    (void)bytes;
    FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
    std::lock_guard<std::mutex> l(registered_mu_);
    if (registered_.count(slab) == 0) return Status::Ok();  // not pinned (a failed PinSlab)
    const cudaError_t e = cudaHostUnregister(slab);
    if (e != cudaSuccess) {
      cudaGetLastError();  // still registered: a later unpin tries again
      return DeviceError(std::string("cudaHostUnregister of a pool slab: ") + cudaGetErrorString(e));
    }
    registered_.erase(slab);
    return Status::Ok();
  }
  Status PinSlab(std::byte* slab, size_t bytes) override {
    FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
    std::lock_guard<std::mutex> l(registered_mu_);
    const cudaError_t e = cudaHostRegister(slab, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return DeviceError(std::string("cudaHostRegister of a pool slab: ") + cudaGetErrorString(e));
    }
    registered_.insert(slab);
    return Status::Ok();
  }
  bool pieces_stay_in_one_slab() const override { return per_slab_; }

  Result<std::unique_ptr<DeviceRegion>> OpenDeviceRegion(const wire::RegisterDeviceRequest& req, UniqueFd) override {
    if (req.kind != static_cast<uint32_t>(wire::DeviceHandleKind::kCudaIpc)) {
      return InvalidArgument("the cuda backend takes CUDA IPC memory handles only");
    }
    // The client's ordinal (req.device_ordinal) is its own numbering (CUDA_VISIBLE_DEVICES may
    // differ): which GPU the memory is on is asked of the driver, once it is mapped here.
    if (req.size == 0) return InvalidArgument("device region of 0 bytes");
    FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
    HandleKey key(reinterpret_cast<const char*>(req.handle), wire::kCudaIpcHandleBytes);
    auto it = opened_.find(key);
    if (it == opened_.end()) {
      cudaIpcMemHandle_t h;
      static_assert(sizeof h == wire::kCudaIpcHandleBytes);
      std::memcpy(&h, req.handle, sizeof h);
      void* ptr = nullptr;
      FERRY_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess));
      cudaPointerAttributes attr{};
      if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess || attr.device != device_) {
        cudaGetLastError();
        cudaIpcCloseMemHandle(ptr);
        return InvalidArgument("the memory is on CUDA device " + std::to_string(attr.device) + " of ferryd, not on " +
                               info_.uuid + " (device " + std::to_string(device_) +
                               "), the GPU this session named: connect one session per GPU");
      }
      // Never trust the claimed size: ask the driver how large the allocation really is.
      uintptr_t base = 0;
      size_t size = 0;
      Status s = CudaAllocationRange(ptr, &base, &size);
      if (!s.ok()) {
        cudaIpcCloseMemHandle(ptr);
        return s;
      }
      it = opened_.emplace(key, OpenedMemory{ptr, size, 0}).first;
    }
    if (req.size > it->second.size) {
      if (it->second.refs == 0) {
        cudaIpcCloseMemHandle(it->second.ptr);
        opened_.erase(it);
      }
      return InvalidArgument("device region claims " + std::to_string(req.size) + " bytes; the allocation has " +
                             std::to_string(it->second.size));
    }
    ++it->second.refs;
    return std::unique_ptr<DeviceRegion>(
        std::make_unique<CudaRegion>(this, key, static_cast<std::byte*>(it->second.ptr), req.size));
  }

  void ReleaseRegion(const HandleKey& key) {
    auto it = opened_.find(key);
    if (it == opened_.end()) return;
    if (--it->second.refs == 0) {
      MakeCurrent();
      cudaIpcCloseMemHandle(it->second.ptr);
      opened_.erase(it);
    }
  }

  Result<std::unique_ptr<SharedEvent>> OpenEvent(const wire::RegisterEventRequest& req) override {
    if (req.kind != static_cast<uint32_t>(wire::EventHandleKind::kCudaIpc)) {
      return InvalidArgument("the cuda backend takes CUDA IPC event handles only");
    }
    cudaIpcEventHandle_t h;
    static_assert(sizeof h == wire::kCudaIpcHandleBytes);
    std::memcpy(&h, req.handle, sizeof h);
    FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
    cudaEvent_t e;
    FERRY_CUDA_RETURN_IF_ERROR(cudaIpcOpenEventHandle(&e, h));
    return std::unique_ptr<SharedEvent>(std::make_unique<CudaEvent>(e));
  }

  Result<bool> EventHappened(SharedEvent& e) override {
    const cudaError_t q = cudaEventQuery(static_cast<CudaEvent&>(e).get());
    if (q == cudaErrorNotReady) return false;
    FERRY_CUDA_RETURN_IF_ERROR(q);
    return true;
  }

  bool waits_on_flags() const override { return flag_waits_; }
  bool writes_done_words() const override { return flag_waits_; }

  Status RegisterFlags(std::byte* flags, size_t bytes) override {
    if (!flag_waits_) return NotSupported("stream memory operations unusable on this device");
    FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
    // With several GPUs the first one's backend registers the pages (for every context); the
    // others find them registered and only ask where their engines see them.
    const cudaError_t registered = cudaHostRegister(flags, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (registered != cudaSuccess && registered != cudaErrorHostMemoryAlreadyRegistered) {
      return CudaStatus(registered, "cudaHostRegister of a session's flag area");
    }
    if (registered != cudaSuccess) cudaGetLastError();
    void* dev = nullptr;
    if (Status st = CudaStatus(cudaHostGetDevicePointer(&dev, flags, 0), "cudaHostGetDevicePointer"); !st.ok()) {
      if (registered == cudaSuccess) cudaHostUnregister(flags);
      return st;
    }
    flag_pages_[flags] = FlagPage{static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(dev)), registered == cudaSuccess};
    return Status::Ok();
  }
  void UnregisterFlags(std::byte* flags) override {
    auto it = flag_pages_.find(flags);
    if (it == flag_pages_.end()) return;
    if (it->second.registered_here) cudaHostUnregister(flags);
    flag_pages_.erase(it);
  }
  Result<SharedDeviceFlags> ShareDeviceFlags(uint32_t, uint64_t session_id, const uint32_t* host_flags) override {
    if (!device_flags_on_) return NotSupported("event flags stay in host memory on this device");
    if (device_flags_.contains(session_id)) return Internal("the session's device flags are shared already");
    FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
    FERRY_ASSIGN_OR_RETURN(SharedDeviceMemory m, SharedDeviceMemory::Create(device_, wire::kEventFlagsBytes));
    FERRY_ASSIGN_OR_RETURN(UniqueFd fd, m.Export());
    const uint64_t bytes = m.bytes();
    device_flags_.emplace(session_id, DeviceFlags{host_flags, std::move(m)});
    return SharedDeviceFlags{std::move(fd), bytes};
  }
  Status WriteDeviceFlag(uint32_t, uint64_t session_id, uint32_t index, uint32_t value) override {
    auto it = device_flags_.find(session_id);
    if (it == device_flags_.end()) return NotFound("the session has no device flags");
    if (index >= wire::kEventFlags) return InvalidArgument("no flag " + std::to_string(index));
    FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
    return DriverStatus(write_value_(flag_stream_, it->second.memory.address() + index * sizeof(uint32_t), value, 0),
                        "cuStreamWriteValue32 of an ended session's flag");
  }
  void CloseLanes(uint64_t session_id) override {
    MakeCurrent();
    if (auto flags = device_flags_.find(session_id); flags != device_flags_.end()) {
      cudaStreamSynchronize(flag_stream_);  // its writes that let the session's lanes go (never blocked)
      // A lane still waiting on them (ferryd stopping past its deadline) keeps them mapped: its
      // wait would read memory gone from under it, a fault for every session.
      if (LanesBusy(session_id)) flags->second.memory.Keep();
      device_flags_.erase(flags);
    }
    for (int d = 0; d < 2; ++d) {
      const uint64_t key = LaneKey(session_id, static_cast<Direction>(d));
      if (auto own = lane_parts_.find(key); own != lane_parts_.end()) {
        for (cudaStream_t s : own->second) cudaStreamDestroy(s);
        lane_parts_.erase(own);
      }
      auto it = lanes_.find(key);
      if (it == lanes_.end()) continue;
      cudaStreamDestroy(it->second);
      lanes_.erase(it);
    }
  }

  // Whether any of the session's lanes (or their part streams) has work not yet done.
  bool LanesBusy(uint64_t session_id) const {
    for (int d = 0; d < 2; ++d) {
      const uint64_t key = LaneKey(session_id, static_cast<Direction>(d));
      std::vector<cudaStream_t> streams;
      if (auto it = lanes_.find(key); it != lanes_.end()) streams.push_back(it->second);
      if (auto own = lane_parts_.find(key); own != lane_parts_.end()) {
        streams.insert(streams.end(), own->second.begin(), own->second.end());
      }
      for (cudaStream_t s : streams) {
        if (cudaStreamQuery(s) == cudaErrorNotReady) return true;
      }
    }
    return false;
  }

  // Where the engines see a word among the first `within` bytes of a registered flag area; 0 if
  // it lies in none.
  CUdeviceptr FlagAreaAddress(const uint32_t* word, size_t within) const {
    auto page = flag_pages_.upper_bound(reinterpret_cast<std::byte*>(const_cast<uint32_t*>(word)));
    if (page == flag_pages_.begin()) return 0;
    --page;
    const auto offset = reinterpret_cast<const std::byte*>(word) - page->first;
    if (offset < 0 || static_cast<size_t>(offset) >= within) return 0;
    return page->second.device + static_cast<CUdeviceptr>(offset);
  }

  // Where the engines see the word a lane waits on: in the session's device flags where it has
  // them, else in its registered flag area; 0 if in neither.
  CUdeviceptr FlagAddress(const FlagWait& wait) const {
    if (auto it = device_flags_.find(wait.session_id); it != device_flags_.end()) {
      const std::ptrdiff_t index = wait.flag - it->second.host;
      if (index < 0 || static_cast<size_t>(index) >= wire::kEventFlags) return 0;
      return it->second.memory.address() + static_cast<CUdeviceptr>(index) * sizeof(uint32_t);
    }
    return FlagAreaAddress(wait.flag, wire::kEventFlagsBytes);
  }

  // A plan after a flag: on its session's lane, the wait, its copies (one batch) and its fence;
  // a group of its own, so nothing else waits with it.
  Result<FenceId> SubmitToLane(const CopyPlan& plan) {
    const CUdeviceptr flag = FlagAddress(plan.wait);
    if (flag == 0) return Internal("a flag outside every registered flag page");
    const uint64_t key = LaneKey(plan.wait.session_id, plan.direction);
    auto lane = lanes_.find(key);
    if (lane == lanes_.end()) {
      FERRY_ASSIGN_OR_RETURN(cudaStream_t s, NewLaneStream(plan.wait.latency));
      lane = lanes_.emplace(key, s).first;
    }
    cudaStream_t s = lane->second;
    Group g;
    g.accepted_ns = plan.accepted_ns;
    g.fences.push_back(next_fence_++);
    g.streams.push_back(s);
    g.status = DriverStatus(wait_value_(s, flag, plan.wait.value, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
    const bool h2d = plan.direction == Direction::kHostToDevice;
    cudaEvent_t trace_start = nullptr;  // with the trace on: once the wait is over
    const uint64_t issued_ns = trace_ ? MonotonicNanos() : 0;
    if (g.status.ok() && trace_) {
      auto e = TakeEvent();
      g.status = e.ok() ? CudaStatus(cudaEventRecord(*e, s), "trace event") : e.status();
      if (e.ok()) trace_start = *e;
    }
    StagedCopies& st = lane_staged_;
    for (const CopyPiece& p : plan.pieces) {
      st.Add(h2d ? static_cast<void*>(p.device) : static_cast<void*>(p.host),
             h2d ? static_cast<const void*>(p.host) : static_cast<const void*>(p.device), p.length, true, false);
      g.bytes += p.length;
    }
    // In parts on the lane's own part streams, which first wait for the lane's wait; a latency
    // lane's never, as the latency stream's. Its span (with the trace on) starts at the end of
    // the wait, before any part.
    std::vector<cudaStream_t> unjoined;
    if (g.status.ok()) {
      g.status = Issue(st, h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s,
                       {.where = plan.wait.latency ? Parts::kNone : Parts::kLane, .lane = key, .unjoined = &unjoined});
    }
    st.ClearCopies();
    // The client's stream waits on the signal: it goes right behind the copies, ahead of the
    // fence that only ferryd waits for.
    if (g.status.ok() && plan.signal != nullptr) {
      g.status = CudaStatus(cudaEventRecord(static_cast<CudaEvent*>(plan.signal)->get(), s), "signal");
    }
    if (g.status.ok()) {
      auto e = TakeEvent();
      g.status = e.ok() ? CudaStatus(cudaEventRecord(*e, s), "fence") : e.status();
      if (e.ok()) g.events.push_back(*e);
    }
    if (trace_start != nullptr) {
      const size_t fence = g.status.ok() && !g.events.empty() ? 0 : SIZE_MAX;
      g.spans.push_back(CopySpan{static_cast<int>(plan.direction), kLaneSpan, g.bytes, issued_ns, trace_start, fence});
    }
    if (g.events.empty()) g.by_stream_query = true;  // failed before its fence: reported at the next poll
    if (!unjoined.empty()) {
      g.streams.insert(g.streams.end(), unjoined.begin(), unjoined.end());
      g.by_stream_query = true;
    }
    const FenceId id = g.fences[0];
    pending_.push_back(std::move(g));
    return id;
  }

  // A lane's stream: of the greatest priority for a latency copy's lane.
  Result<cudaStream_t> NewLaneStream(bool latency) {
    int lo = 0, hi = 0;
    FERRY_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t s;
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, latency ? hi : lo));
    return s;
  }

  // Pieces are staged per stream and issued at Flush(): a loop turn's copies go to each stream
  // as one cudaMemcpyBatchAsync, with one fence event per stream, instead of one API call and
  // one event per copy. Latency-class copies (stream 0) and bulk copies form separate groups, so
  // a small urgent copy never waits for a bulk batch to be reported done.
  Result<FenceId> Submit(const CopyPlan& plan) override {
    if (plan.pieces.empty()) return InvalidArgument("empty copy plan");
    FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
    for (const CopyPiece& p : plan.pieces) {
      if (p.stream >= streams_per_dir_) return Internal("stream index out of range");
    }
    if (plan.wait.flag != nullptr) return SubmitToLane(plan);
    const int d = static_cast<int>(plan.direction);
    const int cls = plan.pieces[0].stream == 0 ? 0 : 1;
    if (plan.signal != nullptr) FlushGroups(true);  // order against what came before
    const bool h2d = plan.direction == Direction::kHostToDevice;
    if (groups_[cls].fences.empty()) {
      groups_[cls].staged_ns = MonotonicNanos();
      groups_[cls].accepted_ns = plan.accepted_ns;
    }
    for (const CopyPiece& p : plan.pieces) {
      groups_[cls].bytes += p.length;
      groups_[cls].pieces++;
      groups_[cls].all_batchable = groups_[cls].all_batchable && p.batchable;
      staged_[d][p.stream].Add(h2d ? static_cast<void*>(p.device) : static_cast<void*>(p.host),
                               h2d ? static_cast<const void*>(p.host) : static_cast<const void*>(p.device), p.length,
                               p.batchable, p.joins_previous);
      groups_[cls].staged_mask |= uint64_t{1} << (d * 32 + p.stream);
    }
    const bool one_stream = std::all_of(plan.pieces.begin(), plan.pieces.end(),
                                        [&](const CopyPiece& p) { return p.stream == plan.pieces[0].stream; });
    // A done word follows its copy on the copy's stream (a plan spread over streams gets none:
    // its completion says when it is done).
    if (const CUdeviceptr word =
            plan.done_word != nullptr && one_stream ? FlagAreaAddress(plan.done_word, wire::kFlagAreaBytes) : 0;
        word != 0) {
      staged_[d][plan.pieces[0].stream].done_writes.emplace_back(word, plan.done_value);
    }
    const FenceId id = next_fence_++;
    groups_[cls].fences.push_back(id);
    if (plan.signal != nullptr) groups_[cls].needs_events = true;
    // A large piece is worth its own fence: the scheduler refills the engines as each one
    // lands instead of waiting for a whole turn's batch.
    const bool large = std::any_of(plan.pieces.begin(), plan.pieces.end(), [](const CopyPiece& p) { return !p.batchable; });
    // A block list's unit (several pieces on one bulk stream) is a batch already: it goes out
    // now, as one cudaMemcpyBatchAsync with its own fence, not held back for more.
    const bool unit = cls == 1 && plan.pieces.size() > 1 && one_stream;
    if ((large || unit) && plan.signal == nullptr) FlushGroups(true);
    if (plan.signal != nullptr) {
      FlushGroups(true);
      Group& g = pending_.back();  // this plan alone: Flush() above emptied the staging first
      cudaStream_t primary = g.streams[0];
      Status st;
      for (size_t i = 1; i < g.events.size() && st.ok(); ++i) st = CudaStatus(cudaStreamWaitEvent(primary, g.events[i], 0), "signal wait");
      if (st.ok()) st = CudaStatus(cudaEventRecord(static_cast<CudaEvent*>(plan.signal)->get(), primary), "signal");
      if (!st.ok() && g.status.ok()) g.status = st;
    }
    return id;
  }

  void Flush() override { FlushGroups(false); }

  // Small bulk copies arriving while the engines are busy are held back a little (at most
  // kHoldNs, and only while more than kBusyBytes are still on the engines), so they reach the
  // engines as one large batch instead of many small ones: per-copy setup is what limits
  // small copies. Nothing waits when the engines are idle.
  void FlushGroups(bool force) {
    const uint64_t now = MonotonicNanos();
    for (Group& staging : groups_) {
      if (staging.fences.empty()) continue;
      MakeCurrent();
      const bool bulk = &staging == &groups_[1];
      if (!force && bulk && staging.all_batchable && staging.pieces < kFullBatch && pending_bulk_bytes_ > kBusyBytes &&
          now - staging.staged_ns < kHoldNs) {
        continue;
      }
      Group g;
      g.bytes = staging.bytes;
      g.accepted_ns = staging.accepted_ns;
      if (bulk) pending_bulk_bytes_ += g.bytes;
      staging.bytes = 0;
      staging.pieces = 0;
      staging.all_batchable = true;
      g.fences = std::move(staging.fences);
      staging.fences.clear();
      const uint64_t mask = std::exchange(staging.staged_mask, 0);
      // A group some plan signals after needs events (the signal waits on them on the GPU);
      // else fence words where there are. Without them: the latency streams carry nothing
      // else, so when no earlier latency group is still out, "the stream is idle" is this
      // group's fence and the event record can be saved.
      const bool needs_events = std::exchange(staging.needs_events, false);
      const bool by_words = fence_page_ != nullptr && !needs_events;
      const bool query_stream = !by_words && &staging == &groups_[0] && streams_per_dir_ > 1 && latency_out_ == 0 &&
                                !trace_ && !needs_events;
      g.by_stream_query = query_stream;
      g.checked_ns = now;
      if (&staging == &groups_[0]) ++latency_out_;
      g.latency = &staging == &groups_[0];
      // Two passes: every stream's copies first, then (each behind its stream's copies) the done
      // words, only if every stream of the group issued (a failed group reports its copies failed,
      // and a copy reported failed must not have said done), then each stream's fence, so that a
      // fence seen done means its words were written.
      std::vector<std::pair<int, uint32_t>> issued_streams;
      std::vector<cudaStream_t> failed_streams;  // some of their copies may be out already
      for (int d = 0; d < 2; ++d) {
        const cudaMemcpyKind kind = d == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
        for (uint32_t s = 0; s < streams_per_dir_; ++s) {
          if (!(mask & (uint64_t{1} << (d * 32 + s)))) continue;
          StagedCopies& st = staged_[d][s];
          Status issued;
          if (trace_) issued = TraceStart(g, d, s, st);
          // Not the latency stream's: its copies never wait behind bulk parts.
          if (issued.ok()) {
            issued = Issue(st, kind, streams_[d][s],
                           {.where = &staging == &groups_[0] ? Parts::kNone : Parts::kShared,
                            .span = trace_ ? &g.spans.back() : nullptr});
          }
          st.ClearCopies();
          if (issued.ok()) issued_streams.emplace_back(d, s);
          if (!issued.ok()) failed_streams.push_back(streams_[d][s]);
          if (!issued.ok() && g.status.ok()) g.status = issued;
        }
      }
      for (const auto& [d, s] : issued_streams) {
        StagedCopies& st = staged_[d][s];
        // Default flags: the write waits for the copies before it on the stream, data included.
        for (const auto& [address, value] : st.done_writes) {
          if (!g.status.ok()) break;
          const CUresult r = write_value_(streams_[d][s], address, value, CU_STREAM_WRITE_VALUE_DEFAULT);
          if (r != CUDA_SUCCESS) {
            g.status = DeviceError("cuStreamWriteValue32 of a done word: error " + std::to_string(r));
          }
        }
        // Every issued stream is fenced, whatever came of its done words; a fence that could
        // not be set leaves the group to end when its streams are idle.
        Status fenced;
        g.streams.push_back(streams_[d][s]);
        if (by_words) {
          const uint32_t index = static_cast<uint32_t>(d) * 32 + s;
          const uint32_t value = ++fence_seq_[index];
          const CUresult r = write_value_(streams_[d][s], fence_dev_ + index * sizeof(uint32_t), value,
                                          CU_STREAM_WRITE_VALUE_DEFAULT);
          if (r == CUDA_SUCCESS) {
            g.words.emplace_back(index, value);
          } else {
            fenced = DeviceError("cuStreamWriteValue32 of a fence word: error " + std::to_string(r));
          }
        } else if (!query_stream) {
          auto e = TakeEvent();
          fenced = e.ok() ? CudaStatus(cudaEventRecord(*e, streams_[d][s]), "fence") : e.status();
          if (fenced.ok()) {
            for (CopySpan& sp : g.spans) {
              if (sp.direction == d && sp.stream == s) sp.fence = g.events.size();
            }
            g.events.push_back(*e);
          } else if (e.ok()) {
            free_events_.push_back(*e);  // never recorded: a query of it would say done
          }
        }
        if (!fenced.ok()) g.by_stream_query = true;
        if (!fenced.ok() && g.status.ok()) g.status = fenced;
      }
      if (!failed_streams.empty()) {
        g.streams.insert(g.streams.end(), failed_streams.begin(), failed_streams.end());
        g.by_stream_query = true;
      }
      for (int d = 0; d < 2; ++d) {
        for (uint32_t s = 0; s < streams_per_dir_; ++s) staged_[d][s].done_writes.clear();
      }
      g.bulk = bulk;
      pending_.push_back(std::move(g));
    }
  }

  void PollCompleted(std::vector<FenceResult>& done) override {
    MaybeRepinTrace();
    uint64_t now = 0;
    // Groups that share a stream ask it once a turn between them.
    asked_this_turn_.clear();
    auto ask = [this](cudaStream_t s) {
      for (const auto& [stream, answer] : asked_this_turn_) {
        if (stream == s) return answer;
      }
      return asked_this_turn_.emplace_back(s, cudaStreamQuery(s)).second;
    };
    for (auto it = pending_.begin(); it != pending_.end();) {
      Status st = it->status;
      bool ready = true;
      for (const auto& [index, value] : it->words) {
        if (static_cast<int32_t>(FenceWord(index) - value) < 0) {
          ready = false;
          break;
        }
      }
      // A stream whose copy failed never writes its word: now and then its streams are asked,
      // and idle streams (or failed ones) end the group too.
      if (!ready) {
        if (now == 0) now = MonotonicNanos();
        if (now - it->checked_ns >= kFenceCheckNs) {
          it->checked_ns = now;
          bool busy = false;
          for (cudaStream_t s : it->streams) {
            const cudaError_t q = ask(s);
            if (q == cudaErrorNotReady) {
              busy = true;
            } else if (q != cudaSuccess && st.ok()) {
              st = CudaStatus(q, "copy");
            }
          }
          ready = !busy;
        }
      }
      for (cudaEvent_t e : it->events) {
        cudaError_t q = cudaEventQuery(e);
        if (q == cudaErrorNotReady) {
          ready = false;
          break;
        }
        if (q != cudaSuccess && st.ok()) st = CudaStatus(q, "copy");
      }
      if (it->by_stream_query) {
        for (cudaStream_t s : it->streams) {
          const cudaError_t q = ask(s);
          if (q == cudaErrorNotReady) {
            ready = false;
            break;
          }
          if (q != cudaSuccess && st.ok()) st = CudaStatus(q, "copy");
        }
      }
      if (!ready) {
        ++it;
        continue;
      }
      if (trace_) TraceDone(*it);
      for (cudaEvent_t e : it->events) free_events_.push_back(e);
      for (FenceId f : it->fences) done.push_back({f, st});
      if (it->bulk) pending_bulk_bytes_ -= it->bytes;
      if (it->latency) --latency_out_;
      it = pending_.erase(it);
    }
  }
  int completion_fd() const override { return -1; }

 private:
  // With the trace on: one stream's share of a group, from an event recorded before its copies
  // to its fence event (events[fence]).
  static constexpr uint32_t kLaneSpan = UINT32_MAX;  // CopySpan::stream of a session's lane
  struct CopySpan {
    int direction;
    uint32_t stream;  // of streams_[direction], or kLaneSpan
    uint64_t bytes;
    uint64_t issued_ns;
    cudaEvent_t start;
    size_t fence;
    uint32_t parts = 1;                         // the batches it was issued as, at once
    std::vector<cudaEvent_t> part_starts = {};  // each part stream's start (none where one failed)
  };
  struct Group {  // fences that complete together, once every event has
    std::vector<FenceId> fences;
    std::vector<cudaEvent_t> events;
    std::vector<CopySpan> spans;  // trace only
    std::vector<cudaStream_t> streams;
    std::vector<std::pair<uint32_t, uint32_t>> words;  // fence words: (index, the value that says done)
    uint64_t checked_ns = 0;       // fence words: when its streams were last asked for errors
    Status status;
    bool by_stream_query = false;  // no events: done when its streams are idle
    bool latency = false;
    bool needs_events = false;     // while staging: a plan signals an event after these pieces
    bool bulk = false;
    uint64_t bytes = 0;            // of its pieces
    uint32_t pieces = 0;           // while staging
    bool all_batchable = true;     // while staging
    uint64_t staged_ns = 0;        // while staging: when the first piece came
    uint64_t accepted_ns = 0;      // when ferryd read the first piece's request (trace)
    uint64_t staged_mask = 0;      // while staging: bit d * 32 + s for each stream with staged pieces
  };

  Status TraceStart(Group& g, int d, uint32_t s, const StagedCopies& st) {
    FERRY_ASSIGN_OR_RETURN(cudaEvent_t start, TakeEvent());
    if (Status st = CudaStatus(cudaEventRecord(start, streams_[d][s]), "trace event"); !st.ok()) {
      free_events_.push_back(start);
      return st;
    }
    uint64_t bytes = 0;
    for (size_t n : st.sizes) bytes += n;
    g.spans.push_back(CopySpan{d, s, bytes, MonotonicNanos(), start, SIZE_MAX});  // fence: set once recorded
    return Status::Ok();
  }

  // One log line a stream: when ferryd issued the copies, when the stream reached them and when
  // they were done on the GPU (a stream's copies may queue behind another stream's on the same
  // copy engine, so that span is not a transfer rate), and when ferryd saw them done; in
  // microseconds from the trace's time zero.
  void TraceDone(Group& g) {
    traced_since_pin_ = true;
    const double seen = static_cast<double>(MonotonicNanos() - trace_origin_ns_) / 1e3;
    for (const CopySpan& sp : g.spans) {
      free_events_.push_back(sp.start);
      free_events_.insert(free_events_.end(), sp.part_starts.begin(), sp.part_starts.end());
      if (!g.status.ok()) continue;
      float start_ms = -1, end_ms = -1;
      if (sp.fence < g.events.size()) {
        cudaEventElapsedTime(&start_ms, trace_origin_, sp.start);
        cudaEventElapsedTime(&end_ms, trace_origin_, g.events[sp.fence]);
        // A batch in parts starts on the engines with its earliest part.
        for (cudaEvent_t part : sp.part_starts) {
          float part_ms = -1;
          if (cudaEventElapsedTime(&part_ms, trace_origin_, part) == cudaSuccess)
            start_ms = std::min(start_ms, part_ms);
        }
      }
      // A lane's span starts when its wait for the client's event is over.
      const std::string stream = sp.stream == kLaneSpan ? "lane" : "stream " + std::to_string(sp.stream);
      char line[256];
      std::snprintf(line, sizeof line,
                    "engine trace: %s %s, %llu bytes: accepted %.1f, issued %.1f, on the engine %.1f to %.1f, seen "
                    "done %.1f us%s",
                    sp.direction == 0 ? "h2d" : "d2h", stream.c_str(), static_cast<unsigned long long>(sp.bytes),
                    (static_cast<double>(g.accepted_ns) - static_cast<double>(trace_origin_ns_)) / 1e3,
                    static_cast<double>(sp.issued_ns - trace_origin_ns_) / 1e3, start_ms * 1e3, end_ms * 1e3, seen,
                    sp.parts == 1 ? "" : (" (in " + std::to_string(sp.parts) + " parts)").c_str());
      FERRY_LOG(kInfo) << line;
    }
    cudaGetLastError();
  }

  // Where a batch's parts may go (see IssueInParts): nowhere, on the part streams shared by
  // the unit stream's priority, or on a lane's own part streams (`lane`), which first wait for
  // what came before on the lane: its wait on the client's event. A lane's parts cannot share
  // the streams of the others: their wait would hold every other copy on those streams.
  enum class Parts { kNone, kShared, kLane };
  struct PartsPlan {
    Parts where = Parts::kNone;
    uint64_t lane = 0;         // kLane: the lane's key
    CopySpan* span = nullptr;  // the trace's: told the parts and their start events
    // kLane: gets the part streams that could not be joined to the lane, for the caller to
    // watch (waiting for one here could block the loop until the client's event happens).
    std::vector<cudaStream_t>* unjoined = nullptr;
  };

  // Large pieces go one call each; the small ones of a stream go as one batch, or, where
  // `plan` allows, as one batch a thread of the crew when they are many small host-to-device
  // copies (see IssueInParts). A lane's parts fork from the lane before its large pieces: they
  // wait for the client's event, not for those pieces too.
  Status Issue(StagedCopies& st, cudaMemcpyKind kind, cudaStream_t stream, const PartsPlan& plan) {
    const bool whole = st.dsts.size() == 1;
    size_t batched = 0;
    uint64_t batched_bytes = 0;
    for (size_t i = 0; i < st.dsts.size() && !whole; ++i) {
      if (!st.batchable[i]) continue;
      batched_bytes += st.sizes[i];
      ++batched;
    }
    const uint32_t parts =
        plan.where != Parts::kNone && kind == cudaMemcpyHostToDevice && batched_bytes < batched * kHostWrittenCopyBytes
            ? static_cast<uint32_t>(std::min<size_t>(crew_.threads(), batched / kMinPartCopies))
            : 1;
    const std::vector<cudaStream_t>* own = nullptr;
    if (parts > 1) own = plan.where == Parts::kLane ? LanePartStreamsOf(plan.lane, stream) : PartStreamsOf(stream);
    if (own != nullptr && plan.where == Parts::kLane) {
      FERRY_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(lane_fork_, stream), "fork of a lane's parts"));
    }
    size_t kept = 0;
    for (size_t i = 0; i < st.dsts.size(); ++i) {
      if (!st.batchable[i] || whole) {
        FERRY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(st.dsts[i], st.srcs[i], st.sizes[i], kind, stream));
        continue;
      }
      st.dsts[kept] = st.dsts[i];
      st.srcs[kept] = st.srcs[i];
      st.sizes[kept] = st.sizes[i];
      ++kept;
    }
    if (kept == 0) return Status::Ok();
    if (own != nullptr) return IssueInParts(st, kept, stream, *own, parts, plan);
    return IssueBatch(st, 0, kept, kind, stream);
  }

  static Status IssueBatch(StagedCopies& st, size_t begin, size_t end, cudaMemcpyKind kind, cudaStream_t stream) {
    if (end - begin == 1) {
      return CudaStatus(cudaMemcpyAsync(st.dsts[begin], st.srcs[begin], st.sizes[begin], kind, stream), "copy");
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t idx = 0;
    return CudaStatus(cudaMemcpyBatchAsync(st.dsts.data() + begin, st.srcs.data() + begin, st.sizes.data() + begin,
                                           end - begin, &attr, &idx, 1, stream),
                      "batched copy");
  }

  // The driver writes a small host-to-device copy's bytes into its command buffer on the calling
  // thread, so a batch of them is bound by that thread, not by the engines: 4096 x 16 KiB went
  // at 4.5 to 5.3 GB/s as one thread's batch, 11.3 to 11.7 as four threads' (a stream each) and
  // 11.5 as eight's on an H100 host; through ferryd 4.6 to 5.0 GB/s issued by the loop alone,
  // 10.8 to 11.2 by four threads, 10.0 by eight; 9.7 and 10.1 by four on another H100 host
  // (docs/measurements/h100-issue-2026-12-06.txt, runs R and X).
  // The first `kept` copies of `st` go as `parts` batches issued at once by the crew, part 0 on
  // `stream`, part p on `own[p - 1]`, and `stream` then waits for each part (an event): what
  // follows on `stream` (done words, the fence) follows every part. The parts do not wait for
  // what came before on `stream` (copies are not ordered among themselves, CopyOptions), so a
  // list's parts never queue behind another copy's bytes; except with `fork` (a lane's parts,
  // on the lane's own part streams), where they first wait for the fork event Issue recorded on
  // `stream` right behind the lane's wait for the client's event. Every part stream is joined,
  // whether its part issued or not (a failed batch call may have put some copies out); one that
  // cannot be joined is waited for here, or, a lane's, handed to the caller.
  Status IssueInParts(StagedCopies& st, size_t kept, cudaStream_t stream, const std::vector<cudaStream_t>& own,
                      uint32_t parts, const PartsPlan& plan) {
    const bool fork = plan.where == Parts::kLane;
    Status status = Status::Ok();
    if (plan.span != nullptr) plan.span->parts = parts;
    for (uint32_t p = 1; p < parts && status.ok(); ++p) {
      cudaStream_t part_stream = own[p - 1];
      if (fork) status = CudaStatus(cudaStreamWaitEvent(part_stream, lane_fork_, 0), "fork of a lane's parts");
      if (status.ok() && part_delay_ms_ > 0) {
        status = CudaStatus(cudaLaunchHostFunc(part_stream, &SleepOnStream, &part_delay_ms_), "part delay");
      }
      // The part streams do not wait for the unit stream's start event: each gets its own.
      if (status.ok() && plan.span != nullptr) {
        if (auto e = TakeEvent(); e.ok()) {
          if (cudaEventRecord(*e, part_stream) == cudaSuccess) {
            plan.span->part_starts.push_back(*e);
          } else {
            cudaGetLastError();
            free_events_.push_back(*e);
          }
        }
      }
    }
    const int to_fail = std::exchange(part_to_fail_, -1);
    if (status.ok()) {
      status = crew_.Run(parts, [&](uint32_t p) -> Status {
        if (static_cast<int>(p) == to_fail)
          return DeviceError("part " + std::to_string(p) + " failed (FERRY_PART_FAIL)");
        FERRY_CUDA_RETURN_IF_ERROR(MakeCurrent());
        return IssueBatch(st, kept * p / parts, kept * (p + 1) / parts, cudaMemcpyHostToDevice,
                          p == 0 ? stream : own[p - 1]);
      });
    }
    for (uint32_t p = 1; p < parts; ++p) {
      cudaEvent_t join = part_events_[p - 1];
      Status joined = CudaStatus(cudaEventRecord(join, own[p - 1]), "join of a part");
      if (joined.ok()) joined = CudaStatus(cudaStreamWaitEvent(stream, join, 0), "join of a part");
      if (!joined.ok()) {
        if (plan.unjoined != nullptr) {
          plan.unjoined->push_back(own[p - 1]);
        } else {
          cudaStreamSynchronize(own[p - 1]);
        }
        if (status.ok()) status = joined;
      }
    }
    return status;
  }

  // Test tools: FERRY_PART_DELAY_MS: each part stream but the first sleeps this long on the host
  // before its copies, so that a fence that did not wait for every part shows; FERRY_PART_FAIL=P:
  // part P of the first batch issued in parts fails instead of issuing its copies.
  static void CUDART_CB SleepOnStream(void* ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<uint32_t*>(ms)));
  }

  // The crew's streams for batches issued on streams of `stream`'s priority (one a helper; one
  // set a priority, made together: made a set a bulk stream, apart, some sets moved 16 KiB lists
  // at 4.5 to 6.3 GB/s where one shared set moved them at 8.9 to 11.4, run W of
  // docs/measurements/h100-issue-2026-12-06.txt) and the join events (one a helper), made at
  // first use; null where the driver will not make them all (they are asked for again at the
  // next batch, and this one goes whole on its stream).
  const std::vector<cudaStream_t>* PartStreamsOf(cudaStream_t stream) {
    int priority = 0;
    if (!MakePartEvents() || !GetPriority(stream, &priority)) return nullptr;
    std::vector<cudaStream_t>& own = part_streams_[priority];
    return GrowPartStreams(own, priority) ? &own : nullptr;
  }

  // A lane's part streams (made at its first list in parts, at the lane's priority, gone with
  // the lane) and the fork event they wait on; null as PartStreamsOf.
  const std::vector<cudaStream_t>* LanePartStreamsOf(uint64_t lane, cudaStream_t stream) {
    int priority = 0;
    if (!MakePartEvents() || !GetPriority(stream, &priority)) return nullptr;
    if (lane_fork_ == nullptr && cudaEventCreateWithFlags(&lane_fork_, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      lane_fork_ = nullptr;
      return nullptr;
    }
    std::vector<cudaStream_t>& own = lane_parts_[lane];
    return GrowPartStreams(own, priority) ? &own : nullptr;
  }

  bool MakePartEvents() {
    while (part_events_.size() + 1 < crew_.threads()) {
      cudaEvent_t e;
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      part_events_.push_back(e);
    }
    return true;
  }
  static bool GetPriority(cudaStream_t stream, int* priority) {
    if (cudaStreamGetPriority(stream, priority) == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }
  // Gives `own` a stream for each helper of the crew, at `priority`.
  bool GrowPartStreams(std::vector<cudaStream_t>& own, int priority) {
    while (own.size() + 1 < crew_.threads()) {
      cudaStream_t s;
      if (cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      own.push_back(s);
    }
    return true;
  }

  Result<cudaEvent_t> TakeEvent() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e;
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, trace_ ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }

  using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

  int device_;
  GpuLocation where_;  // where LocateCudaGpus found it
  uint32_t streams_per_dir_;
  bool flag_waits_ = false;  // stream memory operations work (ProbeFlagWaits)
  WaitValue32 wait_value_ = nullptr;
  WriteValue32 write_value_ = nullptr;                   // the start probe's, and done words
  struct FlagPage {
    CUdeviceptr device;     // where this GPU's engines see it
    bool registered_here;  // else another GPU's backend registered it (and unregisters it)
  };
  std::map<std::byte*, FlagPage> flag_pages_;  // sessions' flag areas, by host address
  // A session's event flags in device memory (ShareDeviceFlags): word i stands for host[i].
  struct DeviceFlags {
    const uint32_t* host;
    SharedDeviceMemory memory;
  };
  bool device_flags_on_ = false;                  // ProbeDeviceFlags passed
  std::map<uint64_t, DeviceFlags> device_flags_;  // by session id
  cudaStream_t flag_stream_ = nullptr;            // writes ended sessions' device flags
  // A session's lane for one direction. Its groups are fenced by events: a fence word's write
  // on the lane held up the lane's next group (in-step exposed +0.004 ms on the H100, 2026-12-07).
  std::map<uint64_t, cudaStream_t> lanes_;  // by LaneKey
  StagedCopies lane_staged_;
  const bool trace_;
  static constexpr uint64_t kTraceRepinNs = 2'000'000'000;  // idle this long after traced copies
  cudaEvent_t trace_origin_ = nullptr;
  uint64_t trace_origin_ns_ = 0;
  uint64_t trace_pinned_ns_ = 0;   // when time zero was last pinned
  bool traced_since_pin_ = false;  // a traced copy was logged since
  uint32_t trace_pins_ = 0;
  std::string describe_;
  DeviceInfo info_;
  std::vector<cudaStream_t> streams_[2];
  IssueCrew crew_;                          // issues parts of small host-to-device batches
  size_t crew_cpus_;                        // the CPUs its helpers may run on
  uint32_t issue_threads_asked_;            // the config's issue_threads
  // By the priority of the stream a batch is for: part p's stream is [p - 1].
  std::map<int, std::vector<cudaStream_t>> part_streams_;
  std::vector<cudaEvent_t> part_events_;    // [p - 1]: part p's join
  std::map<uint64_t, std::vector<cudaStream_t>> lane_parts_;  // by LaneKey: a lane's part streams
  cudaEvent_t lane_fork_ = nullptr;                           // recorded on a lane, waited for by its part streams
  uint32_t part_delay_ms_ = 0;              // FERRY_PART_DELAY_MS (a test tool)
  int part_to_fail_ = -1;                   // FERRY_PART_FAIL (a test tool): of the next parted batch
  std::mutex registered_mu_;    // the zeroer thread re-pins slabs while the loop runs
  std::set<void*> registered_;  // pinned slabs; guarded by registered_mu_
  bool per_slab_ = false;
  std::byte* whole_ = nullptr;  // the pool's base, when it was registered as one range
  std::map<HandleKey, OpenedMemory> opened_;
  std::deque<Group> pending_;
  std::vector<std::pair<cudaStream_t, cudaError_t>> asked_this_turn_;  // PollCompleted's, kept for its capacity
  Group groups_[2];                 // staging: [0] latency (stream 0), [1] bulk
  StagedCopies staged_[2][kStreamsPerDirection];  // [direction][stream]
  std::vector<cudaEvent_t> free_events_;
  FenceId next_fence_ = 1;
  uint32_t latency_out_ = 0;  // latency groups not yet reported done
  uint64_t pending_bulk_bytes_ = 0;  // bytes of bulk groups on the engines, not yet reported done
  // Where a session's event flags live unless FERRY_EVENT_FLAGS says (device, host). Host memory
  // until device flags have run the GPU tests and beaten host flags on a GPU
  // (docs/design.md, "Device flags").
  static constexpr bool kDeviceFlagsByDefault = false;
  static constexpr uint32_t kFullBatch = 64;
  static constexpr size_t kMinPartCopies = 64;        // of a batch's copies to a crew thread, at least
  static constexpr uint64_t kBusyBytes = 2ull << 20;  // ~40 us of work at 55 GB/s
  static constexpr uint64_t kHoldNs = 30'000;
  static constexpr size_t kFencePageBytes = 4096;
  static constexpr uint64_t kFenceCheckNs = 1'000'000;  // a group out this long: its streams asked each time
  // The fence words, registered, written by the copy streams; null: events.
  std::unique_ptr<uint32_t, decltype(&std::free)> fence_page_{nullptr, &std::free};
  CUdeviceptr fence_dev_ = 0;       // where the engines write them
  uint32_t fence_seq_[64] = {};     // the last value each stream was told to write
};

CudaRegion::~CudaRegion() { owner_->ReleaseRegion(key_); }

}  // namespace

Result<std::vector<int>> ResolveCudaDevices(const std::vector<std::string>& devices) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Unavailable(std::string("no CUDA GPU answers: ") + (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)));
  }
  std::vector<int> out;
  if (devices.empty()) {
    for (int i = 0; i < count && i < static_cast<int>(kMaxGpus); ++i) out.push_back(i);
    return out;
  }
  std::vector<std::string> uuids(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      uuids[static_cast<size_t>(i)] = FormatGpuUuid(reinterpret_cast<const uint8_t*>(prop.uuid.bytes));
    }
  }
  cudaGetLastError();
  auto lower = [](std::string t) {
    for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return t;
  };
  for (const std::string& d : devices) {
    int ordinal = -1;
    if (d.compare(0, 4, "GPU-") == 0) {
      for (int i = 0; i < count; ++i) {
        if (lower(uuids[static_cast<size_t>(i)]) == lower(d)) ordinal = i;
      }
      if (ordinal < 0) return Unavailable("no GPU here has the UUID " + d + " (nvidia-smi -L lists them)");
    } else {
      ordinal = std::stoi(d);
      if (ordinal >= count) {
        return Unavailable("GPU " + d + " asked, " + std::to_string(count) + " present (ordinals 0 to " +
                           std::to_string(count - 1) + ")");
      }
    }
    if (std::find(out.begin(), out.end(), ordinal) != out.end()) return InvalidArgument("GPU " + d + " named twice");
    out.push_back(ordinal);
  }
  return out;
}

// Loading cuBLAS (and cuBLASLt) costs a fraction of a second and memory ferryd does not otherwise
// need: only the snapshot writer asks, on its own thread.
std::string CublasVersion() {
  for (const char* name : {"libcublas.so", "libcublas.so.13", "libcublas.so.12"}) {
    void* h = ::dlopen(name, RTLD_LAZY | RTLD_LOCAL);
    if (h == nullptr) continue;
    using GetProperty = int (*)(int, int*);
    auto get = reinterpret_cast<GetProperty>(::dlsym(h, "cublasGetProperty"));
    int v[3] = {0, 0, 0};
    const bool ok = get != nullptr && get(0, &v[0]) == 0 && get(1, &v[1]) == 0 && get(2, &v[2]) == 0;
    ::dlclose(h);
    if (ok) return std::to_string(v[0]) + "." + std::to_string(v[1]) + "." + std::to_string(v[2]);
  }
  return "";
}

Result<std::vector<GpuLocation>> LocateCudaGpus(const std::vector<std::string>& devices) {
  FERRY_ASSIGN_OR_RETURN(std::vector<int> ordinals, ResolveCudaDevices(devices));
  std::vector<GpuLocation> out;
  for (int ordinal : ordinals) {
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, ordinal) != cudaSuccess) {
      cudaGetLastError();
      bus_id[0] = 0;
    }
    out.push_back({ordinal, NumaNodeOfPciDevice(bus_id), bus_id});
  }
  return out;
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(const GpuLocation& gpu, uint32_t streams_per_direction,
                                                   bool trace_engine, uint32_t issue_threads) {
  const int device = gpu.ordinal;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Unavailable(std::string("no CUDA GPU answers: ") + (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)));
  }
  if (device >= count) return Unavailable("device " + std::to_string(device) + " asked, " + std::to_string(count) + " present");
  if (streams_per_direction == 0 || streams_per_direction > 31) return InvalidArgument("1 to 31 streams per direction");
  if (issue_threads == 0 || issue_threads > kMaxIssueThreads) {
    return InvalidArgument("1 to " + std::to_string(kMaxIssueThreads) + " issue threads");
  }
  // The crew's helpers read the pool's pages, which are on the GPU's node.
  const CrewPlacement crew =
      PlaceCrew(issue_threads, gpu.numa_node >= 0 ? CpusOfNumaNode(gpu.numa_node) : std::vector<int>{}, AffinityCpus());
  auto b = std::make_unique<CudaBackend>(gpu, streams_per_direction, trace_engine, crew, issue_threads);
  FERRY_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace ferry::daemon
