// The machine's own limit for a pinned pool, no ferryd: one shared-memory file of N GiB (as
// ferryd's slabs are) mapped and faulted in by 1 thread, then by every usable CPU (each a
// contiguous share, MADV_POPULATE_WRITE), with MADV_HUGEPAGE asked; then cudaHostRegister of the
// whole range. ferry's start-up is measured against these in the same run. The CUDA context
// (which registering needs) is made first and timed apart: "+context" adds it, the least any
// process that pins memory for a GPU spends. With --once GIB: one process doing only what a
// pool's start must (the context, the fault-in with every CPU, the registration), printing
// "registered" once the bytes are pinned, so that a script times it from the process's start as
// it times ferryd's (bench/gpu/pool-start.sh).
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/probes/probe_util.hpp"

namespace {

unsigned Cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? static_cast<unsigned>(CPU_COUNT(&set)) : 1;
}

// Seconds to map and fault in n bytes of a fresh memfd with `threads` threads.
double FaultIn(uint64_t n, unsigned threads, std::byte** out) {
  const double t0 = Now();
  const int fd = memfd_create("probe-pool", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(n)) != 0) std::perror("memfd"), std::exit(1);
  void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) std::perror("mmap"), std::exit(1);
  close(fd);
  madvise(m, n, MADV_HUGEPAGE);
  auto* p = static_cast<std::byte*>(m);
  const uint64_t share = (n / threads + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  std::vector<std::thread> ts;
  for (uint64_t off = 0; off < n; off += share) {
    ts.emplace_back([p, off, len = std::min(share, n - off)] {
      if (madvise(p + off, len, MADV_POPULATE_WRITE) != 0) {
        for (uint64_t i = 0; i < len; i += 4096) p[off + i] = std::byte{0};
      }
    });
  }
  for (auto& t : ts) t.join();
  *out = p;
  return Now() - t0;
}

}  // namespace

// The start of a process that pins `gib` GiB for a GPU, and nothing else.
int Once(uint64_t gib) {
  const double t0 = Now();
  CK(cudaFree(nullptr));
  const double context = Now() - t0;
  std::byte* p = nullptr;
  const uint64_t n = gib << 30;
  const double all = FaultIn(n, Cpus(), &p);
  const double t1 = Now();
  CK(cudaHostRegister(p, n, cudaHostRegisterPortable));
  const double reg = Now() - t1;
  std::printf("registered: %llu GiB; context %.3f s, fault-in %.3f s (%u CPUs), register %.3f s\n",
              static_cast<unsigned long long>(gib), context, all, Cpus(), reg);
  std::fflush(stdout);
  CK(cudaHostUnregister(p));
  munmap(p, n);
  return 0;
}

int main(int argc, char** argv) {
  if (AskedForHelp(argc, argv,
                   "usage: probe-pool [GIB ...]\n"
                   "       probe-pool --once GIB\n"
                   "Maps and faults in a shared-memory file of each size (default 2 48) with one thread and\n"
                   "with every usable CPU, then cudaHostRegisters it: the machine's own limit for a pool.\n"
                   "--once: only the CUDA context, the fault-in with every CPU and the registration of one\n"
                   "size, then \"registered: ...\" on stdout: a pool's start, to be timed from outside.")) {
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--once") == 0) return Once(std::strtoull(argv[2], nullptr, 10));
  std::vector<uint64_t> gib;
  for (int i = 1; i < argc; ++i) gib.push_back(std::strtoull(argv[i], nullptr, 10));
  if (gib.empty()) gib = {2, 48};
  const double t_context = Now();
  CK(cudaFree(nullptr));  // the CUDA context (the driver loaded and initialized), timed apart
  const double context = Now() - t_context;
  const unsigned cpus = Cpus();
  std::printf("probe-pool: %u usable CPUs; sizes in GiB; seconds; the CUDA context made in %.3f s\n", cpus, context);
  std::printf("%6s %12s %12s %10s %12s %14s %14s\n", "GiB", "1 thread", "all CPUs", "GiB/s", "register", "all+register",
              "+context");
  for (uint64_t g : gib) {
    const uint64_t n = g << 30;
    std::byte* p = nullptr;
    const double one = g <= 8 ? FaultIn(n, 1, &p) : -1;  // one thread only where it is quick
    if (p != nullptr) munmap(p, n);
    const double all = FaultIn(n, cpus, &p);
    const double t0 = Now();
    CK(cudaHostRegister(p, n, cudaHostRegisterPortable));
    const double reg = Now() - t0;
    CK(cudaHostUnregister(p));
    munmap(p, n);
    std::printf("%6llu %12.3f %12.3f %10.1f %12.3f %14.3f %14.3f\n", static_cast<unsigned long long>(g), one, all,
                static_cast<double>(g) / all, reg, all + reg, context + all + reg);
  }
  return 0;
}
