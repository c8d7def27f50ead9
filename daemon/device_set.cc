#include "daemon/device_set.hpp"

#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/gpu_uuid.hpp"

namespace ferry::daemon {
namespace {

// An event opened by one GPU's backend, and which one: the plan that signals it and the check
// whether it happened go to that backend, with the event it made.
class GpuEvent final : public SharedEvent {
 public:
  GpuEvent(uint32_t gpu, std::unique_ptr<SharedEvent> inner) : gpu_(gpu), inner_(std::move(inner)) {}
  uint32_t gpu() const { return gpu_; }
  SharedEvent& inner() { return *inner_; }

 private:
  uint32_t gpu_;
  std::unique_ptr<SharedEvent> inner_;
};

}  // namespace

DeviceSet::DeviceSet(std::vector<std::unique_ptr<Backend>> gpus) : gpus_(std::move(gpus)) {
  streams_ = gpus_[0]->streams_per_direction();
  for (auto& g : gpus_) {
    infos_.push_back(g->device_info());
    streams_ = std::min(streams_, g->streams_per_direction());
    waits_on_flags_ = waits_on_flags_ && g->waits_on_flags();
    writes_done_words_ = writes_done_words_ && g->writes_done_words();
  }
}

Result<std::unique_ptr<DeviceSet>> DeviceSet::Create(std::vector<std::unique_ptr<Backend>> gpus) {
  if (gpus.empty()) return InvalidArgument("no GPU to serve");
  if (gpus.size() > kMaxGpus) return InvalidArgument("at most " + std::to_string(kMaxGpus) + " GPUs per ferryd");
  for (auto& g : gpus) {
    if (g->kind() != gpus[0]->kind()) return InvalidArgument("GPUs of one ferryd run one backend");
  }
  auto set = std::unique_ptr<DeviceSet>(new DeviceSet(std::move(gpus)));
  if (set->gpus_.size() == 1) {
    set->completion_fd_ = set->gpus_[0]->completion_fd();
    return set;
  }
  const bool all_have_fds =
      std::all_of(set->gpus_.begin(), set->gpus_.end(), [](const auto& g) { return g->completion_fd() >= 0; });
  if (all_have_fds) {
    set->epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!set->epoll_.valid()) return ErrnoStatus("epoll_create1", errno);
    for (auto& g : set->gpus_) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      if (::epoll_ctl(set->epoll_.get(), EPOLL_CTL_ADD, g->completion_fd(), &ev) != 0) {
        return ErrnoStatus("epoll_ctl", errno);
      }
    }
    set->completion_fd_ = set->epoll_.get();
  }
  return set;
}

Result<uint32_t> DeviceSet::Find(const wire::UseGpuRequest& req) const {
  const bool by_uuid = std::any_of(std::begin(req.uuid), std::end(req.uuid), [](uint8_t b) { return b != 0; });
  if (kind() == wire::BackendKind::kCuda && by_uuid) {
    const std::string uuid = FormatGpuUuid(req.uuid);
    for (uint32_t i = 0; i < gpu_count(); ++i) {
      if (infos_[i].uuid == uuid) return i;
    }
    return NotFound("the client's GPU " + uuid + " is not one this ferryd serves (" + GpuList() +
                    "; its config's devices list them)");
  }
  if (kind() == wire::BackendKind::kCuda) {
    return InvalidArgument("the client named its GPU by ordinal only (" + std::to_string(req.ordinal) +
                           "): ferryd's cuda backend needs its UUID");
  }
  for (uint32_t i = 0; i < gpu_count(); ++i) {
    if (infos_[i].ordinal == req.ordinal) return i;
  }
  return NotFound("the client's GPU " + SimulatedGpuName(req.ordinal) + " is not one this ferryd serves (" +
                  GpuList() + ")");
}

std::string DeviceSet::GpuList() const {
  std::string s;
  for (const DeviceInfo& d : infos_) s += (s.empty() ? "" : ", ") + d.uuid;
  return s;
}

std::string DeviceSet::Describe() const {
  if (gpus_.size() == 1) return gpus_[0]->Describe();
  std::string s = std::to_string(gpus_.size()) + " GPUs:";
  for (uint32_t i = 0; i < gpu_count(); ++i) s += "\n  [" + std::to_string(i) + "] " + gpus_[i]->Describe();
  return s;
}

Result<std::unique_ptr<DeviceRegion>> DeviceSet::OpenDeviceRegionOn(uint32_t gpu, const wire::RegisterDeviceRequest& req,
                                                                  UniqueFd fd) {
  if (gpu >= gpu_count()) return Internal("no GPU " + std::to_string(gpu));
  return gpus_[gpu]->OpenDeviceRegion(req, std::move(fd));
}

Result<std::unique_ptr<SharedEvent>> DeviceSet::OpenEventOn(uint32_t gpu, const wire::RegisterEventRequest& req) {
  if (gpu >= gpu_count()) return Internal("no GPU " + std::to_string(gpu));
  auto e = gpus_[gpu]->OpenEvent(req);
  if (!e.ok()) return e.status();
  return std::unique_ptr<SharedEvent>(std::make_unique<GpuEvent>(gpu, std::move(*e)));
}

Result<bool> DeviceSet::EventHappened(SharedEvent& event) {
  auto& e = static_cast<GpuEvent&>(event);
  return gpus_[e.gpu()]->EventHappened(e.inner());
}

Result<FenceId> DeviceSet::Submit(const CopyPlan& plan) {
  if (plan.gpu >= gpu_count()) return Internal("a copy for GPU " + std::to_string(plan.gpu) + ", which ferryd does not drive");
  Backend& g = *gpus_[plan.gpu];
  Result<FenceId> fence = [&]() -> Result<FenceId> {
    if (plan.signal == nullptr) return g.Submit(plan);
    auto& e = static_cast<GpuEvent&>(*plan.signal);
    if (e.gpu() != plan.gpu) return InvalidArgument("the copy's event belongs to another GPU");
    CopyPlan routed = plan;
    routed.signal = &e.inner();
    return g.Submit(routed);
  }();
  if (!fence.ok()) return fence.status();
  return *fence * kMaxGpus + plan.gpu;
}

void DeviceSet::PollCompleted(std::vector<FenceResult>& done) {
  for (uint32_t i = 0; i < gpu_count(); ++i) {
    polled_.clear();
    gpus_[i]->PollCompleted(polled_);
    for (FenceResult& r : polled_) done.push_back({r.fence * kMaxGpus + i, std::move(r.status)});
  }
}

}  // namespace ferry::daemon
