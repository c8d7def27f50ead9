// What the copy engines make of a list of small blocks, without ferry: is a list's rate bound by
// one engine (spreading it over streams helps) or by the link (nothing does)? 4096 x 16 KiB,
// 1024 x 64 KiB and 256 x 256 KiB (64 MiB a list), both directions, the host side in order
// (pinned, cudaHostAlloc) and the device side shuffled (--host-shuffled: the host side shuffled
// too, as ferry-bench's lists are; --huge: the host side anonymous memory on transparent huge
// pages, registered with cudaHostRegister), timed on the GPU from one event to the last
// stream's end:
//  - one stream: a loop of cudaMemcpyAsync; one cudaMemcpyBatchAsync asking for the copy
//    engines (cudaMemcpyFlagPreferOverlapWithCompute, as ferryd and ferry-bench ask); one with
//    no flags (the driver's choice);
//  - the list cut in N contiguous parts on N streams (2, 3, 4), each part a loop or a batch.
// Prints the median GB/s of 9 timed runs (after 2 untimed) with min and max, by the GPU's events
// and by the host clock (the first call to the end seen), and the calls' own time a block.
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "bench/probes/probe_util.hpp"

namespace {

constexpr const char* kUsage = R"(usage: probe-blocks [--host-shuffled] [--huge] [--block KIB]

Times lists of small blocks (4096 x 16 KiB, 1024 x 64 KiB, 256 x 256 KiB; the device side
shuffled) both ways through the copy engines: one stream's loop and batch, and the list cut
over 2 to 4 streams.

options:
  --host-shuffled  shuffle the host side too (default: the host side in order)
  --huge           the host side on transparent huge pages (anonymous memory, madvise, then
                   cudaHostRegister; default: cudaHostAlloc)
  --block KIB      this block size alone (any number of KiB dividing 64 MiB)
  -h, --help       this help)";

struct Options {
  bool host_shuffled = false, huge = false;
  size_t only_block = 0;  // bytes; 0: every size
};

// False (after saying why) for an option it does not know.
bool ParseOptions(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--host-shuffled") == 0) {
      o.host_shuffled = true;
    } else if (std::strcmp(argv[i], "--huge") == 0) {
      o.huge = true;
    } else if (std::strcmp(argv[i], "--block") == 0 && i + 1 < argc) {
      o.only_block = std::strtoull(argv[++i], nullptr, 10) << 10;
    } else {
      std::fprintf(stderr, "probe-blocks: unknown option %s (see --help)\n", argv[i]);
      return false;
    }
  }
  return true;
}

// 64 MiB of host memory the engines can reach: cudaHostAlloc's, or anonymous memory on huge
// pages (2 MiB aligned, madvise'd, touched, then registered). How many of its pages are huge is
// printed from /proc/self/smaps_rollup's AnonHugePages.
void* PinnedHost(size_t bytes, bool huge) {
  void* host = nullptr;
  if (!huge) {
    CK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
    return host;
  }
  if (posix_memalign(&host, 2u << 20, bytes) != 0) {
    std::fprintf(stderr, "probe-blocks: posix_memalign failed\n");
    std::_Exit(1);
  }
  if (madvise(host, bytes, MADV_HUGEPAGE) != 0) std::perror("probe-blocks: madvise(MADV_HUGEPAGE)");
  std::memset(host, 0, bytes);
  CK(cudaHostRegister(host, bytes, cudaHostRegisterDefault));
  if (FILE* f = std::fopen("/proc/self/smaps_rollup", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "AnonHugePages:", 14) == 0) std::printf("host memory: %s", line);
    }
    std::fclose(f);
  }
  return host;
}

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
  Options o;
  if (!ParseOptions(argc, argv, o)) return 2;
  constexpr size_t kBytes = 64ull << 20;
  void* host = PinnedHost(kBytes, o.huge);
  void* dev = nullptr;
  CK(cudaMalloc(&dev, kBytes));
  CK(cudaMemset(dev, 1, kBytes));
  std::memset(host, 2, kBytes);
  std::vector<cudaStream_t> streams(4);
  for (auto& s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t start, ends[4];
  CK(cudaEventCreate(&start));
  for (auto& e : ends) CK(cudaEventCreate(&e));
  std::mt19937_64 rng(7);
  std::printf(
      "probe-blocks: block lists, 64 MiB a list, the device side shuffled, the host side %s, %s; GB/s median "
      "[min, max] of 9\n",
      o.host_shuffled ? "shuffled" : "in order",
      o.huge ? "anonymous memory on huge pages, registered" : "cudaHostAlloc memory");
  std::printf("columns: the GPU's time (events), the host's (the first call to the end seen), and the calls' own "
              "time a block\n");
  const std::vector<size_t> blocks =
      o.only_block != 0 ? std::vector<size_t>{o.only_block}
                        : std::vector<size_t>{size_t{16} << 10, size_t{64} << 10, size_t{256} << 10};
  for (const size_t block : blocks) {
    const size_t n = kBytes / block;
    for (const bool h2d : {true, false}) {
      std::vector<size_t> order(n), host_order(n);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::iota(host_order.begin(), host_order.end(), 0);
      if (o.host_shuffled) std::shuffle(host_order.begin(), host_order.end(), rng);
      List l;
      for (size_t i = 0; i < n; ++i) {
        char* h = static_cast<char*>(host) + host_order[i] * block;
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
        std::vector<double> rates, host_rates, call_us;
        for (int rep = 0; rep < 11; ++rep) {
          const double t0 = Now();
          CK(cudaEventRecord(start, streams[0]));
          for (size_t k = 1; k < v.streams; ++k) CK(cudaStreamWaitEvent(streams[k], start, 0));
          for (size_t k = 0; k < v.streams; ++k) {
            IssuePart(l, n * k / v.streams, n * (k + 1) / v.streams, v.how, streams[k], kind);
            CK(cudaEventRecord(ends[k], streams[k]));
          }
          for (size_t k = 1; k < v.streams; ++k) CK(cudaStreamWaitEvent(streams[0], ends[k], 0));
          CK(cudaEventRecord(ends[0], streams[0]));
          const double t_called = Now();
          CK(cudaEventSynchronize(ends[0]));
          const double t_end = Now();
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, start, ends[0]));
          if (rep >= 2) {
            rates.push_back(static_cast<double>(kBytes) / (ms * 1e-3) / 1e9);
            host_rates.push_back(static_cast<double>(kBytes) / (t_end - t0) / 1e9);
            call_us.push_back((t_called - t0) * 1e6 / static_cast<double>(n));
          }
        }
        std::sort(rates.begin(), rates.end());
        std::sort(host_rates.begin(), host_rates.end());
        std::sort(call_us.begin(), call_us.end());
        std::printf("%4zu x %3zu KiB %s  %-27s %6.2f [%6.2f, %6.2f]  host %6.2f [%6.2f, %6.2f]  calls %5.2f us a block\n",
                    n, block >> 10, h2d ? "h2d" : "d2h", v.name, rates[rates.size() / 2], rates.front(), rates.back(),
                    host_rates[host_rates.size() / 2], host_rates.front(), host_rates.back(),
                    call_us[call_us.size() / 2]);
      }
    }
  }
  return 0;
}
