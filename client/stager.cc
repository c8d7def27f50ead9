// The staged path: the pipeline of one staged copy, and the threads and buffers kept for the next.
#include "client/stager.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <optional>

#include "client/client_core.hpp"
#include "client/spin_wait.hpp"
#include "client/streaming_copy.hpp"
#include "common/status_macros.hpp"

namespace ferry::detail {
namespace {

// The CPUs this process may run on (its affinity mask; cgroup CPU quotas are not counted).
uint32_t UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return std::max(1u, std::thread::hardware_concurrency());
  return static_cast<uint32_t>(std::max(1, CPU_COUNT(&set)));
}

// One staged copy, cut into chunks of `chunk` bytes and each chunk into slices of `slice`
// bytes. All threads work on the same chunk at once, taking its slices in order; chunk j lives
// in pool buffer slot j % slots. Host to device, the thread that stages a chunk's last slice
// submits its DMA, and the slot takes chunk j + slots once that DMA has landed. Device to host,
// chunk j + slots is submitted into the slot once the last slice of chunk j has been copied
// out. So the DMA starts after one chunk, not one chunk a thread, and ends one chunk after the
// host copies (with a chunk a thread, filling and draining cost a fifth of a 64 MiB copy).
//
// Thread-safety: the hand-offs are atomics that threads spin on briefly (a chunk's slices take
// tens of microseconds; a mutex the eight threads queue on at every chunk cost more than that on
// the H200's host). A slot's mutex only guards its Transfer: whoever holds it waits for the DMA.
class StagedPipeline {
 public:
  using Submit = std::function<Result<Transfer>(const HostBuffer&, uint64_t offset, uint64_t len)>;

  StagedPipeline(Direction direction, std::byte* host, uint64_t bytes, uint64_t chunk, uint64_t slice,
                 std::vector<HostBuffer> buffers, Submit submit)
      : direction_(direction),
        host_(host),
        bytes_(bytes),
        chunk_(chunk),
        slice_(slice),
        chunks_((bytes + chunk - 1) / chunk),
        slices_per_chunk_((chunk + slice - 1) / slice),
        slots_(buffers.size()),
        submit_(std::move(submit)) {
    const auto n = static_cast<int64_t>(slots_.size());
    for (int64_t k = 0; k < n; ++k) {
      Slot& s = slots_[k];
      s.buf = std::move(buffers[k]);
      // Before the first chunk, each slot acts as if the chunk `slots` before its first had
      // been sent and had landed: host to device, it is open for its first chunk.
      s.sent = k - n;
      s.landed = k - n;
      s.open = k;
      s.left = static_cast<uint64_t>(k) < chunks_ ? ChunkLen(k) : 0;
    }
  }

  uint64_t slices() const { return chunks_ * slices_per_chunk_; }

  // Device to host: the first chunks' DMAs go out before any thread starts.
  void Start() {
    if (direction_ != Direction::kDeviceToHost) return;
    for (size_t k = 0; k < slots_.size() && k < chunks_; ++k) {
      if (Status st = Send(slots_[k], k); !st.ok()) return Fail(st);
    }
  }

  // What each thread runs: takes slices until none are left or the copy has failed.
  void Work() {
    for (uint64_t g; !failed_.load(std::memory_order_relaxed) && (g = next_.fetch_add(1)) < slices();) {
      const uint64_t j = g / slices_per_chunk_;
      const uint64_t in_chunk = (g % slices_per_chunk_) * slice_;
      const uint64_t chunk_len = ChunkLen(j);
      if (in_chunk >= chunk_len) continue;  // the last chunk is short
      const uint64_t len = std::min(slice_, chunk_len - in_chunk);
      std::byte* host = host_ + j * chunk_ + in_chunk;
      Status st =
          direction_ == Direction::kHostToDevice ? StageIn(j, in_chunk, host, len) : StageOut(j, in_chunk, host, len);
      if (!st.ok()) return Fail(st);
    }
  }

  // After every thread has returned: waits for the DMAs still in flight (their buffers must
  // not be reused before) and hands the buffers back. The first error, if any.
  Status Finish(std::vector<HostBuffer>& buffers) {
    for (Slot& s : slots_) {
      std::lock_guard<std::mutex> l(s.mu);
      if (s.transfer) {
        Status st = s.transfer->Wait(std::chrono::seconds(60));
        if (!st.ok()) Fail(st);
      }
      buffers.push_back(std::move(*s.buf));
    }
    std::lock_guard<std::mutex> l(err_mu_);
    return first_error_;
  }

 private:
  struct Slot {
    std::atomic<int64_t> sent{0};      // the last chunk whose DMA was submitted from this slot
    std::atomic<int64_t> landed{0};    // the last chunk whose DMA is known to have landed
    std::atomic<int64_t> open{0};      // host to device: the chunk being staged into it
    std::atomic<uint64_t> left{0};     // bytes of the current chunk not yet staged in or copied out
    std::mutex mu;                     // guards transfer
    std::optional<Transfer> transfer;  // the DMA of chunk `sent`, until someone waited for it
    std::optional<HostBuffer> buf;     // always set until Finish
  };

  uint64_t ChunkLen(uint64_t j) const { return std::min(chunk_, bytes_ - j * chunk_); }

  Status Send(Slot& s, uint64_t j) {
    {
      std::lock_guard<std::mutex> l(s.mu);
      FERRY_ASSIGN_OR_RETURN(Transfer t, submit_(*s.buf, j * chunk_, ChunkLen(j)));
      s.transfer = std::move(t);
    }
    s.sent.store(static_cast<int64_t>(j), std::memory_order_release);
    return Status::Ok();
  }

  // Spins until `ready()`; whoever first finds `claimable()` and the slot's mutex free runs
  // `claim()` (which waits for a DMA) while the others keep spinning. After a short spin the
  // waiters yield, then nap: a DMA queued behind other clients' copies may take a while.
  template <typename Ready, typename Claimable, typename Claim>
  Status Await(Slot& s, Ready ready, Claimable claimable, Claim claim) {
    for (uint32_t spins = 0;; ++spins) {
      if (ready()) return Status::Ok();
      if (failed_.load(std::memory_order_relaxed)) return Status::Ok();  // Work() stops next
      if (claimable() && s.mu.try_lock()) {
        Status st;
        if (!ready()) st = claim();
        s.mu.unlock();
        return st;
      }
      if (spins < 2000) {
        CpuRelax();
      } else if (spins < 4000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  // Waits (holding the slot's mutex) for the DMA of chunk `sent`.
  static Status LandedLocked(Slot& s) {
    if (!s.transfer) return Status::Ok();
    Status st = s.transfer->Wait(std::chrono::seconds(60));
    s.transfer.reset();
    s.landed.store(s.sent.load(std::memory_order_acquire), std::memory_order_release);
    return st;
  }

  Status StageIn(uint64_t j, uint64_t in_chunk, std::byte* host, uint64_t len) {
    Slot& s = slots_[j % slots_.size()];
    const auto jj = static_cast<int64_t>(j), before = jj - static_cast<int64_t>(slots_.size());
    // The slot is open for chunk j once chunk j - slots, sent from it, has landed.
    FERRY_RETURN_IF_ERROR(Await(
        s, [&] { return s.open.load(std::memory_order_acquire) == jj; },
        [&] { return s.sent.load(std::memory_order_acquire) == before; },
        [&] {
          Status st = LandedLocked(s);
          s.left.store(ChunkLen(j), std::memory_order_relaxed);
          s.open.store(jj, std::memory_order_release);
          return st;
        }));
    if (failed_.load(std::memory_order_relaxed)) return Status::Ok();
    StagedCopyIn(s.buf->data() + in_chunk, host, len);
    if (s.left.fetch_sub(len, std::memory_order_acq_rel) == len) return Send(s, j);
    return Status::Ok();
  }

  Status StageOut(uint64_t j, uint64_t in_chunk, std::byte* host, uint64_t len) {
    Slot& s = slots_[j % slots_.size()];
    const auto jj = static_cast<int64_t>(j);
    FERRY_RETURN_IF_ERROR(Await(
        s, [&] { return s.landed.load(std::memory_order_acquire) == jj; },
        [&] { return s.sent.load(std::memory_order_acquire) == jj; }, [&] { return LandedLocked(s); }));
    if (failed_.load(std::memory_order_relaxed)) return Status::Ok();
    StagedCopyOut(host, s.buf->data() + in_chunk, len);
    if (s.left.fetch_sub(len, std::memory_order_acq_rel) == len) {
      const uint64_t next = j + slots_.size();
      if (next < chunks_ && !failed_.load(std::memory_order_relaxed)) {
        s.left.store(ChunkLen(next), std::memory_order_relaxed);  // published by Send's release
        return Send(s, next);
      }
    }
    return Status::Ok();
  }

  // Records the first error; the other threads see failed_ and stop.
  void Fail(const Status& st) {
    {
      std::lock_guard<std::mutex> l(err_mu_);
      if (first_error_.ok()) first_error_ = st;
    }
    failed_ = true;
  }

  const Direction direction_;
  std::byte* const host_;
  const uint64_t bytes_, chunk_, slice_, chunks_, slices_per_chunk_;
  std::vector<Slot> slots_;
  const Submit submit_;
  std::atomic<uint64_t> next_{0};
  std::atomic<bool> failed_{false};
  std::mutex err_mu_;
  Status first_error_;  // guarded by err_mu_
};

}  // namespace

Stager::~Stager() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Stager::RunOnThreads(int n, const std::function<void()>& task) {
  {
    std::lock_guard<std::mutex> l(mu_);
    // A new worker starts from the generation before this run's, so it takes part in it.
    const uint64_t before = generation_.load(std::memory_order_relaxed);
    while (static_cast<int>(threads_.size()) < n - 1) {
      threads_.emplace_back([this, before] {
        ::pthread_setname_np(::pthread_self(), "ferry-stage");  // for top -H and the tests
        Work(before);
      });
    }
    task_ = &task;
    running_.store(n - 1, std::memory_order_relaxed);
    tickets_ = n - 1;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  task();
  SpinFor(kSpinNs, [&] { return running_.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> l(mu_);
  done_cv_.wait(l, [&] { return running_.load(std::memory_order_acquire) == 0; });
  task_ = nullptr;
}

Result<std::vector<HostBuffer>> Stager::TakeBuffers(Client& c, size_t bytes, size_t count) {
  std::vector<HostBuffer> out;
  std::erase_if(kept_, [&](HostBuffer& b) {
    if (b.size() < bytes) return true;  // too small for this chunk size: give its room back
    if (out.size() == count) return false;
    out.push_back(std::move(b));
    return true;
  });
  while (out.size() < count) {
    auto b = c.AllocateHost(bytes);
    if (!b.ok()) {
      if (out.empty()) return b.status();
      break;
    }
    out.push_back(std::move(*b));
  }
  return out;
}

void Stager::KeepBuffers(std::vector<HostBuffer> buffers) {
  for (auto& b : buffers) kept_.push_back(std::move(b));
}

void Stager::Work(uint64_t seen) {
  for (;;) {
    SpinFor(kSpinNs, [&] {
      return generation_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_relaxed);
    });
    const std::function<void()>* task;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] {
        return stop_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen;
      });
      if (stop_.load(std::memory_order_relaxed)) return;
      seen = generation_.load(std::memory_order_acquire);
      // More workers than this run asked for: the rest wait for the next.
      if (tickets_ <= 0) continue;
      --tickets_;
      task = task_;
    }
    (*task)();
    if (running_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> l(mu_);
      done_cv_.notify_all();
    }
  }
}

Status Stager::Copy(Client& client, ClientCore& core, Direction direction, void* host, const DeviceRegion& device,
                    size_t device_offset, size_t bytes, const StagedCopyOptions& options) {
  // What the running policy says now: ferryd wrote it into the ring at hello and rewrites it on
  // every policy switch, so the next staged copy follows a switch at once. The call's own
  // chunk and threads, where given, come first (docs/policies.md, "Staging").
  const PolicyStaging r = core.Staging();
  uint64_t chunk = options.chunk_bytes;
  int threads = options.threads;
  // A call that sets both chunk and threads keeps 8 buffers (its chunks may be large); else the
  // policy's.
  const uint32_t buffers = options.chunk_bytes != 0 && options.threads > 0 ? 8 : std::max<uint32_t>(r.buffers, 2);
  {
    // The policy's threads, but no more than this process may run at once: more only queue.
    if (threads <= 0) threads = static_cast<int>(std::min<uint32_t>(r.threads, UsableCpus()));
    if (chunk == 0) {
      // The policy's chunk, but small enough that a copy has a few dozen: the DMA starts after
      // the first chunk is staged and the last chunk's DMA comes after all host copies, so
      // small chunks make a short pipeline fill and drain.
      constexpr uint64_t kChunksPerCopy = 32, kMinChunk = 512ull << 10, kAlign = 64ull << 10;
      const uint64_t fit = (bytes / kChunksPerCopy + kAlign - 1) / kAlign * kAlign;
      chunk = std::min<uint64_t>(r.chunk_bytes, std::max(kMinChunk, fit));
    }
  }
  if (chunk == 0 || threads <= 0) return InvalidArgument("staging chunk size and threads must be positive");
  // Each thread copies a slice of the chunk at hand: a chunk is staged by all threads at once.
  constexpr uint64_t kMinSlice = 64ull << 10, kPage = 4096;
  const uint64_t slice = std::max(kMinSlice, (chunk / static_cast<uint64_t>(threads) + kPage - 1) / kPage * kPage);
  const uint64_t chunks = (bytes + chunk - 1) / chunk;

  auto turn = Exclusive();
  auto bufs = TakeBuffers(client, std::min<uint64_t>(chunk, bytes), std::min<uint64_t>(buffers, chunks));
  if (!bufs.ok()) return bufs.status().WithContext("staging buffer");
  StagedPipeline pipeline(direction, static_cast<std::byte*>(host), bytes, chunk, slice, std::move(*bufs),
                          [&](const HostBuffer& buf, uint64_t offset, uint64_t len) {
                            return client.Copy(direction, buf, 0, device, device_offset + offset, len,
                                               {.priority = options.priority});
                          });
  pipeline.Start();
  const auto n = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(threads), pipeline.slices()));
  const std::function<void()> task = [&] { pipeline.Work(); };
  RunOnThreads(n, task);
  std::vector<HostBuffer> back;
  Status st = pipeline.Finish(back);
  KeepBuffers(std::move(back));
  return st;
}

}  // namespace ferry::detail
