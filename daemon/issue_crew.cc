#include "daemon/issue_crew.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <exception>
#include <new>
#include <string>
#include <system_error>

#include "common/log.hpp"
#include "daemon/numa.hpp"

namespace ferry::daemon {
namespace {

// A part that throws fails its part, not the crew (a helper's exception would end ferryd). The
// last resort's message is short enough not to allocate: the exception may be bad_alloc.
Status CallPart(const std::function<Status(uint32_t)>& part, uint32_t p) {
  try {
    return part(p);
  } catch (const std::exception& e) {
    try {
      return Internal(std::string("an issue part threw: ") + e.what());
    } catch (...) {
    }
  } catch (...) {
  }
  return {Code::kInternal, "part threw"};
}

}  // namespace

IssueCrew::IssueCrew(uint32_t threads, const std::vector<int>& helper_cpus)
    : threads_(std::max<uint32_t>(threads, 1)), cpus_(CpuSetOf(helper_cpus)) {
  has_cpus_ = CPU_COUNT(&cpus_) > 0 || ::sched_getaffinity(0, sizeof cpus_, &cpus_) == 0;
  results_.reserve(threads_);  // Run assigns it without allocating
}

IssueCrew::~IssueCrew() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void IssueCrew::StartHelpers() {
  started_ = true;
  int unpinned = 0;
  try {
    helpers_.reserve(threads_ - 1);
    for (uint32_t part = 1; part < threads_; ++part) {
      helpers_.emplace_back([this, part] { Work(part); });
      pthread_setname_np(helpers_.back().native_handle(), kThreadName);
      // Not the asking thread's CPUs: the event loop may be pinned to one.
      if (has_cpus_ && pthread_setaffinity_np(helpers_.back().native_handle(), sizeof cpus_, &cpus_) != 0) ++unpinned;
    }
  } catch (const std::system_error&) {
    // out of threads: the caller runs the rest
  } catch (const std::bad_alloc&) {
  }
  if (helpers_.size() + 1 < threads_) {
    FERRY_LOG(kWarning) << "issue crew: " << helpers_.size() << " of " << threads_ - 1
                        << " helper threads started; the event loop issues the other parts itself";
  }
  if (unpinned > 0) {
    FERRY_LOG(kWarning) << "issue crew: " << unpinned
                        << " helper threads could not be given their CPUs and run where they started";
  }
}

Status IssueCrew::Run(uint32_t parts, const std::function<Status(uint32_t)>& part) {
  parts = std::max<uint32_t>(parts, 1);
  if (parts > 1 && !started_) StartHelpers();
  const uint32_t by_helpers = std::min<uint32_t>(parts - 1, static_cast<uint32_t>(helpers_.size()));
  results_.assign(parts, Status::Ok());
  if (by_helpers > 0) {
    {
      std::lock_guard lock(mu_);
      job_ = &part;
      parts_ = 1 + by_helpers;
      helpers_left_ = by_helpers;
      ++job_number_;
    }
    wake_.notify_all();
  }
  results_[0] = CallPart(part, 0);
  for (uint32_t p = 1 + by_helpers; p < parts; ++p) results_[p] = CallPart(part, p);
  if (by_helpers > 0) {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return helpers_left_ == 0; });
    job_ = nullptr;
  }
  for (Status& s : results_) {
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

CrewPlacement PlaceCrew(uint32_t asked, const std::vector<int>& node_cpus, const std::vector<int>& allowed) {
  CrewPlacement out;
  out.cpus = IntersectCpus(node_cpus, allowed);
  if (out.cpus.empty()) out.cpus = allowed;
  out.threads = std::max<uint32_t>(asked, 1);
  if (!out.cpus.empty()) out.threads = std::min(out.threads, static_cast<uint32_t>(out.cpus.size()));
  return out;
}

void IssueCrew::Work(uint32_t part) {
  uint64_t seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || job_number_ != seen; });
    if (stop_) return;
    seen = job_number_;
    if (part >= parts_) continue;
    const std::function<Status(uint32_t)>* job = job_;
    lock.unlock();
    Status result = CallPart(*job, part);
    lock.lock();
    results_[part] = std::move(result);
    if (--helpers_left_ == 0) done_.notify_one();
  }
}

}  // namespace ferry::daemon
