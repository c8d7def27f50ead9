// Block-list requests written on the ring by hand, for tests against a real ferryd (host or
// cuda backend): a client that speaks the protocol itself and maps what it is given, and the
// lists, groups of slots and expected images the tests build.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/status_macros.hpp"
#include "common/wire.hpp"
#include "raw_connection.hpp"
#include "test_util.hpp"

namespace ferry::testing {

using namespace std::chrono_literals;

// A client that speaks the protocol by hand and maps what it is given: its buffers (slabs side
// by side) and the memfd it registers as device memory.
class RawClient : public RawConnection {
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

  Result<Buffer> AllocBuffer(uint64_t size) {
    wire::AllocBufferRequest req{size};
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kAllocBuffer, req));
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
  // Host backend: a sealed memfd as the device memory, mapped here too.
  Result<Region> RegisterRegion(uint64_t size) {
    FERRY_ASSIGN_OR_RETURN(UniqueFd mem, CreateSealedMemfd("ferry-sim-gpu0", size));
    Region region;
    FERRY_ASSIGN_OR_RETURN(region.mapping, MapShared(mem.get(), size));
    wire::RegisterDeviceRequest req{};
    req.kind = static_cast<uint32_t>(wire::DeviceHandleKind::kHostMemfd);
    req.size = size;
    FERRY_ASSIGN_OR_RETURN(region.id, Register(req, mem.get()));
    return region;
  }
  // A registration as it is (cuda backend: a CUDA IPC handle and no fd).
  Result<uint32_t> Register(const wire::RegisterDeviceRequest& req, int fd = -1) {
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kRegisterDevice, req, fd));
    FERRY_RETURN_IF_ERROR(FromWire(m.As<wire::RegisterDeviceReply>().status));
    return m.As<wire::RegisterDeviceReply>().region_id;
  }
  Status Unregister(uint32_t region) {
    wire::UnregisterDeviceRequest req{region, 0};
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kUnregisterDevice, req));
    return FromWire(m.As<wire::SimpleReply>().status);
  }
  // Writes `slots` from the ring's tail and publishes `publish` of them (all by default).
  void Push(const std::vector<wire::SubmissionEntry>& slots, std::optional<size_t> publish = std::nullopt) {
    const uint32_t tail = header()->sq_tail.value.load();
    for (size_t i = 0; i < slots.size(); ++i) sq()[(tail + i) & (reply_.sq_entries - 1)] = slots[i];
    header()->sq_tail.value.store(tail + static_cast<uint32_t>(publish.value_or(slots.size())));
    Kick();
  }
  // The next completion; nullopt if none comes within 20 s.
  std::optional<wire::CompletionEntry> Next() { return RawConnection::Next(20s); }
  bool DaemonHungUp() { return RawConnection::DaemonHungUp(5000); }
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
inline BlockList Shuffled(uint32_t count, uint32_t blocks, uint64_t block_bytes, bool lengths, uint64_t seed) {
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
inline std::vector<wire::SubmissionEntry> Group(uint64_t tag, wire::Opcode op, uint64_t host_offset,
                                                uint64_t host_bytes, uint32_t region, uint64_t device_bytes,
                                                uint64_t block_bytes, const BlockList& l, Where where,
                                                uint64_t list_pool_offset) {
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
inline std::vector<std::byte> Expected(const std::byte* src, size_t dst_size, const BlockList& l,
                                       uint64_t block_bytes) {
  std::vector<std::byte> out(dst_size);
  Poison(out.data(), out.size());
  for (size_t i = 0; i < l.src.size(); ++i) {
    const uint64_t len = l.lengths.empty() ? block_bytes : l.lengths[i];
    std::memcpy(out.data() + l.dst[i] * block_bytes, src + l.src[i] * block_bytes, len);
  }
  return out;
}

}  // namespace ferry::testing
