// The scheduler alone: no sockets, no rings, no daemon. A recording backend takes its plans
// and finishes their fences when the test says; a recording listener takes its results.
#include "daemon/scheduler.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

namespace ferry::daemon {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

class RecordingBackend : public Backend {
 public:
  struct Submitted {
    FenceId fence;
    CopyPlan plan;
  };
  wire::BackendKind kind() const override { return wire::BackendKind::kHost; }
  std::string Describe() const override { return "recording"; }
  int device_ordinal() const override { return 0; }
  uint32_t streams_per_direction() const override { return kStreamsPerDirection; }
  bool pieces_stay_in_one_slab() const override { return per_slab; }
  Status RegisterPool(std::byte*, size_t, size_t, bool) override { return Status::Ok(); }
  Result<std::unique_ptr<DeviceRegion>> OpenDeviceRegion(const wire::RegisterDeviceRequest&, UniqueFd) override {
    return NotSupported("recording backend");
  }
  Result<std::unique_ptr<SharedEvent>> OpenEvent(const wire::RegisterEventRequest&) override {
    return NotSupported("recording backend");
  }
  Result<std::unique_ptr<HostWords>> RegisterHostWords(std::byte*, size_t) override {
    return NotSupported("recording backend");
  }
  Result<FenceId> Submit(const CopyPlan& plan) override {
    if (fail_submits > 0) {
      --fail_submits;
      return DeviceError("refused by the test");
    }
    submitted.push_back({next_fence, plan});
    out.push_back(next_fence);
    return next_fence++;
  }
  void PollCompleted(std::vector<FenceResult>& done) override {
    done.insert(done.end(), finished.begin(), finished.end());
    finished.clear();
  }
  int completion_fd() const override { return -1; }

  // The engines finish the oldest fence still out.
  void FinishOldest(Status st = Status::Ok()) {
    ASSERT_FALSE(out.empty());
    finished.push_back({out.front(), st});
    out.erase(out.begin());
  }
  void FinishAll() {
    while (!out.empty()) FinishOldest();
  }

  bool per_slab = false;
  int fail_submits = 0;
  std::vector<Submitted> submitted;
  std::vector<FenceId> out;  // submitted, not finished
  std::vector<FenceResult> finished;
  FenceId next_fence = 1;
};

class RecordingListener : public Scheduler::Listener {
 public:
  struct Finished {
    FinishedCopy copy;
    std::string policy;  // copy.policy does not outlive the call
  };
  void OnCopyEnqueued(uint64_t session_id, uint64_t user_tag, uint64_t bytes) override {
    enqueued.push_back({session_id, user_tag, bytes});
  }
  void OnCopyFinished(const FinishedCopy& c) override { finished.push_back({c, std::string(c.policy)}); }
  std::vector<std::vector<uint64_t>> enqueued;
  std::vector<Finished> finished;
};

class SharedEventStub : public SharedEvent {};

std::shared_ptr<const Policy> Chunked(uint64_t chunk, uint64_t in_flight = 1024 * kMiB, std::string name = "chunked") {
  auto p = std::make_shared<Policy>();
  p->name = std::move(name);
  p->schedule = Schedule::kChunked;
  p->chunk_bytes = chunk;
  p->in_flight_bytes = in_flight;
  return p;
}

// A scheduler over a fake pool and device: host addresses are pool + offset, device addresses
// device + offset, so a plan's pieces say which copy and which part of it they are.
class SchedulerTest : public ::testing::Test {
 protected:
  void Start(std::shared_ptr<const Policy> policy) {
    policy_ = std::make_unique<RunningPolicy>(std::move(policy));
    scheduler_ =
        std::make_unique<Scheduler>(backend_, PoolGeometry{pool_.data(), kSlab}, *policy_, counters_, listener_);
  }
  CopyRequest Copy(uint64_t id, uint64_t session, uint64_t pool_offset, uint64_t bytes, bool latency = false) {
    CopyRequest r;
    r.id = id;
    r.session_id = session;
    r.user_tag = 1000 + id;
    r.pool_offset = pool_offset;
    r.device = device_.data() + pool_offset;
    r.bytes = bytes;
    r.latency_requested = latency;
    return r;
  }
  // The piece lengths of every plan submitted so far, in order.
  std::vector<uint64_t> PieceLengths() const {
    std::vector<uint64_t> out;
    for (const auto& s : backend_.submitted) {
      for (const CopyPiece& p : s.plan.pieces) out.push_back(p.length);
    }
    return out;
  }
  // Which session's copy each plan was of (by its pool offset: session s's copies lie at s GiB).
  uint64_t SessionOf(const RecordingBackend::Submitted& s) const {
    return static_cast<uint64_t>(s.plan.pieces[0].host - pool_.data()) / kSessionSpan;
  }

  static constexpr uint64_t kSlab = 8 * kMiB;
  static constexpr uint64_t kSessionSpan = 128 * kMiB;
  std::vector<std::byte> pool_ = std::vector<std::byte>(1);  // only its address is used
  std::vector<std::byte> device_ = std::vector<std::byte>(1);
  RecordingBackend backend_;
  RecordingListener listener_;
  ServerCounters counters_;
  std::unique_ptr<RunningPolicy> policy_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerTest, ChunkedCopiesAreCutIntoChunksAndTheRemainder) {
  Start(Chunked(kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(Copy(1, 1, 0, 3 * kMiB + 4096));
  EXPECT_TRUE(backend_.submitted.empty());  // bulk: queued until Dispatch
  EXPECT_EQ(counters_.queued_bytes.load(), 3 * kMiB + 4096);
  EXPECT_TRUE(scheduler_->Dispatch());
  EXPECT_EQ(PieceLengths(), (std::vector<uint64_t>{kMiB, kMiB, kMiB, 4096}));
  EXPECT_EQ(backend_.submitted.size(), 4u);  // one piece a plan
  uint64_t offset = 0;
  for (const auto& s : backend_.submitted) {
    EXPECT_EQ(s.plan.pieces[0].host, pool_.data() + offset);
    EXPECT_EQ(s.plan.pieces[0].device, device_.data() + offset);
    EXPECT_GE(s.plan.pieces[0].stream, 1u);  // bulk streams, never the latency stream
    offset += s.plan.pieces[0].length;
  }
  EXPECT_EQ(counters_.queued_bytes.load(), 0u);
}

TEST_F(SchedulerTest, GeometricCopiesShrinkTowardTheTail) {
  auto p = std::make_shared<Policy>();
  p->schedule = Schedule::kGeometric;
  p->ratio = 0.5;
  p->min_chunk_bytes = kMiB;
  Start(p);
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(Copy(1, 1, 0, 16 * kMiB));
  scheduler_->Dispatch();
  EXPECT_EQ(PieceLengths(), (std::vector<uint64_t>{8 * kMiB, 4 * kMiB, 2 * kMiB, kMiB, kMiB}));
}

TEST_F(SchedulerTest, SerialAndSideStreamCopiesGoWhole) {
  for (Schedule kind : {Schedule::kSerial, Schedule::kSideStream}) {
    backend_.submitted.clear();
    auto p = std::make_shared<Policy>();
    p->schedule = kind;
    Start(p);
    scheduler_->AddSession(1, 1);
    scheduler_->Submit(Copy(1, 1, 0, 5 * kMiB));
    scheduler_->Dispatch();
    ASSERT_EQ(backend_.submitted.size(), 1u);
    EXPECT_EQ(PieceLengths(), std::vector<uint64_t>{5 * kMiB});
    backend_.FinishAll();
    scheduler_->PollBackend();
  }
}

TEST_F(SchedulerTest, PiecesStayInOneSlabWhenTheBackendAsks) {
  backend_.per_slab = true;
  Start(Chunked(64 * kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(Copy(1, 1, kSlab - kMiB, 10 * kMiB));  // starts 1 MiB before a slab's end
  scheduler_->Dispatch();
  EXPECT_EQ(PieceLengths(), (std::vector<uint64_t>{kMiB, 8 * kMiB, kMiB}));
}

// Two sessions whose classes weigh 3 and 1, bulk work queued in both, and room on the engines
// for one piece at a time: the engines go to them 3 to 1.
TEST_F(SchedulerTest, DispatchSharesTheEnginesByClassWeight) {
  Start(Chunked(kMiB, kMiB));
  scheduler_->AddSession(1, 3);
  scheduler_->AddSession(2, 1);
  scheduler_->Submit(Copy(1, 1, 1 * kSessionSpan, 64 * kMiB));
  scheduler_->Submit(Copy(2, 2, 2 * kSessionSpan, 64 * kMiB));
  std::map<uint64_t, int> pieces;
  for (int i = 0; i < 40; ++i) {
    scheduler_->Dispatch();
    ASSERT_EQ(backend_.out.size(), 1u) << "the engines take one piece at a time";
    pieces[SessionOf(backend_.submitted.back())]++;
    backend_.FinishOldest();
    scheduler_->PollBackend();
  }
  EXPECT_EQ(pieces[1], 30);
  EXPECT_EQ(pieces[2], 10);
}

TEST_F(SchedulerTest, AWeightChangedByAPolicySwitchTakesEffect) {
  Start(Chunked(kMiB, kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->AddSession(2, 1);
  scheduler_->SetWeight(2, 4);
  scheduler_->Submit(Copy(1, 1, 1 * kSessionSpan, 64 * kMiB));
  scheduler_->Submit(Copy(2, 2, 2 * kSessionSpan, 64 * kMiB));
  std::map<uint64_t, int> pieces;
  for (int i = 0; i < 50; ++i) {
    scheduler_->Dispatch();
    pieces[SessionOf(backend_.submitted.back())]++;
    backend_.FinishOldest();
    scheduler_->PollBackend();
  }
  EXPECT_EQ(pieces[1], 10);
  EXPECT_EQ(pieces[2], 40);
}

// The engines are full of bulk work and more is queued; a latency copy goes out at once, on
// the latency stream, without waiting for Dispatch or for room.
TEST_F(SchedulerTest, LatencyCopiesGoBeforeQueuedBulkWork) {
  Start(Chunked(kMiB, kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(Copy(1, 1, 0, 8 * kMiB));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 1u);
  scheduler_->Submit(Copy(2, 1, 64 * kMiB, 64 * 1024, /*latency=*/true));
  ASSERT_EQ(backend_.submitted.size(), 2u);
  EXPECT_EQ(backend_.submitted[1].plan.pieces.size(), 1u);
  EXPECT_EQ(backend_.submitted[1].plan.pieces[0].stream, 0u);
  EXPECT_EQ(backend_.submitted[1].plan.pieces[0].length, 64u * 1024);
  // Larger than the policy's latency_max_bytes: scheduled as bulk, behind the queued work.
  scheduler_->Submit(Copy(3, 1, 96 * kMiB, 2 * kMiB, /*latency=*/true));
  EXPECT_EQ(backend_.submitted.size(), 2u);
  backend_.FinishAll();
  scheduler_->PollBackend();
  ASSERT_EQ(listener_.finished.size(), 1u);
  EXPECT_EQ(listener_.finished[0].copy.id, 2u);
  EXPECT_TRUE(listener_.finished[0].copy.latency);
}

TEST_F(SchedulerTest, AFinishedCopyReportsItsResultOnce) {
  Start(Chunked(kMiB, 1024 * kMiB, "steady"));
  scheduler_->AddSession(7, 1);
  CopyRequest r = Copy(1, 7, 0, 2 * kMiB);
  r.direction = Direction::kDeviceToHost;
  r.accepted_ns = 5;
  r.buffer_offset = 123;
  r.region_id = 9;
  scheduler_->Submit(r);
  scheduler_->Dispatch();
  EXPECT_EQ(counters_.in_flight.load(), 1u);
  EXPECT_EQ(counters_.in_flight_bytes.load(), 2 * kMiB);
  backend_.FinishOldest();
  scheduler_->PollBackend();
  EXPECT_TRUE(listener_.finished.empty()) << "one of its two pieces is still out";
  EXPECT_FALSE(scheduler_->idle());
  backend_.FinishOldest();
  scheduler_->PollBackend();
  ASSERT_EQ(listener_.finished.size(), 1u);
  const FinishedCopy& c = listener_.finished[0].copy;
  EXPECT_EQ(c.session_id, 7u);
  EXPECT_EQ(c.user_tag, 1001u);
  EXPECT_EQ(c.bytes, 2 * kMiB);
  EXPECT_EQ(c.direction, Direction::kDeviceToHost);
  EXPECT_TRUE(c.status.ok());
  EXPECT_EQ(listener_.finished[0].policy, "steady");
  EXPECT_EQ(c.accepted_ns, 5u);
  EXPECT_GE(c.done_ns, c.first_dispatch_ns);
  EXPECT_EQ(c.buffer_offset, 123u);
  EXPECT_EQ(c.region_id, 9u);
  EXPECT_TRUE(scheduler_->idle());
  EXPECT_EQ(counters_.copies_completed.load(), 1u);
  EXPECT_EQ(counters_.bytes_d2h.load(), 2 * kMiB);
  EXPECT_EQ(counters_.in_flight.load(), 0u);
  EXPECT_EQ(counters_.in_flight_bytes.load(), 0u);
}

TEST_F(SchedulerTest, AFailedPieceEndsItsCopyAndTheRestNeverGoesOut) {
  Start(Chunked(kMiB, kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(Copy(1, 1, 0, 4 * kMiB));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 1u);
  backend_.FinishOldest(DeviceError("the engine failed"));
  scheduler_->PollBackend();
  scheduler_->Dispatch();
  EXPECT_EQ(backend_.submitted.size(), 1u);
  ASSERT_EQ(listener_.finished.size(), 1u);
  EXPECT_EQ(listener_.finished[0].copy.status.code(), Code::kDevice);
  EXPECT_EQ(counters_.copies_failed.load(), 1u);
  EXPECT_EQ(counters_.queued_bytes.load(), 0u);
}

TEST_F(SchedulerTest, ACopyThatSignalsGoesWholeAndIsAnnouncedWhenEnqueued) {
  Start(Chunked(kMiB));
  scheduler_->AddSession(1, 1);
  SharedEventStub done;
  CopyRequest r = Copy(1, 1, 0, 3 * kMiB);
  r.signal = &done;
  scheduler_->Submit(r);
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 1u);
  EXPECT_EQ(backend_.submitted[0].plan.pieces.size(), 3u);
  EXPECT_EQ(backend_.submitted[0].plan.signal, &done);
  ASSERT_EQ(listener_.enqueued.size(), 1u);
  EXPECT_EQ(listener_.enqueued[0], (std::vector<uint64_t>{1, 1001, 3 * kMiB}));
}

// Copies accepted before a switch keep the policy they were planned under; new ones get the new.
TEST_F(SchedulerTest, ASwitchedPolicyAppliesToNewCopiesOnly) {
  Start(Chunked(kMiB, 1024 * kMiB, "small"));
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(Copy(1, 1, 0, 4 * kMiB));
  policy_->Switch(Chunked(2 * kMiB, 1024 * kMiB, "large"));
  scheduler_->Submit(Copy(2, 1, 64 * kMiB, 4 * kMiB));
  scheduler_->Dispatch();
  EXPECT_EQ(PieceLengths(), (std::vector<uint64_t>{kMiB, kMiB, kMiB, kMiB, 2 * kMiB, 2 * kMiB}));
  backend_.FinishAll();
  scheduler_->PollBackend();
  ASSERT_EQ(listener_.finished.size(), 2u);
  EXPECT_EQ(listener_.finished[0].policy, "small");
  EXPECT_EQ(listener_.finished[1].policy, "large");
}

TEST_F(SchedulerTest, ACancelledSessionsQueuedCopiesNeverGoOut) {
  Start(Chunked(kMiB, kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(Copy(1, 1, 0, 4 * kMiB));
  scheduler_->Submit(Copy(2, 1, 64 * kMiB, kMiB));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 1u);
  scheduler_->CancelSession(1);
  ASSERT_EQ(listener_.finished.size(), 1u);  // the copy with nothing on the engines
  EXPECT_EQ(listener_.finished[0].copy.id, 2u);
  backend_.FinishAll();  // the piece on the engines finishes first
  scheduler_->PollBackend();
  scheduler_->Dispatch();
  EXPECT_EQ(backend_.submitted.size(), 1u);
  ASSERT_EQ(listener_.finished.size(), 2u);
  EXPECT_TRUE(scheduler_->idle());
  scheduler_->RemoveSession(1);
}

}  // namespace
}  // namespace ferry::daemon
