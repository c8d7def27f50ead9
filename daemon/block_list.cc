#include "daemon/block_list.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>

#include "common/status_macros.hpp"

namespace ferry::daemon {
namespace {

using u128 = unsigned __int128;

std::string Num(uint64_t v) { return std::to_string(v); }

// Whether block `index` of a region, `length` bytes of it, lies inside `region_bytes`.
bool BlockInside(uint32_t index, uint64_t length, uint64_t block_bytes, uint64_t region_bytes) {
  return u128{index} * block_bytes + length <= region_bytes;
}

std::string BlockOutside(uint32_t i, const char* side, uint32_t index, uint64_t length, uint64_t block_bytes,
                         const char* region, uint64_t region_bytes) {
  const u128 offset = u128{index} * block_bytes;
  const std::string off = offset >> 64 ? "beyond 2^64" : Num(static_cast<uint64_t>(offset));
  return "block " + Num(i) + ": " + side + " block " + Num(index) + " (offset " + off + ", " + Num(length) +
         " bytes) is outside the " + region + " region (" + Num(region_bytes) + " bytes)";
}

// Appends [host, device, length) to the plan, extending the last piece when both sides continue it.
void Append(std::vector<BlockPiece>& pieces, uint64_t host, uint64_t device, uint64_t length) {
  if (!pieces.empty()) {
    BlockPiece& last = pieces.back();
    if (last.host_offset + last.length == host && last.device_offset + last.length == device) {
      last.length += length;
      return;
    }
  }
  pieces.push_back({host, device, length});
}

// The first block (in list order) whose destination an earlier block has too, or -1.
int64_t FirstRepeatedDestination(std::span<const uint32_t> dst, uint32_t max_dst, uint32_t* earlier) {
  const size_t words = (size_t{max_dst} >> 6) + 1;
  // A bitmap when it is small against the list (at most 64 bits a block, or 1 Mbit); a sparse
  // list of huge indices is sorted instead, and walked again only if it has a repeat.
  if (words <= std::max<size_t>(dst.size(), size_t{1} << 14)) {
    std::vector<uint64_t> seen(words, 0);
    for (size_t i = 0; i < dst.size(); ++i) {
      const uint64_t bit = uint64_t{1} << (dst[i] & 63);
      if (seen[dst[i] >> 6] & bit) {
        *earlier = static_cast<uint32_t>(std::find(dst.begin(), dst.end(), dst[i]) - dst.begin());
        return static_cast<int64_t>(i);
      }
      seen[dst[i] >> 6] |= bit;
    }
    return -1;
  }
  std::vector<uint32_t> sorted(dst.begin(), dst.end());
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) return -1;
  std::unordered_set<uint32_t> seen;
  for (size_t i = 0; i < dst.size(); ++i) {
    if (!seen.insert(dst[i]).second) {
      *earlier = static_cast<uint32_t>(std::find(dst.begin(), dst.end(), dst[i]) - dst.begin());
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

}  // namespace

Status CheckBlockListEntry(const wire::BlockListEntry& e, bool inline_list) {
  if (e.reserved[0] != 0 || e.reserved[1] != 0 || e.reserved[2] != 0) {
    return InvalidArgument("block list: reserved fields must be 0");
  }
  if (e.list_flags & ~wire::kBlockListLengths) {
    return InvalidArgument("block list: unknown list flags " + Num(e.list_flags));
  }
  if (e.block_bytes == 0) return InvalidArgument("block list: block_bytes is 0");
  if (e.device_bytes == 0) return InvalidArgument("block list: the device region is empty");
  if (e.block_count == 0 || e.block_count > wire::kMaxBlocksPerList) {
    return InvalidArgument("block list: " + Num(e.block_count) + " blocks (1 to " + Num(wire::kMaxBlocksPerList) + ")");
  }
  const uint64_t want = wire::BlockListBytes(e.block_count, e.list_flags);
  if (e.list_bytes != want) {
    return InvalidArgument("block list: list_bytes " + Num(e.list_bytes) + ", " + Num(e.block_count) + " blocks need " +
                           Num(want));
  }
  if (inline_list) {
    if (e.list_pool_offset != 0) return InvalidArgument("block list: an inline list has list_pool_offset 0");
    const uint32_t slots = wire::InlineListSlots(want);
    if (slots > wire::kMaxInlineListSlots) {
      return InvalidArgument("block list: " + Num(want) + " bytes do not fit inline (at most " +
                             Num(wire::kMaxInlineListSlots) + " slots)");
    }
    if (e.inline_slots != slots) {
      return InvalidArgument("block list: inline_slots " + Num(e.inline_slots) + ", its list needs " + Num(slots));
    }
  } else if (e.inline_slots != 0) {
    return InvalidArgument("block list: inline_slots must be 0 for a list in the pool");
  }
  return Status::Ok();
}

Result<BlockListPlan> PlanBlockList(const wire::BlockListEntry& e, std::span<const std::byte> list,
                                    const BlockListRegions& regions) {
  const uint32_t n = e.block_count;
  if (list.size() != e.list_bytes || e.list_bytes != wire::BlockListBytes(n, e.list_flags)) {
    return Internal("block list: list of " + Num(list.size()) + " bytes for " + Num(n) + " blocks");
  }
  // `list` is ferryd's own copy, at any alignment: its words are read with memcpy.
  auto word = [&](size_t k) {
    uint32_t w;
    std::memcpy(&w, list.data() + k * sizeof(uint32_t), sizeof w);
    return w;
  };
  const bool has_lengths = e.list_flags & wire::kBlockListLengths;
  const uint64_t bb = e.block_bytes;
  const char* src_name = regions.host_to_device ? "host" : "device";
  const char* dst_name = regions.host_to_device ? "device" : "host";
  const uint64_t src_bytes = regions.host_to_device ? regions.host_bytes : regions.device_bytes;
  const uint64_t dst_bytes = regions.host_to_device ? regions.device_bytes : regions.host_bytes;

  BlockListPlan plan;
  plan.blocks = n;
  plan.pieces.reserve(n);  // pages a list coalesces into fewer pieces are never touched
  std::vector<uint32_t> dst(n);
  uint32_t max_dst = 0;
  // The error of the first block (in list order) that repeats a destination among dst[0, blocks).
  auto repeat_among = [&](size_t blocks) -> Status {
    uint32_t earlier = 0;
    const int64_t i = FirstRepeatedDestination(std::span<const uint32_t>(dst).first(blocks), max_dst, &earlier);
    if (i < 0) return Status::Ok();
    return InvalidArgument("block " + Num(static_cast<uint64_t>(i)) + ": destination block " +
                           Num(dst[static_cast<size_t>(i)]) + " is block " + Num(earlier) +
                           "'s destination too (blocks may not overlap)");
  };
  // Block i is bad: named, unless an earlier block repeated a destination (the first bad one).
  auto refuse = [&](uint32_t i, std::string why) -> Status {
    FERRY_RETURN_IF_ERROR(repeat_among(i));
    return InvalidArgument(std::move(why));
  };
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t src = word(i);
    dst[i] = word(size_t{n} + i);
    const uint64_t len = has_lengths ? word(2 * size_t{n} + i) : bb;
    if (len == 0 || len > bb) return refuse(i, "block " + Num(i) + ": length " + Num(len) + " is not in 1.." + Num(bb));
    if (!BlockInside(src, len, bb, src_bytes)) {
      return refuse(i, BlockOutside(i, "source", src, len, bb, src_name, src_bytes));
    }
    if (!BlockInside(dst[i], len, bb, dst_bytes)) {
      return refuse(i, BlockOutside(i, "destination", dst[i], len, bb, dst_name, dst_bytes));
    }
    max_dst = std::max(max_dst, dst[i]);
    // Both offsets fit: each block lies inside its region, whose size is a uint64_t.
    const uint64_t src_off = uint64_t{src} * bb;
    const uint64_t dst_off = uint64_t{dst[i]} * bb;
    Append(plan.pieces, regions.host_to_device ? src_off : dst_off, regions.host_to_device ? dst_off : src_off, len);
    plan.bytes += len;
  }
  FERRY_RETURN_IF_ERROR(repeat_among(n));
  return plan;
}

void CutAtSlabs(std::vector<BlockPiece>& pieces, uint64_t host_pool_offset, uint64_t slab_bytes) {
  std::vector<BlockPiece> cut;
  cut.reserve(pieces.size());
  for (BlockPiece p : pieces) {
    while (p.length > 0) {
      const uint64_t in_slab = slab_bytes - (host_pool_offset + p.host_offset) % slab_bytes;
      const uint64_t n = std::min(p.length, in_slab);
      cut.push_back({p.host_offset, p.device_offset, n});
      p.host_offset += n;
      p.device_offset += n;
      p.length -= n;
    }
  }
  pieces = std::move(cut);
}

void SplitIntoUnits(std::vector<BlockPiece>& pieces, std::span<const uint64_t> unit_lengths,
                    std::vector<size_t>& unit_ends) {
  std::vector<BlockPiece> out;
  out.reserve(pieces.size() + unit_lengths.size());
  size_t unit = 0;
  uint64_t room = unit_lengths.empty() ? UINT64_MAX : unit_lengths[0];
  for (BlockPiece p : pieces) {
    while (p.length > 0) {
      const uint64_t n = std::min(p.length, room);
      out.push_back({p.host_offset, p.device_offset, n});
      p.host_offset += n;
      p.device_offset += n;
      p.length -= n;
      room -= n;
      if (room == 0) {
        unit_ends.push_back(out.size());
        ++unit;
        room = unit < unit_lengths.size() ? unit_lengths[unit] : UINT64_MAX;
      }
    }
  }
  if (unit_ends.empty() || unit_ends.back() != out.size()) unit_ends.push_back(out.size());
  pieces = std::move(out);
}

}  // namespace ferry::daemon
