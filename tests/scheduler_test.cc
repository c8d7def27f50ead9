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
  p->bulk_streams = 2;  // the tests count units and streams for two, whatever the default
  return p;
}

// `policy` with adjacent small copies joined in runs of at most `bytes` (batching.join).
std::shared_ptr<const Policy> JoiningUpTo(std::shared_ptr<const Policy> policy, uint64_t bytes) {
  auto p = std::make_shared<Policy>(*policy);
  p->join_bytes = bytes;
  return p;
}

// A scheduler over a fake pool and device: host addresses are pool + offset, device addresses
// device + offset, so a plan's pieces say which copy and which part of it they are.
class SchedulerTest : public ::testing::Test {
 protected:
  void Start(std::shared_ptr<const Policy> policy, uint32_t gpus = 1) {
    policy_ = std::make_unique<RunningPolicy>(std::move(policy));
    scheduler_ = std::make_unique<Scheduler>(backend_, PoolGeometry{pool_.data(), kSlab}, *policy_, counters_,
                                             listener_, gpus);
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
  // A block list of `n` blocks of `block` bytes: every other block of both regions, so that
  // nothing coalesces.
  CopyRequest List(uint64_t id, uint64_t session, uint64_t pool_offset, uint32_t n, uint64_t block,
                   bool latency = false) {
    CopyRequest r = Copy(id, session, pool_offset, n * block, latency);
    r.blocks = n;
    for (uint64_t i = 0; i < n; ++i) r.block_pieces.push_back({2 * i * block, 2 * i * block, block});
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
  // The `n` plans submitted so far each went alone (none joins the one before), each to
  // another stream than the one before.
  void ExpectEachPlanAloneRoundRobin(size_t n) const {
    ASSERT_EQ(backend_.submitted.size(), n);
    for (size_t i = 0; i < n; ++i) {
      const CopyPiece& p = backend_.submitted[i].plan.pieces[0];
      EXPECT_FALSE(p.joins_previous) << "copy " << i;
      if (i > 0) {
        EXPECT_NE(p.stream, backend_.submitted[i - 1].plan.pieces[0].stream) << "copy " << i;
      }
    }
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

// Each GPU has its own copy engines: one GPU's full in-flight window holds back nothing of
// another's, and each copy's plans name its session's GPU.
TEST_F(SchedulerTest, EachGpuHasItsOwnInFlightWindow) {
  Start(Chunked(1 * kMiB, 4 * kMiB), 2);
  scheduler_->AddSession(1, 1);
  scheduler_->AddSession(2, 1);
  scheduler_->SetGpu(2, 1);
  CopyRequest a = Copy(1, 1, 1 * kSessionSpan, 16 * kMiB);
  scheduler_->Submit(a);
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 4u);  // GPU 0's window is full
  CopyRequest b = Copy(2, 2, 2 * kSessionSpan, 3 * kMiB);
  b.gpu = 1;
  scheduler_->Submit(b);
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 7u) << "GPU 1's copy waited for GPU 0's engines";
  for (size_t i = 0; i < backend_.submitted.size(); ++i) {
    EXPECT_EQ(backend_.submitted[i].plan.gpu, i < 4 ? 0u : 1u) << "plan " << i;
    EXPECT_EQ(SessionOf(backend_.submitted[i]), i < 4 ? 1u : 2u) << "plan " << i;
  }
  backend_.FinishAll();
  scheduler_->PollBackend();
  scheduler_->Dispatch();
  backend_.FinishAll();
  scheduler_->PollBackend();
  scheduler_->Dispatch();
  backend_.FinishAll();
  scheduler_->PollBackend();
  scheduler_->Dispatch();
  backend_.FinishAll();
  scheduler_->PollBackend();
  EXPECT_TRUE(scheduler_->idle());
  EXPECT_EQ(counters_.gpu[0].bytes_h2d.load(), 16 * kMiB);
  EXPECT_EQ(counters_.gpu[1].bytes_h2d.load(), 3 * kMiB);
  EXPECT_EQ(counters_.gpu[0].copies_completed.load() + counters_.gpu[1].copies_completed.load(), 2u);
}

// A GPU named by a policy's override runs the override's schedule and in-flight window; the
// other GPU runs the node's, and a switch to a policy without the override applies to both.
TEST_F(SchedulerTest, AGpuOverrideCutsAndLimitsThatGpusCopiesOnly) {
  auto node = daemon::ParsePolicy(
      "schedule: {kind: chunked, chunk_size: 4MiB}\nlimits: {in_flight_bytes: 64MiB}\n"
      "gpus: [{match: GPU-B, schedule: {kind: chunked, chunk_size: 1MiB}, limits: {in_flight_bytes: 2MiB}}]\n",
      "t.yaml");
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  Start(*node, 2);
  policy_->SetGpus({{0, "GPU-A"}, {1, "GPU-B"}});
  scheduler_->AddSession(1, 1);
  scheduler_->AddSession(2, 1);
  scheduler_->SetGpu(2, 1);
  scheduler_->Submit(Copy(1, 1, 1 * kSessionSpan, 8 * kMiB));
  CopyRequest b = Copy(2, 2, 2 * kSessionSpan, 8 * kMiB);
  b.gpu = 1;
  scheduler_->Submit(b);
  scheduler_->Dispatch();
  // GPU 0: both 4 MiB chunks at once; GPU 1: 1 MiB chunks, two in its 2 MiB window.
  std::vector<uint64_t> gpu0, gpu1;
  for (const auto& sub : backend_.submitted) {
    for (const CopyPiece& piece : sub.plan.pieces) (sub.plan.gpu == 0 ? gpu0 : gpu1).push_back(piece.length);
  }
  EXPECT_EQ(gpu0, (std::vector<uint64_t>{4 * kMiB, 4 * kMiB}));
  EXPECT_EQ(gpu1, (std::vector<uint64_t>{kMiB, kMiB}));
  for (int round = 0; round < 8 && !scheduler_->idle(); ++round) {
    backend_.FinishAll();
    scheduler_->PollBackend();
    scheduler_->Dispatch();
  }
  EXPECT_TRUE(scheduler_->idle());
  uint64_t gpu1_pieces = 0;
  for (const auto& sub : backend_.submitted) gpu1_pieces += sub.plan.gpu == 1 ? sub.plan.pieces.size() : 0;
  EXPECT_EQ(gpu1_pieces, 8u);
  EXPECT_EQ(counters_.gpu[1].bytes_h2d.load(), 8 * kMiB);

  policy_->Switch(Chunked(4 * kMiB, 64 * kMiB));
  backend_.submitted.clear();
  CopyRequest c = Copy(3, 2, 2 * kSessionSpan, 8 * kMiB);
  c.gpu = 1;
  scheduler_->Submit(c);
  scheduler_->Dispatch();
  EXPECT_EQ(PieceLengths(), (std::vector<uint64_t>{4 * kMiB, 4 * kMiB})) << "GPU 1 runs the new policy";
}

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

// A copy after a flagged event goes at once, whole, to its session's lane with the wait as data,
// and parks there outside the bulk in-flight window: another session's bulk copy still goes.
TEST_F(SchedulerTest, ACopyWaitingOnAFlagGoesToItsLaneAtOnceAndLeavesTheBulkWindowToOthers) {
  Start(Chunked(kMiB, kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->AddSession(2, 1);
  uint32_t flag = 0;
  CopyRequest waits = Copy(1, 1, 1 * kSessionSpan, 4 * kMiB);
  waits.wait_flag = &flag;
  waits.wait_value = 3;
  scheduler_->Submit(waits);
  ASSERT_EQ(backend_.submitted.size(), 1u) << "a lane copy is not queued behind the scheduler's windows";
  const CopyPlan& lane = backend_.submitted[0].plan;
  EXPECT_EQ(lane.pieces.size(), 4u);  // cut as the policy says, sent whole
  EXPECT_EQ(lane.wait.flag, &flag);
  EXPECT_EQ(lane.wait.value, 3u);
  EXPECT_EQ(lane.wait.session_id, 1u);
  scheduler_->Submit(Copy(2, 2, 2 * kSessionSpan, kMiB));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 2u) << "the parked copy kept another session's bulk copy off the engines";
  EXPECT_EQ(backend_.submitted[1].plan.wait.flag, nullptr);
  EXPECT_EQ(SessionOf(backend_.submitted[1]), 2u);
  backend_.FinishAll();
  scheduler_->PollBackend();
  EXPECT_TRUE(scheduler_->idle());
  ASSERT_EQ(listener_.finished.size(), 2u);
  for (const auto& f : listener_.finished) EXPECT_TRUE(f.copy.status.ok());
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

// A list is one copy to the scheduler, sent in units of the policy's piece size: each unit one
// plan, its pieces on one bulk stream (one batch on the cuda backend), the units round robin
// over the streams; one completion, its bytes the sum of the blocks'.
// A list smaller than one of the policy's pieces still spreads over its bulk streams (two in
// the default policy): small blocks are bound by each engine's work per block.
TEST_F(SchedulerTest, ABlockListSmallerThanAPieceGoesAsAUnitPerBulkStream) {
  Start(Chunked(64 * kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(List(1, 1, 0, 64, 64 << 10));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 2u);
  EXPECT_NE(backend_.submitted[0].plan.pieces[0].stream, backend_.submitted[1].plan.pieces[0].stream);
  size_t blocks = 0;
  for (const auto& sub : backend_.submitted) {
    EXPECT_EQ(sub.plan.pieces.size(), 32u);
    for (const CopyPiece& p : sub.plan.pieces) {
      EXPECT_EQ(p.stream, sub.plan.pieces[0].stream);
      EXPECT_NE(p.stream, 0u);
      ++blocks;
    }
  }
  EXPECT_EQ(blocks, 64u);
  backend_.FinishAll();
  scheduler_->PollBackend();
  ASSERT_EQ(listener_.finished.size(), 1u);
  EXPECT_TRUE(listener_.finished[0].copy.status.ok());
}

// ... but not host to device in pieces under 32 KiB (the engines' scattered host reads slow
// each other down): one unit, one stream. Device to host, the same list still spreads.
TEST_F(SchedulerTest, AHostToDeviceListOfSmallPiecesStaysOnOneStream) {
  Start(Chunked(64 * kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(List(1, 1, 0, 64, 16 << 10));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 1u);
  EXPECT_EQ(backend_.submitted[0].plan.pieces.size(), 64u);
  for (const CopyPiece& p : backend_.submitted[0].plan.pieces) {
    EXPECT_EQ(p.stream, backend_.submitted[0].plan.pieces[0].stream);
    EXPECT_NE(p.stream, 0u);
    EXPECT_TRUE(p.batchable);
  }
  CopyRequest d2h = List(2, 1, 0, 64, 16 << 10);
  d2h.direction = Direction::kDeviceToHost;
  scheduler_->Submit(d2h);
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 3u);
  EXPECT_NE(backend_.submitted[1].plan.pieces[0].stream, backend_.submitted[2].plan.pieces[0].stream);
  EXPECT_EQ(backend_.submitted[1].plan.pieces.size() + backend_.submitted[2].plan.pieces.size(), 64u);
  backend_.FinishAll();
  scheduler_->PollBackend();
  ASSERT_EQ(listener_.finished.size(), 2u);
  EXPECT_TRUE(listener_.finished[0].copy.status.ok());
  EXPECT_TRUE(listener_.finished[1].copy.status.ok());
}

TEST_F(SchedulerTest, ABlockListGoesInUnitsOfThePolicysPieceSizeEachOnOneStream) {
  Start(Chunked(kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(List(1, 1, 0, 64, 64 << 10));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 4u);
  std::vector<uint32_t> streams;
  for (const auto& sub : backend_.submitted) {
    ASSERT_EQ(sub.plan.pieces.size(), 16u);
    for (const CopyPiece& p : sub.plan.pieces) {
      EXPECT_EQ(p.stream, sub.plan.pieces[0].stream);
      EXPECT_TRUE(p.batchable);
      EXPECT_EQ(p.length, 64u << 10);
    }
    EXPECT_EQ(sub.plan.signal, nullptr);
    streams.push_back(sub.plan.pieces[0].stream);
  }
  EXPECT_NE(streams[0], streams[1]);
  EXPECT_NE(streams[0], 0u) << "bulk, not the latency stream";
  // Every block went out once, in list order.
  size_t k = 0;
  for (const auto& sub : backend_.submitted) {
    for (const CopyPiece& p : sub.plan.pieces) {
      EXPECT_EQ(p.host, pool_.data() + 2 * k * (64 << 10));
      EXPECT_EQ(p.device, device_.data() + 2 * k * (64 << 10));
      ++k;
    }
  }
  EXPECT_TRUE(listener_.finished.empty());
  backend_.FinishAll();
  scheduler_->PollBackend();
  ASSERT_EQ(listener_.finished.size(), 1u);
  EXPECT_EQ(listener_.finished[0].copy.bytes, 4 * kMiB);
  EXPECT_EQ(listener_.finished[0].copy.blocks, 64u);
  EXPECT_TRUE(listener_.finished[0].copy.status.ok());
  EXPECT_EQ(counters_.copies_completed.load(), 1u);
}

// A run of blocks longer than a unit is cut where the unit ends; a unit of one piece is a single
// copy's piece (batchable only up to the threshold).
TEST_F(SchedulerTest, ABlockListsContiguousRunIsCutIntoUnits) {
  Start(Chunked(kMiB));
  scheduler_->AddSession(1, 1);
  CopyRequest r = Copy(1, 1, 0, 3 * kMiB);
  r.blocks = 48;
  r.block_pieces.push_back({0, 0, 3 * kMiB});  // 48 blocks of 64 KiB, coalesced
  scheduler_->Submit(r);
  scheduler_->Dispatch();
  EXPECT_EQ(PieceLengths(), (std::vector<uint64_t>{kMiB, kMiB, kMiB}));
  EXPECT_EQ(backend_.submitted.size(), 3u);
}

// Weights 3 and 1, room on the engines for one unit at a time: a list's units and another
// client's single-copy pieces go 3 to 1, as for two single copies.
TEST_F(SchedulerTest, ABlockListSharesTheEnginesByWeightWithAnotherClientsCopies) {
  Start(Chunked(kMiB, kMiB));
  scheduler_->AddSession(1, 3);
  scheduler_->AddSession(2, 1);
  scheduler_->Submit(List(1, 1, 1 * kSessionSpan, 1024, 64 << 10));  // 64 units of 16 blocks
  scheduler_->Submit(Copy(2, 2, 2 * kSessionSpan, 64 * kMiB));
  std::map<uint64_t, int> units;
  for (int i = 0; i < 40; ++i) {
    scheduler_->Dispatch();
    ASSERT_EQ(backend_.out.size(), 1u) << "the engines take one unit at a time";
    units[SessionOf(backend_.submitted.back())]++;
    backend_.FinishOldest();
    scheduler_->PollBackend();
  }
  EXPECT_EQ(units[1], 30);
  EXPECT_EQ(units[2], 10);
}

TEST_F(SchedulerTest, ABlockListThatSignalsGoesWholeAndIsAnnouncedOnce) {
  Start(Chunked(kMiB));
  scheduler_->AddSession(1, 1);
  SharedEventStub done;
  CopyRequest r = List(1, 1, 0, 64, 64 << 10);
  r.signal = &done;
  scheduler_->Submit(r);
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 1u);
  const CopyPlan& plan = backend_.submitted[0].plan;
  ASSERT_EQ(plan.pieces.size(), 64u);
  EXPECT_EQ(plan.signal, &done);
  for (size_t unit = 0; unit < 4; ++unit) {  // each unit still on one stream
    for (size_t i = 1; i < 16; ++i) EXPECT_EQ(plan.pieces[unit * 16 + i].stream, plan.pieces[unit * 16].stream);
  }
  EXPECT_NE(plan.pieces[0].stream, plan.pieces[16].stream);
  ASSERT_EQ(listener_.enqueued.size(), 1u);
  EXPECT_EQ(listener_.enqueued[0], (std::vector<uint64_t>{1, 1001, 4 * kMiB}));
}

// Latency priority holds for a whole list within latency_max_bytes, else the list is bulk.
TEST_F(SchedulerTest, ABlockListIsLatencyClassOnlyWhenAllOfItIsSmall) {
  Start(Chunked(kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->Submit(List(1, 1, 0, 16, 64 << 10, /*latency=*/true));  // 1 MiB: the limit
  ASSERT_EQ(backend_.submitted.size(), 1u) << "latency copies go out at once";
  for (const CopyPiece& p : backend_.submitted[0].plan.pieces) EXPECT_EQ(p.stream, 0u);
  scheduler_->Submit(List(2, 1, 16 * kMiB, 17, 64 << 10, /*latency=*/true));
  EXPECT_EQ(backend_.submitted.size(), 1u) << "a list over latency_max_bytes is queued as bulk";
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 3u);
  EXPECT_NE(backend_.submitted[1].plan.pieces[0].stream, 0u);
}

// A small single copy that continues the last piece a bulk stream was sent (on both sides, in
// the same session and device region) goes to that stream, marked as joining it, until the
// policy's join size (here 1 MiB: 16 of 64 KiB) met there in a row; then the next stream.
TEST_F(SchedulerTest, AdjacentSmallCopiesGoToOneStreamInRunsAndJoin) {
  Start(JoiningUpTo(Chunked(64 * kMiB), kMiB));
  scheduler_->AddSession(1, 1);
  constexpr uint64_t kPiece = 64 << 10;
  for (uint64_t i = 0; i < 40; ++i) {
    CopyRequest r = Copy(i + 1, 1, kSessionSpan + i * kPiece, kPiece);
    r.region_id = 7;
    scheduler_->Submit(r);
  }
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 40u);
  for (size_t i = 0; i < 40; ++i) {
    const CopyPiece& p = backend_.submitted[i].plan.pieces[0];
    const CopyPiece& run_start = backend_.submitted[i - i % 16].plan.pieces[0];
    EXPECT_NE(p.stream, 0u) << "copy " << i;
    EXPECT_EQ(p.stream, run_start.stream) << "copy " << i << " left its run";
    EXPECT_EQ(p.joins_previous, i % 16 != 0) << "copy " << i;
  }
  EXPECT_NE(backend_.submitted[0].plan.pieces[0].stream, backend_.submitted[16].plan.pieces[0].stream);
  EXPECT_NE(backend_.submitted[16].plan.pieces[0].stream, backend_.submitted[32].plan.pieces[0].stream);
}

// Small copies that continue nothing go round robin, as before joining: a burst of scattered
// copies still spreads over the engines.
TEST_F(SchedulerTest, ScatteredSmallCopiesSpreadOverTheStreams) {
  Start(Chunked(64 * kMiB));
  scheduler_->AddSession(1, 1);
  constexpr uint64_t kPiece = 64 << 10;
  for (uint64_t i = 0; i < 8; ++i) scheduler_->Submit(Copy(i + 1, 1, kSessionSpan + 2 * i * kPiece, kPiece));
  scheduler_->Dispatch();
  ExpectEachPlanAloneRoundRobin(8);
}

// A run ends at the policy's join size in bytes: with 1 MiB, 256 KiB pieces go four to a stream.
TEST_F(SchedulerTest, ARunOfSmallCopiesEndsAtThePolicysJoinSize) {
  Start(JoiningUpTo(Chunked(64 * kMiB), kMiB));
  scheduler_->AddSession(1, 1);
  for (uint64_t i = 0; i < 8; ++i) scheduler_->Submit(Copy(i + 1, 1, kSessionSpan + i * (256 << 10), 256 << 10));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(backend_.submitted[i].plan.pieces[0].stream, backend_.submitted[i - i % 4].plan.pieces[0].stream);
    EXPECT_EQ(backend_.submitted[i].plan.pieces[0].joins_previous, i % 4 != 0) << "copy " << i;
  }
  EXPECT_NE(backend_.submitted[0].plan.pieces[0].stream, backend_.submitted[4].plan.pieces[0].stream);
}

// The default join size keeps a stream's run going far past the batch threshold: 256 adjacent
// 64 KiB copies (16 MiB) are one run on one stream, and the next starts a run on another.
TEST_F(SchedulerTest, ByDefaultAdjacentCopiesJoinInRunsOfSixteenMiB) {
  Start(JoiningUpTo(Chunked(64 * kMiB), Policy{}.join_bytes));
  ASSERT_EQ(Policy{}.join_bytes, 16 * kMiB);
  scheduler_->AddSession(1, 1);
  constexpr uint64_t kPiece = 64 << 10;
  for (uint64_t i = 0; i < 320; ++i) scheduler_->Submit(Copy(i + 1, 1, kSessionSpan + i * kPiece, kPiece));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 320u);
  for (size_t i = 0; i < 320; ++i) {
    const CopyPiece& p = backend_.submitted[i].plan.pieces[0];
    EXPECT_EQ(p.stream, backend_.submitted[i - i % 256].plan.pieces[0].stream) << "copy " << i << " left its run";
    EXPECT_EQ(p.joins_previous, i % 256 != 0) << "copy " << i;
  }
  EXPECT_NE(backend_.submitted[0].plan.pieces[0].stream, backend_.submitted[256].plan.pieces[0].stream);
}

// batching.join 0: adjacent copies never join, and go round robin as scattered ones do.
TEST_F(SchedulerTest, AJoinSizeOfZeroJoinsNothing) {
  Start(JoiningUpTo(Chunked(64 * kMiB), 0));
  scheduler_->AddSession(1, 1);
  constexpr uint64_t kPiece = 64 << 10;
  for (uint64_t i = 0; i < 8; ++i) scheduler_->Submit(Copy(i + 1, 1, kSessionSpan + i * kPiece, kPiece));
  scheduler_->Dispatch();
  ExpectEachPlanAloneRoundRobin(8);
}

// Pieces that only look adjacent do not join: a gap on either side, another device region,
// another session's copy between them on the stream, a block list.
TEST_F(SchedulerTest, CopiesThatAreNotAdjacentInOneRegionDoNotJoin) {
  Start(Chunked(64 * kMiB));
  scheduler_->AddSession(1, 1);
  scheduler_->AddSession(2, 1);
  constexpr uint64_t kPiece = 64 << 10;
  const uint64_t base = kSessionSpan;
  auto copy = [&](uint64_t id, uint64_t session, uint64_t host_off, uint64_t dev_off, uint32_t region) {
    CopyRequest r = Copy(id, session, base + host_off, kPiece);
    r.device = device_.data() + base + dev_off;
    r.region_id = region;
    return r;
  };
  scheduler_->Submit(copy(1, 1, 0, 0, 1));
  scheduler_->Submit(copy(2, 1, 2 * kPiece, kPiece, 1));      // host side has a gap
  scheduler_->Submit(copy(3, 1, 3 * kPiece, 3 * kPiece, 1));  // device side has a gap
  scheduler_->Submit(copy(4, 1, 4 * kPiece, 4 * kPiece, 2));  // adjacent, another region
  scheduler_->Submit(copy(5, 1, 5 * kPiece, 5 * kPiece, 2));  // joins 4
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 5u);
  const std::vector<bool> expected{false, false, false, false, true};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(backend_.submitted[i].plan.pieces[0].joins_previous, expected[i]) << "copy " << i + 1;
  }
  // Another session's copy adjacent to 5 on both sides, in a region of the same id, does not
  // join it; the next of session 1 still does.
  scheduler_->Submit(copy(6, 2, 6 * kPiece, 6 * kPiece, 2));
  scheduler_->Dispatch();
  scheduler_->Submit(copy(7, 1, 6 * kPiece, 6 * kPiece, 2));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 7u);
  EXPECT_FALSE(backend_.submitted[5].plan.pieces[0].joins_previous);
  EXPECT_NE(backend_.submitted[5].plan.pieces[0].stream, backend_.submitted[4].plan.pieces[0].stream);
  EXPECT_TRUE(backend_.submitted[6].plan.pieces[0].joins_previous);
  EXPECT_EQ(backend_.submitted[6].plan.pieces[0].stream, backend_.submitted[4].plan.pieces[0].stream);
  // A list's pieces never join, nor does a copy join a list's last block.
  backend_.FinishAll();
  scheduler_->PollBackend();
  CopyRequest list = List(8, 1, base + 7 * kPiece, 4, kPiece);
  list.region_id = 2;
  scheduler_->Submit(list);
  scheduler_->Submit(copy(9, 1, 14 * kPiece, 14 * kPiece, 2));  // where the list's last block ends
  scheduler_->Dispatch();
  for (size_t i = 7; i < backend_.submitted.size(); ++i) {
    for (const CopyPiece& p : backend_.submitted[i].plan.pieces) EXPECT_FALSE(p.joins_previous) << "plan " << i;
  }
}

// Where the backend registered the pool slab by slab, a piece that starts a slab never joins
// the one that ended the slab before: one copy may not span two registrations.
TEST_F(SchedulerTest, AdjacentCopiesDoNotJoinAcrossASlabRegisteredApart) {
  backend_.per_slab = true;
  Start(Chunked(64 * kMiB));
  scheduler_->AddSession(1, 1);
  constexpr uint64_t kPiece = 64 << 10;
  for (uint64_t i = 0; i < 4; ++i) scheduler_->Submit(Copy(i + 1, 1, kSlab - 2 * kPiece + i * kPiece, kPiece));
  scheduler_->Dispatch();
  ASSERT_EQ(backend_.submitted.size(), 4u);
  const std::vector<bool> expected{false, true, false, true};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(backend_.submitted[i].plan.pieces[0].joins_previous, expected[i]) << "copy " << i + 1;
  }
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
