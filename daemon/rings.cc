#include "daemon/rings.hpp"

#include <algorithm>
#include <atomic>
#include <bitset>
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
  s.flags = wire::EventFlags(s.ring.data(), s.sq_entries, s.cq_entries);
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
    if (s->submissions_blocked) continue;
    if (s->hdr->sq_tail.value.load(std::memory_order_acquire) != s->sq_head) return true;
  }
  return false;
}

Result<bool> Rings::ReadSubmissions(Session& s, Scheduler& scheduler, TurnBudget& turn) {
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
  // The budget counts requests: a block list's group of slots is one, read whole in one turn.
  uint32_t taken = 0, requests = 0;
  bool read_a_list = false;
  s.submissions_blocked = false;  // judged again each turn
  for (; taken < kSubmissionsPerTurn && s.sq_head != tail && !s.dead; ++taken) {
    if (taken >= room) {
      // Blocked only at the cap: wait reports and refused requests take room this turn but
      // leave nothing in flight, and the entries after them can be read next turn.
      s.submissions_blocked = s.in_flight >= s.cq_entries / 2;
      break;
    }
    wire::SubmissionEntry e;
    // Read the entry once, into our memory; the client may rewrite the slot at any time.
    std::memcpy(&e, &s.sq[wire::RingSlot(s.sq_head, s.sq_entries)], sizeof e);
    const auto op = static_cast<wire::Opcode>(e.opcode);
    if (op == wire::Opcode::kBlocksHostToDevice || op == wire::Opcode::kBlocksDeviceToHost) {
      FERRY_ASSIGN_OR_RETURN(const ListRead read, ReadBlockList(s, e, tail, turn.blocks, scheduler));
      if (read.outcome != ListRead::Outcome::kRead) {
        s.submissions_blocked = read.outcome == ListRead::Outcome::kBlocked;
        if (read.outcome == ListRead::Outcome::kNextTurn && !read_a_list && !turn.left_waiting) {
          turn.left_waiting = s.id;
        }
        break;
      }
      turn.blocks += read.blocks;
      read_a_list = true;
      ++requests;
      continue;
    }
    ++s.sq_head;
    if (op != wire::Opcode::kReportWait) ++requests;
    HandleSubmission(s, e, scheduler);
  }
  if (!s.dead && taken > 0) {
    s.hdr->sq_head.value.store(s.sq_head, std::memory_order_release);
    // Reading makes room, and a client may be asleep waiting for it.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (wire::TakeClientWaiting(s.hdr->client_state.value, wire::kClientWaitingForRoom)) {
      RingDoorbell(s.complete_efd.get());
    }
  }
  if (s.sq_head == tail) s.sq_seen_empty_ns = scan_ns;
  return requests > 0;  // wait reports alone are no activity: they must not teach the poll window
}

// A block list's group: its SubmissionEntry (at sq_head), a BlockListEntry, and with
// kBlockListInline the list's slots, published together. Read whole into our memory before any
// of it is judged; a group not wholly published, or whose end cannot be known, breaks the ring.
Result<Rings::ListRead> Rings::ReadBlockList(Session& s, const wire::SubmissionEntry& e, uint32_t tail,
                                             uint64_t turn_blocks, Scheduler& scheduler) {
  const uint32_t published = wire::RingCount(s.sq_head, tail);
  auto breach = [&](const std::string& why) {
    rejections_.Count(RejectReason::kProtocol);
    return ProtocolError("block list " + std::to_string(e.user_tag) + ": " + why);
  };
  if (published < 2) return breach("its BlockListEntry was not published with it");
  wire::BlockListEntry b;
  std::memcpy(&b, &s.sq[wire::RingSlot(s.sq_head + 1, s.sq_entries)], sizeof b);
  // Judged by the count it names (a wrong one is refused below, once it is read); a list alone
  // always goes.
  const uint32_t named = std::min(b.block_count, wire::kMaxBlocksPerList + 1);
  if (s.blocks_in_flight != 0 && s.blocks_in_flight + named > kBlocksInFlightPerSession) {
    return ListRead{ListRead::Outcome::kBlocked};
  }
  if (turn_blocks != 0 && turn_blocks + named > kBlocksPerTurn) return ListRead{ListRead::Outcome::kNextTurn};
  const uint32_t slots = (e.flags & wire::kBlockListInline) ? b.inline_slots : 0;
  if (slots > wire::kMaxInlineListSlots) {
    return breach("inline_slots " + std::to_string(slots) + " (at most " + std::to_string(wire::kMaxInlineListSlots) +
                  "): where the next request starts is unknown");
  }
  if (published < 2 + slots) {
    return breach("its group of " + std::to_string(2 + slots) + " slots was published in part (" +
                  std::to_string(published) + ")");
  }
  std::vector<std::byte> inline_list(size_t{slots} * sizeof(wire::SubmissionEntry));
  for (uint32_t i = 0; i < slots; ++i) {
    std::memcpy(inline_list.data() + size_t{i} * sizeof(wire::SubmissionEntry),
                &s.sq[wire::RingSlot(s.sq_head + 2 + i, s.sq_entries)], sizeof(wire::SubmissionEntry));
  }
  s.sq_head += 2 + slots;
  HandleBlockList(s, e, b, inline_list, scheduler);
  return ListRead{ListRead::Outcome::kRead, named};
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
  while (s.reportable_order.size() >= s.max_reportable_copies()) {
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
  if (e.length == 0) return Reject(s, e.user_tag, InvalidArgument("copy of 0 bytes"));
  CopyTarget t;
  if (Status st = CheckCopy(s, e, e.length, t); !st.ok()) return Reject(s, e.user_tag, st);
  t.request.bytes = e.length;
  Accept(s, t, scheduler);
}

// A block list, its group read into our memory: the entry's regions and events checked as a
// single copy's, the list (inline, or read once from a buffer of the session) checked and
// planned whole. Nothing of a list that fails any check moves.
void Rings::HandleBlockList(Session& s, const wire::SubmissionEntry& e, const wire::BlockListEntry& b,
                            std::span<const std::byte> inline_list, Scheduler& scheduler) {
  const bool inline_list_flag = e.flags & wire::kBlockListInline;
  if (e.flags & ~wire::kBlockListInline) {
    return Reject(s, e.user_tag, InvalidArgument("block list: unknown flags " + std::to_string(e.flags)));
  }
  if (e.length == 0) return Reject(s, e.user_tag, InvalidArgument("block list: the host region is empty"));
  if (Status st = CheckBlockListEntry(b, inline_list_flag); !st.ok()) return Reject(s, e.user_tag, st);
  CopyTarget t;
  if (Status st = CheckCopy(s, e, b.device_bytes, t); !st.ok()) return Reject(s, e.user_tag, st);
  std::span<const std::byte> list;
  std::vector<std::byte> pool_list;
  if (inline_list_flag) {
    list = inline_list.first(b.list_bytes);  // inline_slots, checked, hold list_bytes
  } else {
    uint64_t unused = 0;
    if (s.arena->Find(b.list_pool_offset, b.list_bytes, &unused) == nullptr) {
      return Reject(s, e.user_tag, InvalidArgument("block list: the list [" + std::to_string(b.list_pool_offset) +
                                                   ", +" + std::to_string(b.list_bytes) +
                                                   ") is not inside a buffer of this session"));
    }
    // Read once; the buffer is not held for the copy.
    pool_list.resize(b.list_bytes);
    std::memcpy(pool_list.data(), pool_.base + b.list_pool_offset, b.list_bytes);
    list = pool_list;
  }
  const BlockListRegions regions{t.request.direction == Direction::kHostToDevice, e.length, b.device_bytes};
  auto plan = PlanBlockList(b, list, regions);
  if (!plan.ok()) return Reject(s, e.user_tag, plan.status());
  t.request.bytes = plan->bytes;
  t.request.blocks = plan->blocks;
  t.request.block_pieces = std::move(plan->pieces);
  Accept(s, t, scheduler);
}

// The checks a single copy and a block list share: the priority, events, the host range
// [pool_offset, +host_bytes) and the device range [device_offset, +device_bytes).
Status Rings::CheckCopy(Session& s, const wire::SubmissionEntry& e, uint64_t device_bytes, CopyTarget& t) {
  if (e.wait_value != 0 && e.wait_event_id == wire::kNoEvent) {
    return InvalidArgument("a wait value without an event to wait for");
  }
  if (e.priority > static_cast<uint16_t>(wire::Priority::kLatency)) {
    return InvalidArgument("unknown priority " + std::to_string(e.priority));
  }
  t.buffer = s.arena->Find(e.pool_offset, e.length, &t.request.buffer_offset);
  if (t.buffer == nullptr) return InvalidArgument("host range is not inside a buffer of this session");
  auto rit = s.regions.find(e.region_id);
  if (rit == s.regions.end() || rit->second.unregistering) {
    return NotFound("no device region " + std::to_string(e.region_id));
  }
  t.region = &rit->second;
  const uint64_t rsize = t.region->region->size();
  if (e.device_offset > rsize || device_bytes > rsize - e.device_offset) {
    return InvalidArgument("device range is outside region " + std::to_string(e.region_id));
  }
  CopyRequest& r = t.request;
  const auto op = static_cast<wire::Opcode>(e.opcode);
  r.direction = op == wire::Opcode::kHostToDevice || op == wire::Opcode::kBlocksHostToDevice
                    ? Direction::kHostToDevice
                    : Direction::kDeviceToHost;
  if (e.wait_event_id != wire::kNoEvent) {
    auto it = s.events.find(e.wait_event_id);
    if (it == s.events.end()) return NotFound("no event " + std::to_string(e.wait_event_id));
    if (auto f = s.event_flags.find(e.wait_event_id); f != s.event_flags.end()) {
      t.wait_flag = &f->second;  // waited for on the GPU, on the session's lane
    } else {
      r.wait = it->second.get();  // held here until the event has happened
    }
  }
  if (e.signal_event_id != wire::kNoEvent) {
    auto it = s.events.find(e.signal_event_id);
    if (it == s.events.end()) return NotFound("no event " + std::to_string(e.signal_event_id));
    r.signal = it->second.get();
  }
  r.user_tag = e.user_tag;
  r.pool_offset = e.pool_offset;
  r.region_id = e.region_id;
  r.device = t.region->region->base() + e.device_offset;
  r.latency_requested = e.priority == static_cast<uint16_t>(wire::Priority::kLatency) && s.klass.latency_allowed;
  t.wait_value = e.wait_value;
  return Status::Ok();
}

void Rings::Accept(Session& s, CopyTarget& t, Scheduler& scheduler) {
  CopyRequest& r = t.request;
  r.id = next_copy_id_++;
  r.session_id = s.id;
  r.gpu = s.gpu;
  r.accepted_ns = MonotonicNanos();
  if (Session::EventFlag* f = t.wait_flag; f != nullptr) {
    r.wait_flag = s.flags + f->index;
    r.wait_value = t.wait_value;
    s.lane_waits.emplace(r.id, Session::LaneWait{f->index, t.wait_value});
  }
  // Ordered after nothing, a latency copy reaches the engines now, behind this session's earlier
  // ones on its stream, so its tag in the done word means it is done (see wire::kDoneWords).
  if (r.latency_requested && r.wait == nullptr && r.wait_flag == nullptr && s.done_words != nullptr) {
    r.done_word = &s.done_words[r.user_tag % wire::kDoneWords];
    r.done_value = static_cast<uint32_t>(r.user_tag);
  }
  RememberForReports(s, r.id, r.user_tag, r.accepted_ns, r.direction);
  // Held until the copy finishes (OnCopyFinished): the engines use the buffer and the region.
  t.buffer->in_flight++;
  t.region->in_flight++;
  s.in_flight++;
  s.blocks_in_flight += r.blocks;
  scheduler.Submit(std::move(r));
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
  s.blocks_in_flight -= c.blocks;
  s.submissions_blocked = false;  // room again: its ring is read on the next turn
  s.lane_waits.erase(c.id);
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
    CopyRecord r{c.gpu,
                 c.direction,
                 c.latency,
                 s.klass.name,
                 c.policy,
                 c.bytes,
                 c.blocks,
                 (c.first_dispatch_ns ? c.first_dispatch_ns - c.accepted_ns : 0) * 1e-9,
                 (c.done_ns - c.accepted_ns) * 1e-9,
                 c.status.ok()};
    observer_->OnCopyDone(r);
  }
}

// Whatever the client wrote (or never wrote) into its flags, the lanes' waits go: a session that
// ended with copies waiting must drain. Each flag gets the value of its oldest wait: the
// session's oldest wait heads its lane, so it goes, and once it is done the next pass lets the
// next one go (one value for all of a flag's waits could satisfy none of some). Written again on
// every reap pass until they have, as a client still running could write its flags back.
void Rings::ReleaseFlagWaits(Session& s, Backend& backend) {
  std::bitset<wire::kEventFlags> written;
  for (const auto& [copy_id, w] : s.lane_waits) {
    if (written.test(w.index)) continue;
    written.set(w.index);
    if (s.flag_place != Session::FlagPlace::kDevice) {
      std::atomic_ref<uint32_t>(s.flags[w.index]).store(w.value, std::memory_order_release);
      continue;
    }
    if (Status st = backend.WriteDeviceFlag(s.gpu, s.id, w.index, w.value); !st.ok() && !s.flag_release_failed) {
      s.flag_release_failed = true;
      FERRY_LOG(kWarning) << "session " << s.id << " '" << s.name << "' ended with copies waiting on its event flags, "
                          << "which cannot be let go: " << st.ToString();
    }
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
    if (wire::TakeClientWaiting(s.hdr->client_state.value, wire::kClientWaiting)) {
      RingDoorbell(s.complete_efd.get());
    }
  }
  if (s.backlog.size() > 4u * s.cq_entries) return ResourceExhausted("client does not reap its completions");
  return Status::Ok();
}

}  // namespace ferry::daemon
