// The block-list decoder from arbitrary bytes: the first bytes are a BlockListEntry, the regions'
// sizes and the direction, the rest the list. An error or a plan, never a crash or a hang; a plan
// must move exactly the list's bytes, each piece inside both regions, no two destinations shared.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "daemon/block_list.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry;
  struct Head {
    wire::BlockListEntry entry;
    uint64_t host_bytes;
    uint8_t h2d, inline_list, shrink;
  } head{};
  if (size < sizeof head) return 0;
  std::memcpy(&head, data, sizeof head);
  data += sizeof head;
  size -= sizeof head;
  wire::BlockListEntry& e = head.entry;
  // Small geometries often, so that valid lists are common: shrink block sizes and regions.
  if (head.shrink & 1) e.block_bytes %= 4099;
  if (head.shrink & 2) e.device_bytes %= 1 << 22;
  if (head.shrink & 4) head.host_bytes %= 1 << 22;
  if (head.shrink & 8) {  // a consistent entry for what follows
    e.list_flags &= wire::kBlockListLengths;
    e.block_count = static_cast<uint32_t>(std::min<size_t>(size / ((e.list_flags & 1) ? 12 : 8), wire::kMaxBlocksPerList));
    e.list_bytes = wire::BlockListBytes(e.block_count, e.list_flags);
    e.inline_slots = head.inline_list ? wire::InlineListSlots(e.list_bytes) : 0;
    e.list_pool_offset = 0;
    std::memset(e.reserved, 0, sizeof e.reserved);
  }
  if (!daemon::CheckBlockListEntry(e, head.inline_list & 1).ok()) return 0;
  if (e.list_bytes > size) return 0;
  auto plan = daemon::PlanBlockList(e, {reinterpret_cast<const std::byte*>(data), e.list_bytes},
                                    {(head.h2d & 1) != 0, head.host_bytes, e.device_bytes});
  if (!plan.ok()) return 0;
  uint64_t bytes = 0;
  for (const daemon::BlockPiece& p : plan->pieces) {
    if (p.length == 0 || p.host_offset > head.host_bytes || p.length > head.host_bytes - p.host_offset ||
        p.device_offset > e.device_bytes || p.length > e.device_bytes - p.device_offset) {
      __builtin_trap();  // a piece outside a region
    }
    bytes += p.length;
  }
  if (bytes != plan->bytes || plan->blocks != e.block_count) __builtin_trap();
  std::vector<uint32_t> dst(e.block_count);
  std::memcpy(dst.data(), data + e.block_count * sizeof(uint32_t), dst.size() * sizeof(uint32_t));
  std::sort(dst.begin(), dst.end());
  if (std::adjacent_find(dst.begin(), dst.end()) != dst.end()) __builtin_trap();  // accepted a shared destination
  return 0;
}
