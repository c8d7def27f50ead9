// The session core of libferry: one connection to ferryd (hello, control calls) and its shared
// rings (submit, reap, waits, the stall probes of stream waits). The public objects of
// ferry/client.hpp are thin handles on the states below.
//
// Thread-safety: every method may be called from several threads at once.
// Ownership: a state's `core` is weak; a Transfer holds its core, so a copy can be waited on after
// its Client is gone.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "client/device_api.hpp"
#include "common/channel.hpp"
#include "common/status_macros.hpp"
#include "ferry/client.hpp"

namespace ferry::detail {

class ClientCore;

struct SlabMapping {
  Mapping m;
};

struct EventState {
  std::weak_ptr<ClientCore> core;
  DeviceEvent ev;
  uint32_t id = 0;
  // GPU-side "after": the event's word in the ring segment's flag area (nullptr: none, ferryd
  // polls the event). Each record writes its number there from the recording stream; a copy
  // after the event waits for the number of the last record before it was submitted.
  uint32_t* flag = nullptr;
  std::atomic<uint32_t> records{0};
  ~EventState();
};

// Orders the copy `e` after the last record of `after`.
inline void OrderAfter(wire::SubmissionEntry& e, const EventState& after) {
  e.wait_event_id = after.id;
  e.wait_value = after.flag != nullptr ? after.records.load(std::memory_order_acquire) : 0;
}

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
  bool watch_done_word = false;  // a latency copy after nothing: ferryd's engines may write its done word
  const std::atomic<uint32_t>* done_word = nullptr;  // set at submission when watch_done_word
  Status status;
  uint64_t submit_ns = 0, complete_ns = 0;
  std::shared_ptr<EventState> event;           // completion event, when stream-waitable
  std::shared_ptr<HostBufferState> host_keep;  // buffers stay mapped while the copy runs
  std::shared_ptr<DeviceRegionState> region_keep;
  // A block list's pool buffer (ClientCore::AcquireListBuffer): ferryd may read it until the copy
  // completes, then it goes back to the core's cache.
  std::shared_ptr<HostBufferState> list_keep;
};

// How the running policy says to stage pageable memory (its staging section).
struct PolicyStaging {
  uint64_t chunk_bytes = 0;
  uint32_t threads = 0;
  uint32_t buffers = 0;
};

class ClientCore : public std::enable_shared_from_this<ClientCore> {
 public:
  ~ClientCore();

  // The running policy's staging settings, as ferryd last wrote them into this session's ring
  // header (at hello, and after every policy switch). Any thread.
  PolicyStaging Staging() const;

  // Connects and says hello: maps the rings and sets up the device the daemon's backend uses.
  Status Connect(const ConnectOptions& o);

  // One request, one reply, under the control lock.
  template <typename T>
  Result<ReceivedMessage> Call(wire::MsgType type, const T& payload, wire::MsgType reply_type, const int* fds = nullptr,
                               size_t nfds = 0) {
    std::lock_guard<std::mutex> l(ctl_mu_);
    if (!sock_.valid()) return Unavailable("not connected to ferryd");
    const uint32_t seq = ++seq_;
    Status st = Send(sock_.get(), type, seq, payload, fds, nfds);
    if (!st.ok()) return Unavailable("ferryd went away: " + st.message());
    auto m = RecvMessage(sock_.get(), timeout_ms_, Sender::kFerryd);
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

  Result<std::shared_ptr<HostBufferState>> AllocateHost(size_t bytes);
  Result<std::shared_ptr<DeviceRegionState>> Register(void* ptr, size_t bytes);
  // ordered_after: copies will be ordered after it (it gets a flag, where ferryd has one left).
  Result<std::shared_ptr<EventState>> NewEvent(bool ordered_after);
  // Records `ev` on `stream` and, when it has a flag, writes the record's number there.
  Status RecordEvent(EventState& ev, void* stream);
  // Records `ev` on the core's relay stream once `foreign_event` (any CUDA event of this
  // process) has happened: GPU-side, no host wait. One relay stream per session, so records made
  // this way are ordered among themselves.
  Status RecordEventAfter(EventState& ev, void* foreign_event);

  // Puts `e` on the submission ring for `t` (waiting up to 1 s for room), with a completion
  // event when `want_event`. `more`: slots that belong to the request and follow `e` (a block
  // list's BlockListEntry and inline list), published with it by one tail store; the group is at
  // most sq_entries() slots.
  Result<std::shared_ptr<TransferState>> Submit(wire::SubmissionEntry e, std::shared_ptr<TransferState> t,
                                                bool want_event, std::span<const wire::SubmissionEntry> more = {});
  // A pool buffer of at least `bytes` (at most kMaxListBufferBytes) for a block list: from the
  // cache when one is free, else allocated. Hand it to the copy's TransferState::list_keep; it
  // returns to the cache when the copy completes.
  static constexpr size_t kMinListBufferBytes = 64 << 10;
  static constexpr size_t kListBufferClasses = 7;  // 64 KiB .. 4 MiB, powers of two
  static constexpr size_t kMaxListBufferBytes = kMinListBufferBytes << (kListBufferClasses - 1);
  Result<std::shared_ptr<HostBufferState>> AcquireListBuffer(size_t bytes);
  // Until `t` is done (or, `until_enqueued`, until ferryd has enqueued it), at most timeout_ns.
  Status Wait(TransferState& t, uint64_t timeout_ns, bool until_enqueued);
  Result<bool> Poll(TransferState& t);
  // Makes `stream` wait on the GPU for every copy in `batch`.
  Status StreamWait(std::span<TransferState* const> batch, void* stream);

  BackendKind backend() const { return backend_; }
  int device_ordinal() const { return device_ordinal_; }
  const std::string& gpu_uuid() const { return gpu_uuid_; }
  int numa_node() const { return numa_node_; }
  uint32_t sq_entries() const { return sq_entries_; }
  uint64_t session_id() const { return session_id_; }
  ClientDevice& device() { return *device_; }

 private:
  // A stream's stall on a StreamWait, measured on the GPU by timing events recorded around
  // the wait, and reported like a host wait once the second event has happened.
  struct StallProbe {
    void* start = nullptr;
    void* end = nullptr;
    uint64_t tag = 0;
  };
  static constexpr size_t kMaxStallProbes = 256;  // beyond this many unread, waits go unmeasured
  // StreamWait where the stream is the calling thread: a host wait of the batch, one report.
  Status HostStreamWait(std::span<TransferState* const> batch);

  // The methods named *Locked are called with ring_mu_ held.
  void ReportWaitLocked(uint64_t tag, uint64_t blocked_ns);
  void WakeDaemonIfAsleep();
  void ReapLocked();
  void CollectStallsLocked();
  StallProbe TakeProbeLocked();
  void RecycleListBufferLocked(std::shared_ptr<HostBufferState> b);
  void Break(const Status& why);
  // Whether the engines wrote `t`'s tag into its done word: the copy is done, its completion
  // not necessarily reaped yet. Any thread, no lock.
  static bool DoneByWord(const TransferState& t) {
    return t.done_word != nullptr && t.done_word->load(std::memory_order_acquire) == static_cast<uint32_t>(t.tag);
  }
  // Caller holds ring_mu_: `t` reads as done (done, or done by its word).
  bool SeenDoneLocked(TransferState& t);
  void WaitForProgress(uint64_t timeout_ns, uint32_t seen_tail, std::optional<uint32_t> seen_head = std::nullopt);
  void PublishClientStateLocked();

  UniqueFd sock_;
  std::mutex ctl_mu_;
  uint32_t seq_ = 0;
  int timeout_ms_ = 5000;

  Mapping ring_;
  wire::RingHeader* hdr_ = nullptr;
  wire::SubmissionEntry* sq_ = nullptr;
  wire::CompletionEntry* cq_ = nullptr;
  std::atomic<uint32_t>* done_words_ = nullptr;  // the ring segment's, written by ferryd's engines
  bool stall_probes_on_ = true;                  // FERRY_STALL_PROBES=0 turns them off
  uint32_t sq_entries_ = 0, cq_entries_ = 0;
  UniqueFd submit_efd_, complete_efd_;
  uint32_t* flags_ = nullptr;  // the ring segment's flag area
  Status MapDeviceFlags(const ReceivedMessage& reply, uint64_t bytes);
  // Held over a flagged event's registration and the mapping its reply may bring, so that the
  // reply carrying the device flags is mapped before a later reply that names them is looked at.
  std::mutex flag_events_mu_;
  std::atomic<bool> device_flags_failed_{false};  // their mapping failed: events go unflagged
  std::mutex flags_mu_;        // guards flags_mapped_, flags_on_device_
  bool flags_mapped_ = false;  // by the device (MapFlags), on the first record of a flagged event
  bool flags_on_device_ = false;  // ... or MapDeviceFlags, on the reply that shared them

  std::mutex ring_mu_;  // guards the rings' local indices, pending_, free_events_, free_lists_, the probes, broken_
  uint32_t sq_tail_ = 0, cq_head_ = 0;
  uint64_t next_tag_ = 1;
  uint32_t outstanding_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<TransferState>> pending_;
  std::vector<std::shared_ptr<EventState>> free_events_;
  // Free block-list buffers by size class (kMinListBufferBytes << class). A class keeps
  // kCachedListBytes' worth (at least 2): enough for a step's lists, one per layer, to find theirs
  // here. AcquireListBuffer frees the rest outside ring_mu_ (a free is a round trip on the socket).
  static constexpr size_t kCachedListBytes = 8 << 20;
  std::vector<std::shared_ptr<HostBufferState>> free_lists_[kListBufferClasses];
  std::vector<StallProbe> stall_probes_, free_probes_;
  Status broken_;

  std::mutex wait_mu_;  // guards the five below
  int waiters_ = 0;
  int room_waiters_ = 0;  // ... of them waiting for room in the submission ring
  bool polling_ = false;  // a waiter is in ppoll on the doorbell
  uint64_t wake_gen_ = 0;
  std::condition_variable wake_cv_;
  std::atomic<bool> broken_flag_{false};  // broken_ is not ok (readable without ring_mu_)
  uint64_t spin_ns_ = 50'000;
  uint64_t sleep_cap_ns_ = 50'000'000;  // a waiter's longest sleep between looks at the ring
  static constexpr uint64_t kEnqueueSpinNs = 3'000'000;

  std::mutex relay_mu_;          // guards relay_stream_ and orders the relay's wait-then-record pairs
  void* relay_stream_ = nullptr;  // created on the first RecordEventAfter
  bool relay_created_ = false;

  std::mutex map_mu_;
  std::map<uint32_t, std::weak_ptr<SlabMapping>> slab_maps_;

  uint64_t session_id_ = 0;
  uint64_t slab_bytes_ = 0;
  int device_ordinal_ = 0;
  std::string gpu_uuid_;
  int numa_node_ = -1;
  BackendKind backend_ = BackendKind::kHost;
  std::unique_ptr<ClientDevice> device_;
};

}  // namespace ferry::detail
