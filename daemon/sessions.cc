#include "daemon/sessions.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "common/log.hpp"
#include "daemon/fd_usage.hpp"

namespace ferry::daemon {
namespace {

constexpr uint64_t kRejectLogIntervalNs = 1'000'000'000;  // refused connections: at most one log line a second

}  // namespace

Sessions::Sessions(const DaemonConfig& config, std::optional<gid_t> allowed_gid, Services services)
    : config_(config),
      allowed_gid_(allowed_gid),
      svc_(services),
      quota_(config.session_quota_bytes == 0 ? config.pool_bytes : config.session_quota_bytes) {}

uint64_t Sessions::Admit(UniqueFd sock, const PeerCredentials& peer) {
  // Connections that have not said hello cost an fd and a session each, so they are capped
  // in all and per uid; the one over a cap is closed at once (the client sees the
  // connection closed before hello).
  uint32_t pending = 0, pending_of_uid = 0;
  for (auto& [id, sp] : svc_.map) {
    if (sp->hello_done || sp->dead) continue;
    ++pending;
    if (sp->peer.uid == peer.uid) ++pending_of_uid;
  }
  const Limits& lim = config_.limits;
  if (pending >= lim.pending_connections || pending_of_uid >= lim.pending_connections_per_uid) {
    svc_.rejections.Count(RejectReason::kExhausted);
    LogRefusedConnection(peer, pending >= lim.pending_connections
                                   ? std::to_string(pending) + " connections have not said hello yet "
                                                               "(limits.pending_connections)"
                                   : "uid " + std::to_string(peer.uid) + " has " + std::to_string(pending_of_uid) +
                                         " connections that have not said hello yet "
                                         "(limits.pending_connections_per_uid)");
    return 0;  // closes it
  }
  auto s = std::make_unique<Session>();
  s->id = next_session_id_++;
  s->peer = peer;
  s->sock = std::move(sock);
  s->peer_pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, s->peer.pid, 0)));
  s->accepted_ns = MonotonicNanos();
  if (!svc_.poller.Watch(s->sock.get(), SessionTag(s->id, kSocketKind)).ok()) return 0;
  const uint64_t deadline = s->accepted_ns + HelloTimeoutNs();
  svc_.map.emplace(s->id, std::move(s));
  return deadline;
}

void Sessions::LogRefusedConnection(const PeerCredentials& peer, const std::string& why) {
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

uint64_t Sessions::EnforceHelloDeadlines(uint64_t now) {
  uint64_t next = UINT64_MAX;
  for (auto& [id, sp] : svc_.map) {
    Session& s = *sp;
    if (s.hello_done || s.dead) continue;
    const uint64_t deadline = s.accepted_ns + HelloTimeoutNs();
    if (now >= deadline) {
      svc_.rejections.Count(RejectReason::kProtocol);
      Evict(s, "did not say hello within " + std::to_string(config_.limits.hello_timeout_ms) +
                   " ms (limits.hello_timeout_ms)");
    } else {
      next = std::min(next, deadline);
    }
  }
  return next;
}

void Sessions::OnSocketEvent(Session& s, uint32_t epoll_events) {
  if (epoll_events & (EPOLLHUP | EPOLLERR)) return End(s, "client disconnected");
  if (epoll_events & EPOLLOUT) FlushOutbound(s);
  if ((epoll_events & EPOLLIN) && !s.dead) HandleControl(s);
}

void Sessions::Reclassify() {
  for (auto& [id, sp] : svc_.map) {
    sp->klass = svc_.policy->ClassFor(sp->name, sp->peer.uid);
    svc_.scheduler.SetWeight(id, sp->klass.weight);
  }
}

bool Sessions::Authorized(const Session& s) const {
  if (s.peer.uid == 0 || s.peer.uid == ::geteuid()) return true;
  if (!allowed_gid_) return false;
  if (s.peer.gid == *allowed_gid_) return true;
  gid_t groups[256];
  socklen_t len = sizeof groups;
  if (::getsockopt(s.sock.get(), SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0) {
    for (size_t i = 0; i < len / sizeof(gid_t); ++i) {
      if (groups[i] == *allowed_gid_) return true;
    }
  }
  return false;
}

void Sessions::ReplyFrame(Session& s, wire::MsgType type, uint32_t seq, const void* payload, size_t size,
                          const int* fds, size_t nfds) {
  if (s.dead) return;
  std::vector<std::byte> frame = FrameMessage(type, seq, payload, size);
  if (s.outbound.empty()) {
    auto sent = TrySendFramed(s.sock.get(), frame, fds, nfds);
    if (!sent.ok()) return ReplyNotSent(s, sent.status());
    if (*sent) return;
  }
  if (s.outbound.size() >= config_.limits.outbound_messages) {
    return Evict(s, "does not read its replies: " + std::to_string(s.outbound.size()) +
                        " already queued (limits.outbound_messages)");
  }
  OutboundMessage m{std::move(frame), {}};
  for (size_t i = 0; i < nfds; ++i) {
    UniqueFd copy(::fcntl(fds[i], F_DUPFD_CLOEXEC, 0));
    if (!copy.valid()) {
      return Evict(s, "cannot queue a reply: " + ErrnoStatus("dup", errno).ToString() + " (" + FdUsage() + ")");
    }
    m.fds.push_back(std::move(copy));
  }
  s.outbound.push_back(std::move(m));
  svc_.counters.outbound_queued++;
  if (!s.watching_writable) {
    Status st = svc_.poller.Modify(s.sock.get(), SessionTag(s.id, kSocketKind), EPOLLIN | EPOLLOUT);
    if (!st.ok()) return Evict(s, "cannot wait for its socket: " + st.ToString());
    s.watching_writable = true;
  }
}

// Sends queued replies, in order, while the client's socket takes them.
void Sessions::FlushOutbound(Session& s) {
  while (!s.outbound.empty() && !s.dead) {
    OutboundMessage& m = s.outbound.front();
    std::vector<int> fds;
    for (const UniqueFd& f : m.fds) fds.push_back(f.get());
    auto sent = TrySendFramed(s.sock.get(), m.frame, fds.data(), fds.size());
    if (!sent.ok()) return ReplyNotSent(s, sent.status());
    if (!*sent) return;  // still full: EPOLLOUT again later
    s.outbound.pop_front();
    svc_.counters.outbound_queued--;
  }
  if (s.outbound.empty() && s.watching_writable && !s.dead) {
    Status st = svc_.poller.Modify(s.sock.get(), SessionTag(s.id, kSocketKind), EPOLLIN);
    if (!st.ok()) return Evict(s, "cannot watch its socket: " + st.ToString());
    s.watching_writable = false;
  }
}

void Sessions::ReplyNotSent(Session& s, const Status& why) {
  if (why.code() == Code::kUnavailable) return End(s, "client disconnected (" + why.message() + ")");
  Evict(s, "reply failed: " + why.ToString());
}

void Sessions::ReplySimple(Session& s, uint32_t seq, const Status& st) {
  wire::SimpleReply r{};
  r.status = ToWire(st);
  Reply(s, wire::MsgType::kSimpleReply, seq, r);
}

void Sessions::HandleControl(Session& s) {
  // A few messages per turn, so one chatty client cannot starve the data plane.
  for (int i = 0; i < 8 && !s.dead; ++i) {
    auto msg = RecvMessage(s.sock.get(), 0);
    if (!msg.ok()) {
      if (msg.status().code() == Code::kTimeout) return;  // nothing more to read
      if (msg.status().code() == Code::kUnavailable) {
        End(s, "client disconnected");
      } else {
        svc_.rejections.Count(msg.status());
        Evict(s, "bad control message: " + msg.status().ToString());
      }
      return;
    }
    Dispatch(s, *msg);
  }
}

void Sessions::Dispatch(Session& s, ReceivedMessage& msg) {
  const uint32_t seq = msg.header.seq;
  if (!s.hello_done && msg.type() != wire::MsgType::kHello) return Evict(s, "first message was not hello");
  switch (msg.type()) {
    case wire::MsgType::kHello: return HandleHello(s, seq, msg.header.version, msg.As<wire::HelloRequest>());
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
    case wire::MsgType::kUseGpu: return HandleUseGpu(s, seq, msg.As<wire::UseGpuRequest>());
    case wire::MsgType::kGpuStats: return HandleGpuStats(s, seq, msg.As<wire::GpuStatsRequest>());
    case wire::MsgType::kApplyPolicy: {
      UniqueFd fd = msg.fds.empty() ? UniqueFd() : std::move(msg.fds[0]);
      return HandleApplyPolicy(s, seq, msg.As<wire::ApplyPolicyRequest>(), std::move(fd));
    }
    case wire::MsgType::kGetPolicy: return HandleGetPolicy(s, seq, msg.As<wire::GetPolicyRequest>());
    default:
      svc_.rejections.Count(RejectReason::kProtocol);
      Evict(s, "unexpected control message type " + std::to_string(msg.header.type));
  }
}

void Sessions::HandleHello(Session& s, uint32_t seq, uint16_t version, const wire::HelloRequest& req) {
  wire::HelloReply r{};
  // Refused and evicted (a hello that breaks the protocol, or one ferryd cannot serve), or turned
  // away: a client over a limit or not allowed here broke no rule, so it is no eviction.
  auto answer_and_close = [&](const Status& st, Closing how) {
    r.status = ToWire(st);
    Reply(s, wire::MsgType::kHelloReply, seq, r);
    svc_.rejections.Count(st);
    Close(s, "hello refused: " + st.ToString(), how);
  };
  auto refuse = [&](const Status& st) { answer_and_close(st, Closing::kEvicted); };
  auto turn_away = [&](const Status& st) { answer_and_close(st, Closing::kTurnedAway); };
  if (s.hello_done) return refuse(ProtocolError("hello sent twice"));
  // First: a client of another version may mean another layout for everything after its hello.
  if (version != wire::kVersion || req.client_version != wire::kVersion) {
    return refuse(ProtocolError("ferryd speaks protocol " + std::to_string(wire::kVersion) + ", this client speaks protocol " +
                                std::to_string(version != wire::kVersion ? version : req.client_version) +
                                "; use a libferry from the same ferry release as the running ferryd"));
  }
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
  if (!Authorized(s)) {
    return turn_away(PermissionDenied("uid " + std::to_string(s.peer.uid) + " is not allowed to use this ferryd" +
                                      (allowed_gid_ ? " (not in group " + config_.allowed_group + ")" : "")));
  }
  if (svc_.counters.sessions >= config_.max_sessions) {
    return turn_away(ResourceExhausted("ferryd already serves " + std::to_string(config_.max_sessions) + " clients"));
  }
  const uint32_t of_uid = static_cast<uint32_t>(std::count_if(svc_.map.begin(), svc_.map.end(), [&](const auto& e) {
    return e.second->hello_done && !e.second->dead && e.second->peer.uid == s.peer.uid;
  }));
  if (of_uid >= config_.limits.sessions_per_uid) {
    return turn_away(ResourceExhausted("uid " + std::to_string(s.peer.uid) + " already has " + std::to_string(of_uid) +
                                       " sessions; limits.sessions_per_uid is " +
                                       std::to_string(config_.limits.sessions_per_uid) +
                                       " (end one of them, or raise the limit in ferryd's config)"));
  }
  // A ring or doorbell ferryd cannot make (out of fds or memory) is ferryd's want, not the
  // client's fault: turned away, no eviction.
  if (Status ring = svc_.rings.Attach(s, config_.ring_entries); !ring.ok()) return turn_away(ring);
  // The flag area goes to the engines now where they wait on event flags or write done words
  // (microseconds a hello); where it cannot, "after" is handed off on the host and latency copies
  // complete through the completion ring alone.
  if (svc_.backend.waits_on_flags() || svc_.backend.writes_done_words()) {
    if (Status st = svc_.backend.RegisterFlags(reinterpret_cast<std::byte*>(s.flags), wire::kFlagAreaBytes); st.ok()) {
      s.flags_registered = true;
      if (svc_.backend.writes_done_words()) s.done_words = wire::DoneWords(s.ring.data(), s.sq_entries, s.cq_entries);
    } else {
      FERRY_LOG(kWarning) << "session " << s.id << " '" << s.name << "': its flag area cannot be registered with the "
                          << "engines (" << st.ToString() << "); its copies after an event are handed off on the host "
                          << "and its latency copies complete through the ring only";
    }
  }
  s.arena = std::make_unique<SessionArena>(svc_.pool, s.id, quota_, s.peer.uid, config_.limits.pool_bytes_per_uid,
                                           svc_.gpu_pool_part[s.gpu]);
  s.klass = svc_.policy->ClassFor(s.name, s.peer.uid);
  if (Status watched = svc_.poller.Watch(s.submit_efd.get(), SessionTag(s.id, kDoorbellKind)); !watched.ok()) {
    return turn_away(watched);
  }
  s.hello_done = true;
  s.sq_seen_empty_ns = MonotonicNanos();
  svc_.scheduler.AddSession(s.id, s.klass.weight);
  svc_.counters.sessions++;
  svc_.counters.gpu[s.gpu].sessions++;
  svc_.counters.sessions_total++;
  r.status = ToWire(Status::Ok());
  r.session_id = s.id;
  r.backend = static_cast<uint32_t>(svc_.backend.kind());
  r.device_ordinal = svc_.backend.device_ordinal();
  r.sq_entries = s.sq_entries;
  r.cq_entries = s.cq_entries;
  r.ring_bytes = wire::RingSegmentBytes(s.sq_entries, s.cq_entries);
  r.pool_bytes = svc_.pool.size();
  r.slab_bytes = svc_.pool.slab_bytes();
  r.session_quota_bytes = quota_;
  int fds[3] = {s.ring_fd.get(), s.submit_efd.get(), s.complete_efd.get()};
  FERRY_LOG(kInfo) << "session " << s.id << " '" << s.name << "' from pid " << s.peer.pid << " uid " << s.peer.uid
                   << ", class " << s.klass.name;
  Reply(s, wire::MsgType::kHelloReply, seq, r, fds, 3);
}

void Sessions::Close(Session& s, const std::string& reason, Closing how) {
  if (s.dead) return;
  s.dead = true;
  const std::string who =
      "session " + std::to_string(s.id) + " '" + s.name + "' (pid " + std::to_string(s.peer.pid) + ")";
  switch (how) {
    case Closing::kEvicted:
      svc_.counters.evictions++;
      FERRY_LOG(kWarning) << who << " evicted: " << reason;
      break;
    case Closing::kTurnedAway:
      FERRY_LOG(kWarning) << who << " turned away: " << reason;
      break;
    case Closing::kEnded:
      FERRY_LOG(kInfo) << who << " ended: " << reason;
      break;
  }
  svc_.poller.Unwatch(s.sock.get());
  svc_.poller.Unwatch(s.submit_efd.get());
  s.sock.reset();
  svc_.counters.outbound_queued -= s.outbound.size();
  s.outbound.clear();
  s.backlog.clear();
  // Its queued and held copies never go out; the ones on the engines finish first (they use its
  // memory), and those waiting on its flags are let go.
  svc_.scheduler.CancelSession(s.id);
  Rings::ReleaseFlagWaits(s, svc_.backend);
}

}  // namespace ferry::daemon
