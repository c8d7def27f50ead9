// The C API: handles wrap the C++ objects; errors are kept per thread for ferry_last_error().
#include "ferry/ferry.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

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

namespace {

thread_local std::string g_last_error;

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
    if (options->struct_size < sizeof(uint32_t)) return Fail(ferry::InvalidArgument("ferry_connect_options.struct_size unset"));
    if (options->socket_path) o.socket_path = options->socket_path;
    if (options->name) o.name = options->name;
    if (options->struct_size >= offsetof(ferry_connect_options, timeout_ms) + sizeof(uint32_t) && options->timeout_ms) {
      o.timeout = std::chrono::milliseconds(options->timeout_ms);
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

ferry_status ferry_copy(ferry_client* client, ferry_direction direction, ferry_host_buffer* host, size_t host_offset,
                        ferry_device_region* device, size_t device_offset, size_t bytes, const ferry_copy_options* options,
                        ferry_transfer** out) {
  if (Null(client, "client") || Null(host, "host") || Null(device, "device") || Null(out, "out")) {
    return FERRY_INVALID_ARGUMENT;
  }
  ferry::CopyOptions o;
  if (options != nullptr) {
    if (options->struct_size < sizeof(ferry_copy_options)) return Fail(ferry::InvalidArgument("ferry_copy_options.struct_size too small"));
    o.priority = options->priority == FERRY_PRIORITY_LATENCY ? ferry::Priority::kLatency : ferry::Priority::kBulk;
    o.stream_waitable = options->stream_waitable != 0;
  }
  auto t = client->c->Copy(direction == FERRY_HOST_TO_DEVICE ? ferry::Direction::kHostToDevice : ferry::Direction::kDeviceToHost,
                           host->b, host_offset, device->r, device_offset, bytes, o);
  if (!t.ok()) return Fail(t.status());
  *out = std::make_unique<ferry_transfer>(ferry_transfer{std::move(*t)}).release();
  return Done(ferry::Status::Ok());
}

ferry_status ferry_copy_staged(ferry_client* client, ferry_direction direction, void* host, ferry_device_region* device,
                               size_t device_offset, size_t bytes, size_t chunk_bytes, int threads) {
  if (Null(client, "client") || Null(host, "host") || Null(device, "device")) return FERRY_INVALID_ARGUMENT;
  return Done(client->c->CopyStaged(
      direction == FERRY_HOST_TO_DEVICE ? ferry::Direction::kHostToDevice : ferry::Direction::kDeviceToHost, host,
      device->r, device_offset, bytes, {.chunk_bytes = chunk_bytes, .threads = threads}));
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
