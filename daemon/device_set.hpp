// The GPUs one ferryd drives, behind one Backend. Each GPU has a backend of its own (its CUDA
// context, copy streams, lanes and IPC mappings; on the host backend, a simulated GPU); a plan
// runs on the backend of its GPU (CopyPlan::gpu), a session's device memory and events are
// opened by the backend of the GPU the session named. What is node-wide goes to the first GPU's
// backend: pinning the pool and the sessions' flag areas (a portable registration, which every
// GPU's context sees).
//
// Fences: a GPU's fence f is f * kMaxGpus + gpu here, so fences of different GPUs never meet.
// Threading: as Backend (the event loop), except UnpinSlab/PinSlab (the pool's zeroer thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "daemon/backend.hpp"

namespace ferry::daemon {

class DeviceSet final : public Backend {
 public:
  // At least one GPU, at most kMaxGpus, all of one kind.
  static Result<std::unique_ptr<DeviceSet>> Create(std::vector<std::unique_ptr<Backend>> gpus);

  uint32_t gpu_count() const { return static_cast<uint32_t>(gpus_.size()); }
  Backend& gpu(uint32_t i) { return *gpus_[i]; }
  const DeviceInfo& info(uint32_t i) const { return infos_[i]; }
  // The GPU a session names (kUseGpu): by UUID on cuda, by simulated ordinal on the host
  // backend. NotFound, naming the GPUs served, when it is none of them.
  Result<uint32_t> Find(const wire::UseGpuRequest& req) const;
  Result<std::unique_ptr<DeviceRegion>> OpenDeviceRegionOn(uint32_t gpu, const wire::RegisterDeviceRequest& req,
                                                           UniqueFd fd);
  Result<std::unique_ptr<SharedEvent>> OpenEventOn(uint32_t gpu, const wire::RegisterEventRequest& req);
  std::string GpuList() const;  // "GPU-... (0), GPU-... (1)" for messages

  // Backend: a single-GPU view where one is asked for (the first GPU), the rest routed.
  wire::BackendKind kind() const override { return gpus_[0]->kind(); }
  std::string Describe() const override;
  DeviceInfo device_info() const override { return infos_[0]; }
  int device_ordinal() const override { return gpus_[0]->device_ordinal(); }
  uint32_t streams_per_direction() const override { return streams_; }
  Status RegisterPool(std::byte* base, size_t length, size_t slab_bytes, bool slab_by_slab) override {
    return gpus_[0]->RegisterPool(base, length, slab_bytes, slab_by_slab);
  }
  bool pins_pool() const override { return gpus_[0]->pins_pool(); }
  bool pieces_stay_in_one_slab() const override { return gpus_[0]->pieces_stay_in_one_slab(); }
  Status UnpinSlab(std::byte* slab, size_t bytes) override { return gpus_[0]->UnpinSlab(slab, bytes); }
  Status PinSlab(std::byte* slab, size_t bytes) override { return gpus_[0]->PinSlab(slab, bytes); }
  Result<std::unique_ptr<DeviceRegion>> OpenDeviceRegion(const wire::RegisterDeviceRequest& req, UniqueFd fd) override {
    return OpenDeviceRegionOn(0, req, std::move(fd));
  }
  Result<std::unique_ptr<SharedEvent>> OpenEvent(const wire::RegisterEventRequest& req) override {
    return OpenEventOn(0, req);
  }
  Result<bool> EventHappened(SharedEvent& event) override;
  bool waits_on_flags() const override { return waits_on_flags_; }
  bool writes_done_words() const override { return writes_done_words_; }
  // Every GPU's lanes and done words need the flag area: the first GPU's backend registers it,
  // the others look up where their engines see it (and the first unregisters it, last).
  Status RegisterFlags(std::byte* flags, size_t bytes) override {
    for (size_t g = 0; g < gpus_.size(); ++g) {
      if (Status st = gpus_[g]->RegisterFlags(flags, bytes); !st.ok()) {
        while (g-- > 0) gpus_[g]->UnregisterFlags(flags);
        return st;
      }
    }
    return Status::Ok();
  }
  void UnregisterFlags(std::byte* flags) override {
    for (size_t g = gpus_.size(); g-- > 0;) gpus_[g]->UnregisterFlags(flags);
  }
  Result<SharedDeviceFlags> ShareDeviceFlags(uint32_t gpu, uint64_t session_id, const uint32_t* host_flags) override {
    if (gpu >= gpus_.size()) return InvalidArgument("no GPU " + std::to_string(gpu));
    return gpus_[gpu]->ShareDeviceFlags(gpu, session_id, host_flags);
  }
  Status WriteDeviceFlag(uint32_t gpu, uint64_t session_id, uint32_t index, uint32_t value) override {
    if (gpu >= gpus_.size()) return InvalidArgument("no GPU " + std::to_string(gpu));
    return gpus_[gpu]->WriteDeviceFlag(gpu, session_id, index, value);
  }
  void CloseLanes(uint64_t session_id) override {
    for (auto& g : gpus_) g->CloseLanes(session_id);
  }
  Result<FenceId> Submit(const CopyPlan& plan) override;
  void Flush() override {
    for (auto& g : gpus_) g->Flush();
  }
  void PollCompleted(std::vector<FenceResult>& done) override;
  int completion_fd() const override { return completion_fd_; }

 private:
  explicit DeviceSet(std::vector<std::unique_ptr<Backend>> gpus);

  std::vector<std::unique_ptr<Backend>> gpus_;
  std::vector<DeviceInfo> infos_;
  uint32_t streams_ = 0;
  bool waits_on_flags_ = true;
  bool writes_done_words_ = true;
  UniqueFd epoll_;  // readable when any GPU's completion fd is; none when one GPU has no fd
  int completion_fd_ = -1;
  std::vector<FenceResult> polled_;
};

}  // namespace ferry::daemon
