// The staged path behind Client::CopyStaged: pageable host memory goes through pool buffers,
// client threads copying chunks into them (or out of them) while ferryd moves the chunks already
// staged. A Stager keeps its copy threads and pool buffers between copies, for one Client.
//
// Thread-safety: staged copies of one Stager take turns; Copy may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/wire.hpp"
#include "ferry/client.hpp"

namespace ferry::detail {

class ClientCore;

class Stager {
 public:
  ~Stager();

  // Copies `bytes` between `host` and `device` at `device_offset` (a range the caller checked),
  // submitting the chunks through `client` on `core`'s session. Blocks until every byte arrived.
  Status Copy(Client& client, ClientCore& core, Direction direction, void* host, const DeviceRegion& device,
              size_t device_offset, size_t bytes, const StagedCopyOptions& options);

 private:
  // Staged copies of one client take turns; the helpers below are called by the turn's holder.
  std::unique_lock<std::mutex> Exclusive() { return std::unique_lock<std::mutex>(turn_mu_); }

  // Runs `task` on `n` threads, the caller being one of them (the others are started on first
  // need and kept), and returns when all are done. Workers spin a little before they sleep, so
  // back-to-back staged copies do not pay a wake-up for each of them (on the H200's host a
  // futex wake costs tens of microseconds, and the workers' wake-ups came one after another).
  void RunOnThreads(int n, const std::function<void()>& task);

  // Up to `count` pool buffers of at least `bytes`: kept ones first, then new ones while the
  // pool gives them. An error only when not even one could be had.
  Result<std::vector<HostBuffer>> TakeBuffers(Client& c, size_t bytes, size_t count);
  void KeepBuffers(std::vector<HostBuffer> buffers);

  void Work(uint64_t seen);

  static constexpr uint64_t kSpinNs = 200'000;
  std::mutex turn_mu_;
  std::vector<HostBuffer> kept_;  // guarded by turn_mu_
  std::mutex mu_;                 // guards the fields below
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> threads_;
  const std::function<void()>* task_ = nullptr;
  int tickets_ = 0;                      // workers still to join this run (guarded by mu_)
  std::atomic<int> running_{0};          // workers of this run not yet done
  std::atomic<uint64_t> generation_{0};  // one more each run; spun on, so atomic
  std::atomic<bool> stop_{false};
};

}  // namespace ferry::detail
