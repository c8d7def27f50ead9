#include "python/src/py_client.hpp"

#include <algorithm>
#include <climits>
#include <functional>

namespace py = pybind11;

namespace ferry::python {
namespace {

// The nearest live entry at or below p, erasing expired ones on the way down (a freed buffer's
// address range is reused by the next mapping, so an expired entry may hide a live one).
template <typename T>
std::pair<uintptr_t, std::shared_ptr<T>> NearestLive(std::map<uintptr_t, std::weak_ptr<T>>& m, uintptr_t p) {
  auto it = m.upper_bound(p);
  while (it != m.begin()) {
    --it;
    if (std::shared_ptr<T> live = it->second.lock()) return {it->first, std::move(live)};
    it = m.erase(it);
  }
  return {0, nullptr};
}

template <typename Map>
void Prune(Map& m) {
  if (m.size() >= 64) std::erase_if(m, [](const auto& kv) { return kv.second.expired(); });
}

}  // namespace

PyClient::PyClient(std::optional<std::string> socket, std::optional<std::string> name,
                   std::optional<double> timeout_s, std::optional<int> device) {
  ConnectOptions o;
  if (device) {
    if (*device < 0) ThrowIfError(InvalidArgument("device must be a GPU ordinal (0 or more), not " + std::to_string(*device)));
    o.device = *device;
  }
  if (socket) o.socket_path = *socket;
  if (name) o.name = *name;
  const std::optional<Clock::duration> limit = TimeoutFromSeconds(timeout_s, "timeout");
  o.timeout = limit ? std::chrono::duration_cast<std::chrono::milliseconds>(*limit)
                    : std::chrono::milliseconds(INT_MAX / 2);
  o.timeout = std::min(o.timeout, std::chrono::milliseconds(INT_MAX / 2));
  Result<std::unique_ptr<Client>> c = Status();
  {
    py::gil_scoped_release nogil;
    c = Client::Connect(o);
  }
  ThrowIfError(c.status());
  client_ = SharedWithoutGil(std::move(*c));
  socket_ = o.socket_path.empty() ? DefaultSocketPath() : o.socket_path;
}

PyClient::~PyClient() { Close(); }

void PyClient::Close() {
  std::shared_ptr<Client> c;
  std::map<uintptr_t, std::shared_ptr<OrderingEvent>> streams;
  std::shared_ptr<OrderingEvent> relay;
  {
    std::lock_guard<std::mutex> l(mu_);
    c = std::move(client_);
    streams.swap(stream_events_);
    relay = std::move(relay_event_);
  }
  // The session ends when the last call still holding `c` returns (the deleter drops the GIL).
}

bool PyClient::closed() {
  std::lock_guard<std::mutex> l(mu_);
  return client_ == nullptr;
}

std::shared_ptr<Client> PyClient::Get() {
  std::lock_guard<std::mutex> l(mu_);
  if (client_ == nullptr) ThrowIfError(Aborted("this ferry.Client is closed"));
  return client_;
}

std::string PyClient::backend() { return Get()->backend() == BackendKind::kCuda ? "cuda" : "host"; }
int PyClient::device() { return Get()->device_ordinal(); }
std::string PyClient::gpu_uuid() { return Get()->gpu_uuid(); }
int PyClient::numa_node() { return Get()->numa_node(); }
uint64_t PyClient::session_id() { return Get()->session_id(); }

py::dict PyClient::Stats() {
  std::shared_ptr<Client> c = Get();
  Result<DaemonStats> s = Status();
  {
    py::gil_scoped_release nogil;
    s = c->Stats();
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

PoolBuffer PyClient::AllocateHost(size_t nbytes) {
  std::shared_ptr<Client> c = Get();
  Result<HostBuffer> b = Status();
  {
    py::gil_scoped_release nogil;
    b = c->AllocateHost(std::max<size_t>(nbytes, 1));
  }
  ThrowIfError(b.status());
  auto shared = SharedWithoutGil(std::make_unique<HostBuffer>(std::move(*b)));
  std::lock_guard<std::mutex> l(mu_);
  Prune(pool_);
  pool_[reinterpret_cast<uintptr_t>(shared->data())] = shared;
  return PoolBuffer{shared, nbytes};
}

DeviceBuffer PyClient::AllocateDevice(size_t nbytes) {
  std::shared_ptr<Client> c = Get();
  Result<DeviceAllocation> a = Status();
  {
    py::gil_scoped_release nogil;
    a = c->AllocateDevice(std::max<size_t>(nbytes, 1));
  }
  ThrowIfError(a.status());
  auto shared = SharedWithoutGil(std::make_unique<DeviceAllocation>(std::move(*a)));
  DeviceBuffer d{shared, nbytes, shared->host_visible() ? kDLCPU : kDLCUDA, c->device_ordinal()};
  if (shared->host_visible()) {
    std::lock_guard<std::mutex> l(mu_);
    Prune(stand_ins_);
    stand_ins_[reinterpret_cast<uintptr_t>(shared->data())] = shared;
  }
  return d;
}

PyEvent PyClient::CreateEvent() {
  std::shared_ptr<Client> c = Get();
  Result<SharedEvent> e = Status();
  {
    py::gil_scoped_release nogil;
    e = c->CreateEvent();
  }
  ThrowIfError(e.status());
  return PyEvent(std::move(*e));
}

std::optional<PyClient::HostSide> PyClient::PoolAt(uintptr_t p, size_t nbytes) {
  std::lock_guard<std::mutex> l(mu_);
  auto [base, b] = NearestLive(pool_, p);
  if (!b || p - base >= std::max<size_t>(b->size(), 1)) return std::nullopt;
  if (nbytes > b->size() - (p - base)) ThrowIfError(InvalidArgument("the tensor runs past the end of its pool buffer"));
  return HostSide{std::move(b), p - base};
}

bool PyClient::IsStandIn(uintptr_t p) {
  std::lock_guard<std::mutex> l(mu_);
  auto [base, a] = NearestLive(stand_ins_, p);
  return a && p - base < a->size();
}

PyClient::DeviceSide PyClient::DeviceAt(Client& c, uintptr_t p, size_t nbytes) {
  size_t offset = 0;
  Result<DeviceRegion> r = Status();
  {
    py::gil_scoped_release nogil;
    r = c.RegisterDeviceAllocation(reinterpret_cast<const void*>(p), nbytes, &offset);
  }
  if (!r.ok()) ThrowIfError(ExplainDeviceError(c, r.status()));
  return DeviceSide{std::move(*r), offset};
}

Status PyClient::ExplainDeviceError(Client& c, const Status& st) {
  if (c.backend() == BackendKind::kHost) {
    if (st.code() != Code::kInvalidArgument) return st;
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

PyClient::Plan PyClient::Resolve(Client& c, uintptr_t dst, bool dst_cuda, size_t dst_nbytes, uintptr_t src,
                                 bool src_cuda, size_t src_nbytes) {
  if (dst_nbytes == 0 || src_nbytes == 0) ThrowIfError(InvalidArgument("nothing to copy: a tensor is empty"));
  std::optional<HostSide> dst_pool = dst_cuda ? std::nullopt : PoolAt(dst, dst_nbytes);
  std::optional<HostSide> src_pool = src_cuda ? std::nullopt : PoolAt(src, src_nbytes);
  const bool dst_device = !dst_pool && IsDevice(dst, dst_cuda);
  const bool src_device = !src_pool && IsDevice(src, src_cuda);
  if (src_pool && dst_device) return Plan{Direction::kHostToDevice, std::move(*src_pool), DeviceAt(c, dst, dst_nbytes)};
  if (src_device && dst_pool) return Plan{Direction::kDeviceToHost, std::move(*dst_pool), DeviceAt(c, src, src_nbytes)};
  throw FerryError(InvalidArgument(WhyNoPlan(dst_pool.has_value(), dst_device, src_pool.has_value(), src_device)));
}

std::string PyClient::WhyNoPlan(bool dst_pool, bool dst_device, bool src_pool, bool src_device) {
  if (dst_pool && src_pool) return "both tensors are in ferry's pool: copy_ moves between the pool and the GPU";
  if (dst_device && src_device) return "both tensors are device memory: copy_ moves between ferry's pool and the GPU";
  const char* which = (!dst_pool && !dst_device) ? "dst" : "src";
  return std::string(which) +
         " is host memory outside ferry's pool: allocate it with client.empty() / client.empty_like(), or "
         "copy pageable memory with client.copy_staged_()";
}

std::shared_ptr<PyClient::OrderingEvent> PyClient::OrderingFor(uintptr_t after_cuda_event, uintptr_t stream) {
  if (stream == 0 && after_cuda_event == 0) return nullptr;
  std::lock_guard<std::mutex> l(mu_);
  if (stream == 0) {
    if (!relay_event_) relay_event_ = std::make_shared<OrderingEvent>();
    return relay_event_;
  }
  if (auto it = stream_events_.find(stream); it != stream_events_.end()) return it->second;
  if (stream_events_.size() >= kMaxStreamEvents) {
    std::erase_if(stream_events_, [](const auto& kv) { return kv.second.use_count() == 1; });
  }
  return stream_events_[stream] = std::make_shared<OrderingEvent>();
}

Result<Transfer> PyClient::SubmitOrdered(Client& c, bool latency, bool stream_waitable, PyEvent* after,
                                         uintptr_t after_cuda_event, uintptr_t stream, OrderingEvent* ordering,
                                         const std::function<Result<Transfer>(const CopyOptions&)>& submit) {
  CopyOptions o;
  o.priority = latency ? Priority::kLatency : Priority::kBulk;
  o.stream_waitable = stream_waitable || stream != 0;
  if (after != nullptr) o.after = &after->event();
  std::unique_lock<std::mutex> hold;
  if (ordering != nullptr) {
    hold = std::unique_lock<std::mutex>(ordering->mu);
    if (!ordering->event) {
      Result<SharedEvent> e = c.CreateEvent();
      if (!e.ok()) return e.status();
      ordering->event.emplace(std::move(*e));
    }
    const Status recorded = stream != 0 ? ordering->event->Record(reinterpret_cast<void*>(stream))
                                        : ordering->event->RecordAfter(reinterpret_cast<void*>(after_cuda_event));
    if (!recorded.ok()) return recorded;
    o.after = &*ordering->event;
  }
  Result<Transfer> t = submit(o);
  if (t.ok() && stream != 0) {
    if (Status st = t->StreamWait(reinterpret_cast<void*>(stream)); !st.ok()) return st;
  }
  return t;
}

PyTransfer PyClient::Copy(uintptr_t dst, bool dst_cuda, uintptr_t src, bool src_cuda, size_t nbytes, bool latency,
                          bool stream_waitable, PyEvent* after, uintptr_t after_cuda_event, uintptr_t stream) {
  std::shared_ptr<Client> c = Get();
  Plan p = Resolve(*c, dst, dst_cuda, nbytes, src, src_cuda, nbytes);
  std::shared_ptr<OrderingEvent> ordering = OrderingFor(after_cuda_event, stream);
  Result<Transfer> t = Status();
  {
    py::gil_scoped_release nogil;
    t = SubmitOrdered(*c, latency, stream_waitable, after, after_cuda_event, stream, ordering.get(),
                      [&](const CopyOptions& o) {
                        return c->Copy(p.direction, *p.host.buffer, p.host.offset, p.device.region, p.device.offset,
                                       nbytes, o);
                      });
  }
  ThrowIfError(t.status());
  return PyTransfer(std::move(*t), nbytes);
}

PyTransfer PyClient::CopyBlocks(uintptr_t dst, bool dst_cuda, size_t dst_nbytes, uintptr_t src, bool src_cuda,
                                size_t src_nbytes, uintptr_t src_index, uintptr_t dst_index, size_t count,
                                size_t block_bytes, bool latency, bool stream_waitable, PyEvent* after,
                                uintptr_t after_cuda_event, uintptr_t stream) {
  const auto* src_blocks = reinterpret_cast<const uint32_t*>(src_index);
  const auto* dst_blocks = reinterpret_cast<const uint32_t*>(dst_index);
  // ferryd checks the indexes against the whole pool buffer and allocation; a tensor may be a
  // part of them, so they are checked against the tensors here first (in blocks, not bytes: no
  // product to overflow).
  if (block_bytes == 0) ThrowIfError(InvalidArgument("block_bytes must be positive"));
  const uint64_t src_blocks_in = src_nbytes / block_bytes, dst_blocks_in = dst_nbytes / block_bytes;
  for (size_t i = 0; i < count; ++i) {
    if (src_blocks[i] >= src_blocks_in) {
      ThrowIfError(InvalidArgument("src_blocks[" + std::to_string(i) + "] = " + std::to_string(src_blocks[i]) +
                                   ": block runs past the end of src (" + std::to_string(src_nbytes) + " bytes)"));
    }
    if (dst_blocks[i] >= dst_blocks_in) {
      ThrowIfError(InvalidArgument("dst_blocks[" + std::to_string(i) + "] = " + std::to_string(dst_blocks[i]) +
                                   ": block runs past the end of dst (" + std::to_string(dst_nbytes) + " bytes)"));
    }
  }
  std::shared_ptr<Client> c = Get();
  Plan p = Resolve(*c, dst, dst_cuda, dst_nbytes, src, src_cuda, src_nbytes);
  std::shared_ptr<OrderingEvent> ordering = OrderingFor(after_cuda_event, stream);
  Result<Transfer> t = Status();
  {
    py::gil_scoped_release nogil;
    const BlockList list{block_bytes, {src_blocks, count}, {dst_blocks, count}, {}};
    t = SubmitOrdered(*c, latency, stream_waitable, after, after_cuda_event, stream, ordering.get(),
                      [&](const CopyOptions& o) {
                        return c->CopyBlocks(p.direction, *p.host.buffer, p.host.offset, p.device.region,
                                             p.device.offset, list, o);
                      });
  }
  ThrowIfError(t.status());
  return PyTransfer(std::move(*t), count * block_bytes);
}

void PyClient::CopyStaged(uintptr_t dst, bool dst_cuda, uintptr_t src, bool src_cuda, size_t nbytes) {
  if (nbytes == 0) ThrowIfError(InvalidArgument("nothing to copy: the tensors are empty"));
  const bool to_device = IsDevice(dst, dst_cuda);
  const bool from_device = IsDevice(src, src_cuda);
  if (to_device == from_device) {
    ThrowIfError(InvalidArgument(to_device ? "copy_staged_: both tensors are device memory"
                                           : "copy_staged_: neither tensor is device memory (one must be on the GPU)"));
  }
  std::shared_ptr<Client> c = Get();
  DeviceSide d = DeviceAt(*c, to_device ? dst : src, nbytes);
  void* host = reinterpret_cast<void*>(to_device ? src : dst);
  Status st;
  {
    py::gil_scoped_release nogil;
    st = c->CopyStaged(to_device ? Direction::kHostToDevice : Direction::kDeviceToHost, host, d.region, d.offset,
                       nbytes);
  }
  ThrowIfError(st);
}

void PyClient::StreamWait(std::vector<PyTransfer*> transfers, uintptr_t stream) {
  std::shared_ptr<Client> c = Get();
  std::vector<Transfer> batch;
  batch.reserve(transfers.size());
  for (PyTransfer* t : transfers) batch.push_back(t->transfer());
  Status st;
  {
    py::gil_scoped_release nogil;
    st = c->StreamWait(batch, reinterpret_cast<void*>(stream));
  }
  ThrowIfError(st);
}

void PyClient::ForgetDeviceMemory() {
  std::shared_ptr<Client> c = Get();
  py::gil_scoped_release nogil;
  c->ForgetDeviceAllocations();
}

std::vector<int64_t> PyClient::TimeRoundTrips(uintptr_t dst, bool dst_cuda, uintptr_t src, bool src_cuda,
                                              size_t nbytes, int iterations, bool latency) {
  std::shared_ptr<Client> c = Get();
  Plan p = Resolve(*c, dst, dst_cuda, nbytes, src, src_cuda, nbytes);
  std::vector<int64_t> ns;
  ns.reserve(static_cast<size_t>(std::max(iterations, 0)));
  Status st;
  {
    py::gil_scoped_release nogil;
    for (int i = 0; i < iterations && st.ok(); ++i) {
      const auto t0 = Clock::now();
      Result<Transfer> t = c->Copy(p.direction, *p.host.buffer, p.host.offset, p.device.region, p.device.offset,
                                   nbytes, {.priority = latency ? Priority::kLatency : Priority::kBulk});
      st = t.ok() ? t->Wait(std::chrono::seconds(10)) : t.status();
      ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    }
  }
  ThrowIfError(st);
  return ns;
}

}  // namespace ferry::python
