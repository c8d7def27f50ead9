// ferry-bench: measures ferry against the in-process baseline, side by side, in one run.
//
//   ferry-bench transfer --socket /run/ferry/ferryd.sock [--daemon-pid PID] [--csv out.csv] [--json]
//
// transfer: for 4 KiB to 1 GiB, both directions and both at once, the same copies done in this
// process with cudaMemcpyAsync from cudaMallocHost memory, and through ferryd from its pinned
// pool into the same device memory. Host clock, submit to completion seen; warm-up first; the
// median with min and max. Small copies: p50/p99 latency. Many copies: 1024 x 64 KiB. Block
// lists: shuffled lists of 16 KiB to 256 KiB blocks. With --daemon-pid, ferryd's CPU use at
// idle. Every size's data is checked once byte for byte.
#include <cuda_runtime_api.h>
#include <sched.h>
#include <sys/mman.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_commands.hpp"
#include "bench/bench_util.hpp"
#include "bench/block_lists.hpp"
#include "bench/list_clients.hpp"
#include "bench/target_verdict.hpp"
#include "client/streaming_copy.hpp"
#include "common/byte_size.hpp"
#include "common/cli.hpp"
#include "common/json.hpp"
#include "ferry/client.hpp"

namespace ferry::bench {
namespace {

using namespace std::chrono_literals;
using ferry::bench::FillRandom;
using ferry::FormatByteSize;
using ferry::bench::NowSeconds;
using ferry::bench::Summarize;
using ferry::bench::Summary;

constexpr const char* kUsage = R"(usage: ferry-bench transfer [options]

Runs the same host<->device copies in this process (cudaMemcpyAsync from cudaMallocHost memory)
and through ferryd (its pinned pool, its copy streams), and prints them side by side.

options:
  --socket PATH      ferryd's control socket (default: $FERRY_SOCKET or /run/ferry/ferryd.sock)
  --max-size BYTES   largest copy (default 1073741824 = 1 GiB); ferryd's pool must hold it
  --daemon-pid PID   also measure ferryd's CPU use while idle (5 s)
  --csv FILE         write every sample as CSV (test,bytes,direction,path,rep,seconds)
  --json             print one JSON object instead of the tables
  --quick            fewer repetitions
  --cpu N            run on CPU N (put it near ferryd's, on the GPU's NUMA node)
  --device N         the GPU to copy to (a CUDA ordinal; default: the current device, 0); one
                     ferry-bench per GPU at once measures a node (bench/gpu/node.sh)
  --only LIST        only these sections, comma-separated: bandwidth, both, latency, many, blocks,
                     staged (staged: the pageable-memory section: cudaMemcpy, pin-then-copy, ferry
                     staged; blocks: shuffled block lists, a loop of cudaMemcpyAsync, one
                     cudaMemcpyBatchAsync and ferry's CopyBlocks; without a GPU, `--only blocks`
                     runs ferry's list copies alone against a ferryd on the host backend)
  --clients N        last, each of the blocks section's lists from N client processes at once
                     (2..8; `ferry-bench list-client`, each its own session of ferryd's, a pool
                     buffer of up to 128 MiB and a device region): one alone, then all started
                     together; each client's rate, the rate together and how much of the span
                     all of them were copying; every client checks every byte of its lists
  --staged-chunk B   CopyStaged chunk size (default: the policy's, fitted to the copy)
  --staged-threads N CopyStaged threads (default: the policy's)
  --timeline         print each both-ways copy's and each 4 KiB latency copy's (not the
                     alternating ones) submit and done times, and each run of the 1024
                     separate copies' start, first and last submission, first wait's end
                     and end (CLOCK_MONOTONIC ns) on stderr, to line up with the log of a
                     ferryd run with --trace-engine
  -h, --help         this help
)";

#define CUDA_OR_DIE(call)                                                                     \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "ferry-bench: %s: %s\n", #call, cudaGetErrorString(e_));           \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)
#define FERRY_OR_DIE(expr)                                                                    \
  do {                                                                                        \
    ::ferry::Status s_ = (expr);                                                              \
    if (!s_.ok()) {                                                                           \
      std::fprintf(stderr, "ferry-bench: %s: %s\n", #expr, s_.ToString().c_str());            \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

struct Sample {
  std::string test;
  size_t bytes;
  std::string direction, path;
  int rep;
  double seconds;
};

double ProcessCpuSeconds(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), {});
  auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<std::string> fields;
  size_t pos = close + 2;
  while (pos < stat.size()) {
    size_t sp = stat.find(' ', pos);
    fields.push_back(stat.substr(pos, sp - pos));
    if (sp == std::string::npos) break;
    pos = sp + 1;
  }
  if (fields.size() < 13) return -1;
  // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
  return (std::stod(fields[11]) + std::stod(fields[12])) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

class TransferBench {
 public:
  int Run(const std::vector<std::string>& args);

 private:
  int Setup();
  int Bandwidth();
  int Bidirectional();
  int Latency();
  int ManySmall();
  int Blocks();
  int Staged();
  void ListClients();
  int Verify(size_t n);
  void Report(bool json) const;
  void Add(const std::string& test, size_t bytes, const std::string& dir, const std::string& path, int rep, double s) {
    samples_.push_back({test, bytes, dir, path, rep, s});
  }
  Summary Gbps(const std::string& test, size_t bytes, const std::string& dir, const std::string& path,
               double factor = 1) const;
  Summary Micros(const std::string& test, const std::string& dir, const std::string& path) const;

  ferry::ConnectOptions opts_;
  size_t max_size_ = 1ull << 30;
  int daemon_pid_ = -1;
  int clients_ = 1;                          // --clients
  std::vector<ListClientsRow> client_rows_;  // their lists, when clients_ > 1
  std::string csv_;
  bool json_ = false, quick_ = false, timeline_ = false;
  std::vector<double> many_free_us_;  // freeing a run of separate copies' handles, microseconds
  std::set<std::string> sections_{"bandwidth", "both", "latency", "many", "blocks", "staged"};
  bool Runs(const char* section) const { return sections_.count(section) != 0; }
  ferry::StagedCopyOptions staged_opts_;

  std::unique_ptr<ferry::Client> client_;
  std::optional<ferry::HostBuffer> pool_buf_;
  std::optional<ferry::DeviceRegion> region_;
  std::byte* pinned_ = nullptr;  // in-process baseline: cudaMallocHost
  void* dev_ = nullptr;
  cudaStream_t s_[2] = {nullptr, nullptr};
  cudaEvent_t ev_[2] = {nullptr, nullptr};
  std::string device_name_, daemon_backend_;
  std::vector<Sample> samples_;
  std::vector<size_t> sizes_, staged_sizes_;
  double idle_cpu_pct_ = -1;
  bool pool_registered_ = false;
  double last_ = 0;
  bool verified_ = true;
  std::vector<std::string> failures_;
  std::unique_ptr<ferry::bench::Progress> progress_;
};

int TransferBench::Run(const std::vector<std::string>& args) {
  cli::Args a(args);
  auto usage_error = [](const std::string& what) {
    cli::Fail("ferry-bench", what);
    return 64;  // EX_USAGE
  };
  while (a.Next()) {
    if (a.IsHelp()) {
      return cli::Help(kUsage);
    } else if (a.Is("--socket")) {
      opts_.socket_path = a.Value();
    } else if (a.Is("--max-size")) {
      if (!a.ByteSizeValue(4096, 1ull << 40, max_size_)) return usage_error("--max-size takes a size, 4 KiB .. 1 TiB");
    } else if (a.Is("--daemon-pid")) {
      if (!a.IntValue(1, 1 << 30, daemon_pid_)) return usage_error("--daemon-pid takes ferryd's process id");
    } else if (a.Is("--csv")) {
      csv_ = a.Value();
    } else if (a.Is("--json")) {
      json_ = true;
    } else if (a.Is("--only")) {
      sections_.clear();
      std::string list = a.Value() + ",";
      for (size_t b = 0, e; (e = list.find(',', b)) != std::string::npos; b = e + 1) {
        const std::string one = list.substr(b, e - b);
        if (one != "bandwidth" && one != "both" && one != "latency" && one != "many" && one != "blocks" &&
            one != "staged") {
          std::fprintf(stderr, "ferry-bench: --only takes bandwidth, both, latency, many, blocks, staged (not '%s')\n",
                       one.c_str());
          return 64;
        }
        sections_.insert(one);
      }
    } else if (a.Is("--staged-chunk")) {
      if (!a.ByteSizeValue(4096, 1ull << 32, staged_opts_.chunk_bytes)) {
        return usage_error("--staged-chunk takes a size, 4 KiB .. 4 GiB");
      }
    } else if (a.Is("--staged-threads")) {
      if (!a.IntValue(1, 1024, staged_opts_.threads)) return usage_error("--staged-threads takes 1..1024");
    } else if (a.Is("--clients")) {
      if (!a.IntValue(2, kMaxListClients, clients_)) {
        return usage_error("--clients takes 2.." + std::to_string(kMaxListClients));
      }
    } else if (a.Is("--quick")) {
      quick_ = true;
    } else if (a.Is("--timeline")) {
      timeline_ = true;
    } else if (a.Is("--device")) {
      if (!a.IntValue(0, 63, opts_.device)) return usage_error("--device takes a CUDA device ordinal");
    } else if (a.Is("--cpu")) {
      int cpu = 0;
      if (!a.IntValue(0, CPU_SETSIZE - 1, cpu)) return usage_error("--cpu takes a CPU number");
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      if (::sched_setaffinity(0, sizeof set, &set) != 0) {
        std::perror("ferry-bench: --cpu");
        return 64;
      }
    } else {
      return usage_error("unknown option '" + a.current() + "' (try --help)");
    }
  }
  if (clients_ > 1 && !Runs("blocks"))
    return usage_error("--clients runs the blocks section's lists: add blocks to --only");
  for (size_t n = 4096; n <= max_size_; n *= 4) sizes_.push_back(n);
  if (sections_ == std::set<std::string>{"blocks"}) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      if (json_ || !csv_.empty() || timeline_) {
        return usage_error(
            "no CUDA GPU answers: the blocks section against the host backend prints its table only "
            "(no --json, --csv, --plot or --timeline)");
      }
      std::fprintf(stderr, "ferry-bench: no CUDA GPU answers: the blocks section runs ferry's list copies alone\n");
      return RunBlocksOnHostBackend(opts_, {.quick = quick_, .clients = clients_, .max_bytes = max_size_});
    }
  }
  if (int rc = Setup()) return rc;
  for (size_t n = 1 << 20; n <= max_size_; n *= 4) staged_sizes_.push_back(n);
  if (!Runs("staged")) staged_sizes_.clear();
  if (!Runs("bandwidth")) sizes_.clear();
  progress_ = std::make_unique<ferry::bench::Progress>(
      sizes_.size() * 2 + Runs("both") + 2 * Runs("latency") + Runs("many") +
      2 * ShuffledBlockWorkloads().size() * Runs("blocks") * (clients_ > 1 ? 2 : 1) + staged_sizes_.size() +
      (daemon_pid_ > 0));
  if (int rc = Bandwidth()) return rc;
  if (Runs("both")) {
    if (int rc = Bidirectional()) return rc;
  }
  if (Runs("latency")) {
    if (int rc = Latency()) return rc;
  }
  if (Runs("many")) {
    if (int rc = ManySmall()) return rc;
  }
  if (Runs("blocks")) {
    if (int rc = Blocks()) return rc;
  }
  if (int rc = Staged()) return rc;
  if (daemon_pid_ > 0) {
    std::this_thread::sleep_for(1s);  // past ferryd's spin window
    const double c0 = ProcessCpuSeconds(daemon_pid_), t0 = NowSeconds();
    std::this_thread::sleep_for(5s);
    const double c1 = ProcessCpuSeconds(daemon_pid_), t1 = NowSeconds();
    if (c0 >= 0 && c1 >= 0) idle_cpu_pct_ = 100 * (c1 - c0) / (t1 - t0);
    progress_->Step("idle CPU");
  }
  // After the idle measure: the clients' sessions leave slabs for ferryd to zero and pin again.
  if (clients_ > 1) ListClients();
  if (!csv_.empty()) {
    std::ofstream f(csv_);
    f << "test,bytes,direction,path,rep,seconds\n";
    for (const Sample& s : samples_) {
      f << s.test << ',' << s.bytes << ',' << s.direction << ',' << s.path << ',' << s.rep << ',' << s.seconds << '\n';
    }
  }
  Report(json_);
  return verified_ ? 0 : 1;
}

int TransferBench::Setup() {
  opts_.name = "ferry-bench";
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "ferry-bench: no CUDA GPU answers; transfer compares against the GPU and needs one\n");
    return 2;
  }
  auto c = ferry::Client::Connect(opts_);
  FERRY_OR_DIE(c.status());
  client_ = std::move(*c);
  if (client_->backend() != ferry::BackendKind::kCuda) {
    std::fprintf(stderr, "ferry-bench: ferryd runs the host backend; start it with --backend cuda\n");
    return 2;
  }
  CUDA_OR_DIE(cudaSetDevice(client_->device_ordinal()));
  cudaDeviceProp prop{};
  CUDA_OR_DIE(cudaGetDeviceProperties(&prop, client_->device_ordinal()));
  device_name_ = prop.name;
  CUDA_OR_DIE(cudaMallocHost(reinterpret_cast<void**>(&pinned_), max_size_));
  CUDA_OR_DIE(cudaMalloc(&dev_, max_size_));
  for (auto& s : s_) CUDA_OR_DIE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (auto& e : ev_) CUDA_OR_DIE(cudaEventCreate(&e));
  auto hb = client_->AllocateHost(max_size_);
  FERRY_OR_DIE(hb.status());
  pool_buf_.emplace(std::move(*hb));
  auto r = client_->RegisterDevice(dev_, max_size_);
  FERRY_OR_DIE(r.status());
  region_.emplace(std::move(*r));
  FillRandom(pinned_, max_size_, 1);
  std::memcpy(pool_buf_->data(), pinned_, max_size_);
  // The pool's pages registered in this process too: in-process copies from ferry's memory
  // tell the memory's share of a gap from the daemon's (see Bidirectional).
  pool_registered_ = cudaHostRegister(pool_buf_->data(), max_size_, cudaHostRegisterDefault) == cudaSuccess;
  if (!pool_registered_) cudaGetLastError();
  return 0;
}

int TransferBench::Verify(size_t n) {
  // host -> device through ferry into poisoned device memory, read back in-process.
  FillRandom(pool_buf_->data(), n, n);
  CUDA_OR_DIE(cudaMemset(dev_, 0xA5, n));
  CUDA_OR_DIE(cudaDeviceSynchronize());
  auto t = client_->Copy(ferry::Direction::kHostToDevice, *pool_buf_, 0, *region_, 0, n);
  FERRY_OR_DIE(t.status());
  FERRY_OR_DIE(t->Wait(10s));
  CUDA_OR_DIE(cudaMemcpy(pinned_, dev_, n, cudaMemcpyDeviceToHost));
  bool ok = std::memcmp(pinned_, pool_buf_->data(), n) == 0;
  // device -> host through ferry into a poisoned pool buffer.
  std::memset(pool_buf_->data(), 0xA5, n);
  auto d = client_->Copy(ferry::Direction::kDeviceToHost, *pool_buf_, 0, *region_, 0, n);
  FERRY_OR_DIE(d.status());
  FERRY_OR_DIE(d->Wait(10s));
  ok = ok && std::memcmp(pinned_, pool_buf_->data(), n) == 0;
  if (!ok) {
    verified_ = false;
    failures_.push_back("data check failed at " + FormatByteSize(n));
  }
  return 0;
}

int TransferBench::Bandwidth() {
  for (size_t n : sizes_) {
    if (int rc = Verify(n)) return rc;
    const int reps = std::clamp<int>(static_cast<int>((quick_ ? 1ull << 30 : 4ull << 30) / n), 5, quick_ ? 50 : 200);
    for (int dir = 0; dir < 2; ++dir) {
      const auto kind = dir == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
      const auto fdir = dir == 0 ? ferry::Direction::kHostToDevice : ferry::Direction::kDeviceToHost;
      const std::string dname = dir == 0 ? "h2d" : "d2h";
      // One path's reps, then the other's: alternating copies from two processes' contexts
      // measures the switch between them (see the "mixed" latency line), not either path.
      for (int rep = -2; rep < reps; ++rep) {
        const double t0 = NowSeconds();
        CUDA_OR_DIE(cudaEventRecord(ev_[0], s_[0]));
        CUDA_OR_DIE(kind == cudaMemcpyHostToDevice ? cudaMemcpyAsync(dev_, pinned_, n, kind, s_[0])
                                                   : cudaMemcpyAsync(pinned_, dev_, n, kind, s_[0]));
        CUDA_OR_DIE(cudaEventRecord(ev_[1], s_[0]));
        CUDA_OR_DIE(cudaStreamSynchronize(s_[0]));
        const double host = NowSeconds() - t0;
        float ms = 0;
        CUDA_OR_DIE(cudaEventElapsedTime(&ms, ev_[0], ev_[1]));
        if (rep >= 0) Add("bandwidth", n, dname, "in-process", rep, host);
        if (rep >= 0) Add("bandwidth", n, dname, "in-process-events", rep, ms * 1e-3);  // the engine's time alone
      }
      for (int rep = -2; rep < reps; ++rep) {
        const double t0 = NowSeconds();
        auto t = client_->Copy(fdir, *pool_buf_, 0, *region_, 0, n);
        FERRY_OR_DIE(t.status());
        FERRY_OR_DIE(t->Wait(10s));
        if (rep >= 0) Add("bandwidth", n, dname, "ferry", rep, NowSeconds() - t0);
      }
      progress_->Step("bandwidth " + FormatByteSize(n) + " " + dname);
    }
  }
  return 0;
}

int TransferBench::Bidirectional() {
  const size_t n = std::min<size_t>(256ull << 20, max_size_ / 2);
  const int reps = quick_ ? 10 : 30;
  // In-process, both at once: host[0, n) to the device's first n bytes, its next n to host[n, 2n).
  auto in_process = [&](std::byte* host, const char* path, int rep) -> int {
    const double t0 = NowSeconds();
    CUDA_OR_DIE(cudaMemcpyAsync(dev_, host, n, cudaMemcpyHostToDevice, s_[0]));
    CUDA_OR_DIE(cudaMemcpyAsync(host + n, static_cast<std::byte*>(dev_) + n, n, cudaMemcpyDeviceToHost, s_[1]));
    CUDA_OR_DIE(cudaStreamSynchronize(s_[0]));
    CUDA_OR_DIE(cudaStreamSynchronize(s_[1]));
    if (rep >= 0) Add("bidirectional", n, "both", path, rep, NowSeconds() - t0);
    return 0;
  };
  for (int rep = -2; rep < reps; ++rep) {
    if (int rc = in_process(pinned_, "in-process", rep)) return rc;
    if (pool_registered_) {
      if (int rc = in_process(pool_buf_->data(), "in-process-pool-memory", rep)) return rc;
    }
    const double t0 = NowSeconds();
    auto up = client_->Copy(ferry::Direction::kHostToDevice, *pool_buf_, 0, *region_, 0, n);
    const double t_up = NowSeconds();
    auto down = client_->Copy(ferry::Direction::kDeviceToHost, *pool_buf_, n, *region_, n, n);
    const double t_down = NowSeconds();
    FERRY_OR_DIE(up.status());
    FERRY_OR_DIE(down.status());
    FERRY_OR_DIE(up->Wait(10s));
    const double t_up_done = NowSeconds();
    FERRY_OR_DIE(down->Wait(10s));
    const double t_end = NowSeconds();
    if (rep >= 0) Add("bidirectional", n, "both", "ferry", rep, t_end - t0);
    if (timeline_) {
      std::fprintf(
          stderr,
          "timeline both rep %d: start %.0f, up submitted %.0f, down submitted %.0f, up done %.0f, down done %.0f ns\n",
          rep, t0 * 1e9, t_up * 1e9, t_down * 1e9, t_up_done * 1e9, t_end * 1e9);
    }
  }
  progress_->Step("both directions at once");
  return 0;
}

int TransferBench::Latency() {
  constexpr size_t n = 4096;
  const int reps = quick_ ? 1000 : 5000;
  for (int dir = 0; dir < 2; ++dir) {
    const auto kind = dir == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    const auto fdir = dir == 0 ? ferry::Direction::kHostToDevice : ferry::Direction::kDeviceToHost;
    const std::string dname = dir == 0 ? "h2d" : "d2h";
    auto in_process = [&]() -> int {
      const double t0 = NowSeconds();
      CUDA_OR_DIE(kind == cudaMemcpyHostToDevice ? cudaMemcpyAsync(dev_, pinned_, n, kind, s_[0])
                                                 : cudaMemcpyAsync(pinned_, dev_, n, kind, s_[0]));
      CUDA_OR_DIE(cudaStreamSynchronize(s_[0]));
      last_ = NowSeconds() - t0;
      return 0;
    };
    std::string timeline;  // printed after the reps, so the printing does not delay them
    auto through_ferry = [&]() -> int {
      const double t0 = NowSeconds();
      auto t = client_->Copy(fdir, *pool_buf_, 0, *region_, 0, n, {.priority = ferry::Priority::kLatency});
      const double t_submitted = NowSeconds();
      FERRY_OR_DIE(t.status());
      FERRY_OR_DIE(t->Wait(1s));
      const double t_end = NowSeconds();
      last_ = t_end - t0;
      if (timeline_) {
        char line[160];
        std::snprintf(line, sizeof line, "timeline latency %s: start %.0f, submitted %.0f, done %.0f ns\n",
                      dname.c_str(), t0 * 1e9, t_submitted * 1e9, t_end * 1e9);
        timeline += line;
      }
      return 0;
    };
    for (int rep = -100; rep < reps; ++rep) {
      if (int rc = in_process()) return rc;
      if (rep >= 0) Add("latency", n, dname, "in-process", rep, last_);
    }
    for (int rep = -100; rep < reps; ++rep) {
      if (rep == 0) timeline.clear();  // the warm-up's lines
      if (int rc = through_ferry()) return rc;
      if (rep >= 0) Add("latency", n, dname, "ferry", rep, last_);
    }
    std::fputs(timeline.c_str(), stderr);
    timeline.clear();
    // Mixed: this process's own copies alternating with ferryd's, as a client that also copies
    // by itself would see them.
    for (int rep = -10; rep < reps / 5; ++rep) {
      if (int rc = in_process()) return rc;
      if (rep >= 0) Add("latency-mixed", n, dname, "in-process", rep, last_);
      if (int rc = through_ferry()) return rc;
      if (rep >= 0) Add("latency-mixed", n, dname, "ferry", rep, last_);
    }
    timeline.clear();  // the alternating copies' lines: not printed
    progress_->Step("4 KiB latency " + dname);
  }
  return 0;
}

int TransferBench::ManySmall() {
  constexpr size_t kPiece = 64 << 10, kCount = 1024;
  if (kPiece * kCount > max_size_) return 0;
  const int reps = quick_ ? 5 : 20;
  std::vector<void*> dsts(kCount);
  std::vector<const void*> srcs(kCount);
  std::vector<size_t> sizes(kCount, kPiece);
  for (size_t i = 0; i < kCount; ++i) {
    dsts[i] = static_cast<std::byte*>(dev_) + i * kPiece;
    srcs[i] = pinned_ + i * kPiece;
  }
  std::vector<ferry::Transfer> ts;
  ts.reserve(kCount);
  const BlockIndices in_order = MakeBlockIndices(kCount, false, 0);  // the same copies as one list
  // The same copies with the device side shuffled: none adjacent to the one before, so ferryd
  // cannot join them, and cudaMemcpyBatchAsync of the same. The host side stays in order, as
  // ferry_singles and the batch read it.
  const BlockIndices scattered = [&] {
    BlockIndices b = MakeBlockIndices(kCount, true, 0x5ca77e4);
    b.src = in_order.src;
    return b;
  }();
  std::vector<void*> scattered_dsts(kCount);
  for (size_t i = 0; i < kCount; ++i) scattered_dsts[i] = static_cast<std::byte*>(dev_) + scattered.dst[i] * kPiece;
  // Marks (seconds) of the last run of separate copies: submitting its first copy, its last,
  // the first wait's end.
  double first_submitted = 0, last_submitted = 0, first_waited = 0;
  // Each run times submitting its 1024 copies and waiting for them; the handles of the run before
  // are freed ahead of its clock (timed apart), as the in-process rows have none to free.
  auto free_handles = [&] {
    if (ts.empty()) return;
    const double c0 = NowSeconds();
    ts.clear();
    many_free_us_.push_back((NowSeconds() - c0) * 1e6);
  };
  auto ferry_singles = [&](const std::vector<uint32_t>& dst_blocks) -> int {
    for (size_t i = 0; i < kCount; ++i) {
      auto t = client_->Copy(ferry::Direction::kHostToDevice, *pool_buf_, i * kPiece, *region_, dst_blocks[i] * kPiece,
                             kPiece);
      FERRY_OR_DIE(t.status());
      ts.push_back(std::move(*t));
      if (i == 0) first_submitted = NowSeconds();
    }
    last_submitted = NowSeconds();
    for (auto& t : ts) {
      FERRY_OR_DIE(t.Wait(10s));
      if (&t == &ts.front()) first_waited = NowSeconds();
    }
    return 0;
  };
  std::string timeline;  // printed after the reps, so the printing does not delay them
  auto mark = [&](const char* what, int rep, double t0, double t1) {
    if (!timeline_ || rep < 0) return;
    char line[256];
    std::snprintf(line, sizeof line,
                  "timeline many %s rep %d: start %.0f, first submitted %.0f, last submitted %.0f, first waited "
                  "%.0f, done %.0f ns\n",
                  what, rep, t0 * 1e9, first_submitted * 1e9, last_submitted * 1e9, first_waited * 1e9, t1 * 1e9);
    timeline += line;
  };
  for (int rep = -2; rep < reps; ++rep) {
    double t0 = NowSeconds();
    for (size_t i = 0; i < kCount; ++i) {
      CUDA_OR_DIE(cudaMemcpyAsync(dsts[i], srcs[i], kPiece, cudaMemcpyHostToDevice, s_[0]));
    }
    CUDA_OR_DIE(cudaStreamSynchronize(s_[0]));
    double t1 = NowSeconds();
    if (rep >= 0) Add("many", kPiece * kCount, "h2d", "in-process", rep, t1 - t0);
    t0 = NowSeconds();
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t idx = 0;
    CUDA_OR_DIE(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), kCount, &attr, &idx, 1, s_[0]));
    CUDA_OR_DIE(cudaStreamSynchronize(s_[0]));
    t1 = NowSeconds();
    if (rep >= 0) Add("many", kPiece * kCount, "h2d", "in-process-batch", rep, t1 - t0);
    free_handles();
    t0 = NowSeconds();
    if (int rc = ferry_singles(in_order.dst)) return rc;
    t1 = NowSeconds();
    if (rep >= 0) Add("many", kPiece * kCount, "h2d", "ferry", rep, t1 - t0);
    mark("in order", rep, t0, t1);
    t0 = NowSeconds();
    CUDA_OR_DIE(cudaMemcpyBatchAsync(scattered_dsts.data(), srcs.data(), sizes.data(), kCount, &attr, &idx, 1, s_[0]));
    CUDA_OR_DIE(cudaStreamSynchronize(s_[0]));
    t1 = NowSeconds();
    if (rep >= 0) Add("many", kPiece * kCount, "h2d", "in-process-batch-scattered", rep, t1 - t0);
    free_handles();
    t0 = NowSeconds();
    if (int rc = ferry_singles(scattered.dst)) return rc;
    t1 = NowSeconds();
    if (rep >= 0) Add("many", kPiece * kCount, "h2d", "ferry-scattered", rep, t1 - t0);
    mark("scattered", rep, t0, t1);
    t0 = NowSeconds();
    auto list = client_->CopyBlocks(ferry::Direction::kHostToDevice, *pool_buf_, 0, *region_, 0, in_order.list(kPiece));
    FERRY_OR_DIE(list.status());
    first_submitted = last_submitted = NowSeconds();
    FERRY_OR_DIE(list->Wait(10s));
    t1 = first_waited = NowSeconds();
    if (rep >= 0) Add("many", kPiece * kCount, "h2d", "ferry-list", rep, t1 - t0);
    mark("list", rep, t0, t1);
  }
  std::fputs(timeline.c_str(), stderr);
  // The separate copies' bytes, in order and scattered, once each into poisoned device memory.
  std::vector<std::byte> readback(kPiece * kCount);
  for (const BlockIndices* singles : {&in_order, &scattered}) {
    CUDA_OR_DIE(cudaMemset(dev_, 0xA5, kPiece * kCount));
    CUDA_OR_DIE(cudaDeviceSynchronize());
    ts.clear();
    if (int rc = ferry_singles(singles->dst)) return rc;
    CUDA_OR_DIE(cudaMemcpy(readback.data(), dev_, readback.size(), cudaMemcpyDeviceToHost));
    if (auto bad = FirstWrongBlock(*singles, kPiece, pool_buf_->data(), readback.data())) {
      verified_ = false;
      failures_.push_back(std::string("1024 x 64 KiB as separate copies") +
                          (singles == &scattered ? ", scattered" : "") + ": copy " + std::to_string(*bad) +
                          " arrived wrong");
    }
  }
  // The list's bytes, once, into poisoned device memory.
  CUDA_OR_DIE(cudaMemset(dev_, 0xA5, kPiece * kCount));
  CUDA_OR_DIE(cudaDeviceSynchronize());
  auto list = client_->CopyBlocks(ferry::Direction::kHostToDevice, *pool_buf_, 0, *region_, 0, in_order.list(kPiece));
  FERRY_OR_DIE(list.status());
  FERRY_OR_DIE(list->Wait(10s));
  CUDA_OR_DIE(cudaMemcpy(readback.data(), dev_, readback.size(), cudaMemcpyDeviceToHost));
  if (auto bad = FirstWrongBlock(in_order, kPiece, pool_buf_->data(), readback.data())) {
    verified_ = false;
    failures_.push_back("1024 x 64 KiB as one list: block " + std::to_string(*bad) + " arrived wrong");
  }
  progress_->Step("1024 x 64 KiB");
  return 0;
}

// Block lists as a KV-cache offload or reload names them: each list shuffled (source and
// destination indices independent permutations over regions of exactly its blocks), both
// directions, three ways: a loop of cudaMemcpyAsync on one stream and one cudaMemcpyBatchAsync
// on one stream (attributes as ferryd's cuda backend issues its batches), both in this process
// from cudaMallocHost memory, and ferry's CopyBlocks from a pool buffer. The device side is the
// same cudaMalloc memory, registered with ferryd. One path's repetitions, then the next's (see
// Bandwidth); each path checked once, after its repetitions, in a destination poisoned before.
int TransferBench::Blocks() {
  const int reps = quick_ ? 5 : 20;
  const std::vector<BlockWorkload> workloads = ShuffledBlockWorkloads();
  std::vector<std::byte> readback;
  for (size_t wi = 0; wi < workloads.size(); ++wi) {
    const BlockWorkload& w = workloads[wi];
    const size_t n = w.region_bytes(), bb = w.block_bytes;
    if (2 * n > max_size_) {
      progress_->Step(w.name() + " skipped (--max-size)");
      progress_->Step(w.name() + " skipped (--max-size)");
      continue;
    }
    const BlockIndices indices = MakeBlockIndices(w.count, true, 0xb10c0000 + wi);
    auto* const dev = static_cast<std::byte*>(dev_);
    for (int dir = 0; dir < 2; ++dir) {
      const bool h2d = dir == 0;
      const auto kind = h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
      const auto fdir = h2d ? ferry::Direction::kHostToDevice : ferry::Direction::kDeviceToHost;
      const std::string dname = DirectionName(fdir);
      // The source: fresh random bytes in pinned_[0, n), the reference; copied into the pool
      // buffer (h2d) or the device (d2h). The in-process d2h destination is pinned_[n, 2n),
      // ferry's the pool buffer's [0, n).
      FillRandom(pinned_, n, 0xb10c1000 + 2 * wi + dir);
      if (h2d) {
        std::memcpy(pool_buf_->data(), pinned_, n);
      } else {
        CUDA_OR_DIE(cudaMemcpy(dev_, pinned_, n, cudaMemcpyHostToDevice));
      }
      std::byte* const in_process_host_dst = pinned_ + n;
      std::vector<void*> dsts(w.count);
      std::vector<const void*> srcs(w.count);
      std::vector<size_t> sizes(w.count, bb);
      for (size_t i = 0; i < w.count; ++i) {
        const size_t from = indices.src[i] * bb, to = indices.dst[i] * bb;
        srcs[i] = h2d ? static_cast<const void*>(pinned_ + from) : dev + from;
        dsts[i] = h2d ? dev + to : in_process_host_dst + to;
      }
      auto poison = [&](std::byte* host_dst) -> int {
        if (h2d) {
          CUDA_OR_DIE(cudaMemset(dev_, 0xA5, n));
          CUDA_OR_DIE(cudaDeviceSynchronize());
        } else {
          std::memset(host_dst, 0xA5, n);
        }
        return 0;
      };
      auto check = [&](const std::string& path, const std::byte* host_dst) -> int {
        const std::byte* got = host_dst;
        if (h2d) {
          readback.resize(n);
          CUDA_OR_DIE(cudaMemcpy(readback.data(), dev_, n, cudaMemcpyDeviceToHost));
          got = readback.data();
        }
        if (auto bad = FirstWrongBlock(indices, bb, pinned_, got)) {
          verified_ = false;
          failures_.push_back("blocks " + w.name() + " " + dname + " " + path + ": block " + std::to_string(*bad) +
                              " of the list arrived wrong");
        }
        return 0;
      };

      // The bus's limit for the list's bytes: the whole region as one copy (not checked: it is
      // no list, and the lists below write every byte of the destination again).
      for (int rep = -2; rep < reps; ++rep) {
        const double t0 = NowSeconds();
        CUDA_OR_DIE(cudaMemcpyAsync(h2d ? dev_ : static_cast<void*>(in_process_host_dst),
                                    h2d ? static_cast<const void*>(pinned_) : dev_, n, kind, s_[0]));
        CUDA_OR_DIE(cudaStreamSynchronize(s_[0]));
        if (rep >= 0) Add(w.key(), n, dname, "in-process-one-copy", rep, NowSeconds() - t0);
      }

      if (int rc = poison(in_process_host_dst)) return rc;
      for (int rep = -2; rep < reps; ++rep) {
        const double t0 = NowSeconds();
        for (size_t i = 0; i < w.count; ++i) CUDA_OR_DIE(cudaMemcpyAsync(dsts[i], srcs[i], bb, kind, s_[0]));
        CUDA_OR_DIE(cudaStreamSynchronize(s_[0]));
        if (rep >= 0) Add(w.key(), n, dname, "in-process", rep, NowSeconds() - t0);
      }
      if (int rc = check("in-process loop", in_process_host_dst)) return rc;

      if (int rc = poison(in_process_host_dst)) return rc;
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      for (int rep = -2; rep < reps; ++rep) {
        const double t0 = NowSeconds();
        size_t attr_index = 0;
        CUDA_OR_DIE(
            cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), w.count, &attr, &attr_index, 1, s_[0]));
        CUDA_OR_DIE(cudaStreamSynchronize(s_[0]));
        if (rep >= 0) Add(w.key(), n, dname, "in-process-batch", rep, NowSeconds() - t0);
      }
      if (int rc = check("in-process batch", in_process_host_dst)) return rc;

      if (int rc = poison(pool_buf_->data())) return rc;
      for (int rep = -2; rep < reps; ++rep) {
        const double t0 = NowSeconds();
        auto t = client_->CopyBlocks(fdir, *pool_buf_, 0, *region_, 0, indices.list(bb));
        FERRY_OR_DIE(t.status());
        FERRY_OR_DIE(t->Wait(10s));
        if (rep >= 0) Add(w.key(), n, dname, "ferry", rep, NowSeconds() - t0);
      }
      if (int rc = check("ferry", pool_buf_->data())) return rc;
      progress_->Step("blocks " + w.name() + " " + dname);
    }
  }
  return 0;
}

// The blocks section's lists from clients_ processes at once (bench/list_clients.hpp). Their
// failure is the run's: a failed check, with the reason.
void TransferBench::ListClients() {
  ferry::ConnectOptions each = opts_;
  each.device = client_->device_ordinal();
  const int reps = quick_ ? 5 : 20;
  auto rows = RunListClients(each, clients_, reps, max_size_, progress_.get());
  if (!rows.ok()) {
    verified_ = false;
    failures_.push_back("--clients " + std::to_string(clients_) + ": " + rows.status().ToString());
    return;
  }
  client_rows_ = std::move(*rows);
  const std::string clients = "-clients-" + std::to_string(clients_);
  for (const ListClientsRow& r : client_rows_) {
    const std::string d = DirectionName(r.direction);
    for (size_t rep = 0; rep < r.alone_seconds.size(); ++rep) {
      Add(r.workload.key() + clients, r.workload.region_bytes(), d, "ferry-client-1-alone", static_cast<int>(rep),
          r.alone_seconds[rep]);
    }
    for (size_t c = 0; c < r.each_seconds.size(); ++c) {
      for (size_t rep = 0; rep < r.each_seconds[c].size(); ++rep) {
        Add(r.workload.key() + clients, r.workload.region_bytes(), d, "ferry-client-" + std::to_string(c + 1),
            static_cast<int>(rep), r.each_seconds[c][rep]);
      }
    }
  }
}

// Pageable memory: plain cudaMemcpy, pin-then-copy (cudaHostRegister, copy, unregister), and
// ferry's staged path, for 1 MiB to max size, both directions. Each size checked once.
int TransferBench::Staged() {
  std::vector<std::byte> pageable(max_size_);
  std::memcpy(pageable.data(), pinned_, max_size_);  // random bytes, every page touched
  for (size_t n : staged_sizes_) {
    // Check: staged h2d into poisoned device memory, staged d2h into a poisoned pageable buffer.
    CUDA_OR_DIE(cudaMemset(dev_, 0xA5, n));
    CUDA_OR_DIE(cudaDeviceSynchronize());
    FERRY_OR_DIE(client_->CopyStaged(ferry::Direction::kHostToDevice, pageable.data(), *region_, 0, n, staged_opts_));
    CUDA_OR_DIE(cudaMemcpy(pinned_, dev_, n, cudaMemcpyDeviceToHost));
    bool ok = std::memcmp(pinned_, pageable.data(), n) == 0;
    std::vector<std::byte> back(n, std::byte{0xA5});
    FERRY_OR_DIE(client_->CopyStaged(ferry::Direction::kDeviceToHost, back.data(), *region_, 0, n, staged_opts_));
    ok = ok && std::memcmp(back.data(), pageable.data(), n) == 0;
    if (!ok) {
      verified_ = false;
      failures_.push_back("staged data check failed at " + FormatByteSize(n));
    }
    const int reps = std::clamp<int>(static_cast<int>((quick_ ? 1ull << 30 : 4ull << 30) / n), 3, quick_ ? 10 : 30);
    for (int dir = 0; dir < 2; ++dir) {
      const auto kind = dir == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
      const auto fdir = dir == 0 ? ferry::Direction::kHostToDevice : ferry::Direction::kDeviceToHost;
      const std::string dname = dir == 0 ? "h2d" : "d2h";
      void* d = dev_;
      void* h = pageable.data();
      for (int rep = -1; rep < reps; ++rep) {
        double t0 = NowSeconds();
        CUDA_OR_DIE(dir == 0 ? cudaMemcpy(d, h, n, kind) : cudaMemcpy(h, d, n, kind));
        if (rep >= 0) Add("staged", n, dname, "pageable-cudaMemcpy", rep, NowSeconds() - t0);
      }
      for (int rep = -1; rep < reps; ++rep) {
        double t0 = NowSeconds();
        CUDA_OR_DIE(cudaHostRegister(h, n, cudaHostRegisterDefault));
        CUDA_OR_DIE(dir == 0 ? cudaMemcpy(d, h, n, kind) : cudaMemcpy(h, d, n, kind));
        CUDA_OR_DIE(cudaHostUnregister(h));
        if (rep >= 0) Add("staged", n, dname, "pin-then-copy", rep, NowSeconds() - t0);
      }
      for (int rep = -1; rep < reps; ++rep) {
        double t0 = NowSeconds();
        FERRY_OR_DIE(client_->CopyStaged(fdir, h, *region_, 0, n, staged_opts_));
        if (rep >= 0) Add("staged", n, dname, "ferry-staged", rep, NowSeconds() - t0);
      }
    }
    progress_->Step("pageable " + FormatByteSize(n));
  }
  return 0;
}

Summary TransferBench::Gbps(const std::string& test, size_t bytes, const std::string& dir, const std::string& path,
                            double factor) const {
  std::vector<double> v;
  for (const Sample& s : samples_) {
    if (s.test == test && s.bytes == bytes && s.direction == dir && s.path == path) {
      v.push_back(factor * static_cast<double>(s.bytes) / s.seconds / 1e9);
    }
  }
  return Summarize(std::move(v));
}

Summary TransferBench::Micros(const std::string& test, const std::string& dir, const std::string& path) const {
  std::vector<double> v;
  for (const Sample& s : samples_) {
    if (s.test == test && s.direction == dir && s.path == path) v.push_back(s.seconds * 1e6);
  }
  return Summarize(std::move(v));
}

void TransferBench::Report(bool json) const {
  const size_t bidir_n = std::min<size_t>(256ull << 20, max_size_ / 2);
  struct Check {
    std::string what;
    Verdict verdict;
    std::string figures;
  };
  std::vector<Check> checks;
  char buf[256];
  // This machine's limit one way, as far as this run measured it: the fastest in-process copy,
  // by the host clock or by the copy engine's own time, of the bandwidth section's sizes and of
  // the blocks section's regions as one copy each (0 without either section).
  auto machine_limit = [&](const char* d) {
    double best = 0;
    for (size_t n : sizes_) {
      best = std::max(
          {best, Gbps("bandwidth", n, d, "in-process").median, Gbps("bandwidth", n, d, "in-process-events").median});
    }
    for (const BlockWorkload& w : ShuffledBlockWorkloads()) {
      if (Runs("blocks") && 2 * w.region_bytes() <= max_size_) {
        best = std::max(best, Gbps(w.key(), w.region_bytes(), d, "in-process-one-copy").median);
      }
    }
    return best;
  };
  for (const char* d : {"h2d", "d2h"}) {
    if (!Runs("bandwidth")) break;
    bool pass = true;
    double worst = 1e9;
    for (size_t n : sizes_) {
      if (n < (64ull << 20)) continue;
      double r = Gbps("bandwidth", n, d, "ferry").median / Gbps("bandwidth", n, d, "in-process").median;
      worst = std::min(worst, r);
      pass = pass && r >= 0.98;
    }
    std::snprintf(buf, sizeof buf, "worst ratio %.1f%%", 100 * worst);
    checks.push_back({std::string(d) + " >= 64 MiB at >= 98% of in-process", PassOrFail(pass), buf});
  }
  if (Runs("both")) {
    Summary in = Gbps("bidirectional", bidir_n, "both", "in-process", 2), fe = Gbps("bidirectional", bidir_n, "both", "ferry", 2);
    std::snprintf(buf, sizeof buf, "%.1f vs %.1f GB/s, %.1f%%", fe.median, in.median, 100 * fe.median / in.median);
    checks.push_back({"both ways at >= 98% of in-process", PassOrFail(fe.median >= 0.98 * in.median), buf});
  }
  for (const char* d : {"h2d", "d2h"}) {
    if (!Runs("latency")) break;
    Summary in = Micros("latency", d, "in-process"), fe = Micros("latency", d, "ferry");
    std::snprintf(buf, sizeof buf, "p50 %.2f vs %.2f us (+%.2f), p99 %.2f us", fe.median, in.median,
                  fe.median - in.median, fe.p99);
    checks.push_back({std::string("4 KiB ") + d + " p50 <= in-process + 3 us, p99 < 30 us",
                      PassOrFail(fe.median <= in.median + 3 && fe.p99 < 30), buf});
    checks.push_back(
        {std::string("4 KiB ") + d + " p50 <= in-process + 1.5 us", PassOrFail(fe.median <= in.median + 1.5), buf});
  }
  if (Runs("many")) {
    Summary fe = Gbps("many", 1024 * (64 << 10), "h2d", "ferry");
    std::snprintf(buf, sizeof buf, "%.1f GB/s", fe.median);
    checks.push_back({"1024 x 64 KiB >= 40 GB/s", PassOrFail(fe.median >= 40), buf});
    checks.push_back({"1024 x 64 KiB >= 46 GB/s", PassOrFail(fe.median >= 46), buf});
    Summary list = Gbps("many", 1024 * (64 << 10), "h2d", "ferry-list"),
            batch = Gbps("many", 1024 * (64 << 10), "h2d", "in-process-batch");
    std::snprintf(buf, sizeof buf, "%.1f vs %.1f GB/s, %.1f%%", list.median, batch.median,
                  100 * list.median / batch.median);
    checks.push_back({"1024 x 64 KiB as one list >= 100% of batch", PassOrFail(list.median >= batch.median), buf});
  }
  for (const BlockWorkload& w : ShuffledBlockWorkloads()) {
    if (!Runs("blocks") || 2 * w.region_bytes() > max_size_) break;
    for (const char* d : {"h2d", "d2h"}) {
      Summary loop = Gbps(w.key(), w.region_bytes(), d, "in-process"),
              batch = Gbps(w.key(), w.region_bytes(), d, "in-process-batch"),
              fe = Gbps(w.key(), w.region_bytes(), d, "ferry");
      std::snprintf(buf, sizeof buf, "%.1f GB/s: %.1f%% of batch %.1f", fe.median, 100 * fe.median / batch.median,
                    batch.median);
      checks.push_back({w.name() + " " + d + " list >= 100% of batch", PassOrFail(fe.median >= batch.median), buf});
      const double limit = machine_limit(d);
      if (limit > 0) {
        std::snprintf(buf, sizeof buf, "%.1f GB/s: %.2fx loop %.1f (2x: %.1f; the fastest copy this run: %.1f)",
                      fe.median, fe.median / loop.median, loop.median, 2 * loop.median, limit);
      } else {
        std::snprintf(buf, sizeof buf, "%.1f GB/s: %.2fx loop %.1f", fe.median, fe.median / loop.median, loop.median);
      }
      checks.push_back({w.name() + " " + d + " list >= 2x loop", AtLeast(fe.median, 2 * loop.median, limit), buf});
    }
  }
  for (const char* d : {"h2d", "d2h"}) {
    double worst = 1e9;
    for (size_t n : staged_sizes_) {
      if (n >= (64ull << 20)) worst = std::min(worst, Gbps("staged", n, d, "ferry-staged").median);
    }
    if (worst < 1e9) {
      std::snprintf(buf, sizeof buf, "slowest %.1f GB/s", worst);
      checks.push_back(
          {std::string("pageable ") + d + " staged >= 40 GB/s at >= 64 MiB", PassOrFail(worst >= 40), buf});
    }
  }
  if (idle_cpu_pct_ >= 0) {
    std::snprintf(buf, sizeof buf, "%.3f%% of a core", idle_cpu_pct_);
    checks.push_back({"ferryd idle CPU < 1% of a core", PassOrFail(idle_cpu_pct_ < 1), buf});
  }
  checks.push_back(
      {"every byte checked at every size", PassOrFail(verified_), verified_ ? "all sizes" : failures_.front()});

  if (json) {
    std::printf("{\"device\":\"%s\",\"bandwidth\":[", device_name_.c_str());
    bool first = true;
    for (size_t n : sizes_) {
      for (const char* d : {"h2d", "d2h"}) {
        Summary in = Gbps("bandwidth", n, d, "in-process"), fe = Gbps("bandwidth", n, d, "ferry");
        std::printf("%s{\"bytes\":%zu,\"direction\":\"%s\",\"in_process_gbps\":{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f},"
                    "\"ferry_gbps\":{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f}}",
                    first ? "" : ",", n, d, in.median, in.min, in.max, fe.median, fe.min, fe.max);
        first = false;
      }
    }
    std::printf("],\"blocks\":[");
    first = true;
    for (const BlockWorkload& w : ShuffledBlockWorkloads()) {
      if (!Runs("blocks") || 2 * w.region_bytes() > max_size_) break;
      for (const char* d : {"h2d", "d2h"}) {
        std::printf("%s{\"list\":\"%s\",\"blocks\":%zu,\"block_bytes\":%zu,\"direction\":\"%s\"", first ? "" : ",",
                    w.name().c_str(), w.count, w.block_bytes, d);
        for (const char* path : {"in-process", "in-process-batch", "in-process-one-copy", "ferry"}) {
          Summary g = Gbps(w.key(), w.region_bytes(), d, path);
          std::printf(",\"%s_gbps\":{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f}",
                      path == std::string("in-process")            ? "in_process_loop"
                      : path == std::string("in-process-batch")    ? "in_process_batch"
                      : path == std::string("in-process-one-copy") ? "in_process_one_copy"
                                                                   : "ferry",
                      g.median, g.min, g.max);
        }
        std::printf("}");
        first = false;
      }
    }
    std::printf("],\"checks\":[");
    for (size_t i = 0; i < checks.size(); ++i) {
      std::printf("%s{\"target\":%s,\"pass\":%s,\"above_machine_limit\":%s,\"figures\":%s}", i ? "," : "",
                  ferry::json::String(checks[i].what).c_str(), checks[i].verdict == Verdict::kPass ? "true" : "false",
                  checks[i].verdict == Verdict::kAboveMachineLimit ? "true" : "false",
                  ferry::json::String(checks[i].figures).c_str());
    }
    std::printf("],\"idle_cpu_percent\":%.4f", idle_cpu_pct_);
    if (!client_rows_.empty()) std::printf(",\"list_clients\":%s", ListClientsJson(client_rows_, clients_).c_str());
    std::printf("}\n");
    return;
  }
  std::printf("\nferry-bench transfer on %s (host clock, submit to completion seen; median [min, max]; out: samples\n"
              "beyond Tukey's fences, 1.5 IQR past the quartiles: a warm-up, a page fault or a noisy neighbour)\n\n",
              device_name_.c_str());
  if (Runs("bandwidth")) {
    std::printf("%-8s %-4s %-5s  %-26s %-4s %-26s %-4s %7s   %s\n", "size", "dir", "reps", "in-process GB/s", "out",
                "through ferryd GB/s", "out", "ratio", "engine alone (device events)");
    for (size_t n : sizes_) {
      for (const char* d : {"h2d", "d2h"}) {
        Summary in = Gbps("bandwidth", n, d, "in-process"), fe = Gbps("bandwidth", n, d, "ferry"),
                ev = Gbps("bandwidth", n, d, "in-process-events");
        std::printf("%-8s %-4s %-5zu  %7.2f [%6.2f, %6.2f]   %-4zu %7.2f [%6.2f, %6.2f]   %-4zu %6.1f%%   %7.2f\n",
                    FormatByteSize(n).c_str(), d, in.n, in.median, in.min, in.max, in.outliers, fe.median, fe.min, fe.max,
                    fe.outliers, 100 * fe.median / in.median, ev.median);
      }
    }
    std::printf(
        "(host clock from submit to completion seen, what a caller waits; the last column is the copy engine's own\n"
        "time from device events: small copies are dominated by launch and synchronization, not the bus)\n");
  }
  if (Runs("both")) {
    Summary bi = Gbps("bidirectional", bidir_n, "both", "in-process", 2),
            bf = Gbps("bidirectional", bidir_n, "both", "ferry", 2);
    std::printf(
        "%-8s %-4s %-5zu  %7.2f [%6.2f, %6.2f]   %7.2f [%6.2f, %6.2f]   %6.1f%%   (both ways at once, aggregate)\n",
        FormatByteSize(bidir_n).c_str(), "both", bi.n, bi.median, bi.min, bi.max, bf.median, bf.min, bf.max,
        100 * bf.median / bi.median);
    if (pool_registered_) {
      Summary bp = Gbps("bidirectional", bidir_n, "both", "in-process-pool-memory", 2);
      std::printf(
          "%-8s %-4s %-5zu  %7.2f [%6.2f, %6.2f]   (both ways in-process, from ferry's pool memory instead of "
          "cudaMallocHost: %.1f%%)\n",
          FormatByteSize(bidir_n).c_str(), "both", bp.n, bp.median, bp.min, bp.max, 100 * bp.median / bi.median);
    }
  }
  if (Runs("latency")) {
    std::printf("\n4 KiB round trip (us)   %-34s %-34s\n", "in-process submit+sync", "through ferryd (latency class)");
    for (const char* d : {"h2d", "d2h"}) {
      Summary in = Micros("latency", d, "in-process"), fe = Micros("latency", d, "ferry");
      std::printf("  %-20s  p50 %6.2f p99 %6.2f [%5.2f, %7.1f]   p50 %6.2f p99 %6.2f [%5.2f, %7.1f]\n", d, in.median,
                  in.p99, in.min, in.max, fe.median, fe.p99, fe.min, fe.max);
    }
    for (const char* d : {"h2d", "d2h"}) {
      Summary in = Micros("latency-mixed", d, "in-process"), fe = Micros("latency-mixed", d, "ferry");
      std::printf("  %-20s  p50 %6.2f p99 %6.2f [%5.2f, %7.1f]   p50 %6.2f p99 %6.2f [%5.2f, %7.1f]\n",
                  (std::string(d) + " alternating").c_str(), in.median, in.p99, in.min, in.max, fe.median, fe.p99,
                  fe.min, fe.max);
    }
  }
  if (Runs("many")) {
    Summary m1 = Gbps("many", 1024 * (64 << 10), "h2d", "in-process"),
            m2 = Gbps("many", 1024 * (64 << 10), "h2d", "in-process-batch"),
            m3 = Gbps("many", 1024 * (64 << 10), "h2d", "ferry"),
            m4 = Gbps("many", 1024 * (64 << 10), "h2d", "ferry-list");
    std::printf(
        "\n1024 x 64 KiB h2d (GB/s)  in-process one stream %.2f [%.2f, %.2f]   in-process cudaMemcpyBatchAsync %.2f "
        "[%.2f, %.2f]   through ferryd %.2f [%.2f, %.2f]\n",
        m1.median, m1.min, m1.max, m2.median, m2.min, m2.max, m3.median, m3.min, m3.max);
    std::printf("%-24s  (the same 1024 copies as one block list through ferryd: %.2f [%.2f, %.2f])\n", "", m4.median,
                m4.min, m4.max);
    Summary s2 = Gbps("many", 1024 * (64 << 10), "h2d", "in-process-batch-scattered"),
            s3 = Gbps("many", 1024 * (64 << 10), "h2d", "ferry-scattered");
    std::printf(
        "%-24s  device side scattered (no copy adjacent to the one before): in-process cudaMemcpyBatchAsync "
        "%.2f [%.2f, %.2f]   through ferryd %.2f [%.2f, %.2f]\n",
        "", s2.median, s2.min, s2.max, s3.median, s3.min, s3.max);
    if (!many_free_us_.empty()) {
      const Summary f = Summarize(many_free_us_);
      std::printf("%-24s  freeing a run's 1024 Transfer handles, before the next run's clock: %.1f us [%.1f, %.1f]\n",
                  "", f.median, f.min, f.max);
    }
  }
  if (Runs("blocks")) {
    std::printf("\nblock lists, shuffled (GB/s)  %-26s %-26s %-26s %7s %7s   %s\n", "in-process one-stream loop",
                "in-process batch", "ferry CopyBlocks", "/batch", "/loop", "the region as one copy (the bus)");
    for (const BlockWorkload& w : ShuffledBlockWorkloads()) {
      if (2 * w.region_bytes() > max_size_) {
        std::printf("  %-16s skipped: needs --max-size of at least %s\n", w.name().c_str(),
                    FormatByteSize(2 * w.region_bytes()).c_str());
        continue;
      }
      for (const char* d : {"h2d", "d2h"}) {
        Summary loop = Gbps(w.key(), w.region_bytes(), d, "in-process"),
                batch = Gbps(w.key(), w.region_bytes(), d, "in-process-batch"),
                fe = Gbps(w.key(), w.region_bytes(), d, "ferry"),
                one = Gbps(w.key(), w.region_bytes(), d, "in-process-one-copy");
        std::printf(
            "  %-16s %-4s         %6.2f [%6.2f, %6.2f]   %6.2f [%6.2f, %6.2f]   %6.2f [%6.2f, %6.2f]   %6.1f%% "
            "%6.2fx   %6.2f [%6.2f, %6.2f]\n",
            w.name().c_str(), d, loop.median, loop.min, loop.max, batch.median, batch.min, batch.max, fe.median, fe.min,
            fe.max, 100 * fe.median / batch.median, fe.median / loop.median, one.median, one.min, one.max);
      }
    }
  }
  if (!client_rows_.empty()) PrintListClients(client_rows_, clients_, quick_ ? 5 : 20);
  if (Runs("staged"))
    std::printf("\npageable host memory (GB/s)  %-26s %-26s %-26s (outliers)\n", "cudaMemcpy", "pin, copy, unpin",
                "ferry CopyStaged");
  for (size_t n : staged_sizes_) {
    for (const char* d : {"h2d", "d2h"}) {
      Summary a = Gbps("staged", n, d, "pageable-cudaMemcpy"), b = Gbps("staged", n, d, "pin-then-copy"),
              c = Gbps("staged", n, d, "ferry-staged");
      std::printf("  %-8s %-4s                %6.2f [%6.2f, %6.2f]   %6.2f [%6.2f, %6.2f]   %6.2f [%6.2f, %6.2f]   (%zu %zu %zu)\n",
                  FormatByteSize(n).c_str(), d, a.median, a.min, a.max, b.median, b.min, b.max, c.median, c.min, c.max, a.outliers,
                  b.outliers, c.outliers);
    }
  }
  if (idle_cpu_pct_ >= 0) std::printf("ferryd idle: %.3f%% of a core over 5 s\n", idle_cpu_pct_);
  std::printf(
      "\ntargets (LIMIT: missed, but the target asks for more than the fastest copy this machine made in this\n"
      "run, so nothing could meet it here, and the figure came within 90%% of that copy)\n");
  for (const Check& c : checks)
    std::printf("  %-5s %-52s %s\n", VerdictWord(c.verdict), c.what.c_str(), c.figures.c_str());
}

}  // namespace

int RunTransferSweep(const std::vector<std::string>& args) { return TransferBench().Run(args); }

}  // namespace ferry::bench
