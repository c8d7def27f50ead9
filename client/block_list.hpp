// Client::CopyBlocks's local half: the checks it makes before anything reaches ferryd (which
// checks everything again), and the list's layout as ferryd reads it (common/wire.hpp,
// BlockListEntry).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/client.hpp"

namespace ferry::detail {

// Checks `blocks` against a source region of `source_bytes` and a destination region of
// `destination_bytes` (named `source_name` and `destination_name` in messages): equally long
// lists of 1 to kMaxBlocksPerList blocks, block_bytes > 0, each length in 1..block_bytes, each
// block inside its region, no destination block twice. Returns the bytes the list copies, or
// InvalidArgument naming the first bad block.
Result<uint64_t> CheckBlockList(const BlockList& blocks, uint64_t source_bytes, const char* source_name,
                                uint64_t destination_bytes, const char* destination_name);

// wire::BlockListBytes of the list: what EncodeBlockList writes.
uint64_t EncodedBlockListBytes(const BlockList& blocks);
// Writes the list as ferryd reads it: source indices, destination indices, then lengths if any.
void EncodeBlockList(const BlockList& blocks, std::byte* out);

}  // namespace ferry::detail
