// The host backend's device: "device memory" is a sealed memfd this process maps and shares
// with ferryd; events are placeholders (there is no device work to order against), and an
// event's flag is written when it is recorded, there being no stream to wait for.
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <map>
#include <mutex>

#include "client/device_api.hpp"
#include "common/status_macros.hpp"

namespace ferry::detail {
namespace {

class HostClientDevice : public ClientDevice {
 public:
  explicit HostClientDevice(int ordinal) : ordinal_(ordinal) {}

  Result<wire::UseGpuRequest> Identify() override {
    wire::UseGpuRequest r{};
    r.ordinal = ordinal_;
    return r;
  }

  Result<std::shared_ptr<DeviceAllocationState>> Allocate(size_t bytes) override {
    if (bytes == 0) return InvalidArgument("device allocation of 0 bytes");
    // The name says which simulated GPU the memory is on: ferryd's host backend reads it as the
    // driver's answer to "where is this memory".
    FERRY_ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd("ferry-sim-gpu" + std::to_string(ordinal_), bytes));
    FERRY_ASSIGN_OR_RETURN(Mapping m, MapShared(fd.get(), bytes));
    auto s = std::make_shared<DeviceAllocationState>();
    s->ptr = m.data();
    s->size = bytes;
    s->host_visible = true;
    s->fd = std::move(fd);
    s->mapping = std::move(m);
    std::lock_guard<std::mutex> l(mu_);
    live_[reinterpret_cast<uintptr_t>(s->ptr)] = {s, ++allocations_};
    return s;
  }

  Result<AllocationInfo> AllocationOf(const void* ptr) override {
    std::lock_guard<std::mutex> l(mu_);
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    auto [it, s] = NearestLiveLocked(p);
    if (s && p - it->first < s->size) return AllocationInfo{it->first, s->size, it->second.id};
    return InvalidArgument("on the host backend, device memory must come from Client::AllocateDevice");
  }

  Result<ExportedMemory> Export(void* ptr, size_t bytes) override {
    std::lock_guard<std::mutex> l(mu_);
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    auto [it, s] = NearestLiveLocked(p);
    if (s && p - it->first <= s->size && bytes <= s->size - (p - it->first)) {
      ExportedMemory e;
      e.request.kind = static_cast<uint32_t>(wire::DeviceHandleKind::kHostMemfd);
      e.request.size = s->size;
      e.fd = s->fd.get();
      e.offset_in_base = p - it->first;
      return e;
    }
    return InvalidArgument("on the host backend, device memory must come from Client::AllocateDevice");
  }

  Result<DeviceEvent> CreateEvent() override {
    DeviceEvent e;
    e.request.kind = static_cast<uint32_t>(wire::EventHandleKind::kHost);
    return e;
  }
  void DestroyEvent(void*) override {}
  Status RecordEvent(void*, void*) override { return Status::Ok(); }
  Status StreamWaitEvent(void*, void*) override { return Status::Ok(); }
  Result<void*> CreateStream() override { return static_cast<void*>(nullptr); }
  void DestroyStream(void*) override {}
  bool StreamWaitIsHostWait() const override { return true; }
  Status MapFlags(void*, size_t) override { return Status::Ok(); }
  void UnmapFlags(void*) override {}
  Status WriteFlag(void*, uint32_t* flag, uint32_t value) override {
    std::atomic_ref<uint32_t>(*flag).store(value, std::memory_order_release);
    // ferryd's lane for a copy after this event may be asleep on the word (a shared futex).
    ::syscall(SYS_futex, flag, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    return Status::Ok();
  }

 private:
  int ordinal_;
  struct Live {
    std::weak_ptr<DeviceAllocationState> state;
    uint64_t id = 0;
  };
  // The nearest live allocation at or below p, erasing freed ones on the way down: a freed
  // allocation's addresses are reused by the next mapping, so its entry may hide a live one.
  std::pair<std::map<uintptr_t, Live>::iterator, std::shared_ptr<DeviceAllocationState>> NearestLiveLocked(uintptr_t p) {
    auto it = live_.upper_bound(p);
    while (it != live_.begin()) {
      --it;
      if (auto s = it->second.state.lock()) return {it, std::move(s)};
      it = live_.erase(it);
    }
    return {live_.end(), nullptr};
  }

  std::mutex mu_;
  std::map<uintptr_t, Live> live_;
  uint64_t allocations_ = 0;
};

}  // namespace

std::unique_ptr<ClientDevice> MakeHostClientDevice(int ordinal) { return std::make_unique<HostClientDevice>(ordinal); }

}  // namespace ferry::detail
