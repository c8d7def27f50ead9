#include "client/block_list.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/wire.hpp"

namespace ferry::detail {
namespace {

std::string BlockError(size_t i, const std::string& what) {
  return "block " + std::to_string(i) + ": " + what;
}

// Whether block `index` of `block_bytes` stride, `length` bytes long, lies inside `region_bytes`.
bool BlockInside(uint64_t index, uint64_t length, uint64_t block_bytes, uint64_t region_bytes) {
  return length <= region_bytes && index <= (region_bytes - length) / block_bytes;
}

std::string OutsideMessage(const char* which, uint32_t index, uint64_t length, uint64_t block_bytes,
                           const char* region_name, uint64_t region_bytes) {
  // index * block_bytes may not fit 64 bits: say it in 128.
  const unsigned __int128 start = static_cast<unsigned __int128>(index) * block_bytes;
  std::string at;
  if (start >> 64) {
    at = "beyond 2^64 bytes";
  } else {
    at = "bytes [" + std::to_string(static_cast<uint64_t>(start)) + ", +" + std::to_string(length) + ")";
  }
  return std::string(which) + " block " + std::to_string(index) + " (" + at + ") is outside the " + region_name +
         " region of " + std::to_string(region_bytes) + " bytes";
}

// The first block whose destination an earlier block already has, or blocks.size() when none.
// Every index is inside the destination region, so max_index bounds them.
size_t FirstRepeatedDestination(std::span<const uint32_t> dst, uint32_t max_index, size_t* earlier) {
  constexpr uint32_t kMaxBitmapIndex = 1u << 27;  // a 16 MiB bitmap
  if (max_index < kMaxBitmapIndex) {
    // Reused across calls, and only the words set are cleared after: O(blocks), not O(region).
    thread_local std::vector<uint64_t> seen;
    if (seen.size() <= max_index / 64) seen.resize(max_index / 64 + 1);
    size_t found = dst.size();
    for (size_t i = 0; i < dst.size(); ++i) {
      uint64_t& word = seen[dst[i] / 64];
      const uint64_t bit = uint64_t{1} << (dst[i] % 64);
      if (word & bit) {
        found = i;
        break;
      }
      word |= bit;
    }
    for (size_t i = 0; i < std::min(found + 1, dst.size()); ++i) seen[dst[i] / 64] = 0;
    if (found < dst.size()) *earlier = static_cast<size_t>(std::find(dst.begin(), dst.end(), dst[found]) - dst.begin());
    return found;
  }
  // Indices too far apart for a bitmap: sort (index, block) pairs; within a run of one index, every
  // block but the first repeats it.
  std::vector<uint64_t> keyed(dst.size());
  for (size_t i = 0; i < dst.size(); ++i) keyed[i] = (uint64_t{dst[i]} << 32) | i;
  std::sort(keyed.begin(), keyed.end());
  size_t found = dst.size();
  for (size_t k = 1; k < keyed.size(); ++k) {
    if ((keyed[k] >> 32) == (keyed[k - 1] >> 32) && (keyed[k] & 0xffffffffu) < found) {
      found = keyed[k] & 0xffffffffu;
      size_t first = k - 1;
      while (first > 0 && (keyed[first - 1] >> 32) == (keyed[k] >> 32)) --first;
      *earlier = keyed[first] & 0xffffffffu;
    }
  }
  return found;
}

}  // namespace

Result<uint64_t> CheckBlockList(const BlockList& blocks, uint64_t source_bytes, const char* source_name,
                                uint64_t destination_bytes, const char* destination_name) {
  const size_t n = blocks.src.size();
  if (blocks.dst.size() != n || (!blocks.lengths.empty() && blocks.lengths.size() != n)) {
    return InvalidArgument("block list: " + std::to_string(n) + " source indices, " +
                           std::to_string(blocks.dst.size()) + " destination indices and " +
                           std::to_string(blocks.lengths.size()) + " lengths; the three must be equally long " +
                           "(or lengths empty)");
  }
  if (n == 0 || n > wire::kMaxBlocksPerList) {
    return InvalidArgument("block list of " + std::to_string(n) + " blocks: a list has 1 to " +
                           std::to_string(wire::kMaxBlocksPerList));
  }
  if (blocks.block_bytes == 0) return InvalidArgument("block list with block_bytes 0");
  const uint64_t bb = blocks.block_bytes;
  uint64_t total = 0;
  uint32_t max_dst = 0;
  size_t bad = n;
  std::string why;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t len = blocks.lengths.empty() ? bb : blocks.lengths[i];
    if (len == 0 || len > bb) {
      bad = i;
      why = "length " + std::to_string(len) + " is not in 1..block_bytes (" + std::to_string(bb) + ")";
      break;
    }
    if (!BlockInside(blocks.src[i], len, bb, source_bytes)) {
      bad = i;
      why = OutsideMessage("source", blocks.src[i], len, bb, source_name, source_bytes);
      break;
    }
    if (!BlockInside(blocks.dst[i], len, bb, destination_bytes)) {
      bad = i;
      why = OutsideMessage("destination", blocks.dst[i], len, bb, destination_name, destination_bytes);
      break;
    }
    total += len;
    max_dst = std::max(max_dst, blocks.dst[i]);
  }
  // A repeated destination before the first block out of range is the first bad block.
  size_t earlier = 0;
  const size_t repeat = FirstRepeatedDestination(blocks.dst.first(bad), max_dst, &earlier);
  if (repeat < bad) {
    return InvalidArgument(BlockError(repeat, "destination block " + std::to_string(blocks.dst[repeat]) +
                                                  " is also block " + std::to_string(earlier) +
                                                  "'s: no two blocks may share a destination block"));
  }
  if (bad < n) return InvalidArgument(BlockError(bad, why));
  return total;
}

uint64_t EncodedBlockListBytes(const BlockList& blocks) {
  return wire::BlockListBytes(static_cast<uint32_t>(blocks.src.size()),
                              blocks.lengths.empty() ? 0 : wire::kBlockListLengths);
}

void EncodeBlockList(const BlockList& blocks, std::byte* out) {
  const size_t n = blocks.src.size() * sizeof(uint32_t);
  std::memcpy(out, blocks.src.data(), n);
  std::memcpy(out + n, blocks.dst.data(), n);
  if (!blocks.lengths.empty()) std::memcpy(out + 2 * n, blocks.lengths.data(), n);
}

}  // namespace ferry::detail
