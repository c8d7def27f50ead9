// The policy ferryd runs now: the one new copies are planned and dispatched under. Switched on
// the event-loop thread, which reads it without a lock; other threads (Server::policy) take a
// snapshot under the lock. Each GPU's engines run the policy's override for that GPU, if it
// has one (Policy::gpu_overrides), resolved here once per switch.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "policy/policy.hpp"

namespace ferry::daemon {

// How a policy names a GPU: ferryd's device list's ordinal, and the GPU's UUID.
struct GpuName {
  int ordinal = 0;
  std::string uuid;
};

class RunningPolicy {
 public:
  explicit RunningPolicy(std::shared_ptr<const Policy> policy) : policy_(std::move(policy)) { Resolve(); }
  RunningPolicy(const RunningPolicy&) = delete;
  RunningPolicy& operator=(const RunningPolicy&) = delete;

  // Event-loop thread (or before the loop runs): the GPUs of ForGpu's indexes, in order.
  void SetGpus(std::vector<GpuName> gpus) {
    gpus_ = std::move(gpus);
    Resolve();
  }
  const std::vector<GpuName>& gpus() const { return gpus_; }

  // Event-loop thread.
  const Policy& operator*() const { return *policy_; }
  const Policy* operator->() const { return policy_.get(); }
  const std::shared_ptr<const Policy>& shared() const { return policy_; }
  // The policy GPU `gpu` (an index into SetGpus' list) runs: the node's, or its override.
  const std::shared_ptr<const Policy>& ForGpu(uint32_t gpu) const {
    return gpu < per_gpu_.size() ? per_gpu_[gpu] : policy_;
  }
  // Which override GPU `gpu` runs: an index into gpu_overrides, or -1 for none.
  int OverrideOf(uint32_t gpu) const {
    if (gpu >= per_gpu_.size()) return -1;
    for (size_t i = 0; i < policy_->gpu_overrides.size(); ++i) {
      if (policy_->gpu_overrides[i].policy == per_gpu_[gpu]) return static_cast<int>(i);
    }
    return -1;
  }
  // Event-loop thread: makes `policy` the running one; returns the one it replaces.
  std::shared_ptr<const Policy> Switch(std::shared_ptr<const Policy> policy) {
    std::shared_ptr<const Policy> old;
    {
      std::lock_guard<std::mutex> l(mu_);
      old = std::exchange(policy_, std::move(policy));
    }
    Resolve();
    return old;
  }

  // Any thread.
  std::shared_ptr<const Policy> Snapshot() const {
    std::lock_guard<std::mutex> l(mu_);
    return policy_;
  }

 private:
  void Resolve() {
    per_gpu_.clear();
    for (const GpuName& g : gpus_) per_gpu_.push_back(policy_->ForGpu(policy_, g.ordinal, g.uuid));
  }

  mutable std::mutex mu_;  // guards policy_'s writes, and reads off the loop thread
  std::shared_ptr<const Policy> policy_;
  std::vector<GpuName> gpus_;                           // event-loop thread
  std::vector<std::shared_ptr<const Policy>> per_gpu_;  // event-loop thread
};

}  // namespace ferry::daemon
