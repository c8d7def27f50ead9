// What a GPU-side hand-off to another process and back costs, without ferry: the floor under
// "in-step" copies (a block's output copied as soon as its kernel is done, the step's stream
// waiting for the copy) when the copy runs in another process's context, as ferryd's do.
// Timed on the GPU between two events of this process's stream, released together by a host
// word (so no host call is inside the span), 4 KiB device to host:
//  0. the copy on the stream itself (no hand-off);
//  1. in this process: the stream records an event, a side stream waits on it, copies and
//     records an event the stream waits on (what an in-process in-step copy does);
//  2. in this process, host words both ways: the stream writes a word in mapped host memory
//     (cuStreamWriteValue32), the side stream waits on it (cuStreamWaitValue32), copies and
//     writes a second word the stream waits on;
//  3. in this process, the same with the words in device memory;
//  4. another process, host words both ways (as 2, the side stream the other process's);
//  5. another process, a host word there and an interprocess event back (what ferryd's lanes
//     do today: the client's stream waits on ferryd's event);
//  6. another process, device words both ways (this process's device memory, opened there by
//     its CUDA IPC handle);
//  7. another process, a device word there and an interprocess event back;
//  8. another process, interprocess events both ways: this process's stream records an
//     interprocess event, and only then does the other process enqueue its wait on it (as ferryd
//     would on reading a copy that names the client's record), copy and event back.
// Then one check of what an interprocess event means once its recorder dies: a third process
// records one behind a wait that never ends, this process's stream waits on it, the recorder is
// killed; does the waiting stream go on, fail, or wait for ever?
// So a hand-off's cost splits into the process boundary (1-3 against 4-8), events against words
// (1 against 2-3, 5 against 4, 7 against 6, 8 against 5) and where a word lives (2 against 3, 4
// against 6).
// Prints medians with p99 and min in microseconds, and each hand-off's median beyond 0.
#include <cuda.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bench/probes/probe_util.hpp"
#include "bench/probes/stream_memops.hpp"

namespace {

// The shared page's layout: commands from this process to the other one, and the two words.
struct Shared {
  std::atomic<uint32_t> command;  // the round's number; UINT32_MAX: stop
  std::atomic<uint32_t> mode;     // the variant, 4 to 7
  std::atomic<uint32_t> armed;    // the other process enqueued its part of that round
  std::atomic<uint32_t> ready;    // the handles are below
  uint32_t to_other;              // written by this process's stream
  uint32_t to_this;               // written by the other process's stream
  char event_handle[64];
  char words_handle[64];  // device memory of this process: [0] to the other, [1] back
  char record_handle[64];              // variant 8's event, recorded by this process's stream
  std::atomic<uint32_t> doomed_go;     // the timings are done: the doomed process may start
  std::atomic<uint32_t> doomed_ready;  // the doomed process recorded its event
  uint32_t never;                      // the word the doomed process's stream waits on; never written
  char doomed_handle[64];
};
constexpr int kVariants = 9;
constexpr uint32_t kEventsBothWays = 8;
bool DeviceWords(uint32_t v) { return v == 3 || v == 6 || v == 7; }
bool EventBack(uint32_t v) { return v == 1 || v == 5 || v == 7 || v == kEventsBothWays; }

constexpr size_t kBytes = 4096;

CUdeviceptr OffsetIn(const Shared* sh, const uint32_t* word) {
  return static_cast<CUdeviceptr>(reinterpret_cast<const char*>(word) - reinterpret_cast<const char*>(sh));
}

// The other process: its own context; for each round it enqueues "wait for the word, copy 4 KiB
// device to host, answer", then says it is armed.
[[noreturn]] void Other(Shared* sh) {
  CK(cudaSetDevice(0));
  LoadDriverEntryPoints();
  cudaStream_t cs;
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  void* pinned = nullptr;
  void* dev = nullptr;
  CK(cudaHostAlloc(&pinned, kBytes, cudaHostAllocDefault));
  CK(cudaMalloc(&dev, kBytes));
  const CUdeviceptr words = MapPage(sh);
  const CUdeviceptr to_other = words + OffsetIn(sh, &sh->to_other), to_this = words + OffsetIn(sh, &sh->to_this);
  while (sh->ready.load(std::memory_order_acquire) == 0) Relax();
  cudaIpcEventHandle_t h;
  std::memcpy(&h, sh->event_handle, sizeof h);
  cudaEvent_t answer;
  CK(cudaIpcOpenEventHandle(&answer, h));
  std::memcpy(&h, sh->record_handle, sizeof h);
  cudaEvent_t record;
  CK(cudaIpcOpenEventHandle(&record, h));
  cudaIpcMemHandle_t mh;
  std::memcpy(&mh, sh->words_handle, sizeof mh);
  void* dwords = nullptr;
  CK(cudaIpcOpenMemHandle(&dwords, mh, cudaIpcMemLazyEnablePeerAccess));
  const CUdeviceptr dev_to_other = reinterpret_cast<CUdeviceptr>(dwords), dev_to_this = dev_to_other + 4;
  for (uint32_t round = 1;; ++round) {
    uint32_t c;
    while ((c = sh->command.load(std::memory_order_acquire)) < round) Relax();
    if (c == UINT32_MAX) break;
    const uint32_t mode = sh->mode.load(std::memory_order_relaxed);
    if (mode == kEventsBothWays) {
      CK(cudaStreamWaitEvent(cs, record, 0));
    } else {
      CkCu(wait_value(cs, DeviceWords(mode) ? dev_to_other : to_other, round, CU_STREAM_WAIT_VALUE_GEQ),
           "cuStreamWaitValue32 (other)");
    }
    CK(cudaMemcpyAsync(pinned, dev, kBytes, cudaMemcpyDeviceToHost, cs));
    if (EventBack(mode)) {
      CK(cudaEventRecord(answer, cs));
    } else {
      CkCu(write_value(cs, DeviceWords(mode) ? dev_to_this : to_this, round, 0), "cuStreamWriteValue32 (other)");
    }
    sh->armed.store(round, std::memory_order_release);
    CK(cudaStreamSynchronize(cs));
  }
  std::_Exit(0);
}

// Has the other process enqueue its part of `round` for variant `mode`; returns once it has.
void ArmOther(Shared* sh, uint32_t round, uint32_t mode) {
  sh->mode.store(mode, std::memory_order_relaxed);
  sh->command.store(round, std::memory_order_release);
  while (sh->armed.load(std::memory_order_acquire) != round) Relax();
}

// The doomed process: records an interprocess event behind a wait on a word nobody writes, says
// so, and waits to be killed.
// It starts its context only once the timings are done, so that they see two processes as before.
[[noreturn]] void Doomed(Shared* sh, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  while (sh->doomed_go.load(std::memory_order_acquire) == 0) {
    if (getppid() != parent) std::_Exit(1);  // the probe ended before the signal was asked for
    usleep(1000);
  }
  CK(cudaSetDevice(0));
  LoadDriverEntryPoints();
  cudaStream_t cs;
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  const CUdeviceptr words = MapPage(sh);
  CkCu(wait_value(cs, words + OffsetIn(sh, &sh->never), 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32 (doomed)");
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
  CK(cudaEventRecord(ev, cs));
  cudaIpcEventHandle_t h;
  CK(cudaIpcGetEventHandle(&h, ev));
  std::memcpy(sh->doomed_handle, &h, sizeof h);
  sh->doomed_ready.store(1, std::memory_order_release);
  for (;;) pause();
}

// Waits on the doomed process's event, kills it, and says what became of the wait.
void DeathCheck(Shared* sh, pid_t doomed) {
  sh->doomed_go.store(1, std::memory_order_release);
  while (sh->doomed_ready.load(std::memory_order_acquire) == 0) Relax();
  cudaIpcEventHandle_t h;
  std::memcpy(&h, sh->doomed_handle, sizeof h);
  cudaEvent_t ev;
  CK(cudaIpcOpenEventHandle(&ev, h));
  cudaStream_t waiter;
  CK(cudaStreamCreateWithFlags(&waiter, cudaStreamNonBlocking));
  CK(cudaStreamWaitEvent(waiter, ev, 0));
  usleep(100'000);
  const cudaError_t before = cudaStreamQuery(waiter);
  kill(doomed, SIGKILL);
  int status = 0;
  waitpid(doomed, &status, 0);
  const double killed = Now();
  cudaError_t after = cudaErrorNotReady;
  while (Now() - killed < 5.0 && (after = cudaStreamQuery(waiter)) == cudaErrorNotReady) usleep(1000);
  std::printf(
      "an interprocess event whose recorder is killed while its record waits: the stream waiting on it was %s\n"
      "  before the kill; %.0f ms after it: %s\n",
      cudaGetErrorName(before), (Now() - killed) * 1e3,
      after == cudaErrorNotReady ? "still waiting (given up after 5 s)" : cudaGetErrorName(after));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (AskedForHelp(argc, argv,
                   "probe-handoff: a 4 KiB copy handed off on the GPU to a side stream of this process\n"
                   "or to another process's stream and back (events, words in host or device memory, or a\n"
                   "word there and an interprocess event back), timed on the GPU; no arguments")) {
    return 0;
  }
  constexpr int kReps = 2000;
  auto* sh = MapSharedPageBeforeFork<Shared>();
  if (sh == nullptr) return 1;
  const pid_t self = getpid();
  const pid_t other = fork();
  if (other == 0) Other(sh);
  const pid_t doomed = fork();
  if (doomed == 0) Doomed(sh, self);

  CK(cudaSetDevice(0));
  LoadDriverEntryPoints();
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s, side;
  CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi));
  CK(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, hi));
  void* pinned = nullptr;
  void* dev = nullptr;
  CK(cudaHostAlloc(&pinned, kBytes, cudaHostAllocDefault));
  CK(cudaMalloc(&dev, kBytes));
  uint32_t* own = MapPrivateWordPage();
  const CUdeviceptr go = MapPage(own);  // [0]: the host's go word; [1], [2]: variant 2's words
  const CUdeviceptr words = MapPage(sh);
  const CUdeviceptr to_other = words + OffsetIn(sh, &sh->to_other), to_this = words + OffsetIn(sh, &sh->to_this);
  // Device words: [0], [1] to the other process and back; [2], [3] variant 3's.
  void* dwords = nullptr;
  CK(cudaMalloc(&dwords, 4096));
  CK(cudaMemset(dwords, 0, 4096));
  CK(cudaDeviceSynchronize());
  const CUdeviceptr dev_to_other = reinterpret_cast<CUdeviceptr>(dwords), dev_to_this = dev_to_other + 4;
  const CUdeviceptr dev_side = dev_to_other + 8, dev_back = dev_to_other + 12;
  const CUdeviceptr host_side = go + 4, host_back = go + 8;
  cudaIpcMemHandle_t mh;
  CK(cudaIpcGetMemHandle(&mh, dwords));
  std::memcpy(sh->words_handle, &mh, sizeof mh);
  cudaEvent_t e0, e1, made, copied, answer, record;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreateWithFlags(&made, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&answer, cudaEventDisableTiming | cudaEventInterprocess));
  cudaIpcEventHandle_t h;
  CK(cudaIpcGetEventHandle(&h, answer));
  std::memcpy(sh->event_handle, &h, sizeof h);
  CK(cudaEventCreateWithFlags(&record, cudaEventDisableTiming | cudaEventInterprocess));
  CK(cudaIpcGetEventHandle(&h, record));
  std::memcpy(sh->record_handle, &h, sizeof h);
  sh->ready.store(1, std::memory_order_release);

  const char* names[kVariants] = {"the copy on the stream itself (no hand-off)",
                                  "in this process: event, side stream, event back",
                                  "in this process: host words both ways",
                                  "in this process: device words both ways",
                                  "another process: host words both ways",
                                  "another process: a host word there, its event back",
                                  "another process: device words both ways",
                                  "another process: a device word there, its event back",
                                  "another process: interprocess events both ways"};
  std::vector<double> us[kVariants];
  uint32_t go_seq = 0, other_round = 0;
  // The variants in turn, a round each, so that a slow spell of the machine hits them alike.
  for (int r = -100; r < kReps; ++r) {
    for (int v = 0; v < kVariants; ++v) {
      ++go_seq;
      if (v >= 4 && v != static_cast<int>(kEventsBothWays)) ArmOther(sh, ++other_round, static_cast<uint32_t>(v));
      CkCu(wait_value(s, go, go_seq, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32 (go)");
      CK(cudaEventRecord(e0, s));
      if (v == 0) {
        CK(cudaMemcpyAsync(pinned, dev, kBytes, cudaMemcpyDeviceToHost, s));
      } else if (v == 1) {
        CK(cudaEventRecord(made, s));
        CK(cudaStreamWaitEvent(side, made, 0));
        CK(cudaMemcpyAsync(pinned, dev, kBytes, cudaMemcpyDeviceToHost, side));
        CK(cudaEventRecord(copied, side));
        CK(cudaStreamWaitEvent(s, copied, 0));
      } else if (v <= 3) {
        const CUdeviceptr there = v == 3 ? dev_side : host_side, back = v == 3 ? dev_back : host_back;
        CkCu(wait_value(side, there, go_seq, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32 (side)");
        CK(cudaMemcpyAsync(pinned, dev, kBytes, cudaMemcpyDeviceToHost, side));
        CkCu(write_value(side, back, go_seq, 0), "cuStreamWriteValue32 (side)");
        CkCu(write_value(s, there, go_seq, 0), "cuStreamWriteValue32 (to the side)");
        CkCu(wait_value(s, back, go_seq, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32 (from the side)");
      } else if (v == static_cast<int>(kEventsBothWays)) {
        // The other process waits on this record, so it enqueues its part only after it.
        CK(cudaEventRecord(record, s));
        ArmOther(sh, ++other_round, kEventsBothWays);
        CK(cudaStreamWaitEvent(s, answer, 0));
      } else {
        CkCu(write_value(s, DeviceWords(v) ? dev_to_other : to_other, other_round, 0), "cuStreamWriteValue32 (to the other)");
        if (EventBack(v)) {
          CK(cudaStreamWaitEvent(s, answer, 0));
        } else {
          CkCu(wait_value(s, DeviceWords(v) ? dev_to_this : to_this, other_round, CU_STREAM_WAIT_VALUE_GEQ),
               "cuStreamWaitValue32 (answer)");
        }
      }
      CK(cudaEventRecord(e1, s));
      for (const double parked = Now(); Now() - parked < 50e-6;) {  // the streams reach their waits
      }
      std::atomic_ref<uint32_t>(own[0]).store(go_seq, std::memory_order_release);
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 0) us[v].push_back(static_cast<double>(ms) * 1e3);
    }
  }
  sh->command.store(UINT32_MAX, std::memory_order_release);
  int status = 0;
  waitpid(other, &status, 0);
  std::printf("probe-handoff: 4 KiB device to host, %d rounds, GPU time from the stream's release to its last wait (us)\n",
              kReps);
  for (std::vector<double>& x : us) std::sort(x.begin(), x.end());
  const double base = us[0][us[0].size() / 2];
  for (int v = 0; v < kVariants; ++v) {
    const std::vector<double>& x = us[v];
    std::printf("%-52s p50 %7.2f  p99 %7.2f  min %7.2f", names[v], x[x.size() / 2], x[x.size() * 99 / 100], x[0]);
    if (v > 0) std::printf("   hand-off +%.2f", x[x.size() / 2] - base);
    std::printf("\n");
  }
  std::fflush(stdout);
  DeathCheck(sh, doomed);
  std::_Exit(0);  // a stream still waiting could hold up the context's teardown
}
