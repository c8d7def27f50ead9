// ferry._ferry: the Python extension over libferry's C++ API. It speaks in addresses and sizes;
// the ferry package (ferry/__init__.py) turns torch tensors and numpy arrays into them.
//
// Ownership: a PoolBuffer or DeviceBuffer holds its libferry handle by shared_ptr; every tensor
// or array made over it (a DLPack capsule, the buffer protocol) holds that shared_ptr too, so the
// memory stays mapped while any view of it lives, even after the Client is closed.
// Thread-safety: every call that can block (a round trip to ferryd, a wait, a staged copy)
// releases the GIL; a Client's lookup tables have their own lock.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/client.hpp"
#include "ferry/version.hpp"
#include "python/src/dlpack.hpp"
#include "python/src/errors.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

using Clock = std::chrono::steady_clock;

struct PoolBuffer {
  std::shared_ptr<HostBuffer> buffer;
  size_t nbytes = 0;  // what was asked (the pool may have rounded up)
};

struct DeviceBuffer {
  std::shared_ptr<DeviceAllocation> allocation;
  size_t nbytes = 0;
  int device_type = kDLCPU;  // kDLCUDA on the cuda backend
  int device_id = 0;
};

// One side of a copy as libferry names it.
struct HostSide {
  std::shared_ptr<HostBuffer> buffer;
  size_t offset = 0;
};
struct DeviceSide {
  DeviceRegion region;
  size_t offset = 0;
};

class PyEvent {
 public:
  explicit PyEvent(SharedEvent e) : event_(std::move(e)) {}
  void Record(uintptr_t stream) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = event_.Record(reinterpret_cast<void*>(stream));
    }
    ThrowIfError(st);
  }
  void RecordAfter(uintptr_t cuda_event) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = event_.RecordAfter(reinterpret_cast<void*>(cuda_event));
    }
    ThrowIfError(st);
  }
  SharedEvent& event() { return event_; }

 private:
  SharedEvent event_;
};

class PyTransfer {
 public:
  PyTransfer(Transfer t, size_t nbytes) : t_(std::move(t)), nbytes_(nbytes) {}
  // Waits in slices so that Ctrl-C reaches Python while the GIL is released.
  void Wait(std::optional<double> timeout_s) {
    const auto deadline = timeout_s ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                         std::chrono::duration<double>(*timeout_s))
                                    : Clock::time_point::max();
    for (;;) {
      const auto now = Clock::now();
      const auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(100));
      Status st;
      {
        py::gil_scoped_release nogil;
        st = t_.Wait(std::chrono::duration_cast<std::chrono::microseconds>(std::max(slice, Clock::duration::zero())));
      }
      if (st.ok()) return;
      if (st.code() != Code::kTimeout) ThrowIfError(st);
      if (Clock::now() >= deadline) {
        ThrowIfError(Timeout("copy not done after " + std::to_string(*timeout_s) + " s (Transfer.wait's timeout)"));
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }
  bool Done() {
    Result<bool> r = t_.Poll();
    ThrowIfError(r.status());
    return *r;
  }
  void StreamWait(uintptr_t stream) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = t_.StreamWait(reinterpret_cast<void*>(stream));
    }
    ThrowIfError(st);
  }
  size_t nbytes() const { return nbytes_; }
  int64_t latency_ns() const { return t_.latency().count(); }
  Transfer& transfer() { return t_; }

 private:
  Transfer t_;
  size_t nbytes_;
};

// A Client and what the Python side needs beside it: which pool buffers and device buffers it
// handed out (to find the one under a tensor's address), and the events that carry `stream=`
// and a foreign `after=` event to ferryd GPU-side.
class PyClient {
 public:
  PyClient(std::optional<std::string> socket, std::optional<std::string> name, double timeout_s) {
    ConnectOptions o;
    if (socket) o.socket_path = *socket;
    if (name) o.name = *name;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    Result<std::unique_ptr<Client>> c = Status();
    {
      py::gil_scoped_release nogil;
      c = Client::Connect(o);
    }
    ThrowIfError(c.status());
    client_ = std::move(*c);
    socket_ = o.socket_path.empty() ? DefaultSocketPath() : o.socket_path;
  }

  void Close() {
    std::unique_ptr<Client> c;
    {
      std::lock_guard<std::mutex> l(mu_);
      c = std::move(client_);
      stream_event_.reset();
      relay_event_.reset();
    }
    py::gil_scoped_release nogil;
    c.reset();
  }
  bool closed() {
    std::lock_guard<std::mutex> l(mu_);
    return client_ == nullptr;
  }

  std::string backend() { return Get().backend() == BackendKind::kCuda ? "cuda" : "host"; }
  int device() { return Get().device_ordinal(); }
  uint64_t session_id() { return Get().session_id(); }
  const std::string& socket() const { return socket_; }

  py::dict Stats() {
    Result<DaemonStats> s = Status();
    {
      py::gil_scoped_release nogil;
      s = Get().Stats();
    }
    ThrowIfError(s.status());
    py::dict d;
    d["sessions"] = s->sessions;
    d["copies_completed"] = s->copies_completed;
    d["bytes_h2d"] = s->bytes_h2d;
    d["bytes_d2h"] = s->bytes_d2h;
    d["pool_bytes"] = s->pool_bytes;
    d["pool_free_bytes"] = s->pool_free_bytes;
    d["evictions"] = s->evictions;
    d["rejected"] = s->rejected;
    return d;
  }

  PoolBuffer AllocateHost(size_t nbytes) {
    Result<HostBuffer> b = Status();
    {
      py::gil_scoped_release nogil;
      b = Get().AllocateHost(std::max<size_t>(nbytes, 1));
    }
    ThrowIfError(b.status());
    auto shared = std::make_shared<HostBuffer>(std::move(*b));
    std::lock_guard<std::mutex> l(mu_);
    Prune(pool_);
    pool_[reinterpret_cast<uintptr_t>(shared->data())] = shared;
    return PoolBuffer{shared, nbytes};
  }

  DeviceBuffer AllocateDevice(size_t nbytes) {
    Result<DeviceAllocation> a = Status();
    {
      py::gil_scoped_release nogil;
      a = Get().AllocateDevice(std::max<size_t>(nbytes, 1));
    }
    ThrowIfError(a.status());
    auto shared = std::make_shared<DeviceAllocation>(std::move(*a));
    DeviceBuffer d{shared, nbytes, shared->host_visible() ? kDLCPU : kDLCUDA, Get().device_ordinal()};
    std::lock_guard<std::mutex> l(mu_);
    Prune(stand_ins_);
    if (shared->host_visible()) stand_ins_[reinterpret_cast<uintptr_t>(shared->data())] = shared;
    return d;
  }

  PyEvent CreateEvent() {
    Result<SharedEvent> e = Status();
    {
      py::gil_scoped_release nogil;
      e = Get().CreateEvent();
    }
    ThrowIfError(e.status());
    return PyEvent(std::move(*e));
  }

  // Copies nbytes from src to dst: one of them a pool buffer's memory, the other device memory
  // (cuda: any device pointer; host backend: an AllocateDevice stand-in). `after` orders the copy
  // after a ferry event; `after_cuda_event` after any CUDA event of this process; `stream`
  // (nonzero) after the stream's work so far, and the stream waits for the copy.
  PyTransfer Copy(uintptr_t dst, bool dst_cuda, uintptr_t src, bool src_cuda, size_t nbytes, bool latency,
                  bool stream_waitable, PyEvent* after, uintptr_t after_cuda_event, uintptr_t stream) {
    Plan p = Resolve(dst, dst_cuda, src, src_cuda, nbytes);
    Result<Transfer> t = Status();
    {
      py::gil_scoped_release nogil;
      CopyOptions o = Ordering(latency, stream_waitable, after, after_cuda_event, stream);
      t = Get().Copy(p.direction, *p.host.buffer, p.host.offset, p.device.region, p.device.offset, nbytes, o);
      if (t.ok() && stream != 0) {
        if (Status st = t->StreamWait(reinterpret_cast<void*>(stream)); !st.ok()) t = st;
      }
    }
    ThrowIfError(t.status());
    return PyTransfer(std::move(*t), nbytes);
  }

  // A block list between a pool tensor and a device tensor of dst_nbytes and src_nbytes bytes;
  // the index lists are uint32 arrays of `count` entries at src_index and dst_index.
  PyTransfer CopyBlocks(uintptr_t dst, bool dst_cuda, size_t dst_nbytes, uintptr_t src, bool src_cuda,
                        size_t src_nbytes, uintptr_t src_index, uintptr_t dst_index, size_t count, size_t block_bytes,
                        bool latency, bool stream_waitable, PyEvent* after, uintptr_t after_cuda_event,
                        uintptr_t stream) {
    const auto* src_blocks = reinterpret_cast<const uint32_t*>(src_index);
    const auto* dst_blocks = reinterpret_cast<const uint32_t*>(dst_index);
    // ferryd checks the indexes against the whole pool buffer and allocation; a tensor may be a
    // part of them, so they are checked against the tensors here first.
    if (block_bytes == 0) ThrowIfError(InvalidArgument("block_bytes must be positive"));
    for (size_t i = 0; i < count; ++i) {
      if ((uint64_t{src_blocks[i]} + 1) * block_bytes > src_nbytes) {
        ThrowIfError(InvalidArgument("src_blocks[" + std::to_string(i) + "] = " + std::to_string(src_blocks[i]) +
                                     ": block runs past the end of src (" + std::to_string(src_nbytes) + " bytes)"));
      }
      if ((uint64_t{dst_blocks[i]} + 1) * block_bytes > dst_nbytes) {
        ThrowIfError(InvalidArgument("dst_blocks[" + std::to_string(i) + "] = " + std::to_string(dst_blocks[i]) +
                                     ": block runs past the end of dst (" + std::to_string(dst_nbytes) + " bytes)"));
      }
    }
    Plan p = Resolve(dst, dst_cuda, dst_nbytes, src, src_cuda, src_nbytes);
    Result<Transfer> t = Status();
    {
      py::gil_scoped_release nogil;
      BlockList list{block_bytes, {src_blocks, count}, {dst_blocks, count}, {}};
      CopyOptions o = Ordering(latency, stream_waitable, after, after_cuda_event, stream);
      t = Get().CopyBlocks(p.direction, *p.host.buffer, p.host.offset, p.device.region, p.device.offset, list, o);
      if (t.ok() && stream != 0) {
        if (Status st = t->StreamWait(reinterpret_cast<void*>(stream)); !st.ok()) t = st;
      }
    }
    ThrowIfError(t.status());
    return PyTransfer(std::move(*t), count * block_bytes);
  }

  // Any host memory (pageable) to or from device memory through ferry's staging buffers. Blocks.
  void CopyStaged(uintptr_t dst, bool dst_cuda, uintptr_t src, bool src_cuda, size_t nbytes) {
    const bool to_device = IsDevice(dst, dst_cuda);
    const bool from_device = IsDevice(src, src_cuda);
    if (to_device == from_device) {
      ThrowIfError(InvalidArgument(to_device ? "copy_staged_: both tensors are device memory"
                                             : "copy_staged_: neither tensor is device memory (one must be on the GPU)"));
    }
    const uintptr_t device_ptr = to_device ? dst : src;
    void* host = reinterpret_cast<void*>(to_device ? src : dst);
    DeviceSide d = DeviceAt(device_ptr, nbytes);
    Status st;
    {
      py::gil_scoped_release nogil;
      st = Get().CopyStaged(to_device ? Direction::kHostToDevice : Direction::kDeviceToHost, host, d.region, d.offset,
                            nbytes);
    }
    ThrowIfError(st);
  }

  void StreamWait(std::vector<PyTransfer*> transfers, uintptr_t stream) {
    std::vector<Transfer> batch;
    batch.reserve(transfers.size());
    for (PyTransfer* t : transfers) batch.push_back(t->transfer());
    Status st;
    {
      py::gil_scoped_release nogil;
      st = Get().StreamWait(batch, reinterpret_cast<void*>(stream));
    }
    ThrowIfError(st);
  }

  void ForgetDeviceMemory() {
    py::gil_scoped_release nogil;
    Get().ForgetDeviceAllocations();
  }

  // The C++ round trip the Python path is compared with: `iterations` copies of nbytes (latency
  // class, or bulk)
  // between the same two buffers, each submitted and waited for by libferry alone. Nanoseconds.
  std::vector<int64_t> TimeRoundTrips(uintptr_t dst, bool dst_cuda, uintptr_t src, bool src_cuda, size_t nbytes,
                                      int iterations, bool latency) {
    Plan p = Resolve(dst, dst_cuda, src, src_cuda, nbytes);
    std::vector<int64_t> ns;
    ns.reserve(static_cast<size_t>(std::max(iterations, 0)));
    Status st;
    {
      py::gil_scoped_release nogil;
      Client& c = Get();
      for (int i = 0; i < iterations && st.ok(); ++i) {
        const auto t0 = Clock::now();
        Result<Transfer> t = c.Copy(p.direction, *p.host.buffer, p.host.offset, p.device.region, p.device.offset,
                                    nbytes, {.priority = latency ? Priority::kLatency : Priority::kBulk});
        st = t.ok() ? t->Wait(std::chrono::seconds(10)) : t.status();
        ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
      }
    }
    ThrowIfError(st);
    return ns;
  }

 private:
  struct Plan {
    Direction direction{};
    HostSide host;
    DeviceSide device;
  };

  Client& Get() {
    if (client_ == nullptr) ThrowIfError(Aborted("this ferry.Client is closed"));
    return *client_;
  }

  template <typename Map>
  static void Prune(Map& m) {
    if (m.size() < 64) return;
    std::erase_if(m, [](const auto& kv) { return kv.second.expired(); });
  }

  // The pool buffer holding [p, p + nbytes), if any.
  std::optional<HostSide> PoolAt(uintptr_t p, size_t nbytes) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = pool_.upper_bound(p);
    if (it == pool_.begin()) return std::nullopt;
    --it;
    std::shared_ptr<HostBuffer> b = it->second.lock();
    if (!b || p - it->first >= std::max<size_t>(b->size(), 1)) return std::nullopt;
    if (nbytes > b->size() - (p - it->first)) {
      ThrowIfError(InvalidArgument("the tensor runs past the end of its pool buffer"));
    }
    return HostSide{std::move(b), p - it->first};
  }

  bool IsStandIn(uintptr_t p) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = stand_ins_.upper_bound(p);
    if (it == stand_ins_.begin()) return false;
    --it;
    std::shared_ptr<DeviceAllocation> a = it->second.lock();
    return a && p - it->first < a->size();
  }

  bool IsDevice(uintptr_t p, bool cuda) { return cuda || IsStandIn(p); }

  DeviceSide DeviceAt(uintptr_t p, size_t nbytes) {
    size_t offset = 0;
    Result<DeviceRegion> r = Status();
    {
      py::gil_scoped_release nogil;
      r = Get().RegisterDeviceAllocation(reinterpret_cast<const void*>(p), nbytes, &offset);
    }
    if (!r.ok()) ThrowIfError(ExplainDeviceError(r.status()));
    return DeviceSide{std::move(*r), offset};
  }

  Status ExplainDeviceError(const Status& st) {
    if (Get().backend() == BackendKind::kHost) {
      return Status(st.code(), st.message() +
                                   " (ferryd runs the host backend: device tensors there come from "
                                   "client.empty_device())");
    }
    if (st.message().find("cudaIpcGetMemHandle") != std::string::npos) {
      return Status(Code::kNotSupported,
                    st.message() +
                        ": this memory has no CUDA IPC handle, so ferryd cannot reach it. PyTorch's "
                        "expandable_segments allocator maps memory that way: run with "
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False, or allocate the tensor with "
                        "client.empty_device()");
    }
    return st;
  }

  Plan Resolve(uintptr_t dst, bool dst_cuda, uintptr_t src, bool src_cuda, size_t nbytes) {
    return Resolve(dst, dst_cuda, nbytes, src, src_cuda, nbytes);
  }
  Plan Resolve(uintptr_t dst, bool dst_cuda, size_t dst_nbytes, uintptr_t src, bool src_cuda, size_t src_nbytes) {
    std::optional<HostSide> dst_pool = dst_cuda ? std::nullopt : PoolAt(dst, dst_nbytes);
    std::optional<HostSide> src_pool = src_cuda ? std::nullopt : PoolAt(src, src_nbytes);
    const bool dst_device = !dst_pool && IsDevice(dst, dst_cuda);
    const bool src_device = !src_pool && IsDevice(src, src_cuda);
    if (src_pool && dst_device) return Plan{Direction::kHostToDevice, std::move(*src_pool), DeviceAt(dst, dst_nbytes)};
    if (src_device && dst_pool) return Plan{Direction::kDeviceToHost, std::move(*dst_pool), DeviceAt(src, src_nbytes)};
    throw FerryError(InvalidArgument(WhyNoPlan(dst_pool.has_value(), dst_device, src_pool.has_value(), src_device)));
  }

  static std::string WhyNoPlan(bool dst_pool, bool dst_device, bool src_pool, bool src_device) {
    if (dst_pool && src_pool) return "both tensors are in ferry's pool: copy_ moves between the pool and the GPU";
    if (dst_device && src_device) return "both tensors are device memory: copy_ moves between ferry's pool and the GPU";
    const char* which = (!dst_pool && !dst_device) ? "dst" : "src";
    return std::string(which) +
           " is host memory outside ferry's pool: allocate it with client.empty() / client.empty_like(), or "
           "copy pageable memory with client.copy_staged_()";
  }

  // The copy's ordering; runs without the GIL.
  CopyOptions Ordering(bool latency, bool stream_waitable, PyEvent* after, uintptr_t after_cuda_event,
                       uintptr_t stream) {
    CopyOptions o;
    o.priority = latency ? Priority::kLatency : Priority::kBulk;
    o.stream_waitable = stream_waitable;
    if (after != nullptr) o.after = &after->event();
    if (after_cuda_event != 0) {
      SharedEvent& relay = InternalEvent(relay_event_);
      ThrowIfError(relay.RecordAfter(reinterpret_cast<void*>(after_cuda_event)));
      o.after = &relay;
    }
    if (stream != 0) {
      SharedEvent& mark = InternalEvent(stream_event_);
      ThrowIfError(mark.Record(reinterpret_cast<void*>(stream)));
      o.after = &mark;
      o.stream_waitable = true;
    }
    return o;
  }

  SharedEvent& InternalEvent(std::optional<SharedEvent>& slot) {
    std::lock_guard<std::mutex> l(mu_);
    if (!slot) {
      if (client_ == nullptr) throw FerryError(Aborted("this ferry.Client is closed"));
      Result<SharedEvent> e = client_->CreateEvent();
      if (!e.ok()) throw FerryError(e.status());
      slot.emplace(std::move(*e));
    }
    return *slot;
  }

  std::unique_ptr<Client> client_;
  std::string socket_;
  std::mutex mu_;  // guards pool_, stand_ins_, the internal events' creation and client_'s reset
  std::map<uintptr_t, std::weak_ptr<HostBuffer>> pool_;
  std::map<uintptr_t, std::weak_ptr<DeviceAllocation>> stand_ins_;
  std::optional<SharedEvent> stream_event_, relay_event_;
};

// A DLPack capsule of `nbytes` uint8 over memory that `keep` keeps alive.
py::capsule ToDlpack(std::shared_ptr<void> keep, void* data, size_t nbytes, int device_type, int device_id) {
  return MakeDlpackCapsule(std::move(keep), data, static_cast<int64_t>(nbytes), device_type, device_id);
}

}  // namespace
}  // namespace ferry::python

PYBIND11_MODULE(_ferry, m) {
  using namespace ferry;
  using namespace ferry::python;
  m.doc() = "ferry's extension module: libferry's client API in addresses and sizes (use the ferry package)";
  RegisterErrorTranslator();
  m.attr("__version__") = kVersionString;
  m.attr("built_with_cuda") = kBuiltWithCuda;
  m.def("default_socket", &DefaultSocketPath, "The control socket used when none is given.");

  py::class_<PoolBuffer>(m, "PoolBuffer", py::buffer_protocol(), "A buffer of ferryd's pinned pool, mapped here.")
      .def_property_readonly("ptr", [](const PoolBuffer& b) { return reinterpret_cast<uintptr_t>(b.buffer->data()); })
      .def_readonly("nbytes", &PoolBuffer::nbytes)
      .def("dlpack", [](const PoolBuffer& b) {
        return ToDlpack(b.buffer, b.buffer->data(), b.nbytes, kDLCPU, 0);
      }, "A DLPack capsule (uint8, nbytes) over the buffer that keeps it alive.")
      .def_buffer([](PoolBuffer& b) {
        return py::buffer_info(b.buffer->data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.nbytes)}, {1});
      });

  py::class_<DeviceBuffer>(m, "DeviceBuffer", "Device memory allocated by libferry (cudaMalloc, or the host backend's stand-in).")
      .def_property_readonly("ptr", [](const DeviceBuffer& b) { return reinterpret_cast<uintptr_t>(b.allocation->data()); })
      .def_readonly("nbytes", &DeviceBuffer::nbytes)
      .def_property_readonly("host_visible", [](const DeviceBuffer& b) { return b.allocation->host_visible(); })
      .def("dlpack", [](const DeviceBuffer& b) {
        return ToDlpack(b.allocation, b.allocation->data(), b.nbytes, b.device_type, b.device_id);
      }, "A DLPack capsule (uint8, nbytes) over the allocation that keeps it alive.");

  py::class_<PyEvent>(m, "Event", "An interprocess event shared with ferryd.")
      .def("record", &PyEvent::Record, py::arg("stream"), "Records the event on a CUDA stream (a cudaStream_t as int).")
      .def("record_after", &PyEvent::RecordAfter, py::arg("cuda_event"),
           "Records the event once another CUDA event (a cudaEvent_t as int) has happened, GPU-side.");

  py::class_<PyTransfer>(m, "Transfer", "One submitted copy.")
      .def("wait", &PyTransfer::Wait, py::arg("timeout") = py::none(), "Blocks until done (GIL released).")
      .def("done", &PyTransfer::Done, "True once done; raises the copy's error if it failed.")
      .def("stream_wait", &PyTransfer::StreamWait, py::arg("stream"), "Makes a CUDA stream wait for the copy on the GPU.")
      .def_property_readonly("nbytes", &PyTransfer::nbytes)
      .def_property_readonly("latency_ns", &PyTransfer::latency_ns);

  py::class_<PyClient>(m, "Client", "A session with ferryd.")
      .def(py::init<std::optional<std::string>, std::optional<std::string>, double>(), py::arg("socket") = py::none(),
           py::arg("name") = py::none(), py::arg("timeout") = 5.0)
      .def("close", &PyClient::Close)
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("backend", &PyClient::backend)
      .def_property_readonly("device", &PyClient::device)
      .def_property_readonly("session_id", &PyClient::session_id)
      .def_property_readonly("socket", &PyClient::socket)
      .def("stats", &PyClient::Stats)
      .def("allocate_host", &PyClient::AllocateHost, py::arg("nbytes"))
      .def("allocate_device", &PyClient::AllocateDevice, py::arg("nbytes"))
      .def("create_event", &PyClient::CreateEvent)
      .def("copy", &PyClient::Copy, py::arg("dst"), py::arg("dst_cuda"), py::arg("src"), py::arg("src_cuda"),
           py::arg("nbytes"), py::arg("latency"), py::arg("stream_waitable"), py::arg("after").none(true),
           py::arg("after_cuda_event"), py::arg("stream"))
      .def("copy_blocks", &PyClient::CopyBlocks, py::arg("dst"), py::arg("dst_cuda"), py::arg("dst_nbytes"),
           py::arg("src"), py::arg("src_cuda"), py::arg("src_nbytes"), py::arg("src_index"), py::arg("dst_index"),
           py::arg("count"), py::arg("block_bytes"), py::arg("latency"), py::arg("stream_waitable"),
           py::arg("after").none(true),
           py::arg("after_cuda_event"), py::arg("stream"))
      .def("copy_staged", &PyClient::CopyStaged, py::arg("dst"), py::arg("dst_cuda"), py::arg("src"),
           py::arg("src_cuda"), py::arg("nbytes"))
      .def("stream_wait", &PyClient::StreamWait, py::arg("transfers"), py::arg("stream"))
      .def("forget_device_memory", &PyClient::ForgetDeviceMemory)
      .def("time_round_trips", &PyClient::TimeRoundTrips, py::arg("dst"), py::arg("dst_cuda"), py::arg("src"),
           py::arg("src_cuda"), py::arg("nbytes"), py::arg("iterations"), py::arg("latency") = true);
}
