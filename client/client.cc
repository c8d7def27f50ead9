// The public C++ API of ferry/client.hpp: thin handles on the session core's states.
#include "ferry/client.hpp"

#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "client/block_list.hpp"
#include "client/client_core.hpp"
#include "client/stager.hpp"
#include "common/socket_path.hpp"
#include "common/status_macros.hpp"

namespace ferry {
namespace detail {

// What a Client owns beyond its session: the staged path's threads and buffers live exactly as
// long as the Client (the session may outlive it, held by Transfers).
struct ClientImpl {
  std::shared_ptr<ClientCore> core;
  std::mutex stager_mu;  // guards the creation of stager
  std::unique_ptr<Stager> stager;

  // RegisterDeviceAllocation's cache: allocation base -> its id and region.
  struct CachedAllocation {
    uint64_t id = 0;
    std::shared_ptr<DeviceRegionState> region;
  };
  static constexpr size_t kMaxCachedAllocations = 1024;  // beyond this, the cache starts over
  std::mutex allocations_mu;
  std::map<uintptr_t, CachedAllocation> allocations;
};

}  // namespace detail

std::string DefaultSocketPath() { return DefaultFerrydSocket(); }

HostBuffer::HostBuffer(std::shared_ptr<detail::HostBufferState> s) : s_(std::move(s)) {}
HostBuffer::HostBuffer(HostBuffer&&) noexcept = default;
HostBuffer& HostBuffer::operator=(HostBuffer&&) noexcept = default;
HostBuffer::~HostBuffer() = default;
std::byte* HostBuffer::data() const { return s_ ? s_->data : nullptr; }
size_t HostBuffer::size() const { return s_ ? s_->size : 0; }

DeviceRegion::DeviceRegion(std::shared_ptr<detail::DeviceRegionState> s) : s_(std::move(s)) {}
DeviceRegion::DeviceRegion(DeviceRegion&&) noexcept = default;
DeviceRegion& DeviceRegion::operator=(DeviceRegion&&) noexcept = default;
DeviceRegion::~DeviceRegion() = default;
void* DeviceRegion::data() const { return s_ ? s_->ptr : nullptr; }
size_t DeviceRegion::size() const { return s_ ? s_->size : 0; }

DeviceAllocation::DeviceAllocation(std::shared_ptr<detail::DeviceAllocationState> s) : s_(std::move(s)) {}
DeviceAllocation::DeviceAllocation(DeviceAllocation&&) noexcept = default;
DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&&) noexcept = default;
DeviceAllocation::~DeviceAllocation() = default;
void* DeviceAllocation::data() const { return s_ ? s_->ptr : nullptr; }
size_t DeviceAllocation::size() const { return s_ ? s_->size : 0; }
bool DeviceAllocation::host_visible() const { return s_ && s_->host_visible; }

SharedEvent::SharedEvent(std::shared_ptr<detail::EventState> s) : s_(std::move(s)) {}
SharedEvent::SharedEvent(SharedEvent&&) noexcept = default;
SharedEvent& SharedEvent::operator=(SharedEvent&&) noexcept = default;
SharedEvent::~SharedEvent() = default;
Status SharedEvent::Record(void* stream) {
  if (!s_) return InvalidArgument("empty SharedEvent");
  auto c = s_->core.lock();
  if (!c) return Unavailable("the client that made this event is gone");
  return c->RecordEvent(*s_, stream);
}

Status SharedEvent::RecordAfter(void* cuda_event) {
  if (!s_) return InvalidArgument("empty SharedEvent");
  if (cuda_event == nullptr) return InvalidArgument("RecordAfter: no CUDA event");
  auto c = s_->core.lock();
  if (!c) return Unavailable("the client that made this event is gone");
  return c->RecordEventAfter(*s_, cuda_event);
}

Transfer::Transfer(std::shared_ptr<detail::ClientCore> core, std::shared_ptr<detail::TransferState> s)
    : core_(std::move(core)), s_(std::move(s)) {}
Result<bool> Transfer::Poll() {
  if (!s_) return InvalidArgument("empty Transfer");
  return core_->Poll(*s_);
}
Status Transfer::Wait(std::chrono::microseconds timeout) {
  if (!s_) return InvalidArgument("empty Transfer");
  return core_->Wait(*s_, static_cast<uint64_t>(timeout.count()) * 1000, false);
}
Status Transfer::StreamWait(void* stream) {
  if (!s_) return InvalidArgument("empty Transfer");
  detail::TransferState* const one[] = {s_.get()};
  return core_->StreamWait(one, stream);
}
size_t Transfer::bytes() const { return s_ ? s_->bytes : 0; }
std::chrono::nanoseconds Transfer::latency() const {
  if (!s_ || s_->complete_ns == 0) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(s_->complete_ns - s_->submit_ns);
}

Client::Client(std::shared_ptr<detail::ClientCore> core) : impl_(std::make_unique<detail::ClientImpl>()) {
  impl_->core = std::move(core);
}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ConnectOptions& options) {
  auto core = std::make_shared<detail::ClientCore>();
  FERRY_RETURN_IF_ERROR(core->Connect(options));
  return std::unique_ptr<Client>(new Client(std::move(core)));
}

BackendKind Client::backend() const { return impl_->core->backend(); }
int Client::device_ordinal() const { return impl_->core->device_ordinal(); }
const std::string& Client::gpu_uuid() const { return impl_->core->gpu_uuid(); }
int Client::numa_node() const { return impl_->core->numa_node(); }
uint64_t Client::session_id() const { return impl_->core->session_id(); }

Status Client::StreamWait(std::span<Transfer> transfers, void* cuda_stream) {
  std::vector<detail::TransferState*> batch;
  batch.reserve(transfers.size());
  for (Transfer& t : transfers) {
    if (!t.s_) return InvalidArgument("empty Transfer");
    if (t.core_ != impl_->core) return InvalidArgument("StreamWait: a transfer of another client");
    batch.push_back(t.s_.get());
  }
  return impl_->core->StreamWait(batch, cuda_stream);
}

Result<HostBuffer> Client::AllocateHost(size_t bytes) {
  FERRY_ASSIGN_OR_RETURN(auto s, impl_->core->AllocateHost(bytes));
  return HostBuffer(std::move(s));
}

Result<DeviceAllocation> Client::AllocateDevice(size_t bytes) {
  FERRY_ASSIGN_OR_RETURN(auto s, impl_->core->device().Allocate(bytes));
  return DeviceAllocation(std::move(s));
}

Result<DeviceRegion> Client::RegisterDevice(void* ptr, size_t bytes) {
  FERRY_ASSIGN_OR_RETURN(auto s, impl_->core->Register(ptr, bytes));
  return DeviceRegion(std::move(s));
}

Result<DeviceRegion> Client::RegisterDeviceAllocation(const void* ptr, size_t bytes, size_t* offset) {
  FERRY_ASSIGN_OR_RETURN(detail::AllocationInfo a, impl_->core->device().AllocationOf(ptr));
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (bytes > a.size - (p - a.base)) {
    return InvalidArgument(std::to_string(bytes) + " bytes from this pointer run past the end of its allocation (" +
                           std::to_string(a.size - (p - a.base)) + " bytes left in it)");
  }
  *offset = p - a.base;
  std::lock_guard<std::mutex> l(impl_->allocations_mu);
  auto it = impl_->allocations.find(a.base);
  if (it != impl_->allocations.end() && it->second.id == a.id && it->second.region->size == a.size) {
    return DeviceRegion(it->second.region);
  }
  // A stale entry (freed, its address reused) or a new allocation: the entries it overlaps are
  // dropped, and so unregistered (a round trip each) before the registration below counts
  // against ferryd's region limit.
  auto first = impl_->allocations.lower_bound(a.base);
  if (first != impl_->allocations.begin()) {
    auto before = std::prev(first);
    if (before->first + before->second.region->size > a.base) first = before;
  }
  auto last = impl_->allocations.lower_bound(a.base + a.size);
  if (impl_->allocations.size() >= detail::ClientImpl::kMaxCachedAllocations) {
    first = impl_->allocations.begin();
    last = impl_->allocations.end();
  }
  impl_->allocations.erase(first, last);
  auto region = impl_->core->Register(reinterpret_cast<void*>(a.base), a.size);
  if (!region.ok() && region.status().code() == Code::kResourceExhausted && !impl_->allocations.empty()) {
    // ferryd's region limit: the cache may hold allocations freed since. Unregister them now
    // (regions a copy or caller still holds stay) and retry.
    impl_->allocations.clear();
    region = impl_->core->Register(reinterpret_cast<void*>(a.base), a.size);
  }
  FERRY_RETURN_IF_ERROR(region.status());
  impl_->allocations[a.base] = {a.id, *region};
  return DeviceRegion(std::move(*region));
}

void Client::ForgetDeviceAllocations() {
  std::map<uintptr_t, detail::ClientImpl::CachedAllocation> dropped;
  {
    std::lock_guard<std::mutex> l(impl_->allocations_mu);
    dropped.swap(impl_->allocations);
  }
  // Unregistering is a round trip each: outside the lock.
}

Result<SharedEvent> Client::CreateEvent() {
  FERRY_ASSIGN_OR_RETURN(auto s, impl_->core->NewEvent(true));
  return SharedEvent(std::move(s));
}

namespace {

// What a single copy and a block list share: both ends of this connection, and the entry's
// opcode, priority, regions and ordering.
Status CheckSameConnection(const detail::HostBufferState* host, const detail::DeviceRegionState* device,
                           const std::shared_ptr<detail::ClientCore>& core) {
  if (host == nullptr || device == nullptr) return InvalidArgument("empty HostBuffer or DeviceRegion");
  if (host->core.lock() != core || device->core.lock() != core) {
    return InvalidArgument("buffer or region belongs to another connection");
  }
  return Status::Ok();
}

wire::SubmissionEntry NewEntry(wire::Opcode opcode, const detail::HostBufferState& host, uint64_t host_offset,
                               uint64_t length, const detail::DeviceRegionState& device, uint64_t device_offset,
                               Priority priority, const detail::EventState* after) {
  wire::SubmissionEntry e{};
  e.opcode = static_cast<uint16_t>(opcode);
  e.priority = static_cast<uint16_t>(priority == Priority::kLatency ? wire::Priority::kLatency : wire::Priority::kBulk);
  e.pool_offset = host.pool_offset + host_offset;
  e.length = length;
  e.device_offset = device.offset_in_base + device_offset;
  e.region_id = device.id;
  if (after != nullptr) detail::OrderAfter(e, *after);
  return e;
}

}  // namespace

Result<Transfer> Client::Copy(Direction direction, const HostBuffer& host, size_t host_offset,
                              const DeviceRegion& device, size_t device_offset, size_t bytes,
                              const CopyOptions& options) {
  FERRY_RETURN_IF_ERROR(CheckSameConnection(host.s_.get(), device.s_.get(), impl_->core));
  if (bytes == 0) return InvalidArgument("copy of 0 bytes");
  if (host_offset > host.size() || bytes > host.size() - host_offset) {
    return InvalidArgument("host range [" + std::to_string(host_offset) + ", +" + std::to_string(bytes) +
                           ") runs past the buffer's " + std::to_string(host.size()) + " bytes");
  }
  if (device_offset > device.size() || bytes > device.size() - device_offset) {
    return InvalidArgument("device range [" + std::to_string(device_offset) + ", +" + std::to_string(bytes) +
                           ") runs past the region's " + std::to_string(device.size()) + " bytes");
  }
  if (options.after != nullptr && !options.after->s_) return InvalidArgument("empty SharedEvent");
  const wire::SubmissionEntry e = NewEntry(
      direction == Direction::kHostToDevice ? wire::Opcode::kHostToDevice : wire::Opcode::kDeviceToHost, *host.s_,
      host_offset, bytes, *device.s_, device_offset, options.priority,
      options.after != nullptr ? options.after->s_.get() : nullptr);
  auto t = std::make_shared<detail::TransferState>();
  t->bytes = bytes;
  t->direction = direction == Direction::kHostToDevice ? 0 : 1;
  t->host_keep = host.s_;
  t->region_keep = device.s_;
  t->watch_done_word = options.priority == Priority::kLatency && options.after == nullptr;
  FERRY_ASSIGN_OR_RETURN(auto st, impl_->core->Submit(e, std::move(t), options.stream_waitable));
  return Transfer(impl_->core, std::move(st));
}

Result<Transfer> Client::CopyBlocks(Direction direction, const HostBuffer& host, size_t host_offset,
                                    const DeviceRegion& device, size_t device_offset, const BlockList& blocks,
                                    const CopyOptions& options) {
  FERRY_RETURN_IF_ERROR(CheckSameConnection(host.s_.get(), device.s_.get(), impl_->core));
  if (host_offset > host.size()) {
    return InvalidArgument("host_offset " + std::to_string(host_offset) + " is past the buffer's " +
                           std::to_string(host.size()) + " bytes");
  }
  if (device_offset > device.size()) {
    return InvalidArgument("device_offset " + std::to_string(device_offset) + " is past the region's " +
                           std::to_string(device.size()) + " bytes");
  }
  if (options.after != nullptr && !options.after->s_) return InvalidArgument("empty SharedEvent");
  const bool h2d = direction == Direction::kHostToDevice;
  const uint64_t host_bytes = host.size() - host_offset;
  const uint64_t device_bytes = device.size() - device_offset;
  FERRY_ASSIGN_OR_RETURN(const uint64_t total,
                         h2d ? detail::CheckBlockList(blocks, host_bytes, "host", device_bytes, "device")
                             : detail::CheckBlockList(blocks, device_bytes, "device", host_bytes, "host"));
  detail::ClientCore& core = *impl_->core;
  wire::BlockListEntry list{};
  list.device_bytes = device_bytes;
  list.block_bytes = blocks.block_bytes;
  list.block_count = static_cast<uint32_t>(blocks.src.size());
  list.list_flags = blocks.lengths.empty() ? 0 : wire::kBlockListLengths;
  list.list_bytes = detail::EncodedBlockListBytes(blocks);
  wire::SubmissionEntry e =
      NewEntry(h2d ? wire::Opcode::kBlocksHostToDevice : wire::Opcode::kBlocksDeviceToHost, *host.s_, host_offset,
               host_bytes, *device.s_, device_offset, options.priority,
               options.after != nullptr ? options.after->s_.get() : nullptr);
  auto t = std::make_shared<detail::TransferState>();
  t->bytes = total;
  t->direction = h2d ? 0 : 1;
  t->host_keep = host.s_;
  t->region_keep = device.s_;
  // The group: the BlockListEntry, then the list itself when it fits in the ring (and the whole
  // group in at most half the ring, so that a list never waits for an empty ring).
  std::array<wire::SubmissionEntry, 1 + wire::kMaxInlineListSlots> group{};
  const uint32_t inline_slots = wire::InlineListSlots(list.list_bytes);
  size_t group_slots = 1;
  if (inline_slots <= wire::kMaxInlineListSlots && 2 + inline_slots <= core.sq_entries() / 2) {
    e.flags = wire::kBlockListInline;
    list.inline_slots = inline_slots;
    detail::EncodeBlockList(blocks, reinterpret_cast<std::byte*>(group.data()) + sizeof(wire::SubmissionEntry));
    group_slots += inline_slots;
  } else {
    FERRY_ASSIGN_OR_RETURN(t->list_keep, core.AcquireListBuffer(list.list_bytes));
    detail::EncodeBlockList(blocks, t->list_keep->data);
    list.list_pool_offset = t->list_keep->pool_offset;
  }
  static_assert(sizeof list == sizeof group[0]);
  std::memcpy(&group[0], &list, sizeof list);
  FERRY_ASSIGN_OR_RETURN(auto st, core.Submit(e, std::move(t), options.stream_waitable,
                                              std::span<const wire::SubmissionEntry>(group.data(), group_slots)));
  return Transfer(impl_->core, std::move(st));
}

Status Client::CopyStaged(Direction direction, void* host, const DeviceRegion& device, size_t device_offset,
                          size_t bytes, const StagedCopyOptions& options) {
  if (host == nullptr) return InvalidArgument("CopyStaged: host pointer is null");
  if (bytes == 0) return InvalidArgument("copy of 0 bytes");
  if (!device.s_) return InvalidArgument("empty DeviceRegion");
  if (device_offset > device.size() || bytes > device.size() - device_offset) {
    return InvalidArgument("device range [" + std::to_string(device_offset) + ", +" + std::to_string(bytes) +
                           ") is outside the region of " + std::to_string(device.size()) + " bytes");
  }
  detail::Stager* stager;
  {
    std::lock_guard<std::mutex> l(impl_->stager_mu);
    if (!impl_->stager) impl_->stager = std::make_unique<detail::Stager>();
    stager = impl_->stager.get();
  }
  return stager->Copy(*this, *impl_->core, direction, host, device, device_offset, bytes, options);
}

Result<DaemonStats> Client::Stats() {
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage m,
                         impl_->core->Call(wire::MsgType::kStats, wire::StatsRequest{}, wire::MsgType::kStatsReply));
  auto r = m.As<wire::StatsReply>();
  FERRY_RETURN_IF_ERROR(FromWire(r.status));
  return DaemonStats{r.sessions,   r.copies_completed, r.bytes_h2d, r.bytes_d2h,
                     r.pool_bytes, r.pool_free_bytes,  r.evictions, r.rejected};
}

}  // namespace ferry
