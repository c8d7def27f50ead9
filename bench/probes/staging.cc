// The staged path's ceiling on this host, in one process, no ferryd: T threads memcpy chunks of
// pageable memory into a ring of 16 pinned buffers and cudaMemcpyAsync each one host to device
// as soon as it is staged (and the mirror image device to host). Beside it: the memcpy alone
// into the same ring and the DMA alone from it.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "bench/probes/probe_util.hpp"

static constexpr int kSlots = 16;

struct Rig {
  size_t max_bytes, chunk;
  std::byte* pageable;
  std::byte* ring;
  std::byte* dev;
  cudaStream_t stream;
  cudaEvent_t ev[kSlots];
  std::mutex submit_mu;
};

// mode 0: memcpy only, 1: DMA only, 2: pipeline. dir 0: h2d, 1: d2h.
static double Run(Rig& r, size_t bytes, int threads, int mode, int dir) {
  const size_t chunks = (bytes + r.chunk - 1) / r.chunk;
  std::atomic<size_t> next{0};
  std::vector<std::atomic<int64_t>> slot_chunk(kSlots);
  for (auto& s : slot_chunk) s = -1;
  const double t0 = Now();
  if (mode == 1) {
    for (size_t j = 0; j < chunks; ++j) {
      const size_t len = std::min(r.chunk, bytes - j * r.chunk);
      std::byte* buf = r.ring + (j % kSlots) * r.chunk;
      if (dir == 0)
        CK(cudaMemcpyAsync(r.dev + j * r.chunk, buf, len, cudaMemcpyHostToDevice, r.stream));
      else
        CK(cudaMemcpyAsync(buf, r.dev + j * r.chunk, len, cudaMemcpyDeviceToHost, r.stream));
    }
    CK(cudaStreamSynchronize(r.stream));
    return bytes / (Now() - t0) / 1e9;
  }
  if (mode == 2 && dir == 1) {  // the first kSlots DMAs go out first
    for (size_t j = 0; j < chunks && j < kSlots; ++j) {
      const size_t len = std::min(r.chunk, bytes - j * r.chunk);
      CK(cudaMemcpyAsync(r.ring + j * r.chunk, r.dev + j * r.chunk, len, cudaMemcpyDeviceToHost, r.stream));
      CK(cudaEventRecord(r.ev[j], r.stream));
    }
  }
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < chunks;) {
      const size_t len = std::min(r.chunk, bytes - j * r.chunk);
      const int s = static_cast<int>(j % kSlots);
      std::byte* buf = r.ring + s * r.chunk;
      if (mode == 0) {
        if (dir == 0)
          std::memcpy(buf, r.pageable + j * r.chunk, len);
        else
          std::memcpy(r.pageable + j * r.chunk, buf, len);
        continue;
      }
      if (dir == 0) {
        // wait until chunk j - kSlots was submitted from this slot, then until its DMA is done
        while (j >= kSlots && slot_chunk[s].load() != static_cast<int64_t>(j - kSlots)) {
        }
        if (j >= kSlots) {
          while (cudaEventQuery(r.ev[s]) == cudaErrorNotReady) {
          }
        }
        std::memcpy(buf, r.pageable + j * r.chunk, len);
        std::lock_guard<std::mutex> l(r.submit_mu);
        CK(cudaMemcpyAsync(r.dev + j * r.chunk, buf, len, cudaMemcpyHostToDevice, r.stream));
        CK(cudaEventRecord(r.ev[s], r.stream));
        slot_chunk[s].store(static_cast<int64_t>(j));
      } else {
        // wait until chunk j was sent into this slot and has landed
        while (j >= kSlots && slot_chunk[s].load() != static_cast<int64_t>(j)) {
        }
        while (cudaEventQuery(r.ev[s]) == cudaErrorNotReady) {
        }
        std::memcpy(r.pageable + j * r.chunk, buf, len);
        const size_t nj = j + kSlots;
        if (nj < chunks) {
          const size_t nlen = std::min(r.chunk, bytes - nj * r.chunk);
          std::lock_guard<std::mutex> l(r.submit_mu);
          CK(cudaMemcpyAsync(buf, r.dev + nj * r.chunk, nlen, cudaMemcpyDeviceToHost, r.stream));
          CK(cudaEventRecord(r.ev[s], r.stream));
          slot_chunk[s].store(static_cast<int64_t>(nj));
        }
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(work);
  for (auto& t : ts) t.join();
  CK(cudaStreamSynchronize(r.stream));
  return bytes / (Now() - t0) / 1e9;
}

int main(int argc, char** argv) {
  if (AskedForHelp(
          argc, argv,
          "usage: probe-staging\n\nThe staged path's ceiling on this host, in one process, no ferryd: T threads memcpy "
          "chunks of\npageable memory into a ring of 16 pinned buffers and cudaMemcpyAsync each one host to device\nas "
          "soon as it is staged (and the mirror image device to host). Beside it: the memcpy alone\ninto the same ring "
          "and the DMA alone from it."))
    return 0;
  CK(cudaSetDevice(0));
  Rig r;
  r.max_bytes = 256ull << 20;
  r.pageable = static_cast<std::byte*>(std::malloc(r.max_bytes));
  std::memset(r.pageable, 3, r.max_bytes);
  CK(cudaMallocHost(&r.ring, kSlots * (8ull << 20)));
  std::memset(r.ring, 0, kSlots * (8ull << 20));
  CK(cudaMalloc(&r.dev, r.max_bytes));
  CK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  for (auto& e : r.ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const char* names[] = {"memcpy only", "DMA only", "pipeline"};
  std::printf("in-process staging, 16 pinned buffers: GB/s median [min, max] of 7\n");
  for (size_t bytes : {64ull << 20, 256ull << 20}) {
    for (size_t chunk : {2ull << 20, 4ull << 20, 8ull << 20}) {
      r.chunk = chunk;
      for (int threads : {8, 12}) {
        for (int dir = 0; dir < 2; ++dir) {
          for (int mode = 0; mode < 3; ++mode) {
            if (mode == 1 && threads != 8) continue;
            std::vector<double> v;
            for (int rep = -1; rep < 7; ++rep) {
              double g = Run(r, bytes, threads, mode, dir);
              if (rep >= 0) v.push_back(g);
            }
            std::sort(v.begin(), v.end());
            std::printf("%3zu MiB %s chunk %zu MiB %2d threads %-12s %6.2f [%6.2f, %6.2f]\n", bytes >> 20,
                        dir == 0 ? "h2d" : "d2h", chunk >> 20, threads, names[mode], v[3], v[0], v[6]);
            std::fflush(stdout);
          }
        }
      }
    }
  }
  return 0;
}
