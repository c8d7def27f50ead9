// What the copy engines make of a list of small blocks, without ferry: is a list's rate bound by
// one engine (spreading it over streams helps) or by the link (nothing does)? 4096 x 16 KiB,
// 1024 x 64 KiB and 256 x 256 KiB (64 MiB a list), both directions, the host side in order
// (pinned, cudaHostAlloc) and the device side shuffled, timed on the GPU from one event to the
// last stream's end:
//  - one stream: a loop of cudaMemcpyAsync; one cudaMemcpyBatchAsync asking for the copy
//    engines (cudaMemcpyFlagPreferOverlapWithCompute, as ferryd and ferry-bench ask); one with
//    no flags (the driver's choice);
//  - the list cut in N contiguous parts on N streams (2, 3, 4), each part a loop or a batch.
// Prints the median GB/s of 9 timed runs (after 2 untimed) with min and max.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "bench/probes/probe_util.hpp"

namespace {

constexpr const char* kUsage = R"(usage: probe-blocks

Times lists of small blocks (4096 x 16 KiB, 1024 x 64 KiB, 256 x 256 KiB; the device side
shuffled) both ways through the copy engines: one stream's loop and batch, and the list cut
over 2 to 4 streams. No options.)";

struct List {
  std::vector<void*> dst, src;
  std::vector<size_t> size;
};

enum class How { kLoop, kBatchEngines, kBatchAny };

void IssuePart(const List& l, size_t begin, size_t end, How how, cudaStream_t s, cudaMemcpyKind kind) {
  if (how == How::kLoop) {
    for (size_t i = begin; i < end; ++i) CK(cudaMemcpyAsync(l.dst[i], l.src[i], l.size[i], kind, s));
    return;
  }
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = how == How::kBatchEngines ? cudaMemcpyFlagPreferOverlapWithCompute : 0;
  size_t idx = 0;
  CK(cudaMemcpyBatchAsync(const_cast<void**>(l.dst.data() + begin), const_cast<void**>(l.src.data() + begin),
                          const_cast<size_t*>(l.size.data() + begin), end - begin, &attr, &idx, 1, s));
}

}  // namespace

int main(int argc, char** argv) {
  if (AskedForHelp(argc, argv, kUsage)) return 0;
  constexpr size_t kBytes = 64ull << 20;
  void* host = nullptr;
  void* dev = nullptr;
  CK(cudaHostAlloc(&host, kBytes, cudaHostAllocDefault));
  CK(cudaMalloc(&dev, kBytes));
  CK(cudaMemset(dev, 1, kBytes));
  std::memset(host, 2, kBytes);
  std::vector<cudaStream_t> streams(4);
  for (auto& s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t start, ends[4];
  CK(cudaEventCreate(&start));
  for (auto& e : ends) CK(cudaEventCreate(&e));
  std::mt19937_64 rng(7);
  std::printf("probe-blocks: shuffled block lists, 64 MiB a list, pinned host memory; GB/s median [min, max] of 9\n");
  for (const size_t block : {size_t{16} << 10, size_t{64} << 10, size_t{256} << 10}) {
    const size_t n = kBytes / block;
    for (const bool h2d : {true, false}) {
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      List l;
      for (size_t i = 0; i < n; ++i) {
        char* h = static_cast<char*>(host) + i * block;
        char* d = static_cast<char*>(dev) + order[i] * block;
        l.dst.push_back(h2d ? static_cast<void*>(d) : static_cast<void*>(h));
        l.src.push_back(h2d ? static_cast<void*>(h) : static_cast<void*>(d));
        l.size.push_back(block);
      }
      const cudaMemcpyKind kind = h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
      struct Variant {
        const char* name;
        How how;
        size_t streams;
      };
      const Variant variants[] = {
          {"1 stream, loop", How::kLoop, 1},
          {"1 stream, batch (engines)", How::kBatchEngines, 1},
          {"1 stream, batch (any)", How::kBatchAny, 1},
          {"2 streams, loops", How::kLoop, 2},
          {"2 streams, batches", How::kBatchEngines, 2},
          {"3 streams, loops", How::kLoop, 3},
          {"3 streams, batches", How::kBatchEngines, 3},
          {"4 streams, loops", How::kLoop, 4},
          {"4 streams, batches", How::kBatchEngines, 4},
      };
      for (const Variant& v : variants) {
        std::vector<double> rates;
        for (int rep = 0; rep < 11; ++rep) {
          CK(cudaEventRecord(start, streams[0]));
          for (size_t k = 1; k < v.streams; ++k) CK(cudaStreamWaitEvent(streams[k], start, 0));
          for (size_t k = 0; k < v.streams; ++k) {
            IssuePart(l, n * k / v.streams, n * (k + 1) / v.streams, v.how, streams[k], kind);
            CK(cudaEventRecord(ends[k], streams[k]));
          }
          for (size_t k = 1; k < v.streams; ++k) CK(cudaStreamWaitEvent(streams[0], ends[k], 0));
          CK(cudaEventRecord(ends[0], streams[0]));
          CK(cudaEventSynchronize(ends[0]));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, start, ends[0]));
          if (rep >= 2) rates.push_back(static_cast<double>(kBytes) / (ms * 1e-3) / 1e9);
        }
        std::sort(rates.begin(), rates.end());
        std::printf("%4zu x %3zu KiB %s  %-27s %6.2f [%6.2f, %6.2f]\n", n, block >> 10, h2d ? "h2d" : "d2h", v.name,
                    rates[rates.size() / 2], rates.front(), rates.back());
      }
    }
  }
  return 0;
}
