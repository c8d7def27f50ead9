// The C API: handles wrap the C++ objects; errors are kept per thread for ferry_last_error().
#include "ferry/ferry.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status_macros.hpp"
#include "ferry/client.hpp"
#include "ferry/version.hpp"

struct ferry_client {
  std::unique_ptr<ferry::Client> c;
};
struct ferry_host_buffer {
  ferry::HostBuffer b;
};
struct ferry_device_region {
  std::optional<ferry::DeviceAllocation> owned;  // set by ferry_device_alloc
  ferry::DeviceRegion r;
};
struct ferry_transfer {
  ferry::Transfer t;
};

// ferry_status values are Status::Code values: Fail() passes codes through unchanged.
static_assert(FERRY_OK == static_cast<int>(ferry::Code::kOk));
static_assert(FERRY_INVALID_ARGUMENT == static_cast<int>(ferry::Code::kInvalidArgument));
static_assert(FERRY_NOT_FOUND == static_cast<int>(ferry::Code::kNotFound));
static_assert(FERRY_PERMISSION_DENIED == static_cast<int>(ferry::Code::kPermissionDenied));
static_assert(FERRY_RESOURCE_EXHAUSTED == static_cast<int>(ferry::Code::kResourceExhausted));
static_assert(FERRY_UNAVAILABLE == static_cast<int>(ferry::Code::kUnavailable));
static_assert(FERRY_TIMEOUT == static_cast<int>(ferry::Code::kTimeout));
static_assert(FERRY_PROTOCOL == static_cast<int>(ferry::Code::kProtocol));
static_assert(FERRY_DEVICE == static_cast<int>(ferry::Code::kDevice));
static_assert(FERRY_NOT_SUPPORTED == static_cast<int>(ferry::Code::kNotSupported));
static_assert(FERRY_INTERNAL == static_cast<int>(ferry::Code::kInternal));
static_assert(FERRY_ABORTED == static_cast<int>(ferry::Code::kAborted));

namespace {

thread_local std::string g_last_error;

// Where each versioned struct's first published layout ends (ferry_connect_options and
// ferry_copy_options: ferry 0.1; ferry_staged_copy_options: 0.2; tests/c_abi_v1.h has copies of
// those layouts). A caller's struct_size may not be smaller. Never change these.
constexpr size_t kConnectOptionsFirstSize = offsetof(ferry_connect_options, timeout_ms) + sizeof(uint32_t);
constexpr size_t kCopyOptionsFirstSize = offsetof(ferry_copy_options, stream_waitable) + sizeof(uint32_t);
constexpr size_t kStagedCopyOptionsFirstSize =
    offsetof(ferry_staged_copy_options, priority) + sizeof(ferry_priority);
// ferry_block_list: first published with ferry_copy_blocks, after 0.2.0.
constexpr size_t kBlockListFirstSize = offsetof(ferry_block_list, lengths) + sizeof(const uint32_t*);
// No options struct comes near this: a larger struct_size is garbage, not a newer header.
constexpr size_t kMaxStructSize = 4096;

// Reads a caller's versioned struct into `out`, which holds the defaults, by ferry.h's rule: from
// the first published size up; fields past the caller's struct_size keep their defaults; bytes past
// the ones this library knows must be zero (a newer header's options this library does not have).
template <typename T>
ferry::Status ReadVersioned(const T& in, size_t first_size, const char* name, T& out) {
  const size_t size = in.struct_size;
  if (size < first_size || size > kMaxStructSize) {
    return ferry::InvalidArgument(std::string(name) + ".struct_size is " + std::to_string(size) +
                                  (size < first_size ? ", below its first published size of " +
                                                           std::to_string(first_size) + " bytes"
                                                     : ", larger than any " + std::string(name)) +
                                  ": set it to sizeof(" + name + ")");
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(&in);
  if (std::any_of(bytes + std::min(size, sizeof(T)), bytes + size, [](unsigned char b) { return b != 0; })) {
    return ferry::NotSupported(std::string(name) + " of " + std::to_string(size) + " bytes (a newer ferry.h) sets " +
                               "options that this libferry (" + ferry::kVersionString + ", " +
                               std::to_string(sizeof(T)) + " bytes) does not have");
  }
  std::memcpy(&out, &in, std::min(size, sizeof(T)));
  return ferry::Status::Ok();
}

ferry::Direction FromC(ferry_direction d) {
  return d == FERRY_HOST_TO_DEVICE ? ferry::Direction::kHostToDevice : ferry::Direction::kDeviceToHost;
}
ferry::Priority FromC(ferry_priority p) {
  return p == FERRY_PRIORITY_LATENCY ? ferry::Priority::kLatency : ferry::Priority::kBulk;
}

ferry_status Fail(const ferry::Status& s) {
  g_last_error = s.ToString();
  return static_cast<ferry_status>(s.code());
}
ferry_status Done(const ferry::Status& s) {
  if (!s.ok()) return Fail(s);
  g_last_error.clear();
  return FERRY_OK;
}
bool Null(const void* p, const char* what) {
  if (p != nullptr) return false;
  g_last_error = std::string("InvalidArgument: ") + what + " is NULL";
  return true;
}

}  // namespace

extern "C" {

const char* ferry_last_error(void) { return g_last_error.c_str(); }
const char* ferry_version(void) { return ferry::kVersionString; }

ferry_status ferry_connect(const ferry_connect_options* options, ferry_client** out) {
  if (Null(out, "out")) return FERRY_INVALID_ARGUMENT;
  ferry::ConnectOptions o;
  if (options != nullptr) {
    ferry_connect_options in{};
    if (auto st = ReadVersioned(*options, kConnectOptionsFirstSize, "ferry_connect_options", in); !st.ok()) {
      return Fail(st);
    }
    if (in.socket_path) o.socket_path = in.socket_path;
    if (in.name) o.name = in.name;
    if (in.timeout_ms) o.timeout = std::chrono::milliseconds(in.timeout_ms);
    if (in.use_device) {
      if (in.device < 0) return Fail(ferry::InvalidArgument("ferry_connect_options.device is negative"));
      o.device = in.device;
    }
  }
  auto c = ferry::Client::Connect(o);
  if (!c.ok()) return Fail(c.status());
  *out = std::make_unique<ferry_client>(ferry_client{std::move(*c)}).release();
  return Done(ferry::Status::Ok());
}

void ferry_disconnect(ferry_client* client) { std::unique_ptr<ferry_client> owned(client); }

int ferry_backend(const ferry_client* client) {
  return client && client->c->backend() == ferry::BackendKind::kCuda ? 1 : 0;
}

ferry_status ferry_host_alloc(ferry_client* client, size_t bytes, ferry_host_buffer** out) {
  if (Null(client, "client") || Null(out, "out")) return FERRY_INVALID_ARGUMENT;
  auto b = client->c->AllocateHost(bytes);
  if (!b.ok()) return Fail(b.status());
  *out = std::make_unique<ferry_host_buffer>(ferry_host_buffer{std::move(*b)}).release();
  return Done(ferry::Status::Ok());
}
void* ferry_host_data(const ferry_host_buffer* b) { return b ? b->b.data() : nullptr; }
size_t ferry_host_size(const ferry_host_buffer* b) { return b ? b->b.size() : 0; }
void ferry_host_free(ferry_host_buffer* b) { std::unique_ptr<ferry_host_buffer> owned(b); }

ferry_status ferry_device_register(ferry_client* client, void* ptr, size_t bytes, ferry_device_region** out) {
  if (Null(client, "client") || Null(out, "out")) return FERRY_INVALID_ARGUMENT;
  auto r = client->c->RegisterDevice(ptr, bytes);
  if (!r.ok()) return Fail(r.status());
  *out = std::make_unique<ferry_device_region>(ferry_device_region{std::nullopt, std::move(*r)}).release();
  return Done(ferry::Status::Ok());
}

ferry_status ferry_device_register_allocation(ferry_client* client, const void* ptr, size_t bytes,
                                              ferry_device_region** out, size_t* offset) {
  if (Null(client, "client") || Null(out, "out") || Null(offset, "offset")) return FERRY_INVALID_ARGUMENT;
  auto r = client->c->RegisterDeviceAllocation(ptr, bytes, offset);
  if (!r.ok()) return Fail(r.status());
  *out = std::make_unique<ferry_device_region>(ferry_device_region{std::nullopt, std::move(*r)}).release();
  return Done(ferry::Status::Ok());
}

ferry_status ferry_device_alloc(ferry_client* client, size_t bytes, ferry_device_region** out) {
  if (Null(client, "client") || Null(out, "out")) return FERRY_INVALID_ARGUMENT;
  auto a = client->c->AllocateDevice(bytes);
  if (!a.ok()) return Fail(a.status());
  auto r = client->c->RegisterDevice(a->data(), bytes);
  if (!r.ok()) return Fail(r.status());
  *out = std::make_unique<ferry_device_region>(ferry_device_region{std::move(*a), std::move(*r)}).release();
  return Done(ferry::Status::Ok());
}
void* ferry_device_data(const ferry_device_region* r) { return r ? r->r.data() : nullptr; }
// Members go in reverse order: the region is unregistered before its allocation is freed.
void ferry_device_unregister(ferry_device_region* r) { std::unique_ptr<ferry_device_region> owned(r); }

namespace {

// A copy's options from the caller's versioned struct (NULL: the defaults).
ferry::Result<ferry::CopyOptions> CopyOptionsFrom(const ferry_copy_options* options) {
  ferry::CopyOptions o;
  if (options == nullptr) return o;
  ferry_copy_options in{};
  FERRY_RETURN_IF_ERROR(ReadVersioned(*options, kCopyOptionsFirstSize, "ferry_copy_options", in));
  o.priority = FromC(in.priority);
  o.stream_waitable = in.stream_waitable != 0;
  return o;
}

// Hands a submitted copy to the caller as a ferry_transfer, or fails with its error.
ferry_status TransferOut(ferry::Result<ferry::Transfer> t, ferry_transfer** out) {
  if (!t.ok()) return Fail(t.status());
  *out = std::make_unique<ferry_transfer>(ferry_transfer{std::move(*t)}).release();
  return Done(ferry::Status::Ok());
}

}  // namespace

ferry_status ferry_copy(ferry_client* client, ferry_direction direction, ferry_host_buffer* host, size_t host_offset,
                        ferry_device_region* device, size_t device_offset, size_t bytes, const ferry_copy_options* options,
                        ferry_transfer** out) {
  if (Null(client, "client") || Null(host, "host") || Null(device, "device") || Null(out, "out")) {
    return FERRY_INVALID_ARGUMENT;
  }
  auto o = CopyOptionsFrom(options);
  if (!o.ok()) return Fail(o.status());
  return TransferOut(client->c->Copy(FromC(direction), host->b, host_offset, device->r, device_offset, bytes, *o), out);
}

ferry_status ferry_copy_blocks(ferry_client* client, ferry_direction direction, ferry_host_buffer* host,
                               size_t host_offset, ferry_device_region* device, size_t device_offset,
                               const ferry_block_list* blocks, const ferry_copy_options* options,
                               ferry_transfer** out) {
  if (Null(client, "client") || Null(host, "host") || Null(device, "device") || Null(blocks, "blocks") ||
      Null(out, "out")) {
    return FERRY_INVALID_ARGUMENT;
  }
  ferry_block_list in{};
  if (auto st = ReadVersioned(*blocks, kBlockListFirstSize, "ferry_block_list", in); !st.ok()) return Fail(st);
  if (in.count > 0 && (Null(in.src, "blocks->src") || Null(in.dst, "blocks->dst"))) return FERRY_INVALID_ARGUMENT;
  ferry::BlockList list;
  list.block_bytes = in.block_bytes;
  list.src = {in.src, in.count};
  list.dst = {in.dst, in.count};
  if (in.lengths != nullptr) list.lengths = {in.lengths, in.count};
  auto o = CopyOptionsFrom(options);
  if (!o.ok()) return Fail(o.status());
  return TransferOut(client->c->CopyBlocks(FromC(direction), host->b, host_offset, device->r, device_offset, list, *o),
                     out);
}

ferry_status ferry_copy_staged(ferry_client* client, ferry_direction direction, void* host, ferry_device_region* device,
                               size_t device_offset, size_t bytes, const ferry_staged_copy_options* options) {
  if (Null(client, "client") || Null(host, "host") || Null(device, "device")) return FERRY_INVALID_ARGUMENT;
  ferry::StagedCopyOptions o;
  if (options != nullptr) {
    ferry_staged_copy_options in{};
    if (auto st = ReadVersioned(*options, kStagedCopyOptionsFirstSize, "ferry_staged_copy_options", in); !st.ok()) {
      return Fail(st);
    }
    o.chunk_bytes = in.chunk_bytes;
    o.threads = static_cast<int>(std::min<uint32_t>(in.threads, INT_MAX));
    o.priority = FromC(in.priority);
  }
  return Done(client->c->CopyStaged(FromC(direction), host, device->r, device_offset, bytes, o));
}

ferry_status ferry_transfer_poll(ferry_transfer* t, int* done) {
  if (Null(t, "transfer") || Null(done, "done")) return FERRY_INVALID_ARGUMENT;
  auto r = t->t.Poll();
  if (!r.ok()) return Fail(r.status());
  *done = *r ? 1 : 0;
  return Done(ferry::Status::Ok());
}
ferry_status ferry_transfer_wait(ferry_transfer* t, uint64_t timeout_us) {
  if (Null(t, "transfer")) return FERRY_INVALID_ARGUMENT;
  return Done(t->t.Wait(std::chrono::microseconds(timeout_us)));
}
ferry_status ferry_transfer_stream_wait(ferry_transfer* t, void* stream) {
  if (Null(t, "transfer")) return FERRY_INVALID_ARGUMENT;
  return Done(t->t.StreamWait(stream));
}
ferry_status ferry_stream_wait_all(ferry_client* client, ferry_transfer* const* transfers, size_t count, void* stream) {
  if (Null(client, "client") || (count > 0 && Null(transfers, "transfers"))) return FERRY_INVALID_ARGUMENT;
  std::vector<ferry::Transfer> batch;
  batch.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    if (Null(transfers[i], "transfers[i]")) return FERRY_INVALID_ARGUMENT;
    batch.push_back(transfers[i]->t);
  }
  return Done(client->c->StreamWait(batch, stream));
}
void ferry_transfer_free(ferry_transfer* t) { std::unique_ptr<ferry_transfer> owned(t); }

}  // extern "C"
