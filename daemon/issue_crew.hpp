// Threads that make the driver calls of one job side by side with the thread that asks: the
// engines take a list of small host-to-device copies faster than one thread can issue them (the
// driver writes each such copy's bytes into its command buffer on the calling thread; see
// IssueInParts in cuda_backend.cc).
#pragma once

#include <sched.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::daemon {

// Run(parts, part) calls part(0) on the caller's thread and part(1) .. part(parts - 1) on helper
// threads at once, and returns when every call has returned, with the first error by part
// index. Helper h runs part h (1 <= h < threads()); parts past the helpers' (more parts than
// threads, or fewer threads than asked where the system gives fewer) are called on the caller's
// thread after part 0. A part that throws fails with Internal. Helpers start on the first Run
// that needs them, allowed the CPUs the crew was given, or else those the constructing thread was
// (the event loop may be pinned to one CPU when it asks). At most one Run at a time (the event
// loop's thread); the destructor stops and joins the helpers.
class IssueCrew {
 public:
  static constexpr const char* kThreadName = "ferry-issue";  // the helpers' (ps -L, top -H)

  // `threads` counts the caller's: 1 runs every part on the caller's thread. `helper_cpus`: where
  // the helpers may run (PlaceCrew); empty: where the constructing thread may.
  explicit IssueCrew(uint32_t threads, const std::vector<int>& helper_cpus = {});
  ~IssueCrew();
  IssueCrew(const IssueCrew&) = delete;
  IssueCrew& operator=(const IssueCrew&) = delete;

  uint32_t threads() const { return threads_; }
  // parts: at least 1 (0 counts as 1).
  Status Run(uint32_t parts, const std::function<Status(uint32_t part)>& part);

 private:
  void StartHelpers();
  void Work(uint32_t part);

  const uint32_t threads_;
  cpu_set_t cpus_;  // the helpers'
  bool has_cpus_ = false;
  bool started_ = false;
  std::mutex mu_;
  std::condition_variable wake_;  // helpers: a job came, or stop
  std::condition_variable done_;  // the caller: the helpers' parts returned
  uint64_t job_number_ = 0;       // guarded by mu_, as the four below
  uint32_t parts_ = 0;
  uint32_t helpers_left_ = 0;  // helpers' parts of this job still running
  const std::function<Status(uint32_t)>* job_ = nullptr;
  bool stop_ = false;
  std::vector<Status> results_;       // by part; each written by its part's thread alone
  std::vector<std::thread> helpers_;  // helpers_[i] runs part i + 1
};

// Where a GPU's crew runs. The driver reads each small copy's bytes on the thread that issues
// it, and the GPU's pool pages are on its NUMA node: the helpers go on the CPUs of `node_cpus`
// (the GPU's node) that ferryd may use (`allowed`, its affinity), or on all of `allowed` where
// the node has none of them or is not known (empty). The crew is no larger than those CPUs:
// more threads than CPUs only take turns, and the event loop waits for the last part.
struct CrewPlacement {
  uint32_t threads = 1;   // the caller's included
  std::vector<int> cpus;  // the helpers'; empty where `allowed` is (not known)
};
CrewPlacement PlaceCrew(uint32_t asked, const std::vector<int>& node_cpus, const std::vector<int>& allowed);

}  // namespace ferry::daemon
