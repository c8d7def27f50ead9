// ferry-bench host-copy: how fast this host copies memory, the bound on Client::CopyStaged.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_commands.hpp"
#include "bench/bench_util.hpp"
#include "client/streaming_copy.hpp"
#include "common/cli.hpp"

namespace ferry::bench {
namespace {

constexpr const char* kHostCopyUsage = R"(usage: ferry-bench host-copy [--threads N,N,...]

How fast this host copies memory, which bounds Client::CopyStaged: each of N threads copies
256 MiB of touched pageable memory in 2 MiB chunks into a ring of 8 shared-memory chunks (what
a staging worker does), with plain memcpy and with streaming stores (FERRY_STAGED_COPY);
best of 5 passes, summed over the threads. No GPU needed.

options:
  --threads N,N,...  thread counts to try (default 1,4,8,12,16)
  -h, --help         this help
)";

}  // namespace

int HostCopy(const std::vector<std::string>& args) {
  std::vector<int> counts{1, 4, 8, 12, 16};
  cli::Args a(args);
  while (a.Next()) {
    if (a.IsHelp()) {
      return cli::Help(kHostCopyUsage);
    } else if (a.Is("--threads") && a.HasValue()) {
      counts.clear();
      std::string list = a.Value() + ",";
      for (size_t b = 0, e; (e = list.find(',', b)) != std::string::npos; b = e + 1) {
        const int n = std::atoi(list.substr(b, e - b).c_str());
        if (n < 1 || n > 256) {
          std::fprintf(stderr, "ferry-bench host-copy: --threads takes counts from 1 to 256\n");
          return 64;
        }
        counts.push_back(n);
      }
    } else {
      std::fprintf(stderr, "ferry-bench host-copy: unknown option '%s' (try --help)\n", a.current().c_str());
      return 64;
    }
  }
  constexpr size_t kChunk = 2 << 20, kPerThread = 256ull << 20, kRing = 8;
  for (int threads : counts) {
    for (bool streaming : {false, true}) {
      std::vector<double> gbps(static_cast<size_t>(threads));
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          std::vector<std::byte> src(kPerThread, std::byte(t + 1));
          void* ring = ::mmap(nullptr, kRing * kChunk, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
          if (ring == MAP_FAILED) return;
          auto* dst = static_cast<std::byte*>(ring);
          std::memset(dst, 0, kRing * kChunk);
          double best = 0;
          for (int rep = 0; rep < 5; ++rep) {
            const double t0 = NowSeconds();
            for (size_t off = 0; off < kPerThread; off += kChunk) {
              std::byte* d = dst + (off / kChunk % kRing) * kChunk;
              if (streaming) {
                ferry::detail::StreamingCopy(d, src.data() + off, kChunk);
              } else {
                std::memcpy(d, src.data() + off, kChunk);
              }
            }
            best = std::max(best, static_cast<double>(kPerThread) / (NowSeconds() - t0) / 1e9);
          }
          gbps[static_cast<size_t>(t)] = best;
          ::munmap(ring, kRing * kChunk);
        });
      }
      for (auto& t : ts) t.join();
      double sum = 0;
      for (double g : gbps) sum += g;
      std::printf("%-9s %3d threads: %6.1f GB/s copied (%.1f a thread)\n", streaming ? "streaming" : "memcpy", threads,
                  sum, sum / threads);
    }
  }
  return 0;
}

}  // namespace ferry::bench
