// ferryd's scheduler: plans each accepted copy into pieces under the policy running when it was
// accepted, puts latency-class copies on the latency stream ahead of any bulk work, sends a copy
// "after" a flagged event to its session's lane at once (the GPU waits; outside the bulk
// in-flight windows, as it may wait long), holds other "after" copies
// until their event has happened, shares the copy engines between sessions with bulk
// work by weighted deficit round robin (per direction: each has its own engines) within the
// running policy's in-flight limits, and finishes a copy once its last fence is done.
// It knows sessions only by id and weight: no sockets, no rings (the Listener posts results).
// Event-loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "daemon/backend.hpp"
#include "daemon/block_list.hpp"
#include "daemon/running_policy.hpp"
#include "daemon/server.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

// Where the pool the copies' host side lies in is, and how it is cut into slabs.
struct PoolGeometry {
  std::byte* base = nullptr;
  uint64_t slab_bytes = 0;
};

// A copy read off a ring and validated, in ferryd's memory.
struct CopyRequest {
  uint64_t id = 0;  // unique among the copies not finished
  uint64_t session_id = 0;
  uint64_t user_tag = 0;
  uint32_t gpu = 0;             // its session's GPU, which its device memory is on
  Direction direction = Direction::kHostToDevice;
  uint64_t pool_offset = 0;     // the host side, in the pool
  std::byte* device = nullptr;  // the device side
  uint64_t bytes = 0;
  bool latency_requested = false;  // latency priority, and the session's class allows it
  SharedEvent* wait = nullptr;     // start after this event; owned by the session, which outlives its copies
  // Or start once this flag (in the session's ring segment) reaches wait_value, waited for on
  // the GPU: the copy goes to the backend at once, on its session's lane.
  uint32_t* wait_flag = nullptr;
  uint32_t wait_value = 0;
  SharedEvent* signal = nullptr;   // record this one once the copy is done
  // Optional, for a latency-class copy: the engines write done_value here once it is done.
  uint32_t* done_word = nullptr;
  uint32_t done_value = 0;
  uint64_t accepted_ns = 0;        // when it was read off the ring
  // The session's, handed back untouched in FinishedCopy: what it holds for the copy.
  uint64_t buffer_offset = 0;
  uint32_t region_id = 0;
  // A block list (blocks > 0): its pieces, as offsets from pool_offset and device; bytes is
  // their sum.
  uint32_t blocks = 0;
  std::vector<BlockPiece> block_pieces;
};

// What a finished copy was, for its session's completion and the observer.
struct FinishedCopy {
  uint64_t id = 0;
  uint64_t session_id = 0;
  uint64_t user_tag = 0;
  uint32_t gpu = 0;
  Direction direction = Direction::kHostToDevice;
  bool latency = false;
  uint64_t bytes = 0;
  Status status;                                                 // the first failure, or Ok
  std::string_view policy;                                       // the name of the policy it was planned under
  uint64_t accepted_ns = 0, first_dispatch_ns = 0, done_ns = 0;  // first_dispatch_ns: 0 if it never went out
  uint64_t buffer_offset = 0;                                    // as in its CopyRequest
  uint32_t region_id = 0;
  uint32_t blocks = 0;  // of a block list; 0 for a single copy
};

class Scheduler {
 public:
  // deficit round robin: bytes a session may send per visit, per unit of its class's weight.
  static constexpr uint64_t kQuantumBytes = 1ull << 20;
  // A piece larger than this goes once the deficit is full.
  static constexpr uint64_t kMaxDeficitBytes = 64ull << 20;

  class Listener {
   public:
    virtual ~Listener() = default;
    // The last piece of a copy that signals an event went to the engines: the client may wait
    // on the event from now on.
    virtual void OnCopyEnqueued(uint64_t session_id, uint64_t user_tag, uint64_t bytes) = 0;
    // Nothing of the copy is queued or on the engines any more.
    virtual void OnCopyFinished(const FinishedCopy& copy) = 0;
  };

  // All must outlive the scheduler. `counters`: in_flight, in_flight_bytes, queued_bytes,
  // copies_completed, copies_failed and bytes_* are kept here (and per GPU). `gpus`: how many
  // GPUs the backend drives (a DeviceSet's), each with its own copy engines: the policy's
  // in-flight limits and the round robin apply per GPU and direction, an "engine set".
  Scheduler(Backend& backend, PoolGeometry pool, const RunningPolicy& policy, ServerCounters& counters,
            Listener& listener, uint32_t gpus = 1);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // A session that may submit copies, with its class's weight.
  void AddSession(uint64_t session_id, uint32_t weight);
  void SetWeight(uint64_t session_id, uint32_t weight);
  // The GPU the session's copies go to (before it submits any).
  void SetGpu(uint64_t session_id, uint32_t gpu);
  // Once it has no copy left (its copies finish first).
  void RemoveSession(uint64_t session_id);

  // Accepts a copy, planned under the running policy: held until its wait event has happened,
  // else a latency copy goes to the engines now and a bulk copy is queued for Dispatch.
  // A block list is one copy, dispatched in units (SplitIntoUnits) of about the policy's piece
  // size, each unit's pieces on one bulk stream.
  void Submit(CopyRequest request);
  // Schedules the held copies whose wait event has happened. True if any was.
  bool ReleaseHeld();
  // Hands queued bulk pieces to the engines as the policy's limits and the weights allow.
  bool Dispatch();
  // Takes the engines' finished fences; finishes the copies they ended.
  bool PollBackend();
  // An evicted session: its queued and held copies never go out (and finish, failed or not,
  // as they are); the ones on the engines finish first.
  void CancelSession(uint64_t session_id);

  bool idle() const { return copies_.empty(); }         // no copy accepted and unfinished
  size_t fences_out() const { return fences_.size(); }  // pieces (groups) on the engines
  // The loop must not sleep: results come only by polling, or held copies wait on events.
  bool needs_polling() const { return (!fences_.empty() && backend_.completion_fd() < 0) || !held_.empty(); }

 private:
  // A client's copy, accepted and planned under the policy current at the time; dispatched
  // piece by piece (latency-class and stream-waitable copies: all at once) as limits allow.
  struct Copy {
    uint64_t id = 0;
    uint64_t session_id = 0;
    uint64_t user_tag = 0;
    uint32_t gpu = 0;
    uint64_t bytes = 0;
    uint64_t accepted_ns = 0, first_dispatch_ns = 0;
    uint64_t buffer_offset = 0;
    uint32_t region_id = 0;
    Direction direction = Direction::kHostToDevice;
    bool latency = false;
    std::shared_ptr<const Policy> policy;
    SharedEvent* wait = nullptr;
    SharedEvent* signal = nullptr;
    uint32_t* wait_flag = nullptr;  // on its session's lane (see CopyRequest)
    uint32_t wait_value = 0;
    uint32_t* done_word = nullptr;  // latency copies only
    uint32_t done_value = 0;
    std::vector<CopyPiece> pieces;  // stream chosen at dispatch
    size_t next = 0;                // first piece not yet dispatched
    // A block list's units: one past each unit's last piece. Empty: each piece is a unit.
    std::vector<size_t> unit_ends;
    size_t unit = 0;  // the next unit to dispatch
    uint32_t blocks = 0;
    uint32_t out = 0;               // fences dispatched and not yet done
    Status status;                  // the first failure
    bool WholeAtOnce() const;
    size_t UnitEnd(size_t unit_index, size_t first_piece) const;
    bool OnLane() const { return wait_flag != nullptr; }
    bool Bulk() const { return !latency && !OnLane(); }  // counted in the bulk in-flight windows
    uint64_t NextDispatchBytes() const;
    int EngineSet() const { return static_cast<int>(gpu * 2 + static_cast<uint32_t>(direction)); }
  };
  struct FenceRef {
    uint64_t copy_id;
    uint64_t bytes;
    bool bulk;
  };
  // A session's bulk work. Each direction has its own copy engines, so its own queue, deficit
  // and in-flight bytes; all on the session's GPU.
  struct SessionQueues {
    uint32_t weight = 1;
    uint32_t gpu = 0;
    std::deque<uint64_t> queue[2];  // copy ids, in order
    uint64_t deficit[2] = {0, 0};
    uint64_t bulk_out_bytes[2] = {0, 0};
  };

  void PlanPieces(Copy& c, uint64_t pool_offset, std::byte* device);
  void PlanBlockList(Copy& c, uint64_t pool_offset, std::byte* device, std::vector<BlockPiece>& pieces);
  uint32_t BulkStream(const Copy& c);
  void Schedule(Copy& c);
  void DispatchNext(SessionQueues* q, Copy& c);
  // e: an engine set, gpu * 2 + direction.
  bool DispatchBulk(int e);
  bool AnyDispatchable(int e, uint64_t client_limit) const;
  bool Blocked(int e, const Copy& c) const;
  void DropQueued(SessionQueues& q, Copy& c);
  void MaybeFinish(Copy& c);
  SessionQueues* QueuesOf(uint64_t session_id);

  Backend& backend_;
  const PoolGeometry pool_;
  const RunningPolicy& policy_;
  ServerCounters& counters_;
  Listener& listener_;

  std::map<uint64_t, SessionQueues> sessions_;  // ordered by id: the round robin's order
  std::unordered_map<uint64_t, std::unique_ptr<Copy>> copies_;
  std::unordered_map<FenceId, FenceRef> fences_;
  std::vector<uint64_t> held_;  // copies waiting for their "after" event, in arrival order
  std::vector<FenceResult> done_;
  std::vector<uint64_t> lengths_;
  const uint32_t gpus_;
  uint64_t bulk_cursor_ = 0;
  // Per engine set (gpu * 2 + direction):
  uint64_t bulk_out_bytes_[2 * kMaxGpus] = {};  // bulk bytes on the engines, all sessions
  uint32_t copies_started_[2 * kMaxGpus] = {};  // bulk copies with pieces out, not finished
  uint64_t rr_cursor_[2 * kMaxGpus] = {};       // deficit round robin: the session visited last (or now)
  bool visit_open_[2 * kMaxGpus] = {};          // ... and its visit continues when the engines drain
  // The last piece each bulk stream was sent (session 0: none that a piece may join), and the
  // bytes of the adjacent pieces that met there in a row, it included.
  struct StreamTail {
    uint64_t session_id = 0;
    uint32_t region_id = 0;
    const std::byte* host_end = nullptr;
    const std::byte* device_end = nullptr;
    uint64_t run_bytes = 0;
  };
  static constexpr uint32_t kStreamIndexes = 1 + 2 * kMaxBulkStreams;  // the latency stream, two banks
  StreamTail tails_[2 * kMaxGpus][kStreamIndexes] = {};

  uint32_t SingleCopyStream(int e, const Copy& c, const CopyPiece& piece);
  bool Continues(const StreamTail& tail, const Copy& c, const CopyPiece& piece) const;
  bool JoinsStreamTail(int e, const Copy& c, const CopyPiece& piece);
};

}  // namespace ferry::daemon
