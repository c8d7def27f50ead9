// The block lists of ferry-bench transfer's blocks section, shared by the GPU run (bench/transfer.cc)
// and its run against a ferryd on the host backend: lists of fixed-size blocks as a KV-cache
// offload or reload names them, in shuffled order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/client.hpp"

namespace ferry::bench {

struct BlockWorkload {
  size_t count = 0, block_bytes = 0;
  bool shuffled = true;
  size_t region_bytes() const { return count * block_bytes; }
  std::string name() const;  // "4096 x 16 KiB" (in order: "1024 x 64 KiB in order")
  std::string key() const;   // the CSV's test column: "blocks-4096x16KiB"
};

// A direction as the tables, the JSON and the CSV name it: "h2d" or "d2h".
const char* DirectionName(Direction direction);

// The section's lists, each shuffled: 4096 x 16 KiB, 2048 x 64 KiB, 512 x 256 KiB.
std::vector<BlockWorkload> ShuffledBlockWorkloads();

// Source and destination block indices of a list of `count` blocks over regions of exactly
// `count` blocks: independent random permutations, so every block of both regions is copied
// once and a check of the destination region covers every byte; or both 0..count-1 in order.
struct BlockIndices {
  std::vector<uint32_t> src, dst;
  BlockList list(size_t block_bytes) const {
    return {.block_bytes = block_bytes, .src = src, .dst = dst, .lengths = {}};
  }
};
BlockIndices MakeBlockIndices(size_t count, bool shuffled, uint64_t seed);

// The first list position whose destination block (in `dst`, the destination region) differs
// from its source block (in `src`), if any.
std::optional<size_t> FirstWrongBlock(const BlockIndices& indices, size_t block_bytes, const std::byte* src,
                                      const std::byte* dst);

// A client's side of the lists: a pool buffer, device memory from Client::AllocateDevice
// (cudaMalloc on the cuda backend) and that memory's registered region, each as large as the
// largest of `workloads`. An error names the call that failed.
struct ListRegions {
  HostBuffer host;
  DeviceAllocation device;
  DeviceRegion region;
};
Result<ListRegions> AllocateListRegions(Client& client, const std::vector<BlockWorkload>& workloads);

// The blocks section against a ferryd on the host backend (no GPU: ferry's list copies alone,
// every byte checked, no in-process columns and no targets), and with `clients` > 1 its lists
// from that many client processes at once (bench/list_clients.hpp). Lists whose two regions
// exceed `max_bytes` are left out, as on the GPU. 0: every list arrived intact.
struct HostBlocksOptions {
  bool quick = false;
  int clients = 1;
  size_t max_bytes = size_t{1} << 30;  // --max-size
};
int RunBlocksOnHostBackend(const ConnectOptions& options, const HostBlocksOptions& run);

}  // namespace ferry::bench
