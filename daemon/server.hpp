// ferryd's server: the control socket, the sessions, the rings and the event loop that feeds
// the backend. One thread runs Run(); Stop() may be called from any thread or a signal handler.
// Its rooms: server.cc (the event loop and lifecycle), sessions.hpp (sessions and their control
// messages), rings.hpp (the shared-memory rings), scheduler.hpp (pieces, fair dispatch, finishing).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/backend.hpp"
#include "daemon/config.hpp"
#include "daemon/preflight.hpp"
#include "daemon/reject_reason.hpp"
#include "policy/policy.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

// One GPU's share of the counters below.
struct GpuCounters {
  std::atomic<uint64_t> sessions{0};  // sessions copying to it
  std::atomic<uint64_t> copies_completed{0};
  std::atomic<uint64_t> bytes_h2d{0};
  std::atomic<uint64_t> bytes_d2h{0};
};

struct ServerCounters {
  std::atomic<uint64_t> sessions{0};
  std::atomic<uint64_t> sessions_total{0};
  std::atomic<uint64_t> copies_completed{0};
  std::atomic<uint64_t> copies_failed{0};
  std::atomic<uint64_t> bytes_h2d{0};
  std::atomic<uint64_t> bytes_d2h{0};
  std::atomic<uint64_t> evictions{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> wait_reports_accepted{0};  // exposed-time reports believed (OnExposed)
  std::atomic<uint64_t> wait_reports_refused{0};   // ... and refused (also in rejected)
  std::atomic<uint64_t> outbound_queued{0};        // replies waiting for clients that do not read them
  std::atomic<uint64_t> pool_free_bytes{0};
  std::atomic<uint64_t> pool_quarantined_bytes{0};  // slabs of ended sessions a process outside ferryd still holds
  std::atomic<uint64_t> pool_zeroing_bytes{0};      // slabs let go of, getting fresh pages before reuse
  std::atomic<uint64_t> pool_broken_bytes{0};       // slabs the backend could not pin again: out of use
  std::atomic<uint64_t> in_flight{0};        // copies accepted and not finished
  std::atomic<uint64_t> in_flight_bytes{0};  // bytes on the engines now
  std::atomic<uint64_t> queued_bytes{0};     // bytes accepted, waiting for the engines
  std::atomic<uint64_t> policy_switches{0};
  std::atomic<uint64_t> policy_failures{0};
  std::atomic<uint64_t> sleeps{0};          // times the event loop went to sleep (each wake-up delays a request)
  // Times the loop set every ring's sleeping bit (before its last look at the rings, after which
  // it may still stay up), and the submit doorbells' rings it read (eventfd counts, as clients
  // wrote them): a client rings only when it takes its ring's bit, so each session rings at most
  // once per announcement.
  std::atomic<uint64_t> sleeps_announced{0};
  std::atomic<uint64_t> submit_doorbells{0};
  std::atomic<uint64_t> buffers_allocated{0};  // pool buffers granted to clients (each a round trip on a socket)
  std::atomic<uint64_t> poll_window_ns{0};  // it polls this long after its last activity (PollWindow)
  // The start, once done: the pool built, its registration, and Server::Create in all (ns).
  std::atomic<uint64_t> start_pool_ns{0};
  std::atomic<uint64_t> start_register_ns{0};
  std::atomic<uint64_t> start_total_ns{0};
  std::atomic<uint64_t> pool_huge_page_bytes{0};
  std::array<GpuCounters, kMaxGpus> gpu;    // by ferryd's index of the GPU (DeviceSet)
  // The pool's parts, one per NUMA node of the GPUs (PinnedPool::part): fixed at the start but
  // for free_bytes.
  struct PoolPartCounters {
    std::atomic<int> numa_node{-1};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> bytes_on_node{0};
    std::atomic<uint64_t> free_bytes{0};
  };
  std::array<PoolPartCounters, kMaxGpus> pool_part;
  std::atomic<uint32_t> pool_parts{0};
};

// What a finished copy looked like, for metrics. Called on the event-loop thread.
struct CopyRecord {
  uint32_t gpu;  // ferryd's index of the GPU (DeviceSet)
  Direction direction;
  bool latency;
  std::string_view client_class;
  std::string_view policy;
  uint64_t bytes;
  uint32_t blocks;        // a block list's; 0 for a single copy
  double queued_seconds;  // accepted to first piece on the engines
  double seconds;         // accepted to done
  bool ok;
};

// A client's report of how long it was blocked waiting for one of its copies (exposed copy
// time), accepted because the copy is real, of that session, reported once, and the wait fits
// in the time since the copy was submitted. `seconds` is the client's figure; the rest is
// ferryd's own. Called on the event-loop thread.
struct ExposedRecord {
  Direction direction;  // the copy's, as ferryd accepted it
  std::string_view client_class;
  std::string_view policy;
  double seconds;       // reported by the client
  double copy_seconds;  // measured by ferryd: the copy's accepted to done (to now, if not done yet)
};

// Told about copies, exposed time and policy changes; the metrics exporter implements it.
class ServerObserver {
 public:
  virtual ~ServerObserver() = default;
  virtual void OnCopyDone(const CopyRecord& r) = 0;
  virtual void OnExposed(const ExposedRecord& r) = 0;
  virtual void OnPolicy(const Policy& now) = 0;
  virtual void OnPolicyRefused() = 0;
  virtual void OnRejected(std::string_view reason) = 0;  // RejectReasonName: a bounded set
};

struct ServerOptions {
  // Tests: a policy to start with instead of the checked config's (config.policy_path's, or
  // the built-in default), and where it came from, for the log.
  std::shared_ptr<const Policy> policy;
  std::string policy_source = {};
  ServerObserver* observer = nullptr;    // must outlive the server
  // Test seam: runs on the pool's zeroer thread before a reclaimed slab gets fresh pages.
  std::function<void(std::byte* slab, uint64_t bytes)> before_slab_renewal = nullptr;
  // Tests: runs on the policy loader's thread before it reads each policy file (reloads and
  // applies), e.g. to make a parse slow on purpose.
  std::function<void(const std::string& name)> before_policy_parse = nullptr;
  // Tests: runs in Create once the socket answers "starting", before the pool is built.
  std::function<void()> before_pool_build = nullptr;
  // Asked while the pool is built (from its fault-in threads; thread-safe): true, a stop came
  // during the start (SIGTERM), and Create gives up at once with kAborted instead of building
  // the rest of a pool that may take minutes.
  std::function<bool()> stop_requested = nullptr;
  // Tests: asked before each fd is watched (on Create's thread, then the event loop's), with its
  // tag (daemon/poller.hpp); an error fails the watch as epoll_ctl's would.
  std::function<Status(uint64_t tag)> watch_fault = nullptr;
};

using GpuBackends = std::vector<std::unique_ptr<Backend>>;
// Makes the backend of each GPU (CreateBackends). The server runs it on a thread of its own while
// it builds the pool: a CUDA context takes a few hundred milliseconds to make.
using BackendMaker = std::function<Result<GpuBackends>()>;
// The GPUs a server serves: each one's NUMA node, known before any backend is made (LocateGpus),
// which its share of the pool is placed on; and how to make their backends, in the same order.
struct GpuSource {
  std::vector<int> numa_nodes;
  BackendMaker make;
  bool pins_pool = false;  // the backends' pins_pool() (cuda): how reclaimed slabs are renewed
};

class Server {
 public:
  // Builds the server from what Preflight passed: listens on config.SocketPath() (hellos are
  // answered "starting" until ready), makes the backends while it creates the pool, registers
  // the pool with them.
  // The pool is split into a part per NUMA node of the GPUs, in proportion to their GPUs.
  static Result<std::unique_ptr<Server>> Create(CheckedConfig checked, GpuSource gpus, ServerOptions options = {});
  // `gpus`: a backend per GPU it serves (CreateBackends), at least one.
  static Result<std::unique_ptr<Server>> Create(CheckedConfig checked, std::vector<std::unique_ptr<Backend>> gpus,
                                                ServerOptions options = {});
  // One GPU.
  static Result<std::unique_ptr<Server>> Create(CheckedConfig checked, std::unique_ptr<Backend> backend,
                                                ServerOptions options = {});
  // The same, after Preflight(config).
  static Result<std::unique_ptr<Server>> Create(const DaemonConfig& config, std::vector<std::unique_ptr<Backend>> gpus,
                                                ServerOptions options = {});
  static Result<std::unique_ptr<Server>> Create(const DaemonConfig& config, std::unique_ptr<Backend> backend,
                                                ServerOptions options = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves until Stop(); then evicts every session, waits for in-flight copies, and removes the
  // socket. Returns an error only if the loop itself failed.
  Status Run();
  void Stop();           // any thread; async-signal-safe
  void RequestReload();  // any thread; async-signal-safe: re-reads config.policy_path (SIGHUP)
  // The running policy (thread-safe snapshot).
  std::shared_ptr<const Policy> policy() const;

  const DaemonConfig& config() const;
  const ServerCounters& counters() const;
  Backend& backend();
  // The GPUs it serves, in its order (the index sessions and counters use).
  std::vector<DeviceInfo> gpus() const;
  uint64_t pool_bytes() const;

 private:
  class Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::daemon
