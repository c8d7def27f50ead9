// The daemon's pinned host memory: `slab_count` sealed memfds of `slab_bytes`, mapped side by
// side into one address range that the backend registers for DMA once, at start. The range is
// cut into parts, one per NUMA node of the GPUs served (daemon/numa.hpp): a part's slabs are in
// a row and its pages on its node, and a session's slabs come from its GPU's part.
//
// Isolation (docs/design.md, "Isolation: what ferry promises"): a slab belongs to at most one
// session at a time, and a client only ever receives descriptions of its own slabs. ferryd keeps
// the memfd it created to itself; each grant sends a fresh open file description of it
// (OpenForClient). When a session ends its slabs go to quarantine, still counted against its
// uid, and leave it only once no description other than ferryd's own exists anywhere
// (SlabHeldOutside): no fd, no mapping, in no process. Then a worker thread gives them fresh
// pages, off the event loop, and only then are they free for the next session. Fresh pages, not
// zeroed old ones: a client can keep references to a slab's pages without any description
// (vmsplice into a pipe, io_uring fixed buffers, RDMA registrations), and those must go on
// seeing the old pages, never the next session's bytes. Punching a hole in the memfd orphans the
// old pages to whoever still references them; the file gets new zero pages.
//
// The bookkeeping lives here, in daemon memory; nothing a client can write affects it.
// Thread-safety: none, except where noted; driven by the daemon's event loop. The zeroer thread
// touches only the memory of slabs handed to it and its own queues.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/fd.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

// The CPUs this process may run on (its affinity mask).
unsigned UsableCpus();
// Told how far a pool's fault-in got: bytes faulted of total. Called on the creating thread: at
// the start (0), every interval while the workers fault, and at the end (total).
using FaultProgress = std::function<void(uint64_t faulted, uint64_t total)>;
// Asked by the faulting threads between chunks of 64 MiB: true abandons the fault-in (a start
// that was told to stop, or whose GPUs failed). Must be thread-safe.
using FaultStop = std::function<bool()>;
// A range for FaultInParallel, and where its threads run.
struct FaultRange {
  std::byte* p = nullptr;
  uint64_t n = 0;
  std::vector<int> cpus;     // its threads are pinned to these CPUs (a NUMA node's); empty: not pinned
  unsigned max_threads = 0;  // 0: one per usable CPU
};
// Maps every page of each range now, by up to max_threads threads a range, each a contiguous
// share of at least min_share bytes, all ranges at once: the kernel zeroes every page it hands
// out, on the faulting thread's CPU, and one thread did 0.6 s a GiB (a 48 GiB pool in 28.8 s on
// the H200's host). A thread whose pinning the kernel refuses faults unpinned. The caller's
// thread reports progress over all ranges together, and faults the shares of threads that
// could not start. Returns the threads used for each range (at least 1: the caller's). When
// `stop` says so, every thread stops at its next chunk and the ranges are left part faulted.
std::vector<unsigned> FaultInParallel(const std::vector<FaultRange>& ranges, uint64_t min_share,
                                      const FaultProgress& progress = {},
                                      std::chrono::milliseconds interval = std::chrono::seconds(1),
                                      const FaultStop& stop = {});
// One range, its threads not pinned, up to one per usable CPU. Returns the threads used.
unsigned FaultInParallel(std::byte* p, uint64_t n, uint64_t min_share, const FaultProgress& progress = {},
                         std::chrono::milliseconds interval = std::chrono::seconds(1));

// The kernel's reserved huge pages (hugetlb): their size (Hugepagesize in /proc/meminfo; 0 when
// the kernel has none), and how many are free, on the whole machine (node -1) or on one NUMA node.
uint64_t HugetlbPageBytes();
uint64_t FreeHugetlbPages(int node = -1);
// Whether `bytes` of hugetlb pages can be had (on `node`, or anywhere for -1): OK, or
// ResourceExhausted saying how many are free and how to reserve more.
Status CheckHugetlbPages(uint64_t bytes, int node = -1);
// A pool of `pool_bytes` in slabs of `slab_bytes` from hugetlb pages: the kernel has them, the
// slab is a whole number of them, and enough are free on the machine. What ferryd's start and
// --check-config both check first.
Status CheckHugetlbPool(uint64_t slab_bytes, uint64_t pool_bytes);

// Bytes of [base, base + size) that this process maps with huge (PMD) pages, from /proc/self/smaps
// (transparent huge pages and hugetlb pages both).
uint64_t MappedHugePageBytes(const std::byte* base, uint64_t size);
// The kernel's transparent huge page setting for shared memory ("never", "advise", ...).
std::string ShmemHugePageSetting();

// Whether an open file description of the memfd behind `slab_fd` exists other than the one
// memfd_create() returned (ferryd's own, which it maps and never sends): an fd in any process,
// one in flight in a socket, or a mapping (a mapping keeps its description alive). Answered by
// the kernel: a write lease (F_SETLEASE F_WRLCK) is granted only when the caller's is the only
// description open for reading or writing. The probe opens a fresh read-only description through
// /proc/self/fd, asks for the lease and closes it (which drops the lease at once). The
// description memfd_create() returns is not counted by the kernel's open-for-read/write counts,
// while every description opened since is, including the ones ferryd sends, re-opens through
// /proc/<pid>/fd, and the copies a fork or SCM_RIGHTS makes share a counted one. true: held
// outside (or the probe could not tell: held is the safe answer's error path, see the caller).
Result<bool> SlabHeldOutside(int slab_fd);

// What the zeroer thread calls around giving a reclaimed slab fresh pages. Each may be null.
// They run on the zeroer thread, so they must be safe to call from it while the event loop runs.
struct SlabReclaimHooks {
  // Before the old pages go, and once the new ones are in place: the backend lets go of the
  // old pages' DMA registration and registers the new ones. A failed pin keeps the slab out of
  // the pool ("broken"): a slab the engines cannot reach is never handed out.
  std::function<Status(std::byte* slab, uint64_t bytes)> unpin, pin;
  // Test seam: runs first, with the old pages still in place.
  std::function<void(std::byte* slab, uint64_t bytes)> before;
  // false: the engines reach the pool through one pinning of the whole range, which fresh pages
  // would escape; reclaimed slabs are then zeroed in place, and unpin/pin are not called.
  bool fresh_pages = true;
};

// One part of a pool: its bytes, and the NUMA node its pages belong on (-1: none, wherever the
// kernel puts them). A GPU's clients get their buffers from the part of the GPU's node.
struct PoolPartSpec {
  int numa_node = -1;
  uint64_t bytes = 0;  // rounded up to whole slabs
};

// A part as built: its slabs, in a row, and where its pages are.
struct PoolPart {
  int numa_node = -1;
  uint32_t first_slab = 0, slab_count = 0;
  uint64_t requested_bytes = 0;  // asked
  uint64_t bytes = 0;            // what it has: slab_count whole slabs
  bool bound = false;            // its range is bound to numa_node (mbind), so renewed slabs stay there
  uint64_t bytes_on_node = 0;    // of its pages, on numa_node after the fault-in (/proc/self/numa_maps)
  std::map<int, uint64_t> bytes_by_node;  // all of them by node (empty for a part of no node)
  unsigned fault_threads = 0;    // threads that faulted it in
  // In words, for the log: "all 512 MiB on node 0", "384 MiB of 512 MiB on node 0 (node 1: 128
  // MiB)", "not placed: node 1 is not online on this machine", "not placed: 200 GiB is more
  // than node 1's memory (188 GiB)", "not bound (mbind to node 0: ...); first touch from node
  // 0's CPUs put 512 MiB of 512 MiB there", "no node".
  std::string placement;
  // Whether every page is on its node and will stay there: bound and all on the node. false for
  // a part of no node.
  bool placed() const;
};

// Where a pool's build went (for the log): its slabs made and mapped, faulted in, and where
// their pages landed looked up (huge pages, NUMA nodes).
struct PoolBuildTimes {
  uint64_t slabs_ns = 0, fault_ns = 0, inspect_ns = 0;
};

class PinnedPool {
 public:
  // One address range, as ever (pool offsets and base() are global), its slabs part by part:
  // part i's right after part i-1's, each part's bytes rounded up to whole slabs. Each part of a
  // node is bound to it before it is faulted in, by threads pinned to that node's usable CPUs
  // (any CPU when it has none); parts fault in at once, sharing the CPUs; progress counts all of
  // them. A part that cannot be placed (its node not online, mbind refused) is built all the
  // same and says why in its `placement`: the caller logs it (once). The hooks must stay callable
  // until the pool is destroyed. `stop`: asked while the pool faults in; true gives up the
  // build (kAborted), its memory released, in a fraction of a second whatever the pool's size.
  // before_fault_in runs once the slabs are made and mapped, before any page is faulted in: the
  // caller finishes there what must not run alongside the fault-in (a CUDA context being made
  // stalls it: both work on the process's memory map); its error ends the build.
  // hugetlb: the slabs are memfds of the kernel's reserved huge pages (MFD_HUGETLB; slab_bytes
  // a multiple of their size), each part's checked against its node's free ones first; else
  // shared memory that asks for transparent huge pages (MADV_HUGEPAGE).
  static Result<std::unique_ptr<PinnedPool>> Create(std::vector<PoolPartSpec> parts, uint64_t slab_bytes,
                                                    SlabReclaimHooks hooks = {}, const FaultProgress& progress = {},
                                                    const FaultStop& stop = {},
                                                    const std::function<Status()>& before_fault_in = {},
                                                    bool hugetlb = false);
  bool hugetlb() const { return hugetlb_; }
  // One part of no node, of exactly pool_bytes (a multiple of slab_bytes).
  static Result<std::unique_ptr<PinnedPool>> Create(uint64_t pool_bytes, uint64_t slab_bytes,
                                                    SlabReclaimHooks hooks = {}, const FaultProgress& progress = {});
  ~PinnedPool();  // joins the zeroer (after it finishes the slab it is renewing)
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  std::byte* base() const { return mapping_.data(); }
  uint64_t size() const { return mapping_.size(); }
  uint64_t slab_bytes() const { return slab_bytes_; }
  // Of the pool, the bytes mapped with huge pages now (reads /proc/self/smaps: 0.2 s for 48 GiB
  // in 6144 slabs; thread-safe).
  uint64_t huge_page_bytes() const { return MappedHugePageBytes(base(), size()); }
  unsigned fault_threads() const { return fault_threads_; }  // threads that faulted the pool in at start, all parts
  uint32_t slab_count() const { return static_cast<uint32_t>(slab_fds_.size()); }
  int slab_fd(uint32_t slab) const { return slab_fds_[slab].get(); }
  uint64_t free_bytes() const { return free_slabs_ * slab_bytes_; }
  uint64_t free_bytes(uint32_t part) const { return uint64_t{parts_[part].free_slabs} * slab_bytes_; }
  const PoolBuildTimes& build_times() const { return build_times_; }
  uint32_t part_count() const { return static_cast<uint32_t>(parts_.size()); }
  const PoolPart& part(uint32_t i) const { return parts_[i].info; }
  uint32_t part_of_slab(uint32_t slab) const;
  uint64_t owner(uint32_t slab) const { return owner_[slab]; }  // 0: not granted (free, quarantined or zeroing)

  // Grants `n` free slabs in a row of part `part` to session `owner` (non-zero) of `uid`.
  // Returns the first slab's index.
  Result<uint32_t> GrantRun(uint32_t n, uint64_t owner, uint32_t uid, uint32_t part = 0);
  // A fresh read-write open file description of a granted slab, to send to its session's client
  // (then close). ferryd's own description never leaves the daemon, so SlabHeldOutside can count
  // the client's.
  Result<UniqueFd> OpenForClient(uint32_t slab) const;
  // The slab's session ended: it waits in quarantine, still counted against its uid, until
  // ReclaimQuarantined finds that no one outside ferryd can reach it.
  void Quarantine(uint32_t slab);
  // Probes every quarantined slab; hands the ones no process outside ferryd can reach to the
  // zeroer, which gives them fresh pages. Returns the bytes that left quarantine.
  uint64_t ReclaimQuarantined();
  // Puts the slabs the zeroer has finished in the free set (those it could not pin again stay
  // out, broken). Returns how many went to the free set.
  uint32_t CollectZeroed();
  // Readable (an eventfd) when CollectZeroed has slabs to take; drained by CollectZeroed.
  int zeroed_fd() const { return zeroed_efd_.get(); }

  bool quarantined(uint32_t slab) const { return state_[slab] == SlabState::kQuarantined; }
  uint64_t quarantined_bytes() const { return quarantined_slabs_ * slab_bytes_; }
  uint64_t zeroing_bytes() const { return zeroing_slabs_ * slab_bytes_; }
  // Slabs the backend could not pin again after their pages were renewed: out of use for good.
  uint64_t broken_bytes() const { return broken_slabs_ * slab_bytes_; }
  // Pool bytes `uid` holds: slabs of its live sessions and its quarantined slabs.
  uint64_t uid_bytes(uint32_t uid) const;
  uint64_t uid_quarantined_bytes(uint32_t uid) const;

 private:
  enum class SlabState : uint8_t { kFree, kGranted, kQuarantined, kZeroing, kBroken };
  struct UidUse {
    uint32_t slabs = 0;        // granted and quarantined
    uint32_t quarantined = 0;  // of those, quarantined
  };
  struct Part {
    PoolPart info;
    uint32_t free_slabs = 0;
  };
  PinnedPool(std::vector<UniqueFd> fds, Mapping m, uint64_t slab_bytes, SlabReclaimHooks hooks);
  // The ResourceExhausted of a GrantRun that found no run of n in part p.
  Status NoRun(uint32_t n, uint32_t p) const;
  void ZeroerMain();
  // Gives the slab fresh zero pages, pinned again. false: it could not be pinned again.
  bool RenewSlab(uint32_t slab);
  void ForgetUidSlab(uint32_t uid, bool quarantined);

  PoolBuildTimes build_times_;
  unsigned fault_threads_ = 1;
  bool hugetlb_ = false;
  std::vector<UniqueFd> slab_fds_;  // the descriptions memfd_create() returned: never sent
  Mapping mapping_;
  uint64_t slab_bytes_;
  std::vector<Part> parts_;
  std::vector<uint64_t> owner_;  // session id while granted, else 0
  std::vector<SlabState> state_;
  std::vector<uint32_t> uid_;    // while granted or quarantined
  std::map<uint32_t, UidUse> uid_use_;
  uint32_t free_slabs_;
  uint32_t quarantined_slabs_ = 0;
  uint32_t zeroing_slabs_ = 0;
  uint32_t broken_slabs_ = 0;
  bool probe_failure_logged_ = false;

  // The zeroer: slabs go in to_zero_, come back in zeroed_, the eventfd tells the loop.
  SlabReclaimHooks hooks_;
  bool in_place_logged_ = false;  // zeroer thread only
  UniqueFd zeroed_efd_;
  std::mutex zero_mu_;
  std::condition_variable zero_cv_;
  std::deque<uint32_t> to_zero_;   // guarded by zero_mu_
  std::vector<std::pair<uint32_t, bool>> zeroed_;  // slab, pinned again; guarded by zero_mu_
  bool zeroer_stop_ = false;       // guarded by zero_mu_
  std::thread zeroer_;
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

// One session's buffers, carved from slabs granted to it (small buffers share its slabs, never
// another session's). Quarantines its slabs when destroyed.
class SessionArena {
 public:
  static constexpr uint64_t kAlignment = 256;

  // uid_limit_bytes: what all of `uid`'s slabs together may reach (0: no limit but the pool).
  // part: the pool part its slabs come from (the one local to the session's GPU).
  SessionArena(PinnedPool& pool, uint64_t session_id, uint64_t quota_bytes, uint32_t uid = 0,
               uint64_t uid_limit_bytes = 0, uint32_t part = 0)
      : pool_(pool), id_(session_id), quota_(quota_bytes), uid_(uid), uid_limit_(uid_limit_bytes), part_(part) {}
  ~SessionArena();
  SessionArena(const SessionArena&) = delete;
  SessionArena& operator=(const SessionArena&) = delete;

  // `max_slabs` (0: any): the most slabs the buffer may span (what one reply can carry fds
  // for). A buffer that could need more is refused before any slab is granted for it.
  Result<Allocation> Allocate(uint64_t size, uint32_t max_slabs = 0);
  // Frees now, or marks for freeing once no copy uses the buffer.
  Status Free(uint64_t pool_offset);
  // The live buffer wholly containing [offset, offset + length), or null. Overflow-safe.
  BufferInfo* Find(uint64_t offset, uint64_t length, uint64_t* buffer_offset);
  // Called when a copy that used the buffer at buffer_offset is done.
  void CopyDone(uint64_t buffer_offset);

  uint64_t owned_bytes() const { return owned_slabs_.size() * pool_.slab_bytes(); }
  const std::vector<uint32_t>& owned_slabs() const { return owned_slabs_; }
  size_t buffer_count() const { return buffers_.size(); }
  uint32_t part() const { return part_; }

 private:
  void AddFreeRange(uint64_t off, uint64_t len);
  bool TakeFirstFit(uint64_t size, uint64_t* off);
  void ReturnRange(uint64_t off, uint64_t len) { AddFreeRange(off, len); }

  PinnedPool& pool_;
  uint64_t id_;
  uint64_t quota_;
  uint32_t uid_;
  uint64_t uid_limit_;
  uint32_t part_;
  std::vector<uint32_t> owned_slabs_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, coalesced
  std::map<uint64_t, BufferInfo> buffers_;
};

}  // namespace ferry::daemon
