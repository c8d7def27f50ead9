#include "daemon/server.hpp"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/channel.hpp"
#include "common/log.hpp"
#include "common/notify.hpp"
#include "common/yaml_util.hpp"
#include "daemon/pinned_pool.hpp"
#include "daemon/poll_window.hpp"
#include "daemon/policy_loader.hpp"
#include "daemon/preflight.hpp"

namespace ferry::daemon {
namespace {

constexpr uint64_t kListenTag = 1;
constexpr uint64_t kStopTag = 2;
constexpr uint64_t kBackendTag = 3;
constexpr uint64_t kReloadTag = 4;
constexpr uint64_t kZeroedTag = 5;
constexpr uint64_t kPolicyLoadedTag = 8;  // the policy loader finished a file
constexpr uint64_t kSocketKind = 0;
constexpr uint64_t kDoorbellKind = 1;
constexpr uint64_t kPeerExitKind = 2;  // the pidfd of an ended session's client, while its slabs are quarantined
constexpr uint64_t kReclaimIntervalNs = 250'000'000;  // quarantined slabs are probed again this often
constexpr uint64_t SessionTag(uint64_t id, uint64_t kind) { return (id << 8) | 0x10 | kind; }
constexpr uint64_t kListenPauseNs = 100'000'000;  // out of fds: stop accepting this long, then try again
constexpr uint64_t kRejectLogIntervalNs = 1'000'000'000;  // refused connections: at most one log line a second
constexpr uint32_t kSubmissionsPerTurn = 64;  // per session per loop turn: fairness between clients
constexpr uint64_t kQuantumBytes = 1ull << 20;     // deficit round robin: bytes per visit per unit of weight
constexpr uint64_t kMaxDeficitBytes = 64ull << 20;  // a piece larger than this goes once the deficit is full
constexpr int kMaxDispatchRounds = 128;
constexpr uint32_t kTurnsPerEpoll = 32;       // while spinning, sockets are looked at every 32nd turn

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

struct RegionState {
  std::unique_ptr<DeviceRegion> region;
  uint32_t in_flight = 0;
  bool unregistering = false;
};

// A reply that did not fit in the client's socket buffer, waiting for it to read.
struct OutboundMessage {
  std::vector<std::byte> frame;  // header and payload
  std::vector<UniqueFd> fds;     // our own copies of the fds it carries
};

// How many of a session's refused requests were logged (Server::Impl::Reject).
struct RejectLog {
  uint32_t logged = 0;
  uint64_t unlogged = 0;       // refused since the last line
  uint64_t summarized_ns = 0;  // when the last line was written
};

struct Session {
  uint64_t id = 0;
  PeerCredentials peer;
  std::string name;
  UniqueFd sock;
  UniqueFd peer_pidfd;  // readable once the client process has exited; invalid where pidfd_open fails
  bool hello_done = false;
  bool dead = false;
  uint64_t accepted_ns = 0;
  // Replies wait here, in order, while the client's socket is full; the loop never blocks on it.
  std::deque<OutboundMessage> outbound;
  bool watching_writable = false;  // EPOLLOUT on sock while outbound is not empty

  UniqueFd ring_fd, submit_efd, complete_efd;
  Mapping ring;
  wire::RingHeader* hdr = nullptr;
  wire::SubmissionEntry* sq = nullptr;
  wire::CompletionEntry* cq = nullptr;
  uint32_t sq_entries = 0, cq_entries = 0;  // daemon's copies; never read back from shared memory
  uint32_t sq_head = 0, cq_tail = 0;
  uint32_t in_flight = 0;
  std::deque<wire::CompletionEntry> backlog;
  // When ferryd last saw the submission ring with nothing unread: every entry read later was
  // written after this, so it bounds how long a client can have waited for that copy.
  uint64_t sq_seen_empty_ns = 0;

  std::unique_ptr<SessionArena> arena;
  std::map<uint32_t, RegionState> regions;
  uint32_t next_region_id = 1;
  std::map<uint32_t, std::unique_ptr<SharedEvent>> events;
  uint32_t next_event_id = 1;

  // Scheduling: bulk copies wait here in order; deficit round robin shares the engines.
  // Each direction has its own copy engines, so its own queue, deficit and in-flight bytes.
  std::deque<uint64_t> queue[2];
  uint64_t queued_bytes = 0;
  uint64_t deficit[2] = {0, 0};
  uint64_t bulk_out_bytes[2] = {0, 0};
  ClientClass klass;

  // The session's recent copies, by user_tag, to check its wait reports (kReportWait) against:
  // bounded (the oldest are forgotten first), each reportable once.
  struct ReportableCopy {
    uint64_t copy_id = 0;
    uint64_t written_after_ns = 0;  // sq_seen_empty_ns when the copy was read off the ring
    uint64_t accepted_ns = 0, done_ns = 0;
    Direction direction = Direction::kHostToDevice;
    bool reported = false;
  };
  static constexpr size_t kMaxReportableCopies = 4096;
  std::unordered_map<uint64_t, ReportableCopy> reportable;
  std::deque<std::pair<uint64_t, uint64_t>> reportable_order;  // (user_tag, copy_id), oldest first
  RejectLog reject_log;
};

// A client's copy, accepted and planned under the policy current at the time; dispatched
// piece by piece (latency-class and stream-waitable copies: all at once) as limits allow.
struct Copy {
  uint64_t id = 0;
  uint64_t session_id = 0;
  uint64_t user_tag = 0;
  uint64_t bytes = 0;
  uint64_t accepted_ns = 0, first_dispatch_ns = 0;
  uint64_t buffer_offset = 0;
  uint32_t region_id = 0;
  Direction direction = Direction::kHostToDevice;
  bool latency = false;
  std::shared_ptr<const Policy> policy;
  SharedEvent* wait = nullptr;    // owned by the session, which outlives its copies
  SharedEvent* signal = nullptr;
  std::vector<CopyPiece> pieces;  // stream chosen at dispatch
  size_t next = 0;                // first piece not yet dispatched
  uint32_t out = 0;               // fences dispatched and not yet done
  Status status;                  // the first failure
  bool WholeAtOnce() const { return latency || signal != nullptr || policy->schedule == Schedule::kSerial; }
  uint64_t NextDispatchBytes() const {
    if (!WholeAtOnce()) return pieces[next].length;
    uint64_t n = 0;
    for (size_t i = next; i < pieces.size(); ++i) n += pieces[i].length;
    return n;
  }
};

struct FenceRef {
  uint64_t copy_id;
  uint64_t bytes;
  bool bulk;
};

}  // namespace

class Server::Impl {
 public:
  Impl(DaemonConfig config, std::unique_ptr<Backend> backend, std::function<void(std::byte*, uint64_t)> before_renewal)
      : config_(std::move(config)), backend_(std::move(backend)), before_slab_renewal_(std::move(before_renewal)) {}

  Status Init() {
    if (!config_.allowed_group.empty()) {
      group* g = ::getgrnam(config_.allowed_group.c_str());
      if (g == nullptr) return NotFound("allowed_group '" + config_.allowed_group + "' does not exist");
      allowed_gid_ = g->gr_gid;
      has_allowed_gid_ = true;
    }
    quota_ = config_.session_quota_bytes == 0 ? config_.pool_bytes : config_.session_quota_bytes;
    // Before the pool: a second ferryd on this runtime directory must not pin a whole pool
    // before it learns the first one holds the lock.
    FERRY_RETURN_IF_ERROR(MakeRuntimeDir(config_.runtime_dir));
    FERRY_RETURN_IF_ERROR(LockRuntimeDir());
    uint64_t t0 = MonotonicNanos();
    // The hooks run on the pool's zeroer thread; backend_ outlives pool_ (declared before it).
    // Fresh pages for every reclaimed slab, unless the engines reach the pool through one pinning
    // of the whole range (pool.register: whole), which fresh pages would escape.
    const bool slab_by_slab = RegistersSlabBySlab(config_);
    SlabReclaimHooks hooks;
    hooks.fresh_pages = slab_by_slab || !backend_->pins_pool();
    if (hooks.fresh_pages) {
      hooks.unpin = [b = backend_.get()](std::byte* p, uint64_t n) { return b->UnpinSlab(p, n); };
      hooks.pin = [b = backend_.get()](std::byte* p, uint64_t n) { return b->PinSlab(p, n); };
    }
    hooks.before = std::move(before_slab_renewal_);
    FERRY_ASSIGN_OR_RETURN(pool_, PinnedPool::Create(config_.pool_bytes, config_.slab_bytes, std::move(hooks)));
    uint64_t t1 = MonotonicNanos();
    FERRY_RETURN_IF_ERROR(backend_->RegisterPool(pool_->base(), pool_->size(), pool_->slab_bytes(), slab_by_slab).WithContext("pool registration"));
    uint64_t t2 = MonotonicNanos();
    FERRY_LOG(kInfo) << "pool: " << (pool_->size() >> 20) << " MiB in " << pool_->slab_count() << " slabs of "
                     << (pool_->slab_bytes() >> 10) << " KiB; created in " << (t1 - t0) / 1000000
                     << " ms, registered in " << (t2 - t1) / 1000000 << " ms; " << (pool_->huge_page_bytes() >> 20)
                     << " MiB on huge pages (transparent_hugepage/shmem_enabled: " << ShmemHugePageSetting() << ")";
    UpdatePoolCounters();

    socket_path_ = config_.SocketPath();
    FERRY_ASSIGN_OR_RETURN(listen_, ListenUnix(socket_path_, has_allowed_gid_ ? 0660 : 0600));
    if (has_allowed_gid_ && ::chown(socket_path_.c_str(), static_cast<uid_t>(-1), allowed_gid_) != 0) {
      return ErrnoStatus("chown(" + socket_path_ + ")", errno);
    }
    FERRY_ASSIGN_OR_RETURN(stop_efd_, CreateEventFd());
    FERRY_ASSIGN_OR_RETURN(reload_efd_, CreateEventFd());
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_.valid()) return ErrnoStatus("epoll_create1", errno);
    FERRY_RETURN_IF_ERROR(Watch(listen_.get(), kListenTag));
    listen_watched_ = true;
    reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!reserve_fd_.valid()) return ErrnoStatus("open(/dev/null)", errno);
    FERRY_RETURN_IF_ERROR(Watch(stop_efd_.get(), kStopTag));
    FERRY_RETURN_IF_ERROR(Watch(reload_efd_.get(), kReloadTag));
    FERRY_ASSIGN_OR_RETURN(policy_loader_, PolicyLoader::Create(policy_parse_hook_));
    FERRY_RETURN_IF_ERROR(Watch(policy_loader_->done_fd(), kPolicyLoadedTag));
    if (backend_->completion_fd() >= 0) FERRY_RETURN_IF_ERROR(Watch(backend_->completion_fd(), kBackendTag));
    FERRY_RETURN_IF_ERROR(Watch(pool_->zeroed_fd(), kZeroedTag));
    FERRY_LOG(kInfo) << "listening on " << socket_path_ << (has_allowed_gid_ ? " (group " + config_.allowed_group + ")" : " (owner only)");
    return Status::Ok();
  }

  ~Impl() {
    if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
  }

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

  void Stop() { RingDoorbell(stop_efd_.get()); }
  void RequestReload() { RingDoorbell(reload_efd_.get()); }

  // Makes `p` the policy for copies accepted from now on; copies already accepted keep theirs.
  void SwitchPolicy(std::shared_ptr<const Policy> p, const std::string& source) {
    std::shared_ptr<const Policy> old;
    {
      std::lock_guard<std::mutex> l(policy_mu_);
      old = std::exchange(policy_, std::move(p));
    }
    if (old) {
      counters_.policy_switches++;
      FERRY_LOG(kInfo) << "policy switched: " << old->name << " (" << old->Hash() << ") -> " << policy_->name << " ("
                       << policy_->Hash() << ") from " << source;
    } else {
      FERRY_LOG(kInfo) << "policy: " << policy_->name << " (" << policy_->Hash() << ") from " << source;
    }
    for (auto& [id, sp] : sessions_) sp->klass = policy_->ClassFor(sp->name, sp->peer.uid);
    if (observer_ != nullptr) observer_->OnPolicy(*policy_);
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
      auto it = sessions_.find(load.session_id);
      Session* s = load.reload || it == sessions_.end() || it->second->dead ? nullptr : it->second.get();
      const std::string previous = policy_->Hash();
      if (!load.status.ok()) {
        if (!load.dry_run) PolicyFailed(load.source, load.status);
      } else if (!load.dry_run) {
        SwitchPolicy(load.policy, load.source);
      }
      if (load.reload) SdNotify("READY=1");
      if (s == nullptr) continue;  // reloads, and applies whose client has gone
      wire::PolicyReply r{};
      r.status = ToWire(load.status);
      const Policy& named = load.status.ok() ? *load.policy : *policy_;
      CopyCString(r.name, named.name);
      CopyCString(r.hash, named.Hash());
      if (load.status.ok()) CopyCString(r.previous_hash, previous);
      Reply(*s, wire::MsgType::kPolicyReply, load.seq, r);
    }
  }

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

  Status Serve() {
    if (config_.cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(config_.cpu, &set);
      if (::sched_setaffinity(0, sizeof set, &set) != 0) return ErrnoStatus("pinning to cpu " + std::to_string(config_.cpu), errno);
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
        if (copies_.empty() || done != completed_at_ping) {
          SdNotify("WATCHDOG=1");
        } else {
          FERRY_LOG(kWarning) << copies_.size() << " copies waiting and none finished for "
                              << (MonotonicNanos() - last_ping) / 1000000 << " ms: not feeding the watchdog";
        }
        completed_at_ping = done;
        last_ping = MonotonicNanos();
      }
      const bool must_poll = (!fences_.empty() && backend_->completion_fd() < 0) || !held_.empty();
      int timeout = 0;
      bool slept = false;
      if (!must_poll && MonotonicNanos() - last_activity > window.ns()) {
        SetSleeping(true);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (AnySubmissionPending()) {
          SetSleeping(false);
        } else {
          timeout = watchdog_ns != 0 ? static_cast<int>(watchdog_ns / 2'000'000) : -1;
          if (pool_->quarantined_bytes() != 0 && (timeout < 0 || timeout > int{kReclaimIntervalNs / 1'000'000})) {
            timeout = kReclaimIntervalNs / 1'000'000;  // wake to probe the quarantine again
          }
          const int timer = MillisToNextTimer();
          if (timer >= 0 && (timeout < 0 || timer < timeout)) timeout = timer;
          slept = true;
          counters_.sleeps++;
        }
      }
      // While spinning, look at the sockets only now and then: an epoll_wait per turn would
      // add its cost to every copy's latency. Sockets carry only the slow path.
      int n = 0;
      if (timeout != 0 || ++turns_since_epoll_ >= kTurnsPerEpoll) {
        turns_since_epoll_ = 0;
        n = ::epoll_wait(epoll_.get(), evs, 64, timeout);
      }
      if (slept) SetSleeping(false);
      if (n < 0 && errno != EINTR) return ErrnoStatus("epoll_wait", errno);
      bool work = n > 0;
      for (int i = 0; i < n; ++i) HandleEvent(evs[i]);
      RunTimers();
      if (PollSubmissions()) {
        window.OnQuietGap(MonotonicNanos() - last_activity);
        counters_.poll_window_ns = window.ns();
        work = true;
      }
      work |= PollBackend();
      work |= ReleaseHeld();
      work |= DispatchBulk();
      backend_->Flush();
      FlushAll();
      ReapDead();
      if (pool_->quarantined_bytes() != 0 && MonotonicNanos() - last_reclaim_ns_ >= kReclaimIntervalNs) Reclaim();
      if (work) last_activity = MonotonicNanos();
    }
    return Status::Ok();
  }

  DaemonConfig config_;
  std::unique_ptr<Backend> backend_;  // outlives pool_, whose zeroer thread calls it
  ServerCounters counters_;
  std::unique_ptr<PinnedPool> pool_;
  std::function<void(std::byte*, uint64_t)> before_slab_renewal_;  // handed to the pool at Init

 private:
  Status Watch(int fd, uint64_t tag, uint32_t events = EPOLLIN, int op = EPOLL_CTL_ADD) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    if (::epoll_ctl(epoll_.get(), op, fd, &ev) != 0) return ErrnoStatus("epoll_ctl", errno);
    return Status::Ok();
  }
  void Unwatch(int fd) {
    if (fd >= 0) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  }

  void SetSleeping(bool sleeping) {
    for (auto& [id, s] : sessions_) {
      if (s->hdr == nullptr || s->dead) continue;
      s->hdr->daemon_state.value.store(sleeping ? wire::kDaemonSleeping : 0, std::memory_order_relaxed);
    }
  }

  bool AnySubmissionPending() {
    for (auto& [id, s] : sessions_) {
      if (s->hdr == nullptr || s->dead) continue;
      if (s->hdr->sq_tail.value.load(std::memory_order_acquire) != s->sq_head) return true;
    }
    return false;
  }

  void HandleEvent(const epoll_event& ev) {
    const uint64_t tag = ev.data.u64;
    if (tag == kStopTag) {
      DrainDoorbell(stop_efd_.get());
      stopping_ = true;
      return;
    }
    if (tag == kListenTag) {
      Accept();
      return;
    }
    if (tag == kBackendTag) return;  // PollBackend runs every turn
    if (tag == kZeroedTag) {
      pool_->CollectZeroed();
      UpdatePoolCounters();
      return;
    }
    if ((tag & 0xf) == kPeerExitKind) {
      // An ended session's client exited: its mappings are gone, so its slabs may be too.
      auto w = exit_watch_.find(static_cast<pid_t>(tag >> 8));
      if (w != exit_watch_.end()) {
        Unwatch(w->second.pidfd.get());
        exit_watch_.erase(w);
      }
      Reclaim();
      return;
    }
    if (tag == kReloadTag) {
      DrainDoorbell(reload_efd_.get());
      ReloadPolicyFile();
      return;
    }
    if (tag == kPolicyLoadedTag) {
      PolicyLoaded();
      return;
    }
    const uint64_t id = tag >> 8;
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second->dead) return;
    Session& s = *it->second;
    if ((tag & 0xf) == kDoorbellKind) {
      DrainDoorbell(s.submit_efd.get());
      return;
    }
    if (ev.events & (EPOLLHUP | EPOLLERR)) {
      Evict(s, "client disconnected", kInfoLevel);
      return;
    }
    if (ev.events & EPOLLOUT) FlushOutbound(s);
    if ((ev.events & EPOLLIN) && !s.dead) HandleControl(s);
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
      // Connections that have not said hello cost an fd and a session each, so they are capped
      // in all and per uid; the one over a cap is closed at once (the client sees the
      // connection closed before hello).
      uint32_t pending = 0, pending_of_uid = 0;
      for (auto& [id, sp] : sessions_) {
        if (sp->hello_done || sp->dead) continue;
        ++pending;
        if (sp->peer.uid == cred->uid) ++pending_of_uid;
      }
      const Limits& lim = config_.limits;
      if (pending >= lim.pending_connections || pending_of_uid >= lim.pending_connections_per_uid) {
        CountRejected(ResourceExhausted(""));
        LogRefusedConnection(*cred, pending >= lim.pending_connections
                                        ? std::to_string(pending) + " connections have not said hello yet "
                                              "(limits.pending_connections)"
                                        : "uid " + std::to_string(cred->uid) + " has " + std::to_string(pending_of_uid) +
                                              " connections that have not said hello yet "
                                              "(limits.pending_connections_per_uid)");
        continue;  // closes it
      }
      auto s = std::make_unique<Session>();
      s->id = next_session_id_++;
      s->peer = *cred;
      s->sock = std::move(*fd);
      s->peer_pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, s->peer.pid, 0)));
      s->accepted_ns = MonotonicNanos();
      if (!Watch(s->sock.get(), SessionTag(s->id, kSocketKind)).ok()) continue;
      next_timer_ns_ = std::min(next_timer_ns_, s->accepted_ns + HelloTimeoutNs());
      sessions_.emplace(s->id, std::move(s));
    }
  }

  uint64_t HelloTimeoutNs() const { return uint64_t{config_.limits.hello_timeout_ms} * 1'000'000; }

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
      CountRejected(ResourceExhausted(""));
    }
    if (listen_watched_) {
      Unwatch(listen_.get());
      listen_watched_ = false;
      listen_resume_ns_ = MonotonicNanos() + kListenPauseNs;
      next_timer_ns_ = std::min(next_timer_ns_, listen_resume_ns_);
    }
  }

  static std::string FdUsage() {
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    std::error_code ec;
    size_t open = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::directory_iterator();
         it.increment(ec)) {
      ++open;
    }
    // The listing counts the fd it reads /proc/self/fd through.
    return (ec || open == 0 ? std::string("?") : std::to_string(open - 1)) + " fds open, RLIMIT_NOFILE " +
           std::to_string(rl.rlim_cur);
  }

  void LogRefusedConnection(const PeerCredentials& peer, const std::string& why) {
    const uint64_t now = MonotonicNanos();
    if (now - last_refusal_log_ns_ < kRejectLogIntervalNs && last_refusal_log_ns_ != 0) {
      ++refusals_unlogged_;
      return;
    }
    FERRY_LOG(kWarning) << "connection from pid " << peer.pid << " uid " << peer.uid << " closed before hello: " << why
                        << (refusals_unlogged_ ? " (and " + std::to_string(refusals_unlogged_) +
                                                     " more refused since the last such line)"
                                               : std::string());
    refusals_unlogged_ = 0;
    last_refusal_log_ns_ = now;
  }

  // Timers, run when next_timer_ns_ passes: hello deadlines and the listen socket's pause.
  void RunTimers() {
    const uint64_t now = MonotonicNanos();
    if (now < next_timer_ns_) return;
    next_timer_ns_ = UINT64_MAX;
    if (!listen_watched_ && listen_.valid()) {
      if (now >= listen_resume_ns_) {
        listen_watched_ = Watch(listen_.get(), kListenTag).ok();
      } else {
        next_timer_ns_ = listen_resume_ns_;
      }
    }
    for (auto& [id, sp] : sessions_) {
      Session& s = *sp;
      if (s.hello_done || s.dead) continue;
      const uint64_t deadline = s.accepted_ns + HelloTimeoutNs();
      if (now >= deadline) {
        CountRejected(ProtocolError(""));
        Evict(s, "did not say hello within " + std::to_string(config_.limits.hello_timeout_ms) +
                     " ms (limits.hello_timeout_ms)", kWarningLevel);
      } else {
        next_timer_ns_ = std::min(next_timer_ns_, deadline);
      }
    }
  }

  // How long the loop may sleep before a timer is due (-1: no timer).
  int MillisToNextTimer() const {
    if (next_timer_ns_ == UINT64_MAX) return -1;
    const uint64_t now = MonotonicNanos();
    return next_timer_ns_ <= now ? 0 : static_cast<int>((next_timer_ns_ - now + 999'999) / 1'000'000);
  }

  bool Authorized(const Session& s) {
    if (s.peer.uid == 0 || s.peer.uid == ::geteuid()) return true;
    if (!has_allowed_gid_) return false;
    if (s.peer.gid == allowed_gid_) return true;
    gid_t groups[256];
    socklen_t len = sizeof groups;
    if (::getsockopt(s.sock.get(), SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0) {
      for (size_t i = 0; i < len / sizeof(gid_t); ++i) {
        if (groups[i] == allowed_gid_) return true;
      }
    }
    return false;
  }

  // Replies never wait for the client: what does not fit in its socket buffer is queued (in
  // order, with copies of its fds) and sent when the socket is writable; a client that lets
  // more than limits.outbound_messages pile up is evicted.
  template <typename T>
  void Reply(Session& s, wire::MsgType type, uint32_t seq, const T& payload, const int* fds = nullptr, size_t nfds = 0) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (s.dead) return;
    std::vector<std::byte> frame = FrameMessage(type, seq, &payload, sizeof payload);
    if (s.outbound.empty()) {
      auto sent = TrySendFramed(s.sock.get(), frame, fds, nfds);
      if (!sent.ok()) return Evict(s, "reply failed: " + sent.status().ToString(), kWarningLevel);
      if (*sent) return;
    }
    if (s.outbound.size() >= config_.limits.outbound_messages) {
      return Evict(s, "does not read its replies: " + std::to_string(s.outbound.size()) +
                          " already queued (limits.outbound_messages)", kWarningLevel);
    }
    OutboundMessage m{std::move(frame), {}};
    for (size_t i = 0; i < nfds; ++i) {
      UniqueFd copy(::fcntl(fds[i], F_DUPFD_CLOEXEC, 0));
      if (!copy.valid()) {
        return Evict(s, "cannot queue a reply: " + ErrnoStatus("dup", errno).ToString() + " (" + FdUsage() + ")",
                     kWarningLevel);
      }
      m.fds.push_back(std::move(copy));
    }
    s.outbound.push_back(std::move(m));
    counters_.outbound_queued++;
    if (!s.watching_writable) {
      Status st = Watch(s.sock.get(), SessionTag(s.id, kSocketKind), EPOLLIN | EPOLLOUT, EPOLL_CTL_MOD);
      if (!st.ok()) return Evict(s, "cannot wait for its socket: " + st.ToString(), kWarningLevel);
      s.watching_writable = true;
    }
  }

  // Sends queued replies, in order, while the client's socket takes them.
  void FlushOutbound(Session& s) {
    while (!s.outbound.empty() && !s.dead) {
      OutboundMessage& m = s.outbound.front();
      std::vector<int> fds;
      for (const UniqueFd& f : m.fds) fds.push_back(f.get());
      auto sent = TrySendFramed(s.sock.get(), m.frame, fds.data(), fds.size());
      if (!sent.ok()) return Evict(s, "reply failed: " + sent.status().ToString(), kWarningLevel);
      if (!*sent) return;  // still full: EPOLLOUT again later
      s.outbound.pop_front();
      counters_.outbound_queued--;
    }
    if (s.outbound.empty() && s.watching_writable && !s.dead) {
      Status st = Watch(s.sock.get(), SessionTag(s.id, kSocketKind), EPOLLIN, EPOLL_CTL_MOD);
      if (!st.ok()) return Evict(s, "cannot watch its socket: " + st.ToString(), kWarningLevel);
      s.watching_writable = false;
    }
  }
  void ReplySimple(Session& s, uint32_t seq, const Status& st) {
    wire::SimpleReply r{};
    r.status = ToWire(st);
    Reply(s, wire::MsgType::kSimpleReply, seq, r);
  }

  void HandleControl(Session& s) {
    // A few messages per turn, so one chatty client cannot starve the data plane.
    for (int i = 0; i < 8 && !s.dead; ++i) {
      auto msg = RecvMessage(s.sock.get(), 0);
      if (!msg.ok()) {
        if (msg.status().code() == Code::kTimeout) return;  // nothing more to read
        if (msg.status().code() == Code::kUnavailable) {
          Evict(s, "client disconnected", kInfoLevel);
        } else {
          CountRejected(msg.status());
          Evict(s, "bad control message: " + msg.status().ToString(), kWarningLevel);
        }
        return;
      }
      Dispatch(s, *msg);
    }
  }

  void Dispatch(Session& s, ReceivedMessage& msg) {
    const uint32_t seq = msg.header.seq;
    if (!s.hello_done && msg.type() != wire::MsgType::kHello) {
      Evict(s, "first message was not hello", kWarningLevel);
      return;
    }
    switch (msg.type()) {
      case wire::MsgType::kHello: return HandleHello(s, seq, msg.As<wire::HelloRequest>());
      case wire::MsgType::kAllocBuffer: return HandleAlloc(s, seq, msg.As<wire::AllocBufferRequest>());
      case wire::MsgType::kFreeBuffer:
        return ReplySimple(s, seq, s.arena->Free(msg.As<wire::FreeBufferRequest>().pool_offset));
      case wire::MsgType::kRegisterDevice: {
        UniqueFd fd = msg.fds.empty() ? UniqueFd() : std::move(msg.fds[0]);
        return HandleRegisterDevice(s, seq, msg.As<wire::RegisterDeviceRequest>(), std::move(fd));
      }
      case wire::MsgType::kUnregisterDevice: return HandleUnregister(s, seq, msg.As<wire::UnregisterDeviceRequest>());
      case wire::MsgType::kRegisterEvent: return HandleRegisterEvent(s, seq, msg.As<wire::RegisterEventRequest>());
      case wire::MsgType::kStats: return HandleStats(s, seq);
      case wire::MsgType::kApplyPolicy: {
        UniqueFd fd = msg.fds.empty() ? UniqueFd() : std::move(msg.fds[0]);
        return HandleApplyPolicy(s, seq, msg.As<wire::ApplyPolicyRequest>(), std::move(fd));
      }
      case wire::MsgType::kGetPolicy: return HandleGetPolicy(s, seq, msg.As<wire::GetPolicyRequest>());
      case wire::MsgType::kGetStaging: {
        wire::StagingReply r{};
        r.status = ToWire(Status::Ok());
        r.chunk_bytes = policy_->staging_chunk_bytes;
        r.threads = policy_->staging_threads;
        r.buffers = policy_->staging_buffers;
        return Reply(s, wire::MsgType::kStagingReply, seq, r);
      }
      default:
        CountRejected(ProtocolError("unexpected message"));
        Evict(s, "unexpected control message type " + std::to_string(msg.header.type), kWarningLevel);
    }
  }

  void HandleHello(Session& s, uint32_t seq, const wire::HelloRequest& req) {
    wire::HelloReply r{};
    auto refuse = [&](const Status& st) {
      r.status = ToWire(st);
      Reply(s, wire::MsgType::kHelloReply, seq, r);
      CountRejected(st);
      Evict(s, "hello refused: " + st.ToString(), kWarningLevel);
    };
    if (s.hello_done) return refuse(ProtocolError("hello sent twice"));
    // The name goes into the log and policy rules match it: a control character in it could
    // forge log lines, so such a hello is refused (and its name never logged).
    const std::string name = ReadCString(req.name);
    for (size_t i = 0; i < name.size(); ++i) {
      const auto c = static_cast<unsigned char>(name[i]);
      if (c < 0x20 || c == 0x7f) {
        return refuse(InvalidArgument("the client name has a control character (byte " + std::to_string(c) +
                                      " at offset " + std::to_string(i) +
                                      "); name clients with printable text (ConnectOptions::name)"));
      }
    }
    s.name = name;
    if (req.client_version != wire::kVersion) {
      return refuse(ProtocolError("client speaks protocol " + std::to_string(req.client_version) + ", ferryd speaks " +
                                  std::to_string(wire::kVersion)));
    }
    if (!Authorized(s)) {
      return refuse(PermissionDenied("uid " + std::to_string(s.peer.uid) + " is not allowed to use this ferryd" +
                                     (has_allowed_gid_ ? " (not in group " + config_.allowed_group + ")" : "")));
    }
    if (counters_.sessions >= config_.max_sessions) {
      return refuse(ResourceExhausted("ferryd already serves " + std::to_string(config_.max_sessions) + " clients"));
    }
    const uint32_t of_uid = static_cast<uint32_t>(std::count_if(sessions_.begin(), sessions_.end(), [&](const auto& e) {
      return e.second->hello_done && !e.second->dead && e.second->peer.uid == s.peer.uid;
    }));
    if (of_uid >= config_.limits.sessions_per_uid) {
      return refuse(ResourceExhausted("uid " + std::to_string(s.peer.uid) + " already has " + std::to_string(of_uid) +
                                      " sessions; limits.sessions_per_uid is " +
                                      std::to_string(config_.limits.sessions_per_uid) +
                                      " (end one of them, or raise the limit in ferryd's config)"));
    }
    s.sq_entries = config_.ring_entries;
    s.cq_entries = config_.ring_entries * 2;
    const size_t bytes = wire::RingSegmentBytes(s.sq_entries, s.cq_entries);
    auto ring_fd = CreateSealedMemfd("ferry-ring-" + std::to_string(s.id), bytes);
    if (!ring_fd.ok()) return refuse(ring_fd.status());
    auto ring = MapShared(ring_fd->get(), bytes);
    if (!ring.ok()) return refuse(ring.status());
    auto sub = CreateEventFd();
    auto comp = CreateEventFd();
    if (!sub.ok() || !comp.ok()) return refuse(ResourceExhausted("cannot create doorbells"));
    s.ring_fd = std::move(*ring_fd);
    s.ring = std::move(*ring);
    s.submit_efd = std::move(*sub);
    s.complete_efd = std::move(*comp);
    s.hdr = std::construct_at(reinterpret_cast<wire::RingHeader*>(s.ring.data()));
    s.hdr->magic = wire::kRingMagic;
    s.hdr->version = wire::kVersion;
    s.hdr->sq_entries = s.sq_entries;
    s.hdr->cq_entries = s.cq_entries;
    s.sq = wire::SubmissionEntries(s.ring.data());
    s.cq = wire::CompletionEntries(s.ring.data(), s.sq_entries);
    s.arena = std::make_unique<SessionArena>(*pool_, s.id, quota_, s.peer.uid, config_.limits.pool_bytes_per_uid);
    s.klass = policy_->ClassFor(s.name, s.peer.uid);
    if (!Watch(s.submit_efd.get(), SessionTag(s.id, kDoorbellKind)).ok()) return refuse(Internal("epoll"));
    s.hello_done = true;
    s.sq_seen_empty_ns = MonotonicNanos();
    counters_.sessions++;
    counters_.sessions_total++;
    r.status = ToWire(Status::Ok());
    r.session_id = s.id;
    r.backend = static_cast<uint32_t>(backend_->kind());
    r.device_ordinal = backend_->device_ordinal();
    r.sq_entries = s.sq_entries;
    r.cq_entries = s.cq_entries;
    r.ring_bytes = bytes;
    r.pool_bytes = pool_->size();
    r.slab_bytes = pool_->slab_bytes();
    r.session_quota_bytes = quota_;
    int fds[3] = {s.ring_fd.get(), s.submit_efd.get(), s.complete_efd.get()};
    FERRY_LOG(kInfo) << "session " << s.id << " '" << s.name << "' from pid " << s.peer.pid << " uid " << s.peer.uid
                     << ", class " << s.klass.name;
    Reply(s, wire::MsgType::kHelloReply, seq, r, fds, 3);
  }

  // Queued replies hold dup'd fds (an AllocBuffer reply up to kMaxFdsPerMessage), so requests
  // whose reply carries fds are refused while replies wait for the client to read them: the
  // fds ferryd holds for a client that does not read stay bounded by one reply's.
  Status RefuseFdsWhileRepliesWait(const Session& s) {
    if (s.outbound.empty()) return Status::Ok();
    Status st = ResourceExhausted(std::to_string(s.outbound.size()) +
                                  " replies are waiting for this client to read them; read them, then ask again");
    CountRejected(st);
    return st;
  }

  void HandleAlloc(Session& s, uint32_t seq, const wire::AllocBufferRequest& req) {
    wire::AllocBufferReply r{};
    if (Status waiting = RefuseFdsWhileRepliesWait(s); !waiting.ok()) {
      r.status = ToWire(waiting);
      return Reply(s, wire::MsgType::kAllocBufferReply, seq, r);
    }
    auto a = s.arena->Allocate(req.size);
    if (!a.ok()) {
      r.status = ToWire(a.status());
      CountRejected(a.status());
      return Reply(s, wire::MsgType::kAllocBufferReply, seq, r);
    }
    if (a->slab_count > wire::kMaxFdsPerMessage) {
      s.arena->Free(a->pool_offset).ok();
      r.status = ToWire(InvalidArgument("buffer spans more than " + std::to_string(wire::kMaxFdsPerMessage) +
                                        " slabs; raise pool.slab"));
      return Reply(s, wire::MsgType::kAllocBufferReply, seq, r);
    }
    // Fresh descriptions, closed once sent: the client's (and whoever it passes them to) are the
    // only ones outside ferryd, which is what the quarantine's probe counts.
    std::vector<UniqueFd> grants;
    std::vector<int> fds;
    for (uint32_t i = 0; i < a->slab_count; ++i) {
      auto fd = pool_->OpenForClient(a->first_slab + i);
      if (!fd.ok()) {
        s.arena->Free(a->pool_offset).ok();
        r.status = ToWire(fd.status());
        return Reply(s, wire::MsgType::kAllocBufferReply, seq, r);
      }
      fds.push_back(fd->get());
      grants.push_back(std::move(*fd));
    }
    UpdatePoolCounters();
    r.status = ToWire(Status::Ok());
    r.pool_offset = a->pool_offset;
    r.size = a->size;
    r.first_slab = a->first_slab;
    r.slab_count = a->slab_count;
    Reply(s, wire::MsgType::kAllocBufferReply, seq, r, fds.data(), fds.size());
  }

  void HandleRegisterDevice(Session& s, uint32_t seq, const wire::RegisterDeviceRequest& req, UniqueFd fd) {
    wire::RegisterDeviceReply r{};
    auto refuse = [&](const Status& st) {
      r.status = ToWire(st);
      CountRejected(st);
      Reply(s, wire::MsgType::kRegisterDeviceReply, seq, r);
    };
    // Each region is a mapping or a device handle in ferryd: bounded per session and per uid, so
    // that no client can use up the process's map count (vm.max_map_count) or fds for the others.
    const Limits& lim = config_.limits;
    if (s.regions.size() >= lim.regions_per_session) {
      return refuse(ResourceExhausted("this session already has " + std::to_string(s.regions.size()) +
                                      " device regions (limits.regions_per_session): unregister some first"));
    }
    uint64_t of_uid = 0;
    for (auto& [id, sp] : sessions_) {
      if (sp->peer.uid == s.peer.uid) of_uid += sp->regions.size();
    }
    if (of_uid >= lim.regions_per_uid) {
      return refuse(ResourceExhausted("uid " + std::to_string(s.peer.uid) + " already has " + std::to_string(of_uid) +
                                      " device regions over all its sessions (limits.regions_per_uid): unregister "
                                      "some first"));
    }
    auto region = backend_->OpenDeviceRegion(req, std::move(fd));
    if (!region.ok()) {
      if (region.status().code() == Code::kResourceExhausted) {
        FERRY_LOG(kWarning) << "session " << s.id << " '" << s.name << "' (uid " << s.peer.uid
                            << "): cannot open a device region: " << region.status().message() << " (" << FdUsage()
                            << ")";
      }
      return refuse(region.status());
    }
    uint32_t id = s.next_region_id++;
    s.regions[id].region = std::move(*region);
    r.status = ToWire(Status::Ok());
    r.region_id = id;
    Reply(s, wire::MsgType::kRegisterDeviceReply, seq, r);
  }

  void HandleUnregister(Session& s, uint32_t seq, const wire::UnregisterDeviceRequest& req) {
    auto it = s.regions.find(req.region_id);
    if (it == s.regions.end() || it->second.unregistering) {
      return ReplySimple(s, seq, NotFound("no device region " + std::to_string(req.region_id)));
    }
    if (it->second.in_flight > 0) {
      it->second.unregistering = true;
    } else {
      s.regions.erase(it);
    }
    ReplySimple(s, seq, Status::Ok());
  }

  void HandleRegisterEvent(Session& s, uint32_t seq, const wire::RegisterEventRequest& req) {
    wire::RegisterEventReply r{};
    if (s.events.size() >= config_.limits.events_per_session) {
      r.status = ToWire(ResourceExhausted("this session already has " + std::to_string(s.events.size()) +
                                          " events (limits.events_per_session)"));
      CountRejected(ResourceExhausted(""));
      return Reply(s, wire::MsgType::kRegisterEventReply, seq, r);
    }
    auto ev = backend_->OpenEvent(req);
    if (!ev.ok()) {
      r.status = ToWire(ev.status());
      return Reply(s, wire::MsgType::kRegisterEventReply, seq, r);
    }
    uint32_t id = s.next_event_id++;
    s.events[id] = std::move(*ev);
    r.status = ToWire(Status::Ok());
    r.event_id = id;
    Reply(s, wire::MsgType::kRegisterEventReply, seq, r);
  }

  // Policies change how every client is served: only ferryd's own user (or root) may apply one.
  void HandleApplyPolicy(Session& s, uint32_t seq, const wire::ApplyPolicyRequest& req, UniqueFd fd) {
    wire::PolicyReply r{};
    const std::string source = ReadCString(req.source) + " (ferryctl, pid " + std::to_string(s.peer.pid) + ")";
    auto reply = [&](const Status& st) {
      r.status = ToWire(st);
      CopyCString(r.name, policy_->name);
      CopyCString(r.hash, policy_->Hash());
      Reply(s, wire::MsgType::kPolicyReply, seq, r);
    };
    if (s.peer.uid != 0 && s.peer.uid != ::geteuid()) {
      CountRejected(PermissionDenied(""));
      return reply(PermissionDenied("only ferryd's user or root may apply a policy"));
    }
    if (!fd.valid()) return reply(InvalidArgument("apply-policy carries the policy file as a file descriptor"));
    PolicyLoad load;
    load.fd = std::move(fd);
    load.name = ReadCString(req.source);
    load.session_id = s.id;
    load.seq = seq;
    load.dry_run = req.dry_run != 0;
    load.source = source;
    if (!policy_loader_->Submit(std::move(load))) {
      return reply(ResourceExhausted("ferryd is already reading " + std::to_string(PolicyLoader::kMaxQueued) +
                                     " policy files; try again when they are done"));
    }
  }

  void HandleGetPolicy(Session& s, uint32_t seq, const wire::GetPolicyRequest& req) {
    wire::PolicyReply r{};
    if (Status waiting = RefuseFdsWhileRepliesWait(s); !waiting.ok()) {
      r.status = ToWire(waiting);
      return Reply(s, wire::MsgType::kPolicyReply, seq, r);
    }
    if (req.format != wire::kPolicyFormatCanonical && req.format != wire::kPolicyFormatYaml) {
      r.status = ToWire(InvalidArgument("unknown policy format " + std::to_string(req.format)));
      return Reply(s, wire::MsgType::kPolicyReply, seq, r);
    }
    const std::string text = req.format == wire::kPolicyFormatYaml
                                 ? "# running policy " + policy_->Hash() + ", as a policy file\n" + policy_->ToYaml()
                                 : "# running policy, canonical form\n" + policy_->Canonical();
    CopyCString(r.name, policy_->name);
    CopyCString(r.hash, policy_->Hash());
    auto fd = CreateSealedMemfd("ferry-policy", text.size());
    Status st = fd.ok() ? Status::Ok() : fd.status();
    if (st.ok() && ::pwrite(fd->get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      st = ErrnoStatus("pwrite", errno);
    }
    r.status = ToWire(st);
    if (!st.ok()) return Reply(s, wire::MsgType::kPolicyReply, seq, r);
    int f = fd->get();
    Reply(s, wire::MsgType::kPolicyReply, seq, r, &f, 1);
  }

  void HandleStats(Session& s, uint32_t seq) {
    wire::StatsReply r{};
    r.status = ToWire(Status::Ok());
    r.sessions = counters_.sessions;
    r.copies_completed = counters_.copies_completed;
    r.bytes_h2d = counters_.bytes_h2d;
    r.bytes_d2h = counters_.bytes_d2h;
    r.pool_bytes = pool_->size();
    r.pool_free_bytes = pool_->free_bytes();
    r.evictions = counters_.evictions;
    r.rejected = counters_.rejected;
    r.backend = static_cast<uint32_t>(backend_->kind());
    Reply(s, wire::MsgType::kStatsReply, seq, r);
  }

  // ---- data plane ----

  bool PollSubmissions() {
    bool work = false;
    for (auto& [id, sp] : sessions_) {
      Session& s = *sp;
      if (!s.hello_done || s.dead) continue;
      const uint64_t scan_ns = MonotonicNanos();
      const uint32_t tail = s.hdr->sq_tail.value.load(std::memory_order_acquire);
      const uint32_t avail = tail - s.sq_head;
      if (avail == 0) {
        s.sq_seen_empty_ns = scan_ns;
        continue;
      }
      if (avail > s.sq_entries) {
        CountRejected(ProtocolError(""));
        Evict(s, "submission ring tail out of range", kWarningLevel);
        continue;
      }
      // Back-pressure: at most half the completion ring in flight, so completions always fit.
      const uint32_t room = s.cq_entries / 2 > s.in_flight ? s.cq_entries / 2 - s.in_flight : 0;
      const uint32_t take = std::min({avail, room, kSubmissionsPerTurn});
      for (uint32_t i = 0; i < take && !s.dead; ++i) {
        wire::SubmissionEntry e;
        // Read the entry once, into our memory; the client may rewrite the slot at any time.
        std::memcpy(&e, &s.sq[s.sq_head & (s.sq_entries - 1)], sizeof e);
        ++s.sq_head;
        HandleSubmission(s, e);
      }
      if (!s.dead) s.hdr->sq_head.value.store(s.sq_head, std::memory_order_release);
      if (s.sq_head == tail) s.sq_seen_empty_ns = scan_ns;
      work |= take > 0;
    }
    return work;
  }

  void Complete(Session& s, uint64_t tag, const Status& st, wire::CompletionKind kind, uint64_t bytes, uint64_t ns) {
    wire::CompletionEntry c{};
    c.user_tag = tag;
    c.status = static_cast<int32_t>(st.code());
    c.kind = static_cast<uint16_t>(kind);
    c.bytes = bytes;
    c.duration_ns = ns;
    s.backlog.push_back(c);
  }

  // Every refused request is counted under one of a few reasons (bounded metric labels).
  void CountRejected(const Status& st) {
    counters_.rejected++;
    if (observer_ == nullptr) return;
    switch (st.code()) {
      case Code::kResourceExhausted: return observer_->OnRejected("exhausted");
      case Code::kPermissionDenied: return observer_->OnRejected("permission");
      case Code::kNotFound: return observer_->OnRejected("not_found");
      case Code::kProtocol: return observer_->OnRejected("protocol");
      default: return observer_->OnRejected("invalid");
    }
  }

  // The client is told its log has the reason, so refusals are logged as warnings: the first
  // kRejectsLogged of a session, then (a hostile client must not flood the log) one line a
  // minute saying how many more there were, and the last one.
  static constexpr uint32_t kRejectsLogged = 10;
  static constexpr uint64_t kRejectSummaryNs = 60'000'000'000ull;
  void Reject(Session& s, uint64_t tag, const Status& st) {
    CountRejected(st);
    RejectLog& rl = s.reject_log;
    if (rl.logged < kRejectsLogged) {
      ++rl.logged;
      FERRY_LOG(kWarning) << "session " << s.id << " '" << s.name << "' (pid " << s.peer.pid << "): refused request "
                          << tag << ": " << st.ToString()
                          << (rl.logged == kRejectsLogged ? " (further refusals of this session: one line a minute)" : "");
      rl.summarized_ns = MonotonicNanos();
    } else {
      ++rl.unlogged;
      const uint64_t now = MonotonicNanos();
      if (now - rl.summarized_ns >= kRejectSummaryNs) {
        FERRY_LOG(kWarning) << "session " << s.id << " '" << s.name << "' (pid " << s.peer.pid << "): " << rl.unlogged
                            << " more requests refused in the last " << (now - rl.summarized_ns) / 1'000'000'000ull
                            << " s; the last, request " << tag << ": " << st.ToString();
        rl.unlogged = 0;
        rl.summarized_ns = now;
      }
    }
    Complete(s, tag, st, wire::CompletionKind::kCompleted, 0, 0);
  }

  void RememberForReports(Session& s, const Copy& c) {
    while (s.reportable_order.size() >= Session::kMaxReportableCopies) {
      const auto [tag, id] = s.reportable_order.front();
      s.reportable_order.pop_front();
      if (auto it = s.reportable.find(tag); it != s.reportable.end() && it->second.copy_id == id) s.reportable.erase(it);
    }
    // A tag used again names the newer copy from now on.
    s.reportable[c.user_tag] = {c.id, s.sq_seen_empty_ns, c.accepted_ns, 0, c.direction, false};
    s.reportable_order.emplace_back(c.user_tag, c.id);
  }

  // Exposed copy time is the one figure ferryd cannot measure: the client says how long it was
  // blocked on a copy. Believed only for a real copy of this session, once, and no longer than
  // ferryd's clock allows: the time since the copy's entry can first have been on the ring.
  void HandleWaitReport(Session& s, const wire::SubmissionEntry& e) {
    auto refuse = [&](const std::string& why) {
      counters_.rejected++;
      counters_.wait_reports_refused++;
      if (observer_ != nullptr) observer_->OnRejected("wait_report");
      FERRY_LOG(kDebug) << "session " << s.id << ": refused a wait report for copy " << e.user_tag << ": " << why;
    };
    auto it = s.reportable.find(e.user_tag);
    if (it == s.reportable.end()) return refuse("no recent copy of this session has that tag");
    Session::ReportableCopy& c = it->second;
    if (c.reported) return refuse("that copy's wait was reported already");
    const uint64_t now = MonotonicNanos();
    if (e.length > now - c.written_after_ns) {
      return refuse(std::to_string(e.length) + " ns is longer than the copy can have existed (" +
                    std::to_string(now - c.written_after_ns) + " ns)");
    }
    c.reported = true;
    counters_.wait_reports_accepted++;
    if (observer_ != nullptr) {
      observer_->OnExposed({c.direction, s.klass.name, policy_->name, static_cast<double>(e.length) * 1e-9,
                            static_cast<double>((c.done_ns != 0 ? c.done_ns : now) - c.accepted_ns) * 1e-9});
    }
  }

  void HandleSubmission(Session& s, const wire::SubmissionEntry& e) {
    const auto op = static_cast<wire::Opcode>(e.opcode);
    if (op == wire::Opcode::kNop) return Complete(s, e.user_tag, Status::Ok(), wire::CompletionKind::kCompleted, 0, 0);
    if (op == wire::Opcode::kReportWait) return HandleWaitReport(s, e);
    if (op != wire::Opcode::kHostToDevice && op != wire::Opcode::kDeviceToHost) {
      return Reject(s, e.user_tag, InvalidArgument("unknown opcode " + std::to_string(e.opcode)));
    }
    if (e.flags != 0 || e.reserved != 0) return Reject(s, e.user_tag, InvalidArgument("reserved fields must be 0"));
    if (e.priority > static_cast<uint16_t>(wire::Priority::kLatency)) {
      return Reject(s, e.user_tag, InvalidArgument("unknown priority " + std::to_string(e.priority)));
    }
    if (e.length == 0) return Reject(s, e.user_tag, InvalidArgument("copy of 0 bytes"));
    uint64_t buffer_offset = 0;
    BufferInfo* buf = s.arena->Find(e.pool_offset, e.length, &buffer_offset);
    if (buf == nullptr) return Reject(s, e.user_tag, InvalidArgument("host range is not inside a buffer of this session"));
    auto rit = s.regions.find(e.region_id);
    if (rit == s.regions.end() || rit->second.unregistering) {
      return Reject(s, e.user_tag, NotFound("no device region " + std::to_string(e.region_id)));
    }
    const uint64_t rsize = rit->second.region->size();
    if (e.device_offset > rsize || e.length > rsize - e.device_offset) {
      return Reject(s, e.user_tag, InvalidArgument("device range is outside region " + std::to_string(e.region_id)));
    }
    auto c = std::make_unique<Copy>();
    c->direction = op == wire::Opcode::kHostToDevice ? Direction::kHostToDevice : Direction::kDeviceToHost;
    if (e.wait_event_id != wire::kNoEvent) {
      auto it = s.events.find(e.wait_event_id);
      if (it == s.events.end()) return Reject(s, e.user_tag, NotFound("no event " + std::to_string(e.wait_event_id)));
      c->wait = it->second.get();
    }
    if (e.signal_event_id != wire::kNoEvent) {
      auto it = s.events.find(e.signal_event_id);
      if (it == s.events.end()) return Reject(s, e.user_tag, NotFound("no event " + std::to_string(e.signal_event_id)));
      c->signal = it->second.get();
    }
    c->id = next_copy_id_++;
    c->session_id = s.id;
    c->user_tag = e.user_tag;
    c->bytes = e.length;
    c->accepted_ns = MonotonicNanos();
    c->buffer_offset = buffer_offset;
    c->region_id = e.region_id;
    c->policy = policy_;
    c->latency = e.priority == static_cast<uint16_t>(wire::Priority::kLatency) && s.klass.latency_allowed &&
                 e.length <= policy_->latency_max_bytes && backend_->streams_per_direction() > 1;
    RememberForReports(s, *c);
    PlanPieces(*c, e, rit->second.region->base());
    buf->in_flight++;
    rit->second.in_flight++;
    s.in_flight++;
    counters_.in_flight++;
    Copy& ref = *c;
    copies_.emplace(c->id, std::move(c));
    if (ref.wait != nullptr) {
      held_.push_back(ref.id);
      return;
    }
    ScheduleCopy(s, ref);
  }

  void ScheduleCopy(Session& s, Copy& c) {
    if (c.latency) {
      DispatchNext(s, c);  // the latency stream: never queued behind bulk work
      MaybeFinish(c);
    } else {
      s.queue[static_cast<int>(c.direction)].push_back(c.id);
      s.queued_bytes += c.bytes;
      counters_.queued_bytes += c.bytes;
    }
  }

  // Schedules the held copies whose "after" event has happened (see Backend::EventHappened).
  bool ReleaseHeld() {
    bool any = false;
    for (size_t i = 0; i < held_.size();) {
      Copy& c = *copies_.at(held_[i]);
      auto happened = backend_->EventHappened(*c.wait);
      if (happened.ok() && !*happened) {
        ++i;
        continue;
      }
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
      any = true;
      c.wait = nullptr;
      if (!happened.ok()) {
        c.status = happened.status().WithContext("waiting for the copy's event");
        c.next = c.pieces.size();
        MaybeFinish(c);
      } else {
        ScheduleCopy(*sessions_.at(c.session_id), c);
      }
    }
    return any;
  }

  // Cuts a copy as its policy says, and also at slab boundaries when the backend registered the
  // pool slab by slab (a session's buffer sits in consecutive slabs of one mapping, so otherwise
  // a piece may cross them). Latency copies are one piece: they are small by definition.
  void PlanPieces(Copy& c, const wire::SubmissionEntry& e, std::byte* device_base) {
    const uint64_t slab = pool_->slab_bytes();
    const bool per_slab = backend_->pieces_stay_in_one_slab();
    lengths_.clear();
    if (c.latency) {
      lengths_.push_back(e.length);
    } else {
      c.policy->Pieces(e.length, lengths_);
    }
    uint64_t host_off = e.pool_offset;
    uint64_t dev_off = e.device_offset;
    for (uint64_t len : lengths_) {
      while (len > 0) {
        uint64_t n = per_slab ? std::min(len, slab - host_off % slab) : len;
        c.pieces.push_back(CopyPiece{0, pool_->base() + host_off, device_base + dev_off, n,
                                     n <= c.policy->batch_threshold_bytes});
        host_off += n;
        dev_off += n;
        len -= n;
      }
    }
  }

  // The stream for the next bulk piece of `c`: round robin over its policy's bulk streams, in
  // the bank of its bulk priority.
  uint32_t BulkStream(const Copy& c) {
    const uint32_t n = std::min(c.policy->bulk_streams, kMaxBulkStreams);
    const uint32_t bank = c.policy->bulk_priority == StreamPriority::kLeast ? 1 : 1 + kMaxBulkStreams;
    return bank + static_cast<uint32_t>(bulk_cursor_++ % n);
  }

  // Hands the next piece of `c` (or all of it, when it goes whole) to the backend.
  void DispatchNext(Session& s, Copy& c) {
    CopyPlan plan;
    plan.direction = c.direction;
    plan.accepted_ns = c.accepted_ns;
    const bool whole = c.WholeAtOnce();
    const size_t end = whole ? c.pieces.size() : c.next + 1;
    uint64_t bytes = 0;
    for (size_t i = c.next; i < end; ++i) {
      CopyPiece p = c.pieces[i];
      p.stream = c.latency ? 0 : BulkStream(c);  // a whole bulk copy spreads over the streams too
      plan.pieces.push_back(p);
      bytes += p.length;
    }
    const bool last = end == c.pieces.size();
    if (last) plan.signal = c.signal;
    c.next = end;
    if (c.first_dispatch_ns == 0) c.first_dispatch_ns = MonotonicNanos();
    auto fence = backend_->Submit(plan);
    if (!fence.ok()) {
      if (c.status.ok()) c.status = fence.status();
      c.next = c.pieces.size();  // nothing more of it goes out
      return;
    }
    c.out++;
    fences_[*fence] = FenceRef{c.id, bytes, !c.latency};
    if (!c.latency) {
      s.bulk_out_bytes[static_cast<int>(c.direction)] += bytes;
      bulk_out_bytes_[static_cast<int>(c.direction)] += bytes;
    }
    counters_.in_flight_bytes += bytes;
    if (last && c.signal != nullptr) Complete(s, c.user_tag, Status::Ok(), wire::CompletionKind::kEnqueued, c.bytes, 0);
  }

  // Deficit round robin over the sessions with queued bulk work, within the current policy's
  // in-flight limits. A visit adds weight x quantum to the session's deficit; the session
  // dispatches while its next piece fits in the deficit. A visit cut short by full engines stays
  // open, so the session resumes first when they drain: shares follow the weights even when
  // every completion frees room for one piece only.
  bool DispatchBulk() { return DispatchBulk(0) | DispatchBulk(1); }

  bool DispatchBulk(int d) {
    const Policy& pol = *policy_;
    const uint64_t client_limit = pol.client_in_flight_bytes ? pol.client_in_flight_bytes : pol.in_flight_bytes;
    auto engines_full = [&] { return bulk_out_bytes_[d] >= pol.in_flight_bytes; };
    auto blocked = [&](const Copy& c) {
      return c.first_dispatch_ns == 0 && pol.max_copies_in_flight != 0 && copies_started_[d] >= pol.max_copies_in_flight;
    };
    bool any = false;
    size_t idle_visits = 0;  // visits in a row that dispatched nothing
    while (!engines_full() && !sessions_.empty() && idle_visits <= 2 * sessions_.size() + kMaxDispatchRounds) {
      auto it = visit_open_[d] ? sessions_.lower_bound(rr_cursor_[d]) : sessions_.upper_bound(rr_cursor_[d]);
      if (it == sessions_.end()) it = sessions_.begin();
      if (visit_open_[d] && it->first != rr_cursor_[d]) visit_open_[d] = false;  // that session is gone
      rr_cursor_[d] = it->first;
      Session& s = *it->second;
      if (s.queue[d].empty() || s.dead || s.bulk_out_bytes[d] >= client_limit || blocked(*copies_.at(s.queue[d].front()))) {
        visit_open_[d] = false;
        ++idle_visits;
        if (idle_visits > sessions_.size() && !AnyDispatchable(d, client_limit, blocked)) break;
        continue;
      }
      if (!visit_open_[d]) {
        s.deficit[d] = std::min<uint64_t>(s.deficit[d] + kQuantumBytes * s.klass.weight, kMaxDeficitBytes);
        visit_open_[d] = true;
      }
      bool sent = false;
      while (!s.queue[d].empty() && !engines_full() && s.bulk_out_bytes[d] < client_limit) {
        Copy& c = *copies_.at(s.queue[d].front());
        if (blocked(c)) break;
        const uint64_t need = c.NextDispatchBytes();
        if (need > s.deficit[d] && s.deficit[d] < kMaxDeficitBytes) break;
        s.deficit[d] -= std::min(need, s.deficit[d]);
        if (c.first_dispatch_ns == 0) copies_started_[d]++;
        DispatchNext(s, c);
        sent = any = true;
        if (c.next == c.pieces.size()) {
          s.queue[d].pop_front();
          s.queued_bytes -= c.bytes;
          counters_.queued_bytes -= c.bytes;
          MaybeFinish(c);  // done already if its dispatch failed
        }
      }
      if (s.queue[d].empty()) s.deficit[d] = 0;
      if (engines_full() && !s.queue[d].empty()) return any;  // the visit stays open
      visit_open_[d] = false;
      idle_visits = sent ? 0 : idle_visits + 1;
    }
    return any;
  }

  template <typename Blocked>
  bool AnyDispatchable(int d, uint64_t client_limit, Blocked blocked) {
    for (auto& [id, sp] : sessions_) {
      const Session& s = *sp;
      if (!s.queue[d].empty() && !s.dead && s.bulk_out_bytes[d] < client_limit && !blocked(*copies_.at(s.queue[d].front()))) {
        return true;
      }
    }
    return false;
  }

  // Finishes a copy once nothing of it is queued or out: completion to the client, resources
  // released, counters and the observer told.
  void MaybeFinish(Copy& c) {
    if (c.out != 0 || c.next != c.pieces.size()) return;
    const uint64_t now = MonotonicNanos();
    if (!c.latency && c.first_dispatch_ns != 0) copies_started_[static_cast<int>(c.direction)]--;
    counters_.in_flight--;
    if (c.status.ok()) {
      counters_.copies_completed++;
      (c.direction == Direction::kHostToDevice ? counters_.bytes_h2d : counters_.bytes_d2h) += c.bytes;
    } else {
      counters_.copies_failed++;
    }
    auto sit = sessions_.find(c.session_id);
    if (sit != sessions_.end()) {
      Session& s = *sit->second;
      s.in_flight--;
      s.arena->CopyDone(c.buffer_offset);
      auto rit = s.regions.find(c.region_id);
      if (rit != s.regions.end() && --rit->second.in_flight == 0 && rit->second.unregistering) s.regions.erase(rit);
      if (!s.dead) Complete(s, c.user_tag, c.status, wire::CompletionKind::kCompleted, c.bytes, now - c.accepted_ns);
      if (auto rc = s.reportable.find(c.user_tag); rc != s.reportable.end() && rc->second.copy_id == c.id) {
        rc->second.done_ns = now;
      }
      if (observer_ != nullptr) {
        CopyRecord r{c.direction, c.latency, s.klass.name, c.policy->name, c.bytes,
                     (c.first_dispatch_ns ? c.first_dispatch_ns - c.accepted_ns : 0) * 1e-9,
                     (now - c.accepted_ns) * 1e-9, c.status.ok()};
        observer_->OnCopyDone(r);
      }
    }
    copies_.erase(c.id);
  }

  bool PollBackend() {
    done_.clear();
    backend_->PollCompleted(done_);
    for (const FenceResult& r : done_) {
      auto it = fences_.find(r.fence);
      if (it == fences_.end()) continue;
      const FenceRef f = it->second;
      fences_.erase(it);
      counters_.in_flight_bytes -= f.bytes;
      auto cit = copies_.find(f.copy_id);
      if (cit == copies_.end()) continue;
      Copy& c = *cit->second;
      c.out--;
      if (!r.status.ok() && c.status.ok()) c.status = r.status;
      if (f.bulk) {
        const int d = static_cast<int>(c.direction);
        bulk_out_bytes_[d] -= f.bytes;
        auto sit = sessions_.find(c.session_id);
        if (sit != sessions_.end()) sit->second->bulk_out_bytes[d] -= f.bytes;
      }
      if (!c.status.ok() && c.next < c.pieces.size()) {
        // A piece failed: the rest of the copy does not go out.
        auto sit = sessions_.find(c.session_id);
        if (sit != sessions_.end()) DropQueued(*sit->second, c);
      }
      MaybeFinish(c);
    }
    return !done_.empty();
  }

  // Takes a copy's undispatched pieces out of its session's queue.
  void DropQueued(Session& s, Copy& c) {
    c.next = c.pieces.size();
    auto& queue = s.queue[static_cast<int>(c.direction)];
    auto q = std::find(queue.begin(), queue.end(), c.id);
    if (q != queue.end()) {
      queue.erase(q);
      s.queued_bytes -= c.bytes;
      counters_.queued_bytes -= c.bytes;
    }
  }

  void FlushAll() {
    for (auto& [id, sp] : sessions_) {
      Session& s = *sp;
      if (s.dead || s.backlog.empty()) continue;
      const uint32_t head = s.hdr->cq_head.value.load(std::memory_order_acquire);
      const uint32_t used = s.cq_tail - head;
      if (used > s.cq_entries) {
        CountRejected(ProtocolError(""));
        Evict(s, "completion ring head out of range", kWarningLevel);
        continue;
      }
      uint32_t space = s.cq_entries - used;
      bool wrote = false;
      while (space > 0 && !s.backlog.empty()) {
        s.cq[s.cq_tail & (s.cq_entries - 1)] = s.backlog.front();
        s.backlog.pop_front();
        ++s.cq_tail;
        --space;
        wrote = true;
      }
      if (wrote) {
        s.hdr->cq_tail.value.store(s.cq_tail, std::memory_order_release);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (s.hdr->client_state.value.load(std::memory_order_relaxed) & wire::kClientWaiting) {
          RingDoorbell(s.complete_efd.get());
        }
      }
      if (s.backlog.size() > 4u * s.cq_entries) Evict(s, "client does not reap its completions", kWarningLevel);
    }
  }

  enum LogLevelTag { kInfoLevel, kWarningLevel };

  // Stops serving a session now; its resources go once its copies in flight are done (the
  // copy engines may still be reading or writing its buffers).
  void Evict(Session& s, const std::string& reason, LogLevelTag level) {
    if (s.dead) return;
    s.dead = true;
    if (level == kWarningLevel) {
      counters_.evictions++;
      FERRY_LOG(kWarning) << "session " << s.id << " '" << s.name << "' (pid " << s.peer.pid << ") evicted: " << reason;
    } else {
      FERRY_LOG(kInfo) << "session " << s.id << " '" << s.name << "' (pid " << s.peer.pid << ") ended: " << reason;
    }
    Unwatch(s.sock.get());
    Unwatch(s.submit_efd.get());
    s.sock.reset();
    counters_.outbound_queued -= s.outbound.size();
    s.outbound.clear();
    s.backlog.clear();
    // Its queued copies never go out; the ones on the engines finish first (they use its memory).
    std::vector<uint64_t> queued(s.queue[0].begin(), s.queue[0].end());
    queued.insert(queued.end(), s.queue[1].begin(), s.queue[1].end());
    for (uint64_t id : queued) {
      Copy& c = *copies_.at(id);
      DropQueued(s, c);
      MaybeFinish(c);
    }
    // Its held copies never go out either.
    for (size_t i = 0; i < held_.size();) {
      Copy& c = *copies_.at(held_[i]);
      if (c.session_id != s.id) {
        ++i;
        continue;
      }
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
      c.next = c.pieces.size();
      MaybeFinish(c);
    }
  }

  void ReapDead() {
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      Session& s = *it->second;
      if (s.dead && s.in_flight == 0) {
        const uint64_t id = s.id;
        const uint32_t uid = s.peer.uid;
        const bool counted = s.hello_done;
        const std::string name = s.name;
        const size_t regions = s.regions.size(), events = s.events.size();
        const std::vector<uint32_t> slabs = s.arena ? s.arena->owned_slabs() : std::vector<uint32_t>{};
        const pid_t s_pid = s.peer.pid;
        UniqueFd pidfd = std::move(s.peer_pidfd);
        it = sessions_.erase(it);  // closes regions and events, quarantines slabs
        if (!slabs.empty()) Reclaim();
        uint64_t held = 0;
        for (uint32_t slab : slabs) held += pool_->quarantined(slab) ? pool_->slab_bytes() : 0;
        if (counted) {
          counters_.sessions--;
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
        Unwatch(w->second.pidfd.get());
        w = exit_watch_.erase(w);
      } else {
        ++w;
      }
    }
    UpdatePoolCounters();
  }

  // Watches the exit of the client process `pid` (one pidfd per process) while `slabs` of its
  // ended session are quarantined.
  void WatchPeerExit(pid_t pid, UniqueFd pidfd, const std::vector<uint32_t>& slabs) {
    auto w = exit_watch_.find(pid);
    if (w == exit_watch_.end()) {
      if (!pidfd.valid() || !Watch(pidfd.get(), SessionTag(static_cast<uint64_t>(pid), kPeerExitKind)).ok()) return;
      w = exit_watch_.emplace(pid, PeerExitWatch{std::move(pidfd), {}}).first;
    }
    for (uint32_t slab : slabs) {
      if (pool_->quarantined(slab)) w->second.slabs.insert(slab);
    }
  }

  void UpdatePoolCounters() {
    counters_.pool_free_bytes = pool_->free_bytes();
    counters_.pool_quarantined_bytes = pool_->quarantined_bytes();
    counters_.pool_zeroing_bytes = pool_->zeroing_bytes();
    counters_.pool_broken_bytes = pool_->broken_bytes();
  }

  void Shutdown() {
    SdNotify("STOPPING=1");
    FERRY_LOG(kInfo) << "stopping: " << sessions_.size() << " sessions, " << fences_.size() << " copies in flight";
    if (listen_watched_) Unwatch(listen_.get());
    listen_watched_ = false;
    listen_.reset();
    ::unlink(socket_path_.c_str());
    for (auto& [id, s] : sessions_) Evict(*s, "ferryd is stopping", kInfoLevel);
    const uint64_t deadline = MonotonicNanos() + 10'000'000'000ull;
    while (!fences_.empty() && MonotonicNanos() < deadline) {
      if (backend_->completion_fd() >= 0) WaitReadable(backend_->completion_fd(), 10).ok();
      backend_->Flush();
      PollBackend();
    }
    ReapDead();
    sessions_.clear();
  }

  std::string socket_path_;
  UniqueFd listen_, stop_efd_, epoll_;
  UniqueFd reserve_fd_;  // /dev/null, closed to make room to refuse a connection when out of fds
  bool listen_watched_ = false;
  bool fd_episode_ = false;  // out of fds since the last accept that worked (logged once)
  uint64_t listen_resume_ns_ = 0;
  uint64_t next_timer_ns_ = UINT64_MAX;  // the earliest hello deadline or listen resumption
  uint64_t last_refusal_log_ns_ = 0;
  uint64_t refusals_unlogged_ = 0;
  bool stopping_ = false;
  uint32_t turns_since_epoll_ = 0;
  bool has_allowed_gid_ = false;
  gid_t allowed_gid_ = 0;
  uint64_t quota_ = 0;
  uint64_t next_session_id_ = 1;
  uint64_t bulk_cursor_ = 0;
  std::map<uint64_t, std::unique_ptr<Session>> sessions_;
  struct PeerExitWatch {
    UniqueFd pidfd;
    std::set<uint32_t> slabs;  // of its ended sessions, still quarantined
  };
  std::map<pid_t, PeerExitWatch> exit_watch_;  // client pid -> its pidfd, while its ended sessions' slabs are quarantined
  uint64_t last_reclaim_ns_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Copy>> copies_;
  std::unordered_map<FenceId, FenceRef> fences_;
  std::vector<FenceResult> done_;
  std::vector<uint64_t> lengths_;
  uint64_t next_copy_id_ = 1;
  std::vector<uint64_t> held_;  // copies waiting for their "after" event, in arrival order
  uint64_t bulk_out_bytes_[2] = {0, 0};  // per direction: bulk bytes on the engines, all sessions
  uint32_t copies_started_[2] = {0, 0};  // per direction: bulk copies with pieces out, not finished
  uint64_t rr_cursor_[2] = {0, 0};        // deficit round robin: the session visited last (or now)
  bool visit_open_[2] = {false, false};  // ... and its visit continues when the engines drain
  UniqueFd reload_efd_;
  std::unique_ptr<PolicyLoader> policy_loader_;
  UniqueFd lock_fd_;  // holds ferryd.lock open, and with it the fcntl lock

 public:
  std::shared_ptr<const Policy> policy_;  // written on the loop thread only; read under policy_mu_
  mutable std::mutex policy_mu_;
  ServerObserver* observer_ = nullptr;
  std::function<void(const std::string&)> policy_parse_hook_;  // ServerOptions::before_policy_parse
 private:
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

Result<std::unique_ptr<Server>> Server::Create(const DaemonConfig& config, std::unique_ptr<Backend> backend,
                                               ServerOptions options) {
  FERRY_RETURN_IF_ERROR(ValidateConfig(config));
  std::shared_ptr<const Policy> policy = options.policy;
  std::string source = options.policy_source.empty() ? "the caller" : options.policy_source;
  if (!policy && !config.policy_path.empty()) {
    FERRY_ASSIGN_OR_RETURN(policy, LoadPolicyFile(config.policy_path));
    source = config.policy_path;
  }
  if (!policy) {
    policy = std::make_shared<const Policy>();
    source = "built-in default";
  }
  auto impl = std::make_unique<Impl>(config, std::move(backend), std::move(options.before_slab_renewal));
  impl->observer_ = options.observer;
  impl->policy_parse_hook_ = std::move(options.before_policy_parse);
  impl->SwitchPolicy(std::move(policy), source);
  FERRY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Status Server::Run() { return impl_->Run(); }
void Server::Stop() { impl_->Stop(); }
void Server::RequestReload() { impl_->RequestReload(); }
std::shared_ptr<const Policy> Server::policy() const {
  std::lock_guard<std::mutex> l(impl_->policy_mu_);
  return impl_->policy_;
}
const DaemonConfig& Server::config() const { return impl_->config_; }
const ServerCounters& Server::counters() const { return impl_->counters_; }
Backend& Server::backend() { return *impl_->backend_; }
uint64_t Server::pool_bytes() const { return impl_->pool_->size(); }

}  // namespace ferry::daemon
