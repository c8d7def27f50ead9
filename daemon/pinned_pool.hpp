// The daemon's pinned host memory: `slab_count` sealed memfds of `slab_bytes`, mapped side by
// side into one address range that the backend registers for DMA once, at start.
//
// Isolation: a slab belongs to at most one session at a time, and a client only ever receives
// the fds of its own slabs, so clients (of the same or different users) never map each other's
// buffers. A client keeps its slab fds as long as it lives, so a slab returns to the pool only
// when its session ends, and is zeroed before anyone else can get it.
//
// The bookkeeping lives here, in daemon memory; nothing a client can write affects it.
// Thread-safety: none; driven by the daemon's event loop.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

// Bytes of [base, base + size) that this process maps with huge (PMD) pages, from /proc/self/smaps.
uint64_t MappedHugePageBytes(const std::byte* base, uint64_t size);
// The kernel's transparent huge page setting for shared memory ("never", "advise", ...).
std::string ShmemHugePageSetting();

class PinnedPool {
 public:
  static Result<std::unique_ptr<PinnedPool>> Create(uint64_t pool_bytes, uint64_t slab_bytes);

  std::byte* base() const { return mapping_.data(); }
  uint64_t size() const { return mapping_.size(); }
  uint64_t slab_bytes() const { return slab_bytes_; }
  uint64_t huge_page_bytes() const { return huge_page_bytes_; }  // of the pool, backed by 2 MiB pages at start
  uint32_t slab_count() const { return static_cast<uint32_t>(slab_fds_.size()); }
  int slab_fd(uint32_t slab) const { return slab_fds_[slab].get(); }
  uint64_t free_bytes() const { return free_slabs_ * slab_bytes_; }
  uint64_t owner(uint32_t slab) const { return owner_[slab]; }

  // Grants `n` free slabs in a row to `owner` (non-zero). Returns the first slab's index.
  Result<uint32_t> GrantRun(uint32_t n, uint64_t owner);
  // Zeroes a slab and returns it to the free set.
  void Release(uint32_t slab);

 private:
  uint64_t huge_page_bytes_ = 0;
  PinnedPool(std::vector<UniqueFd> fds, Mapping m, uint64_t slab_bytes);
  std::vector<UniqueFd> slab_fds_;
  Mapping mapping_;
  uint64_t slab_bytes_;
  std::vector<uint64_t> owner_;  // 0: free
  uint32_t free_slabs_;
};

struct BufferInfo {
  uint64_t size = 0;
  uint32_t in_flight = 0;  // copies using it now
  bool freeing = false;    // freed by the client; returned once in_flight drops to 0
};

struct Allocation {
  uint64_t pool_offset;
  uint64_t size;
  uint32_t first_slab;
  uint32_t slab_count;
};

// One session's buffers, carved from slabs granted to it. Releases its slabs when destroyed.
class SessionArena {
 public:
  static constexpr uint64_t kAlignment = 256;

  SessionArena(PinnedPool& pool, uint64_t session_id, uint64_t quota_bytes)
      : pool_(pool), id_(session_id), quota_(quota_bytes) {}
  ~SessionArena();
  SessionArena(const SessionArena&) = delete;
  SessionArena& operator=(const SessionArena&) = delete;

  Result<Allocation> Allocate(uint64_t size);
  // Frees now, or marks for freeing once no copy uses the buffer.
  Status Free(uint64_t pool_offset);
  // The live buffer wholly containing [offset, offset + length), or null. Overflow-safe.
  BufferInfo* Find(uint64_t offset, uint64_t length, uint64_t* buffer_offset);
  // Called when a copy that used the buffer at buffer_offset is done.
  void CopyDone(uint64_t buffer_offset);

  uint64_t owned_bytes() const { return owned_slabs_.size() * pool_.slab_bytes(); }
  size_t buffer_count() const { return buffers_.size(); }

 private:
  void AddFreeRange(uint64_t off, uint64_t len);
  bool TakeFirstFit(uint64_t size, uint64_t* off);
  void ReturnRange(uint64_t off, uint64_t len) { AddFreeRange(off, len); }

  PinnedPool& pool_;
  uint64_t id_;
  uint64_t quota_;
  std::vector<uint32_t> owned_slabs_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, coalesced
  std::map<uint64_t, BufferInfo> buffers_;
};

}  // namespace ferry::daemon
