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
// --h2d-ways asks what bounds a small host-to-device list, by the host clock: each source access
// order; batches issued by several threads at once; a CPU gather, one copy and a device scatter.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "bench/probes/probe_util.hpp"

namespace {

constexpr const char* kUsage = R"(usage: probe-blocks [--host-shuffled] [--huge] [--block KIB] [--h2d-ways]

Times lists of small blocks (4096 x 16 KiB, 1024 x 64 KiB, 256 x 256 KiB; the device side
shuffled) both ways through the copy engines: one stream's loop and batch, and the list cut
over 2 to 4 streams.

options:
  --host-shuffled  shuffle the host side too (default: the host side in order)
  --huge           the host side on transparent huge pages (anonymous memory, madvise, then
                   cudaHostRegister; default: cudaHostAlloc)
  --block KIB      this block size alone (any number of KiB dividing 64 MiB)
  --h2d-ways       host-to-device only, other ways to issue a list: one batch with each source
                   access order; batches issued by 2, 4 and 8 host threads at once, each on its own
                   stream; the blocks gathered by the CPU into contiguous pinned memory (1 and 4
                   threads, 4 MiB at a time), each 4 MiB copied whole, then scattered on the device
                   by a device-to-device batch; that scatter alone
  -h, --help       this help)";

struct Options {
  bool host_shuffled = false, huge = false, h2d_ways = false;
  size_t only_block = 0;  // bytes; 0: every size
};

// False (after saying why) for an option it does not know.
bool ParseOptions(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--host-shuffled") == 0) {
      o.host_shuffled = true;
    } else if (std::strcmp(argv[i], "--huge") == 0) {
      o.huge = true;
    } else if (std::strcmp(argv[i], "--h2d-ways") == 0) {
      o.h2d_ways = true;
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

enum class How { kLoop, kBatchEngines, kBatchAny, kBatchOrderAny, kBatchOrderDuringCall };

void IssuePart(const List& l, size_t begin, size_t end, How how, cudaStream_t s, cudaMemcpyKind kind) {
  if (how == How::kLoop) {
    for (size_t i = begin; i < end; ++i) CK(cudaMemcpyAsync(l.dst[i], l.src[i], l.size[i], kind, s));
    return;
  }
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = how == How::kBatchOrderAny          ? cudaMemcpySrcAccessOrderAny
                        : how == How::kBatchOrderDuringCall ? cudaMemcpySrcAccessOrderDuringApiCall
                                                            : cudaMemcpySrcAccessOrderStream;
  attr.flags = how == How::kBatchAny ? 0 : cudaMemcpyFlagPreferOverlapWithCompute;
  size_t idx = 0;
  CK(cudaMemcpyBatchAsync(const_cast<void**>(l.dst.data() + begin), const_cast<void**>(l.src.data() + begin),
                          const_cast<size_t*>(l.size.data() + begin), end - begin, &attr, &idx, 1, s));
}

// Host-clock timing of one way to move a list: `issue` makes the calls and returns, then the
// streams are synchronized. Prints the median GB/s of 9 (after 2 untimed) with min and max, and
// the calls' own time a block.
template <typename Issue>
void TimeByHost(const char* name, size_t n, size_t block, const std::vector<cudaStream_t>& streams, Issue issue) {
  std::vector<double> host_rates, call_us;
  for (int rep = 0; rep < 11; ++rep) {
    const double t0 = Now();
    issue();
    const double t_called = Now();
    for (cudaStream_t s : streams) CK(cudaStreamSynchronize(s));
    const double t_end = Now();
    if (rep < 2) continue;
    host_rates.push_back(static_cast<double>(n * block) / (t_end - t0) / 1e9);
    call_us.push_back((t_called - t0) * 1e6 / static_cast<double>(n));
  }
  std::sort(host_rates.begin(), host_rates.end());
  std::sort(call_us.begin(), call_us.end());
  std::printf("%4zu x %3zu KiB h2d  %-40s host %6.2f [%6.2f, %6.2f]  calls %5.2f us a block\n", n, block >> 10, name,
              host_rates[host_rates.size() / 2], host_rates.front(), host_rates.back(), call_us[call_us.size() / 2]);
  std::fflush(stdout);
}

// --h2d-ways: other ways to issue one host-to-device list `l` of n blocks (see the usage).
void H2dWays(const List& l, size_t n, size_t block, const std::vector<cudaStream_t>& streams) {
  const std::vector<cudaStream_t> one{streams[0]};
  TimeByHost("1 stream, batch, source order stream", n, block, one,
             [&] { IssuePart(l, 0, n, How::kBatchEngines, streams[0], cudaMemcpyHostToDevice); });
  TimeByHost("1 stream, batch, source order any", n, block, one,
             [&] { IssuePart(l, 0, n, How::kBatchOrderAny, streams[0], cudaMemcpyHostToDevice); });
  TimeByHost("1 stream, batch, source order during call", n, block, one,
             [&] { IssuePart(l, 0, n, How::kBatchOrderDuringCall, streams[0], cudaMemcpyHostToDevice); });
  TimeByHost("1 stream, loop", n, block, one,
             [&] { IssuePart(l, 0, n, How::kLoop, streams[0], cudaMemcpyHostToDevice); });
  for (const size_t threads : {size_t{2}, size_t{4}, size_t{8}}) {
    const std::vector<cudaStream_t> used(streams.begin(), streams.begin() + threads);
    char name[64];
    std::snprintf(name, sizeof name, "%zu threads, a batch each", threads);
    TimeByHost(name, n, block, used, [&] {
      std::vector<std::thread> ts;
      for (size_t k = 0; k < threads; ++k)
        ts.emplace_back([&, k] {
          IssuePart(l, n * k / threads, n * (k + 1) / threads, How::kBatchEngines, streams[k], cudaMemcpyHostToDevice);
        });
      for (auto& t : ts) t.join();
    });
  }
  // Gathered: contiguous pinned staging and a device staging of the list's size.
  const size_t bytes = n * block;
  void* stage_host = nullptr;
  void* stage_dev = nullptr;
  CK(cudaHostAlloc(&stage_host, bytes, cudaHostAllocDefault));
  CK(cudaMalloc(&stage_dev, bytes));
  std::memset(stage_host, 0, bytes);
  const size_t per_chunk = std::max<size_t>(1, (size_t{4} << 20) / block);
  const size_t chunks = (n + per_chunk - 1) / per_chunk;
  std::vector<void*> scatter_src(n), scatter_dst(l.dst);
  std::vector<size_t> scatter_size(n, block);
  for (size_t i = 0; i < n; ++i) scatter_src[i] = static_cast<char*>(stage_dev) + i * block;
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  auto issue_chunk = [&](size_t c) {
    const size_t b = c * per_chunk, e = std::min(n, b + per_chunk);
    CK(cudaMemcpyAsync(static_cast<char*>(stage_dev) + b * block, static_cast<char*>(stage_host) + b * block,
                       (e - b) * block, cudaMemcpyHostToDevice, streams[0]));
    size_t idx = 0;
    CK(cudaMemcpyBatchAsync(scatter_dst.data() + b, scatter_src.data() + b, scatter_size.data() + b, e - b, &attr, &idx,
                            1, streams[0]));
  };
  TimeByHost("device scatter alone (d2d batches of 4 MiB)", n, block, one, [&] {
    for (size_t c = 0; c < chunks; ++c) {
      const size_t b = c * per_chunk, e = std::min(n, b + per_chunk);
      size_t idx = 0;
      CK(cudaMemcpyBatchAsync(scatter_dst.data() + b, scatter_src.data() + b, scatter_size.data() + b, e - b, &attr,
                              &idx, 1, streams[0]));
    }
  });
  for (const size_t threads : {size_t{1}, size_t{4}}) {
    char name[64];
    std::snprintf(name, sizeof name, "gathered by %zu thread%s, copied, scattered", threads, threads == 1 ? "" : "s");
    TimeByHost(name, n, block, one, [&] {
      std::vector<std::atomic<size_t>> done(chunks);
      for (auto& d : done) d.store(0);
      auto gather = [&](size_t k) {
        for (size_t c = 0; c < chunks; ++c) {
          const size_t b = c * per_chunk, e = std::min(n, b + per_chunk);
          for (size_t i = b + k; i < e; i += threads)
            std::memcpy(static_cast<char*>(stage_host) + i * block, l.src[i], block);
          done[c].fetch_add(1, std::memory_order_release);
        }
      };
      std::vector<std::thread> ts;
      for (size_t k = 1; k < threads; ++k) ts.emplace_back(gather, k);
      if (threads == 1) {
        for (size_t c = 0; c < chunks; ++c) {
          const size_t b = c * per_chunk, e = std::min(n, b + per_chunk);
          for (size_t i = b; i < e; ++i) std::memcpy(static_cast<char*>(stage_host) + i * block, l.src[i], block);
          issue_chunk(c);
        }
      } else {
        for (size_t c = 0; c < chunks; ++c) {
          const size_t b = c * per_chunk, e = std::min(n, b + per_chunk);
          for (size_t i = b; i < e; i += threads)  // the issuing thread's own share of the chunk
            std::memcpy(static_cast<char*>(stage_host) + i * block, l.src[i], block);
          while (done[c].load(std::memory_order_acquire) != threads - 1) std::this_thread::yield();
          issue_chunk(c);
        }
      }
      for (auto& t : ts) t.join();
    });
  }
  CK(cudaStreamSynchronize(streams[0]));
  CK(cudaFreeHost(stage_host));
  CK(cudaFree(stage_dev));
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
  std::vector<cudaStream_t> streams(8);
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
  std::printf(o.h2d_ways
                  ? "columns: the host's time (the first call to the end seen) and the calls' own time a block\n"
                  : "columns: the GPU's time (events), the host's (the first call to the end seen), and the calls' "
                    "own time a block\n");
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
      if (o.h2d_ways) {
        if (h2d) H2dWays(l, n, block, streams);
        continue;
      }
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
