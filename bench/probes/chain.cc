// What a ferryd lane adds to a chain of copies, without ferry. The in-step mode's copies of a
// step run back to back on the client's lane (the output blocks are ready faster than the bus
// takes them), so whatever the lane does between two copies is paid once a copy, and the first
// copy pays the parked wait's reaction to the flag. Two parts, one stream each ("the lane"):
//  gaps:     16 device-to-host copies of 256 KiB, all enqueued behind a word the host releases,
//            with what a variant puts before or after each copy; the GPU time of the chain, and
//            per copy what it adds over the plain chain;
//  reaction: the lane parked on a word (or an event) that another stream writes after a 16 MiB
//            copy; the GPU time from the other stream's timing event after its write to the
//            lane's timing event after its wait, by where the word lives and what wakes the lane.
// Prints medians [min, p90] in microseconds.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/probes/probe_util.hpp"
#include "bench/probes/stream_memops.hpp"

namespace {

constexpr size_t kCopyBytes = 256 << 10;
constexpr int kCopies = 16;
constexpr size_t kDelayBytes = 16 << 20;

struct Words {
  uint32_t* host = nullptr;  // [0] the go word, [1] a word always satisfied, [2] fence words, [3] the flag
  CUdeviceptr host_dev = 0;
  CUdeviceptr device = 0;  // device words: [0] always satisfied, [1] the flag, [2] signal words
};

CUdeviceptr HostWord(const Words& w, int i) { return w.host_dev + static_cast<CUdeviceptr>(i) * sizeof(uint32_t); }
CUdeviceptr DeviceWord(const Words& w, int i) { return w.device + static_cast<CUdeviceptr>(i) * sizeof(uint32_t); }

enum Gap {
  kPlain,
  kEvent,
  kIpcEvent,
  kIpcAndEvent,
  kWord,
  kDeviceWordAfter,
  kWaitHost,
  kWaitDevice,
  kWaitEvent,
  kLaneToday,
  kLaneWordFence,
  kLaneDeviceWords,
  kLaneWaiter,
  kGaps
};
const char* const kGapNames[kGaps] = {
    "plain copies",
    "+ event after each (no timing)",
    "+ interprocess event after each",
    "+ interprocess event and event after each",
    "+ word after each (default: fenced)",
    "+ device word after each (fenced)",
    "+ wait on a satisfied host word before each",
    "+ wait on a satisfied device word before each",
    "+ wait on a done event before each",
    "lane: host-word wait, copy, interprocess event, event",
    "lane: host-word wait, copy, interprocess event, word",
    "lane: device-word wait, copy, device word, event",
    "lane: host-word wait on a waiter stream, its event, copy, ipc event, event",
};

enum Wake {
  kEventWait,
  kHostWord,
  kDeviceWord,
  kHostWordFlush,
  kHostWordHighPriority,
  kHostWordKick,
  kHostWordWaiter,
  kWakes
};
const char* const kWakeNames[kWakes] = {
    "cudaStreamWaitEvent on the other stream's event",
    "cuStreamWaitValue32 on a host word",
    "cuStreamWaitValue32 on a device word",
    "cuStreamWaitValue32 on a host word, FLUSH",
    "cuStreamWaitValue32 on a host word, lane of the greatest priority",
    "cuStreamWaitValue32 on a host word, the host enqueues an event behind it on seeing the word",
    "cuStreamWaitValue32 on a host word on a waiter stream, the lane waiting on its event",
};

struct Stats {
  double p50, min, p90;
};
Stats Summarize(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return {x[x.size() / 2], x[0], x[x.size() * 9 / 10]};
}

float ElapsedUs(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms * 1000.0f;
}

}  // namespace

int main(int argc, char** argv) {
  if (AskedForHelp(argc, argv,
                   "probe-chain: what a ferryd lane adds between back-to-back device-to-host copies (waits,\n"
                   "events, words around each of 16 copies of 256 KiB), and how soon a lane parked on a word\n"
                   "or an event starts once another stream writes it; no arguments")) {
    return 0;
  }
  constexpr int kReps = 200, kWarm = 20;
  CK(cudaSetDevice(0));
  LoadDriverEntryPoints();
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t lane, lane_high, other, waiter;
  CK(cudaStreamCreateWithPriority(&lane, cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithPriority(&waiter, cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithPriority(&lane_high, cudaStreamNonBlocking, hi));
  CK(cudaStreamCreateWithPriority(&other, cudaStreamNonBlocking, lo));
  void* dev = nullptr;
  void* host = nullptr;
  void* delay_dev = nullptr;
  void* delay_host = nullptr;
  CK(cudaMalloc(&dev, kCopyBytes * kCopies));
  CK(cudaHostAlloc(&host, kCopyBytes * kCopies, cudaHostAllocDefault));
  CK(cudaMalloc(&delay_dev, kDelayBytes));
  CK(cudaHostAlloc(&delay_host, kDelayBytes, cudaHostAllocDefault));
  CK(cudaMemset(dev, 0x5a, kCopyBytes * kCopies));
  Words w;
  w.host = MapPrivateWordPage();
  w.host_dev = MapPage(w.host);
  void* dwords = nullptr;
  CK(cudaMalloc(&dwords, 4096));
  CK(cudaMemset(dwords, 0, 4096));
  w.device = reinterpret_cast<CUdeviceptr>(dwords);
  w.host[1] = 1;
  CkCu(write_value(other, DeviceWord(w, 0), 1, 0), "cuStreamWriteValue32");
  cudaEvent_t t0, t1, done_event, plain, ipc, handoff;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  CK(cudaEventCreateWithFlags(&done_event, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&handoff, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&ipc, cudaEventDisableTiming | cudaEventInterprocess));
  CK(cudaEventRecord(done_event, other));
  CK(cudaDeviceSynchronize());

  // Part 1: gaps. The variants in turn, a round each.
  std::vector<double> chain[kGaps];
  uint32_t go = 0, fence = 0;
  for (int r = -kWarm; r < kReps; ++r) {
    for (int v = 0; v < kGaps; ++v) {
      ++go;
      CkCu(wait_value(lane, HostWord(w, 0), go, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32 (go)");
      CK(cudaEventRecord(t0, lane));
      for (int i = 0; i < kCopies; ++i) {
        if (v == kWaitHost || v == kLaneToday || v == kLaneWordFence) {
          CkCu(wait_value(lane, HostWord(w, 1), 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
        }
        if (v == kWaitDevice || v == kLaneDeviceWords)
          CkCu(wait_value(lane, DeviceWord(w, 0), 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
        if (v == kWaitEvent) CK(cudaStreamWaitEvent(lane, done_event, 0));
        if (v == kLaneWaiter) {  // the waiter's waits are over before the go word: the best case
          CkCu(wait_value(waiter, HostWord(w, 1), 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32 (waiter)");
          CK(cudaEventRecord(handoff, waiter));
          CK(cudaStreamWaitEvent(lane, handoff, 0));
        }
        CK(cudaMemcpyAsync(static_cast<std::byte*>(host) + i * kCopyBytes,
                           static_cast<std::byte*>(dev) + i * kCopyBytes, kCopyBytes, cudaMemcpyDeviceToHost, lane));
        if (v == kEvent) CK(cudaEventRecord(plain, lane));
        if (v == kIpcEvent || v == kIpcAndEvent || v == kLaneToday || v == kLaneWordFence || v == kLaneWaiter) {
          CK(cudaEventRecord(ipc, lane));
        }
        if (v == kDeviceWordAfter || v == kLaneDeviceWords)
          CkCu(write_value(lane, DeviceWord(w, 2), ++fence, 0), "cuStreamWriteValue32 (device)");
        if (v == kIpcAndEvent || v == kLaneToday || v == kLaneDeviceWords || v == kLaneWaiter) {
          CK(cudaEventRecord(plain, lane));
        }
        if (v == kWord || v == kLaneWordFence)
          CkCu(write_value(lane, HostWord(w, 2), ++fence, 0), "cuStreamWriteValue32");
      }
      CK(cudaEventRecord(t1, lane));
      for (const double parked = Now(); Now() - parked < 50e-6;) {  // the lane reaches the go word
      }
      std::atomic_ref<uint32_t>(w.host[0]).store(go, std::memory_order_release);
      CK(cudaEventSynchronize(t1));
      if (r >= 0) chain[v].push_back(ElapsedUs(t0, t1));
    }
  }
  std::printf("probe-chain: %d device-to-host copies of %zu KiB back to back on one stream, %d rounds (us)\n", kCopies,
              kCopyBytes >> 10, kReps);
  const double base = Summarize(chain[kPlain]).p50;
  for (int v = 0; v < kGaps; ++v) {
    const Stats s = Summarize(chain[v]);
    std::printf("  %-76s chain p50 %8.2f [%8.2f, p90 %8.2f]   a copy +%6.2f\n", kGapNames[v], s.p50, s.min, s.p90,
                (s.p50 - base) / kCopies);
  }

  // Part 2: reaction. The other stream copies 16 MiB (the lane parks meanwhile), writes the flag
  // (or records its event) and a timing event; the lane waits, records a timing event, copies 4 KiB.
  std::vector<double> reaction[kWakes];
  int can_flush = 0;  // whether the GPU takes CU_STREAM_WAIT_VALUE_FLUSH (the driver refuses it where not)
  CK(cudaDeviceGetAttribute(&can_flush, cudaDevAttrCanFlushRemoteWrites, 0));
  uint32_t flag = 0;
  for (int r = -kWarm; r < kReps / 2; ++r) {
    for (int v = 0; v < kWakes; ++v) {
      if (v == kHostWordFlush && can_flush == 0) continue;
      ++flag;
      cudaStream_t s = v == kHostWordHighPriority ? lane_high : lane;
      switch (v) {
        case kEventWait:
          break;
        case kDeviceWord:
          CkCu(wait_value(s, DeviceWord(w, 1), flag, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
          break;
        case kHostWordFlush:
          CkCu(wait_value(s, HostWord(w, 3), flag, CU_STREAM_WAIT_VALUE_GEQ | CU_STREAM_WAIT_VALUE_FLUSH),
               "cuStreamWaitValue32 (flush)");
          break;
        case kHostWordWaiter:
          CkCu(wait_value(waiter, HostWord(w, 3), flag, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32 (waiter)");
          CK(cudaEventRecord(handoff, waiter));
          CK(cudaStreamWaitEvent(s, handoff, 0));
          break;
        default:
          CkCu(wait_value(s, HostWord(w, 3), flag, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
          break;
      }
      CK(cudaMemcpyAsync(delay_dev, delay_host, kDelayBytes, cudaMemcpyHostToDevice, other));
      if (v == kEventWait) {
        CK(cudaEventRecord(done_event, other));
        CK(cudaStreamWaitEvent(s, done_event, 0));
      } else {
        CkCu(write_value(other, v == kDeviceWord ? DeviceWord(w, 1) : HostWord(w, 3), flag, 0), "cuStreamWriteValue32");
      }
      CK(cudaEventRecord(t0, other));
      CK(cudaEventRecord(t1, s));
      CK(cudaMemcpyAsync(host, dev, 4096, cudaMemcpyDeviceToHost, s));
      if (v == kHostWordKick) {
        while (static_cast<int32_t>(std::atomic_ref<uint32_t>(w.host[3]).load(std::memory_order_acquire) - flag) < 0)
          Relax();
        CK(cudaEventRecord(plain, s));
      }
      CK(cudaStreamSynchronize(s));
      CK(cudaStreamSynchronize(other));
      if (r >= 0) reaction[v].push_back(ElapsedUs(t0, t1));
    }
  }
  std::printf(
      "probe-chain: a parked lane's start after another stream's write (the other's timing event after its\n"
      "write to the lane's after its wait), %d rounds (us)\n",
      kReps / 2);
  for (int v = 0; v < kWakes; ++v) {
    if (reaction[v].empty()) {
      std::printf("  %-92s not supported by this GPU\n", kWakeNames[v]);
      continue;
    }
    const Stats s = Summarize(reaction[v]);
    std::printf("  %-92s p50 %7.2f [%7.2f, p90 %7.2f]\n", kWakeNames[v], s.p50, s.min, s.p90);
  }
  return 0;
}
