#include "daemon/rings.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "common/channel.hpp"
#include "common/log.hpp"
#include "common/status_macros.hpp"

namespace ferry::daemon {
namespace {

// The client is told its log has the reason, so refusals are logged as warnings: the first
// kRejectsLogged of a session, then (a hostile client must not flood the log) one line a
// minute saying how many more there were, and the last one.
constexpr uint32_t kRejectsLogged = 10;
constexpr uint64_t kRejectSummaryNs = 60'000'000'000ull;

}  // namespace

Status Rings::Attach(Session& s, uint32_t ring_entries) {
  s.sq_entries = ring_entries;
  s.cq_entries = ring_entries * 2;
  const size_t bytes = wire::RingSegmentBytes(s.sq_entries, s.cq_entries);
  FERRY_ASSIGN_OR_RETURN(UniqueFd ring_fd, CreateSealedMemfd("ferry-ring-" + std::to_string(s.id), bytes));
  FERRY_ASSIGN_OR_RETURN(Mapping ring, MapShared(ring_fd.get(), bytes));
  auto sub = CreateEventFd();
  auto comp = CreateEventFd();
  if (!sub.ok() || !comp.ok()) return ResourceExhausted("cannot create doorbells");
  s.ring_fd = std::move(ring_fd);
  s.ring = std::move(ring);
  s.submit_efd = std::move(*sub);
  s.complete_efd = std::move(*comp);
  s.hdr = std::construct_at(reinterpret_cast<wire::RingHeader*>(s.ring.data()));
  s.hdr->magic = wire::kRingMagic;
  s.hdr->version = wire::kVersion;
  s.hdr->sq_entries = s.sq_entries;
  s.hdr->cq_entries = s.cq_entries;
  s.sq = wire::SubmissionEntries(s.ring.data());
  s.cq = wire::CompletionEntries(s.ring.data(), s.sq_entries);
  PublishStaging(s);
  return Status::Ok();
}

void Rings::PublishStaging(Session& s) {
  wire::StagingSettings& st = s.hdr->staging;
  st.generation.store(++s.staging_generation, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  st.chunk_bytes.store(policy_->staging_chunk_bytes, std::memory_order_relaxed);
  st.threads.store(policy_->staging_threads, std::memory_order_relaxed);
  st.buffers.store(policy_->staging_buffers, std::memory_order_relaxed);
  st.generation.store(++s.staging_generation, std::memory_order_release);
}

void Rings::PublishStagingToAll() {
  for (auto& [id, s] : sessions_) {
    if (s->hdr != nullptr && !s->dead) PublishStaging(*s);
  }
}

void Rings::SetSleeping(bool sleeping) {
  for (auto& [id, s] : sessions_) {
    if (s->hdr == nullptr || s->dead) continue;
    s->hdr->daemon_state.value.store(sleeping ? wire::kDaemonSleeping : 0, std::memory_order_relaxed);
  }
}

bool Rings::AnySubmissionPending() const {
  for (const auto& [id, s] : sessions_) {
    if (s->hdr == nullptr || s->dead) continue;
    if (s->hdr->sq_tail.value.load(std::memory_order_acquire) != s->sq_head) return true;
  }
  return false;
}

Result<bool> Rings::ReadSubmissions(Session& s, Scheduler& scheduler) {
  const uint64_t scan_ns = MonotonicNanos();
  const uint32_t tail = s.hdr->sq_tail.value.load(std::memory_order_acquire);
  const uint32_t avail = wire::RingCount(s.sq_head, tail);
  if (avail == 0) {
    s.sq_seen_empty_ns = scan_ns;
    return false;
  }
  if (!wire::RingIndexPlausible(s.sq_head, tail, s.sq_entries)) {
    rejections_.Count(RejectReason::kProtocol);
    return ProtocolError("submission ring tail out of range");
  }
  // Back-pressure: at most half the completion ring in flight, so completions always fit.
  const uint32_t room = s.cq_entries / 2 > s.in_flight ? s.cq_entries / 2 - s.in_flight : 0;
  const uint32_t take = std::min({avail, room, kSubmissionsPerTurn});
  for (uint32_t i = 0; i < take && !s.dead; ++i) {
    wire::SubmissionEntry e;
    // Read the entry once, into our memory; the client may rewrite the slot at any time.
    std::memcpy(&e, &s.sq[wire::RingSlot(s.sq_head, s.sq_entries)], sizeof e);
    ++s.sq_head;
    HandleSubmission(s, e, scheduler);
  }
  if (!s.dead) s.hdr->sq_head.value.store(s.sq_head, std::memory_order_release);
  if (s.sq_head == tail) s.sq_seen_empty_ns = scan_ns;
  return take > 0;
}

void Rings::Complete(Session& s, uint64_t tag, const Status& st, wire::CompletionKind kind, uint64_t bytes,
                     uint64_t ns) {
  wire::CompletionEntry c{};
  c.user_tag = tag;
  c.status = static_cast<int32_t>(st.code());
  c.kind = static_cast<uint16_t>(kind);
  c.bytes = bytes;
  c.duration_ns = ns;
  s.backlog.push_back(c);
}

void Rings::Reject(Session& s, uint64_t tag, const Status& st) {
  rejections_.Count(st);
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

void Rings::RememberForReports(Session& s, uint64_t copy_id, uint64_t user_tag, uint64_t accepted_ns,
                               Direction direction) {
  while (s.reportable_order.size() >= Session::kMaxReportableCopies) {
    const auto [tag, id] = s.reportable_order.front();
    s.reportable_order.pop_front();
    if (auto it = s.reportable.find(tag); it != s.reportable.end() && it->second.copy_id == id) s.reportable.erase(it);
  }
  // A tag used again names the newer copy from now on.
  s.reportable[user_tag] = {copy_id, s.sq_seen_empty_ns, accepted_ns, 0, direction, false};
  s.reportable_order.emplace_back(user_tag, copy_id);
}

// Exposed copy time is the one figure ferryd cannot measure: the client says how long it was
// blocked on a copy. Believed only for a real copy of this session, once, and no longer than
// ferryd's clock allows: the time since the copy's entry can first have been on the ring.
void Rings::HandleWaitReport(Session& s, const wire::SubmissionEntry& e) {
  auto refuse = [&](const std::string& why) {
    counters_.wait_reports_refused++;
    rejections_.Count(RejectReason::kWaitReport);
    FERRY_LOG(kDebug) << "session " << s.id << ": refused a wait report for copy " << e.user_tag << ": " << why;
  };
  if (e.priority != 0 || e.flags != 0 || e.pool_offset != 0 || e.device_offset != 0 || e.region_id != 0 ||
      e.wait_event_id != 0 || e.signal_event_id != 0 || e.wait_value != 0) {
    return refuse("a wait report carries only a tag and a length; its other fields must be 0");
  }
  auto it = s.reportable.find(e.user_tag);
  if (it == s.reportable.end()) return refuse("no recent copy of this session has that tag");
  ReportableCopy& c = it->second;
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

void Rings::HandleSubmission(Session& s, const wire::SubmissionEntry& e, Scheduler& scheduler) {
  const auto op = static_cast<wire::Opcode>(e.opcode);
  if (op == wire::Opcode::kNop) return Complete(s, e.user_tag, Status::Ok(), wire::CompletionKind::kCompleted, 0, 0);
  if (op == wire::Opcode::kReportWait) return HandleWaitReport(s, e);
  if (op != wire::Opcode::kHostToDevice && op != wire::Opcode::kDeviceToHost) {
    return Reject(s, e.user_tag, InvalidArgument("unknown opcode " + std::to_string(e.opcode)));
  }
  if (e.flags != 0) return Reject(s, e.user_tag, InvalidArgument("reserved fields must be 0"));
  if (e.wait_value != 0 && e.wait_event_id == wire::kNoEvent) {
    return Reject(s, e.user_tag, InvalidArgument("a wait value without an event to wait for"));
  }
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
  CopyRequest r;
  r.direction = op == wire::Opcode::kHostToDevice ? Direction::kHostToDevice : Direction::kDeviceToHost;
  if (e.wait_event_id != wire::kNoEvent) {
    auto it = s.events.find(e.wait_event_id);
    if (it == s.events.end()) return Reject(s, e.user_tag, NotFound("no event " + std::to_string(e.wait_event_id)));
    r.wait = it->second.get();
  }
  if (e.signal_event_id != wire::kNoEvent) {
    auto it = s.events.find(e.signal_event_id);
    if (it == s.events.end()) return Reject(s, e.user_tag, NotFound("no event " + std::to_string(e.signal_event_id)));
    r.signal = it->second.get();
  }
  r.id = next_copy_id_++;
  r.session_id = s.id;
  r.user_tag = e.user_tag;
  r.bytes = e.length;
  r.accepted_ns = MonotonicNanos();
  r.pool_offset = e.pool_offset;
  r.buffer_offset = buffer_offset;
  r.region_id = e.region_id;
  r.device = rit->second.region->base() + e.device_offset;
  r.latency_requested = e.priority == static_cast<uint16_t>(wire::Priority::kLatency) && s.klass.latency_allowed;
  // Ordered after nothing, a latency copy reaches the engines now, behind this session's earlier
  // ones on its stream, so its tag in the done word means it is done (see wire::kDoneWords).
  if (r.latency_requested && r.wait == nullptr && s.done_words != nullptr) {
    const size_t slot = e.user_tag % wire::kDoneWords;
    r.done_word = &s.done_words[slot];
    r.done_word_device = s.flag_area->DeviceAddress(r.done_word);
    r.done_value = static_cast<uint32_t>(e.user_tag);
  }
  RememberForReports(s, r.id, r.user_tag, r.accepted_ns, r.direction);
  // Held until the copy finishes (OnCopyFinished): the engines use the buffer and the region.
  buf->in_flight++;
  rit->second.in_flight++;
  s.in_flight++;
  scheduler.Submit(r);
}

void Rings::OnCopyEnqueued(uint64_t session_id, uint64_t user_tag, uint64_t bytes) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  Complete(*it->second, user_tag, Status::Ok(), wire::CompletionKind::kEnqueued, bytes, 0);
}

// A copy is done: its buffer and region are free of it, its session told, the observer too.
void Rings::OnCopyFinished(const FinishedCopy& c) {
  auto sit = sessions_.find(c.session_id);
  if (sit == sessions_.end()) return;
  Session& s = *sit->second;
  s.in_flight--;
  s.arena->CopyDone(c.buffer_offset);
  auto rit = s.regions.find(c.region_id);
  if (rit != s.regions.end() && --rit->second.in_flight == 0 && rit->second.unregistering) s.regions.erase(rit);
  if (!s.dead) {
    Complete(s, c.user_tag, c.status, wire::CompletionKind::kCompleted, c.bytes, c.done_ns - c.accepted_ns);
  }
  if (auto rc = s.reportable.find(c.user_tag); rc != s.reportable.end() && rc->second.copy_id == c.id) {
    rc->second.done_ns = c.done_ns;
  }
  if (observer_ != nullptr) {
    CopyRecord r{c.direction,
                 c.latency,
                 s.klass.name,
                 c.policy,
                 c.bytes,
                 (c.first_dispatch_ns ? c.first_dispatch_ns - c.accepted_ns : 0) * 1e-9,
                 (c.done_ns - c.accepted_ns) * 1e-9,
                 c.status.ok()};
    observer_->OnCopyDone(r);
  }
}

Status Rings::PostCompletions(Session& s) {
  if (s.backlog.empty()) return Status::Ok();
  const uint32_t head = s.hdr->cq_head.value.load(std::memory_order_acquire);
  if (!wire::RingIndexPlausible(head, s.cq_tail, s.cq_entries)) {
    rejections_.Count(RejectReason::kProtocol);
    return ProtocolError("completion ring head out of range");
  }
  uint32_t space = s.cq_entries - wire::RingCount(head, s.cq_tail);
  bool wrote = false;
  while (space > 0 && !s.backlog.empty()) {
    s.cq[wire::RingSlot(s.cq_tail, s.cq_entries)] = s.backlog.front();
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
  if (s.backlog.size() > 4u * s.cq_entries) return ResourceExhausted("client does not reap its completions");
  return Status::Ok();
}

}  // namespace ferry::daemon
