// ferry._ferry.Client: a libferry Client and what the Python side needs beside it.
//
// Thread-safety: any Python thread may call any method. Each call takes its own reference to the
// libferry Client under mu_ and holds it while it runs, so close() on another thread ends the
// session only once the calls already in it have returned. Calls that can block release the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/client.hpp"
#include "python/src/handles.hpp"

namespace ferry::python {

class PyClient {
 public:
  // device: the GPU (a CUDA ordinal of this process; on the host backend the simulated GPU);
  // none: the calling thread's current device.
  PyClient(std::optional<std::string> socket, std::optional<std::string> name, std::optional<double> timeout_s,
           std::optional<int> device);
  ~PyClient();

  void Close();
  bool closed();
  std::string backend();
  int device();
  std::string gpu_uuid();
  int numa_node();
  uint64_t session_id();
  const std::string& socket() const { return socket_; }
  pybind11::dict Stats();

  PoolBuffer AllocateHost(size_t nbytes);
  DeviceBuffer AllocateDevice(size_t nbytes);
  PyEvent CreateEvent();

  // Copies nbytes from src to dst: one of them a pool buffer's memory, the other device memory
  // (cuda: any device pointer; host backend: an AllocateDevice stand-in). `after` orders the copy
  // after a ferry event; `after_cuda_event` after any CUDA event of this process; `stream`
  // (nonzero) after the stream's work so far, and the stream waits for the copy.
  PyTransfer Copy(uintptr_t dst, bool dst_cuda, uintptr_t src, bool src_cuda, size_t nbytes, bool latency,
                  bool stream_waitable, PyEvent* after, uintptr_t after_cuda_event, uintptr_t stream);
  // A block list between a pool tensor and a device tensor of dst_nbytes and src_nbytes bytes;
  // the index lists are uint32 arrays of `count` entries at src_index and dst_index.
  PyTransfer CopyBlocks(uintptr_t dst, bool dst_cuda, size_t dst_nbytes, uintptr_t src, bool src_cuda,
                        size_t src_nbytes, uintptr_t src_index, uintptr_t dst_index, size_t count, size_t block_bytes,
                        bool latency, bool stream_waitable, PyEvent* after, uintptr_t after_cuda_event,
                        uintptr_t stream);
  // Any host memory (pageable) to or from device memory through ferry's staging buffers. Blocks.
  void CopyStaged(uintptr_t dst, bool dst_cuda, uintptr_t src, bool src_cuda, size_t nbytes);
  void StreamWait(std::vector<PyTransfer*> transfers, uintptr_t stream);
  void ForgetDeviceMemory();
  // The C++ round trip the Python path is compared with: `iterations` copies of nbytes (latency
  // class, or bulk) between the same two buffers, each submitted and waited for by libferry
  // alone. Nanoseconds.
  std::vector<int64_t> TimeRoundTrips(uintptr_t dst, bool dst_cuda, uintptr_t src, bool src_cuda, size_t nbytes,
                                      int iterations, bool latency);

 private:
  struct HostSide {
    std::shared_ptr<HostBuffer> buffer;
    size_t offset = 0;
  };
  struct DeviceSide {
    DeviceRegion region;
    size_t offset = 0;
  };
  struct Plan {
    Direction direction{};
    HostSide host;
    DeviceSide device;
  };
  // An event that orders copies after a stream's work (or after foreign CUDA events, relayed).
  // `mu` is held from the event's record to the copy's submission: the copy waits for its own
  // record, not another thread's.
  struct OrderingEvent {
    std::mutex mu;
    std::optional<SharedEvent> event;  // created on first use, under mu
  };
  static constexpr size_t kMaxStreamEvents = 64;  // beyond this, idle ones are dropped

  std::shared_ptr<Client> Get();
  std::optional<HostSide> PoolAt(uintptr_t p, size_t nbytes);
  bool IsStandIn(uintptr_t p);
  bool IsDevice(uintptr_t p, bool cuda) { return cuda || IsStandIn(p); }
  DeviceSide DeviceAt(Client& c, uintptr_t p, size_t nbytes);
  Status ExplainDeviceError(Client& c, const Status& st);
  Plan Resolve(Client& c, uintptr_t dst, bool dst_cuda, size_t dst_nbytes, uintptr_t src, bool src_cuda,
               size_t src_nbytes);
  static std::string WhyNoPlan(bool dst_pool, bool dst_device, bool src_pool, bool src_device);
  std::shared_ptr<OrderingEvent> OrderingFor(uintptr_t after_cuda_event, uintptr_t stream);
  // Submits `submit(options)` with the copy's ordering options; runs without the GIL.
  Result<Transfer> SubmitOrdered(Client& c, bool latency, bool stream_waitable, PyEvent* after,
                                 uintptr_t after_cuda_event, uintptr_t stream, OrderingEvent* ordering,
                                 const std::function<Result<Transfer>(const CopyOptions&)>& submit);

  std::string socket_;
  std::mutex mu_;  // guards everything below
  std::shared_ptr<Client> client_;  // null once closed
  // The pool buffers and host-backend device stand-ins handed out, by base address: live ones
  // never overlap, so the nearest live one at or below an address is the only one it can be in.
  std::map<uintptr_t, std::weak_ptr<HostBuffer>> pool_;
  std::map<uintptr_t, std::weak_ptr<DeviceAllocation>> stand_ins_;
  std::map<uintptr_t, std::shared_ptr<OrderingEvent>> stream_events_;  // one per stream: `stream=`
  std::shared_ptr<OrderingEvent> relay_event_;  // `after=` a foreign CUDA event
};

}  // namespace ferry::python
