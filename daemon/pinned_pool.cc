#include "daemon/pinned_pool.hpp"

#include <sys/mman.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace ferry::daemon {

PinnedPool::PinnedPool(std::vector<UniqueFd> fds, Mapping m, uint64_t slab_bytes)
    : slab_fds_(std::move(fds)),
      mapping_(std::move(m)),
      slab_bytes_(slab_bytes),
      owner_(slab_fds_.size(), 0),
      free_slabs_(static_cast<uint32_t>(slab_fds_.size())) {}

Result<std::unique_ptr<PinnedPool>> PinnedPool::Create(uint64_t pool_bytes, uint64_t slab_bytes) {
  if (slab_bytes == 0 || pool_bytes == 0 || pool_bytes % slab_bytes != 0) {
    return InvalidArgument("pool size must be a positive multiple of the slab size");
  }
  const size_t n = pool_bytes / slab_bytes;
  std::vector<UniqueFd> fds;
  std::vector<int> raw;
  fds.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    FERRY_ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd("ferry-pool-slab-" + std::to_string(i), slab_bytes));
    raw.push_back(fd.get());
    fds.push_back(std::move(fd));
  }
  FERRY_ASSIGN_OR_RETURN(Mapping m, MapSideBySide(raw.data(), n, slab_bytes));
  // Ask for huge pages before the first touch: the copy engines then walk 2 MiB pages instead
  // of 4 KiB ones. The kernel grants them to shared memory only when
  // /sys/kernel/mm/transparent_hugepage/shmem_enabled allows it (advise, within_size, always).
  ::madvise(m.data(), pool_bytes, MADV_HUGEPAGE);
  // Touch every page now so that registration and the first copies do not fault them in.
  for (uint64_t off = 0; off < pool_bytes; off += 4096) m.data()[off] = std::byte{0};
  auto pool = std::unique_ptr<PinnedPool>(new PinnedPool(std::move(fds), std::move(m), slab_bytes));
  pool->huge_page_bytes_ = MappedHugePageBytes(pool->base(), pool->size());
  return pool;
}

uint64_t MappedHugePageBytes(const std::byte* base, uint64_t size) {
  std::ifstream smaps("/proc/self/smaps");
  const auto lo = reinterpret_cast<uintptr_t>(base), hi = lo + size;
  bool inside = false;
  uint64_t kib = 0;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &a, &b) == 2 && line.find(':') > line.find(' ')) {
      inside = a >= lo && b <= hi;
      continue;
    }
    unsigned long long v = 0;
    if (inside && std::sscanf(line.c_str(), "ShmemPmdMapped: %llu kB", &v) == 1) kib += v;
  }
  return kib << 10;
}

std::string ShmemHugePageSetting() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  std::getline(f, line);
  const auto open = line.find('['), close = line.find(']');
  return open == std::string::npos || close == std::string::npos ? "unknown" : line.substr(open + 1, close - open - 1);
}

Result<uint32_t> PinnedPool::GrantRun(uint32_t n, uint64_t owner) {
  if (n == 0) return InvalidArgument("zero slabs asked");
  uint32_t run = 0;
  for (uint32_t i = 0; i < slab_count(); ++i) {
    run = owner_[i] == 0 ? run + 1 : 0;
    if (run == n) {
      uint32_t first = i + 1 - n;
      for (uint32_t j = first; j <= i; ++j) owner_[j] = owner;
      free_slabs_ -= n;
      return first;
    }
  }
  return ResourceExhausted("pool has no " + std::to_string(n) + " free slabs in a row (" +
                           std::to_string(free_slabs_) + " of " + std::to_string(slab_count()) + " free)");
}

void PinnedPool::Release(uint32_t slab) {
  if (owner_[slab] == 0) return;
  std::memset(base() + static_cast<uint64_t>(slab) * slab_bytes_, 0, slab_bytes_);
  owner_[slab] = 0;
  ++free_slabs_;
}

SessionArena::~SessionArena() {
  for (uint32_t s : owned_slabs_) pool_.Release(s);
}

void SessionArena::AddFreeRange(uint64_t off, uint64_t len) {
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free_.emplace(off, len);
}

bool SessionArena::TakeFirstFit(uint64_t size, uint64_t* off) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    *off = it->first;
    uint64_t rest = it->second - size;
    free_.erase(it);
    if (rest > 0) free_.emplace(*off + size, rest);
    return true;
  }
  return false;
}

Result<Allocation> SessionArena::Allocate(uint64_t size) {
  if (size == 0) return InvalidArgument("buffer of 0 bytes");
  if (size > pool_.size()) {
    return ResourceExhausted("buffer of " + std::to_string(size) + " bytes is larger than the pool (" +
                             std::to_string(pool_.size()) + ")");
  }
  const uint64_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  uint64_t off = 0;
  if (!TakeFirstFit(rounded, &off)) {
    const uint64_t slab = pool_.slab_bytes();
    const uint32_t need = static_cast<uint32_t>((rounded + slab - 1) / slab);
    if (owned_bytes() + need * slab > quota_) {
      return ResourceExhausted("session quota of " + std::to_string(quota_) + " bytes reached (" +
                               std::to_string(owned_bytes()) + " held, " + std::to_string(need * slab) + " more asked)");
    }
    FERRY_ASSIGN_OR_RETURN(uint32_t first, pool_.GrantRun(need, id_));
    for (uint32_t s = first; s < first + need; ++s) owned_slabs_.push_back(s);
    AddFreeRange(first * slab, need * slab);
    if (!TakeFirstFit(rounded, &off)) return Internal("fresh slabs did not fit the buffer");
  }
  buffers_[off] = BufferInfo{rounded, 0, false};
  const uint64_t slab = pool_.slab_bytes();
  const uint32_t first_slab = static_cast<uint32_t>(off / slab);
  const uint32_t last_slab = static_cast<uint32_t>((off + rounded - 1) / slab);
  return Allocation{off, rounded, first_slab, last_slab - first_slab + 1};
}

Status SessionArena::Free(uint64_t pool_offset) {
  auto it = buffers_.find(pool_offset);
  if (it == buffers_.end() || it->second.freeing) {
    return NotFound("no buffer at pool offset " + std::to_string(pool_offset) + " in this session");
  }
  if (it->second.in_flight > 0) {
    it->second.freeing = true;
    return Status::Ok();
  }
  ReturnRange(it->first, it->second.size);
  buffers_.erase(it);
  return Status::Ok();
}

BufferInfo* SessionArena::Find(uint64_t offset, uint64_t length, uint64_t* buffer_offset) {
  auto it = buffers_.upper_bound(offset);
  if (it == buffers_.begin()) return nullptr;
  --it;
  const uint64_t start = it->first;
  const uint64_t size = it->second.size;
  if (it->second.freeing) return nullptr;
  // offset >= start holds; check offset + length <= start + size without overflow.
  if (offset - start > size || length > size - (offset - start)) return nullptr;
  *buffer_offset = start;
  return &it->second;
}

void SessionArena::CopyDone(uint64_t buffer_offset) {
  auto it = buffers_.find(buffer_offset);
  if (it == buffers_.end()) return;
  if (--it->second.in_flight == 0 && it->second.freeing) {
    ReturnRange(it->first, it->second.size);
    buffers_.erase(it);
  }
}

}  // namespace ferry::daemon
