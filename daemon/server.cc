// The event loop and ferryd's lifecycle: start (runtime directory and its lock, the pool, the
// listening socket), the loop (accept, epoll, timers, sleeping and the watchdog), policy
// switches and reloads, reaping ended sessions and reclaiming their slabs, and stopping.
#include "daemon/server.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include "common/channel.hpp"
#include "common/log.hpp"
#include "common/notify.hpp"
#include "common/status_macros.hpp"
#include "daemon/device_set.hpp"
#include "daemon/fd_usage.hpp"
#include "daemon/pinned_pool.hpp"
#include "daemon/policy_loader.hpp"
#include "daemon/poll_window.hpp"
#include "daemon/poller.hpp"
#include "daemon/rejections.hpp"
#include "daemon/rings.hpp"
#include "daemon/running_policy.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/session.hpp"
#include "daemon/sessions.hpp"
#include "daemon/startup_responder.hpp"

namespace ferry::daemon {
namespace {

constexpr uint64_t kReclaimIntervalNs = 250'000'000;  // quarantined slabs are probed again this often
constexpr uint64_t kLaneReleaseIntervalNs = 10'000'000;  // an ended session's lane waits are let go again
constexpr uint64_t kListenPauseNs = 100'000'000;      // out of fds: stop accepting this long, then try again
constexpr uint32_t kTurnsPerEpoll = 32;               // while spinning, sockets are looked at every 32nd turn
constexpr uint64_t kEpollIntervalNs = 1'000'000;      // ... or once 1 ms went by, however long the turns
constexpr uint64_t kStartStepTimeoutUs = 10'000'000;  // systemd's start timeout, extended past each pool report

// "12.3": one decimal, for the log.
std::string OneDecimal(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

Status MakeRuntimeDir(const std::string& dir) {
  std::string path;
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      path = dir.substr(0, i);
      if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoStatus("mkdir(" + path + ")", errno);
    }
  }
  return Status::Ok();
}

}  // namespace

class Server::Impl {
 public:
  Impl(CheckedConfig checked, GpuSource gpus, std::shared_ptr<const Policy> policy, const std::string& policy_source,
       ServerOptions options)
      : config_(std::move(checked.config)),
        allowed_gid_(checked.allowed_gid),
        gpu_source_(std::move(gpus)),
        observer_(options.observer),
        before_slab_renewal_(std::move(options.before_slab_renewal)),
        policy_parse_hook_(std::move(options.before_policy_parse)),
        before_pool_build_(std::move(options.before_pool_build)),
        stop_requested_(std::move(options.stop_requested)),
        watch_fault_(std::move(options.watch_fault)),
        policy_(std::move(policy)),
        rejections_(counters_, observer_) {
    FERRY_LOG(kInfo) << "policy: " << policy_->name << " (" << policy_->Hash() << ") from " << policy_source;
    if (observer_ != nullptr) observer_->OnPolicy(*policy_);
  }

  ~Impl() {
    if (inspector_.joinable()) inspector_.join();
    if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
  }

  Status Init() {
    const uint64_t t0 = MonotonicNanos();
    // Before the pool: a second ferryd on this runtime directory must not pin a whole pool
    // before it learns the first one holds the lock.
    FERRY_RETURN_IF_ERROR(MakeRuntimeDir(config_.runtime_dir));
    FERRY_RETURN_IF_ERROR(LockRuntimeDir());
    // The socket first, so that clients and ferryctl status hear how the start goes.
    socket_path_ = config_.SocketPath();
    FERRY_ASSIGN_OR_RETURN(listen_, ListenUnix(socket_path_, allowed_gid_ ? 0660 : 0600));
    if (allowed_gid_ && ::chown(socket_path_.c_str(), static_cast<uid_t>(-1), *allowed_gid_) != 0) {
      return ErrnoStatus("chown(" + socket_path_ + ")", errno);
    }
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<StartupResponder> responder,
                           StartupResponder::Start(listen_.get(), "making the GPUs' contexts"));
    // The backends (a CUDA context per GPU, side by side) are made on a thread while the pool's
    // slabs are made and mapped, and are done before its pages are faulted in: made alongside
    // the fault-in, a context stalled it (both work on the process's memory map; a 48 GiB pool
    // took 5.1 s to build instead of 1.6 on the H200's host).
    const uint64_t t_backends = MonotonicNanos();
    Result<GpuBackends> made = Internal("the backends were not made");
    std::thread maker;
    try {
      maker = std::thread([&] { made = gpu_source_.make(); });
    } catch (const std::system_error&) {
      made = gpu_source_.make();  // no thread to spare: one after the other
    }
    struct Join {
      std::thread& t;
      ~Join() {
        if (t.joinable()) t.join();
      }
    } join{maker};
    uint64_t t_made = 0;
    auto backends_made = [&]() -> Status {
      if (maker.joinable()) maker.join();
      t_made = MonotonicNanos();
      if (!made.ok()) return made.status();
      if (made->size() != gpu_source_.numa_nodes.size()) return Internal("the backends made are not the GPUs located");
      FERRY_ASSIGN_OR_RETURN(backend_, DeviceSet::Create(std::move(*made)));
      return Status::Ok();
    };
    // The hooks run on the pool's zeroer thread, once sessions end: backend_ is there by then,
    // and outlives pool_ (declared before it). Fresh pages for every reclaimed slab, unless the
    // engines reach the pool through one pinning of the whole range (pool.register: whole),
    // which fresh pages would escape.
    const bool slab_by_slab = RegistersSlabBySlab(config_);
    SlabReclaimHooks hooks;
    hooks.fresh_pages = slab_by_slab || !gpu_source_.pins_pool;
    if (hooks.fresh_pages) {
      hooks.unpin = [this](std::byte* p, uint64_t n) { return backend_->UnpinSlab(p, n); };
      hooks.pin = [this](std::byte* p, uint64_t n) { return backend_->PinSlab(p, n); };
    }
    hooks.before = std::move(before_slab_renewal_);
    // A large pool takes seconds to build: systemd hears how far it got and extends the unit's
    // start timeout while it progresses (its TimeoutStartSec would otherwise stop a long build).
    auto building = [&responder](uint64_t faulted, uint64_t total) {
      const std::string progress = "building the pool: " + std::to_string(faulted >> 20) + " of " +
                                   std::to_string(total >> 20) + " MiB faulted in (" +
                                   std::to_string(total ? faulted * 100 / total : 100) + "%)";
      responder->SetProgress(progress);
      SdNotify("EXTEND_TIMEOUT_USEC=" + std::to_string(kStartStepTimeoutUs) + "\nSTATUS=" + progress);
    };
    responder->SetProgress("building the pool");
    if (before_pool_build_) before_pool_build_();
    // Told to stop, the build stops at once: a pool may take minutes to build.
    const FaultStop stop_build = [this] { return stop_requested_ && stop_requested_(); };
    auto built = PinnedPool::Create(PoolParts(), config_.slab_bytes, std::move(hooks), building, stop_build,
                                    backends_made, config_.pool_pages == PoolPages::kHugetlb);
    if (!built.ok() && built.status().code() == Code::kAborted) return Aborted("ferryd was stopped while it started");
    FERRY_RETURN_IF_ERROR(built.status());
    pool_ = std::move(*built);
    const uint64_t t1 = MonotonicNanos();
    // Registration pins the whole pool in one call (1.3 s for 48 GiB on the H200's host).
    responder->SetProgress("registering the pool with the GPU");
    SdNotify("EXTEND_TIMEOUT_USEC=" + std::to_string(kStartStepTimeoutUs + (pool_->size() >> 30) * 200'000) +
             "\nSTATUS=registering the pool with the GPU");
    FERRY_RETURN_IF_ERROR(backend_->RegisterPool(pool_->base(), pool_->size(), pool_->slab_bytes(), slab_by_slab)
                              .WithContext("pool registration"));
    const uint64_t t2 = MonotonicNanos();
    const PoolBuildTimes& bt = pool_->build_times();
    const uint64_t created_ns = bt.slabs_ns + bt.fault_ns + bt.inspect_ns;  // not the wait for the backends
    const double created_s = static_cast<double>(created_ns) / 1e9;
    FERRY_LOG(kInfo) << "pool: " << (pool_->size() >> 20) << " MiB in " << pool_->slab_count() << " slabs of "
                     << (pool_->slab_bytes() >> 10) << " KiB; created in " << created_ns / 1000000
                     << " ms (" << pool_->fault_threads() << " threads, "
                     << OneDecimal(static_cast<double>(pool_->size()) / (1ull << 30) / std::max(created_s, 1e-9))
                     << " GiB/s)";
    FERRY_LOG(kInfo) << "started in " << (t2 - t0) / 1000000 << " ms: the GPUs' backends made in "
                     << (t_made - t_backends) / 1000000 << " ms while the pool's slabs were made and mapped in "
                     << bt.slabs_ns / 1000000 << " ms; the pool faulted in in " << bt.fault_ns / 1000000
                     << " ms, inspected in " << bt.inspect_ns / 1000000 << " ms, registered in " << (t2 - t1) / 1000000
                     << " ms";
    LogPoolParts();
    std::vector<GpuName> gpu_names;
    for (uint32_t i = 0; i < backend_->gpu_count(); ++i) gpu_names.push_back({backend_->info(i).ordinal, backend_->info(i).uuid});
    policy_.SetGpus(std::move(gpu_names));
    LogGpuOverrides();
    counters_.start_pool_ns = created_ns;
    counters_.start_register_ns = t2 - t1;
    counters_.start_total_ns = t2 - t0;
    // How much of the pool got huge pages is read from /proc/self/smaps (0.2 s for 48 GiB): off
    // the start's path, said once known.
    try {
      inspector_ = std::thread([this] {
        const uint64_t huge = pool_->huge_page_bytes();
        counters_.pool_huge_page_bytes = huge;
        FERRY_LOG(kInfo) << "pool: " << (huge >> 20) << " of " << (pool_->size() >> 20)
                         << " MiB on huge pages ("
                         << (pool_->hugetlb() ? std::string("hugetlb, pool.huge_pages: hugetlb")
                                              : "transparent_hugepage/shmem_enabled: " + ShmemHugePageSetting())
                         << ")";
      });
    } catch (const std::system_error&) {
      counters_.pool_huge_page_bytes = pool_->huge_page_bytes();
    }
    responder.reset();  // the loop below takes over the socket; hellos queued meanwhile wait for it
    UpdatePoolCounters(*pool_, counters_);

    FERRY_ASSIGN_OR_RETURN(stop_efd_, CreateEventFd());
    FERRY_ASSIGN_OR_RETURN(reload_efd_, CreateEventFd());
    FERRY_ASSIGN_OR_RETURN(poller_, Poller::Create());
    poller_.set_watch_fault(std::move(watch_fault_));
    FERRY_RETURN_IF_ERROR(poller_.Watch(listen_.get(), kListenTag));
    listen_watched_ = true;
    reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!reserve_fd_.valid()) return ErrnoStatus("open(/dev/null)", errno);
    FERRY_RETURN_IF_ERROR(poller_.Watch(stop_efd_.get(), kStopTag));
    FERRY_RETURN_IF_ERROR(poller_.Watch(reload_efd_.get(), kReloadTag));
    FERRY_ASSIGN_OR_RETURN(policy_loader_, PolicyLoader::Create(policy_parse_hook_));
    FERRY_RETURN_IF_ERROR(poller_.Watch(policy_loader_->done_fd(), kPolicyLoadedTag));
    if (backend_->completion_fd() >= 0) FERRY_RETURN_IF_ERROR(poller_.Watch(backend_->completion_fd(), kBackendTag));
    FERRY_RETURN_IF_ERROR(poller_.Watch(pool_->zeroed_fd(), kZeroedTag));

    rings_ = std::make_unique<Rings>(session_map_, counters_, observer_, rejections_, policy_,
                                     PoolGeometry{pool_->base(), pool_->slab_bytes()});
    scheduler_ = std::make_unique<Scheduler>(*backend_, PoolGeometry{pool_->base(), pool_->slab_bytes()}, policy_,
                                             counters_, *rings_, backend_->gpu_count());
    sessions_ = std::make_unique<Sessions>(config_, allowed_gid_,
                                           Sessions::Services{session_map_, *backend_, *pool_, poller_, *rings_,
                                                              *scheduler_, policy_, *policy_loader_, counters_,
                                                              rejections_, gpu_pool_part_});
    FERRY_LOG(kInfo) << "listening on " << socket_path_
                     << (allowed_gid_ ? " (group " + config_.allowed_group + ")" : " (owner only)");
    return Status::Ok();
  }

  // A part of the pool per NUMA node of the GPUs (in the order the GPUs first name them), sized
  // in proportion to its GPUs; GPUs of no known node share a part of no node.
  std::vector<PoolPartSpec> PoolParts() {
    std::vector<PoolPartSpec> parts;
    std::vector<uint32_t> gpus_of_part;
    gpu_pool_part_.clear();
    for (int node : gpu_source_.numa_nodes) {
      uint32_t i = 0;
      while (i < parts.size() && parts[i].numa_node != node) ++i;
      if (i == parts.size()) {
        parts.push_back({node, 0});
        gpus_of_part.push_back(0);
      }
      ++gpus_of_part[i];
      gpu_pool_part_.push_back(i);
    }
    if (parts.empty()) {
      parts.push_back({-1, 0});
      gpus_of_part.push_back(1);
    }
    const uint64_t gpus = std::max<uint64_t>(gpu_source_.numa_nodes.size(), 1);
    uint64_t left = config_.pool_bytes;
    for (size_t i = 0; i < parts.size(); ++i) {
      parts[i].bytes = i + 1 == parts.size() ? left : config_.pool_bytes / gpus * gpus_of_part[i];
      left -= parts[i].bytes;
    }
    return parts;
  }

  // Each part's size and where its pages are: said once; a part not on its node is a warning.
  void LogPoolParts() {
    counters_.pool_parts = pool_->part_count();
    for (uint32_t i = 0; i < pool_->part_count() && i < counters_.pool_part.size(); ++i) {
      const PoolPart& p = pool_->part(i);
      auto& c = counters_.pool_part[i];
      c.numa_node = p.numa_node;
      c.bytes = p.bytes;
      c.bytes_on_node = p.bytes_on_node;
      std::string gpus;
      for (uint32_t g = 0; g < gpu_pool_part_.size(); ++g) {
        if (gpu_pool_part_[g] == i) gpus += (gpus.empty() ? "" : ", ") + backend_->info(g).uuid;
      }
      const bool warn = p.numa_node >= 0 && !p.placed();
 const LogLevel level = warn ? LogLevel::kWarning : LogLevel::kInfo;
      if (LogEnabled(level)) LogLine(level)
          << "pool part " << i << " (NUMA node " << p.numa_node << "; " << gpus << "): " << (p.bytes >> 20) << " MiB"
          << (p.bytes != p.requested_bytes ? " (" + std::to_string(p.requested_bytes) + " bytes asked, rounded up to " +
                                                 std::to_string(p.bytes / config_.slab_bytes) + " whole slabs)"
                                           : "")
          << ", " << p.fault_threads << " threads; " << p.placement
          << (warn ? ": copies to its GPUs cross the sockets' link (ferryd carries on)" : "");
    }
  }

  void Stop() { RingDoorbell(stop_efd_.get()); }
  void RequestReload() { RingDoorbell(reload_efd_.get()); }

  // No exception ends the process from here: a failure ends the loop with an error (main
  // returns it, and systemd restarts ferryd), after the copies in flight have drained.
  Status Run() {
    Status st;
    try {
      st = Serve();
    } catch (const std::exception& e) {
      st = Internal(std::string("event loop failed: ") + e.what());
    } catch (...) {
      st = Internal("event loop failed: unknown exception");
    }
    if (!st.ok()) {
      FERRY_LOG(kError) << st.message() << "; stopping";
    }
    try {
      Shutdown();
    } catch (const std::exception& e) {
      FERRY_LOG(kError) << "stopping failed: " << e.what();
      if (st.ok()) st = Internal(std::string("stopping failed: ") + e.what());
    }
    return st;
  }

  std::shared_ptr<const Policy> policy() const { return policy_.Snapshot(); }
  const DaemonConfig& config() const { return config_; }
  const ServerCounters& counters() const { return counters_; }
  DeviceSet& backend() { return *backend_; }
  std::vector<DeviceInfo> gpus() const {
    std::vector<DeviceInfo> out;
    for (uint32_t i = 0; i < backend_->gpu_count(); ++i) out.push_back(backend_->info(i));
    return out;
  }
  uint64_t pool_bytes() const { return pool_->size(); }

 private:
  // One ferryd per runtime directory: a second one would take over the socket. The lock is an
  // fcntl lock on the lock file's descriptor, so the kernel drops it when the holder dies and
  // a crashed ferryd never blocks its restart. ferryd may run as root: the directory must be
  // its own and closed to others (CheckRuntimeDir), and the lock file is opened without
  // following a symbolic link, so nothing planted there makes ferryd write to another file.
  Status LockRuntimeDir() {
    FERRY_RETURN_IF_ERROR(CheckRuntimeDir(config_.runtime_dir));
    const std::string path = config_.runtime_dir + "/ferryd.lock";
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600));
    if (!fd.valid() && errno == ELOOP) {
      return PermissionDenied(path + " is a symbolic link; ferryd will not follow it (remove it: ferryd creates its own)");
    }
    if (!fd.valid()) return ErrnoStatus("open(" + path + ")", errno);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat(" + path + ")", errno);
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1) {
      return PermissionDenied(path + " is not a plain file of ferryd's own (uid " + std::to_string(::geteuid()) +
                              ") with one link; remove it: ferryd creates its own");
    }
    struct flock lk {};
    lk.l_type = F_WRLCK;
    lk.l_whence = SEEK_SET;
    if (::fcntl(fd.get(), F_SETLK, &lk) != 0) {
      if (errno != EAGAIN && errno != EACCES) return ErrnoStatus("lock(" + path + ")", errno);
      auto holder = ReadWholeFd(fd.get(), 64);
      return Unavailable("another ferryd (pid " + (holder.ok() ? *holder : std::string("?")) + ") serves " +
                         config_.runtime_dir);
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), pid.data(), pid.size(), 0) < 0) {
      return ErrnoStatus("write(" + path + ")", errno);
    }
    lock_fd_ = std::move(fd);
    return Status::Ok();
  }

  // ---- policy switches ----

  // Makes `p` the policy for copies accepted from now on; copies already accepted keep theirs.
  void SwitchPolicy(std::shared_ptr<const Policy> p, const std::string& source) {
    std::shared_ptr<const Policy> old = policy_.Switch(std::move(p));
    sessions_->Reclassify();
    rings_->PublishStagingToAll();
    counters_.policy_switches++;  // after the switch is whole: tests wait on it
    FERRY_LOG(kInfo) << "policy switched: " << old->name << " (" << old->Hash() << ") -> " << policy_->name << " ("
                     << policy_->Hash() << ") from " << source;
    LogGpuOverrides();
    if (observer_ != nullptr) observer_->OnPolicy(*policy_);
  }

  // Which GPUs run an override of the policy, and what it changes; an override that names no
  // GPU served here is said too (one policy file may serve several nodes).
  void LogGpuOverrides() {
    const Policy& node = *policy_;
    for (size_t o = 0; o < node.gpu_overrides.size(); ++o) {
      std::string gpus;
      for (uint32_t g = 0; g < policy_.gpus().size(); ++g) {
        if (policy_.OverrideOf(g) != static_cast<int>(o)) continue;
        gpus += (gpus.empty() ? "" : ", ") + policy_.gpus()[g].uuid + " (" + std::to_string(policy_.gpus()[g].ordinal) + ")";
      }
      const GpuOverride& over = node.gpu_overrides[o];
      if (gpus.empty()) {
        FERRY_LOG(kWarning) << "policy " << node.name << ": the override for GPU " << over.MatchText()
                            << " names no GPU this ferryd serves, or only GPUs an earlier override took";
        continue;
      }
      std::string changes;
      for (const std::string& d : over.Changes(node)) changes += (changes.empty() ? "" : "; ") + d;
      FERRY_LOG(kInfo) << "policy " << node.name << ": " << gpus << " run its override for GPU " << over.MatchText()
                       << (changes.empty() ? " (the same settings)" : ": " + changes);
    }
  }

  void PolicyFailed(const std::string& source, const Status& why) {
    counters_.policy_failures++;
    if (observer_ != nullptr) observer_->OnPolicyRefused();
    FERRY_LOG(kError) << "policy from " << source << " refused, keeping " << policy_->name << " (" << policy_->Hash()
                      << "): " << why.message();
  }

  // Reloads and applies are read and parsed on the policy loader's thread; the loop only
  // submits them and, when they are done, switches and replies (PolicyLoaded).
  void ReloadPolicyFile() {
    if (config_.policy_path.empty()) {
      FERRY_LOG(kWarning) << "reload asked, but no policy file is configured (config key 'policy')";
      return;
    }
    SdNotify("RELOADING=1");
    PolicyLoad load;
    load.reload = true;
    load.path = config_.policy_path;
    load.name = config_.policy_path;
    load.source = config_.policy_path + " (reload)";
    if (!policy_loader_->Submit(std::move(load))) {
      PolicyFailed(config_.policy_path + " (reload)", ResourceExhausted("too many policy files waiting to be read"));
      SdNotify("READY=1");
    }
  }

  void PolicyLoaded() {
    for (PolicyLoad& load : policy_loader_->TakeDone()) {
      const std::string previous = policy_->Hash();
      if (!load.status.ok()) {
        if (!load.dry_run) PolicyFailed(load.source, load.status);
      } else if (!load.dry_run) {
        SwitchPolicy(load.policy, load.source);
      }
      if (load.reload) SdNotify("READY=1");
      sessions_->ReplyPolicyLoaded(load, previous);
    }
  }

  // ---- the loop ----

  Status Serve() {
    if (config_.cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(config_.cpu, &set);
      if (::sched_setaffinity(0, sizeof set, &set) != 0) {
        return ErrnoStatus("pinning to cpu " + std::to_string(config_.cpu), errno);
      }
      FERRY_LOG(kInfo) << "event loop pinned to cpu " << config_.cpu;
    }
    PollWindow window(static_cast<uint64_t>(config_.spin_us) * 1000, static_cast<uint64_t>(config_.spin_max_us) * 1000);
    counters_.poll_window_ns = window.ns();
    uint64_t last_activity = MonotonicNanos();
    epoll_event evs[64];
    // systemd: ready now that the pool is registered and the socket listens; the watchdog is
    // fed only while copies make progress.
    const uint64_t watchdog_ns = WatchdogIntervalNanos();
    uint64_t last_ping = MonotonicNanos(), completed_at_ping = counters_.copies_completed + counters_.copies_failed;
    SdNotify("READY=1\nSTATUS=serving on " + socket_path_);
    while (!stopping_) {
      if (watchdog_ns != 0 && MonotonicNanos() - last_ping >= watchdog_ns / 2) {
        const uint64_t done = counters_.copies_completed + counters_.copies_failed;
        if (scheduler_->idle() || done != completed_at_ping) {
          SdNotify("WATCHDOG=1");
        } else {
          FERRY_LOG(kWarning) << counters_.in_flight << " copies waiting and none finished for "
                              << (MonotonicNanos() - last_ping) / 1000000 << " ms: not feeding the watchdog";
        }
        completed_at_ping = done;
        last_ping = MonotonicNanos();
      }
      const bool must_poll = scheduler_->needs_polling();
      int timeout = 0;
      bool slept = false;
      if (!must_poll && MonotonicNanos() - last_activity > window.ns()) {
        rings_->SetSleeping(true);
        counters_.sleeps_announced++;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (rings_->AnySubmissionPending()) {
          rings_->SetSleeping(false);
        } else {
          timeout = watchdog_ns != 0 ? static_cast<int>(watchdog_ns / 2'000'000) : -1;
          if (pool_->quarantined_bytes() != 0 && (timeout < 0 || timeout > int{kReclaimIntervalNs / 1'000'000})) {
            timeout = kReclaimIntervalNs / 1'000'000;  // wake to probe the quarantine again
          }
          // An ended session's flags are written again on each reap pass: a client still running
          // may write them back, and then only a later pass lets its lanes drain.
          if (AnyEndedSessionWaitsOnLanes() && (timeout < 0 || timeout > int{kLaneReleaseIntervalNs / 1'000'000})) {
            timeout = kLaneReleaseIntervalNs / 1'000'000;
          }
          const int timer = MillisToNextTimer();
          if (timer >= 0 && (timeout < 0 || timer < timeout)) timeout = timer;
          slept = true;
          counters_.sleeps++;
        }
      }
      // While spinning, look at the sockets only now and then: an epoll_wait per turn would
      // add its cost to every copy's latency. Sockets carry only the slow path, but it must not
      // wait 32 turns that each read a client's largest block list (a millisecond or more each).
      int n = 0;
      if (const uint64_t now = MonotonicNanos();
          timeout != 0 || ++turns_since_epoll_ >= kTurnsPerEpoll || now - last_epoll_ns_ >= kEpollIntervalNs) {
        turns_since_epoll_ = 0;
        last_epoll_ns_ = now;
        n = poller_.Wait(evs, 64, timeout);
      }
      if (slept) rings_->SetSleeping(false);
      if (n < 0 && errno != EINTR) return ErrnoStatus("epoll_wait", errno);
      bool work = false;
      for (int i = 0; i < n; ++i) work |= HandleEvent(evs[i]);
      RunTimers();
      if (PollSubmissions()) {
        window.OnQuietGap(MonotonicNanos() - last_activity);
        counters_.poll_window_ns = window.ns();
        work = true;
      }
      work |= scheduler_->PollBackend();
      work |= scheduler_->ReleaseHeld();
      work |= scheduler_->Dispatch();
      backend_->Flush();
      PostCompletions();
      ReapDead();
      if (pool_->quarantined_bytes() != 0 && MonotonicNanos() - last_reclaim_ns_ >= kReclaimIntervalNs) Reclaim();
      if (work) last_activity = MonotonicNanos();
    }
    return Status::Ok();
  }

  // Whether the event was activity for the poll window. A submit doorbell is not by itself: the
  // ring read after it decides (a client's wait report alone is none).
  bool HandleEvent(const epoll_event& ev) {
    const uint64_t tag = ev.data.u64;
    if (tag == kStopTag) {
      DrainDoorbell(stop_efd_.get());
      stopping_ = true;
      return true;
    }
    if (tag == kListenTag) {
      Accept();
      return true;
    }
    if (tag == kBackendTag) return true;  // the scheduler polls the backend every turn
    if (tag == kZeroedTag) {
      pool_->CollectZeroed();
      UpdatePoolCounters(*pool_, counters_);
      return true;
    }
    if ((tag & 0xf) == kPeerExitKind) {
      // An ended session's client exited: its mappings are gone, so its slabs may be too.
      auto w = exit_watch_.find(static_cast<pid_t>(tag >> 8));
      if (w != exit_watch_.end()) {
        poller_.Unwatch(w->second.pidfd.get());
        exit_watch_.erase(w);
      }
      Reclaim();
      return true;
    }
    if (tag == kReloadTag) {
      DrainDoorbell(reload_efd_.get());
      ReloadPolicyFile();
      return true;
    }
    if (tag == kPolicyLoadedTag) {
      PolicyLoaded();
      return true;
    }
    auto it = session_map_.find(tag >> 8);
    if (it == session_map_.end() || it->second->dead) return true;
    Session& s = *it->second;
    if ((tag & 0xf) == kDoorbellKind) {
      counters_.submit_doorbells += DrainDoorbell(s.submit_efd.get());
      return false;
    }
    sessions_->OnSocketEvent(s, ev.events);
    return true;
  }

  void Accept() {
    // At most kAcceptsPerTurn a turn, so a reconnect storm cannot hold the loop; the listen
    // socket stays readable while more are pending, and the next turn takes them.
    constexpr int kAcceptsPerTurn = 64;
    for (int accepted = 0; accepted < kAcceptsPerTurn; ++accepted) {
      auto fd = AcceptUnix(listen_.get());
      if (!fd.ok()) {
        if (fd.status().code() == Code::kResourceExhausted) OutOfFds(fd.status());
        return;  // EAGAIN: no more pending
      }
      if (fd_episode_) {
        fd_episode_ = false;
        FERRY_LOG(kInfo) << "accepting connections again: file descriptors are available";
      }
      auto cred = GetPeerCredentials(fd->get());
      if (!cred.ok()) continue;
      const uint64_t hello_deadline = sessions_->Admit(std::move(*fd), *cred);
      if (hello_deadline != 0) next_timer_ns_ = std::min(next_timer_ns_, hello_deadline);
    }
  }

  // accept() failed for want of fds. The pending connections stay in the backlog and keep the
  // listen socket readable, so: close them, using the reserve fd to accept each (their clients
  // see the connection closed instead of hanging), and stop watching the listen socket for a
  // while, or the loop would spin on it.
  void OutOfFds(const Status& why) {
    if (!fd_episode_) {
      fd_episode_ = true;
      reserve_fd_.reset();  // room to read /proc/self/fd
      const std::string usage = FdUsage();
      reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      FERRY_LOG(kError) << "cannot accept connections: " << why.message() << " (" << usage
                        << "); refusing new connections until some close. Raise LimitNOFILE (systemd) or "
                           "ulimit -n, or lower max_sessions / limits.pending_connections";
    }
    for (int i = 0; i < kListenBacklog && reserve_fd_.valid(); ++i) {
      reserve_fd_.reset();
      UniqueFd doomed(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      const bool refused = doomed.valid();
      doomed.reset();
      reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (!refused) break;  // the backlog is empty
      rejections_.Count(RejectReason::kExhausted);
    }
    if (listen_watched_) {
      poller_.Unwatch(listen_.get());
      listen_watched_ = false;
      listen_resume_ns_ = MonotonicNanos() + kListenPauseNs;
      next_timer_ns_ = std::min(next_timer_ns_, listen_resume_ns_);
    }
  }

  // Timers, run when next_timer_ns_ passes: hello deadlines and the listen socket's pause.
  void RunTimers() {
    const uint64_t now = MonotonicNanos();
    if (now < next_timer_ns_) return;
    next_timer_ns_ = UINT64_MAX;
    if (!listen_watched_ && listen_.valid()) {
      if (now >= listen_resume_ns_) {
        listen_watched_ = poller_.Watch(listen_.get(), kListenTag).ok();
      } else {
        next_timer_ns_ = listen_resume_ns_;
      }
    }
    next_timer_ns_ = std::min(next_timer_ns_, sessions_->EnforceHelloDeadlines(now));
  }

  // How long the loop may sleep before a timer is due (-1: no timer).
  int MillisToNextTimer() const {
    if (next_timer_ns_ == UINT64_MAX) return -1;
    const uint64_t now = MonotonicNanos();
    return next_timer_ns_ <= now ? 0 : static_cast<int>((next_timer_ns_ - now + 999'999) / 1'000'000);
  }

  // Sessions are read in turn from first_session_: the first one the turn's budget left with
  // no list read at all goes first next turn (not one that read a list and had more), so many
  // clients' lists cannot make a turn longer than kBlocksPerTurn blocks' checks, and with N
  // clients flooding ferryd with lists each has one read every N turns or so.
  bool PollSubmissions() {
    bool work = false;
    Rings::TurnBudget turn;
    auto read_one = [&](Session& s) {
      if (!s.hello_done || s.dead) return;
      auto read = rings_->ReadSubmissions(s, *scheduler_, turn);
      if (!read.ok()) {
        sessions_->Evict(s, read.status().message());
        return;
      }
      work |= *read;
    };
    const auto first = session_map_.lower_bound(first_session_);
    for (auto it = first; it != session_map_.end(); ++it) read_one(*it->second);
    for (auto it = session_map_.begin(); it != first; ++it) read_one(*it->second);
    first_session_ = turn.left_waiting.value_or(0);
    return work;
  }

  void PostCompletions() {
    for (auto& [id, sp] : session_map_) {
      Session& s = *sp;
      if (s.dead || s.backlog.empty()) continue;
      if (Status st = rings_->PostCompletions(s); !st.ok()) sessions_->Evict(s, st.message());
    }
  }

  // ---- ended sessions and their slabs ----

  bool AnyEndedSessionWaitsOnLanes() const {
    return std::any_of(session_map_.begin(), session_map_.end(),
                       [](const auto& entry) { return entry.second->dead && !entry.second->lane_waits.empty(); });
  }

  void ReapDead() {
    for (auto it = session_map_.begin(); it != session_map_.end();) {
      Session& s = *it->second;
      if (s.dead && !s.lane_waits.empty()) Rings::ReleaseFlagWaits(s, *backend_);
      if (s.dead && s.in_flight == 0) {
        if (s.flags_registered) backend_->UnregisterFlags(reinterpret_cast<std::byte*>(s.flags));
        backend_->CloseLanes(s.id);
        const uint64_t id = s.id;
        const uint32_t uid = s.peer.uid;
        const bool counted = s.hello_done;
        const uint32_t gpu = s.gpu;
        const std::string name = s.name;
        const size_t regions = s.regions.size(), events = s.events.size();
        const std::vector<uint32_t> slabs = s.arena ? s.arena->owned_slabs() : std::vector<uint32_t>{};
        const pid_t s_pid = s.peer.pid;
        UniqueFd pidfd = std::move(s.peer_pidfd);
        scheduler_->RemoveSession(id);
        it = session_map_.erase(it);  // closes regions and events, quarantines slabs
        if (!slabs.empty()) Reclaim();
        uint64_t held = 0;
        for (uint32_t slab : slabs) held += pool_->quarantined(slab) ? pool_->slab_bytes() : 0;
        if (counted) {
          counters_.sessions--;
          counters_.gpu[gpu].sessions--;
          FERRY_LOG(kInfo) << "session " << id << " '" << name << "' reclaimed: " << regions << " device regions closed, "
                           << events << " events closed, " << ((slabs.size() * pool_->slab_bytes()) >> 20)
                           << " MiB of slabs out of the session, "
                           << ((slabs.size() * pool_->slab_bytes() - held) >> 20) << " MiB to be zeroed for reuse"
                           << (held ? ", " + std::to_string(held >> 20) +
                                          " MiB quarantined (still mapped or open outside ferryd; counted against uid " +
                                          std::to_string(uid) + " until no process holds them)"
                                    : std::string());
        }
        if (held != 0) WatchPeerExit(s_pid, std::move(pidfd), slabs);
      } else {
        ++it;
      }
    }
  }

  // Probes the quarantined slabs; the ones no process outside ferryd holds go to be zeroed.
  void Reclaim() {
    last_reclaim_ns_ = MonotonicNanos();
    pool_->ReclaimQuarantined();
    // A watch lasts only while some of its slabs are quarantined, or a client process that
    // churns sessions would grow ferryd's fds while any other slab stays quarantined.
    for (auto w = exit_watch_.begin(); w != exit_watch_.end();) {
      std::erase_if(w->second.slabs, [&](uint32_t slab) { return !pool_->quarantined(slab); });
      if (w->second.slabs.empty()) {
        poller_.Unwatch(w->second.pidfd.get());
        w = exit_watch_.erase(w);
      } else {
        ++w;
      }
    }
    UpdatePoolCounters(*pool_, counters_);
  }

  // Watches the exit of the client process `pid` (one pidfd per process) while `slabs` of its
  // ended session are quarantined.
  void WatchPeerExit(pid_t pid, UniqueFd pidfd, const std::vector<uint32_t>& slabs) {
    auto w = exit_watch_.find(pid);
    if (w == exit_watch_.end()) {
      if (!pidfd.valid() || !poller_.Watch(pidfd.get(), SessionTag(static_cast<uint64_t>(pid), kPeerExitKind)).ok()) {
        return;
      }
      w = exit_watch_.emplace(pid, PeerExitWatch{std::move(pidfd), {}}).first;
    }
    for (uint32_t slab : slabs) {
      if (pool_->quarantined(slab)) w->second.slabs.insert(slab);
    }
  }

  void Shutdown() {
    if (inspector_.joinable()) inspector_.join();
    SdNotify("STOPPING=1");
    FERRY_LOG(kInfo) << "stopping: " << session_map_.size() << " sessions, " << scheduler_->fences_out()
                     << " copies in flight";
    if (listen_watched_) poller_.Unwatch(listen_.get());
    listen_watched_ = false;
    listen_.reset();
    ::unlink(socket_path_.c_str());
    for (auto& [id, s] : session_map_) sessions_->End(*s, "ferryd is stopping");
    const uint64_t deadline = MonotonicNanos() + 10'000'000'000ull;
    while (scheduler_->fences_out() != 0 && MonotonicNanos() < deadline) {
      // Lane waits are let go one at a time per flag (ReleaseFlagWaits), as copies finish.
      for (auto& [id, s] : session_map_) {
        if (!s->lane_waits.empty()) Rings::ReleaseFlagWaits(*s, *backend_);
      }
      if (backend_->completion_fd() >= 0) WaitReadable(backend_->completion_fd(), 10).ok();
      backend_->Flush();
      scheduler_->PollBackend();
    }
    ReapDead();
    // Past the deadline a lane may still wait on a flag in a session's ring: it goes first.
    for (auto& [id, s] : session_map_) backend_->CloseLanes(id);
    session_map_.clear();
  }

  // Declaration order is destruction order, reversed: whatever holds a pointer into another
  // member is declared after it.
  const DaemonConfig config_;
  const std::optional<gid_t> allowed_gid_;
  GpuSource gpu_source_;                // its maker runs once, in Init
  std::vector<uint32_t> gpu_pool_part_;  // each GPU's pool part (PoolParts)
  std::thread inspector_;               // reads the pool's huge pages once, after the start
  std::unique_ptr<DeviceSet> backend_;  // outlives pool_, whose zeroer thread calls it
  ServerCounters counters_;
  ServerObserver* const observer_;  // may be null; outlives the server
  std::function<void(std::byte*, uint64_t)> before_slab_renewal_;  // handed to the pool at Init
  std::function<void(const std::string&)> policy_parse_hook_;    // ServerOptions::before_policy_parse
  std::function<void()> before_pool_build_;                      // ServerOptions::before_pool_build
  std::function<bool()> stop_requested_;                         // ServerOptions::stop_requested
  std::function<Status(uint64_t)> watch_fault_;                  // ServerOptions::watch_fault, till the poller has it
  RunningPolicy policy_;
  Rejections rejections_;
  std::unique_ptr<PinnedPool> pool_;

  std::string socket_path_;
  UniqueFd lock_fd_;  // holds ferryd.lock open, and with it the fcntl lock
  UniqueFd listen_, stop_efd_, reload_efd_;
  UniqueFd reserve_fd_;  // /dev/null, closed to make room to refuse a connection when out of fds
  Poller poller_;
  std::unique_ptr<PolicyLoader> policy_loader_;
  bool listen_watched_ = false;
  bool fd_episode_ = false;  // out of fds since the last accept that worked (logged once)
  uint64_t listen_resume_ns_ = 0;
  uint64_t next_timer_ns_ = UINT64_MAX;  // the earliest hello deadline or listen resumption
  bool stopping_ = false;
  uint32_t turns_since_epoll_ = 0;
  uint64_t last_epoll_ns_ = 0;
  uint64_t first_session_ = 0;  // the session PollSubmissions reads first (see there)
  struct PeerExitWatch {
    UniqueFd pidfd;
    std::set<uint32_t> slabs;  // of its ended sessions, still quarantined
  };
  std::map<pid_t, PeerExitWatch> exit_watch_;  // client pid -> its pidfd, while its ended sessions' slabs are quarantined
  uint64_t last_reclaim_ns_ = 0;

  // The rooms, built by Init once the pool exists.
  SessionMap session_map_;
  std::unique_ptr<Rings> rings_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Sessions> sessions_;
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

Result<std::unique_ptr<Server>> Server::Create(CheckedConfig checked, GpuSource gpus, ServerOptions options) {
  std::shared_ptr<const Policy> policy = std::move(checked.policy);
  std::string source = std::move(checked.policy_source);
  if (options.policy) {
    policy = std::move(options.policy);
    source = options.policy_source.empty() ? "the caller" : options.policy_source;
  }
  if (!policy) {
    policy = std::make_shared<const Policy>();
    source = "built-in default";
  }
  auto impl = std::make_unique<Impl>(std::move(checked), std::move(gpus), std::move(policy), source,
                                     std::move(options));
  FERRY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Result<std::unique_ptr<Server>> Server::Create(CheckedConfig checked, std::vector<std::unique_ptr<Backend>> gpus,
                                               ServerOptions options) {
  // Made already: handed over as they are.
  GpuSource source;
  for (const auto& g : gpus) source.numa_nodes.push_back(g->device_info().numa_node);
  source.pins_pool = !gpus.empty() && gpus[0]->pins_pool();
  auto held = std::make_shared<GpuBackends>(std::move(gpus));
  source.make = [held]() -> Result<GpuBackends> { return std::move(*held); };
  return Create(std::move(checked), std::move(source), std::move(options));
}

namespace {
std::vector<std::unique_ptr<Backend>> OneGpu(std::unique_ptr<Backend> backend) {
  std::vector<std::unique_ptr<Backend>> gpus;
  gpus.push_back(std::move(backend));
  return gpus;
}
}  // namespace

Result<std::unique_ptr<Server>> Server::Create(CheckedConfig checked, std::unique_ptr<Backend> backend,
                                               ServerOptions options) {
  return Create(std::move(checked), OneGpu(std::move(backend)), std::move(options));
}

Result<std::unique_ptr<Server>> Server::Create(const DaemonConfig& config, std::vector<std::unique_ptr<Backend>> gpus,
                                               ServerOptions options) {
  FERRY_ASSIGN_OR_RETURN(CheckedConfig checked, Preflight(config));
  return Create(std::move(checked), std::move(gpus), std::move(options));
}

Result<std::unique_ptr<Server>> Server::Create(const DaemonConfig& config, std::unique_ptr<Backend> backend,
                                               ServerOptions options) {
  return Create(config, OneGpu(std::move(backend)), std::move(options));
}

Status Server::Run() { return impl_->Run(); }
void Server::Stop() { impl_->Stop(); }
void Server::RequestReload() { impl_->RequestReload(); }
std::shared_ptr<const Policy> Server::policy() const { return impl_->policy(); }
const DaemonConfig& Server::config() const { return impl_->config(); }
const ServerCounters& Server::counters() const { return impl_->counters(); }
Backend& Server::backend() { return impl_->backend(); }
std::vector<DeviceInfo> Server::gpus() const { return impl_->gpus(); }
uint64_t Server::pool_bytes() const { return impl_->pool_bytes(); }

}  // namespace ferry::daemon
