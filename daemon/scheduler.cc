#include "daemon/scheduler.hpp"

#include <algorithm>

#include "common/fd.hpp"

namespace ferry::daemon {
namespace {

constexpr int kMaxDispatchRounds = 128;

}  // namespace

bool Scheduler::Copy::WholeAtOnce() const {
  return latency || OnLane() || signal != nullptr || policy->schedule == Schedule::kSerial;
}

size_t Scheduler::Copy::UnitEnd(size_t unit_index, size_t first_piece) const {
  return unit_ends.empty() ? first_piece + 1 : unit_ends[unit_index];
}

uint64_t Scheduler::Copy::NextDispatchBytes() const {
  const size_t end = WholeAtOnce() ? pieces.size() : UnitEnd(unit, next);
  uint64_t n = 0;
  for (size_t i = next; i < end; ++i) n += pieces[i].length;
  return n;
}

Scheduler::Scheduler(Backend& backend, PoolGeometry pool, const RunningPolicy& policy, ServerCounters& counters,
                     Listener& listener, uint32_t gpus)
    : backend_(backend),
      pool_(pool),
      policy_(policy),
      counters_(counters),
      listener_(listener),
      gpus_(std::clamp<uint32_t>(gpus, 1, kMaxGpus)) {}

void Scheduler::SetGpu(uint64_t session_id, uint32_t gpu) {
  if (SessionQueues* q = QueuesOf(session_id)) q->gpu = gpu;
}

void Scheduler::AddSession(uint64_t session_id, uint32_t weight) { sessions_[session_id].weight = weight; }

void Scheduler::SetWeight(uint64_t session_id, uint32_t weight) {
  if (SessionQueues* q = QueuesOf(session_id)) q->weight = weight;
}

void Scheduler::RemoveSession(uint64_t session_id) { sessions_.erase(session_id); }

Scheduler::SessionQueues* Scheduler::QueuesOf(uint64_t session_id) {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : &it->second;
}

void Scheduler::Submit(CopyRequest r) {
  auto c = std::make_unique<Copy>();
  c->id = r.id;
  c->session_id = r.session_id;
  c->user_tag = r.user_tag;
  c->gpu = r.gpu;
  c->bytes = r.bytes;
  c->accepted_ns = r.accepted_ns;
  c->buffer_offset = r.buffer_offset;
  c->region_id = r.region_id;
  c->direction = r.direction;
  c->wait = r.wait;
  c->signal = r.signal;
  c->wait_flag = r.wait_flag;
  c->wait_value = r.wait_value;
  c->policy = policy_.ForGpu(r.gpu);
  c->latency = r.latency_requested && r.bytes <= c->policy->latency_max_bytes && backend_.streams_per_direction() > 1;
  if (c->latency) {
    c->done_word = r.done_word;
    c->done_value = r.done_value;
  }
  c->blocks = r.blocks;
  if (r.blocks != 0) {
    PlanBlockList(*c, r.pool_offset, r.device, r.block_pieces);
  } else {
    PlanPieces(*c, r.pool_offset, r.device);
  }
  counters_.in_flight++;
  Copy& ref = *c;
  copies_.emplace(c->id, std::move(c));
  if (ref.wait != nullptr) {
    held_.push_back(ref.id);
    return;
  }
  Schedule(ref);
}

void Scheduler::Schedule(Copy& c) {
  if (c.latency || c.OnLane()) {
    DispatchNext(QueuesOf(c.session_id), c);  // the latency stream: never queued behind bulk work
    MaybeFinish(c);
  } else {
    SessionQueues* q = QueuesOf(c.session_id);
    if (q != nullptr) q->queue[static_cast<int>(c.direction)].push_back(c.id);
    counters_.queued_bytes += c.bytes;
  }
}

// Schedules the held copies whose "after" event has happened (see Backend::EventHappened).
bool Scheduler::ReleaseHeld() {
  bool any = false;
  for (size_t i = 0; i < held_.size();) {
    Copy& c = *copies_.at(held_[i]);
    auto happened = backend_.EventHappened(*c.wait);
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
      Schedule(c);
    }
  }
  return any;
}

// Cuts a copy as its policy says, and also at slab boundaries when the backend registered the
// pool slab by slab (a session's buffer sits in consecutive slabs of one mapping, so otherwise
// a piece may cross them). Latency copies are one piece: they are small by definition.
void Scheduler::PlanPieces(Copy& c, uint64_t pool_offset, std::byte* device) {
  const uint64_t slab = pool_.slab_bytes;
  const bool per_slab = backend_.pieces_stay_in_one_slab();
  lengths_.clear();
  if (c.latency) {
    lengths_.push_back(c.bytes);
  } else {
    c.policy->Pieces(c.bytes, lengths_);
  }
  uint64_t host_off = pool_offset;
  uint64_t dev_off = 0;
  for (uint64_t len : lengths_) {
    while (len > 0) {
      uint64_t n = per_slab ? std::min(len, slab - host_off % slab) : len;
      c.pieces.push_back(
          CopyPiece{0, pool_.base + host_off, device + dev_off, n, n <= c.policy->batch_threshold_bytes});
      host_off += n;
      dev_off += n;
      len -= n;
    }
  }
}

// A block list goes in units of what the policy would cut a copy of its bytes into (a latency
// list: one, on the latency stream). A unit of several pieces is one batch on one stream, so its
// pieces are all batchable; a unit of one piece is like a single copy's piece.
void Scheduler::PlanBlockList(Copy& c, uint64_t pool_offset, std::byte* device, std::vector<BlockPiece>& pieces) {
  if (backend_.pieces_stay_in_one_slab()) CutAtSlabs(pieces, pool_offset, pool_.slab_bytes);
  lengths_.clear();
  if (c.latency) {
    lengths_.push_back(c.bytes);
  } else {
    c.policy->Pieces(c.bytes, lengths_);
    // At least a unit per bulk stream, where the list has the blocks for it: each stream's engine
    // takes its unit's batch at once, and small blocks are bound by an engine's work per block,
    // not by the bus (64 KiB blocks went from 39.6 GB/s on one stream to 49.8 over four on the
    // H200, docs/measurements/h200-handoff-2026-12-05.txt, run C). Not for host-to-device pieces
    // under kHostWrittenCopyBytes: bound by the issuing thread, they stay one unit, which the
    // cuda backend issues in parts.
    const uint64_t streams = std::min(c.policy->bulk_streams, kMaxBulkStreams);
    const bool small_h2d = c.direction == Direction::kHostToDevice &&
                           c.bytes < kHostWrittenCopyBytes * static_cast<uint64_t>(pieces.size());
    if (lengths_.size() < streams && pieces.size() >= 2 * streams && !small_h2d) {
      lengths_.assign(streams, (c.bytes + streams - 1) / streams);
    }
  }
  SplitIntoUnits(pieces, lengths_, c.unit_ends);
  c.pieces.reserve(pieces.size());
  size_t begin = 0;
  for (size_t end : c.unit_ends) {
    const bool batch = end - begin > 1;
    for (size_t i = begin; i < end; ++i) {
      const BlockPiece& p = pieces[i];
      c.pieces.push_back(CopyPiece{0, pool_.base + pool_offset + p.host_offset, device + p.device_offset, p.length,
                                   batch || p.length <= c.policy->batch_threshold_bytes});
    }
    begin = end;
  }
}

// The stream for the next bulk piece of `c`: round robin over its policy's bulk streams, in
// the bank of its bulk priority.
uint32_t Scheduler::BulkStream(const Copy& c) {
  const uint32_t n = std::min(c.policy->bulk_streams, kMaxBulkStreams);
  const uint32_t bank = c.policy->bulk_priority == StreamPriority::kLeast ? 1 : 1 + kMaxBulkStreams;
  return bank + static_cast<uint32_t>(bulk_cursor_++ % n);
}

// A small single copy (a piece up to the policy's batch threshold) that continues the piece some
// bulk stream was sent last goes to that stream, while what has met there in a row stays within
// the policy's join size: a client's adjacent copies meet where the backend can join them, in
// runs of up to that size, one stream after another. Any other piece goes round robin, as block
// lists' units do, so scattered copies still spread over the engines.
uint32_t Scheduler::SingleCopyStream(int e, const Copy& c, const CopyPiece& piece) {
  const uint32_t n = std::min(c.policy->bulk_streams, kMaxBulkStreams);
  const uint32_t bank = c.policy->bulk_priority == StreamPriority::kLeast ? 1 : 1 + kMaxBulkStreams;
  if (piece.length <= c.policy->batch_threshold_bytes) {
    for (uint32_t s = bank; s < bank + n; ++s) {
      if (Continues(tails_[e][s], c, piece)) return s;
    }
  }
  return BulkStream(c);
}

// Whether `piece` of single copy `c` continues the run of pieces a stream was sent last
// (`tail`) within the policy's join size: the same session, the same device region, adjacent on
// both sides, and not across slabs pinned apart (where the backend registered the pool slab by
// slab, a piece that starts a slab is in another registration than the piece before it).
bool Scheduler::Continues(const StreamTail& tail, const Copy& c, const CopyPiece& piece) const {
  const bool starts_a_slab = backend_.pieces_stay_in_one_slab() && pool_.slab_bytes != 0 &&
                             static_cast<uint64_t>(piece.host - pool_.base) % pool_.slab_bytes == 0;
  return c.blocks == 0 && tail.session_id == c.session_id && tail.region_id == c.region_id &&
         tail.host_end == piece.host && tail.device_end == piece.device && !starts_a_slab &&
         tail.run_bytes + piece.length <= c.policy->join_bytes;
}

// Whether `piece`, going to its stream, continues the piece that stream was sent last. Records
// `piece` as the stream's tail (a block list's: none, its pieces never join).
bool Scheduler::JoinsStreamTail(int e, const Copy& c, const CopyPiece& piece) {
  StreamTail& tail = tails_[e][piece.stream % kStreamIndexes];
  const bool joins = Continues(tail, c, piece);
  if (c.blocks != 0) {
    tail = StreamTail{};
  } else {
    tail = StreamTail{c.session_id, c.region_id, piece.host + piece.length, piece.device + piece.length,
                      (joins ? tail.run_bytes : 0) + piece.length};
  }
  return joins;
}

// Hands the next piece of `c` (or all of it, when it goes whole) to the backend.
void Scheduler::DispatchNext(SessionQueues* q, Copy& c) {
  CopyPlan plan;
  plan.gpu = c.gpu;
  plan.direction = c.direction;
  plan.accepted_ns = c.accepted_ns;
  plan.policy = c.policy.get();
  const bool whole = c.WholeAtOnce();
  const size_t end = whole ? c.pieces.size() : c.UnitEnd(c.unit, c.next);
  uint64_t bytes = 0;
  uint32_t stream = 0;
  size_t unit_end = c.next;
  plan.pieces.reserve(end - c.next);
  for (size_t i = c.next; i < end; ++i) {
    // A whole bulk copy spreads over the streams too, unit by unit; a lane is one stream of its own.
    if (i == unit_end) {
      unit_end = c.UnitEnd(c.unit++, i);
      if (c.Bulk()) stream = c.blocks == 0 ? SingleCopyStream(c.EngineSet(), c, c.pieces[i]) : BulkStream(c);
    }
    CopyPiece p = c.pieces[i];
    p.stream = stream;
    if (c.Bulk()) p.joins_previous = JoinsStreamTail(c.EngineSet(), c, p);
    plan.pieces.push_back(p);
    bytes += p.length;
  }
  const bool last = end == c.pieces.size();
  if (last) {
    plan.signal = c.signal;
    plan.done_word = c.done_word;
    plan.done_value = c.done_value;
  }
  if (c.OnLane()) plan.wait = FlagWait{c.wait_flag, c.wait_value, c.session_id, c.latency};
  c.next = end;
  if (c.first_dispatch_ns == 0) c.first_dispatch_ns = MonotonicNanos();
  auto fence = backend_.Submit(plan);
  if (!fence.ok()) {
    if (c.status.ok()) c.status = fence.status();
    c.next = c.pieces.size();  // nothing more of it goes out
    return;
  }
  c.out++;
  fences_[*fence] = FenceRef{c.id, bytes, c.Bulk()};
  if (c.Bulk()) {
    if (q != nullptr) q->bulk_out_bytes[static_cast<int>(c.direction)] += bytes;
    bulk_out_bytes_[c.EngineSet()] += bytes;
  }
  counters_.in_flight_bytes += bytes;
  if (last && c.signal != nullptr) listener_.OnCopyEnqueued(c.session_id, c.user_tag, c.bytes);
}

// Deficit round robin over the sessions with queued bulk work, within the running policy's
// in-flight limits. A visit adds weight x quantum to the session's deficit; the session
// dispatches while its next piece fits in the deficit. A visit cut short by full engines stays
// open, so the session resumes first when they drain: shares follow the weights even when
// every completion frees room for one piece only.
bool Scheduler::Dispatch() {
  bool any = false;
  for (uint32_t e = 0; e < 2 * gpus_; ++e) any |= DispatchBulk(static_cast<int>(e));
  return any;
}

bool Scheduler::Blocked(int e, const Copy& c) const {
  const Policy& pol = *policy_.ForGpu(static_cast<uint32_t>(e / 2));
  return c.first_dispatch_ns == 0 && pol.max_copies_in_flight != 0 && copies_started_[e] >= pol.max_copies_in_flight;
}

// One engine set's bulk work: the sessions of its GPU, in its direction (sessions of other GPUs
// count as having nothing queued).
bool Scheduler::DispatchBulk(int e) {
  const Policy& pol = *policy_.ForGpu(static_cast<uint32_t>(e / 2));
  const uint64_t client_limit = pol.client_in_flight_bytes ? pol.client_in_flight_bytes : pol.in_flight_bytes;
  const int d = e % 2;
  const uint32_t gpu = static_cast<uint32_t>(e / 2);
  auto engines_full = [&] { return bulk_out_bytes_[e] >= pol.in_flight_bytes; };
  bool any = false;
  size_t idle_visits = 0;  // visits in a row that dispatched nothing
  while (!engines_full() && !sessions_.empty() && idle_visits <= 2 * sessions_.size() + kMaxDispatchRounds) {
    auto it = visit_open_[e] ? sessions_.lower_bound(rr_cursor_[e]) : sessions_.upper_bound(rr_cursor_[e]);
    if (it == sessions_.end()) it = sessions_.begin();
    if (visit_open_[e] && it->first != rr_cursor_[e]) visit_open_[e] = false;  // that session is gone
    rr_cursor_[e] = it->first;
    SessionQueues& s = it->second;
    if (s.gpu != gpu || s.queue[d].empty() || s.bulk_out_bytes[d] >= client_limit || Blocked(e, *copies_.at(s.queue[d].front()))) {
      visit_open_[e] = false;
      ++idle_visits;
      if (idle_visits > sessions_.size() && !AnyDispatchable(e, client_limit)) break;
      continue;
    }
    if (!visit_open_[e]) {
      s.deficit[d] = std::min<uint64_t>(s.deficit[d] + kQuantumBytes * s.weight, kMaxDeficitBytes);
      visit_open_[e] = true;
    }
    bool sent = false;
    while (!s.queue[d].empty() && !engines_full() && s.bulk_out_bytes[d] < client_limit) {
      Copy& c = *copies_.at(s.queue[d].front());
      if (Blocked(e, c)) break;
      const uint64_t need = c.NextDispatchBytes();
      if (need > s.deficit[d] && s.deficit[d] < kMaxDeficitBytes) break;
      s.deficit[d] -= std::min(need, s.deficit[d]);
      if (c.first_dispatch_ns == 0) copies_started_[e]++;
      DispatchNext(&s, c);
      sent = any = true;
      if (c.next == c.pieces.size()) {
        s.queue[d].pop_front();
        counters_.queued_bytes -= c.bytes;
        MaybeFinish(c);  // done already if its dispatch failed
      }
    }
    if (s.queue[d].empty()) s.deficit[d] = 0;
    if (engines_full() && !s.queue[d].empty()) return any;  // the visit stays open
    visit_open_[e] = false;
    idle_visits = sent ? 0 : idle_visits + 1;
  }
  return any;
}

bool Scheduler::AnyDispatchable(int e, uint64_t client_limit) const {
  const int d = e % 2;
  for (const auto& [id, s] : sessions_) {
    if (s.gpu == static_cast<uint32_t>(e / 2) && !s.queue[d].empty() && s.bulk_out_bytes[d] < client_limit &&
        !Blocked(e, *copies_.at(s.queue[d].front()))) {
      return true;
    }
  }
  return false;
}

// Finishes a copy once nothing of it is queued or out: counters, then the listener (the
// session's completion, resources, the observer).
void Scheduler::MaybeFinish(Copy& c) {
  if (c.out != 0 || c.next != c.pieces.size()) return;
  const uint64_t now = MonotonicNanos();
  if (c.Bulk() && c.first_dispatch_ns != 0) copies_started_[c.EngineSet()]--;
  counters_.in_flight--;
  if (c.status.ok()) {
    counters_.copies_completed++;
    (c.direction == Direction::kHostToDevice ? counters_.bytes_h2d : counters_.bytes_d2h) += c.bytes;
    GpuCounters& g = counters_.gpu[c.gpu];
    g.copies_completed++;
    (c.direction == Direction::kHostToDevice ? g.bytes_h2d : g.bytes_d2h) += c.bytes;
  } else {
    counters_.copies_failed++;
  }
  listener_.OnCopyFinished({c.id, c.session_id, c.user_tag, c.gpu, c.direction, c.latency, c.bytes, c.status, c.policy->name,
                            c.accepted_ns, c.first_dispatch_ns, now, c.buffer_offset, c.region_id, c.blocks});
  copies_.erase(c.id);
}

bool Scheduler::PollBackend() {
  done_.clear();
  backend_.PollCompleted(done_);
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
    SessionQueues* q = QueuesOf(c.session_id);
    if (f.bulk) {
      bulk_out_bytes_[c.EngineSet()] -= f.bytes;
      if (q != nullptr) q->bulk_out_bytes[static_cast<int>(c.direction)] -= f.bytes;
    }
    // A piece failed: the rest of the copy does not go out.
    if (!c.status.ok() && c.next < c.pieces.size() && q != nullptr) DropQueued(*q, c);
    MaybeFinish(c);
  }
  return !done_.empty();
}

// Takes a copy's undispatched pieces out of its session's queue.
void Scheduler::DropQueued(SessionQueues& q, Copy& c) {
  c.next = c.pieces.size();
  auto& queue = q.queue[static_cast<int>(c.direction)];
  auto it = std::find(queue.begin(), queue.end(), c.id);
  if (it != queue.end()) {
    queue.erase(it);
    counters_.queued_bytes -= c.bytes;
  }
}

void Scheduler::CancelSession(uint64_t session_id) {
  if (SessionQueues* q = QueuesOf(session_id)) {
    std::vector<uint64_t> queued(q->queue[0].begin(), q->queue[0].end());
    queued.insert(queued.end(), q->queue[1].begin(), q->queue[1].end());
    for (uint64_t id : queued) {
      Copy& c = *copies_.at(id);
      DropQueued(*q, c);
      MaybeFinish(c);
    }
  }
  for (size_t i = 0; i < held_.size();) {
    Copy& c = *copies_.at(held_[i]);
    if (c.session_id != session_id) {
      ++i;
      continue;
    }
    held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
    c.next = c.pieces.size();
    MaybeFinish(c);
  }
}

}  // namespace ferry::daemon
