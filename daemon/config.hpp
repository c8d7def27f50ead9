// ferryd's configuration (config/ferryd.yaml): where it listens, how big its pool is, which
// backend it runs, and the knobs of its copy engine use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/host_link.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

enum class BackendChoice { kAuto, kCuda, kHost };

// How the cuda backend pins the pool (config key pool.register). Slab by slab, a reclaimed slab
// can be given fresh pages and pinned again, so that pages a client pinned behind ferryd's back
// (vmsplice, io_uring, RDMA) never see another user's bytes; the price is that copies are cut at
// slab boundaries (about 2% of bandwidth for large copies with 8 MiB slabs on an H200). Whole,
// reclaimed slabs are zeroed in place: right when one trust domain uses ferryd. auto: slab by
// slab when allowed_group lets other users in, whole otherwise.
enum class PoolRegistration { kAuto, kWhole, kPerSlab };
// Where the pool's huge pages come from (config key pool.huge_pages): transparent huge pages for
// shared memory, granted when /sys/kernel/mm/transparent_hugepage/shmem_enabled allows
// (advise, within_size, always), else 4 KiB pages; or hugetlb: the kernel's reserved huge pages
// (vm.nr_hugepages), every page huge or the start fails saying how many are missing.
enum class PoolPages { kTransparent, kHugetlb };

// What one client, and one user, may take of ferryd (config key `limits`). Every limit refuses
// the request that would pass it with a clear error; none evicts a well-behaved client.
struct Limits {
  uint32_t sessions_per_uid = 16;           // sessions of one uid at once
  uint64_t pool_bytes_per_uid = 0;          // pool bytes one uid holds, slabs awaiting reclaim included; 0: the pool
  uint32_t regions_per_session = 4096;      // device regions registered by one session
  uint32_t regions_per_uid = 16384;         // ... by all sessions of one uid
  uint32_t events_per_session = 4096;       // interprocess events registered by one session
  uint32_t buffers_per_session = 65536;     // pool buffers one session holds at once (ferryd keeps an entry for each)
  uint32_t pending_connections = 64;        // connections that have not said hello yet, all users
  uint32_t pending_connections_per_uid = 8; // ... of one uid
  uint32_t hello_timeout_ms = 5000;         // a connection that has not said hello by then is closed
  uint32_t outbound_messages = 64;          // replies queued for a client that does not read; more evicts it
};

struct DaemonConfig {
  std::string runtime_dir = "/run/ferry";
  std::string socket_name = "ferryd.sock";
  std::string allowed_group;  // empty: only the daemon's own uid (and root) may connect
  BackendChoice backend = BackendChoice::kAuto;
  // The GPUs ferryd serves: CUDA ordinals ("0") and UUIDs ("GPU-..."); empty: all it sees.
  std::vector<std::string> devices;
  // The host backend's stand-in for a node (config key host): this many simulated GPUs, spread
  // over this many simulated NUMA nodes (GPU i on node i % host_numa_nodes).
  uint32_t host_gpus = 1;
  uint32_t host_numa_nodes = 1;
  uint64_t host_gpu_memory_bytes = 0;  // host.gpu_memory: each simulated GPU's; 0: the machine's memory
  // A test tool (config keys host.copy_rate, host.slow): the host backend's simulated link.
  HostLink host_link;
  uint64_t pool_bytes = 1ull << 30;
  uint64_t slab_bytes = 8ull << 20;
  PoolRegistration pool_registration = PoolRegistration::kAuto;
  PoolPages pool_pages = PoolPages::kTransparent;
  uint64_t session_quota_bytes = 0;  // 0: the whole pool
  uint32_t max_sessions = 64;
  Limits limits;
  // Submission ring; the completion ring is twice that. A session has at most this many copies
  // in flight: 1024 keeps 1024 x 64 KiB copies submitted one by one on the engines (256 held
  // them to 38.4 and 43.4 GB/s on an H100, against 42.1 and 42.8 with 1024).
  uint32_t ring_entries = 1024;
  int cpu = -1;                      // pin the event loop to this CPU (one near the GPU); -1: no pinning
  uint32_t spin_us = 200;            // busy-poll at least this long after the last activity, then sleep
  uint32_t spin_max_us = 20000;      // ... or up to this long when requests keep coming (PollWindow); 0: spin_us
  std::string policy_path;           // scheduling policy (policies/*.yaml); empty: built-in default
  std::string metrics_address = "127.0.0.1:9477";  // empty: no exporter
  std::string snapshot_dir;       // signed snapshots go here; empty: none
  std::string snapshot_key;       // the secret key (ferryctl keygen), mode 0600
  uint64_t snapshot_interval_ms = 60000;
  std::string snapshot_host_id;   // the host id the records name; empty: a hash of /etc/machine-id
  bool trace_engine = false;  // log each copy group's timeline on the copy engines (cuda)
  // Threads (the event loop's among them) that issue a batch of small host-to-device copies in
  // parts at once, a GPU (cuda): the driver copies such a copy's bytes on the issuing thread.
  uint32_t issue_threads = 4;
  // Copies ordered after a client's event: false hands them off on the host (ferryd polls the
  // event), as before the GPU-side hand-off, for comparing the two.
  bool handoff_on_gpu = true;

  std::string SocketPath() const { return runtime_dir + "/" + socket_name; }
};

// Reads and validates a config file; every error names file:line:col.
Result<DaemonConfig> LoadConfig(const std::string& path);
Result<DaemonConfig> ParseConfig(const std::string& text, const std::string& name);
Status ValidateConfig(const DaemonConfig& c);
std::string_view BackendChoiceName(BackendChoice b);
// "auto", "cuda" or "host".
Result<BackendChoice> ParseBackendChoice(std::string_view text);
Result<PoolRegistration> ParsePoolRegistration(std::string_view text);
Result<PoolPages> ParsePoolPages(std::string_view text);  // "transparent" | "hugetlb"
std::string_view PoolPagesName(PoolPages pages);
// "all" (or "") or a comma-separated list of ordinals and UUIDs, as --devices takes it.
Result<std::vector<std::string>> ParseDeviceList(std::string_view text);
// "all", or the list as written.
std::string DeviceListText(const std::vector<std::string>& devices);
// What kAuto means for this config: slab by slab when other users may connect.
bool RegistersSlabBySlab(const DaemonConfig& c);

}  // namespace ferry::daemon
