// Block-list copies through libferry (Client::CopyBlocks) end to end: a real ferryd Server (host
// backend) inside the test process, real clients over the real socket and rings. Every list uses random data,
// shuffled indices and a poisoned destination; every byte of the destination is checked, those
// outside the list's blocks for the poison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/wire.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using testing::CopyTarget;
using testing::DaemonHarness;
using testing::FillRandom;
using testing::FirstDifference;
using testing::MakeCopyTarget;
using testing::Poison;

// `count` distinct block indices of a region of `region_blocks`, in random order.
std::vector<uint32_t> ShuffledIndices(uint32_t region_blocks, size_t count, std::mt19937_64& rng) {
  std::vector<uint32_t> all(region_blocks);
  std::iota(all.begin(), all.end(), 0u);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(count);
  return all;
}

struct ListShape {
  size_t block_bytes;
  size_t blocks;
  bool lengths;  // per-block lengths, random in 1..block_bytes
};

std::string Describe(Direction dir, const ListShape& s) {
  return std::string(dir == Direction::kHostToDevice ? "h2d " : "d2h ") + std::to_string(s.blocks) + " x " +
         std::to_string(s.block_bytes) + (s.lengths ? " with lengths" : "");
}

// A host buffer and a device region of `region_blocks` blocks each (past their offsets, plus an odd
// tail that no block reaches), with the list's indices and lengths, ready to copy either way.
struct ListCase {
  HostBuffer host;
  DeviceAllocation dev;
  DeviceRegion region;
  size_t host_offset = 0, device_offset = 0;
  size_t block_bytes = 0;
  std::vector<uint32_t> src, dst, lengths;
  BlockList list() const { return BlockList{.block_bytes = block_bytes, .src = src, .dst = dst, .lengths = lengths}; }
};

Result<ListCase> MakeCase(Client& client, const ListShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto region_blocks = static_cast<uint32_t>(s.blocks + s.blocks / 4 + 3);  // room the list leaves alone
  const size_t host_offset = seed % 61, device_offset = seed % 37, tail = 5;
  FERRY_ASSIGN_OR_RETURN(HostBuffer host, client.AllocateHost(host_offset + region_blocks * s.block_bytes + tail));
  FERRY_ASSIGN_OR_RETURN(DeviceAllocation dev,
                         client.AllocateDevice(device_offset + region_blocks * s.block_bytes + tail));
  FERRY_ASSIGN_OR_RETURN(DeviceRegion region, client.RegisterDevice(dev.data(), dev.size()));
  ListCase c{.host = std::move(host),
             .dev = std::move(dev),
             .region = std::move(region),
             .host_offset = host_offset,
             .device_offset = device_offset,
             .block_bytes = s.block_bytes,
             .src = {},
             .dst = {},
             .lengths = {}};
  c.src = ShuffledIndices(region_blocks, s.blocks, rng);
  c.dst = ShuffledIndices(region_blocks, s.blocks, rng);
  if (s.lengths) {
    std::uniform_int_distribution<uint32_t> len(1, static_cast<uint32_t>(s.block_bytes));
    for (size_t i = 0; i < s.blocks; ++i) c.lengths.push_back(len(rng));
    c.lengths[0] = static_cast<uint32_t>(s.block_bytes);  // the full length and 1 byte both occur
    if (s.blocks > 1) c.lengths[1] = 1;
  }
  return c;
}

// Fills the source side with random data and poisons the destination side; returns what the
// destination side must hold after the copy (the poison, with the list's blocks copied in).
std::vector<std::byte> Prepare(ListCase& c, Direction dir, uint64_t seed) {
  auto* dev = static_cast<std::byte*>(c.dev.data());
  std::byte* source = dir == Direction::kHostToDevice ? c.host.data() : dev;
  std::byte* destination = dir == Direction::kHostToDevice ? dev : c.host.data();
  const size_t source_size = dir == Direction::kHostToDevice ? c.host.size() : c.dev.size();
  const size_t destination_size = dir == Direction::kHostToDevice ? c.dev.size() : c.host.size();
  const size_t source_offset = dir == Direction::kHostToDevice ? c.host_offset : c.device_offset;
  const size_t destination_offset = dir == Direction::kHostToDevice ? c.device_offset : c.host_offset;
  FillRandom(source, source_size, seed);
  Poison(destination, destination_size);
  std::vector<std::byte> want(destination, destination + destination_size);
  for (size_t i = 0; i < c.src.size(); ++i) {
    const size_t len = c.lengths.empty() ? c.block_bytes : c.lengths[i];
    std::memcpy(want.data() + destination_offset + c.dst[i] * c.block_bytes,
                source + source_offset + c.src[i] * c.block_bytes, len);
  }
  return want;
}

const std::byte* Destination(const ListCase& c, Direction dir) {
  return dir == Direction::kHostToDevice ? static_cast<const std::byte*>(c.dev.data()) : c.host.data();
}

uint64_t ListBytes(const ListCase& c) {
  if (c.lengths.empty()) return c.src.size() * c.block_bytes;
  return std::accumulate(c.lengths.begin(), c.lengths.end(), uint64_t{0});
}

// Copies one list of `shape` in `dir` and checks every byte of the destination side.
void CopyAndCheck(Client& client, Direction dir, const ListShape& shape, uint64_t seed) {
  SCOPED_TRACE(Describe(dir, shape));
  ASSERT_OK_AND_ASSIGN(ListCase c, MakeCase(client, shape, seed));
  const std::vector<std::byte> want = Prepare(c, dir, seed + 1);
  ASSERT_OK_AND_ASSIGN(Transfer t, client.CopyBlocks(dir, c.host, c.host_offset, c.region, c.device_offset, c.list()));
  EXPECT_EQ(t.bytes(), ListBytes(c));
  ASSERT_OK(t.Wait(20s));
  EXPECT_EQ(FirstDifference(Destination(c, dir), want.data(), want.size()), -1)
      << "destination differs (blocks copied wrong, or poison outside them overwritten)";
}

// Lists up to 112 blocks (74 with lengths) travel in the ring; longer ones in pool buffers.
constexpr size_t kInlineBlocks = wire::kMaxInlineListSlots * sizeof(wire::SubmissionEntry) / 8;
constexpr size_t kInlineBlocksWithLengths = wire::kMaxInlineListSlots * sizeof(wire::SubmissionEntry) / 12;

TEST(BlockList, CopiesEveryBlockBothWaysAtAwkwardSizesInlineAndInPoolBuffers) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const ListShape shapes[] = {
      {4097, 1, false},                          // one block, odd size
      {4097, 37, true},                          // inline, per-block lengths
      {1, kInlineBlocks, false},                 // the longest inline list, 1-byte blocks
      {3, kInlineBlocksWithLengths, true},       // the longest inline list with lengths
      {4097, kInlineBlocks + 1, false},          // the shortest pool-buffer list
      {16, kInlineBlocksWithLengths + 1, true},  // ... with lengths
      {(64 << 10) + 3, 9, false},                // blocks above the policy's chunk size / 4
      {16, 65536, false},                        // 65,536 small blocks
      {24, 65536, true},                         // ... with lengths
  };
  for (Direction dir : {Direction::kHostToDevice, Direction::kDeviceToHost}) {
    for (const ListShape& s : shapes) {
      CopyAndCheck(*client, dir, s, seed + s.blocks * 31 + s.block_bytes);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(BlockList, TheLongestListCopiesEveryBlock) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // 262,144 blocks with lengths: a 3 MiB list, the largest list buffer.
  CopyAndCheck(*client, Direction::kHostToDevice, {8, wire::kMaxBlocksPerList, true}, seed);
  CopyAndCheck(*client, Direction::kDeviceToHost, {4, wire::kMaxBlocksPerList, false}, seed + 1);
}

// The list's own checks, made before anything reaches ferryd: a clear error naming the first bad
// block, and no byte moves.
TEST(BlockList, BadListsAreRefusedNamingTheFirstBadBlockAndMoveNothing) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  constexpr size_t kBlock = 4096, kBlocks = 64;
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, kBlocks * kBlock));
  auto& [host, dev, region] = target;
  FillRandom(host.data(), host.size(), testing::RandomSeed());
  Poison(static_cast<std::byte*>(dev.data()), dev.size());
  std::vector<uint32_t> src(32), dst(32), lengths(32, kBlock);
  std::iota(src.begin(), src.end(), 0u);
  std::iota(dst.begin(), dst.end(), 32u);
  struct Bad {
    const char* what;
    std::function<void(BlockList&, std::vector<uint32_t>&, std::vector<uint32_t>&, std::vector<uint32_t>&)> spoil;
    size_t host_offset = 0, device_offset = 0;
    const char* message;
  };
  std::vector<uint32_t> too_many(wire::kMaxBlocksPerList + 1);
  const std::vector<Bad> bad = {
      {"lists of different lengths", [](auto& l, auto&, auto& d, auto&) { l.dst = std::span(d).first(31); }, 0, 0,
       "equally long"},
      {"lengths of another length", [](auto& l, auto&, auto&, auto& n) { l.lengths = std::span(n).first(5); }, 0, 0,
       "equally long"},
      {"no blocks", [](auto& l, auto&, auto&, auto&) { l.src = {}, l.dst = {}; }, 0, 0, "1 to 262144"},
      {"too many blocks", [&](auto& l, auto&, auto&, auto&) { l.src = too_many, l.dst = too_many; }, 0, 0,
       "262145 blocks"},
      {"block_bytes 0", [](auto& l, auto&, auto&, auto&) { l.block_bytes = 0; }, 0, 0, "block_bytes 0"},
      {"a length of 0", [](auto& l, auto&, auto&, auto& n) { n[7] = 0, l.lengths = n; }, 0, 0,
       "block 7: length 0 is not in 1..block_bytes (4096)"},
      {"a length past block_bytes", [](auto& l, auto&, auto&, auto& n) { n[9] = kBlock + 1, l.lengths = n; }, 0, 0,
       "block 9: length 4097"},
      {"a source block outside the host region", [](auto&, auto& s, auto&, auto&) { s[3] = kBlocks; }, 0, 0,
       "block 3: source block 64 (bytes [262144, +4096)) is outside the host region of 262144 bytes"},
      {"a destination block outside the device region", [](auto&, auto&, auto& d, auto&) { d[17] = 9000; }, 0, 0,
       "block 17: destination block 9000 (bytes [36864000, +4096)) is outside the device region of 262144 bytes"},
      {"the last block past the region by an offset", [](auto&, auto&, auto& d, auto&) { d[31] = kBlocks - 1; }, 0, 1,
       "block 31: destination block 63 (bytes [258048, +4096)) is outside the device region of 262143 bytes"},
      {"a host offset that shrinks the source region", [](auto&, auto& s, auto&, auto&) { s[0] = kBlocks - 1; }, 8, 0,
       "block 0: source block 63"},
      {"a short last block still inside with its length",
       [](auto& l, auto&, auto& d, auto& n) { d[4] = kBlocks - 1, n[4] = kBlock - 8, l.lengths = n, d[5] = 1u << 31; },
       0, 8, "block 5: destination block 2147483648"},
      {"a repeated destination", [](auto&, auto&, auto& d, auto&) { d[12] = d[4]; }, 0, 0,
       "block 12: destination block 36 is also block 4's"},
      {"a repeat before a block out of range", [](auto&, auto& s, auto& d, auto&) { d[6] = d[2], s[20] = 999; }, 0, 0,
       "block 6: destination block 34 is also block 2's"},
      {"a block out of range before a repeat", [](auto&, auto& s, auto& d, auto&) { s[2] = 999, d[6] = d[1]; }, 0, 0,
       "block 2: source block 999"},
      {"a host offset past the buffer", [](auto&, auto&, auto&, auto&) {}, kBlocks * kBlock + 1, 0,
       "host_offset 262145 is past the buffer's 262144 bytes"},
      {"a device offset past the region", [](auto&, auto&, auto&, auto&) {}, 0, kBlocks * kBlock + 1,
       "device_offset 262145 is past the region's 262144 bytes"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    std::vector<uint32_t> s = src, t = dst, n = lengths;
    BlockList list{.block_bytes = kBlock, .src = s, .dst = t, .lengths = {}};
    b.spoil(list, s, t, n);
    auto r = client->CopyBlocks(Direction::kHostToDevice, host, b.host_offset, region, b.device_offset, list);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find(b.message), std::string::npos) << r.status().ToString();
  }
  // The large-index path of the repeat check (indices too far apart for its bitmap): a sparse
  // device region of 256 MiB, 1-byte blocks.
  {
    ASSERT_OK_AND_ASSIGN(DeviceAllocation big, client->AllocateDevice(256 << 20));
    ASSERT_OK_AND_ASSIGN(DeviceRegion big_region, client->RegisterDevice(big.data(), big.size()));
    std::vector<uint32_t> s = {0, 1, 2, 3}, t = {(1u << 27) + 5, 5, (1u << 27) + 5, 5};
    auto r =
        client->CopyBlocks(Direction::kHostToDevice, host, 0, big_region, 0, {.block_bytes = 1, .src = s, .dst = t, .lengths = {}});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("block 2: destination block 134217733 is also block 0's"), std::string::npos)
        << r.status().ToString();
  }
  // The same checks name the device as the source of a device-to-host list.
  {
    std::vector<uint32_t> s = src, t = dst;
    s[30] = 70;
    t[0] = 0;
    auto r =
        client->CopyBlocks(Direction::kDeviceToHost, host, 0, region, 0, {.block_bytes = kBlock, .src = s, .dst = t, .lengths = {}});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(
        r.status().message().find("block 30: source block 70 (bytes [286720, +4096)) is outside the device region"),
        std::string::npos)
        << r.status().ToString();
  }
  // Nothing moved, and nothing reached ferryd.
  const auto* p = static_cast<const std::byte*>(dev.data());
  for (size_t i = 0; i < dev.size(); ++i) ASSERT_EQ(p[i], std::byte{0xA5}) << "a refused list wrote byte " << i;
  ASSERT_OK_AND_ASSIGN(DaemonStats st, client->Stats());
  EXPECT_EQ(st.copies_completed, 0u);
  EXPECT_EQ(st.rejected, 0u);
  // And the session still copies.
  CopyAndCheck(*client, Direction::kHostToDevice, {kBlock, 5, false}, testing::RandomSeed());
}

TEST(BlockList, AListAfterAnEventWaitsForItAndIsStreamWaitable) {
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(inner.ok());
  auto backend = std::make_unique<testing::PausableBackend>(std::move(*inner));
  testing::PausableBackend* be = backend.get();
  DaemonHarness d(DaemonHarness::SmallConfig(), std::move(backend));
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ASSERT_OK_AND_ASSIGN(ListCase held, MakeCase(*client, {4097, 300, true}, seed));
  ASSERT_OK_AND_ASSIGN(ListCase free, MakeCase(*client, {4097, 40, false}, seed + 1));
  const std::vector<std::byte> held_want = Prepare(held, Direction::kHostToDevice, seed + 2);
  const std::vector<std::byte> free_want = Prepare(free, Direction::kHostToDevice, seed + 3);
  ASSERT_OK_AND_ASSIGN(SharedEvent ev, client->CreateEvent());
  be->HoldEvents(true);  // the client's kernel has not reached its record yet
  ASSERT_OK(ev.Record(nullptr));
  ASSERT_OK_AND_ASSIGN(Transfer after,
                       client->CopyBlocks(Direction::kHostToDevice, held.host, held.host_offset, held.region,
                                          held.device_offset, held.list(), {.after = &ev, .stream_waitable = true}));
  ASSERT_OK_AND_ASSIGN(Transfer other, client->CopyBlocks(Direction::kHostToDevice, free.host, free.host_offset,
                                                          free.region, free.device_offset, free.list()));
  ASSERT_OK(other.Wait(5s));  // a list submitted later, with no dependency, is not stuck behind it
  EXPECT_EQ(FirstDifference(Destination(free, Direction::kHostToDevice), free_want.data(), free_want.size()), -1);
  ASSERT_OK_AND_ASSIGN(bool done, after.Poll());
  EXPECT_FALSE(done) << "the list ran before its event happened";
  const auto* dev = Destination(held, Direction::kHostToDevice);
  for (size_t i = 0; i < held.dev.size(); ++i) ASSERT_EQ(dev[i], std::byte{0xA5}) << "held list wrote byte " << i;
  be->HoldEvents(false);
  ASSERT_OK(after.StreamWait(nullptr));  // the host backend's stream wait waits on the host
  EXPECT_EQ(FirstDifference(dev, held_want.data(), held_want.size()), -1);

  // Both directions' lists waited on together, one of them inline.
  const std::vector<std::byte> back_want = Prepare(held, Direction::kDeviceToHost, seed + 4);
  const std::vector<std::byte> up_want = Prepare(free, Direction::kHostToDevice, seed + 5);
  std::vector<Transfer> step;
  for (auto [c, dir] : {std::pair{&held, Direction::kDeviceToHost}, std::pair{&free, Direction::kHostToDevice}}) {
    ASSERT_OK_AND_ASSIGN(Transfer t, client->CopyBlocks(dir, c->host, c->host_offset, c->region, c->device_offset,
                                                        c->list(), {.after = &ev, .stream_waitable = true}));
    step.push_back(std::move(t));
  }
  ASSERT_OK(client->StreamWait(step, nullptr));
  EXPECT_EQ(FirstDifference(Destination(held, Direction::kDeviceToHost), back_want.data(), back_want.size()), -1);
  EXPECT_EQ(FirstDifference(Destination(free, Direction::kHostToDevice), up_want.data(), up_want.size()), -1);
}

// A list too long for the ring travels in a pool buffer: the first of its size costs the client
// a buffer from ferryd (a round trip on its socket), the ones after it reuse that buffer.
TEST(BlockList, AListBufferIsAskedForOnceAndThenReused) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ASSERT_OK_AND_ASSIGN(ListCase c, MakeCase(*client, ListShape{1000, kInlineBlocks + 200, false}, seed));
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE("list " + std::to_string(i));
    const uint64_t asked_before = d.counters().buffers_allocated.load();
    const Direction dir = i % 2 ? Direction::kDeviceToHost : Direction::kHostToDevice;
    const std::vector<std::byte> want = Prepare(c, dir, seed + 10 + i);
    ASSERT_OK_AND_ASSIGN(Transfer t, client->CopyBlocks(dir, c.host, c.host_offset, c.region, c.device_offset, c.list()));
    ASSERT_OK(t.Wait(20s));
    EXPECT_EQ(FirstDifference(Destination(c, dir), want.data(), want.size()), -1);
    EXPECT_EQ(d.counters().buffers_allocated.load() - asked_before, i == 0 ? 1u : 0u)
        << (i == 0 ? "the first list's buffer did not come from ferryd" : "a warm cache asked ferryd for a buffer");
  }
}

// More lists in flight than the ring has room for at once, inline ones (18 slots each, wrapping
// around the ring) and pool-buffer ones, all in flight at once; later rounds reuse the list
// buffers the first round's lists gave back.
TEST(BlockList, ManyListsInFlightWrapTheRingAndRecycleTheirListBuffers) {
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(inner.ok());
  auto backend = std::make_unique<testing::PausableBackend>(std::move(*inner));
  testing::PausableBackend* be = backend.get();
  DaemonHarness d(DaemonHarness::SmallConfig(), std::move(backend));  // a ring of 64 slots
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr int kLists = 40;
  std::vector<ListCase> cases;
  for (int i = 0; i < kLists; ++i) {
    const ListShape shape = i % 2 ? ListShape{513, kInlineBlocks, false} : ListShape{1000, 300u + i, i % 4 == 0};
    ASSERT_OK_AND_ASSIGN(ListCase c, MakeCase(*client, shape, seed + i));
    cases.push_back(std::move(c));
  }
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const Direction dir = round % 2 ? Direction::kDeviceToHost : Direction::kHostToDevice;
    std::vector<std::vector<std::byte>> want;
    for (int i = 0; i < kLists; ++i) want.push_back(Prepare(cases[i], dir, seed + 100 * round + i));
    be->Pause(true);  // no list completes before all are in: each pool-buffer list has a buffer of its own
    std::vector<Transfer> ts;
    for (auto& c : cases) {
      ASSERT_OK_AND_ASSIGN(Transfer t, client->CopyBlocks(dir, c.host, c.host_offset, c.region, c.device_offset,
                                                          c.list(), {.priority = Priority::kBulk}));
      ts.push_back(std::move(t));
    }
    be->Pause(false);
    for (int i = 0; i < kLists; ++i) {
      ASSERT_OK(ts[i].Wait(20s));
      EXPECT_EQ(FirstDifference(Destination(cases[i], dir), want[i].data(), want[i].size()), -1) << "list " << i;
    }
  }
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

}  // namespace
}  // namespace ferry
