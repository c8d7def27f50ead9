#include "ferry/client.hpp"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/device_api.hpp"
#include "client/streaming_copy.hpp"
#include "common/channel.hpp"

namespace ferry {
namespace detail {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until `done()` or `ns` have passed; says whether `done()` came true.
template <typename Done>
bool SpinFor(uint64_t ns, Done done) {
  const uint64_t until = MonotonicNanos() + ns;
  while (!done()) {
    if (MonotonicNanos() >= until) return false;
    CpuRelax();
  }
  return true;
}

// The CPUs this process may run on (its affinity mask; cgroup CPU quotas are not counted).
uint32_t UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return std::max(1u, std::thread::hardware_concurrency());
  return static_cast<uint32_t>(std::max(1, CPU_COUNT(&set)));
}

struct SlabMapping {
  Mapping m;
};

struct EventState {
  std::weak_ptr<ClientCore> core;
  DeviceEvent ev;
  uint32_t id = 0;
  ~EventState();
};

struct HostBufferState {
  std::weak_ptr<ClientCore> core;
  uint64_t pool_offset = 0;
  size_t size = 0;
  std::byte* data = nullptr;
  std::shared_ptr<SlabMapping> mapping;  // shared between buffers of one slab
  ~HostBufferState();
};

struct DeviceRegionState {
  std::weak_ptr<ClientCore> core;
  uint32_t id = 0;
  void* ptr = nullptr;
  size_t size = 0;
  uint64_t offset_in_base = 0;
  ~DeviceRegionState();
};

struct TransferState {
  uint64_t tag = 0;
  size_t bytes = 0;
  uint32_t direction = 0;  // 0 h2d, 1 d2h
  bool enqueued = false;
  bool done = false;
  bool wait_reported = false;  // ferryd believes one wait report per copy: the first
  Status status;
  uint64_t submit_ns = 0, complete_ns = 0;
  std::shared_ptr<EventState> event;             // completion event, when stream-waitable
  std::shared_ptr<HostBufferState> host_keep;    // buffers stay mapped while the copy runs
  std::shared_ptr<DeviceRegionState> region_keep;
};

class ClientCore : public std::enable_shared_from_this<ClientCore> {
 public:
  ~ClientCore() {
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

  Status Connect(const ConnectOptions& o) {
    timeout_ms_ = static_cast<int>(o.timeout.count());
    const std::string path = o.socket_path.empty() ? DefaultSocketPath() : o.socket_path;
    FERRY_ASSIGN_OR_RETURN(sock_, ConnectUnix(path, timeout_ms_));
    wire::HelloRequest h{};
    h.client_version = wire::kVersion;
    std::string name = o.name;
    if (name.empty()) name = program_invocation_short_name;
    CopyCString(h.name, name);
    auto hello = Call(wire::MsgType::kHello, h, wire::MsgType::kHelloReply);
    if (!hello.ok() && hello.status().code() == Code::kUnavailable) {
      return Unavailable("ferryd at " + path + " closed the connection before answering hello: it may be at its " +
                         "limit of connections that have not said hello yet (limits.pending_connections*) or out " +
                         "of file descriptors; its log says why");
    }
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, std::move(hello));
    auto r = m.As<wire::HelloReply>();
    FERRY_RETURN_IF_ERROR(FromWire(r.status).WithContext("ferryd refused the connection"));
    if (m.fds.size() != 3) return ProtocolError("hello reply carries " + std::to_string(m.fds.size()) + " fds, 3 expected");
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
    session_id_ = r.session_id;
    slab_bytes_ = r.slab_bytes;
    device_ordinal_ = r.device_ordinal;
    backend_ = r.backend == static_cast<uint32_t>(wire::BackendKind::kCuda) ? BackendKind::kCuda : BackendKind::kHost;
    if (backend_ == BackendKind::kCuda) {
      FERRY_ASSIGN_OR_RETURN(device_, MakeCudaClientDevice(device_ordinal_));
    } else {
      device_ = MakeHostClientDevice();
    }
    if (const char* s = std::getenv("FERRY_SPIN_US")) spin_ns_ = std::strtoull(s, nullptr, 10) * 1000;
    return Status::Ok();
  }

  // One request, one reply, under the control lock.
  template <typename T>
  Result<ReceivedMessage> Call(wire::MsgType type, const T& payload, wire::MsgType reply_type, const int* fds = nullptr,
                               size_t nfds = 0) {
    std::lock_guard<std::mutex> l(ctl_mu_);
    if (!sock_.valid()) return Unavailable("not connected to ferryd");
    const uint32_t seq = ++seq_;
    Status st = Send(sock_.get(), type, seq, payload, fds, nfds);
    if (!st.ok()) return Unavailable("ferryd went away: " + st.message());
    auto m = RecvMessage(sock_.get(), timeout_ms_);
    if (!m.ok()) {
      if (m.status().code() == Code::kUnavailable) return Unavailable("ferryd closed the connection");
      return m.status();
    }
    if (m->type() != reply_type || m->header.seq != seq) return ProtocolError("unexpected reply from ferryd");
    return m;
  }

  Status CallSimple(wire::MsgType type, const auto& payload) {
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(type, payload, wire::MsgType::kSimpleReply));
    return FromWire(m.As<wire::SimpleReply>().status);
  }

  Result<std::shared_ptr<HostBufferState>> AllocateHost(size_t bytes) {
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

  Result<std::shared_ptr<DeviceRegionState>> Register(void* ptr, size_t bytes) {
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

  Result<std::shared_ptr<EventState>> NewEvent() {
    FERRY_ASSIGN_OR_RETURN(DeviceEvent ev, device_->CreateEvent());
    auto s = std::make_shared<EventState>();
    s->core = weak_from_this();
    s->ev = ev;
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kRegisterEvent, ev.request, wire::MsgType::kRegisterEventReply));
    auto r = m.As<wire::RegisterEventReply>();
    FERRY_RETURN_IF_ERROR(FromWire(r.status).WithContext("registering an event"));
    s->id = r.event_id;
    return s;
  }

  Result<std::shared_ptr<TransferState>> Submit(wire::SubmissionEntry e, std::shared_ptr<TransferState> t, bool want_event) {
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
        FERRY_ASSIGN_OR_RETURN(ev, NewEvent());
      }
      e.signal_event_id = ev->id;
      t->event = std::move(ev);
    }
    const uint64_t deadline = MonotonicNanos() + 1'000'000'000ull;
    for (;;) {
      {
        std::lock_guard<std::mutex> l(ring_mu_);
        FERRY_RETURN_IF_ERROR(broken_);
        ReapLocked();
        const uint32_t head = hdr_->sq_head.value.load(std::memory_order_acquire);
        if (outstanding_ < sq_entries_ && sq_tail_ - head < sq_entries_) {
          e.user_tag = t->tag = next_tag_++;
          t->submit_ns = MonotonicNanos();
          pending_[t->tag] = t;
          ++outstanding_;
          sq_[sq_tail_ & (sq_entries_ - 1)] = e;
          ++sq_tail_;
          hdr_->sq_tail.value.store(sq_tail_, std::memory_order_release);
          std::atomic_thread_fence(std::memory_order_seq_cst);
          if (hdr_->daemon_state.value.load(std::memory_order_relaxed) & wire::kDaemonSleeping) {
            RingDoorbell(submit_efd_.get());
          }
          return t;
        }
      }
      if (MonotonicNanos() > deadline) {
        return ResourceExhausted("submission ring full: " + std::to_string(outstanding_) +
                                 " copies in flight for 1 s; wait on some before submitting more");
      }
      WaitForProgress(1'000'000);
    }
  }

  // Tells ferryd how long this thread was blocked on a copy: the exposed time its metrics show.
  // Best effort: skipped when the ring is full. Caller holds ring_mu_.
  void ReportWaitLocked(uint64_t tag, uint32_t direction, uint64_t blocked_ns) {
    const uint32_t head = hdr_->sq_head.value.load(std::memory_order_acquire);
    if (sq_tail_ - head >= sq_entries_) return;
    wire::SubmissionEntry e{};
    e.opcode = static_cast<uint16_t>(wire::Opcode::kReportWait);
    e.user_tag = tag;
    e.length = blocked_ns;
    e.device_offset = direction;
    sq_[sq_tail_ & (sq_entries_ - 1)] = e;
    ++sq_tail_;
    hdr_->sq_tail.value.store(sq_tail_, std::memory_order_release);
  }

  // Caller holds ring_mu_.
  void ReapLocked() {
    const uint32_t tail = hdr_->cq_tail.value.load(std::memory_order_acquire);
    if (tail - cq_head_ > cq_entries_) {
      Break(ProtocolError("completion ring tail out of range"));
      return;
    }
    bool any = false;
    while (cq_head_ != tail) {
      wire::CompletionEntry c = cq_[cq_head_ & (cq_entries_ - 1)];
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
      t.complete_ns = MonotonicNanos();
      if (c.status != 0) {
        int32_t code = c.status;
        Code k = (code > 0 && code <= static_cast<int32_t>(Code::kAborted)) ? static_cast<Code>(code) : Code::kInternal;
        t.status = Status(k, "ferryd failed the copy (" + std::string(CodeName(k)) +
                                 "; its log has the reason)");
      }
      if (t.event) free_events_.push_back(std::move(t.event));
      t.host_keep.reset();
      t.region_keep.reset();
      pending_.erase(it);
      --outstanding_;
    }
    if (any) hdr_->cq_head.value.store(cq_head_, std::memory_order_release);
    reaped_to_.store(cq_head_, std::memory_order_release);
    if (!stall_probes_.empty()) CollectStallsLocked();
  }

  // A stream's stall on a StreamWait, measured on the GPU by timing events recorded around
  // the wait, and reported like a host wait once the second event has happened.
  struct StallProbe {
    void* start = nullptr;
    void* end = nullptr;
    uint64_t tag = 0;
    uint32_t direction = 0;
  };
  static constexpr size_t kMaxStallProbes = 256;  // beyond this many unread, waits go unmeasured

  // Caller holds ring_mu_.
  void CollectStallsLocked() {
    // A few a call: each look is a driver call, and reaps sit on the submit path.
    int looks = 8;
    for (size_t i = 0; i < stall_probes_.size() && looks-- > 0;) {
      StallProbe& p = stall_probes_[i];
      auto ns = device_->ElapsedIfDone(p.start, p.end);
      if (ns.ok() && *ns < 0) {
        ++i;
        continue;
      }
      if (ns.ok()) ReportWaitLocked(p.tag, p.direction, static_cast<uint64_t>(*ns));
      free_probes_.push_back(p);
      stall_probes_[i] = stall_probes_.back();
      stall_probes_.pop_back();
    }
  }

  // Caller holds ring_mu_. A probe with no events when none could be made: waits go unmeasured.
  StallProbe TakeProbeLocked() {
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

  void Break(const Status& why) {
    if (!broken_.ok()) return;
    broken_ = why;
    broken_flag_.store(true, std::memory_order_release);
    for (auto& [tag, t] : pending_) {
      t->done = true;
      t->status = why;
      t->host_keep.reset();
      t->region_keep.reset();
    }
    pending_.clear();
    outstanding_ = 0;
  }

  // Sleeps until the daemon signals completions, the connection drops, or timeout_ns passes.
  // Several threads may wait at once (the staged path does): one of them watches the doorbell
  // and wakes the others when it rings, since reading an eventfd wakes only its reader.
  void WaitForProgress(uint64_t timeout_ns) {
    std::unique_lock<std::mutex> wl(wait_mu_);
    if (waiters_++ == 0) hdr_->client_state.value.store(wire::kClientWaiting, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const bool ready = hdr_->cq_tail.value.load(std::memory_order_acquire) != reaped_to_.load(std::memory_order_acquire) ||
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
    if (--waiters_ == 0) hdr_->client_state.value.store(0, std::memory_order_relaxed);
  }

  // Waits without burning a core for long copies and without a wake-up's delay for short ones:
  // a copy of n bytes cannot complete before n / kFastestBus after it was submitted, so sleep
  // through most of that, spin across the moment it may land (until it would have taken twice
  // that, plus spin_ns_), and only then block on the doorbell. Twice: both directions at once run
  // at ~50 GB/s each on the H200, past a quarter's slack, and the doorbell's wake-up then cost
  // every such copy tens of microseconds (ferryd --trace-engine showed ~100 us between a
  // both-ways pair's engine time and what the client saw). cudaStreamSynchronize spins all along.
  Status Wait(TransferState& t, uint64_t timeout_ns, bool until_enqueued) {
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
    for (bool first = true;; first = false) {
      // Spinning threads look at the ring without the lock, and take it only when completions
      // arrived: many threads waiting at once (the staged path) must not starve submitters.
      if (!first && hdr_->cq_tail.value.load(std::memory_order_acquire) == reaped_to_.load(std::memory_order_acquire) &&
          MonotonicNanos() - start < timeout_ns) {
        const uint64_t now = MonotonicNanos();
        if (now >= sleep_until && now < spin_until) {
          CpuRelax();
          continue;
        }
      }
      {
        std::lock_guard<std::mutex> l(ring_mu_);
        ReapLocked();
        if (t.done) {
          if (!until_enqueued && !t.wait_reported) {
            t.wait_reported = true;
            ReportWaitLocked(t.tag, t.direction, first ? 0 : MonotonicNanos() - start);
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
        WaitForProgress(std::min(sleep_until - now, left));
      } else if (now >= spin_until) {
        WaitForProgress(std::min<uint64_t>(left, 50'000'000));
      }
    }
  }

  Result<bool> Poll(TransferState& t) {
    std::lock_guard<std::mutex> l(ring_mu_);
    ReapLocked();
    if (t.done) {
      if (!t.status.ok()) return t.status;
      return true;
    }
    FERRY_RETURN_IF_ERROR(broken_);
    return false;
  }

  // One probe spans the whole batch: a probe's two timing events cost the stream ~1 us each
  // (H200), which a stall measured between them leaves out, so six waits probed one by one read
  // ~14 us a step below what the stream lost (docs/design.md, "Measured and reported figures").
  // The probe starts before this thread waits for ferryd to enqueue the copies: meanwhile the
  // stream has nothing of the caller's to run, and that is exposed time too. The stall is
  // reported against the batch's newest copy, whose lifetime at ferryd bounds the whole span.
  Status StreamWait(std::span<TransferState* const> batch, void* stream) {
    if (device_->StreamWaitIsHostWait()) {
      for (TransferState* t : batch) FERRY_RETURN_IF_ERROR(Wait(*t, 3600ull * 1'000'000'000ull, false));
      return Status::Ok();
    }
    for (TransferState* t : batch) {
      if (!t->event && !t->done) return InvalidArgument("StreamWait needs a copy submitted with stream_waitable = true");
    }
    StallProbe p;
    {
      std::lock_guard<std::mutex> l(ring_mu_);
      for (TransferState* t : batch) {
        if (!t->done && !t->wait_reported) {
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
      p.direction = newest->direction;
      stall_probes_.push_back(p);
    } else if (p.start) {
      free_probes_.push_back(p);
    }
    return Status::Ok();
  }

  UniqueFd sock_;
  std::mutex ctl_mu_;
  uint32_t seq_ = 0;
  int timeout_ms_ = 5000;

  Mapping ring_;
  wire::RingHeader* hdr_ = nullptr;
  wire::SubmissionEntry* sq_ = nullptr;
  wire::CompletionEntry* cq_ = nullptr;
  uint32_t sq_entries_ = 0, cq_entries_ = 0;
  UniqueFd submit_efd_, complete_efd_;

  std::mutex ring_mu_;  // guards the rings' local indices, pending_, free_events_, the probes, broken_
  uint32_t sq_tail_ = 0, cq_head_ = 0;
  uint64_t next_tag_ = 1;
  uint32_t outstanding_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<TransferState>> pending_;
  std::vector<std::shared_ptr<EventState>> free_events_;
  std::vector<StallProbe> stall_probes_, free_probes_;
  Status broken_;

  std::mutex wait_mu_;  // guards the four below
  int waiters_ = 0;
  bool polling_ = false;  // a waiter is in ppoll on the doorbell
  uint64_t wake_gen_ = 0;
  std::condition_variable wake_cv_;
  std::atomic<bool> broken_flag_{false};  // broken_ is not ok (readable without ring_mu_)
  uint64_t spin_ns_ = 50'000;
  static constexpr uint64_t kEnqueueSpinNs = 3'000'000;
  std::atomic<uint32_t> reaped_to_{0};  // cq_head_ after the last reap, readable without ring_mu_

  std::mutex map_mu_;
  std::map<uint32_t, std::weak_ptr<SlabMapping>> slab_maps_;

  uint64_t session_id_ = 0;
  uint64_t slab_bytes_ = 0;
  int device_ordinal_ = 0;
  BackendKind backend_ = BackendKind::kHost;
  std::unique_ptr<ClientDevice> device_;
};

EventState::~EventState() {
  // The daemon closes its side when the session ends; the client's event goes now.
  if (auto c = core.lock()) c->device_->DestroyEvent(ev.event);
}

HostBufferState::~HostBufferState() {
  if (auto c = core.lock()) (void)c->CallSimple(wire::MsgType::kFreeBuffer, wire::FreeBufferRequest{pool_offset});
}

DeviceRegionState::~DeviceRegionState() {
  if (auto c = core.lock()) (void)c->CallSimple(wire::MsgType::kUnregisterDevice, wire::UnregisterDeviceRequest{id, 0});
}

}  // namespace detail

std::string DefaultSocketPath() {
  if (const char* s = std::getenv("FERRY_SOCKET"); s != nullptr && *s != '\0') return s;
  return "/run/ferry/ferryd.sock";
}

HostBuffer::HostBuffer(std::shared_ptr<detail::HostBufferState> s) : s_(std::move(s)) {}
HostBuffer::HostBuffer(HostBuffer&&) noexcept = default;
HostBuffer& HostBuffer::operator=(HostBuffer&&) noexcept = default;
HostBuffer::~HostBuffer() = default;
std::byte* HostBuffer::data() const { return s_ ? s_->data : nullptr; }
size_t HostBuffer::size() const { return s_ ? s_->size : 0; }

DeviceRegion::DeviceRegion(std::shared_ptr<detail::DeviceRegionState> s) : s_(std::move(s)) {}
DeviceRegion::DeviceRegion(DeviceRegion&&) noexcept = default;
DeviceRegion& DeviceRegion::operator=(DeviceRegion&&) noexcept = default;
DeviceRegion::~DeviceRegion() = default;
void* DeviceRegion::data() const { return s_ ? s_->ptr : nullptr; }
size_t DeviceRegion::size() const { return s_ ? s_->size : 0; }

DeviceAllocation::DeviceAllocation(std::shared_ptr<detail::DeviceAllocationState> s) : s_(std::move(s)) {}
DeviceAllocation::DeviceAllocation(DeviceAllocation&&) noexcept = default;
DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&&) noexcept = default;
DeviceAllocation::~DeviceAllocation() = default;
void* DeviceAllocation::data() const { return s_ ? s_->ptr : nullptr; }
size_t DeviceAllocation::size() const { return s_ ? s_->size : 0; }
bool DeviceAllocation::host_visible() const { return s_ && s_->host_visible; }

SharedEvent::SharedEvent(std::shared_ptr<detail::EventState> s) : s_(std::move(s)) {}
SharedEvent::SharedEvent(SharedEvent&&) noexcept = default;
SharedEvent& SharedEvent::operator=(SharedEvent&&) noexcept = default;
SharedEvent::~SharedEvent() = default;
Status SharedEvent::Record(void* stream) {
  if (!s_) return InvalidArgument("empty SharedEvent");
  auto c = s_->core.lock();
  if (!c) return Unavailable("the client that made this event is gone");
  return c->device_->RecordEvent(s_->ev.event, stream);
}

Transfer::Transfer(std::shared_ptr<detail::ClientCore> core, std::shared_ptr<detail::TransferState> s)
    : core_(std::move(core)), s_(std::move(s)) {}
Result<bool> Transfer::Poll() {
  if (!s_) return InvalidArgument("empty Transfer");
  return core_->Poll(*s_);
}
Status Transfer::Wait(std::chrono::microseconds timeout) {
  if (!s_) return InvalidArgument("empty Transfer");
  return core_->Wait(*s_, static_cast<uint64_t>(timeout.count()) * 1000, false);
}
Status Transfer::StreamWait(void* stream) {
  if (!s_) return InvalidArgument("empty Transfer");
  detail::TransferState* const one[] = {s_.get()};
  return core_->StreamWait(one, stream);
}
size_t Transfer::bytes() const { return s_ ? s_->bytes : 0; }
std::chrono::nanoseconds Transfer::latency() const {
  if (!s_ || s_->complete_ns == 0) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(s_->complete_ns - s_->submit_ns);
}

Client::Client(std::shared_ptr<detail::ClientCore> core) : core_(std::move(core)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ConnectOptions& options) {
  auto core = std::make_shared<detail::ClientCore>();
  FERRY_RETURN_IF_ERROR(core->Connect(options));
  return std::unique_ptr<Client>(new Client(std::move(core)));
}

BackendKind Client::backend() const { return core_->backend_; }
int Client::device_ordinal() const { return core_->device_ordinal_; }
uint64_t Client::session_id() const { return core_->session_id_; }

Status Client::StreamWait(std::span<Transfer> transfers, void* cuda_stream) {
  std::vector<detail::TransferState*> batch;
  batch.reserve(transfers.size());
  for (Transfer& t : transfers) {
    if (!t.s_) return InvalidArgument("empty Transfer");
    if (t.core_ != core_) return InvalidArgument("StreamWait: a transfer of another client");
    batch.push_back(t.s_.get());
  }
  return core_->StreamWait(batch, cuda_stream);
}

Result<HostBuffer> Client::AllocateHost(size_t bytes) {
  FERRY_ASSIGN_OR_RETURN(auto s, core_->AllocateHost(bytes));
  return HostBuffer(std::move(s));
}

Result<DeviceAllocation> Client::AllocateDevice(size_t bytes) {
  FERRY_ASSIGN_OR_RETURN(auto s, core_->device_->Allocate(bytes));
  return DeviceAllocation(std::move(s));
}

Result<DeviceRegion> Client::RegisterDevice(void* ptr, size_t bytes) {
  FERRY_ASSIGN_OR_RETURN(auto s, core_->Register(ptr, bytes));
  return DeviceRegion(std::move(s));
}

Result<SharedEvent> Client::CreateEvent() {
  FERRY_ASSIGN_OR_RETURN(auto s, core_->NewEvent());
  return SharedEvent(std::move(s));
}

Result<Transfer> Client::Copy(Direction direction, const HostBuffer& host, size_t host_offset, const DeviceRegion& device,
                              size_t device_offset, size_t bytes, const CopyOptions& options) {
  if (!host.s_ || !device.s_) return InvalidArgument("empty HostBuffer or DeviceRegion");
  if (host.s_->core.lock() != core_ || device.s_->core.lock() != core_) {
    return InvalidArgument("buffer or region belongs to another connection");
  }
  if (bytes == 0) return InvalidArgument("copy of 0 bytes");
  if (host_offset > host.size() || bytes > host.size() - host_offset) {
    return InvalidArgument("host range [" + std::to_string(host_offset) + ", +" + std::to_string(bytes) +
                           ") runs past the buffer's " + std::to_string(host.size()) + " bytes");
  }
  if (device_offset > device.size() || bytes > device.size() - device_offset) {
    return InvalidArgument("device range [" + std::to_string(device_offset) + ", +" + std::to_string(bytes) +
                           ") runs past the region's " + std::to_string(device.size()) + " bytes");
  }
  wire::SubmissionEntry e{};
  e.opcode = static_cast<uint16_t>(direction == Direction::kHostToDevice ? wire::Opcode::kHostToDevice
                                                                         : wire::Opcode::kDeviceToHost);
  e.priority = static_cast<uint16_t>(options.priority == Priority::kLatency ? wire::Priority::kLatency : wire::Priority::kBulk);
  e.pool_offset = host.s_->pool_offset + host_offset;
  e.length = bytes;
  e.device_offset = device.s_->offset_in_base + device_offset;
  e.region_id = device.s_->id;
  if (options.after != nullptr) {
    if (!options.after->s_) return InvalidArgument("empty SharedEvent");
    e.wait_event_id = options.after->s_->id;
  }
  auto t = std::make_shared<detail::TransferState>();
  t->bytes = bytes;
  t->direction = direction == Direction::kHostToDevice ? 0 : 1;
  t->host_keep = host.s_;
  t->region_keep = device.s_;
  FERRY_ASSIGN_OR_RETURN(auto st, core_->Submit(e, std::move(t), options.stream_waitable));
  return Transfer(core_, std::move(st));
}

namespace detail {

// The staged path's helpers: persistent copy threads and the pool buffers kept between copies.
// Staged copies of one client take turns (Exclusive); the rest is called by the turn's holder.
class Stager {
 public:
  // The policy's staging settings, asked of ferryd at most once a second (a round trip costs
  // tens of microseconds, a copy of 64 MiB 1.5 ms); a new policy reaches staged copies within
  // that second.
  Result<wire::StagingReply> Settings(const std::function<Result<wire::StagingReply>()>& ask) {
    std::lock_guard<std::mutex> l(settings_mu_);
    const uint64_t now = MonotonicNanos();
    if (settings_at_ == 0 || now - settings_at_ > 1'000'000'000ull) {
      FERRY_ASSIGN_OR_RETURN(settings_, ask());
      settings_at_ = now;
    }
    return settings_;
  }

  ~Stager() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  std::unique_lock<std::mutex> Exclusive() { return std::unique_lock<std::mutex>(turn_mu_); }

  // Runs `task` on `n` threads, the caller being one of them (the others are started on first
  // need and kept), and returns when all are done. Workers spin a little before they sleep, so
  // back-to-back staged copies do not pay a wake-up for each of them (on the H200's VM host a
  // futex wake costs tens of microseconds, and the workers' wake-ups came one after another).
  void RunOnThreads(int n, const std::function<void()>& task) {
    {
      std::lock_guard<std::mutex> l(mu_);
      // A new worker starts from the generation before this run's, so it takes part in it.
      const uint64_t before = generation_.load(std::memory_order_relaxed);
      while (static_cast<int>(threads_.size()) < n - 1) {
        threads_.emplace_back([this, before] {
          ::pthread_setname_np(::pthread_self(), "ferry-stage");  // for top -H and the tests
          Work(before);
        });
      }
      task_ = &task;
      running_.store(n - 1, std::memory_order_relaxed);
      tickets_ = n - 1;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    task();
    SpinFor(kSpinNs, [&] { return running_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return running_.load(std::memory_order_acquire) == 0; });
    task_ = nullptr;
  }

  // Up to `count` pool buffers of at least `bytes`: kept ones first, then new ones while the
  // pool gives them. An error only when not even one could be had.
  Result<std::vector<HostBuffer>> TakeBuffers(Client& c, size_t bytes, size_t count) {
    std::vector<HostBuffer> out;
    std::erase_if(kept_, [&](HostBuffer& b) {
      if (b.size() < bytes) return true;  // too small for this chunk size: give its room back
      if (out.size() == count) return false;
      out.push_back(std::move(b));
      return true;
    });
    while (out.size() < count) {
      auto b = c.AllocateHost(bytes);
      if (!b.ok()) {
        if (out.empty()) return b.status();
        break;
      }
      out.push_back(std::move(*b));
    }
    return out;
  }
  void KeepBuffers(std::vector<HostBuffer> buffers) {
    for (auto& b : buffers) kept_.push_back(std::move(b));
  }

 private:
  void Work(uint64_t seen) {
    for (;;) {
      SpinFor(kSpinNs, [&] {
        return generation_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_relaxed);
      });
      const std::function<void()>* task;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen; });
        if (stop_.load(std::memory_order_relaxed)) return;
        seen = generation_.load(std::memory_order_acquire);
        // More workers than this run asked for: the rest wait for the next.
        if (tickets_ <= 0) continue;
        --tickets_;
        task = task_;
      }
      (*task)();
      if (running_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> l(mu_);
        done_cv_.notify_all();
      }
    }
  }

  static constexpr uint64_t kSpinNs = 200'000;
  std::mutex settings_mu_;
  wire::StagingReply settings_{};
  uint64_t settings_at_ = 0;
  std::mutex turn_mu_;
  std::vector<HostBuffer> kept_;  // guarded by turn_mu_
  std::mutex mu_;                 // guards the fields below
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> threads_;
  const std::function<void()>* task_ = nullptr;
  int tickets_ = 0;                       // workers still to join this run (guarded by mu_)
  std::atomic<int> running_{0};           // workers of this run not yet done
  std::atomic<uint64_t> generation_{0};   // one more each run; spun on, so atomic
  std::atomic<bool> stop_{false};
};

// One staged copy, cut into chunks of `chunk` bytes and each chunk into slices of `slice`
// bytes. All threads work on the same chunk at once, taking its slices in order; chunk j lives
// in pool buffer slot j % slots. Host to device, the thread that stages a chunk's last slice
// submits its DMA, and the slot takes chunk j + slots once that DMA has landed. Device to host,
// chunk j + slots is submitted into the slot once the last slice of chunk j has been copied
// out. So the DMA starts after one chunk, not one chunk a thread, and ends one chunk after the
// host copies (with a chunk a thread, filling and draining cost a fifth of a 64 MiB copy).
//
// Thread-safety: the hand-offs are atomics that threads spin on briefly (a chunk's slices take
// tens of microseconds; a mutex the eight threads queue on at every chunk cost more than that on
// the H200's host). A slot's mutex only guards its Transfer: whoever holds it waits for the DMA.
class StagedPipeline {
 public:
  using Submit = std::function<Result<Transfer>(const HostBuffer&, uint64_t offset, uint64_t len)>;

  StagedPipeline(Direction direction, std::byte* host, uint64_t bytes, uint64_t chunk, uint64_t slice,
                 std::vector<HostBuffer> buffers, Submit submit)
      : direction_(direction),
        host_(host),
        bytes_(bytes),
        chunk_(chunk),
        slice_(slice),
        chunks_((bytes + chunk - 1) / chunk),
        slices_per_chunk_((chunk + slice - 1) / slice),
        slots_(buffers.size()),
        submit_(std::move(submit)) {
    const auto n = static_cast<int64_t>(slots_.size());
    for (int64_t k = 0; k < n; ++k) {
      Slot& s = slots_[k];
      s.buf = std::move(buffers[k]);
      // Before the first chunk, each slot acts as if the chunk `slots` before its first had
      // been sent and had landed: host to device, it is open for its first chunk.
      s.sent = k - n;
      s.landed = k - n;
      s.open = k;
      s.left = static_cast<uint64_t>(k) < chunks_ ? ChunkLen(k) : 0;
    }
  }

  uint64_t slices() const { return chunks_ * slices_per_chunk_; }

  // Device to host: the first chunks' DMAs go out before any thread starts.
  void Start() {
    if (direction_ != Direction::kDeviceToHost) return;
    for (size_t k = 0; k < slots_.size() && k < chunks_; ++k) {
      if (Status st = Send(slots_[k], k); !st.ok()) return Fail(st);
    }
  }

  // What each thread runs: takes slices until none are left or the copy has failed.
  void Work() {
    for (uint64_t g; !failed_.load(std::memory_order_relaxed) && (g = next_.fetch_add(1)) < slices();) {
      const uint64_t j = g / slices_per_chunk_;
      const uint64_t in_chunk = (g % slices_per_chunk_) * slice_;
      const uint64_t chunk_len = ChunkLen(j);
      if (in_chunk >= chunk_len) continue;  // the last chunk is short
      const uint64_t len = std::min(slice_, chunk_len - in_chunk);
      std::byte* host = host_ + j * chunk_ + in_chunk;
      Status st =
          direction_ == Direction::kHostToDevice ? StageIn(j, in_chunk, host, len) : StageOut(j, in_chunk, host, len);
      if (!st.ok()) return Fail(st);
    }
  }

  // After every thread has returned: waits for the DMAs still in flight (their buffers must
  // not be reused before) and hands the buffers back. The first error, if any.
  Status Finish(std::vector<HostBuffer>& buffers) {
    for (Slot& s : slots_) {
      std::lock_guard<std::mutex> l(s.mu);
      if (s.transfer) {
        Status st = s.transfer->Wait(std::chrono::seconds(60));
        if (!st.ok()) Fail(st);
      }
      buffers.push_back(std::move(*s.buf));
    }
    std::lock_guard<std::mutex> l(err_mu_);
    return first_error_;
  }

 private:
  struct Slot {
    std::atomic<int64_t> sent{0};      // the last chunk whose DMA was submitted from this slot
    std::atomic<int64_t> landed{0};    // the last chunk whose DMA is known to have landed
    std::atomic<int64_t> open{0};      // host to device: the chunk being staged into it
    std::atomic<uint64_t> left{0};     // bytes of the current chunk not yet staged in or copied out
    std::mutex mu;                     // guards transfer
    std::optional<Transfer> transfer;  // the DMA of chunk `sent`, until someone waited for it
    std::optional<HostBuffer> buf;     // always set until Finish
  };

  uint64_t ChunkLen(uint64_t j) const { return std::min(chunk_, bytes_ - j * chunk_); }

  Status Send(Slot& s, uint64_t j) {
    {
      std::lock_guard<std::mutex> l(s.mu);
      FERRY_ASSIGN_OR_RETURN(Transfer t, submit_(*s.buf, j * chunk_, ChunkLen(j)));
      s.transfer = std::move(t);
    }
    s.sent.store(static_cast<int64_t>(j), std::memory_order_release);
    return Status::Ok();
  }

  // Spins until `ready()`; whoever first finds `claimable()` and the slot's mutex free runs
  // `claim()` (which waits for a DMA) while the others keep spinning. After a short spin the
  // waiters yield, then nap: a DMA queued behind other clients' copies may take a while.
  template <typename Ready, typename Claimable, typename Claim>
  Status Await(Slot& s, Ready ready, Claimable claimable, Claim claim) {
    for (uint32_t spins = 0;; ++spins) {
      if (ready()) return Status::Ok();
      if (failed_.load(std::memory_order_relaxed)) return Status::Ok();  // Work() stops next
      if (claimable() && s.mu.try_lock()) {
        Status st;
        if (!ready()) st = claim();
        s.mu.unlock();
        return st;
      }
      if (spins < 2000) {
        CpuRelax();
      } else if (spins < 4000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  // Waits (holding the slot's mutex) for the DMA of chunk `sent`.
  static Status LandedLocked(Slot& s) {
    if (!s.transfer) return Status::Ok();
    Status st = s.transfer->Wait(std::chrono::seconds(60));
    s.transfer.reset();
    s.landed.store(s.sent.load(std::memory_order_acquire), std::memory_order_release);
    return st;
  }

  Status StageIn(uint64_t j, uint64_t in_chunk, std::byte* host, uint64_t len) {
    Slot& s = slots_[j % slots_.size()];
    const auto jj = static_cast<int64_t>(j), before = jj - static_cast<int64_t>(slots_.size());
    // The slot is open for chunk j once chunk j - slots, sent from it, has landed.
    FERRY_RETURN_IF_ERROR(Await(
        s, [&] { return s.open.load(std::memory_order_acquire) == jj; },
        [&] { return s.sent.load(std::memory_order_acquire) == before; },
        [&] {
          Status st = LandedLocked(s);
          s.left.store(ChunkLen(j), std::memory_order_relaxed);
          s.open.store(jj, std::memory_order_release);
          return st;
        }));
    if (failed_.load(std::memory_order_relaxed)) return Status::Ok();
    StagedCopyIn(s.buf->data() + in_chunk, host, len);
    if (s.left.fetch_sub(len, std::memory_order_acq_rel) == len) return Send(s, j);
    return Status::Ok();
  }

  Status StageOut(uint64_t j, uint64_t in_chunk, std::byte* host, uint64_t len) {
    Slot& s = slots_[j % slots_.size()];
    const auto jj = static_cast<int64_t>(j);
    FERRY_RETURN_IF_ERROR(Await(
        s, [&] { return s.landed.load(std::memory_order_acquire) == jj; },
        [&] { return s.sent.load(std::memory_order_acquire) == jj; }, [&] { return LandedLocked(s); }));
    if (failed_.load(std::memory_order_relaxed)) return Status::Ok();
    StagedCopyOut(host, s.buf->data() + in_chunk, len);
    if (s.left.fetch_sub(len, std::memory_order_acq_rel) == len) {
      const uint64_t next = j + slots_.size();
      if (next < chunks_ && !failed_.load(std::memory_order_relaxed)) {
        s.left.store(ChunkLen(next), std::memory_order_relaxed);  // published by Send's release
        return Send(s, next);
      }
    }
    return Status::Ok();
  }

  // Records the first error; the other threads see failed_ and stop.
  void Fail(const Status& st) {
    {
      std::lock_guard<std::mutex> l(err_mu_);
      if (first_error_.ok()) first_error_ = st;
    }
    failed_ = true;
  }

  const Direction direction_;
  std::byte* const host_;
  const uint64_t bytes_, chunk_, slice_, chunks_, slices_per_chunk_;
  std::vector<Slot> slots_;
  const Submit submit_;
  std::atomic<uint64_t> next_{0};
  std::atomic<bool> failed_{false};
  std::mutex err_mu_;
  Status first_error_;  // guarded by err_mu_
};

}  // namespace detail

Status Client::CopyStaged(Direction direction, void* host, const DeviceRegion& device, size_t device_offset,
                          size_t bytes, const StagedCopyOptions& options) {
  if (host == nullptr) return InvalidArgument("CopyStaged: host pointer is null");
  if (bytes == 0) return InvalidArgument("copy of 0 bytes");
  if (!device.s_) return InvalidArgument("empty DeviceRegion");
  if (device_offset > device.size() || bytes > device.size() - device_offset) {
    return InvalidArgument("device range [" + std::to_string(device_offset) + ", +" + std::to_string(bytes) +
                           ") is outside the region of " + std::to_string(device.size()) + " bytes");
  }
  {
    static std::mutex create_mu;
    std::lock_guard<std::mutex> l(create_mu);
    if (!stager_) stager_ = std::make_shared<detail::Stager>();
  }
  uint64_t chunk = options.chunk_bytes;
  int threads = options.threads;
  uint32_t buffers = 8;
  if (chunk == 0 || threads <= 0) {
    FERRY_ASSIGN_OR_RETURN(wire::StagingReply r, stager_->Settings([&]() -> Result<wire::StagingReply> {
      FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, core_->Call(wire::MsgType::kGetStaging, wire::GetStagingRequest{},
                                                            wire::MsgType::kStagingReply));
      auto reply = m.As<wire::StagingReply>();
      FERRY_RETURN_IF_ERROR(FromWire(reply.status));
      return reply;
    }));
    // The policy's threads, but no more than this process may run at once: more only queue.
    if (threads <= 0) threads = static_cast<int>(std::min<uint32_t>(r.threads, detail::UsableCpus()));
    if (chunk == 0) {
      // The policy's chunk, but small enough that a copy has a few dozen: the DMA starts after
      // the first chunk is staged and the last chunk's DMA comes after all host copies, so
      // small chunks make a short pipeline fill and drain.
      constexpr uint64_t kChunksPerCopy = 32, kMinChunk = 512ull << 10, kAlign = 64ull << 10;
      const uint64_t fit = (bytes / kChunksPerCopy + kAlign - 1) / kAlign * kAlign;
      chunk = std::min<uint64_t>(r.chunk_bytes, std::max(kMinChunk, fit));
    }
    buffers = std::max<uint32_t>(r.buffers, 2);
  }
  if (chunk == 0 || threads <= 0) return InvalidArgument("staging chunk size and threads must be positive");
  // Each thread copies a slice of the chunk at hand: a chunk is staged by all threads at once.
  constexpr uint64_t kMinSlice = 64ull << 10, kPage = 4096;
  const uint64_t slice = std::max(kMinSlice, (chunk / static_cast<uint64_t>(threads) + kPage - 1) / kPage * kPage);
  const uint64_t chunks = (bytes + chunk - 1) / chunk;

  auto turn = stager_->Exclusive();
  auto bufs = stager_->TakeBuffers(*this, std::min<uint64_t>(chunk, bytes), std::min<uint64_t>(buffers, chunks));
  if (!bufs.ok()) return bufs.status().WithContext("staging buffer");
  detail::StagedPipeline pipeline(direction, static_cast<std::byte*>(host), bytes, chunk, slice, std::move(*bufs),
                                  [&](const HostBuffer& buf, uint64_t offset, uint64_t len) {
                                    return Copy(direction, buf, 0, device, device_offset + offset, len,
                                                {.priority = options.priority});
                                  });
  pipeline.Start();
  const auto n = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(threads), pipeline.slices()));
  const std::function<void()> task = [&] { pipeline.Work(); };
  stager_->RunOnThreads(n, task);
  std::vector<HostBuffer> back;
  Status st = pipeline.Finish(back);
  stager_->KeepBuffers(std::move(back));
  return st;
}

Result<DaemonStats> Client::Stats() {
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, core_->Call(wire::MsgType::kStats, wire::StatsRequest{}, wire::MsgType::kStatsReply));
  auto r = m.As<wire::StatsReply>();
  FERRY_RETURN_IF_ERROR(FromWire(r.status));
  return DaemonStats{r.sessions, r.copies_completed, r.bytes_h2d, r.bytes_d2h, r.pool_bytes, r.pool_free_bytes, r.evictions, r.rejected};
}

}  // namespace ferry
