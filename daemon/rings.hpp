// The data plane's shared memory. Each session has one ring segment (a sealed memfd): a
// submission ring the client writes copies into, and a completion ring ferryd posts results to.
// Here every submission entry is read once, into ferryd's memory (the client may rewrite its
// slot at any time), and validated before the scheduler sees it; results are posted as the
// completion ring has room, and the client's doorbell rung when it waits. Wait reports (exposed
// copy time) arrive on the ring too and are judged here. Event-loop thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "daemon/rejections.hpp"
#include "daemon/running_policy.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/server.hpp"
#include "daemon/session.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

class Rings : public Scheduler::Listener {
 public:
  // Per session per loop turn: fairness between clients. A turn also reads block lists of at
  // most kBlocksPerTurn blocks in all, every session's together (at least one list): ferryd
  // checks every block on its loop, and the turn is what other clients' copies wait behind.
  static constexpr uint32_t kSubmissionsPerTurn = 64;
  static constexpr uint64_t kBlocksPerTurn = wire::kMaxBlocksPerList;
  // What one session's block lists may have in flight (a list alone always may): ferryd keeps a
  // plan of every block until its list is done, and lists count as one copy each.
  static constexpr uint64_t kBlocksInFlightPerSession = wire::kMaxBlocksPerList;

  // All must outlive the rings.
  // `pool`: where block lists that travel in a buffer are read from.
  Rings(SessionMap& sessions, ServerCounters& counters, ServerObserver* observer, Rejections& rejections,
        const RunningPolicy& policy, PoolGeometry pool)
      : sessions_(sessions),
        counters_(counters),
        observer_(observer),
        rejections_(rejections),
        policy_(policy),
        pool_(pool) {}

  // At hello: the session's ring segment (ring_entries submissions, twice that completions)
  // and its two doorbells.
  Status Attach(Session& s, uint32_t ring_entries);

  // What a loop turn has read of block lists so far, every session's.
  struct TurnBudget {
    uint64_t blocks = 0;
    // The first session the budget left with a list on its ring and none read this turn: the
    // one to read first next turn.
    std::optional<uint64_t> left_waiting;
  };

  // Reads what `s` submitted since the last turn (at most kSubmissionsPerTurn requests, a block
  // list's slots counting as one, lists while `turn` has room, and no more than fit in its completion
  // ring when done, nor lists past kBlocksInFlightPerSession) and hands its copies to
  // `scheduler`. Entries left for want of room mark the session blocked until a copy of it
  // finishes (Session::submissions_blocked). True if it read any request but wait reports. An error: the
  // session broke the ring's protocol and must be evicted, for that reason.
  Result<bool> ReadSubmissions(Session& s, Scheduler& scheduler, TurnBudget& turn);
  // Posts the session's waiting results as its completion ring has room, and rings its doorbell
  // if it waits for them. An error: evict it, for that reason.
  Status PostCompletions(Session& s);

  // Writes the running policy's staging settings into the session's ring header, where its
  // client's staged copies read them; again into every ring after a policy switch.
  void PublishStaging(Session& s);
  void PublishStagingToAll();

  // An ended session: writes into each of its flags the value its copies wait for, so that its
  // copies waiting on the GPU go and finish (then its resources are reclaimed as usual).
  static void ReleaseFlagWaits(Session& s, Backend& backend);

  // Tells every client's ring whether the loop sleeps (then a submission needs the doorbell).
  void SetSleeping(bool sleeping);
  // Whether a ring holds entries the loop can read now (not those of a blocked session: the
  // loop may sleep over them until one of its copies finishes).
  bool AnySubmissionPending() const;

  // Scheduler::Listener: a copy's results go to its session's completion ring.
  void OnCopyEnqueued(uint64_t session_id, uint64_t user_tag, uint64_t bytes) override;
  void OnCopyFinished(const FinishedCopy& copy) override;

 private:
  // A copy that passed the checks, and what it will hold while it runs.
  struct CopyTarget {
    CopyRequest request;
    BufferInfo* buffer = nullptr;
    RegionState* region = nullptr;
    Session::EventFlag* wait_flag = nullptr;  // the wait event's flag, when it has one
    uint32_t wait_value = 0;
  };

  void HandleSubmission(Session& s, const wire::SubmissionEntry& e, Scheduler& scheduler);
  // What became of a block list's group at sq_head: read (its blocks, as the count it names),
  // or left on the ring for a later turn (over this turn's kBlocksPerTurn, `turn_blocks` read
  // so far) or until a copy of the session finishes (over kBlocksInFlightPerSession).
  struct ListRead {
    enum class Outcome { kRead, kNextTurn, kBlocked };
    Outcome outcome;
    uint32_t blocks = 0;
  };
  // An error: the group broke the ring's protocol.
  Result<ListRead> ReadBlockList(Session& s, const wire::SubmissionEntry& e, uint32_t tail, uint64_t turn_blocks,
                                 Scheduler& scheduler);
  void HandleBlockList(Session& s, const wire::SubmissionEntry& e, const wire::BlockListEntry& b,
                       std::span<const std::byte> inline_list, Scheduler& scheduler);
  Status CheckCopy(Session& s, const wire::SubmissionEntry& e, uint64_t device_bytes, CopyTarget& t);
  void Accept(Session& s, CopyTarget& t, Scheduler& scheduler);
  void HandleWaitReport(Session& s, const wire::SubmissionEntry& e);
  void Reject(Session& s, uint64_t tag, const Status& st);
  void RememberForReports(Session& s, uint64_t copy_id, uint64_t user_tag, uint64_t accepted_ns, Direction direction);
  static void Complete(Session& s, uint64_t tag, const Status& st, wire::CompletionKind kind, uint64_t bytes,
                       uint64_t ns);

  SessionMap& sessions_;
  ServerCounters& counters_;
  ServerObserver* observer_;
  Rejections& rejections_;
  const RunningPolicy& policy_;
  const PoolGeometry pool_;
  uint64_t next_copy_id_ = 1;
};

}  // namespace ferry::daemon
