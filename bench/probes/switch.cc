// What a 4 KiB copy costs when the copy before it on the same engine ran in another process's
// context, without ferry: the transfer bench's "alternating" lines (a client's own copies between
// ferryd's) cost ~143 us a host-to-device copy on the H100 and H200 where device to host costs
// ~7 us, and ferryd traced (an event recorded on its streams) did not show it.
// Two processes take turns, one 4 KiB copy each: this process's on a default-priority stream from
// cudaMallocHost memory, waited for with cudaStreamSynchronize (the bench's in-process copy); then
// the other process's, as a variant says: after its copy the other stream carries
//  none:   nothing (seen done by cudaStreamQuery);
//  word:   a cuStreamWriteValue32 of a host word (seen done by reading the word: ferryd's fence);
//  word+q: the same word, seen done by cudaStreamQuery;
//  event:  a cudaEventRecord (no timing; seen done by cudaEventQuery);
//  traced: timing events before and after the copy, then the word (seen done by the event);
//  t<+word: a timing event before the copy, the word after it (seen done by the word);
//  e<+word: the same with an event without timing;
// on a stream of the greatest priority (ferryd's stream 0) or the default one, from cudaMallocHost
// memory or from malloc'd memory registered with cudaHostRegister (ferryd's pool). Prints, per
// direction and variant, the median [p99] of this process's copy and of the other's, host clock
// from the call to the wait's return, in microseconds.
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/probes/probe_util.hpp"
#include "bench/probes/stream_memops.hpp"

namespace {

constexpr size_t kBytes = 4096;
constexpr int kMarkers = 7;
const char* const kMarkerNames[kMarkers] = {"none", "word", "word+q", "event", "traced", "t<+word", "e<+word"};

struct Variant {
  int direction;  // 0: host to device
  int marker;     // index of kMarkerNames
  bool high_priority;
  bool registered;
};

struct Shared {
  std::atomic<uint32_t> command;  // the round's number; UINT32_MAX: stop
  std::atomic<uint32_t> done;     // the other process saw that round's copy done
  Variant variant;
};

void Spin(cudaStream_t s) {
  cudaError_t e;
  while ((e = cudaStreamQuery(s)) == cudaErrorNotReady) {
  }
  CK(e);
}

void Spin(cudaEvent_t ev) {
  cudaError_t e;
  while ((e = cudaEventQuery(ev)) == cudaErrorNotReady) {
  }
  CK(e);
}

[[noreturn]] void Other(Shared* sh) {
  CK(cudaSetDevice(0));
  LoadDriverEntryPoints();
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t streams[2];  // [0] default priority, [1] greatest
  CK(cudaStreamCreateWithPriority(&streams[0], cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithPriority(&streams[1], cudaStreamNonBlocking, hi));
  void* allocated = nullptr;
  CK(cudaHostAlloc(&allocated, kBytes, cudaHostAllocDefault));
  void* registered = std::aligned_alloc(2 << 20, 2 << 20);
  CK(cudaHostRegister(registered, 2 << 20, cudaHostRegisterPortable));
  void* dev = nullptr;
  CK(cudaMalloc(&dev, kBytes));
  uint32_t* page = MapPrivateWordPage();
  const CUdeviceptr word = MapPage(page);
  cudaEvent_t plain, t0, t1;
  CK(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  for (uint32_t round = 1;; ++round) {
    uint32_t c;
    while ((c = sh->command.load(std::memory_order_acquire)) < round) Relax();
    if (c == UINT32_MAX) break;
    const Variant v = sh->variant;
    cudaStream_t s = streams[v.high_priority ? 1 : 0];
    void* host = v.registered ? registered : allocated;
    if (v.marker == 4 || v.marker == 5) CK(cudaEventRecord(t0, s));
    if (v.marker == 6) CK(cudaEventRecord(plain, s));
    CK(v.direction == 0 ? cudaMemcpyAsync(dev, host, kBytes, cudaMemcpyHostToDevice, s)
                        : cudaMemcpyAsync(host, dev, kBytes, cudaMemcpyDeviceToHost, s));
    switch (v.marker) {
      case 0:
        Spin(s);
        break;
      case 1:
      case 2:
      case 5:
      case 6:
        CkCu(write_value(s, word, round, 0), "cuStreamWriteValue32");
        if (v.marker == 2) {
          Spin(s);
        } else {
          while (static_cast<int32_t>(std::atomic_ref<uint32_t>(page[0]).load(std::memory_order_acquire) - round) < 0) {
          }
        }
        break;
      case 3:
        CK(cudaEventRecord(plain, s));
        Spin(plain);
        break;
      default:
        CK(cudaEventRecord(t1, s));
        CkCu(write_value(s, word, round, 0), "cuStreamWriteValue32");
        Spin(t1);
        break;
    }
    sh->done.store(round, std::memory_order_release);
  }
  CK(cudaStreamSynchronize(streams[0]));
  CK(cudaStreamSynchronize(streams[1]));
  std::_Exit(0);
}

double Median(std::vector<double>& x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (AskedForHelp(argc, argv,
                   "probe-switch: a 4 KiB copy of this process after another process's copy on the same\n"
                   "engine, and the other's after this one's, by what the other stream carries after its copy,\n"
                   "its priority and its host memory; both directions; no arguments")) {
    return 0;
  }
  constexpr int kReps = 400, kWarm = 40;
  auto* sh = MapSharedPageBeforeFork<Shared>();
  if (sh == nullptr) return 1;
  const pid_t other = fork();
  if (other == 0) Other(sh);

  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* pinned = nullptr;
  void* dev = nullptr;
  CK(cudaMallocHost(&pinned, kBytes));
  CK(cudaMalloc(&dev, kBytes));
  auto own_copy = [&](int direction) {
    const double t0 = Now();
    CK(direction == 0 ? cudaMemcpyAsync(dev, pinned, kBytes, cudaMemcpyHostToDevice, s)
                      : cudaMemcpyAsync(pinned, dev, kBytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    return (Now() - t0) * 1e6;
  };
  uint32_t round = 0;
  auto other_copy = [&](const Variant& v) {
    const double t0 = Now();
    sh->variant = v;
    ++round;
    sh->command.store(round, std::memory_order_release);
    while (sh->done.load(std::memory_order_acquire) != round) Relax();
    return (Now() - t0) * 1e6;
  };
  std::printf("probe-switch: 4 KiB copies, this process's and another's in turn, %d rounds each; median [p99] us\n",
              kReps);
  for (int direction = 0; direction < 2; ++direction) {
    std::vector<double> alone;
    for (int r = -kWarm; r < kReps; ++r) {
      const double t = own_copy(direction);
      if (r >= 0) alone.push_back(t);
    }
    std::printf("%s: this process's copies back to back: %.2f\n", direction == 0 ? "h2d" : "d2h", Median(alone));
    std::printf("  %-8s %-9s %-11s %22s %22s\n", "other:", "priority", "host memory", "this process's copy",
                "the other's copy");
    for (int marker = 0; marker < kMarkers; ++marker) {
      for (int prio = 1; prio >= 0; --prio) {
        for (int reg = 1; reg >= 0; --reg) {
          const Variant v{direction, marker, prio == 1, reg == 1};
          std::vector<double> mine, theirs;
          for (int r = -kWarm; r < kReps; ++r) {
            const double o = other_copy(v);
            const double m = own_copy(direction);
            if (r >= 0) {
              theirs.push_back(o);
              mine.push_back(m);
            }
          }
          std::sort(mine.begin(), mine.end());
          std::sort(theirs.begin(), theirs.end());
          std::printf("  %-8s %-9s %-11s %10.2f [%9.2f] %10.2f [%9.2f]\n", kMarkerNames[marker],
                      prio ? "greatest" : "default", reg ? "registered" : "hostalloc", mine[mine.size() / 2],
                      mine[mine.size() * 99 / 100], theirs[theirs.size() / 2], theirs[theirs.size() * 99 / 100]);
        }
      }
    }
  }
  sh->command.store(UINT32_MAX, std::memory_order_release);
  int status = 0;
  waitpid(other, &status, 0);
  return 0;
}
