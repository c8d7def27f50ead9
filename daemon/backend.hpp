// The one interface between ferryd and a copy engine. Two implementations:
//   cuda  (cuda_backend.cc)  the product: pinned pool, copy streams, CUDA IPC memory and events;
//   host  (host_backend.cc)  a test double: "device memory" is a sealed memfd, copies are memcpy
//                            on worker threads, one per stream. What CI runs.
// FaultInjectingBackend wraps either to make chosen calls fail.
//
// Threading: a Backend is driven by the daemon's single event-loop thread; implementations may
// run their own threads internally.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/fd.hpp"
#include "common/wire.hpp"
#include "daemon/host_link.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

struct DaemonConfig;

enum class Direction : uint8_t { kHostToDevice = 0, kDeviceToHost = 1 };

// Device memory a client registered, opened in the daemon. Owned by the session that registered it.
class DeviceRegion {
 public:
  virtual ~DeviceRegion() = default;
  virtual std::byte* base() const = 0;  // a device address (cuda) or a host mapping (host)
  virtual uint64_t size() const = 0;
};

// An event shared with a client: "start after its last record" / "recorded when done".
class SharedEvent {
 public:
  virtual ~SharedEvent() = default;
};

// Streams of each direction: 0 is the latency stream (greatest priority); 1..kMaxBulkStreams
// are bulk streams at the least priority; the next kMaxBulkStreams bulk at the greatest.
inline constexpr uint32_t kBulkStreamsPerBank = 8;
inline constexpr uint32_t kStreamsPerDirection = 1 + 2 * kBulkStreamsPerBank;
inline bool StreamHasGreatestPriority(uint32_t stream) { return stream == 0 || stream > kBulkStreamsPerBank; }

struct CopyPiece {
  uint32_t stream;
  std::byte* host;  // inside the registered pool
  std::byte* device;
  uint64_t length;
  bool batchable = true;  // may go to the engines in one batch with others on its stream
  // The scheduler sent the piece before it to the same stream, from the same session's host
  // buffer (within one registration) to the same device region: where the two are adjacent on
  // both sides and the earlier one is still staged, the backend may copy them as one.
  bool joins_previous = false;
};

// "Start once the client's stream has written at least `value` into this flag word" (a cyclic
// comparison, as CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*flag - value) >= 0). The flag is a word of
// the session's ring segment, in pages registered with RegisterFlags, or stands for the same word
// of its device flags (ShareDeviceFlags), which the engines wait on instead. A plan that waits goes, whole,
// to its lane: a stream of its own per (session, direction), so that its wait holds up nothing
// of any other session, nor the shared copy streams.
struct FlagWait {
  uint32_t* flag = nullptr;  // nullptr: no wait
  uint32_t value = 0;
  uint64_t session_id = 0;  // the lane is the session's, in the plan's direction
  bool latency = false;     // the lane's priority, when the plan creates it
};

// A session's event flags in device memory (Backend::ShareDeviceFlags): the fd the client maps
// them by, and the size of the memory it shares.
struct SharedDeviceFlags {
  UniqueFd fd;
  uint64_t bytes = 0;
};

// A lane's key: the session's, in one direction.
inline uint64_t LaneKey(uint64_t session_id, Direction direction) {
  return session_id * 2 + static_cast<uint64_t>(direction);
}

// Whether a flag holding `flag` satisfies a wait for `value` (the GPU's cyclic comparison).
inline bool FlagReached(uint32_t flag, uint32_t value) { return static_cast<int32_t>(flag - value) >= 0; }

// The most GPUs one ferryd drives.
inline constexpr uint32_t kMaxGpus = 16;

struct CopyPlan {
  uint32_t gpu = 0;  // which of ferryd's GPUs runs it (DeviceSet); a single backend ignores it
  Direction direction = Direction::kHostToDevice;
  SharedEvent* signal = nullptr;  // optional: recorded once every piece is done
  FlagWait wait;                  // optional: on the session's lane, after this flag
  // Optional: done_value is written (release) into done_word, a word of the session's
  // registered flag area (RegisterFlags), once every piece is done.
  uint32_t* done_word = nullptr;
  uint32_t done_value = 0;
  std::vector<CopyPiece> pieces;
  uint64_t accepted_ns = 0;  // when ferryd read the request off the ring (for --trace-engine)
  const Policy* policy = nullptr;  // the policy it was planned under (the host link's host.slow matches it)
};

using FenceId = uint64_t;

struct FenceResult {
  FenceId fence;
  Status status;
};

// The device a ferryd drives, as its log, metrics and snapshots name it: one struct, passed along.
struct DeviceInfo {
  std::string backend;  // "cuda" | "host"
  int ordinal = 0;      // the CUDA device ordinal
  std::string name;     // e.g. "NVIDIA H200"; "host" on the host backend
  std::string uuid;     // "GPU-..."; empty on the host backend
  int cuda_driver = 0, cuda_runtime = 0;  // as CUDA reports them (13000); 0 on the host backend
  std::string cublas;  // the cuBLAS next to the runtime ("13.1.0"; "none" on the host backend, empty: not found)
  int numa_node = -1;           // the NUMA node nearest the GPU; -1: not known (one node, or a VM)
  std::string pci_bus_id;       // "0000:19:00.0"; empty on the host backend
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceInfo device_info() const { return {"host", device_ordinal(), "host", "", 0, 0, "none", -1, ""}; }

  virtual wire::BackendKind kind() const = 0;
  virtual std::string Describe() const = 0;  // one line for logs and `ferryctl status`
  virtual int device_ordinal() const = 0;
  virtual uint32_t streams_per_direction() const = 0;

  // Registers the pool for DMA once, at start. Never on the hot path.
  // slab_by_slab: pin each slab on its own, so that UnpinSlab/PinSlab can renew one (see
  // PoolRegistration); otherwise the whole range at once where the driver allows it.
  virtual Status RegisterPool(std::byte* base, size_t length, size_t slab_bytes, bool slab_by_slab) = 0;
  // Whether the engines reach the pool through a pinning (cudaHostRegister) that fresh pages
  // would have to be pinned again for. The host backend reads ferryd's mapping directly.
  virtual bool pins_pool() const { return false; }
  // True when the pool is registered slab by slab, so no piece may cross a slab.
  virtual bool pieces_stay_in_one_slab() const { return false; }
  // A reclaimed slab gets fresh pages (PinnedPool): UnpinSlab lets go of the old pages'
  // registration first, PinSlab registers the new ones. Called on the pool's zeroer thread while
  // the event loop runs, never while a copy uses the slab (it belongs to no session); must be
  // thread-safe with the other calls. Only for a backend that registered slab by slab, or none.
  virtual Status UnpinSlab(std::byte* slab, size_t bytes) {
    (void)slab, (void)bytes;
    return Status::Ok();
  }
  virtual Status PinSlab(std::byte* slab, size_t bytes) {
    (void)slab, (void)bytes;
    return Status::Ok();
  }

  virtual Result<std::unique_ptr<DeviceRegion>> OpenDeviceRegion(const wire::RegisterDeviceRequest& req,
                                                                 UniqueFd fd) = 0;
  virtual Result<std::unique_ptr<SharedEvent>> OpenEvent(const wire::RegisterEventRequest& req) = 0;
  // Whether the client's last record of `event` has happened. "Start after this event" is
  // resolved here, on the host, before the copy is submitted: a copy stream of ferryd waiting
  // on the GPU for another process's event cost 0.4 ms a hand-off on the H200 (a cross-context
  // wait), polling the event costs microseconds.
  virtual Result<bool> EventHappened(SharedEvent& event) {
    (void)event;
    return true;
  }

  // GPU-side "after": whether plans may wait on a flag (FlagWait). False: ferryd resolves
  // "after" on the host (EventHappened).
  virtual bool waits_on_flags() const { return false; }
  // Whether plans may ask for a done word (CopyPlan::done_word).
  virtual bool writes_done_words() const { return false; }
  // A session's flag area (its ring segment's event flags and done words), made visible to the
  // engines at the session's hello, where it waits on flags or writes done words; unregistered
  // once none of its plans is on the engines.
  virtual Status RegisterFlags(std::byte* flags, size_t bytes) {
    (void)flags, (void)bytes;
    return NotSupported("this backend does not wait on flags");
  }
  virtual void UnregisterFlags(std::byte* flags) { (void)flags; }
  // Device memory for a session's event flags, on GPU `gpu`, shared with the client as an fd
  // (RegisterEventReply::flag_place): from then on the session's lanes wait on word i of it for
  // a flag at host_flags + i (the ring's word stays unused), where a wait costs the engines
  // less than on host memory. Zeroed; freed with the session's lanes (CloseLanes), while a
  // client that still maps it keeps its pages: ferryd's memory is never reused under a client.
  virtual Result<SharedDeviceFlags> ShareDeviceFlags(uint32_t gpu, uint64_t session_id, const uint32_t* host_flags) {
    (void)gpu, (void)session_id, (void)host_flags;
    return NotSupported("this backend keeps event flags in the ring segment");
  }
  // Writes `value` into word `index` of the session's device flags (ShareDeviceFlags), on the
  // GPU, behind nothing else: how an ended session's lane waits are let go.
  virtual Status WriteDeviceFlag(uint32_t gpu, uint64_t session_id, uint32_t index, uint32_t value) {
    (void)gpu, (void)session_id, (void)index, (void)value;
    return NotSupported("this backend keeps event flags in the ring segment");
  }
  // The session is gone and none of its plans is on the engines: its lanes go too, and its
  // device flags.
  virtual void CloseLanes(uint64_t session_id) { (void)session_id; }

  // Enqueues a plan; its fence completes once every piece has. A backend may hold the pieces
  // until Flush(), so that copies submitted together reach the engines as one batch.
  virtual Result<FenceId> Submit(const CopyPlan& plan) = 0;
  // Hands everything submitted so far to the engines. Errors surface on the fences.
  virtual void Flush() {}
  // Appends the fences that completed since the last call. Never blocks.
  virtual void PollCompleted(std::vector<FenceResult>& done) = 0;
  // Readable when PollCompleted has news. -1: none; the caller polls while fences are pending.
  virtual int completion_fd() const = 0;
};

struct HostBackendOptions {
  uint32_t streams_per_direction = 3;
  // The simulated GPU this backend stands for (config host.gpus): device memory registered with
  // it must have been made for it (libferry names the memfd), and its NUMA node (-1: none).
  int ordinal = 0;
  int numa_node = -1;
  // Tests: called just before a copy worker thread starts; it may throw std::system_error, as
  // std::thread does when the process is out of threads or memory.
  std::function<void()> before_worker_start = nullptr;
  // A test tool: the simulated link copies take time on (config host.copy_rate, host.slow).
  HostLink link = {};
  // The simulated GPU's memory: the device regions registered with it, all sessions' together,
  // may reach this many bytes (0: the machine's physical memory). ferryd maps each region
  // whole, and a sparse memfd costs its maker nothing: without a bound, one client could take
  // ferryd's whole address space.
  uint64_t device_memory_bytes = 0;
};
Result<std::unique_ptr<Backend>> CreateHostBackend(const HostBackendOptions& options);
// The cuBLAS library this node's clients load ("13.0.2.14"; empty when none is found, which the
// records' environment block says with its reason; "none" without the CUDA toolkit). Loads it for the asking: slow, and never on the start's path.
std::string CublasVersion();
// A GPU ferryd will serve, located before its backend is made (no CUDA context yet): its
// ordinal, PCI bus id ("0000:19:00.0"; empty on the host backend) and NUMA node, which its
// pool memory is placed on.
struct GpuLocation {
  int ordinal = 0;
  int numa_node = -1;
  std::string pci_bus_id;
};
// NotSupported when ferry was built without the CUDA toolkit; Unavailable when no GPU answers.
// trace_engine: log each copy group's timeline on the engines (a diagnostic; costs two timing
// events a stream and a log line per group).
// `gpu`: from LocateCudaGpus (its PCI bus id and NUMA node are not read again).
// issue_threads: the threads (the loop's among them) that issue a batch of small host-to-device
// copies in parts at once (config key issue_threads; 1 to kMaxIssueThreads); no more than the CPUs
// of the GPU's NUMA node ferryd may use, where the helpers run (PlaceCrew).
inline constexpr uint32_t kMaxIssueThreads = 16;
// Host-to-device copies under this size (on average, in a batch) are written into the driver's
// command buffer by the thread that issues them, so such a batch is bound by that thread, not
// by an engine: a batch of 16 KiB copies cost its thread 3.6 us a copy, one of 32 KiB copies
// 0.4 (probe-blocks --h2d-ways, H100; docs/measurements/h100-issue-2026-12-06.txt). The
// scheduler keeps such a list one unit; the cuda backend issues it in parts (its issue crew).
inline constexpr uint64_t kHostWrittenCopyBytes = 32 << 10;
Result<std::unique_ptr<Backend>> CreateCudaBackend(const GpuLocation& gpu, uint32_t streams_per_direction,
                                                   bool trace_engine = false, uint32_t issue_threads = 4);
// The CUDA ordinals that `devices` names (empty: every GPU), each once; ordinals that are not
// there and UUIDs no GPU has are errors naming what is. Unavailable when no GPU answers.
Result<std::vector<int>> ResolveCudaDevices(const std::vector<std::string>& devices);
// The cuda GPUs that `devices` names (ResolveCudaDevices) and their NUMA nodes (PCI bus id, then
// sysfs). Makes no context.
Result<std::vector<GpuLocation>> LocateCudaGpus(const std::vector<std::string>& devices);
// Picks the backend per config.backend (`auto`: cuda when a GPU answers, else host) and the GPUs
// config.devices names (the host backend: its simulated ones, over host.numa_nodes); *why says
// which backend and why.
Result<std::vector<GpuLocation>> LocateGpus(const DaemonConfig& config, wire::BackendKind* kind, std::string* why);
// A backend per located GPU (a CUDA context each, made side by side).
Result<std::vector<std::unique_ptr<Backend>>> CreateBackends(const DaemonConfig& config, wire::BackendKind kind,
                                                             const std::vector<GpuLocation>& gpus);
// Both at once.
Result<std::vector<std::unique_ptr<Backend>>> CreateBackends(const DaemonConfig& config, std::string* why);

// Makes chosen calls fail, for tests of the daemon's error paths.
class FaultInjectingBackend : public Backend {
 public:
  explicit FaultInjectingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  void FailNextSubmits(int n) { fail_submits_ = n; }
  // The next `ok` submits go through, then `n` fail.
  void FailSubmitsAfter(int ok, int n) {
    pass_submits_ = ok;
    fail_submits_ = n;
  }
  void FailNextCompletions(int n) { fail_completions_ = n; }
  void FailNextOpenRegion(int n) { fail_open_ = n; }
  void FailNextPinSlab(int n) { fail_pin_slab_ = n; }

  wire::BackendKind kind() const override { return inner_->kind(); }
  std::string Describe() const override { return "fault-injecting " + inner_->Describe(); }
  DeviceInfo device_info() const override { return inner_->device_info(); }
  int device_ordinal() const override { return inner_->device_ordinal(); }
  uint32_t streams_per_direction() const override { return inner_->streams_per_direction(); }
  bool pins_pool() const override { return inner_->pins_pool(); }
  Status RegisterPool(std::byte* base, size_t length, size_t slab, bool slab_by_slab) override {
    return inner_->RegisterPool(base, length, slab, slab_by_slab);
  }
  bool pieces_stay_in_one_slab() const override { return inner_->pieces_stay_in_one_slab(); }
  Status UnpinSlab(std::byte* slab, size_t bytes) override { return inner_->UnpinSlab(slab, bytes); }
  Status PinSlab(std::byte* slab, size_t bytes) override {
    if (fail_pin_slab_.load() > 0 && fail_pin_slab_.fetch_sub(1) > 0) {
      return DeviceError("injected: cannot register the slab's fresh pages");
    }
    return inner_->PinSlab(slab, bytes);
  }
  Result<std::unique_ptr<DeviceRegion>> OpenDeviceRegion(const wire::RegisterDeviceRequest& r, UniqueFd fd) override {
    if (fail_open_.load() > 0 && fail_open_.fetch_sub(1) > 0) {
      return DeviceError("injected: cannot open device memory handle");
    }
    return inner_->OpenDeviceRegion(r, std::move(fd));
  }
  Result<std::unique_ptr<SharedEvent>> OpenEvent(const wire::RegisterEventRequest& r) override {
    return inner_->OpenEvent(r);
  }
  Result<bool> EventHappened(SharedEvent& e) override { return inner_->EventHappened(e); }
  bool waits_on_flags() const override { return inner_->waits_on_flags(); }
  bool writes_done_words() const override { return inner_->writes_done_words(); }
  Status RegisterFlags(std::byte* flags, size_t bytes) override { return inner_->RegisterFlags(flags, bytes); }
  void UnregisterFlags(std::byte* flags) override { inner_->UnregisterFlags(flags); }
  Result<SharedDeviceFlags> ShareDeviceFlags(uint32_t gpu, uint64_t session_id, const uint32_t* host_flags) override {
    return inner_->ShareDeviceFlags(gpu, session_id, host_flags);
  }
  Status WriteDeviceFlag(uint32_t gpu, uint64_t session_id, uint32_t index, uint32_t value) override {
    return inner_->WriteDeviceFlag(gpu, session_id, index, value);
  }
  void CloseLanes(uint64_t session_id) override { inner_->CloseLanes(session_id); }
  Result<FenceId> Submit(const CopyPlan& plan) override {
    if (pass_submits_.load() > 0 && pass_submits_.fetch_sub(1) > 0) return inner_->Submit(plan);
    if (fail_submits_.load() > 0 && fail_submits_.fetch_sub(1) > 0) {
      return DeviceError("injected: copy engine refused the copy");
    }
    if (fail_completions_.load() > 0 && plan.done_word != nullptr) {
      // A copy that fails on the device never gets to write its done word.
      CopyPlan without = plan;
      without.done_word = nullptr;
      return inner_->Submit(without);
    }
    return inner_->Submit(plan);
  }
  void Flush() override { inner_->Flush(); }
  void PollCompleted(std::vector<FenceResult>& done) override {
    size_t before = done.size();
    inner_->PollCompleted(done);
    for (size_t i = before; i < done.size() && fail_completions_.load() > 0; ++i) {
      if (fail_completions_.fetch_sub(1) > 0) done[i].status = DeviceError("injected: copy failed on the device");
    }
  }
  int completion_fd() const override { return inner_->completion_fd(); }

 private:
  std::unique_ptr<Backend> inner_;
  // Set by a test thread, consumed by the event loop.
  std::atomic<int> pass_submits_{0};
  std::atomic<int> fail_submits_{0};
  std::atomic<int> fail_completions_{0};
  std::atomic<int> fail_open_{0};
  std::atomic<int> fail_pin_slab_{0};  // consumed by the pool's zeroer thread
};

}  // namespace ferry::daemon
