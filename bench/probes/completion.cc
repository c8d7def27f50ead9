// How fast a host learns that a small copy is done, and how fast a stream starts once another
// party says go, without ferry: the costs a copy service pays on top of a copy.
//  - 4 KiB round trips: cudaMemcpyAsync then cudaStreamSynchronize; then a cudaStreamQuery spin;
//    then a 32-bit word the stream writes after the copy (cuStreamWriteValue32 into mapped host
//    memory) that the host spins on.
//  - The calls themselves: cudaMemcpyAsync, cuStreamWriteValue32, cudaStreamQuery of an idle
//    stream, cudaEventRecord.
//  - Hand-off: a stream parked on cuStreamWaitValue32 over a host word, then a 4 KiB copy and a
//    done word; from the host's write of the word to the done word seen. Then the same with the
//    word written by another process's stream (cuStreamWriteValue32 into a shared page).
// Prints medians with p99 and min, in microseconds.
#include <cuda.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "bench/probes/probe_util.hpp"
#include "bench/probes/stream_memops.hpp"

namespace {

void Print(const char* what, std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  std::printf("%-58s p50 %7.2f  p99 %7.2f  min %7.2f us\n", what, us[us.size() / 2], us[us.size() * 99 / 100], us[0]);
}

// A host word the GPU can read and write: mapped, with its device address.
struct MappedWords {
  volatile uint32_t* host = nullptr;
  CUdeviceptr dev = 0;
};
MappedWords Map(void* page) { return {static_cast<volatile uint32_t*>(page), MapPage(page)}; }

}  // namespace

int main(int argc, char** argv) {
  if (AskedForHelp(argc, argv, "probe-completion: small-copy completion and hand-off costs; no arguments")) return 0;
  constexpr size_t kBytes = 4096;
  constexpr int kReps = 5000;
  // Before any CUDA call: a child forked after CUDA starts cannot use it.
  // Shared with a child process: page 0 holds its "go" word (host), page 1 the flag its stream writes.
  auto* shared = static_cast<std::byte*>(
      mmap(nullptr, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  auto* go = reinterpret_cast<std::atomic<uint32_t>*>(shared);
  go->store(0);

  // Page 0: [0] go (the command's sequence number), [1] mode (0: write the host flag from the
  // stream, 1: write the device flag, 2: record the event), [2] handles ready; then at 64 the
  // device flag's IPC handle, at 128 the event's.
  auto* mode = reinterpret_cast<std::atomic<uint32_t>*>(shared + 4);
  auto* ready = reinterpret_cast<std::atomic<uint32_t>*>(shared + 8);
  auto* ack = reinterpret_cast<std::atomic<uint32_t>*>(shared + 12);  // mode 2: the record was made
  pid_t child = fork();
  if (child == 0) {
    // The other process: its own CUDA context; it writes the flag from its stream when told.
    CK(cudaSetDevice(0));
    LoadDriverEntryPoints();
    cudaStream_t cs;
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    MappedWords flag = Map(shared + 4096);
    while (ready->load(std::memory_order_acquire) == 0) Relax();
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
    std::memcpy(&mh, shared + 64, sizeof mh);
    std::memcpy(&eh, shared + 128, sizeof eh);
    void* dflag = nullptr;
    cudaEvent_t ev;
    CK(cudaIpcOpenMemHandle(&dflag, mh, cudaIpcMemLazyEnablePeerAccess));
    CK(cudaIpcOpenEventHandle(&ev, eh));
    for (uint32_t i = 1;; ++i) {
      uint32_t g;
      while ((g = go->load(std::memory_order_acquire)) < i) Relax();
      if (g == UINT32_MAX) break;
      const uint32_t m = mode->load(std::memory_order_relaxed);
      if (m == 0) CkCu(write_value(cs, flag.dev, i, 0), "child cuStreamWriteValue32");
      if (m == 1) CkCu(write_value(cs, reinterpret_cast<CUdeviceptr>(dflag), i, 0), "child cuStreamWriteValue32 (device)");
      if (m == 2) {
        CK(cudaEventRecord(ev, cs));
        ack->store(i, std::memory_order_release);
      }
      CK(cudaStreamSynchronize(cs));
    }
    std::_Exit(0);
  }

  CK(cudaSetDevice(0));
  LoadDriverEntryPoints();
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s;
  CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi));
  void* pinned = nullptr;
  void* dev = nullptr;
  CK(cudaHostAlloc(&pinned, kBytes, cudaHostAllocDefault));
  CK(cudaMalloc(&dev, kBytes));
  void* own_page = MapPrivateWordPage();  // [0]: the done word, [1]: a flag the host writes
  MappedWords mine = Map(own_page);
  MappedWords theirs = Map(shared + 4096);
  void* dflag = nullptr;
  CK(cudaMalloc(&dflag, 4096));
  CK(cudaMemset(dflag, 0, 4096));
  cudaEvent_t ipc_event;
  CK(cudaEventCreateWithFlags(&ipc_event, cudaEventDisableTiming | cudaEventInterprocess));
  cudaIpcMemHandle_t mh;
  cudaIpcEventHandle_t eh;
  CK(cudaIpcGetMemHandle(&mh, dflag));
  CK(cudaIpcGetEventHandle(&eh, ipc_event));
  std::memcpy(shared + 64, &mh, sizeof mh);
  std::memcpy(shared + 128, &eh, sizeof eh);
  ready->store(1, std::memory_order_release);
  for (int dir = 0; dir < 2; ++dir) {
    const char* d = dir == 0 ? "h2d" : "d2h";
    auto copy = [&] {
      CK(dir == 0 ? cudaMemcpyAsync(dev, pinned, kBytes, cudaMemcpyHostToDevice, s)
                  : cudaMemcpyAsync(pinned, dev, kBytes, cudaMemcpyDeviceToHost, s));
    };
    std::vector<double> sync, query, word, call;
    uint32_t seq = 0;
    for (int r = -200; r < kReps; ++r) {
      double t0 = Now();
      copy();
      CK(cudaStreamSynchronize(s));
      if (r >= 0) sync.push_back((Now() - t0) * 1e6);
      t0 = Now();
      copy();
      while (cudaStreamQuery(s) == cudaErrorNotReady) {
      }
      if (r >= 0) query.push_back((Now() - t0) * 1e6);
      t0 = Now();
      copy();
      ++seq;
      CkCu(write_value(s, mine.dev, seq, 0), "cuStreamWriteValue32");
      while (mine.host[0] != seq) Relax();
      if (r >= 0) word.push_back((Now() - t0) * 1e6);
      CK(cudaStreamSynchronize(s));
      t0 = Now();
      copy();
      if (r >= 0) call.push_back((Now() - t0) * 1e6);
      CK(cudaStreamSynchronize(s));
    }
    char what[96];
    std::snprintf(what, sizeof what, "4 KiB %s: memcpy + cudaStreamSynchronize", d);
    Print(what, sync);
    std::snprintf(what, sizeof what, "4 KiB %s: memcpy + cudaStreamQuery spin", d);
    Print(what, query);
    std::snprintf(what, sizeof what, "4 KiB %s: memcpy + done word the stream writes", d);
    Print(what, word);
    std::snprintf(what, sizeof what, "4 KiB %s: the cudaMemcpyAsync call alone", d);
    Print(what, call);

    // Hand-off from a host write: the stream waits for flag >= seq, copies, writes done = seq.
    std::vector<double> host_go, proc_go;
    for (int r = -200; r < kReps; ++r) {
      ++seq;
      CkCu(wait_value(s, mine.dev + 4, seq, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
      copy();
      CkCu(write_value(s, mine.dev, seq, 0), "cuStreamWriteValue32");
      for (const double parked = Now(); Now() - parked < 30e-6;) {  // the stream reaches its wait
      }
      const double t0 = Now();
      mine.host[1] = seq;
      while (mine.host[0] != seq) Relax();
      if (r >= 0) host_go.push_back((Now() - t0) * 1e6);
    }
    std::snprintf(what, sizeof what, "4 KiB %s after a host-written flag (wait value)", d);
    Print(what, host_go);
    // Hand-off from another process: its stream writes a host flag (0) or a device flag (1) that
    // this stream waits on; or (2) it records an event this host polls, then issues the copy.
    static uint32_t child_seq = 0;
    const char* how[3] = {"another process's stream writes a host flag", "another process's stream writes a device flag",
                          "host polls another process's event, then issues"};
    for (uint32_t m = 0; m < 3; ++m) {
      mode->store(m, std::memory_order_relaxed);
      std::vector<double> proc_go;
      for (int r = -200; r < kReps; ++r) {
        ++seq;
        ++child_seq;
        if (m < 2) {
          const CUdeviceptr f = m == 0 ? theirs.dev : reinterpret_cast<CUdeviceptr>(dflag);
          CkCu(wait_value(s, f, child_seq, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
          copy();
          CkCu(write_value(s, mine.dev, seq, 0), "cuStreamWriteValue32");
        }
        for (const double parked = Now(); Now() - parked < 30e-6;) {  // the stream reaches its wait
        }
        const double t0 = Now();
        go->store(child_seq, std::memory_order_release);
        if (m == 2) {
          // An event not yet recorded again reads as done: first see the child's record made.
          while (ack->load(std::memory_order_acquire) != child_seq) Relax();
          while (cudaEventQuery(ipc_event) == cudaErrorNotReady) {
          }
          copy();
          CkCu(write_value(s, mine.dev, seq, 0), "cuStreamWriteValue32");
        }
        while (mine.host[0] != seq) Relax();
        if (r >= 0) proc_go.push_back((Now() - t0) * 1e6);
        CK(cudaStreamSynchronize(s));
      }
      std::snprintf(what, sizeof what, "4 KiB %s: %s", d, how[m]);
      Print(what, proc_go);
    }
  }
  std::vector<double> wv, q, rec;
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (int r = 0; r < kReps; ++r) {
    double t0 = Now();
    CkCu(write_value(s, mine.dev + 8, r, 0), "cuStreamWriteValue32");
    wv.push_back((Now() - t0) * 1e6);
    CK(cudaStreamSynchronize(s));
    t0 = Now();
    (void)cudaStreamQuery(s);
    q.push_back((Now() - t0) * 1e6);
    t0 = Now();
    CK(cudaEventRecord(e, s));
    rec.push_back((Now() - t0) * 1e6);
    CK(cudaStreamSynchronize(s));
  }
  Print("the cuStreamWriteValue32 call alone", wv);
  Print("cudaStreamQuery of an idle stream", q);
  Print("the cudaEventRecord call alone", rec);
  std::vector<double> eq;
  for (int r = 0; r < kReps; ++r) {
    const double t0 = Now();
    (void)cudaEventQuery(e);
    eq.push_back((Now() - t0) * 1e6);
  }
  Print("cudaEventQuery of a done event", eq);
  go->store(UINT32_MAX, std::memory_order_release);
  int status = 0;
  waitpid(child, &status, 0);
  return 0;
}
