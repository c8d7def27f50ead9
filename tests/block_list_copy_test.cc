// Block-list copies through a real ferryd (host backend) in the test process, written on the
// ring by hand (the entry, its BlockListEntry and the inline list), so that every field can be
// what a hostile or broken client would write. Random data, poisoned destinations, every byte of
// both regions checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <stop_token>
#include <thread>
#include <vector>

#include "block_list_client.hpp"
#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/status_macros.hpp"
#include "common/wire.hpp"
#include "daemon/rings.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using testing::BlockList;
using testing::DaemonHarness;
using testing::Expected;
using testing::FillRandom;
using testing::FirstDifference;
using testing::Group;
using testing::Poison;
using testing::RawClient;
using testing::Shuffled;
using testing::Where;

class BlockListCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(raw_.Open(d_.socket_path()));
    ASSERT_OK_AND_ASSIGN(list_, raw_.AllocBuffer(4 << 20));
  }

  // One list each way between a host buffer and a device region of `blocks` blocks each:
  // host -> device, then device -> host into a fresh poisoned buffer; every byte checked.
  void RoundTrip(const BlockList& l, uint32_t blocks, uint64_t block_bytes, Where where, uint64_t seed) {
    const uint64_t bytes = uint64_t{blocks} * block_bytes;
    ASSERT_OK_AND_ASSIGN(RawClient::Buffer host, raw_.AllocBuffer(bytes));
    ASSERT_OK_AND_ASSIGN(RawClient::Region dev, raw_.RegisterRegion(bytes));
    FillRandom(host.data, bytes, seed);
    Poison(dev.data(), bytes);
    uint64_t sum = 0;
    for (size_t i = 0; i < l.src.size(); ++i) sum += l.lengths.empty() ? block_bytes : l.lengths[i];
    if (where == Where::kPool) {
      const std::vector<std::byte> b = l.Bytes();
      std::memcpy(list_.data, b.data(), b.size());
    }
    raw_.Push(Group(1, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, block_bytes, l, where,
                    list_.pool_offset));
    auto up = raw_.Next();
    ASSERT_TRUE(up.has_value());
    ASSERT_EQ(up->status, 0) << "host to device refused";
    EXPECT_EQ(up->user_tag, 1u);
    EXPECT_EQ(up->bytes, sum);
    const std::vector<std::byte> want_dev = Expected(host.data, bytes, l, block_bytes);
    ASSERT_EQ(FirstDifference(dev.data(), want_dev.data(), bytes), -1) << "device bytes differ";

    ASSERT_OK_AND_ASSIGN(RawClient::Buffer back, raw_.AllocBuffer(bytes));
    Poison(back.data, bytes);
    FillRandom(dev.data(), bytes, seed + 1);  // the device's every block random now
    raw_.Push(Group(2, wire::Opcode::kBlocksDeviceToHost, back.pool_offset, bytes, dev.id, bytes, block_bytes, l, where,
                    list_.pool_offset));
    auto down = raw_.Next();
    ASSERT_TRUE(down.has_value());
    ASSERT_EQ(down->status, 0) << "device to host refused";
    EXPECT_EQ(down->bytes, sum);
    const std::vector<std::byte> want_host = Expected(dev.data(), bytes, l, block_bytes);
    ASSERT_EQ(FirstDifference(back.data, want_host.data(), bytes), -1) << "host bytes differ";
  }

  DaemonHarness d_;
  RawClient raw_;
  RawClient::Buffer list_;
};

TEST_F(BlockListCopy, OddBlockSizesMoveEveryByteBothWaysFromThePool) {
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  RoundTrip(Shuffled(300, 400, 4097, false, seed), 400, 4097, Where::kPool, seed);
}

TEST_F(BlockListCopy, OneBlockAndShortListsTravelInline) {
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  RoundTrip(BlockList{{2}, {5}, {}}, 8, 12345, Where::kInline, seed);
  if (HasFatalFailure()) return;
  // 37 blocks with lengths: 444 bytes, 8 slots after the entry.
  RoundTrip(Shuffled(37, 50, 4097, true, seed), 50, 4097, Where::kInline, seed + 7);
  if (HasFatalFailure()) return;
  // The most an inline list holds: 16 slots, 112 blocks without lengths.
  RoundTrip(Shuffled(112, 120, 511, false, seed), 120, 511, Where::kInline, seed + 9);
}

TEST_F(BlockListCopy, SixtyFiveThousandBlocksWithTheirOwnLengths) {
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  RoundTrip(Shuffled(65536, 70000, 48, true, seed), 70000, 48, Where::kPool, seed);
}

// A list refused: its completion has the error, nothing of it moved, the refusal counted and
// logged with the reason; the session goes on.
TEST_F(BlockListCopy, BadListsAreRefusedWholeAndMoveNothing) {
  constexpr uint64_t kBlock = 4096;
  constexpr uint32_t kBlocks = 64;
  const uint64_t bytes = kBlocks * kBlock;
  ASSERT_OK_AND_ASSIGN(RawClient::Buffer host, raw_.AllocBuffer(bytes));
  ASSERT_OK_AND_ASSIGN(RawClient::Region dev, raw_.RegisterRegion(bytes));
  FillRandom(host.data, bytes, testing::RandomSeed());
  Poison(dev.data(), bytes);
  // Another session's buffer: not this session's memory.
  RawClient other;
  ASSERT_OK(other.Open(d_.socket_path()));
  ASSERT_OK_AND_ASSIGN(RawClient::Buffer foreign, other.AllocBuffer(1 << 20));

  BlockList good{{0, 1, 2, 3}, {10, 11, 12, 13}, {}};
  struct Case {
    const char* what;
    std::vector<wire::SubmissionEntry> slots;
    Code code;
    const char* logged;  // in the session's refusal line
  };
  std::vector<Case> cases;
  BlockList bad_index = good;
  bad_index.dst[2] = kBlocks;
  cases.push_back({"an index past the region",
                   Group(1, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock,
                         bad_index, Where::kInline, 0),
                   Code::kInvalidArgument,
                   "block 2: destination block 64 (offset 262144, 4096 bytes) is outside the device region (262144 "
                   "bytes)"});
  BlockList overlap = good;
  overlap.dst[3] = 10;
  cases.push_back({"two blocks to one destination",
                   Group(2, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock, overlap,
                         Where::kInline, 0),
                   Code::kInvalidArgument, "block 3: destination block 10 is block 0's destination too"});
  auto too_many = Group(3, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock, good,
                        Where::kPool, list_.pool_offset);
  {
    wire::BlockListEntry b;
    std::memcpy(&b, &too_many[1], sizeof b);
    b.block_count = wire::kMaxBlocksPerList + 1;
    b.list_bytes = wire::BlockListBytes(b.block_count, 0);
    std::memcpy(&too_many[1], &b, sizeof b);
  }
  cases.push_back({"too many blocks", too_many, Code::kInvalidArgument, "block list: 262145 blocks (1 to 262144)"});
  cases.push_back({"a list in another session's buffer",
                   Group(4, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock, good,
                         Where::kPool, foreign.pool_offset),
                   Code::kInvalidArgument, "is not inside a buffer of this session"});
  cases.push_back({"a list past its buffer's end",
                   Group(5, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock, good,
                         Where::kPool, list_.pool_offset + (4 << 20) - 16),
                   Code::kInvalidArgument, "is not inside a buffer of this session"});
  cases.push_back({"a device region larger than the registered one",
                   Group(6, wire::Opcode::kBlocksDeviceToHost, host.pool_offset, bytes, dev.id, bytes + 1, kBlock, good,
                         Where::kInline, 0),
                   Code::kInvalidArgument, "device range is outside region"});
  auto flags = Group(7, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock, good,
                     Where::kInline, 0);
  flags[0].flags |= 4;
  cases.push_back({"an unknown flag", flags, Code::kInvalidArgument, "block list: unknown flags 5"});
  // In the pool, the list: indices fine, but its blocks' lengths over the block size.
  BlockList long_block = good;
  long_block.lengths = {4096, 4096, 4097, 1};
  cases.push_back({"a length over the block size",
                   Group(8, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock,
                         long_block, Where::kInline, 0),
                   Code::kInvalidArgument, "block 2: length 4097 is not in 1..4096"});

  const std::vector<std::byte> list_bytes = good.Bytes();
  std::memcpy(list_.data, list_bytes.data(), list_bytes.size());
  std::memcpy(foreign.data, list_bytes.data(), list_bytes.size());
  const uint64_t rejected_before = d_.counters().rejected.load();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ::testing::internal::CaptureStderr();
    raw_.Push(c.slots);
    auto done = raw_.Next();
    const std::string log = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(done.has_value());
    EXPECT_EQ(done->status, static_cast<int32_t>(c.code));
    EXPECT_EQ(done->kind, static_cast<uint16_t>(wire::CompletionKind::kCompleted));
    EXPECT_EQ(done->bytes, 0u);
    EXPECT_NE(log.find(c.logged), std::string::npos) << log;
    std::vector<std::byte> poison(bytes);
    Poison(poison.data(), bytes);
    ASSERT_EQ(FirstDifference(dev.data(), poison.data(), bytes), -1) << "a refused list moved bytes";
  }
  EXPECT_EQ(d_.counters().rejected.load() - rejected_before, cases.size());
  // The session goes on: the good list, from the pool, moves exactly its blocks.
  raw_.Push(Group(9, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock, good,
                  Where::kPool, list_.pool_offset));
  auto done = raw_.Next();
  ASSERT_TRUE(done.has_value());
  ASSERT_EQ(done->status, 0);
  const std::vector<std::byte> want = Expected(host.data, bytes, good, kBlock);
  EXPECT_EQ(FirstDifference(dev.data(), want.data(), bytes), -1);
  EXPECT_EQ(d_.counters().evictions.load(), 0u);
}

// A turn reads at most 64 requests, a group counting as one and read whole: a list that is the
// 64th request of a turn, and one whose slots wrap around the ring's end, both move exactly
// their blocks, and every request around them completes once.
TEST(BlockListRing, GroupsAreReadWholeAtATurnsEndAndAcrossTheRingsEnd) {
  daemon::DaemonConfig config = DaemonHarness::SmallConfig();
  config.ring_entries = 256;
  DaemonHarness d(config);
  RawClient raw;
  ASSERT_OK(raw.Open(d.socket_path()));
  constexpr uint64_t kBlock = 4097;
  const uint64_t bytes = 32 * kBlock;
  ASSERT_OK_AND_ASSIGN(RawClient::Buffer host, raw.AllocBuffer(bytes));
  ASSERT_OK_AND_ASSIGN(RawClient::Region dev, raw.RegisterRegion(bytes));
  FillRandom(host.data, bytes, testing::RandomSeed());
  Poison(dev.data(), bytes);
  const BlockList first = Shuffled(16, 16, kBlock, false, 1);  // 128 bytes: 3 inline slots
  BlockList second = Shuffled(16, 16, kBlock, false, 2);
  for (uint32_t& i : second.dst) i += 16;
  auto nops = [](uint64_t first_tag, size_t n) {
    std::vector<wire::SubmissionEntry> v(n);
    for (size_t i = 0; i < n; ++i) v[i].user_tag = first_tag + i;
    return v;
  };
  // Each of the tags first_tag.. completes once (a copy's completion comes when it is done, so
  // after the Nops read with it).
  auto expect_each_once = [&](uint64_t first_tag, size_t n, uint64_t list_tag, uint64_t list_bytes) {
    std::vector<int> seen(n, 0);
    for (size_t i = 0; i < n; ++i) {
      auto c = raw.Next();
      ASSERT_TRUE(c.has_value()) << "completion " << i;
      ASSERT_EQ(c->status, 0) << "request " << c->user_tag;
      ASSERT_GE(c->user_tag, first_tag);
      ASSERT_LT(c->user_tag, first_tag + n);
      seen[c->user_tag - first_tag]++;
      if (c->user_tag == list_tag) {
        EXPECT_EQ(c->bytes, list_bytes);
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(n));
  };
  // 63 requests, the list (5 slots), 100 more: one publish of 168 slots.
  std::vector<wire::SubmissionEntry> batch = nops(1000, 63);
  const auto group1 = Group(1063, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock,
                            first, Where::kInline, 0);
  ASSERT_EQ(group1.size(), 5u);
  batch.insert(batch.end(), group1.begin(), group1.end());
  const auto after = nops(1064, 100);
  batch.insert(batch.end(), after.begin(), after.end());
  raw.Push(batch);
  expect_each_once(1000, 164, 1063, 16 * kBlock);
  if (HasFatalFailure()) return;
  // Slots 168..253, then the second list in 254, 255, 0, 1, 2.
  raw.Push(nops(2000, 86));
  expect_each_once(2000, 86, 0, 0);
  if (HasFatalFailure()) return;
  raw.Push(Group(3000, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock, second,
                 Where::kInline, 0));
  expect_each_once(3000, 1, 3000, 16 * kBlock);
  if (HasFatalFailure()) return;
  std::vector<std::byte> want = Expected(host.data, bytes, first, kBlock);
  for (size_t i = 0; i < second.src.size(); ++i) {
    std::memcpy(want.data() + second.dst[i] * kBlock, host.data + second.src[i] * kBlock, kBlock);
  }
  EXPECT_EQ(FirstDifference(dev.data(), want.data(), bytes), -1);
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

// A group whose slots are not all published breaks the ring's protocol: the session is evicted
// and nothing of the list moves.
TEST_F(BlockListCopy, AGroupPublishedInPartEvictsTheSession) {
  constexpr uint64_t kBlock = 4096;
  const uint64_t bytes = 8 * kBlock;
  ASSERT_OK_AND_ASSIGN(RawClient::Buffer host, raw_.AllocBuffer(bytes));
  ASSERT_OK_AND_ASSIGN(RawClient::Region dev, raw_.RegisterRegion(bytes));
  FillRandom(host.data, bytes, testing::RandomSeed());
  Poison(dev.data(), bytes);
  const BlockList l = Shuffled(8, 8, kBlock, false, 1);
  const auto slots =
      Group(1, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock, l, Where::kInline, 0);
  raw_.Push(slots, /*publish=*/slots.size() - 1);
  EXPECT_TRUE(raw_.DaemonHungUp());
  std::vector<std::byte> poison(bytes);
  Poison(poison.data(), bytes);
  EXPECT_EQ(FirstDifference(dev.data(), poison.data(), bytes), -1) << "a list of an evicted group moved bytes";
  EXPECT_EQ(d_.counters().evictions.load(), 1u);
}

// An inline list of more slots than the protocol allows: where the next request starts is
// unknown, so the session is evicted, and nothing moves.
TEST_F(BlockListCopy, AnInlineListOfMoreThan16SlotsEvictsTheSession) {
  constexpr uint64_t kBlock = 64;
  const uint64_t bytes = 200 * kBlock;
  ASSERT_OK_AND_ASSIGN(RawClient::Buffer host, raw_.AllocBuffer(bytes));
  ASSERT_OK_AND_ASSIGN(RawClient::Region dev, raw_.RegisterRegion(bytes));
  FillRandom(host.data, bytes, testing::RandomSeed());
  Poison(dev.data(), bytes);
  const BlockList l = Shuffled(112, 200, kBlock, false, 3);  // 16 slots: the most allowed
  auto slots =
      Group(1, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, dev.id, bytes, kBlock, l, Where::kInline, 0);
  ASSERT_EQ(slots.size(), 18u);
  wire::BlockListEntry b;
  std::memcpy(&b, &slots[1], sizeof b);
  b.inline_slots = 17;
  std::memcpy(&slots[1], &b, sizeof b);
  slots.emplace_back();
  raw_.Push(slots);
  EXPECT_TRUE(raw_.DaemonHungUp());
  std::vector<std::byte> poison(bytes);
  Poison(poison.data(), bytes);
  EXPECT_EQ(FirstDifference(dev.data(), poison.data(), bytes), -1);
  EXPECT_EQ(d_.counters().evictions.load(), 1u);
}

// The largest list, kMaxBlocksPerList one-byte blocks that never coalesce (block i of each region
// at byte 2i), in a pool buffer: the most blocks ferryd plans and checks for one request.
struct LargestList {
  static constexpr uint32_t kBlocks = wire::kMaxBlocksPerList;
  static constexpr uint64_t kSpan = 2ull * kBlocks;  // bytes of each region
  RawClient::Buffer host, list;
  RawClient::Region dev;
  Status Open(RawClient& raw, bool repeat_a_destination) {
    FERRY_ASSIGN_OR_RETURN(host, raw.AllocBuffer(kSpan));
    FERRY_ASSIGN_OR_RETURN(dev, raw.RegisterRegion(kSpan));
    FERRY_ASSIGN_OR_RETURN(list, raw.AllocBuffer(wire::BlockListBytes(kBlocks, 0)));
    std::vector<uint32_t> words(2 * size_t{kBlocks});
    for (uint32_t i = 0; i < kBlocks; ++i) words[i] = words[kBlocks + i] = 2 * i;
    if (repeat_a_destination) words.back() = 0;  // the last block lands where the first does
    std::memcpy(list.data, words.data(), words.size() * sizeof(uint32_t));
    return Status::Ok();
  }
  std::vector<wire::SubmissionEntry> Group(uint64_t tag, uint32_t wait_event = wire::kNoEvent,
                                           uint32_t wait_value = 0) const {
    wire::SubmissionEntry e{};
    e.user_tag = tag;
    e.opcode = static_cast<uint16_t>(wire::Opcode::kBlocksHostToDevice);
    e.pool_offset = host.pool_offset;
    e.length = kSpan;
    e.region_id = dev.id;
    e.wait_event_id = wait_event;
    e.wait_value = wait_value;
    wire::BlockListEntry b{};
    b.device_bytes = kSpan;
    b.block_bytes = 1;
    b.block_count = kBlocks;
    b.list_bytes = wire::BlockListBytes(kBlocks, 0);
    b.list_pool_offset = list.pool_offset;
    std::vector<wire::SubmissionEntry> slots(2);
    slots[0] = e;
    std::memcpy(&slots[1], &b, sizeof b);
    return slots;
  }
};

// Each list is one copy against a session's cap on copies in flight, but ferryd keeps a plan of
// every block until the list is done: lists parked on a flag never written once made ferryd
// hold 1.3 GiB for one client's 64-entry ring (about 20 GiB at the default ring). A session's
// lists past kBlocksInFlightPerSession wait on its ring, and ferryd sleeps over them.
TEST(BlockListRing, ListsPastTheSessionsBlocksInFlightWaitOnTheRingUntilOneIsDone) {
  DaemonHarness d;
  RawClient raw;
  ASSERT_OK(raw.Open(d.socket_path()));
  LargestList big;
  ASSERT_OK(big.Open(raw, false));
  ASSERT_OK_AND_ASSIGN(const wire::RegisterEventReply ev, raw.RegisterEvent(wire::kEventWantsFlag));
  ASSERT_NE(ev.flag_index, wire::kNoFlag);
  FillRandom(big.host.data, big.kSpan, testing::RandomSeed());
  Poison(big.dev.data(), big.kSpan);
  static_assert(daemon::Rings::kBlocksInFlightPerSession < 2ull * LargestList::kBlocks);
  constexpr int kLists = 3;
  std::vector<wire::SubmissionEntry> slots;
  for (int i = 0; i < kLists; ++i) {
    const auto g = big.Group(i + 1, ev.event_id, 1);
    slots.insert(slots.end(), g.begin(), g.end());
  }
  raw.Push(slots);
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().in_flight.load() == 1; }, 30'000));
  EXPECT_TRUE(raw.DaemonSleepsFor(100ms)) << "ferryd polls over lists it cannot take";
  EXPECT_EQ(d.counters().in_flight.load(), 1u);
  EXPECT_EQ(raw.header()->sq_head.value.load(), 2u) << "only the first list's group was read";
  raw.Record(ev.flag_index, 1);
  for (int i = 0; i < kLists; ++i) {
    auto c = raw.Next();
    ASSERT_TRUE(c.has_value()) << "list " << i << " never completed";
    EXPECT_EQ(c->status, 0) << "list " << c->user_tag;
    EXPECT_EQ(c->bytes, uint64_t{LargestList::kBlocks});
  }
  std::vector<std::byte> want(big.kSpan);
  Poison(want.data(), want.size());
  for (uint64_t i = 0; i < big.kSpan; i += 2) want[i] = big.host.data[i];
  EXPECT_EQ(FirstDifference(big.dev.data(), want.data(), big.kSpan), -1);
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

// `count` 4 KiB host-to-device copies by `client` into `target`, each of fresh random bytes into a
// poisoned destination, every byte checked; appends each one's time from its submission to its
// wait's return to `waits`.
void TimeCopiesOf4KiB(Client& client, testing::CopyTarget& target, int count, std::vector<uint64_t>& waits) {
  auto& [src, dev, region] = target;
  for (int i = 0; i < count; ++i) {
    FillRandom(src.data(), 4096, testing::RandomSeed() + i);
    Poison(target.device(), 4096);
    const uint64_t t0 = MonotonicNanos();
    auto t = client.Copy(Direction::kHostToDevice, src, 0, region, 0, 4096);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_OK(t->Wait(20s));
    waits.push_back(MonotonicNanos() - t0);
    EXPECT_EQ(FirstDifference(target.device(), src.data(), 4096), -1) << "copy " << i;
  }
}

// ferryd checks every block of a list on its loop before it refuses or accepts it. A client
// flooding its ring with the largest lists, each refused at its last block, once had 64 of them
// checked in one turn while another client's 4 KiB copy waited for the turn's end; and sockets,
// looked at every 32nd turn, waited 32 lists' checks (a stop, ~6 s under TSan). A turn reads
// lists of at most kBlocksPerTurn blocks a session, and sockets are looked at after 1 ms of
// turns: each waits for about one list's check.
TEST(BlockListRing, RefusedLargestListsHoldUpAnotherClientsCopyForAboutOneListsCheck) {
  daemon::DaemonConfig config = DaemonHarness::SmallConfig();
  config.ring_entries = 256;  // room for more lists than a turn reads
  DaemonHarness d(config);
  RawClient raw;
  ASSERT_OK(raw.Open(d.socket_path(), "flood"));
  LargestList big;
  ASSERT_OK(big.Open(raw, true));
  // How long one refused list takes, from its publishing to its completion.
  auto completions_after = [&](uint32_t tail) {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (raw.header()->cq_tail.value.load(std::memory_order_acquire) == tail) {
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
    return true;
  };
  std::vector<uint64_t> one;
  for (int i = 0; i < 3; ++i) {
    const uint32_t cq_tail = raw.header()->cq_tail.value.load();
    const uint64_t t0 = MonotonicNanos();
    raw.Push(big.Group(100 + i));
    ASSERT_TRUE(completions_after(cq_tail));
    one.push_back(MonotonicNanos() - t0);
    auto c = raw.Next();
    ASSERT_TRUE(c.has_value());
    ASSERT_EQ(c->status, static_cast<int32_t>(Code::kInvalidArgument)) << "the list must be refused";
  }
  std::sort(one.begin(), one.end());
  const uint64_t list_ns = one[one.size() / 2];

  std::jthread flood([&](std::stop_token stop) {  // stopped and joined however the test ends
    for (uint64_t tag = 1000; !stop.stop_requested(); ++tag) {
      while (!stop.stop_requested() &&
             raw.header()->sq_tail.value.load() - raw.header()->sq_head.value.load() + 2 > config.ring_entries) {
        raw.header()->cq_head.value.store(raw.header()->cq_tail.value.load());  // reaps every refusal
      }
      if (stop.stop_requested()) break;
      raw.Push(big.Group(tag));
      raw.header()->cq_head.value.store(raw.header()->cq_tail.value.load());
    }
  });
  // The flood is on: its ring holds lists waiting to be read.
  ASSERT_TRUE(DaemonHarness::Eventually(
      [&] { return raw.header()->sq_tail.value.load() - raw.header()->sq_head.value.load() >= 64; }));
  // Control messages (a hello, a buffer, device memory and its region) are read between turns.
  const uint64_t control_start = MonotonicNanos();
  auto victim = d.Connect("victim");
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  auto made = testing::MakeCopyTarget(**victim, 4096);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const uint64_t control_ns = MonotonicNanos() - control_start;
  std::vector<uint64_t> waits;
  ASSERT_NO_FATAL_FAILURE(TimeCopiesOf4KiB(**victim, *made, 8, waits));
  const uint64_t worst = *std::max_element(waits.begin(), waits.end());
  EXPECT_EQ(d.counters().evictions.load(), 0u);
  // Stopping is an event on the loop's epoll too: seen within a turn or two, flood or not. So
  // ferryd checks at most a few more lists once asked to stop. Counted, not timed: once the
  // loop has ended no refusal comes, and the count does not grow with the machine's load (under
  // TSan beside another test a stop once took 4.3 times a list's check timed before the flood;
  // 1 or 2 lists are counted there).
  const uint32_t refusals_before_stop = raw.header()->cq_tail.value.load(std::memory_order_acquire);
  const uint64_t stop_start = MonotonicNanos();
  d.Stop();
  const uint64_t stop_ns = MonotonicNanos() - stop_start;
  const uint32_t refused_while_stopping =
      raw.header()->cq_tail.value.load(std::memory_order_acquire) - refusals_before_stop;
  flood.request_stop();
  flood.join();
  EXPECT_LT(control_ns, 16 * list_ns + 50'000'000)
      << "connecting and setting up took " << control_ns / 1000 << " us beside refused lists, one of which takes "
      << list_ns / 1000 << " us";
  EXPECT_LT(worst, 6 * list_ns + 20'000'000)
      << "a 4 KiB copy waited " << worst / 1000 << " us behind refused lists, one of which takes " << list_ns / 1000
      << " us";
  EXPECT_LE(refused_while_stopping, 4u) << "ferryd refused " << refused_while_stopping
                                        << " lists after it was asked to stop (stopping took " << stop_ns / 1000
                                        << " us; one list takes " << list_ns / 1000 << " us)";
}

// Each turn once read one list from every client that had one: six clients flooding ferryd
// with the largest lists made a turn six lists' checks long, and another client's 4 KiB copy
// waited behind them. A turn now reads kBlocksPerTurn blocks of lists over all clients, starting
// with the client its budget left waiting last.
TEST(BlockListRing, ManyClientsRefusedLargestListsHoldUpAnotherClientsCopyForAboutOneListsCheck) {
  constexpr int kFlooders = 6;
  daemon::DaemonConfig config = DaemonHarness::SmallConfig();
  config.ring_entries = 64;
  DaemonHarness d(config);
  std::vector<std::unique_ptr<RawClient>> raws;
  std::vector<LargestList> lists(kFlooders);
  for (int i = 0; i < kFlooders; ++i) {
    raws.push_back(std::make_unique<RawClient>());
    ASSERT_OK(raws[i]->Open(d.socket_path(), "flood" + std::to_string(i)));
    ASSERT_OK(lists[i].Open(*raws[i], true));
  }
  // Each flooder keeps its ring full of lists; it sleeps while there is no room, leaving the
  // CPUs to ferryd.
  std::vector<std::jthread> floods;
  for (int i = 0; i < kFlooders; ++i) {
    floods.emplace_back([&, i](std::stop_token stop) {
      RawClient& raw = *raws[i];
      for (uint64_t tag = 1000; !stop.stop_requested(); ++tag) {
        raw.header()->cq_head.value.store(raw.header()->cq_tail.value.load());  // reaps every refusal
        if (raw.header()->sq_tail.value.load() - raw.header()->sq_head.value.load() + 2 > config.ring_entries) {
          std::this_thread::sleep_for(100us);
          continue;
        }
        raw.Push(lists[i].Group(tag));
      }
    });
  }
  for (auto& raw : raws) {
    ASSERT_TRUE(DaemonHarness::Eventually(
        [&] { return raw->header()->sq_tail.value.load() - raw->header()->sq_head.value.load() >= 32; }));
  }
  auto victim = d.Connect("victim");
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  auto made = testing::MakeCopyTarget(**victim, 4096);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  // How long a list takes under the flood, whatever else the CPUs are doing: the lists ferryd
  // finished (refused) while the copies below ran, over that time.
  auto lists_done = [&] {
    uint64_t n = 0;
    for (auto& raw : raws) n += raw->header()->cq_tail.value.load();
    return n;
  };
  std::vector<uint32_t> each_before;
  for (auto& raw : raws) each_before.push_back(raw->header()->cq_tail.value.load());
  const uint64_t lists_before = lists_done(), window_start = MonotonicNanos();
  std::vector<uint64_t> waits;
  ASSERT_NO_FATAL_FAILURE(TimeCopiesOf4KiB(**victim, *made, 9, waits));
  const uint64_t lists_finished = lists_done() - lists_before, window_ns = MonotonicNanos() - window_start;
  std::vector<uint32_t> each;
  for (int i = 0; i < kFlooders; ++i) each.push_back(raws[i]->header()->cq_tail.value.load() - each_before[i]);
  floods.clear();  // stops and joins them
  // Every client's lists are read in their turn: none is left out while others go on.
  const auto [fewest, most] = std::minmax_element(each.begin(), each.end());
  EXPECT_GE(*fewest, 1u) << "a flooding client had no list read while the others had up to " << *most;
  EXPECT_LE(*most, 3 * *fewest + 3) << "the flooding clients' lists were not read in turn: " << *fewest << " to "
                                    << *most;
  ASSERT_GT(lists_finished, 0u);
  const uint64_t list_ns = window_ns / lists_finished;
  EXPECT_EQ(d.counters().evictions.load(), 0u);
  std::sort(waits.begin(), waits.end());
  const uint64_t median = waits[waits.size() / 2];
  std::printf("4 KiB copy beside %d flooding clients: median %.0f us, worst %.0f us; a list each %.0f us\n", kFlooders,
              median / 1e3, waits.back() / 1e3, list_ns / 1e3);
  // Read in the turn after the one it came during and done a turn or two later: about two
  // lists' checks. Six lists a turn made it seven or more.
  EXPECT_LT(median, 4 * list_ns) << "a 4 KiB copy waited a median " << median / 1000 << " us behind " << kFlooders
                                 << " clients' refused lists, one every " << list_ns / 1000 << " us";
}

}  // namespace
}  // namespace ferry
