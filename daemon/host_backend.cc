// The host backend: device memory is a client's sealed memfd mapped here, copies are memcpy on
// one worker thread per (direction, stream). Events are accepted and ignored: with no GPU there
// is no device work to order against, so "after" an event without a flag is always satisfied.
// "After" a flag is simulated as on the GPU: a lane per (session, direction), a thread that
// waits for the flag (a short spin, then asleep on the flag word, which the client's host device
// wakes when it writes it) and then copies.
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "common/gpu_uuid.hpp"
#include "common/log.hpp"
#include "common/status_macros.hpp"
#include "daemon/backend.hpp"

namespace ferry::daemon {
namespace {

// The bytes of the simulated GPU's memory its open regions hold. Shared with each region, which
// gives its bytes back when it closes, on whatever thread that is.
struct DeviceMemoryInUse {
  std::atomic<uint64_t> bytes{0};
};

class HostRegion : public DeviceRegion {
 public:
  HostRegion(Mapping m, std::shared_ptr<DeviceMemoryInUse> in_use) : m_(std::move(m)), in_use_(std::move(in_use)) {}
  ~HostRegion() override { in_use_->bytes.fetch_sub(m_.size()); }
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;
  std::byte* base() const override { return m_.data(); }
  uint64_t size() const override { return m_.size(); }

 private:
  Mapping m_;
  std::shared_ptr<DeviceMemoryInUse> in_use_;
};

uint64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : uint64_t{1} << 40;
}

class HostEvent : public SharedEvent {};

// The simulated GPU a device memfd was made for: libferry names it "ferry-sim-gpu<N>"; -1 for
// any other name.
int SimulatedGpuOfMemfd(int fd) {
  char link[256];
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
  if (n <= 0) return -1;
  const std::string_view name(link, static_cast<size_t>(n));
  constexpr std::string_view kPrefix = "/memfd:ferry-sim-gpu";
  if (name.substr(0, kPrefix.size()) != kPrefix) return -1;
  int ordinal = 0;
  size_t i = kPrefix.size();
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && ordinal < 1000; ++i) ordinal = ordinal * 10 + (name[i] - '0');
  return i < name.size() && name[i] != ' ' ? -1 : ordinal;
}


class HostBackend : public Backend {
 public:
  explicit HostBackend(const HostBackendOptions& o, UniqueFd efd)
      : streams_(o.streams_per_direction),
        ordinal_(o.ordinal),
        numa_node_(o.numa_node),
        link_(o.link),
        before_worker_start_(o.before_worker_start),
        efd_(std::move(efd)),
        device_memory_bytes_(o.device_memory_bytes != 0 ? o.device_memory_bytes : PhysicalMemoryBytes()) {
    for (uint32_t i = 0; i < 2 * streams_; ++i) workers_.emplace_back(std::make_unique<Worker>());
  }
  ~HostBackend() override {
    for (auto& [key, lane] : lanes_) StopLane(*lane);
    for (auto& w : workers_) {
      if (!w->thread.joinable()) continue;
      {
        std::lock_guard<std::mutex> l(w->mu);
        w->stop = true;
      }
      w->cv.notify_one();
      w->thread.join();
    }
  }

  wire::BackendKind kind() const override { return wire::BackendKind::kHost; }
  std::string Describe() const override {
    return "host: simulated GPU " + std::to_string(ordinal_) + " in host memory (" + SimulatedGpuName(ordinal_) +
           ", NUMA node " + std::to_string(numa_node_) + "), " + std::to_string(streams_) +
           " streams per direction; no GPU" + LinkText();
  }
  DeviceInfo device_info() const override {
    return {"host", ordinal_, "host", SimulatedGpuName(ordinal_), 0, 0, "none", numa_node_, ""};
  }
  int device_ordinal() const override { return ordinal_; }
  uint32_t streams_per_direction() const override { return streams_; }
  Status RegisterPool(std::byte*, size_t, size_t, bool) override { return Status::Ok(); }

  Result<std::unique_ptr<DeviceRegion>> OpenDeviceRegion(const wire::RegisterDeviceRequest& req, UniqueFd fd) override {
    if (req.kind != static_cast<uint32_t>(wire::DeviceHandleKind::kHostMemfd)) {
      return InvalidArgument("the host backend takes host-memfd device handles only");
    }
    if (!fd.valid()) return InvalidArgument("a host-memfd registration must carry its memfd");
    if (req.size == 0) return InvalidArgument("device region of 0 bytes");
    FERRY_RETURN_IF_ERROR(CheckSealedMemfd(fd.get(), req.size));
    // Which simulated GPU the memory is on, the host backend's stand-in for asking the driver:
    // the name libferry gave the memfd when it made the memory for that GPU, not the request's
    // claim.
    const int on = SimulatedGpuOfMemfd(fd.get());
    if (on != ordinal_) {
      return InvalidArgument("the memory is on " + (on < 0 ? std::string("no simulated GPU") : SimulatedGpuName(on)) +
                             ", not on " + SimulatedGpuName(ordinal_) +
                             ", the GPU this session named: connect one session per GPU");
    }
    const uint64_t held = device_memory_in_use_->bytes.load();
    if (req.size > device_memory_bytes_ - std::min(held, device_memory_bytes_)) {
      return ResourceExhausted(SimulatedGpuName(ordinal_) + " has " + std::to_string(device_memory_bytes_) +
                               " bytes of memory, " + std::to_string(held) + " of them registered; " +
                               std::to_string(req.size) + " more asked");
    }
    FERRY_ASSIGN_OR_RETURN(Mapping m, MapShared(fd.get(), req.size));
    device_memory_in_use_->bytes.fetch_add(req.size);
    return std::unique_ptr<DeviceRegion>(std::make_unique<HostRegion>(std::move(m), device_memory_in_use_));
  }

  Result<std::unique_ptr<SharedEvent>> OpenEvent(const wire::RegisterEventRequest& req) override {
    if (req.kind != static_cast<uint32_t>(wire::EventHandleKind::kHost)) {
      return InvalidArgument("the host backend takes host events only");
    }
    return std::unique_ptr<SharedEvent>(std::make_unique<HostEvent>());
  }

  bool waits_on_flags() const override { return true; }
  bool writes_done_words() const override { return true; }
  Status RegisterFlags(std::byte*, size_t) override { return Status::Ok(); }  // ferryd's own mapping
  void CloseLanes(uint64_t session_id) override {
    for (int d = 0; d < 2; ++d) {
      auto it = lanes_.find(LaneKey(session_id, static_cast<Direction>(d)));
      if (it == lanes_.end()) continue;
      StopLane(*it->second);
      lanes_.erase(it);
    }
  }

  Result<FenceId> Submit(const CopyPlan& plan) override {
    if (plan.pieces.empty()) return InvalidArgument("empty copy plan");
    if (plan.wait.flag != nullptr) return SubmitToLane(plan);
    for (const CopyPiece& p : plan.pieces) {
      if (p.stream >= streams_) return Internal("stream index out of range");
    }
    // A stream's worker starts on its first use; every worker the plan needs runs before any
    // piece is queued, so a worker that cannot start fails this copy and nothing else.
    for (const CopyPiece& p : plan.pieces) {
      FERRY_RETURN_IF_ERROR(StartWorker(plan.direction, p.stream));
    }
    FenceId id = next_fence_++;
    {
      std::lock_guard<std::mutex> l(fence_mu_);
      remaining_[id] = {plan.pieces.size(), plan.done_word, plan.done_value};
    }
    const double factor = link_.FactorFor(plan.policy);
    for (const CopyPiece& p : plan.pieces) {
      Worker& w = *workers_[static_cast<size_t>(plan.direction) * streams_ + p.stream];
      {
        std::lock_guard<std::mutex> l(w.mu);
        w.jobs.push_back(Job{id, plan.direction, p, factor});
      }
      w.cv.notify_one();
    }
    return id;
  }

  void PollCompleted(std::vector<FenceResult>& done) override {
    DrainDoorbell(efd_.get());
    std::lock_guard<std::mutex> l(fence_mu_);
    for (FenceId f : finished_) done.push_back({f, Status::Ok()});
    finished_.clear();
  }
  int completion_fd() const override { return efd_.get(); }

 private:
  struct Job {
    FenceId fence;
    Direction dir;
    CopyPiece piece;
    double factor;  // of the link's time (HostLink::FactorFor)
  };
  struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> jobs;
    bool stop = false;
    std::thread thread;
  };

  // A plan waiting on a flag: one job on its session's lane.
  struct LaneJob {
    FenceId fence;
    CopyPlan plan;
    double factor;
  };
  struct Lane {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<LaneJob> jobs;
    std::atomic<bool> stop{false};
    std::thread thread;
  };

  Result<FenceId> SubmitToLane(const CopyPlan& plan) {
    const uint64_t key = LaneKey(plan.wait.session_id, plan.direction);
    auto it = lanes_.find(key);
    if (it == lanes_.end()) {
      auto lane = std::make_unique<Lane>();
      try {
        if (before_worker_start_) before_worker_start_();
        lane->thread = std::thread([this, l = lane.get()] { RunLane(*l); });
      } catch (const std::system_error& e) {
        return ResourceExhausted(std::string("cannot start the host backend's lane thread for session ") +
                                 std::to_string(plan.wait.session_id) + ": " + e.what());
      }
      it = lanes_.emplace(key, std::move(lane)).first;
    }
    const FenceId id = next_fence_++;
    {
      std::lock_guard<std::mutex> l(fence_mu_);
      remaining_[id] = {1, nullptr, 0};
    }
    Lane& lane = *it->second;
    {
      std::lock_guard<std::mutex> l(lane.mu);
      lane.jobs.push_back(LaneJob{id, plan, link_.FactorFor(plan.policy)});
    }
    lane.cv.notify_one();
    return id;
  }

  static void StopLane(Lane& lane) {
    {
      std::lock_guard<std::mutex> l(lane.mu);
      lane.stop = true;
    }
    lane.cv.notify_one();
    if (lane.thread.joinable()) lane.thread.join();
  }

  // A lane runs its jobs in order, each once its flag is reached; a lane stopped while a job
  // waits leaves it (the backend is going away).
  void RunLane(Lane& lane) {
    for (;;) {
      LaneJob job;
      {
        std::unique_lock<std::mutex> l(lane.mu);
        lane.cv.wait(l, [&] { return lane.stop || !lane.jobs.empty(); });
        if (lane.stop) return;
        job = std::move(lane.jobs.front());
        lane.jobs.pop_front();
      }
      if (!AwaitFlag(lane, job.plan.wait)) return;
      for (const CopyPiece& p : job.plan.pieces) Copy(job.plan.direction, p, job.factor);
      FinishPiece(job.fence);
    }
  }

  // False when the lane was stopped first.
  static bool AwaitFlag(Lane& lane, const FlagWait& w) {
    const std::atomic_ref<uint32_t> flag(*w.flag);
    auto reached = [&] { return FlagReached(flag.load(std::memory_order_acquire), w.value); };
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
    while (std::chrono::steady_clock::now() < spin_until) {
      if (reached()) return true;
    }
    // Asleep on the flag word itself (the ring segment is shared memory, so the futex is too):
    // the client's write wakes the lane at once. Naps that grew to 1 ms held a copy up to 1 ms
    // past its flag. The timeout bounds how late a stop, or a writer that does not wake (ferryd
    // letting a dead session's waits go), is seen.
    for (;;) {
      const uint32_t seen = flag.load(std::memory_order_acquire);
      if (FlagReached(seen, w.value)) return true;
      if (lane.stop.load(std::memory_order_relaxed)) return false;
      const timespec timeout{0, 1'000'000};
      ::syscall(SYS_futex, w.flag, FUTEX_WAIT, seen, &timeout, nullptr, 0);
    }
  }

  // On a simulated link, a piece takes its time there: memcpy, then asleep until then.
  void Copy(Direction dir, const CopyPiece& p, double factor) const {
    const auto start = std::chrono::steady_clock::now();
    if (dir == Direction::kHostToDevice) {
      std::memcpy(p.device, p.host, p.length);
    } else {
      std::memcpy(p.host, p.device, p.length);
    }
    if (link_.paced()) SleepUntil(start + link_.Duration(p.length, factor));
  }

  std::string LinkText() const {
    if (!link_.paced()) return "";
    std::string s = "; simulated link of " + std::to_string(link_.bytes_per_second) + " bytes/s (test tool)";
    if (link_.slow_when.empty()) return s;
    s += ", " + std::to_string(link_.slow_factor) + "x as long under a policy with";
    for (const auto& [k, v] : link_.slow_when) s += " " + k + ": " + v;
    return s;
  }

  void FinishPiece(FenceId fence) {
    bool last = false;
    {
      std::lock_guard<std::mutex> l(fence_mu_);
      auto it = remaining_.find(fence);
      if (--it->second.pieces == 0) {
        // As a GPU writes it: after the data, which the release orders before the word.
        if (it->second.done_word != nullptr) {
          std::atomic_ref<uint32_t>(*it->second.done_word).store(it->second.done_value, std::memory_order_release);
        }
        remaining_.erase(it);
        finished_.push_back(fence);
        last = true;
      }
    }
    if (last) RingDoorbell(efd_.get());
  }

  Status StartWorker(Direction dir, uint32_t stream) {
    Worker& w = *workers_[static_cast<size_t>(dir) * streams_ + stream];
    if (w.thread.joinable()) return Status::Ok();
    try {
      if (before_worker_start_) before_worker_start_();
      w.thread = std::thread([this, &w] { RunWorker(w); });
    } catch (const std::system_error& e) {
      const Status st = ResourceExhausted(std::string("cannot start the host backend's copy thread for ") +
                                          (dir == Direction::kHostToDevice ? "host-to-device" : "device-to-host") +
                                          " stream " + std::to_string(stream) + ": " + e.what() +
                                          " (ferryd is out of threads or memory: see its limits, e.g. "
                                          "TasksMax, RLIMIT_NPROC, vm.max_map_count)");
      FERRY_LOG(kError) << st.message();
      return st;
    }
    return Status::Ok();
  }

  // Nothing in a job throws; should anything, the worker says so and stops rather than take
  // ferryd down (its copies then never complete, which the watchdog notices).
  void RunWorker(Worker& w) {
    try {
      ServeJobs(w);
    } catch (const std::exception& e) {
      FERRY_LOG(kError) << "host backend copy thread failed: " << e.what();
    } catch (...) {
      FERRY_LOG(kError) << "host backend copy thread failed: unknown exception";
    }
  }

  void ServeJobs(Worker& w) {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> l(w.mu);
        w.cv.wait(l, [&] { return w.stop || !w.jobs.empty(); });
        if (w.jobs.empty()) return;  // stop requested and drained
        job = w.jobs.front();
        w.jobs.pop_front();
      }
      Copy(job.dir, job.piece, job.factor);
      FinishPiece(job.fence);
    }
  }

  uint32_t streams_;
  int ordinal_;
  int numa_node_;
  HostLink link_;
  std::function<void()> before_worker_start_;
  UniqueFd efd_;
  uint64_t device_memory_bytes_;
  std::shared_ptr<DeviceMemoryInUse> device_memory_in_use_ = std::make_shared<DeviceMemoryInUse>();
  FenceId next_fence_ = 1;
  std::mutex fence_mu_;
  struct FenceLeft {
    size_t pieces;
    uint32_t* done_word;
    uint32_t done_value;
  };
  std::unordered_map<FenceId, FenceLeft> remaining_;  // guarded by fence_mu_
  std::vector<FenceId> finished_;                  // guarded by fence_mu_
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unordered_map<uint64_t, std::unique_ptr<Lane>> lanes_;  // by LaneKey; event-loop thread only
};

}  // namespace

Result<std::unique_ptr<Backend>> CreateHostBackend(const HostBackendOptions& options) {
  if (options.streams_per_direction == 0) return InvalidArgument("at least one stream per direction");
  FERRY_ASSIGN_OR_RETURN(UniqueFd efd, CreateEventFd());
  return std::unique_ptr<Backend>(std::make_unique<HostBackend>(options, std::move(efd)));
}

}  // namespace ferry::daemon
