#include "daemon/pinned_pool.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "common/status_macros.hpp"
#include "daemon/numa.hpp"

namespace ferry::daemon {

Result<bool> SlabHeldOutside(int slab_fd) {
  const std::string path = "/proc/self/fd/" + std::to_string(slab_fd);
  UniqueFd probe(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!probe.valid()) return ErrnoStatus("open(" + path + ")", errno);
  if (::fcntl(probe.get(), F_SETLEASE, F_WRLCK) == 0) return false;  // closing `probe` drops the lease
  if (errno == EAGAIN || errno == EBUSY) return true;
  return ErrnoStatus("fcntl(F_SETLEASE) on a pool slab (is fs.leases-enable 0?)", errno);
}

namespace {

// Maps every page of [p, p + n) now, so that registration and the first copies do not fault
// them in. One MADV_POPULATE_WRITE (Linux 5.14) instead of a fault per page: under a hypervisor
// a fault costs ~12 us, and a reclaimed 16 MiB took 50 ms of the zeroer's CPU (several hundred
// ms on a loaded machine) where the madvise takes 5. Older kernels refuse it: touch each page.
void FaultIn(std::byte* p, uint64_t n) {
  if (::madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
  for (uint64_t off = 0; off < n; off += 4096) p[off] = std::byte{0};
}

}  // namespace

unsigned UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
}

namespace {

// Pins the calling thread to `cpus` (none: leaves it be). The kernel may refuse (a CPU gone
// offline, a cpuset changed since): the thread then runs where it is let, which is only slower.
void PinThisThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  const cpu_set_t set = CpuSetOf(cpus);
  ::sched_setaffinity(0, sizeof set, &set);
}

}  // namespace

std::vector<unsigned> FaultInParallel(const std::vector<FaultRange>& ranges, uint64_t min_share,
                                      const FaultProgress& progress, std::chrono::milliseconds interval,
                                      const FaultStop& stop) {
  constexpr uint64_t kAlign = 2ull << 20, kChunk = 64ull << 20;
  uint64_t total = 0;
  for (const FaultRange& r : ranges) total += r.n;
  std::atomic<uint64_t> faulted{0};
  auto fault = [&](std::byte* p, uint64_t len) {
    for (uint64_t at = 0; at < len; at += kChunk) {
      if (stop && stop()) return;
      const uint64_t chunk = std::min(kChunk, len - at);
      FaultIn(p + at, chunk);
      faulted.fetch_add(chunk, std::memory_order_relaxed);
    }
  };
  if (progress) progress(0, total);
  std::mutex mu;
  std::condition_variable cv;
  size_t finished = 0;  // guarded by mu
  std::vector<std::thread> workers;
  std::vector<unsigned> used(ranges.size(), 0);
  std::vector<std::pair<std::byte*, uint64_t>> unstarted;  // shares no thread could start for
  bool can_start = true;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const FaultRange& r = ranges[i];
    if (r.n == 0) continue;
    const uint64_t cap = r.max_threads != 0 ? r.max_threads : UsableCpus();
    const uint64_t want = std::clamp<uint64_t>(r.n / std::max<uint64_t>(min_share, kAlign), 1, cap);
    const uint64_t share = (r.n / want + kAlign - 1) / kAlign * kAlign;
    for (uint64_t off = 0; off < r.n; off += share) {
      const uint64_t len = std::min(share, r.n - off);
      if (can_start) {
        try {
          workers.emplace_back([&, p = r.p + off, len, cpus = &r.cpus] {
            PinThisThread(*cpus);
            fault(p, len);
            std::lock_guard<std::mutex> l(mu);
            ++finished;
            cv.notify_one();
          });
          ++used[i];
          continue;
        } catch (const std::system_error&) {
          can_start = false;
        }
      }
      unstarted.emplace_back(r.p + off, len);
    }
  }
  for (auto [p, len] : unstarted) fault(p, len);
  {
    // This thread reports while the workers fault.
    std::unique_lock<std::mutex> l(mu);
    while (!cv.wait_for(l, interval, [&] { return finished == workers.size(); })) {
      l.unlock();
      if (progress) progress(faulted.load(std::memory_order_relaxed), total);
      l.lock();
    }
  }
  for (std::thread& w : workers) w.join();
  if (progress) progress(faulted.load(std::memory_order_relaxed), total);  // total, unless stopped
  for (unsigned& u : used) u = std::max(u, 1u);
  return used;
}

unsigned FaultInParallel(std::byte* p, uint64_t n, uint64_t min_share, const FaultProgress& progress,
                         std::chrono::milliseconds interval) {
  return FaultInParallel({FaultRange{p, n, {}, 0}}, min_share, progress, interval)[0];
}

PinnedPool::PinnedPool(std::vector<UniqueFd> fds, Mapping m, uint64_t slab_bytes, SlabReclaimHooks hooks)
    : slab_fds_(std::move(fds)),
      mapping_(std::move(m)),
      slab_bytes_(slab_bytes),
      owner_(slab_fds_.size(), 0),
      state_(slab_fds_.size(), SlabState::kFree),
      uid_(slab_fds_.size(), 0),
      free_slabs_(static_cast<uint32_t>(slab_fds_.size())),
      hooks_(std::move(hooks)) {}

PinnedPool::~PinnedPool() {
  if (!zeroer_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(zero_mu_);
    zeroer_stop_ = true;
  }
  zero_cv_.notify_all();
  zeroer_.join();
}

bool PoolPart::placed() const { return numa_node >= 0 && bound && bytes_on_node == bytes; }

namespace {

// "512 MiB", "48 GiB", "12345 bytes".
std::string Size(uint64_t bytes) {
  if (bytes != 0 && bytes % (1ull << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

enum class Binding : uint8_t { kNoNode, kNotOnline, kTooLarge, kRefused, kBound };

// Fills `fds` with sealed memfds of slab_bytes, a share of them per thread (up to one per usable
// CPU, at least 256 slabs each); the first error, if any.
Status MakeSlabs(std::vector<UniqueFd>& fds, uint64_t slab_bytes, bool hugetlb) {
  constexpr size_t kMinShare = 256;
  const size_t n = fds.size();
  const size_t threads = std::clamp<size_t>(n / kMinShare, 1, UsableCpus());
  const size_t share = (n + threads - 1) / threads;
  std::vector<Status> status(threads);
  auto make = [&](size_t t) {
    for (size_t i = t * share; i < std::min(n, (t + 1) * share); ++i) {
      auto fd = CreateSealedMemfd("ferry-pool-slab-" + std::to_string(i), slab_bytes, hugetlb ? MFD_HUGETLB : 0);
      if (!fd.ok()) {
        status[t] = fd.status();
        return;
      }
      fds[i] = std::move(*fd);
    }
  };
  std::vector<std::thread> workers;
  for (size_t t = 1; t < threads; ++t) {
    try {
      workers.emplace_back(make, t);
    } catch (const std::system_error&) {
      make(t);  // no thread to spare: made here
    }
  }
  make(0);
  for (std::thread& w : workers) w.join();
  for (const Status& st : status) FERRY_RETURN_IF_ERROR(st);
  return Status::Ok();
}

// Binds each part of a node to it (the range is not faulted in yet) and says where its
// fault-in threads run: on the node's usable CPUs, else anywhere; parts on the same CPUs share
// them. A part whose node is not online, or whose binding the kernel refuses, gets its
// placement's reason now (the rest is filled in by DescribePlacement).
std::vector<FaultRange> BindParts(std::vector<PoolPart>& parts, std::byte* base, uint64_t slab_bytes,
                                  std::vector<Binding>* binding) {
  const std::vector<int> online = OnlineNumaNodes();
  const std::vector<int> affinity = AffinityCpus();
  std::vector<FaultRange> ranges;
  for (PoolPart& p : parts) {
    FaultRange r{base + uint64_t{p.first_slab} * slab_bytes, p.bytes, {}, 0};
    const std::string node = "node " + std::to_string(p.numa_node);
    if (p.numa_node < 0) {
      binding->push_back(Binding::kNoNode);
      p.placement = "no node";
    } else if (!std::binary_search(online.begin(), online.end(), p.numa_node)) {
      binding->push_back(Binding::kNotOnline);
      p.placement = online.empty() ? "not placed: this kernel reports no NUMA nodes"
                                   : "not placed: " + node + " is not online on this machine";
    } else if (const uint64_t total = NumaNodeMemTotal(p.numa_node); total != 0 && p.bytes > total) {
      // Bound, it could only fault in by OOM-killing (MPOL_BIND does not spill to other nodes).
      binding->push_back(Binding::kTooLarge);
      p.placement = "not placed: " + Size(p.bytes) + " is more than " + node + "'s memory (" + Size(total) + ")";
    } else {
      Status bound = BindToNumaNode(r.p, r.n, p.numa_node);
      p.bound = bound.ok();
      binding->push_back(p.bound ? Binding::kBound : Binding::kRefused);
      if (!p.bound) p.placement = "not bound (" + bound.message() + ")";
      // Bound or not, threads on the node's CPUs fault it: the kernel zeroes each page on the
      // faulting CPU, and without the binding the first touch is what puts the page there.
      r.cpus = IntersectCpus(CpusOfNumaNode(p.numa_node), affinity);
    }
    ranges.push_back(std::move(r));
  }
  const uint64_t usable = UsableCpus();
  for (FaultRange& r : ranges) {
    const auto sharing = static_cast<uint64_t>(
        std::count_if(ranges.begin(), ranges.end(), [&](const FaultRange& o) { return o.cpus == r.cpus; }));
    r.max_threads = static_cast<unsigned>(std::max<uint64_t>(1, (r.cpus.empty() ? usable : r.cpus.size()) / sharing));
  }
  return ranges;
}

// After the fault-in: where each part of a node has its pages (/proc/self/numa_maps), in words.
void DescribePlacement(std::vector<PoolPart>& parts, std::byte* base, uint64_t slab_bytes,
                       const std::vector<FaultRange>& ranges, const std::vector<Binding>& binding) {
  if (std::all_of(binding.begin(), binding.end(), [](Binding b) { return b == Binding::kNoNode; })) return;
  const std::string maps = ReadTextFile("/proc/self/numa_maps");
  for (size_t i = 0; i < parts.size(); ++i) {
    PoolPart& p = parts[i];
    if (binding[i] == Binding::kNoNode) continue;
    const auto lo = reinterpret_cast<uintptr_t>(base + uint64_t{p.first_slab} * slab_bytes);
    p.bytes_by_node = ParseNumaMaps(maps, lo, lo + p.bytes);
    auto it = p.bytes_by_node.find(p.numa_node);
    p.bytes_on_node = it == p.bytes_by_node.end() ? 0 : it->second;
    const std::string node = "node " + std::to_string(p.numa_node);
    if (binding[i] == Binding::kBound) {
      if (p.bytes_on_node == p.bytes) {
        p.placement = "all " + Size(p.bytes) + " on " + node;
        continue;
      }
      p.placement = Size(p.bytes_on_node) + " of " + Size(p.bytes) + " on " + node;
      std::string elsewhere;
      for (auto [n, b] : p.bytes_by_node) {
        if (n == p.numa_node) continue;
        elsewhere += (elsewhere.empty() ? "" : ", ") + ("node " + std::to_string(n) + ": " + Size(b));
      }
      if (!elsewhere.empty()) p.placement += " (" + elsewhere + ")";
    } else if (binding[i] == Binding::kRefused) {
      p.placement += ranges[i].cpus.empty() ? "; " + Size(p.bytes_on_node) + " of " + Size(p.bytes) + " on " + node
                                            : "; first touch from " + node + "'s CPUs put " + Size(p.bytes_on_node) +
                                                  " of " + Size(p.bytes) + " there";
    }
  }
}

}  // namespace

Result<std::unique_ptr<PinnedPool>> PinnedPool::Create(uint64_t pool_bytes, uint64_t slab_bytes,
                                                       SlabReclaimHooks hooks, const FaultProgress& progress) {
  if (slab_bytes == 0 || pool_bytes == 0 || pool_bytes % slab_bytes != 0) {
    return InvalidArgument("pool size must be a positive multiple of the slab size");
  }
  return Create({PoolPartSpec{-1, pool_bytes}}, slab_bytes, std::move(hooks), progress);
}

Result<std::unique_ptr<PinnedPool>> PinnedPool::Create(std::vector<PoolPartSpec> specs, uint64_t slab_bytes,
                                                       SlabReclaimHooks hooks, const FaultProgress& progress,
                                                       const FaultStop& stop,
                                                       const std::function<Status()>& before_fault_in, bool hugetlb) {
  if (slab_bytes == 0 || slab_bytes % static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) != 0) {
    return InvalidArgument("slab size must be a positive multiple of the page size");
  }
  if (specs.empty()) return InvalidArgument("a pool needs at least one part");
  std::vector<PoolPart> parts(specs.size());
  uint64_t slabs = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].bytes == 0) return InvalidArgument("pool part " + std::to_string(i) + " has no bytes");
    PoolPart& p = parts[i];
    p.numa_node = std::max(specs[i].numa_node, -1);
    p.requested_bytes = specs[i].bytes;
    const uint64_t count = specs[i].bytes / slab_bytes + (specs[i].bytes % slab_bytes != 0);
    if (count > UINT32_MAX - slabs) return InvalidArgument("pool of more than 2^32 slabs");
    p.first_slab = static_cast<uint32_t>(slabs);
    p.slab_count = static_cast<uint32_t>(count);
    p.bytes = count * slab_bytes;
    slabs += count;
  }
  if (slabs > UINT64_MAX / slab_bytes) return InvalidArgument("pool larger than the address space");
  if (hugetlb) {
    uint64_t all = 0;
    for (const PoolPart& p : parts) all += p.bytes;
    FERRY_RETURN_IF_ERROR(CheckHugetlbPool(slab_bytes, all));
    // A part bound to a node faults its pages in there: a node short of free huge pages would
    // end the build with SIGBUS, so each is checked first.
    const std::vector<int> online = OnlineNumaNodes();
    for (const PoolPart& p : parts) {
      if (p.numa_node >= 0 && std::find(online.begin(), online.end(), p.numa_node) != online.end()) {
        FERRY_RETURN_IF_ERROR(CheckHugetlbPages(p.bytes, p.numa_node));
      }
    }
  }
  const uint64_t pool_bytes = slabs * slab_bytes;
  const size_t n = slabs;
  const uint64_t t0 = MonotonicNanos();
  // The slabs' memfds are made by several threads (43 us a slab, 6144 slabs for 48 GiB).
  std::vector<UniqueFd> fds(n);
  FERRY_RETURN_IF_ERROR(MakeSlabs(fds, slab_bytes, hugetlb));
  std::vector<int> raw;
  raw.reserve(n);
  for (const UniqueFd& fd : fds) raw.push_back(fd.get());
  FERRY_ASSIGN_OR_RETURN(Mapping m, MapSideBySide(raw.data(), n, slab_bytes));
  // Ask for huge pages before the first touch: the copy engines then walk 2 MiB pages instead
  // of 4 KiB ones. The kernel grants them to shared memory only when
  // /sys/kernel/mm/transparent_hugepage/shmem_enabled allows it (advise, within_size, always).
  if (!hugetlb) ::madvise(m.data(), pool_bytes, MADV_HUGEPAGE);
  std::vector<Binding> binding;
  const std::vector<FaultRange> ranges = BindParts(parts, m.data(), slab_bytes, &binding);
  const uint64_t t1 = MonotonicNanos();
  if (before_fault_in) FERRY_RETURN_IF_ERROR(before_fault_in());
  const uint64_t t_fault = MonotonicNanos();
  const std::vector<unsigned> threads = FaultInParallel(ranges, 256ull << 20, progress, std::chrono::seconds(1), stop);
  if (stop && stop()) return Aborted("the pool's build was stopped");
  const uint64_t t2 = MonotonicNanos();
  for (size_t i = 0; i < parts.size(); ++i) parts[i].fault_threads = threads[i];
  DescribePlacement(parts, m.data(), slab_bytes, ranges, binding);
  auto pool = std::unique_ptr<PinnedPool>(new PinnedPool(std::move(fds), std::move(m), slab_bytes, std::move(hooks)));
  pool->fault_threads_ = 0;
  pool->hugetlb_ = hugetlb;
  for (PoolPart& p : parts) {
    pool->fault_threads_ += p.fault_threads;
    const uint32_t free_slabs = p.slab_count;
    pool->parts_.push_back(Part{std::move(p), free_slabs});
  }
  pool->build_times_ = {t1 - t0, t2 - t_fault, MonotonicNanos() - t2};
  FERRY_ASSIGN_OR_RETURN(pool->zeroed_efd_, CreateEventFd());
  try {
    pool->zeroer_ = std::thread([p = pool.get()] { p->ZeroerMain(); });
  } catch (const std::system_error& e) {
    return ResourceExhausted(std::string("cannot start the slab zeroer thread: ") + e.what());
  }
  return pool;
}

uint64_t HugetlbPageBytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "Hugepagesize: %llu kB", &kib) == 1) return kib << 10;
  }
  return 0;
}

uint64_t FreeHugetlbPages(int node) {
  const uint64_t page = HugetlbPageBytes();
  if (page == 0) return 0;
  const std::string path = node < 0 ? "/proc/meminfo"
                                    : "/sys/devices/system/node/node" + std::to_string(node) + "/hugepages/hugepages-" +
                                          std::to_string(page >> 10) + "kB/free_hugepages";
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    unsigned long long n = 0;
    if (node >= 0 && std::sscanf(line.c_str(), "%llu", &n) == 1) return n;
    if (node < 0 && std::sscanf(line.c_str(), "HugePages_Free: %llu", &n) == 1) return n;
  }
  return 0;
}

Status CheckHugetlbPages(uint64_t bytes, int node) {
  const uint64_t page = HugetlbPageBytes();
  if (page == 0) return NotSupported("this kernel has no hugetlb pages");
  const uint64_t need = (bytes + page - 1) / page, free = FreeHugetlbPages(node);
  if (free >= need) return Status::Ok();
  const std::string where = node < 0 ? "" : " on NUMA node " + std::to_string(node);
  return ResourceExhausted(
      "the pool needs " + std::to_string(need) + " hugetlb pages of " + std::to_string(page >> 10) + " KiB" + where +
      ", and " + std::to_string(free) + " are free (" +
      (node < 0 ? std::string("HugePages_Free in /proc/meminfo")
                : "/sys/devices/system/node/node" + std::to_string(node) + "/hugepages") +
      "): reserve more (sysctl vm.nr_hugepages, or hugepages= on the kernel's command line), or use pool.huge_pages: "
      "transparent");
}

Status CheckHugetlbPool(uint64_t slab_bytes, uint64_t pool_bytes) {
  const uint64_t page = HugetlbPageBytes();
  if (page == 0) return NotSupported("pool.huge_pages is hugetlb, but this kernel has no hugetlb pages");
  if (slab_bytes % page != 0) {
    return InvalidArgument("pool.huge_pages is hugetlb: pool.slab (" + std::to_string(slab_bytes >> 10) +
                           " KiB) must be a multiple of the huge page size (" + std::to_string(page >> 10) + " KiB)");
  }
  return CheckHugetlbPages(pool_bytes).WithContext("pool.huge_pages: hugetlb");
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
    // hugetlb pages mapped once count as private whatever the mapping's kind.
    if (inside && (std::sscanf(line.c_str(), "ShmemPmdMapped: %llu kB", &v) == 1 ||
                   std::sscanf(line.c_str(), "Shared_Hugetlb: %llu kB", &v) == 1 ||
                   std::sscanf(line.c_str(), "Private_Hugetlb: %llu kB", &v) == 1)) {
      kib += v;
    }
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

uint32_t PinnedPool::part_of_slab(uint32_t slab) const {
  auto it = std::upper_bound(parts_.begin(), parts_.end(), slab,
                             [](uint32_t s, const Part& p) { return s < p.info.first_slab; });
  return static_cast<uint32_t>(it - parts_.begin()) - 1;
}

Result<uint32_t> PinnedPool::GrantRun(uint32_t n, uint64_t owner, uint32_t uid, uint32_t part) {
  if (n == 0) return InvalidArgument("zero slabs asked");
  if (part >= parts_.size()) {
    return InvalidArgument("pool part " + std::to_string(part) + " asked; the pool has " +
                           std::to_string(parts_.size()));
  }
  Part& p = parts_[part];
  const uint32_t begin = p.info.first_slab, end = begin + p.info.slab_count;
  uint32_t run = 0;
  for (uint32_t i = begin; i < end; ++i) {
    run = state_[i] == SlabState::kFree ? run + 1 : 0;
    if (run == n) {
      uint32_t first = i + 1 - n;
      for (uint32_t j = first; j <= i; ++j) {
        owner_[j] = owner;
        state_[j] = SlabState::kGranted;
        uid_[j] = uid;
      }
      uid_use_[uid].slabs += n;
      free_slabs_ -= n;
      p.free_slabs -= n;
      return first;
    }
  }
  return NoRun(n, part);
}

Status PinnedPool::NoRun(uint32_t n, uint32_t part) const {
  const PoolPart& p = parts_[part].info;
  uint32_t quarantined = 0, zeroing = 0, broken = 0;
  for (uint32_t s = p.first_slab; s < p.first_slab + p.slab_count; ++s) {
    quarantined += state_[s] == SlabState::kQuarantined;
    zeroing += state_[s] == SlabState::kZeroing;
    broken += state_[s] == SlabState::kBroken;
  }
  std::string waiting;
  if (quarantined + zeroing > 0) {
    waiting = "; " + std::to_string(quarantined) + " await reclaim (still mapped after their session ended), " +
              std::to_string(zeroing) + " being zeroed";
  }
  if (broken > 0) waiting += "; " + std::to_string(broken) + " out of use (could not be pinned again)";
  // Short enough for the wire's 160-byte message.
  std::string which = "pool";
  if (parts_.size() > 1) {
    which = p.numa_node >= 0 ? "pool part of node " + std::to_string(p.numa_node)
                             : "pool part " + std::to_string(part) + " (no node)";
  }
  return ResourceExhausted(which + " has no " + std::to_string(n) + " free slabs in a row (" +
                           std::to_string(parts_[part].free_slabs) + " of " + std::to_string(p.slab_count) + " free" +
                           waiting + ")");
}

Result<UniqueFd> PinnedPool::OpenForClient(uint32_t slab) const {
  const std::string path = "/proc/self/fd/" + std::to_string(slab_fds_[slab].get());
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("open(" + path + ") for a client's slab", errno);
  return fd;
}

void PinnedPool::Quarantine(uint32_t slab) {
  if (state_[slab] != SlabState::kGranted) return;
  state_[slab] = SlabState::kQuarantined;
  owner_[slab] = 0;
  uid_use_[uid_[slab]].quarantined++;
  ++quarantined_slabs_;
}

void PinnedPool::ForgetUidSlab(uint32_t uid, bool quarantined) {
  auto it = uid_use_.find(uid);
  if (it == uid_use_.end()) return;
  it->second.slabs--;
  if (quarantined) it->second.quarantined--;
  if (it->second.slabs == 0) uid_use_.erase(it);
}

uint64_t PinnedPool::ReclaimQuarantined() {
  if (quarantined_slabs_ == 0) return 0;
  std::vector<uint32_t> reclaimed;
  for (uint32_t s = 0; s < slab_count(); ++s) {
    if (state_[s] != SlabState::kQuarantined) continue;
    auto held = SlabHeldOutside(slab_fds_[s].get());
    if (!held.ok()) {
      if (!std::exchange(probe_failure_logged_, true)) {  // it fails for every slab alike: say it once
        FERRY_LOG(kError) << "cannot tell whether slabs of ended sessions are still mapped by their clients, so they "
                             "stay out of the pool: "
                          << held.status().ToString();
      }
      continue;
    }
    if (*held) continue;
    state_[s] = SlabState::kZeroing;
    --quarantined_slabs_;
    ++zeroing_slabs_;
    ForgetUidSlab(uid_[s], true);
    reclaimed.push_back(s);
  }
  if (!reclaimed.empty()) {
    {
      std::lock_guard<std::mutex> l(zero_mu_);
      to_zero_.insert(to_zero_.end(), reclaimed.begin(), reclaimed.end());
    }
    zero_cv_.notify_one();
  }
  return reclaimed.size() * slab_bytes_;
}

uint32_t PinnedPool::CollectZeroed() {
  DrainDoorbell(zeroed_efd_.get());
  std::vector<std::pair<uint32_t, bool>> done;
  {
    std::lock_guard<std::mutex> l(zero_mu_);
    done.swap(zeroed_);
  }
  uint32_t freed = 0;
  for (auto [s, pinned] : done) {
    --zeroing_slabs_;
    if (!pinned) {
      state_[s] = SlabState::kBroken;
      ++broken_slabs_;
      continue;
    }
    state_[s] = SlabState::kFree;
    ++free_slabs_;
    ++parts_[part_of_slab(s)].free_slabs;
    ++freed;
  }
  return freed;
}

void PinnedPool::ZeroerMain() {
  std::unique_lock<std::mutex> l(zero_mu_);
  for (;;) {
    zero_cv_.wait(l, [&] { return zeroer_stop_ || !to_zero_.empty(); });
    if (zeroer_stop_) return;
    const uint32_t slab = to_zero_.front();
    to_zero_.pop_front();
    l.unlock();
    bool pinned = false;
    try {
      pinned = RenewSlab(slab);
    } catch (...) {  // a throw (allocation, a backend hook) must not end ferryd: the slab stays out
      try {
        FERRY_LOG(kError) << "pool slab " << slab << " stays out of the pool: renewing it threw";
      } catch (...) {
      }
    }
    l.lock();
    zeroed_.emplace_back(slab, pinned);
    RingDoorbell(zeroed_efd_.get());
  }
}

bool PinnedPool::RenewSlab(uint32_t slab) {
  std::byte* p = base() + static_cast<uint64_t>(slab) * slab_bytes_;
  const std::string name = "pool slab " + std::to_string(slab);
  try {
    if (hooks_.before) hooks_.before(p, slab_bytes_);
  } catch (...) {  // a test seam; the slab is renewed all the same
  }
  if (!hooks_.fresh_pages) {
    std::memset(p, 0, slab_bytes_);
    return true;
  }
  if (hooks_.unpin) {
    Status unpinned = hooks_.unpin(p, slab_bytes_);
    if (!unpinned.ok()) {
      // The engines may still reach the old pages: renewing them under the registration would
      // split what the CPU and the engines see. Keep the slab out.
      FERRY_LOG(kError) << name << " stays out of the pool: cannot unpin its old pages: " << unpinned.ToString();
      return false;
    }
  }
  // New pages for the file; old ones stay with whoever still references them (a pipe, an
  // io_uring, an RDMA registration) and never see the next session's bytes.
  if (::fallocate(slab_fds_[slab].get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                  static_cast<off_t>(slab_bytes_)) == 0) {
    FaultIn(p, slab_bytes_);  // the new pages (MADV_HUGEPAGE still covers the range)
  } else {
    const int err = errno;
    if (!std::exchange(in_place_logged_, true)) {
      FERRY_LOG(kError) << "cannot give reclaimed slabs fresh pages (fallocate(PUNCH_HOLE): " << std::strerror(err)
                        << "); zeroing them in place: pages a client pinned without a description (vmsplice, "
                           "io_uring, RDMA) can see the next session's bytes";
    }
    std::memset(p, 0, slab_bytes_);
  }
  if (hooks_.pin) {
    Status pinned = hooks_.pin(p, slab_bytes_);
    if (!pinned.ok()) {
      FERRY_LOG(kError) << name << " stays out of the pool: cannot pin its fresh pages: " << pinned.ToString();
      return false;
    }
  }
  return true;
}

uint64_t PinnedPool::uid_bytes(uint32_t uid) const {
  auto it = uid_use_.find(uid);
  return it == uid_use_.end() ? 0 : it->second.slabs * slab_bytes_;
}

uint64_t PinnedPool::uid_quarantined_bytes(uint32_t uid) const {
  auto it = uid_use_.find(uid);
  return it == uid_use_.end() ? 0 : it->second.quarantined * slab_bytes_;
}

namespace {
std::string MiB(uint64_t bytes) {
  if (bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}
}  // namespace

SessionArena::~SessionArena() {
  for (uint32_t s : owned_slabs_) pool_.Quarantine(s);
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

namespace {
std::string TooManySlabs(uint32_t max_slabs) {
  return "buffer spans more than " + std::to_string(max_slabs) + " slabs; raise pool.slab";
}
}  // namespace

Result<Allocation> SessionArena::Allocate(uint64_t size, uint32_t max_slabs) {
  if (size == 0) return InvalidArgument("buffer of 0 bytes");
  if (part_ >= pool_.part_count()) {
    return InvalidArgument("pool part " + std::to_string(part_) + " asked; the pool has " +
                           std::to_string(pool_.part_count()));
  }
  const PoolPart& part = pool_.part(part_);
  if (size > part.bytes) {
    return ResourceExhausted("buffer of " + std::to_string(size) + " bytes is larger than the pool" +
                             (pool_.part_count() == 1   ? ""
                              : part.numa_node >= 0 ? " part of node " + std::to_string(part.numa_node)
                                                    : " part " + std::to_string(part_)) + " (" +
                             std::to_string(part.bytes) + ")");
  }
  const uint64_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  if (max_slabs != 0 && (rounded + pool_.slab_bytes() - 1) / pool_.slab_bytes() > max_slabs) {
    return InvalidArgument(TooManySlabs(max_slabs));
  }
  uint64_t off = 0;
  if (!TakeFirstFit(rounded, &off)) {
    const uint64_t slab = pool_.slab_bytes();
    const uint32_t need = static_cast<uint32_t>((rounded + slab - 1) / slab);
    if (owned_bytes() + need * slab > quota_) {
      return ResourceExhausted("session quota of " + std::to_string(quota_) + " bytes reached (" +
                               std::to_string(owned_bytes()) + " held, " + std::to_string(need * slab) + " more asked)");
    }
    if (uid_limit_ != 0 && pool_.uid_bytes(uid_) + need * slab > uid_limit_) {
      const uint64_t held = pool_.uid_bytes(uid_), waiting = pool_.uid_quarantined_bytes(uid_);
      // Short enough for the wire's 160-byte message.
      return ResourceExhausted("uid " + std::to_string(uid_) + " holds " + MiB(held) +
                               (waiting ? " (" + MiB(waiting) + " awaiting reclaim: still mapped after its session ended)"
                                        : " and asks " + MiB(need * slab) + " more") +
                               "; limits.pool_per_uid is " + MiB(uid_limit_) + ", in whole " + MiB(slab) + " slabs");
    }
    FERRY_ASSIGN_OR_RETURN(uint32_t first, pool_.GrantRun(need, id_, uid_, part_));
    for (uint32_t s = first; s < first + need; ++s) owned_slabs_.push_back(s);
    AddFreeRange(first * slab, need * slab);
    if (!TakeFirstFit(rounded, &off)) return Internal("fresh slabs did not fit the buffer");
  }
  const uint64_t slab = pool_.slab_bytes();
  const uint32_t first_slab = static_cast<uint32_t>(off / slab);
  const uint32_t last_slab = static_cast<uint32_t>((off + rounded - 1) / slab);
  if (max_slabs != 0 && last_slab - first_slab + 1 > max_slabs) {
    // It fit in max_slabs slabs, but the free range it landed in straddles one more: the
    // range stays the session's, like any freed buffer's.
    ReturnRange(off, rounded);
    return InvalidArgument(TooManySlabs(max_slabs));
  }
  buffers_[off] = BufferInfo{rounded, 0, false};
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
