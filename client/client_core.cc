#include "client/client_core.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

#include "client/spin_wait.hpp"
#include "common/status_macros.hpp"

namespace ferry::detail {

ClientCore::~ClientCore() {
  if (relay_created_) device_->DestroyStream(relay_stream_);
  if (flags_mapped_) device_->UnmapFlags(flags_);
  // EventState's destructor cannot reach a core that is going away: release events here.
  for (auto& e : free_events_) {
    device_->DestroyEvent(e->ev.event);
    e->ev.event = nullptr;
  }
  for (auto* list : {&stall_probes_, &free_probes_}) {
    for (StallProbe& p : *list) {
      device_->DestroyEvent(p.start);
      device_->DestroyEvent(p.end);
    }
  }
}

Status ClientCore::Connect(const ConnectOptions& o) {
  timeout_ms_ = static_cast<int>(o.timeout.count());
  const std::string path = o.socket_path.empty() ? DefaultSocketPath() : o.socket_path;
  // A ferryd still building its pool answers "starting": wait for it, up to the timeout.
  wire::HelloRequest h{};
  h.client_version = wire::kVersion;
  CopyCString(h.name, o.name.empty() ? std::string(program_invocation_short_name) : o.name);
  auto greeted = HelloUntilReady(path, h, o.timeout, std::chrono::milliseconds(20));
  if (!greeted.ok() && greeted.status().code() == Code::kUnavailable &&
      greeted.status().message().find("is not running") == std::string::npos) {
    return Unavailable("ferryd at " + path + " closed the connection before answering hello: it may be at its " +
                       "limit of connections that have not said hello yet (limits.pending_connections*) or out " +
                       "of file descriptors (its log says why), or it is a ferryd older than protocol " +
                       std::to_string(wire::kVersion) + " that hangs up on a client of another version");
  }
  FERRY_RETURN_IF_ERROR(greeted.status());
  {
    std::lock_guard<std::mutex> l(ctl_mu_);
    sock_ = std::move(greeted->sock);
    seq_ = 1;
  }
  ReceivedMessage m = std::move(greeted->reply);
  const auto r = m.As<wire::HelloReply>();
  FERRY_RETURN_IF_ERROR(FromWire(r.status).WithContext("ferryd refused the connection"));
  if (m.fds.size() != 3)
    return ProtocolError("hello reply carries " + std::to_string(m.fds.size()) + " fds, 3 expected");
  if (r.sq_entries == 0 || (r.sq_entries & (r.sq_entries - 1)) != 0 || r.cq_entries == 0 ||
      (r.cq_entries & (r.cq_entries - 1)) != 0 || r.ring_bytes != wire::RingSegmentBytes(r.sq_entries, r.cq_entries)) {
    return ProtocolError("hello reply has an inconsistent ring geometry");
  }
  FERRY_ASSIGN_OR_RETURN(ring_, MapShared(m.fds[0].get(), r.ring_bytes));
  submit_efd_ = std::move(m.fds[1]);
  complete_efd_ = std::move(m.fds[2]);
  hdr_ = reinterpret_cast<wire::RingHeader*>(ring_.data());
  if (hdr_->magic != wire::kRingMagic) return ProtocolError("ring segment has a bad magic");
  sq_entries_ = r.sq_entries;
  cq_entries_ = r.cq_entries;
  sq_ = wire::SubmissionEntries(ring_.data());
  cq_ = wire::CompletionEntries(ring_.data(), sq_entries_);
  flags_ = wire::EventFlags(ring_.data(), sq_entries_, cq_entries_);
  done_words_ = reinterpret_cast<std::atomic<uint32_t>*>(wire::DoneWords(ring_.data(), sq_entries_, cq_entries_));
  session_id_ = r.session_id;
  slab_bytes_ = r.slab_bytes;
  backend_ = r.backend == static_cast<uint32_t>(wire::BackendKind::kCuda) ? BackendKind::kCuda : BackendKind::kHost;
  if (o.device < -1) return InvalidArgument("ConnectOptions::device is " + std::to_string(o.device));
  if (backend_ == BackendKind::kCuda) {
    if (o.device >= 0) {
      device_ordinal_ = o.device;
    } else {
      FERRY_ASSIGN_OR_RETURN(device_ordinal_, CurrentCudaDevice());
    }
    FERRY_ASSIGN_OR_RETURN(device_, MakeCudaClientDevice(device_ordinal_));
  } else {
    device_ordinal_ = std::max(o.device, 0);
    device_ = MakeHostClientDevice(device_ordinal_);
  }
  // Name the GPU before anything else: ferryd takes this session's pool memory from its NUMA
  // node and checks its device memory against it.
  FERRY_ASSIGN_OR_RETURN(wire::UseGpuRequest use, device_->Identify());
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage g, Call(wire::MsgType::kUseGpu, use, wire::MsgType::kUseGpuReply));
  auto gr = g.As<wire::UseGpuReply>();
  FERRY_RETURN_IF_ERROR(FromWire(gr.status).WithContext("ferryd does not serve this client's GPU"));
  gpu_uuid_ = ReadCString(gr.uuid);
  numa_node_ = gr.numa_node;
  if (const char* s = std::getenv("FERRY_SPIN_US")) spin_ns_ = std::strtoull(s, nullptr, 10) * 1000;
  // FERRY_SLEEP_CAP_MS: the longest a waiting thread sleeps on the doorbell before it looks at
  // the ring again (for tests: a long cap makes a missed wake-up a hang instead of a delay).
  if (const char* s = std::getenv("FERRY_SLEEP_CAP_MS")) {
    sleep_cap_ns_ = std::max<uint64_t>(1, std::strtoull(s, nullptr, 10)) * 1'000'000;
  }
  // FERRY_DONE_WORDS=0: wait for latency copies' completions alone (to measure what the done
  // words save).
  if (const char* s = std::getenv("FERRY_DONE_WORDS"); s != nullptr && std::string_view(s) == "0") done_words_ = nullptr;
  // FERRY_STALL_PROBES=0: stream waits without their two timing events (to measure what the
  // probes cost the stream; ferryd's exposed-time metric then misses those stalls).
  if (const char* s = std::getenv("FERRY_STALL_PROBES"); s != nullptr && std::string_view(s) == "0")
    stall_probes_on_ = false;
  return Status::Ok();
}

Result<std::shared_ptr<HostBufferState>> ClientCore::AllocateHost(size_t bytes) {
  wire::AllocBufferRequest req{bytes};
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kAllocBuffer, req, wire::MsgType::kAllocBufferReply));
  auto r = m.As<wire::AllocBufferReply>();
  FERRY_RETURN_IF_ERROR(FromWire(r.status));
  auto s = std::make_shared<HostBufferState>();
  s->core = weak_from_this();
  s->pool_offset = r.pool_offset;
  s->size = bytes;
  const uint64_t in_map = r.pool_offset - static_cast<uint64_t>(r.first_slab) * slab_bytes_;
  if (m.fds.size() != r.slab_count || r.slab_count == 0 || in_map + bytes > r.slab_count * slab_bytes_) {
    (void)CallSimple(wire::MsgType::kFreeBuffer, wire::FreeBufferRequest{r.pool_offset});
    return ProtocolError("allocation reply does not match its slabs");
  }
  if (r.slab_count == 1) {
    std::lock_guard<std::mutex> l(map_mu_);
    auto& weak = slab_maps_[r.first_slab];
    s->mapping = weak.lock();
    if (!s->mapping) {
      auto mapped = MapShared(m.fds[0].get(), slab_bytes_);
      if (!mapped.ok()) return mapped.status();
      s->mapping = std::make_shared<SlabMapping>(SlabMapping{std::move(*mapped)});
      weak = s->mapping;
    }
  } else {
    std::vector<int> raw;
    for (auto& f : m.fds) raw.push_back(f.get());
    FERRY_ASSIGN_OR_RETURN(Mapping mapped, MapSideBySide(raw.data(), raw.size(), slab_bytes_));
    ::madvise(mapped.data(), mapped.size(), MADV_HUGEPAGE);  // map ferryd's huge pages as such, where it got them
    s->mapping = std::make_shared<SlabMapping>(SlabMapping{std::move(mapped)});
  }
  s->data = s->mapping->m.data() + in_map;
  return s;
}

Result<std::shared_ptr<DeviceRegionState>> ClientCore::Register(void* ptr, size_t bytes) {
  if (bytes == 0) return InvalidArgument("device region of 0 bytes");
  FERRY_ASSIGN_OR_RETURN(ExportedMemory e, device_->Export(ptr, bytes));
  const int fds[1] = {e.fd};
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kRegisterDevice, e.request,
                                                 wire::MsgType::kRegisterDeviceReply, fds, e.fd >= 0 ? 1 : 0));
  auto r = m.As<wire::RegisterDeviceReply>();
  FERRY_RETURN_IF_ERROR(FromWire(r.status).WithContext("registering device memory"));
  auto s = std::make_shared<DeviceRegionState>();
  s->core = weak_from_this();
  s->id = r.region_id;
  s->ptr = ptr;
  s->size = bytes;
  s->offset_in_base = e.offset_in_base;
  return s;
}

Result<std::shared_ptr<EventState>> ClientCore::NewEvent(bool ordered_after) {
  FERRY_ASSIGN_OR_RETURN(DeviceEvent ev, device_->CreateEvent());
  const bool flagged = ordered_after && !device_flags_failed_.load(std::memory_order_relaxed);
  if (flagged) {
    ev.request.flags |= wire::kEventWantsFlag | (device_->MapsDeviceFlags() ? wire::kEventTakesDeviceFlag : 0);
  }
  auto s = std::make_shared<EventState>();
  s->core = weak_from_this();
  s->ev = ev;
  std::unique_lock<std::mutex> in_order(flag_events_mu_, std::defer_lock);
  if (flagged) in_order.lock();
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage m,
                         Call(wire::MsgType::kRegisterEvent, ev.request, wire::MsgType::kRegisterEventReply));
  auto r = m.As<wire::RegisterEventReply>();
  FERRY_RETURN_IF_ERROR(FromWire(r.status).WithContext("registering an event"));
  s->id = r.event_id;
  if (r.flag_index != wire::kNoFlag) {
    if (r.flag_index >= wire::kEventFlags) return ProtocolError("ferryd gave an event a flag outside the flag area");
    if (r.flag_place == wire::kFlagOnDevice) {
      if (Status mapped = MapDeviceFlags(m, r.flag_memory_bytes); !mapped.ok()) {
        if (mapped.code() == Code::kProtocol) return mapped;
        // ferryd keeps this session's flags where this process cannot write them: this
        // registration is left unused, and its events go without flags from now on (ferryd
        // then sees them happen on the host: slower, as correct).
        device_flags_failed_.store(true, std::memory_order_relaxed);
        in_order.unlock();
        return NewEvent(ordered_after);
      }
    } else if (r.flag_place != wire::kFlagInRing) {
      return ProtocolError("ferryd put an event's flag in an unknown place (" + std::to_string(r.flag_place) + ")");
    } else if (std::lock_guard<std::mutex> l(flags_mu_); flags_on_device_) {
      return ProtocolError("ferryd put an event's flag in the ring after putting the session's on the device");
    }
    s->flag = flags_ + r.flag_index;
  }
  return s;
}

// The first reply that puts a flag on the device carries the memory (one fd); later ones none.
Status ClientCore::MapDeviceFlags(const ReceivedMessage& reply, uint64_t bytes) {
  std::lock_guard<std::mutex> l(flags_mu_);
  if (flags_on_device_) return Status::Ok();
  if (flags_mapped_) return ProtocolError("ferryd moved the session's event flags into device memory");
  if (reply.fds.size() != 1) return ProtocolError("ferryd put an event's flag in device memory it did not share");
  FERRY_RETURN_IF_ERROR(device_->MapDeviceFlags(flags_, reply.fds[0].get(), bytes)
                            .WithContext("mapping the event flags ferryd keeps in device memory"));
  flags_mapped_ = true;
  flags_on_device_ = true;
  return Status::Ok();
}

// An event with a flag is waited for by its flag alone (ferryd never looks at the event itself
// then), so the stream writes the flag and records the ferry event not: one operation less on
// the caller's stream for every copy ordered after it. (A flag in device memory is followed by
// an event of libferry's own, for the mapping's end: see ClientDevice::UnmapFlags.)
Status ClientCore::RecordEvent(EventState& ev, void* stream) {
  if (ev.flag == nullptr) return device_->RecordEvent(ev.ev.event, stream);
  {
    std::lock_guard<std::mutex> l(flags_mu_);
    if (!flags_mapped_) {
      FERRY_RETURN_IF_ERROR(device_->MapFlags(flags_, wire::kEventFlagsBytes).WithContext("mapping the event flags"));
      flags_mapped_ = true;
    }
  }
  // Counted once written: a copy submitted after a failed record waits for the last good one.
  const uint32_t n = ev.records.load(std::memory_order_relaxed) + 1;
  FERRY_RETURN_IF_ERROR(device_->WriteFlag(stream, ev.flag, n));
  ev.records.store(n, std::memory_order_release);
  return Status::Ok();
}

Status ClientCore::RecordEventAfter(EventState& ev, void* foreign_event) {
  std::lock_guard<std::mutex> l(relay_mu_);
  if (!relay_created_) {
    FERRY_ASSIGN_OR_RETURN(relay_stream_, device_->CreateStream());
    relay_created_ = true;
  }
  FERRY_RETURN_IF_ERROR(device_->StreamWaitEvent(relay_stream_, foreign_event));
  return RecordEvent(ev, relay_stream_);
}

Result<std::shared_ptr<TransferState>> ClientCore::Submit(wire::SubmissionEntry e, std::shared_ptr<TransferState> t,
                                                          bool want_event,
                                                          std::span<const wire::SubmissionEntry> more) {
  if (more.size() >= sq_entries_) {
    return InvalidArgument("a request of " + std::to_string(more.size() + 1) + " ring slots does not fit a ring of " +
                           std::to_string(sq_entries_));
  }
  const auto extra = static_cast<uint32_t>(more.size());
  if (want_event) {
    std::shared_ptr<EventState> ev;
    {
      std::lock_guard<std::mutex> l(ring_mu_);
      if (!free_events_.empty()) {
        ev = std::move(free_events_.back());
        free_events_.pop_back();
      }
    }
    if (!ev) {
      FERRY_ASSIGN_OR_RETURN(ev, NewEvent(false));
    }
    e.signal_event_id = ev->id;
    t->event = std::move(ev);
  }
  const uint64_t deadline = MonotonicNanos() + 1'000'000'000ull;
  for (;;) {
    uint32_t seen_tail = 0, seen_head = 0;  // the rings as this thread last found them, under ring_mu_
    {
      std::lock_guard<std::mutex> l(ring_mu_);
      FERRY_RETURN_IF_ERROR(broken_);
      ReapLocked();
      seen_tail = cq_head_;
      seen_head = hdr_->sq_head.value.load(std::memory_order_acquire);
      // Room for the whole group: its last slot must fit too.
      if (outstanding_ < sq_entries_ && !wire::RingFull(seen_head, sq_tail_ + extra, sq_entries_)) {
        e.user_tag = t->tag = next_tag_++;
        if (t->watch_done_word && done_words_ != nullptr) t->done_word = &done_words_[t->tag % wire::kDoneWords];
        t->submit_ns = MonotonicNanos();
        pending_[t->tag] = t;
        ++outstanding_;
        sq_[wire::RingSlot(sq_tail_, sq_entries_)] = e;
        ++sq_tail_;
        for (const wire::SubmissionEntry& slot : more) {
          sq_[wire::RingSlot(sq_tail_, sq_entries_)] = slot;
          ++sq_tail_;
        }
        hdr_->sq_tail.value.store(sq_tail_, std::memory_order_release);
        WakeDaemonIfAsleep();
        return t;
      }
    }
    if (MonotonicNanos() > deadline) {
      return ResourceExhausted("submission ring full: " + std::to_string(outstanding_) +
                               " copies in flight for 1 s; wait on some before submitting more");
    }
    // Room comes with ferryd reading the ring and with its completions, usually within
    // microseconds while it copies: spin for them first, as a waiter does, before the doorbell's
    // wake-up (tens of us a time, paid over and over by a client keeping more copies in flight
    // than its ring holds). ferryd must not be asleep over a full ring.
    WakeDaemonIfAsleep();
    for (const uint64_t spin_until = MonotonicNanos() + spin_ns_;
         hdr_->cq_tail.value.load(std::memory_order_acquire) == seen_tail &&
         hdr_->sq_head.value.load(std::memory_order_acquire) == seen_head && MonotonicNanos() < spin_until;) {
      CpuRelax();
    }
    WaitForProgress(1'000'000, seen_tail, seen_head);
  }
}

namespace {
// The size class of a list buffer of `bytes`: the smallest c with kMinListBufferBytes << c >= bytes.
size_t ListBufferClass(size_t bytes) {
  size_t c = 0;
  while ((ClientCore::kMinListBufferBytes << c) < bytes) ++c;
  return c;
}
}  // namespace

Result<std::shared_ptr<HostBufferState>> ClientCore::AcquireListBuffer(size_t bytes) {
  if (bytes > kMaxListBufferBytes) {
    return InvalidArgument("a block list of " + std::to_string(bytes) + " bytes is larger than " +
                           std::to_string(kMaxListBufferBytes));
  }
  const size_t c = ListBufferClass(bytes);
  std::shared_ptr<HostBufferState> b;
  std::vector<std::shared_ptr<HostBufferState>> excess;  // freed below, outside ring_mu_
  {
    std::lock_guard<std::mutex> l(ring_mu_);
    FERRY_RETURN_IF_ERROR(broken_);
    if (!free_lists_[c].empty()) {
      b = std::move(free_lists_[c].back());
      free_lists_[c].pop_back();
    }
    for (size_t k = 0; k < kListBufferClasses; ++k) {
      const size_t keep = std::max<size_t>(2, kCachedListBytes / (kMinListBufferBytes << k));
      while (free_lists_[k].size() > keep) {
        excess.push_back(std::move(free_lists_[k].back()));
        free_lists_[k].pop_back();
      }
    }
  }
  if (b) return b;
  return AllocateHost(kMinListBufferBytes << c);
}

// Caller holds ring_mu_. `b` came from AcquireListBuffer: its size is a class's.
void ClientCore::RecycleListBufferLocked(std::shared_ptr<HostBufferState> b) {
  free_lists_[ListBufferClass(b->size)].push_back(std::move(b));
}

// Tells ferryd how long this thread was blocked on a copy: the exposed time its metrics show.
// Best effort: skipped when the ring is full. Caller holds ring_mu_.
PolicyStaging ClientCore::Staging() const {
  const wire::StagingSettings& st = hdr_->staging;
  PolicyStaging out;
  // ferryd writes it in a few stores on its loop thread; a ferryd killed mid-write leaves the
  // generation odd for good, so after a while the fields are taken as they are.
  for (int tries = 0; tries < 100'000; ++tries) {
    const uint32_t before = st.generation.load(std::memory_order_acquire);
    if (before % 2 == 0) {
      out.chunk_bytes = st.chunk_bytes.load(std::memory_order_relaxed);
      out.threads = st.threads.load(std::memory_order_relaxed);
      out.buffers = st.buffers.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (st.generation.load(std::memory_order_relaxed) == before) return out;
    }
    CpuRelax();
  }
  out.chunk_bytes = st.chunk_bytes.load(std::memory_order_relaxed);
  out.threads = st.threads.load(std::memory_order_relaxed);
  out.buffers = st.buffers.load(std::memory_order_relaxed);
  return out;
}

void ClientCore::ReportWaitLocked(uint64_t tag, uint64_t blocked_ns) {
  const uint32_t head = hdr_->sq_head.value.load(std::memory_order_acquire);
  if (wire::RingFull(head, sq_tail_, sq_entries_)) return;
  wire::SubmissionEntry e{};
  e.opcode = static_cast<uint16_t>(wire::Opcode::kReportWait);
  e.user_tag = tag;
  e.length = blocked_ns;
  sq_[wire::RingSlot(sq_tail_, sq_entries_)] = e;
  ++sq_tail_;
  hdr_->sq_tail.value.store(sq_tail_, std::memory_order_release);
  WakeDaemonIfAsleep();
}

// After publishing submissions: a sleeping ferryd reads none of them until its doorbell rings.
// Pairs with ferryd's setting its sleeping bit, fencing, and looking at the rings once more.
void ClientCore::WakeDaemonIfAsleep() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (wire::TakeDaemonSleeping(hdr_->daemon_state.value)) RingDoorbell(submit_efd_.get());
}

// Caller holds ring_mu_.
void ClientCore::ReapLocked() {
  const uint32_t tail = hdr_->cq_tail.value.load(std::memory_order_acquire);
  if (!wire::RingIndexPlausible(cq_head_, tail, cq_entries_)) {
    Break(ProtocolError("completion ring tail out of range"));
    return;
  }
  bool any = false;
  while (cq_head_ != tail) {
    wire::CompletionEntry c = cq_[wire::RingSlot(cq_head_, cq_entries_)];
    ++cq_head_;
    any = true;
    auto it = pending_.find(c.user_tag);
    if (it == pending_.end()) continue;
    TransferState& t = *it->second;
    if (c.kind == static_cast<uint16_t>(wire::CompletionKind::kEnqueued)) {
      t.enqueued = true;
      continue;
    }
    t.done = true;
    t.enqueued = true;
    if (t.complete_ns == 0) t.complete_ns = MonotonicNanos();
    if (c.status != 0) {
      int32_t code = c.status;
      Code k = (code > 0 && code <= static_cast<int32_t>(Code::kAborted)) ? static_cast<Code>(code) : Code::kInternal;
      t.status = Status(k, "ferryd failed the copy (" + std::string(CodeName(k)) + "; its log has the reason)");
    }
    if (t.event) free_events_.push_back(std::move(t.event));
    if (t.list_keep) RecycleListBufferLocked(std::move(t.list_keep));
    t.host_keep.reset();
    t.region_keep.reset();
    pending_.erase(it);
    --outstanding_;
  }
  if (any) hdr_->cq_head.value.store(cq_head_, std::memory_order_release);
  if (!stall_probes_.empty()) CollectStallsLocked();
}

// Caller holds ring_mu_.
void ClientCore::CollectStallsLocked() {
  // A few a call: each look is a driver call, and reaps sit on the submit path.
  int looks = 8;
  for (size_t i = 0; i < stall_probes_.size() && looks-- > 0;) {
    StallProbe& p = stall_probes_[i];
    auto ns = device_->ElapsedIfDone(p.start, p.end);
    if (ns.ok() && *ns < 0) {
      ++i;
      continue;
    }
    if (ns.ok()) ReportWaitLocked(p.tag, static_cast<uint64_t>(*ns));
    free_probes_.push_back(p);
    stall_probes_[i] = stall_probes_.back();
    stall_probes_.pop_back();
  }
}

// Caller holds ring_mu_. A probe with no events when none could be made: waits go unmeasured.
ClientCore::StallProbe ClientCore::TakeProbeLocked() {
  StallProbe p;
  if (!free_probes_.empty()) {
    p = free_probes_.back();
    free_probes_.pop_back();
  } else if (stall_probes_.size() < kMaxStallProbes) {
    auto a = device_->CreateTimingEvent();
    auto b = a.ok() ? device_->CreateTimingEvent() : a;
    if (a.ok() && b.ok()) {
      p.start = *a;
      p.end = *b;
    } else if (a.ok()) {
      device_->DestroyEvent(*a);
    }
  }
  return p;
}

void ClientCore::Break(const Status& why) {
  if (!broken_.ok()) return;
  broken_ = why;
  broken_flag_.store(true, std::memory_order_release);
  for (auto& [tag, t] : pending_) {
    t->done = true;
    t->status = why;
    t->host_keep.reset();
    t->region_keep.reset();
    t->list_keep.reset();
  }
  pending_.clear();
  outstanding_ = 0;
}

// Sleeps until the daemon signals completions past `seen_tail` (the completion ring's tail as the
// caller last reaped it), or with `seen_head` (a caller waiting for room in the submission ring)
// reads submissions past it, the connection drops, or timeout_ns passes.
// Several threads may wait at once (the staged path does): one of them watches the doorbell
// and wakes the others when it rings, since reading an eventfd wakes only its reader.
void ClientCore::WaitForProgress(uint64_t timeout_ns, uint32_t seen_tail, std::optional<uint32_t> seen_head) {
  std::unique_lock<std::mutex> wl(wait_mu_);
  ++waiters_;
  if (seen_head) ++room_waiters_;
  PublishClientStateLocked();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const bool ready = hdr_->cq_tail.value.load(std::memory_order_acquire) != seen_tail ||
                     (seen_head && hdr_->sq_head.value.load(std::memory_order_acquire) != *seen_head) ||
                     broken_flag_.load(std::memory_order_acquire);
  if (!ready && polling_) {
    const uint64_t gen = wake_gen_;
    wake_cv_.wait_for(wl, std::chrono::nanoseconds(timeout_ns), [&] { return wake_gen_ != gen; });
  } else if (!ready) {
    polling_ = true;
    wl.unlock();
    // On the socket only a hang-up matters here: a readable reply belongs to another thread's
    // call in flight.
    pollfd p[2] = {{complete_efd_.get(), POLLIN, 0}, {sock_.get(), POLLRDHUP, 0}};
    const timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000), static_cast<long>(timeout_ns % 1'000'000'000)};
    int n = ::ppoll(p, 2, &ts, nullptr);
    if (n > 0 && (p[0].revents & POLLIN)) DrainDoorbell(complete_efd_.get());
    if (n > 0 && (p[1].revents & (POLLHUP | POLLERR | POLLRDHUP))) {
      std::lock_guard<std::mutex> l(ring_mu_);
      ReapLocked();
      Break(Unavailable("ferryd went away (connection closed); reconnect once it is back"));
    }
    wl.lock();
    polling_ = false;
    ++wake_gen_;
    wake_cv_.notify_all();
  }
  --waiters_;
  if (seen_head) --room_waiters_;
  PublishClientStateLocked();
}

// Caller holds wait_mu_.
void ClientCore::PublishClientStateLocked() {
  const uint32_t state =
      (waiters_ > 0 ? wire::kClientWaiting : 0) | (room_waiters_ > 0 ? wire::kClientWaitingForRoom : 0);
  if (hdr_->client_state.value.load(std::memory_order_relaxed) != state) {
    hdr_->client_state.value.store(state, std::memory_order_relaxed);
  }
}

// Waits without burning a core for long copies and without a wake-up's delay for short ones:
// a copy of n bytes cannot complete before n / kFastestBus after it was submitted, so sleep
// through most of that, spin across the moment it may land (until it would have taken twice
// that, plus spin_ns_), and only then block on the doorbell. Twice: both directions at once run
// at ~50 GB/s each on the H200, past a quarter's slack, and the doorbell's wake-up then cost
// every such copy tens of microseconds (ferryd --trace-engine showed ~100 us between a
// both-ways pair's engine time and what the client saw). cudaStreamSynchronize spins all along.
Status ClientCore::Wait(TransferState& t, uint64_t timeout_ns, bool until_enqueued) {
  constexpr uint64_t kFastestBusBytesPerUs = 64'000;  // above PCIe Gen5 x16
  constexpr uint64_t kWakeAheadNs = 100'000;          // covers the kernel's default timer slack
  const uint64_t start = MonotonicNanos();
  const uint64_t earliest = until_enqueued ? 0 : t.bytes * 1000 / kFastestBusBytesPerUs;
  const uint64_t sleep_until = t.submit_ns + (earliest > kWakeAheadNs ? earliest - kWakeAheadNs : 0);
  // A stream wait waits only for ferryd to enqueue the copy, which for a copy "after" an event
  // is when the client's kernel reaches it: usually soon, and the caller's stream stalls while
  // this thread sleeps. Spinning through it took the in-step exposed time of the overlap
  // workload on the H200 from 0.18 to 0.15 ms (a doorbell wake-up costs tens of us).
  const uint64_t spin = until_enqueued ? std::max<uint64_t>(spin_ns_, kEnqueueSpinNs) : spin_ns_;
  const uint64_t spin_until = std::max(start, t.submit_ns + 2 * earliest) + spin;
  // The completion ring's tail as of this thread's last reap. Not the ring's shared head: another
  // thread may reap this copy's completion after it was posted, when no doorbell rang for it.
  uint32_t seen_tail = 0;
  for (bool first = true;; first = false) {
    // Spinning threads look at the ring without the lock, and take it only when completions
    // arrived: many threads waiting at once (the staged path) must not starve submitters.
    if (!first && hdr_->cq_tail.value.load(std::memory_order_acquire) == seen_tail &&
        (until_enqueued || !DoneByWord(t)) && MonotonicNanos() - start < timeout_ns) {
      const uint64_t now = MonotonicNanos();
      if (now >= sleep_until && now < spin_until) {
        CpuRelax();
        continue;
      }
    }
    {
      std::lock_guard<std::mutex> l(ring_mu_);
      ReapLocked();
      seen_tail = cq_head_;
      if (until_enqueued ? t.done : SeenDoneLocked(t)) {
        if (!until_enqueued && !t.wait_reported) {
          t.wait_reported = true;
          ReportWaitLocked(t.tag, first ? 0 : MonotonicNanos() - start);
        }
        return t.status;
      }
      if (until_enqueued && t.enqueued) return Status::Ok();
      FERRY_RETURN_IF_ERROR(broken_);
    }
    const uint64_t now = MonotonicNanos();
    if (now - start >= timeout_ns) return Timeout("copy not done after " + std::to_string(timeout_ns / 1000) + " us");
    const uint64_t left = timeout_ns - (now - start);
    if (now < sleep_until) {
      WaitForProgress(std::min(sleep_until - now, left), seen_tail);
    } else if (now >= spin_until) {
      WaitForProgress(std::min(left, sleep_cap_ns_), seen_tail);
    }
  }
}

bool ClientCore::SeenDoneLocked(TransferState& t) {
  if (t.done) return true;
  if (!DoneByWord(t)) return false;
  // Done on the engines; the completion still comes, and releases what the copy holds.
  if (t.complete_ns == 0) t.complete_ns = MonotonicNanos();
  return true;
}

Result<bool> ClientCore::Poll(TransferState& t) {
  std::lock_guard<std::mutex> l(ring_mu_);
  ReapLocked();
  if (SeenDoneLocked(t)) {
    if (!t.status.ok()) return t.status;
    return true;
  }
  FERRY_RETURN_IF_ERROR(broken_);
  return false;
}

// Where the stream is the calling thread (host backend), its stall is this whole call, reported
// once against the batch's newest copy as a GPU probe's is. One wait report per copy left the time
// between the copies' waits and each wait's first look unreported: a thread preempted there on a
// loaded machine was blocked for milliseconds that the bench's clock saw and ferryd's metric not.
Status ClientCore::HostStreamWait(std::span<TransferState* const> batch) {
  const uint64_t start = MonotonicNanos();
  TransferState* newest = nullptr;
  {
    std::lock_guard<std::mutex> l(ring_mu_);
    for (TransferState* t : batch) {
      if (t->wait_reported) continue;
      if (newest == nullptr || t->submit_ns >= newest->submit_ns) newest = t;
      t->wait_reported = true;  // the batch's stall is the one report below
    }
  }
  for (TransferState* t : batch) FERRY_RETURN_IF_ERROR(Wait(*t, 3600ull * 1'000'000'000ull, false));
  if (newest != nullptr) {
    std::lock_guard<std::mutex> l(ring_mu_);
    ReportWaitLocked(newest->tag, MonotonicNanos() - start);
  }
  return Status::Ok();
}

// One probe spans the whole batch: a probe's two timing events cost the stream ~1 us each
// (H200), which a stall measured between them leaves out, so six waits probed one by one read
// ~14 us a step below what the stream lost (docs/design.md, "Measured and reported figures").
// The probe starts before this thread waits for ferryd to enqueue the copies: meanwhile the
// stream has nothing of the caller's to run, and that is exposed time too. The stall is
// reported against the batch's newest copy, whose lifetime at ferryd bounds the whole span.
Status ClientCore::StreamWait(std::span<TransferState* const> batch, void* stream) {
  if (device_->StreamWaitIsHostWait()) return HostStreamWait(batch);
  StallProbe p;
  {
    // Under ring_mu_: a reap on another thread sets done and takes the event back.
    std::lock_guard<std::mutex> l(ring_mu_);
    for (TransferState* t : batch) {
      if (!t->event && !t->done) return InvalidArgument("StreamWait needs a copy submitted with stream_waitable = true");
    }
    for (TransferState* t : batch) {
      if (stall_probes_on_ && !t->done && !t->wait_reported) {
        p = TakeProbeLocked();
        break;
      }
    }
  }
  const bool measured = p.start && device_->RecordEvent(p.start, stream).ok();
  auto give_back = [&] {
    std::lock_guard<std::mutex> l(ring_mu_);
    if (p.start) free_probes_.push_back(p);
  };
  for (TransferState* t : batch) {
    if (Status s = Wait(*t, 10ull * 1'000'000'000ull, true); !s.ok()) {
      give_back();
      return s;
    }
  }
  std::lock_guard<std::mutex> l(ring_mu_);
  TransferState* newest = nullptr;
  for (TransferState* t : batch) {
    if (t->done) {
      if (!t->status.ok()) {
        if (p.start) free_probes_.push_back(p);
        return t->status;
      }
      continue;  // done already: nothing left for the stream to wait on
    }
    // Under ring_mu_, so the event cannot be recycled and re-recorded before this wait is enqueued.
    if (Status s = device_->StreamWaitEvent(stream, t->event->ev.event); !s.ok()) {
      if (p.start) free_probes_.push_back(p);
      return s;
    }
    if (!t->wait_reported && (newest == nullptr || t->submit_ns >= newest->submit_ns)) newest = t;
  }
  if (measured && newest != nullptr && device_->RecordEvent(p.end, stream).ok()) {
    for (TransferState* t : batch) t->wait_reported = true;  // the batch's stall is this one report
    p.tag = newest->tag;
    stall_probes_.push_back(p);
  } else if (p.start) {
    free_probes_.push_back(p);
  }
  return Status::Ok();
}

EventState::~EventState() {
  // The daemon closes its side when the session ends; the client's event goes now.
  if (auto c = core.lock()) c->device().DestroyEvent(ev.event);
}

HostBufferState::~HostBufferState() {
  if (auto c = core.lock()) (void)c->CallSimple(wire::MsgType::kFreeBuffer, wire::FreeBufferRequest{pool_offset});
}

DeviceRegionState::~DeviceRegionState() {
  if (auto c = core.lock()) (void)c->CallSimple(wire::MsgType::kUnregisterDevice, wire::UnregisterDeviceRequest{id, 0});
}

}  // namespace ferry::detail
