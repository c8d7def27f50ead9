// libferry: the C++ client API of ferry.
//
//   auto client = ferry::Client::Connect({});                       // or {.socket_path = ...}
//   auto host   = client->AllocateHost(64 << 20);                   // zero-copy, pinned by ferryd
//   auto region = client->RegisterDevice(dev_ptr, bytes);           // any cudaMalloc'd pointer
//   auto t      = client->Copy(ferry::Direction::kHostToDevice, *host, 0, *region, 0, n);
//   t->Wait(std::chrono::seconds(1));                               // or Poll(), or StreamWait(s)
//
// Nothing throws across this API: every fallible call returns Status or Result<T>.
// Thread-safety: a Client and the objects it hands out may be used from several threads.
// Objects handed out keep the connection's state alive; destroying the Client does not
// invalidate them, but once the connection is gone their operations fail with kUnavailable.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ferry/export.h"
#include "ferry/status.hpp"

namespace ferry {

namespace detail {
class ClientCore;
struct TransferState;
struct HostBufferState;
struct DeviceRegionState;
struct EventState;
struct DeviceAllocationState;
struct ClientImpl;
}  // namespace detail

enum class Direction { kHostToDevice, kDeviceToHost };
enum class Priority { kBulk, kLatency };
enum class BackendKind { kHost, kCuda };

// The default control socket: $FERRY_SOCKET, else /run/ferry/ferryd.sock.
FERRY_EXPORT std::string DefaultSocketPath();

struct ConnectOptions {
  std::string socket_path;  // empty: DefaultSocketPath()
  std::string name;         // shows in the daemon's logs; empty: the program's name
  std::chrono::milliseconds timeout{5000};
  // The GPU this client copies to: a CUDA ordinal of this process (its own numbering, as
  // CUDA_VISIBLE_DEVICES makes it); -1: the calling thread's current device. ferryd serves every
  // GPU of the node; a client copies to one (its device memory must be on it, and its pool
  // buffers come from that GPU's NUMA node): connect once per GPU. On the host backend: the
  // simulated GPU.
  int device = -1;
};

// A buffer in ferryd's pinned pool, mapped into this process: write into data() and copy from
// it with no host-side copy. Freed when destroyed.
class FERRY_EXPORT HostBuffer {
 public:
  HostBuffer(HostBuffer&&) noexcept;
  HostBuffer& operator=(HostBuffer&&) noexcept;
  ~HostBuffer();
  std::byte* data() const;
  size_t size() const;

 private:
  friend class Client;
  explicit HostBuffer(std::shared_ptr<detail::HostBufferState> s);
  std::shared_ptr<detail::HostBufferState> s_;
};

// Device memory registered with ferryd (by CUDA IPC handle on the cuda backend). Copies address
// it by offset from the registered pointer. Unregistered when destroyed.
class FERRY_EXPORT DeviceRegion {
 public:
  DeviceRegion(DeviceRegion&&) noexcept;
  DeviceRegion& operator=(DeviceRegion&&) noexcept;
  ~DeviceRegion();
  void* data() const;  // the pointer that was registered
  size_t size() const;

 private:
  friend class Client;
  explicit DeviceRegion(std::shared_ptr<detail::DeviceRegionState> s);
  std::shared_ptr<detail::DeviceRegionState> s_;
};

// Device memory allocated by the client library for the daemon's backend: cudaMalloc on the
// cuda backend; on the host backend, a sealed memory segment standing in for the GPU, whose
// data() the process can read and write directly (host_visible()).
class FERRY_EXPORT DeviceAllocation {
 public:
  DeviceAllocation(DeviceAllocation&&) noexcept;
  DeviceAllocation& operator=(DeviceAllocation&&) noexcept;
  ~DeviceAllocation();
  void* data() const;
  size_t size() const;
  bool host_visible() const;

 private:
  friend class Client;
  explicit DeviceAllocation(std::shared_ptr<detail::DeviceAllocationState> s);
  std::shared_ptr<detail::DeviceAllocationState> s_;
};

// A CUDA interprocess event shared with ferryd. Record it on your stream, then pass it as
// CopyOptions::after: the copy starts on the GPU once your stream reaches the record, with no
// CPU round trip. On the host backend, recording is a no-op and `after` is always satisfied.
class FERRY_EXPORT SharedEvent {
 public:
  SharedEvent(SharedEvent&&) noexcept;
  SharedEvent& operator=(SharedEvent&&) noexcept;
  ~SharedEvent();
  Status Record(void* cuda_stream);
  // Records this event once `cuda_event` (any CUDA event of this process, e.g. a framework's,
  // already recorded on its stream) has happened: a stream of libferry's own waits for it on
  // the GPU and then records, so a copy `after` this event still starts with no host round
  // trip. The client has one such stream: records made this way happen in call order.
  Status RecordAfter(void* cuda_event);

 private:
  friend class Client;
  explicit SharedEvent(std::shared_ptr<detail::EventState> s);
  std::shared_ptr<detail::EventState> s_;
};

// Copies are not ordered among themselves: two copies in flight at once may run side by side
// or in either order (on any policy, however many streams it has). To order a copy after
// another, wait for the first one's Transfer (Wait) before submitting the second, or, without
// blocking, make the first `stream_waitable`, have a CUDA stream wait for it
// (Transfer::StreamWait), record a SharedEvent on that stream (Record) and pass it as the
// second's `after`.
struct CopyOptions {
  Priority priority = Priority::kBulk;
  const SharedEvent* after = nullptr;  // start once this event's last record has happened
  bool stream_waitable = false;        // allow Transfer::StreamWait (costs an event per copy)
};

// What Client::CopyBlocks copies: block i of the list copies lengths[i] bytes (or block_bytes,
// when lengths is empty) from block src[i] of the source to block dst[i] of the destination,
// block k of a region lying k * block_bytes from its start. The source is the host side of a
// host-to-device copy, the device side of a device-to-host one. src, dst (and lengths) are
// equally long, 1 to 262,144 blocks; no two blocks may share a destination block.
struct BlockList {
  size_t block_bytes = 0;
  std::span<const uint32_t> src;
  std::span<const uint32_t> dst;
  std::span<const uint32_t> lengths;  // empty: every block is block_bytes long
};

// One submitted copy.
class FERRY_EXPORT Transfer {
 public:
  Transfer() = default;
  // true once done; the copy's error if it failed.
  Result<bool> Poll();
  // Blocks until done or `timeout` passes (kTimeout).
  Status Wait(std::chrono::microseconds timeout);
  // Makes `cuda_stream` wait on the GPU for this copy; returns without blocking the host.
  // Needs CopyOptions::stream_waitable. On the host backend, waits on the host instead.
  Status StreamWait(void* cuda_stream);
  size_t bytes() const;
  // Host-observed time from submission to completion seen (after it completed).
  std::chrono::nanoseconds latency() const;

 private:
  friend class Client;
  Transfer(std::shared_ptr<detail::ClientCore> core, std::shared_ptr<detail::TransferState> s);
  std::shared_ptr<detail::ClientCore> core_;
  std::shared_ptr<detail::TransferState> s_;
};

// For Client::CopyStaged. Zero: what the running policy says (its staging section).
struct StagedCopyOptions {
  size_t chunk_bytes = 0;
  int threads = 0;
  Priority priority = Priority::kBulk;
};

struct DaemonStats {
  uint64_t sessions, copies_completed, bytes_h2d, bytes_d2h, pool_bytes, pool_free_bytes, evictions, rejected;
};

class FERRY_EXPORT Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(const ConnectOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  BackendKind backend() const;
  int device_ordinal() const;  // the GPU it copies to, in this process's numbering
  // ... as ferryd names it: its UUID ("GPU-..."; on the host backend "host-gpu-N"), and its
  // NUMA node (-1: not known), where this client's pool buffers live.
  const std::string& gpu_uuid() const;
  int numa_node() const;
  uint64_t session_id() const;

  Result<HostBuffer> AllocateHost(size_t bytes);
  Result<DeviceAllocation> AllocateDevice(size_t bytes);
  // Registers device memory: on the cuda backend any device pointer of this process; on the host
  // backend a pointer from AllocateDevice.
  Result<DeviceRegion> RegisterDevice(void* device_ptr, size_t bytes);
  // The registered region holding [device_ptr, device_ptr + bytes): the whole allocation around
  // it (a cudaMalloc, or a segment of a framework's caching allocator; on the host backend an
  // AllocateDevice allocation), registered on first use and cached per allocation, so later
  // calls anywhere inside it make no round trip to ferryd. `*offset` is where device_ptr lies in
  // the region. An allocation freed and another made at the same address is told apart (by
  // CUDA's buffer id) and registered anew.
  Result<DeviceRegion> RegisterDeviceAllocation(const void* device_ptr, size_t bytes, size_t* offset);
  // Empties that cache: ferryd unmaps each allocation once no region or copy still holds it.
  // Call after freeing device memory in bulk (e.g. after torch.cuda.empty_cache()).
  void ForgetDeviceAllocations();
  Result<SharedEvent> CreateEvent();

  Result<Transfer> Copy(Direction direction, const HostBuffer& host, size_t host_offset, const DeviceRegion& device,
                        size_t device_offset, size_t bytes, const CopyOptions& options = {});

  // Copies a list of blocks between host and device as one copy: one submission, one
  // completion, the same ordering options as Copy. The host region is `host` from host_offset to
  // its end, the device region `device` from device_offset to its end; ferryd checks every index
  // against both before any byte moves and refuses the whole list, naming the first bad index.
  // ferryd runs the list as batches over its copy streams, adjacent blocks coalesced. The list
  // is copied before this returns.
  Result<Transfer> CopyBlocks(Direction direction, const HostBuffer& host, size_t host_offset,
                              const DeviceRegion& device, size_t device_offset, const BlockList& blocks,
                              const CopyOptions& options = {});

  // Copies between any host memory (pageable: malloc'd, mmap'd, a framework's tensor) and
  // device memory through pool buffers: client threads copy chunks into staging buffers while
  // ferryd DMAs the chunks already staged. Blocks until every byte has arrived. The staging
  // buffers stay with this client for reuse (they count against its pool quota).
  Status CopyStaged(Direction direction, void* host, const DeviceRegion& device, size_t device_offset, size_t bytes,
                    const StagedCopyOptions& options = {});

  // Makes `cuda_stream` wait on the GPU for every copy in `transfers` (all of this client,
  // each stream_waitable); returns without blocking on the copies themselves. Waiting on a
  // step's copies together costs the stream one pair of timing events instead of a pair each,
  // and their stall is reported to ferryd as one wait, against the batch's newest copy (and its
  // direction: wait on each direction's copies apart to see them apart in the metrics). On the
  // host backend, waits on the host.
  Status StreamWait(std::span<Transfer> transfers, void* cuda_stream);

  Result<DaemonStats> Stats();

 private:
  explicit Client(std::shared_ptr<detail::ClientCore> core);
  std::unique_ptr<detail::ClientImpl> impl_;
};

}  // namespace ferry
