// Block-list copies through a real ferryd (host backend) in the test process, written on the
// ring by hand (the entry, its BlockListEntry and the inline list), so that every field can be
// what a hostile or broken client would write. Random data, poisoned destinations, every byte of
// both regions checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/status_macros.hpp"
#include "common/wire.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using testing::DaemonHarness;
using testing::FillRandom;
using testing::FirstDifference;
using testing::Poison;

// A client that speaks the protocol by hand and maps what it is given: its buffers (slabs side
// by side) and the memfd it registers as device memory.
class RawClient {
 public:
  struct Buffer {
    uint64_t pool_offset = 0;
    std::byte* data = nullptr;
    Mapping mapping;
  };
  struct Region {
    uint32_t id = 0;
    Mapping mapping;
    std::byte* data() const { return mapping.data(); }
  };

  Status Open(const std::string& socket) {
    FERRY_ASSIGN_OR_RETURN(sock_, ConnectUnix(socket));
    wire::HelloRequest h{};
    h.client_version = wire::kVersion;
    CopyCString(h.name, "raw-blocks");
    FERRY_RETURN_IF_ERROR(Send(sock_.get(), wire::MsgType::kHello, 1, h));
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, RecvMessage(sock_.get(), 5000));
    if (m.type() != wire::MsgType::kHelloReply || m.fds.size() != 3) return Internal("bad hello reply");
    reply_ = m.As<wire::HelloReply>();
    FERRY_RETURN_IF_ERROR(FromWire(reply_.status));
    FERRY_ASSIGN_OR_RETURN(ring_, MapShared(m.fds[0].get(), reply_.ring_bytes));
    submit_ = std::move(m.fds[1]);
    return Status::Ok();
  }
  Result<Buffer> AllocBuffer(uint64_t size) {
    wire::AllocBufferRequest req{size};
    FERRY_RETURN_IF_ERROR(Send(sock_.get(), wire::MsgType::kAllocBuffer, ++seq_, req));
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, RecvMessage(sock_.get(), 5000));
    const auto r = m.As<wire::AllocBufferReply>();
    FERRY_RETURN_IF_ERROR(FromWire(r.status));
    std::vector<int> fds;
    for (const UniqueFd& fd : m.fds) fds.push_back(fd.get());
    Buffer b;
    FERRY_ASSIGN_OR_RETURN(b.mapping, MapSideBySide(fds.data(), fds.size(), reply_.slab_bytes));
    b.pool_offset = r.pool_offset;
    b.data = b.mapping.data() + (r.pool_offset - uint64_t{r.first_slab} * reply_.slab_bytes);
    return b;
  }
  Result<Region> RegisterRegion(uint64_t size) {
    FERRY_ASSIGN_OR_RETURN(UniqueFd mem, CreateSealedMemfd("raw-device", size));
    Region region;
    FERRY_ASSIGN_OR_RETURN(region.mapping, MapShared(mem.get(), size));
    wire::RegisterDeviceRequest req{};
    req.kind = static_cast<uint32_t>(wire::DeviceHandleKind::kHostMemfd);
    req.size = size;
    const int fd = mem.get();
    FERRY_RETURN_IF_ERROR(Send(sock_.get(), wire::MsgType::kRegisterDevice, ++seq_, req, &fd, 1));
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, RecvMessage(sock_.get(), 5000));
    FERRY_RETURN_IF_ERROR(FromWire(m.As<wire::RegisterDeviceReply>().status));
    region.id = m.As<wire::RegisterDeviceReply>().region_id;
    return region;
  }
  // Writes `slots` from the ring's tail and publishes `publish` of them (all by default).
  void Push(const std::vector<wire::SubmissionEntry>& slots, std::optional<size_t> publish = std::nullopt) {
    auto* hdr = reinterpret_cast<wire::RingHeader*>(ring_.data());
    const uint32_t tail = hdr->sq_tail.value.load();
    for (size_t i = 0; i < slots.size(); ++i) {
      wire::SubmissionEntries(ring_.data())[(tail + i) & (reply_.sq_entries - 1)] = slots[i];
    }
    hdr->sq_tail.value.store(tail + static_cast<uint32_t>(publish.value_or(slots.size())));
    RingDoorbell(submit_.get());
  }
  // The next completion; nullopt if none comes within 20 s.
  std::optional<wire::CompletionEntry> Next() {
    auto* hdr = reinterpret_cast<wire::RingHeader*>(ring_.data());
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline) {
      const uint32_t head = hdr->cq_head.value.load();
      if (hdr->cq_tail.value.load() != head) {
        wire::CompletionEntry c = wire::CompletionEntries(ring_.data(), reply_.sq_entries)[head & (reply_.cq_entries - 1)];
        hdr->cq_head.value.store(head + 1);
        return c;
      }
      std::this_thread::sleep_for(1ms);
    }
    return std::nullopt;
  }
  bool DaemonHungUp() {
    auto m = RecvMessage(sock_.get(), 5000);
    return !m.ok() && m.status().code() == Code::kUnavailable;
  }

 private:
  UniqueFd sock_, submit_;
  Mapping ring_;
  wire::HelloReply reply_{};
  uint32_t seq_ = 1;
};

struct BlockList {
  std::vector<uint32_t> src, dst, lengths;
  std::vector<std::byte> Bytes() const {
    std::vector<uint32_t> words = src;
    words.insert(words.end(), dst.begin(), dst.end());
    words.insert(words.end(), lengths.begin(), lengths.end());
    std::vector<std::byte> out(words.size() * sizeof(uint32_t));
    std::memcpy(out.data(), words.data(), out.size());
    return out;
  }
};

// `count` blocks from shuffled sources to shuffled distinct destinations among `blocks` of each
// region; with `lengths`, each block a random length in 1..block_bytes.
BlockList Shuffled(uint32_t count, uint32_t blocks, uint64_t block_bytes, bool lengths, uint64_t seed) {
  std::mt19937_64 rng(seed);
  BlockList l;
  std::vector<uint32_t> all(blocks);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  l.dst.assign(all.begin(), all.begin() + count);
  std::shuffle(all.begin(), all.end(), rng);
  l.src.assign(all.begin(), all.begin() + count);
  // Some runs of consecutive blocks on both sides, to be coalesced.
  for (uint32_t i = 0; i + 4 < count && l.src[i] + 4 < blocks && l.dst[i] + 4 < blocks; i += 64) {
    bool free_run = true;
    for (uint32_t k = 1; k < 4; ++k) {
      free_run = free_run && std::find(l.dst.begin(), l.dst.end(), l.dst[i] + k) == l.dst.end();
    }
    if (!free_run) continue;
    for (uint32_t k = 1; k < 4; ++k) {
      l.src[i + k] = l.src[i] + k;
      l.dst[i + k] = l.dst[i] + k;
    }
  }
  if (lengths) {
    for (uint32_t i = 0; i < count; ++i) l.lengths.push_back(static_cast<uint32_t>(1 + rng() % block_bytes));
  }
  return l;
}

enum class Where { kInline, kPool };

// The block list's group of slots: its entry, the BlockListEntry, the inline list if any.
std::vector<wire::SubmissionEntry> Group(uint64_t tag, wire::Opcode op, uint64_t host_offset, uint64_t host_bytes,
                                         uint32_t region, uint64_t device_bytes, uint64_t block_bytes,
                                         const BlockList& l, Where where, uint64_t list_pool_offset) {
  wire::SubmissionEntry e{};
  e.user_tag = tag;
  e.opcode = static_cast<uint16_t>(op);
  e.flags = where == Where::kInline ? wire::kBlockListInline : 0;
  e.pool_offset = host_offset;
  e.length = host_bytes;
  e.region_id = region;
  wire::BlockListEntry b{};
  b.device_bytes = device_bytes;
  b.block_bytes = block_bytes;
  b.block_count = static_cast<uint32_t>(l.src.size());
  b.list_flags = l.lengths.empty() ? 0 : wire::kBlockListLengths;
  b.list_bytes = wire::BlockListBytes(b.block_count, b.list_flags);
  std::vector<wire::SubmissionEntry> slots(2);
  slots[0] = e;
  if (where == Where::kInline) {
    b.inline_slots = wire::InlineListSlots(b.list_bytes);
    const std::vector<std::byte> bytes = l.Bytes();
    slots.resize(2 + b.inline_slots);
    std::memcpy(&slots[2], bytes.data(), bytes.size());
  } else {
    b.list_pool_offset = list_pool_offset;
  }
  std::memcpy(&slots[1], &b, sizeof b);
  return slots;
}

// What the destination region must hold after the list: its poison, with each block's bytes.
std::vector<std::byte> Expected(const std::byte* src, size_t dst_size, const BlockList& l, uint64_t block_bytes) {
  std::vector<std::byte> out(dst_size);
  Poison(out.data(), out.size());
  for (size_t i = 0; i < l.src.size(); ++i) {
    const uint64_t len = l.lengths.empty() ? block_bytes : l.lengths[i];
    std::memcpy(out.data() + l.dst[i] * block_bytes, src + l.src[i] * block_bytes, len);
  }
  return out;
}

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
                   Group(6, wire::Opcode::kBlocksDeviceToHost, host.pool_offset, bytes, dev.id, bytes + 1, kBlock,
                         good, Where::kInline, 0),
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

}  // namespace
}  // namespace ferry
