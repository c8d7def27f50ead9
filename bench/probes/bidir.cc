// Both directions at once, 256 MiB each way: in this process vs in a second process on device
// memory opened by CUDA IPC (as ferryd does), with host memory from cudaMallocHost or
// mmap+cudaHostRegister, whole copies or 64 MiB pieces over two streams a direction.
// Run with no arguments: it runs the baselines and starts itself again as the second process.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/probes/probe_util.hpp"

static constexpr size_t kN = 256ull << 20;

struct Streams {
  cudaStream_t s[2][2];
  Streams() {
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    for (auto& d : s)
      for (auto& x : d) CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  }
};

// host: 2n bytes; dev: 2n bytes. pieces: 1 (whole copies on one stream a direction) or 4.
static void Measure(const char* name, std::byte* host, std::byte* dev, int pieces, int reps, Streams& st) {
  std::vector<double> gbps;
  for (int r = -2; r < reps; ++r) {
    const double t0 = Now();
    const size_t p = kN / pieces;
    for (int i = 0; i < pieces; ++i) {
      CK(cudaMemcpyAsync(dev + i * p, host + i * p, p, cudaMemcpyHostToDevice, st.s[0][i % 2]));
      CK(cudaMemcpyAsync(host + kN + i * p, dev + kN + i * p, p, cudaMemcpyDeviceToHost, st.s[1][i % 2]));
    }
    for (auto& d : st.s)
      for (auto& x : d) CK(cudaStreamSynchronize(x));
    if (r >= 0) gbps.push_back(2.0 * kN / (Now() - t0) / 1e9);
  }
  std::sort(gbps.begin(), gbps.end());
  std::printf("%-40s %7.2f GB/s [%6.2f, %6.2f]\n", name, gbps[gbps.size() / 2], gbps.front(), gbps.back());
  std::fflush(stdout);
}

static std::byte* Registered() {
  void* p = mmap(nullptr, 2 * kN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::_Exit(2);
  std::memset(p, 1, 2 * kN);
  CK(cudaHostRegister(p, 2 * kN, cudaHostRegisterPortable));
  return static_cast<std::byte*>(p);
}

int main(int argc, char** argv) {
  if (AskedForHelp(
          argc, argv,
          "usage: probe-bidir\n\nBoth directions at once, 256 MiB each way: in this process vs in a second process on "
          "device\nmemory opened by CUDA IPC (as ferryd does), with host memory from cudaMallocHost "
          "or\nmmap+cudaHostRegister, whole copies or 64 MiB pieces over two streams a direction.\nRun with no "
          "arguments: it runs the baselines and starts itself again as the second process."))
    return 0;
  const int reps = 30;
  if (argc == 3 && std::strcmp(argv[1], "user") == 0) {
    cudaIpcMemHandle_t h;
    FILE* f = std::fopen(argv[2], "rb");
    if (!f || std::fread(&h, sizeof h, 1, f) != 1) return 3;
    std::fclose(f);
    CK(cudaSetDevice(0));
    void* ipc;
    CK(cudaIpcOpenMemHandle(&ipc, h, cudaIpcMemLazyEnablePeerAccess));
    void* own;
    CK(cudaMalloc(&own, 2 * kN));
    void* pinned;
    CK(cudaMallocHost(&pinned, 2 * kN));
    std::memset(pinned, 1, 2 * kN);
    std::byte* reg = Registered();
    Streams st;
    auto* P = static_cast<std::byte*>(pinned);
    auto* I = static_cast<std::byte*>(ipc);
    auto* O = static_cast<std::byte*>(own);
    Measure("user: own dev, pinned, whole", P, O, 1, reps, st);
    Measure("user: ipc dev, pinned, whole", P, I, 1, reps, st);
    Measure("user: ipc dev, registered, whole", reg, I, 1, reps, st);
    Measure("user: ipc dev, registered, 4 pieces", reg, I, 4, reps, st);
    Measure("user: own dev, registered, 4 pieces", reg, O, 4, reps, st);
    Measure("user: own dev, pinned, whole (again)", P, O, 1, reps, st);
    Measure("user: ipc dev, pinned, whole (again)", P, I, 1, reps, st);
    {
      // As in ferryd: more streams at two priorities, and a thread polling events all along.
      int lo, hi;
      CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
      std::vector<cudaStream_t> extra(16);
      for (size_t i = 0; i < extra.size(); ++i)
        CK(cudaStreamCreateWithPriority(&extra[i], cudaStreamNonBlocking, i % 8 == 0 ? hi : lo));
      Measure("user: ipc dev, registered, 4 pieces, +16 streams", reg, I, 4, reps, st);
      std::atomic<bool> stop{false};
      cudaEvent_t ev;
      CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      std::thread poller([&] {
        while (!stop.load()) {
          cudaEventRecord(ev, st.s[0][0]);
          while (!stop.load() && cudaEventQuery(ev) == cudaErrorNotReady) {
          }
        }
      });
      Measure("user: ipc dev, registered, 4 pieces, +poller", reg, I, 4, reps, st);
      Measure("user: ipc dev, pinned, whole, +poller", P, I, 1, reps, st);
      stop = true;
      poller.join();
      Measure("user: ipc dev, pinned, whole (after poller)", P, I, 1, reps, st);
    }
    return 0;
  }
  CK(cudaSetDevice(0));
  void* dev;
  CK(cudaMalloc(&dev, 2 * kN));
  void* pinned;
  CK(cudaMallocHost(&pinned, 2 * kN));
  std::memset(pinned, 1, 2 * kN);
  std::byte* reg = Registered();
  cudaIpcMemHandle_t h;
  CK(cudaIpcGetMemHandle(&h, dev));
  const std::string file = "/tmp/probe_bidir." + std::to_string(getpid()) + ".handle";
  FILE* f = std::fopen(file.c_str(), "wb");
  std::fwrite(&h, sizeof h, 1, f);
  std::fclose(f);
  Streams st;
  auto* P = static_cast<std::byte*>(pinned);
  auto* D = static_cast<std::byte*>(dev);
  for (int round = 0; round < 3; ++round) {
    std::printf("-- round %d\n", round);
    Measure("owner: pinned, whole", P, D, 1, reps, st);
    Measure("owner: registered, whole", reg, D, 1, reps, st);
    Measure("owner: registered, 4 pieces", reg, D, 4, reps, st);
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      execl("/proc/self/exe", argv[0], "user", file.c_str(), nullptr);
      std::_Exit(4);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (status != 0) std::printf("user exited %d\n", status);
    Measure("owner: pinned, whole (after)", P, D, 1, reps, st);
  }
  return 0;
}
