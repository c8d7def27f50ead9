// Block lists (wire::Opcode::kBlocks*): the check of a list and its plan, as a pure function of
// what ferryd read off the ring into its own memory: no sessions, rings or pool here. A list
// that passes is a set of pieces (byte offsets in its two regions) that move exactly the blocks
// it names; one that fails names its first bad field or block and nothing of it moves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/wire.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

// One contiguous run of a list: offsets from the start of each region.
struct BlockPiece {
  uint64_t host_offset;
  uint64_t device_offset;
  uint64_t length;
};

struct BlockListPlan {
  std::vector<BlockPiece> pieces;  // in list order; consecutive blocks coalesced
  uint32_t blocks = 0;
  uint64_t bytes = 0;  // the sum of the blocks' lengths
};

struct BlockListRegions {
  bool host_to_device = true;  // which region the source indices name
  uint64_t host_bytes = 0;
  uint64_t device_bytes = 0;
};

// Checks the BlockListEntry alone, before its list is read: every field but the indices. `inline_list`:
// the SubmissionEntry's kBlockListInline.
Status CheckBlockListEntry(const wire::BlockListEntry& entry, bool inline_list);

// Checks `list` (entry.list_bytes bytes: sources, destinations, lengths) against the regions
// and plans it. Assumes CheckBlockListEntry passed. `regions.device_bytes` is the entry's.
Result<BlockListPlan> PlanBlockList(const wire::BlockListEntry& entry, std::span<const std::byte> list,
                                    const BlockListRegions& regions);

// Cuts pieces where their host side would cross a slab of the pool (for a backend whose pieces
// stay in one slab): `host_pool_offset` is where the host region starts in the pool.
void CutAtSlabs(std::vector<BlockPiece>& pieces, uint64_t host_pool_offset, uint64_t slab_bytes);

// Groups a plan's pieces into dispatch units of `unit_lengths` bytes each in turn (what the policy
// cuts a copy of plan.bytes into, summing to it), cutting a piece where a unit ends. Appends to
// `unit_ends` the index one past each unit's last piece.
void SplitIntoUnits(std::vector<BlockPiece>& pieces, std::span<const uint64_t> unit_lengths,
                    std::vector<size_t>& unit_ends);

}  // namespace ferry::daemon
