// Are a process's copy streams alike, its pinned buffers and its device buffers? 1024 x 64 KiB
// in order as one cudaMemcpyBatchAsync, both directions, for each of STREAMS streams (created
// one after another, as ferryd creates its copy streams), BUFFERS pinned buffers of 64 MiB
// (cudaHostAlloc, each allocated apart) and DEVICE_BUFFERS device buffers of 64 MiB (cudaMalloc,
// each apart, with 1 GiB allocated between them), timed on the GPU from one event to the next.
// A small-copy rate that differs by stream points at the engine each stream's channel was
// given; by buffer, at the memory behind it; by process alone, at the process. CONTEXTS > 1
// measures it all again on fresh primary contexts (cudaDeviceReset between), in one process:
// on the H100s of docs/measurements/h100-lanes-2026-12-05.txt (run O) every stream, buffer and
// context of a process gave the same rate, ~31, ~33 or ~39 GB/s depending on the process.
// Prints, per pairing, the median GB/s of 7 timed runs (after 2 untimed) with min and max.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/probes/probe_util.hpp"

namespace {

constexpr const char* kUsage = R"(usage: probe-streams [STREAMS [BUFFERS [DEVICE_BUFFERS [CONTEXTS]]]]

Times 1024 x 64 KiB (in order, one cudaMemcpyBatchAsync) both ways for every combination of
STREAMS copy streams (default 8), BUFFERS pinned 64 MiB buffers (default 3) and DEVICE_BUFFERS
device buffers of 64 MiB (default 1); then again on CONTEXTS - 1 fresh primary contexts.)";

}  // namespace

int main(int argc, char** argv) {
  if (AskedForHelp(argc, argv, kUsage)) return 0;
  const int nstreams = argc > 1 ? std::atoi(argv[1]) : 8;
  const int nbuffers = argc > 2 ? std::atoi(argv[2]) : 3;
  const int ndevs = argc > 3 ? std::atoi(argv[3]) : 1;
  const int ncontexts = argc > 4 ? std::atoi(argv[4]) : 1;
  if (nstreams < 1 || nbuffers < 1 || ndevs < 1 || ncontexts < 1) {
    std::puts(kUsage);
    return 2;
  }
  constexpr size_t kBlock = 64 << 10, kCount = 1024, kBytes = kBlock * kCount;
  for (int c = 0; c < ncontexts; ++c) {
    if (c > 0) CK(cudaDeviceReset());
    std::vector<void*> devs(ndevs), spacers(ndevs);
    for (int v = 0; v < ndevs; ++v) {
      CK(cudaMalloc(&devs[v], kBytes));
      CK(cudaMemset(devs[v], 1, kBytes));
      CK(cudaMalloc(&spacers[v], size_t{1} << 30));
    }
    std::vector<void*> hosts(nbuffers);
    for (auto& h : hosts) {
      CK(cudaHostAlloc(&h, kBytes, cudaHostAllocDefault));
      std::memset(h, 2, kBytes);
    }
    std::vector<cudaStream_t> streams(nstreams);
    for (auto& s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t start, end;
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&end));
    std::printf(
        "probe-streams: context %d: 1024 x 64 KiB in order, one cudaMemcpyBatchAsync; GB/s median [min, max] of 7\n",
        c);
    for (const bool h2d : {true, false}) {
      for (int v = 0; v < ndevs; ++v) {
        for (int b = 0; b < nbuffers; ++b) {
          std::vector<void*> dst(kCount), src(kCount);
          std::vector<size_t> size(kCount, kBlock);
          for (size_t i = 0; i < kCount; ++i) {
            char* h = static_cast<char*>(hosts[b]) + i * kBlock;
            char* d = static_cast<char*>(devs[v]) + i * kBlock;
            dst[i] = h2d ? static_cast<void*>(d) : static_cast<void*>(h);
            src[i] = h2d ? static_cast<void*>(h) : static_cast<void*>(d);
          }
          for (int k = 0; k < nstreams; ++k) {
            std::vector<double> rates;
            for (int rep = 0; rep < 9; ++rep) {
              cudaMemcpyAttributes attr{};
              attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
              size_t idx = 0;
              CK(cudaEventRecord(start, streams[k]));
              CK(cudaMemcpyBatchAsync(dst.data(), src.data(), size.data(), kCount, &attr, &idx, 1, streams[k]));
              CK(cudaEventRecord(end, streams[k]));
              CK(cudaEventSynchronize(end));
              float ms = 0;
              CK(cudaEventElapsedTime(&ms, start, end));
              if (rep >= 2) rates.push_back(static_cast<double>(kBytes) / (ms * 1e-3) / 1e9);
            }
            std::sort(rates.begin(), rates.end());
            std::printf("%s device buffer %d host buffer %d stream %2d  %6.2f [%6.2f, %6.2f]\n", h2d ? "h2d" : "d2h", v,
                        b, k, rates[rates.size() / 2], rates.front(), rates.back());
          }
        }
      }
    }
  }
  return 0;
}
