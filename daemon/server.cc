#include "daemon/server.hpp"

#include <grp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>

#include "common/channel.hpp"
#include "common/log.hpp"
#include "daemon/pinned_pool.hpp"

namespace ferry::daemon {
namespace {

constexpr uint64_t kListenTag = 1;
constexpr uint64_t kStopTag = 2;
constexpr uint64_t kBackendTag = 3;
constexpr uint64_t kSocketKind = 0;
constexpr uint64_t kDoorbellKind = 1;
constexpr uint64_t SessionTag(uint64_t id, uint64_t kind) { return (id << 8) | 0x10 | kind; }
constexpr uint32_t kMaxEventsPerSession = 4096;
constexpr uint32_t kMaxRegionsPerSession = 4096;
constexpr uint32_t kSubmissionsPerTurn = 64;  // per session per loop turn: fairness between clients
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

struct Session {
  uint64_t id = 0;
  PeerCredentials peer;
  std::string name;
  UniqueFd sock;
  bool hello_done = false;
  bool dead = false;

  UniqueFd ring_fd, submit_efd, complete_efd;
  Mapping ring;
  wire::RingHeader* hdr = nullptr;
  wire::SubmissionEntry* sq = nullptr;
  wire::CompletionEntry* cq = nullptr;
  uint32_t sq_entries = 0, cq_entries = 0;  // daemon's copies; never read back from shared memory
  uint32_t sq_head = 0, cq_tail = 0;
  uint32_t in_flight = 0;
  std::deque<wire::CompletionEntry> backlog;

  std::unique_ptr<SessionArena> arena;
  std::map<uint32_t, RegionState> regions;
  uint32_t next_region_id = 1;
  std::map<uint32_t, std::unique_ptr<SharedEvent>> events;
  uint32_t next_event_id = 1;
};

struct InFlight {
  uint64_t session_id;
  uint64_t user_tag;
  uint64_t bytes;
  uint64_t start_ns;
  uint64_t buffer_offset;
  uint32_t region_id;
  Direction direction;
};

}  // namespace

class Server::Impl {
 public:
  Impl(DaemonConfig config, std::unique_ptr<Backend> backend) : config_(std::move(config)), backend_(std::move(backend)) {}

  Status Init() {
    if (!config_.allowed_group.empty()) {
      group* g = ::getgrnam(config_.allowed_group.c_str());
      if (g == nullptr) return NotFound("allowed_group '" + config_.allowed_group + "' does not exist");
      allowed_gid_ = g->gr_gid;
      has_allowed_gid_ = true;
    }
    quota_ = config_.session_quota_bytes == 0 ? config_.pool_bytes : config_.session_quota_bytes;
    uint64_t t0 = MonotonicNanos();
    FERRY_ASSIGN_OR_RETURN(pool_, PinnedPool::Create(config_.pool_bytes, config_.slab_bytes));
    uint64_t t1 = MonotonicNanos();
    FERRY_RETURN_IF_ERROR(backend_->RegisterPool(pool_->base(), pool_->size(), pool_->slab_bytes()).WithContext("pool registration"));
    uint64_t t2 = MonotonicNanos();
    FERRY_LOG(kInfo) << "pool: " << (pool_->size() >> 20) << " MiB in " << pool_->slab_count() << " slabs of "
                     << (pool_->slab_bytes() >> 10) << " KiB; created in " << (t1 - t0) / 1000000 << " ms, registered in "
                     << (t2 - t1) / 1000000 << " ms";
    counters_.pool_free_bytes = pool_->free_bytes();

    FERRY_RETURN_IF_ERROR(MakeRuntimeDir(config_.runtime_dir));
    socket_path_ = config_.SocketPath();
    FERRY_ASSIGN_OR_RETURN(listen_, ListenUnix(socket_path_, has_allowed_gid_ ? 0660 : 0600));
    if (has_allowed_gid_ && ::chown(socket_path_.c_str(), static_cast<uid_t>(-1), allowed_gid_) != 0) {
      return ErrnoStatus("chown(" + socket_path_ + ")", errno);
    }
    FERRY_ASSIGN_OR_RETURN(stop_efd_, CreateEventFd());
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_.valid()) return ErrnoStatus("epoll_create1", errno);
    FERRY_RETURN_IF_ERROR(Watch(listen_.get(), kListenTag));
    FERRY_RETURN_IF_ERROR(Watch(stop_efd_.get(), kStopTag));
    if (backend_->completion_fd() >= 0) FERRY_RETURN_IF_ERROR(Watch(backend_->completion_fd(), kBackendTag));
    FERRY_LOG(kInfo) << "listening on " << socket_path_ << (has_allowed_gid_ ? " (group " + config_.allowed_group + ")" : " (owner only)");
    return Status::Ok();
  }

  ~Impl() {
    if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
  }

  void Stop() { RingDoorbell(stop_efd_.get()); }

  Status Run() {
    const uint64_t spin_ns = static_cast<uint64_t>(config_.spin_us) * 1000;
    uint64_t last_activity = MonotonicNanos();
    epoll_event evs[64];
    while (!stopping_) {
      const bool must_poll = !fences_.empty() && backend_->completion_fd() < 0;
      int timeout = 0;
      bool slept = false;
      if (!must_poll && MonotonicNanos() - last_activity > spin_ns) {
        SetSleeping(true);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (AnySubmissionPending()) {
          SetSleeping(false);
        } else {
          timeout = -1;
          slept = true;
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
      work |= PollSubmissions();
      backend_->Flush();
      work |= PollBackend();
      FlushAll();
      ReapDead();
      if (work) last_activity = MonotonicNanos();
    }
    Shutdown();
    return Status::Ok();
  }

  DaemonConfig config_;
  std::unique_ptr<Backend> backend_;
  ServerCounters counters_;
  std::unique_ptr<PinnedPool> pool_;

 private:
  Status Watch(int fd, uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return ErrnoStatus("epoll_ctl", errno);
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
    HandleControl(s);
  }

  void Accept() {
    for (;;) {
      auto fd = AcceptUnix(listen_.get());
      if (!fd.ok()) return;  // EAGAIN: no more pending
      auto cred = GetPeerCredentials(fd->get());
      if (!cred.ok()) continue;
      auto s = std::make_unique<Session>();
      s->id = next_session_id_++;
      s->peer = *cred;
      s->sock = std::move(*fd);
      if (!Watch(s->sock.get(), SessionTag(s->id, kSocketKind)).ok()) continue;
      sessions_.emplace(s->id, std::move(s));
    }
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

  template <typename T>
  void Reply(Session& s, wire::MsgType type, uint32_t seq, const T& payload, const int* fds = nullptr, size_t nfds = 0) {
    Status st = Send(s.sock.get(), type, seq, payload, fds, nfds);
    if (!st.ok()) Evict(s, "reply failed: " + st.ToString(), kWarningLevel);
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
          counters_.rejected++;
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
      default:
        counters_.rejected++;
        Evict(s, "unexpected control message type " + std::to_string(msg.header.type), kWarningLevel);
    }
  }

  void HandleHello(Session& s, uint32_t seq, const wire::HelloRequest& req) {
    wire::HelloReply r{};
    auto refuse = [&](const Status& st) {
      r.status = ToWire(st);
      Reply(s, wire::MsgType::kHelloReply, seq, r);
      counters_.rejected++;
      Evict(s, "hello refused: " + st.ToString(), kWarningLevel);
    };
    if (s.hello_done) return refuse(ProtocolError("hello sent twice"));
    s.name = ReadCString(req.name);
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
    s.arena = std::make_unique<SessionArena>(*pool_, s.id, quota_);
    if (!Watch(s.submit_efd.get(), SessionTag(s.id, kDoorbellKind)).ok()) return refuse(Internal("epoll"));
    s.hello_done = true;
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
    FERRY_LOG(kInfo) << "session " << s.id << " '" << s.name << "' from pid " << s.peer.pid << " uid " << s.peer.uid;
    Reply(s, wire::MsgType::kHelloReply, seq, r, fds, 3);
  }

  void HandleAlloc(Session& s, uint32_t seq, const wire::AllocBufferRequest& req) {
    wire::AllocBufferReply r{};
    auto a = s.arena->Allocate(req.size);
    if (!a.ok()) {
      r.status = ToWire(a.status());
      if (a.status().code() == Code::kResourceExhausted) counters_.rejected++;
      return Reply(s, wire::MsgType::kAllocBufferReply, seq, r);
    }
    if (a->slab_count > wire::kMaxFdsPerMessage) {
      s.arena->Free(a->pool_offset).ok();
      r.status = ToWire(InvalidArgument("buffer spans more than " + std::to_string(wire::kMaxFdsPerMessage) +
                                        " slabs; raise pool.slab"));
      return Reply(s, wire::MsgType::kAllocBufferReply, seq, r);
    }
    counters_.pool_free_bytes = pool_->free_bytes();
    r.status = ToWire(Status::Ok());
    r.pool_offset = a->pool_offset;
    r.size = a->size;
    r.first_slab = a->first_slab;
    r.slab_count = a->slab_count;
    std::vector<int> fds;
    for (uint32_t i = 0; i < a->slab_count; ++i) fds.push_back(pool_->slab_fd(a->first_slab + i));
    Reply(s, wire::MsgType::kAllocBufferReply, seq, r, fds.data(), fds.size());
  }

  void HandleRegisterDevice(Session& s, uint32_t seq, const wire::RegisterDeviceRequest& req, UniqueFd fd) {
    wire::RegisterDeviceReply r{};
    if (s.regions.size() >= kMaxRegionsPerSession) {
      r.status = ToWire(ResourceExhausted("too many device regions in this session"));
      return Reply(s, wire::MsgType::kRegisterDeviceReply, seq, r);
    }
    auto region = backend_->OpenDeviceRegion(req, std::move(fd));
    if (!region.ok()) {
      r.status = ToWire(region.status());
      return Reply(s, wire::MsgType::kRegisterDeviceReply, seq, r);
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
    if (s.events.size() >= kMaxEventsPerSession) {
      r.status = ToWire(ResourceExhausted("too many events in this session"));
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
      const uint32_t tail = s.hdr->sq_tail.value.load(std::memory_order_acquire);
      const uint32_t avail = tail - s.sq_head;
      if (avail == 0) continue;
      if (avail > s.sq_entries) {
        counters_.rejected++;
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

  void Reject(Session& s, uint64_t tag, const Status& st) {
    counters_.rejected++;
    FERRY_LOG(kDebug) << "session " << s.id << ": rejected request " << tag << ": " << st.ToString();
    Complete(s, tag, st, wire::CompletionKind::kCompleted, 0, 0);
  }

  void HandleSubmission(Session& s, const wire::SubmissionEntry& e) {
    const auto op = static_cast<wire::Opcode>(e.opcode);
    if (op == wire::Opcode::kNop) return Complete(s, e.user_tag, Status::Ok(), wire::CompletionKind::kCompleted, 0, 0);
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
    CopyPlan plan;
    plan.direction = op == wire::Opcode::kHostToDevice ? Direction::kHostToDevice : Direction::kDeviceToHost;
    if (e.wait_event_id != wire::kNoEvent) {
      auto it = s.events.find(e.wait_event_id);
      if (it == s.events.end()) return Reject(s, e.user_tag, NotFound("no event " + std::to_string(e.wait_event_id)));
      plan.wait = it->second.get();
    }
    if (e.signal_event_id != wire::kNoEvent) {
      auto it = s.events.find(e.signal_event_id);
      if (it == s.events.end()) return Reject(s, e.user_tag, NotFound("no event " + std::to_string(e.signal_event_id)));
      plan.signal = it->second.get();
    }
    PlanPieces(e, rit->second.region->base(), static_cast<wire::Priority>(e.priority), plan);
    const uint64_t start = MonotonicNanos();
    auto fence = backend_->Submit(plan);
    if (!fence.ok()) {
      counters_.copies_failed++;
      return Complete(s, e.user_tag, fence.status(), wire::CompletionKind::kCompleted, 0, 0);
    }
    buf->in_flight++;
    rit->second.in_flight++;
    s.in_flight++;
    counters_.in_flight++;
    fences_[*fence] = InFlight{s.id, e.user_tag, e.length, start, buffer_offset, e.region_id, plan.direction};
    if (plan.signal != nullptr) Complete(s, e.user_tag, Status::Ok(), wire::CompletionKind::kEnqueued, e.length, 0);
  }

  // Splits a copy at chunk_size, and at slab boundaries when the backend registered the pool
  // slab by slab. A session's buffer sits in consecutive slabs of one mapping, so otherwise a
  // piece may cross them. Latency-class copies go to stream 0, bulk ones round-robin
  // over the other streams.
  void PlanPieces(const wire::SubmissionEntry& e, std::byte* device_base, wire::Priority prio, CopyPlan& plan) {
    const uint64_t slab = pool_->slab_bytes();
    const bool per_slab = backend_->pieces_stay_in_one_slab();
    const uint32_t nstreams = backend_->streams_per_direction();
    uint64_t host_off = e.pool_offset;
    uint64_t dev_off = e.device_offset;
    uint64_t left = e.length;
    while (left > 0) {
      uint64_t n = std::min(left, config_.chunk_bytes);
      if (per_slab) n = std::min(n, slab - host_off % slab);
      uint32_t stream = 0;
      if (prio == wire::Priority::kBulk && nstreams > 1) stream = 1 + (bulk_cursor_++ % (nstreams - 1));
      plan.pieces.push_back(CopyPiece{stream, pool_->base() + host_off, device_base + dev_off, n});
      host_off += n;
      dev_off += n;
      left -= n;
    }
  }

  bool PollBackend() {
    done_.clear();
    backend_->PollCompleted(done_);
    const uint64_t now = MonotonicNanos();
    for (const FenceResult& r : done_) {
      auto it = fences_.find(r.fence);
      if (it == fences_.end()) continue;
      const InFlight f = it->second;
      fences_.erase(it);
      counters_.in_flight--;
      if (r.status.ok()) {
        counters_.copies_completed++;
        (f.direction == Direction::kHostToDevice ? counters_.bytes_h2d : counters_.bytes_d2h) += f.bytes;
      } else {
        counters_.copies_failed++;
      }
      auto sit = sessions_.find(f.session_id);
      if (sit == sessions_.end()) continue;
      Session& s = *sit->second;
      s.in_flight--;
      s.arena->CopyDone(f.buffer_offset);
      auto rit = s.regions.find(f.region_id);
      if (rit != s.regions.end() && --rit->second.in_flight == 0 && rit->second.unregistering) s.regions.erase(rit);
      if (!s.dead) Complete(s, f.user_tag, r.status, wire::CompletionKind::kCompleted, f.bytes, now - f.start_ns);
    }
    return !done_.empty();
  }

  void FlushAll() {
    for (auto& [id, sp] : sessions_) {
      Session& s = *sp;
      if (s.dead || s.backlog.empty()) continue;
      const uint32_t head = s.hdr->cq_head.value.load(std::memory_order_acquire);
      const uint32_t used = s.cq_tail - head;
      if (used > s.cq_entries) {
        counters_.rejected++;
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
    s.backlog.clear();
  }

  void ReapDead() {
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      Session& s = *it->second;
      if (s.dead && s.in_flight == 0) {
        if (s.hello_done) {
          counters_.sessions--;
          FERRY_LOG(kInfo) << "session " << s.id << " '" << s.name << "' reclaimed: " << s.regions.size()
                           << " device regions closed, " << s.events.size() << " events closed, "
                           << (s.arena ? s.arena->owned_bytes() >> 20 : 0) << " MiB back in the pool";
        }
        it = sessions_.erase(it);  // closes regions and events, returns and zeroes slabs
        counters_.pool_free_bytes = pool_->free_bytes();
      } else {
        ++it;
      }
    }
  }

  void Shutdown() {
    FERRY_LOG(kInfo) << "stopping: " << sessions_.size() << " sessions, " << fences_.size() << " copies in flight";
    Unwatch(listen_.get());
    listen_.reset();
    ::unlink(socket_path_.c_str());
    for (auto& [id, s] : sessions_) Evict(*s, "ferryd is stopping", kInfoLevel);
    const uint64_t deadline = MonotonicNanos() + 10'000'000'000ull;
    while (!fences_.empty() && MonotonicNanos() < deadline) {
      if (backend_->completion_fd() >= 0) WaitReadable(backend_->completion_fd(), 10).ok();
      PollBackend();
    }
    ReapDead();
    sessions_.clear();
  }

  std::string socket_path_;
  UniqueFd listen_, stop_efd_, epoll_;
  bool stopping_ = false;
  uint32_t turns_since_epoll_ = 0;
  bool has_allowed_gid_ = false;
  gid_t allowed_gid_ = 0;
  uint64_t quota_ = 0;
  uint64_t next_session_id_ = 1;
  uint64_t bulk_cursor_ = 0;
  std::map<uint64_t, std::unique_ptr<Session>> sessions_;
  std::unordered_map<FenceId, InFlight> fences_;
  std::vector<FenceResult> done_;
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

Result<std::unique_ptr<Server>> Server::Create(const DaemonConfig& config, std::unique_ptr<Backend> backend) {
  FERRY_RETURN_IF_ERROR(ValidateConfig(config));
  auto impl = std::make_unique<Impl>(config, std::move(backend));
  FERRY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Status Server::Run() { return impl_->Run(); }
void Server::Stop() { impl_->Stop(); }
const DaemonConfig& Server::config() const { return impl_->config_; }
const ServerCounters& Server::counters() const { return impl_->counters_; }
Backend& Server::backend() { return *impl_->backend_; }
uint64_t Server::pool_bytes() const { return impl_->pool_->size(); }

}  // namespace ferry::daemon
