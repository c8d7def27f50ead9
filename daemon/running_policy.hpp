// The policy ferryd runs now: the one new copies are planned and dispatched under. Switched on
// the event-loop thread, which reads it without a lock; other threads (Server::policy) take a
// snapshot under the lock.
#pragma once

#include <memory>
#include <mutex>
#include <utility>

#include "policy/policy.hpp"

namespace ferry::daemon {

class RunningPolicy {
 public:
  explicit RunningPolicy(std::shared_ptr<const Policy> policy) : policy_(std::move(policy)) {}
  RunningPolicy(const RunningPolicy&) = delete;
  RunningPolicy& operator=(const RunningPolicy&) = delete;

  // Event-loop thread.
  const Policy& operator*() const { return *policy_; }
  const Policy* operator->() const { return policy_.get(); }
  const std::shared_ptr<const Policy>& shared() const { return policy_; }
  // Event-loop thread: makes `policy` the running one; returns the one it replaces.
  std::shared_ptr<const Policy> Switch(std::shared_ptr<const Policy> policy) {
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(policy_, std::move(policy));
  }

  // Any thread.
  std::shared_ptr<const Policy> Snapshot() const {
    std::lock_guard<std::mutex> l(mu_);
    return policy_;
  }

 private:
  mutable std::mutex mu_;  // guards policy_'s writes, and reads off the loop thread
  std::shared_ptr<const Policy> policy_;
};

}  // namespace ferry::daemon
