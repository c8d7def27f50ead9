// The block-list decoder alone (daemon/block_list): every check, coalescing, slab cuts and units.
#include "daemon/block_list.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/status_macros.hpp"
#include "test_util.hpp"

namespace ferry::daemon {
namespace {

struct List {
  std::vector<uint32_t> src, dst, lengths;
};

wire::BlockListEntry Entry(const List& l, uint64_t block_bytes, uint64_t device_bytes, bool inline_list = false) {
  wire::BlockListEntry e{};
  e.device_bytes = device_bytes;
  e.block_bytes = block_bytes;
  e.block_count = static_cast<uint32_t>(l.src.size());
  e.list_flags = l.lengths.empty() ? 0 : wire::kBlockListLengths;
  e.list_bytes = wire::BlockListBytes(e.block_count, e.list_flags);
  e.list_pool_offset = inline_list ? 0 : 4096;
  e.inline_slots = inline_list ? wire::InlineListSlots(e.list_bytes) : 0;
  return e;
}

std::vector<std::byte> Bytes(const List& l) {
  std::vector<uint32_t> words = l.src;
  words.insert(words.end(), l.dst.begin(), l.dst.end());
  words.insert(words.end(), l.lengths.begin(), l.lengths.end());
  std::vector<std::byte> out(words.size() * sizeof(uint32_t));
  std::memcpy(out.data(), words.data(), out.size());
  return out;
}

Result<BlockListPlan> Plan(const List& l, uint64_t block_bytes, uint64_t host_bytes, uint64_t device_bytes,
                           bool h2d = true) {
  const wire::BlockListEntry e = Entry(l, block_bytes, device_bytes);
  FERRY_RETURN_IF_ERROR(CheckBlockListEntry(e, false));
  const std::vector<std::byte> bytes = Bytes(l);
  return PlanBlockList(e, bytes, {h2d, host_bytes, device_bytes});
}

std::string Error(const Result<BlockListPlan>& r) { return r.ok() ? "(accepted)" : r.status().message(); }

bool SamePieces(const std::vector<BlockPiece>& a, const std::vector<BlockPiece>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].host_offset != b[i].host_offset || a[i].device_offset != b[i].device_offset ||
        a[i].length != b[i].length) {
      return false;
    }
  }
  return true;
}

TEST(BlockListDecoder, EveryFieldOfTheEntryIsChecked) {
  const List l{{0, 1}, {2, 3}, {}};
  auto check = [&](auto mutate, bool inline_list = false) {
    wire::BlockListEntry e = Entry(l, 4096, 1 << 20, inline_list);
    mutate(e);
    return CheckBlockListEntry(e, inline_list);
  };
  EXPECT_TRUE(check([](wire::BlockListEntry&) {}).ok());
  EXPECT_TRUE(check([](wire::BlockListEntry&) {}, true).ok());
  EXPECT_EQ(check([](wire::BlockListEntry& e) { e.reserved[2] = 1; }).message(),
            "block list: reserved fields must be 0");
  EXPECT_EQ(check([](wire::BlockListEntry& e) { e.list_flags = 2; }).message(), "block list: unknown list flags 2");
  EXPECT_EQ(check([](wire::BlockListEntry& e) { e.block_bytes = 0; }).message(), "block list: block_bytes is 0");
  EXPECT_EQ(check([](wire::BlockListEntry& e) { e.device_bytes = 0; }).message(),
            "block list: the device region is empty");
  EXPECT_EQ(check([](wire::BlockListEntry& e) { e.block_count = 0; }).message(), "block list: 0 blocks (1 to 262144)");
  EXPECT_EQ(check([](wire::BlockListEntry& e) {
              e.block_count = wire::kMaxBlocksPerList + 1;
              e.list_bytes = wire::BlockListBytes(e.block_count, 0);
            }).message(),
            "block list: 262145 blocks (1 to 262144)");
  EXPECT_EQ(check([](wire::BlockListEntry& e) { e.list_bytes = 12; }).message(),
            "block list: list_bytes 12, 2 blocks need 16");
  EXPECT_EQ(check([](wire::BlockListEntry& e) { e.list_flags = wire::kBlockListLengths; }).message(),
            "block list: list_bytes 16, 2 blocks need 24");
  EXPECT_EQ(check([](wire::BlockListEntry& e) { e.inline_slots = 1; }).message(),
            "block list: inline_slots must be 0 for a list in the pool");
  EXPECT_EQ(check([](wire::BlockListEntry& e) { e.inline_slots = 2; }, true).message(),
            "block list: inline_slots 2, its list needs 1");
  EXPECT_EQ(check([](wire::BlockListEntry& e) { e.list_pool_offset = 64; }, true).message(),
            "block list: an inline list has list_pool_offset 0");
  EXPECT_EQ(check(
                [](wire::BlockListEntry& e) {
                  e.block_count = 113;  // 904 bytes: 17 slots
                  e.list_bytes = wire::BlockListBytes(113, 0);
                  e.inline_slots = 17;
                },
                true)
                .message(),
            "block list: 904 bytes do not fit inline (at most 16 slots)");
}

TEST(BlockListDecoder, AnIndexOutsideItsRegionIsNamedWithItsBlock) {
  List l{std::vector<uint32_t>(20), std::vector<uint32_t>(20), {}};
  std::iota(l.src.begin(), l.src.end(), 0);
  std::iota(l.dst.begin(), l.dst.end(), 0);
  l.dst[17] = 9000;
  EXPECT_EQ(Error(Plan(l, 16384, 1 << 20, 147000000)),
            "block 17: destination block 9000 (offset 147456000, 16384 bytes) is outside the device region (147000000 "
            "bytes)");
  l.dst[17] = 17;
  l.src[3] = 64;  // host region: 64 blocks of 16 KiB, so block 64 starts at its end
  EXPECT_EQ(Error(Plan(l, 16384, 1 << 20, 147000000)),
            "block 3: source block 64 (offset 1048576, 16384 bytes) is outside the host region (1048576 bytes)");
  // Device to host: the sources index the device region, the destinations the host region.
  l.src[3] = 3;
  l.dst[5] = 64;
  EXPECT_EQ(Error(Plan(l, 16384, 1 << 20, 147000000, /*h2d=*/false)),
            "block 5: destination block 64 (offset 1048576, 16384 bytes) is outside the host region (1048576 bytes)");
  // The last block may end exactly at the region's end; a short last block fits where a full one would not.
  List edge{{0}, {63}, {}};
  EXPECT_TRUE(Plan(edge, 16384, 1 << 20, 1 << 20).ok());
  List tail{{0}, {64}, {100}};
  EXPECT_EQ(Error(Plan(tail, 16384, 1 << 20, (1 << 20) + 99)),
            "block 0: destination block 64 (offset 1048576, 100 bytes) is outside the device region (1048675 bytes)");
  EXPECT_TRUE(Plan(tail, 16384, 1 << 20, (1 << 20) + 100).ok());
}

TEST(BlockListDecoder, OffsetsThatOverflowAreOutsideNotWrapped) {
  // index * block_bytes is past 2^64: outside, not a small offset after wrapping.
  List l{{0}, {0xffffffffu}, {}};
  EXPECT_EQ(Error(Plan(l, uint64_t{1} << 40, uint64_t{1} << 40, UINT64_MAX)),
            "block 0: destination block 4294967295 (offset beyond 2^64, 1099511627776 bytes) is outside the device "
            "region (18446744073709551615 bytes)");
  List m{{0}, {1}, {}};  // 2^63 + 2^63 == 2^64: wraps to 0 in 64 bits
  EXPECT_FALSE(Plan(m, uint64_t{1} << 63, uint64_t{1} << 63, UINT64_MAX).ok());
}

TEST(BlockListDecoder, LengthsAreFrom1ToTheBlockSize) {
  List l{{0, 1, 2}, {0, 1, 2}, {4096, 0, 1}};
  EXPECT_EQ(Error(Plan(l, 4096, 1 << 20, 1 << 20)), "block 1: length 0 is not in 1..4096");
  l.lengths = {4096, 1, 4097};
  EXPECT_EQ(Error(Plan(l, 4096, 1 << 20, 1 << 20)), "block 2: length 4097 is not in 1..4096");
  l.lengths = {4096, 1, 4095};
  ASSERT_OK_AND_ASSIGN(BlockListPlan plan, Plan(l, 4096, 1 << 20, 1 << 20));
  EXPECT_EQ(plan.bytes, 4096u + 1 + 4095);
  EXPECT_EQ(plan.blocks, 3u);
}

TEST(BlockListDecoder, TwoBlocksWithOneDestinationAreRefused) {
  List l{{0, 1, 2, 3}, {7, 8, 9, 8}, {}};
  EXPECT_EQ(Error(Plan(l, 4096, 1 << 20, 1 << 20)),
            "block 3: destination block 8 is block 1's destination too (blocks may not overlap)");
  // The same source twice is fine: it is only read.
  List reads{{5, 5}, {0, 1}, {}};
  EXPECT_TRUE(Plan(reads, 4096, 1 << 20, 1 << 20).ok());
  // Sparse huge indices take the sorting path: the same verdict and the same first block.
  List sparse{{0, 1, 2}, {4000000000u, 3000000000u, 4000000000u}, {}};
  EXPECT_EQ(Error(Plan(sparse, 1, 1 << 20, UINT64_MAX)),
            "block 2: destination block 4000000000 is block 0's destination too (blocks may not overlap)");
  List sparse_ok{{0, 1, 2}, {4000000000u, 3000000000u, 5}, {}};
  EXPECT_TRUE(Plan(sparse_ok, 1, 1 << 20, UINT64_MAX).ok());
}

TEST(BlockListDecoder, TheFirstBadBlockIsNamedWhateverIsWrongWithIt) {
  // Block 1 repeats block 0's destination; block 3 is bad in its own way: block 1 is named.
  List outside{{0, 1, 2, 3}, {7, 7, 9, 9000}, {}};
  EXPECT_EQ(Error(Plan(outside, 4096, 1 << 20, 1 << 20)),
            "block 1: destination block 7 is block 0's destination too (blocks may not overlap)");
  List source{{0, 1, 2, 5000}, {7, 7, 9, 10}, {}};
  EXPECT_EQ(Error(Plan(source, 4096, 1 << 20, 1 << 20)),
            "block 1: destination block 7 is block 0's destination too (blocks may not overlap)");
  List length{{0, 1, 2, 3}, {7, 8, 7, 10}, {4096, 4096, 4096, 0}};
  EXPECT_EQ(Error(Plan(length, 4096, 1 << 20, 1 << 20)),
            "block 2: destination block 7 is block 0's destination too (blocks may not overlap)");
  // A bad block before the repeat is named itself.
  List first{{0, 1, 2, 3}, {9000, 7, 7, 10}, {}};
  EXPECT_EQ(Error(Plan(first, 4096, 1 << 20, 1 << 20)),
            "block 0: destination block 9000 (offset 36864000, 4096 bytes) is outside the device region (1048576 "
            "bytes)");
}

TEST(BlockListDecoder, ConsecutiveFullBlocksBecomeOnePiece) {
  // Runs 0-2 -> 10-12 and 5-6 -> 3-4 are contiguous on both sides; 3 -> 20 breaks the first run
  // on the destination side, and a short block ends a run.
  List l{{0, 1, 2, 3, 5, 6, 7, 8}, {10, 11, 12, 20, 3, 4, 5, 6}, {}};
  ASSERT_OK_AND_ASSIGN(BlockListPlan plan, Plan(l, 100, 10000, 10000));
  EXPECT_TRUE(SamePieces(plan.pieces, {{0, 1000, 300}, {300, 2000, 100}, {500, 300, 400}}));
  // Device to host: the host side is the destination.
  ASSERT_OK_AND_ASSIGN(BlockListPlan d2h, Plan(l, 100, 10000, 10000, false));
  EXPECT_TRUE(SamePieces(d2h.pieces, {{1000, 0, 300}, {2000, 300, 100}, {300, 500, 400}}));
  List short_block{{0, 1, 2}, {0, 1, 2}, {100, 50, 100}};
  ASSERT_OK_AND_ASSIGN(BlockListPlan s, Plan(short_block, 100, 10000, 10000));
  EXPECT_TRUE(SamePieces(s.pieces, {{0, 0, 150}, {200, 200, 100}}));
}

TEST(BlockListDecoder, PiecesAreCutAtSlabBoundaries) {
  // The host region starts 10 bytes before a slab's end; one 300-byte run crosses it, then
  // another crosses the next boundary at 1000 - 10 + 1000.
  std::vector<BlockPiece> pieces{{0, 0, 300}, {1900, 5000, 200}};
  CutAtSlabs(pieces, 990, 1000);
  EXPECT_TRUE(SamePieces(pieces, {{0, 0, 10}, {10, 10, 290}, {1900, 5000, 110}, {2010, 5110, 90}}));
}

TEST(BlockListDecoder, UnitsFollowThePolicysPieceLengths) {
  std::vector<BlockPiece> pieces{{0, 0, 100}, {200, 200, 100}, {400, 400, 250}, {1000, 1000, 50}};
  std::vector<size_t> ends;
  const std::vector<uint64_t> units{200, 200, 100};
  SplitIntoUnits(pieces, units, ends);
  EXPECT_TRUE(SamePieces(pieces, {{0, 0, 100}, {200, 200, 100}, {400, 400, 200}, {600, 600, 50}, {1000, 1000, 50}}));
  EXPECT_EQ(ends, (std::vector<size_t>{2, 3, 5}));
}

// The largest list the wire allows, shuffled, validated and planned on the loop's thread: the
// time is printed, not asserted (it depends on the machine).
TEST(BlockListDecoder, TheLargestListValidatesQuickly) {
  List l{std::vector<uint32_t>(wire::kMaxBlocksPerList), std::vector<uint32_t>(wire::kMaxBlocksPerList), {}};
  std::iota(l.src.begin(), l.src.end(), 0);
  std::iota(l.dst.begin(), l.dst.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(l.dst.begin(), l.dst.end(), rng);
  const wire::BlockListEntry e = Entry(l, 16384, uint64_t{16384} * wire::kMaxBlocksPerList);
  const std::vector<std::byte> bytes = Bytes(l);
  const BlockListRegions regions{true, uint64_t{16384} * wire::kMaxBlocksPerList, e.device_bytes};
  double best_us = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    auto plan = PlanBlockList(e, bytes, regions);
    const auto t1 = std::chrono::steady_clock::now();
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->blocks, wire::kMaxBlocksPerList);
    best_us = std::min(best_us, std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::printf("a %u-block shuffled list validated and planned in %.0f us (best of 5)\n", wire::kMaxBlocksPerList,
              best_us);
}

}  // namespace
}  // namespace ferry::daemon
