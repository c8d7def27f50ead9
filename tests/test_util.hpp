// Shared helpers for ferry's tests: random data, poison, byte-exact checks, and DaemonHarness,
// which runs a real ferryd Server inside the test process on a throwaway runtime directory.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.hpp"
#include "common/status_macros.hpp"
#include "daemon/server.hpp"
#include "ferry/client.hpp"

namespace ferry::testing {

using bench::FillRandom;  // the benchmarks' generator: one definition of "random data"

inline void Poison(std::byte* p, size_t n) { std::memset(p, 0xA5, n); }

// What a host-backend copy test copies between: a pool buffer and a simulated device allocation of
// `bytes` each, the allocation registered.
struct CopyTarget {
  HostBuffer host;
  DeviceAllocation dev;
  DeviceRegion region;
  std::byte* device() const { return static_cast<std::byte*>(dev.data()); }
};
inline Result<CopyTarget> MakeCopyTarget(Client& client, size_t bytes) {
  FERRY_ASSIGN_OR_RETURN(HostBuffer host, client.AllocateHost(bytes));
  FERRY_ASSIGN_OR_RETURN(DeviceAllocation dev, client.AllocateDevice(bytes));
  FERRY_ASSIGN_OR_RETURN(DeviceRegion region, client.RegisterDevice(dev.data(), dev.size()));
  return CopyTarget{std::move(host), std::move(dev), std::move(region)};
}

// `count` host-to-device copies of `piece` bytes each, piece i at i * piece on both sides of
// `target`, all submitted before any is waited on. An error names the copy that failed.
inline Result<std::vector<Transfer>> CopyPieces(Client& client, const CopyTarget& target, size_t piece, size_t count,
                                                const CopyOptions& options = {}) {
  std::vector<Transfer> ts;
  for (size_t i = 0; i < count; ++i) {
    auto t = client.Copy(Direction::kHostToDevice, target.host, i * piece, target.region, i * piece, piece, options);
    if (!t.ok()) return Status(t.status().code(), "copy " + std::to_string(i) + ": " + t.status().message());
    ts.push_back(std::move(*t));
  }
  return ts;
}

// Index of the first differing byte, or -1.
inline long long FirstDifference(const std::byte* a, const std::byte* b, size_t n) {
  if (std::memcmp(a, b, n) == 0) return -1;
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<long long>(i);
  }
  return -1;
}

// Threads of process `pid` ("self": this one) named `name` (their /proc comm).
inline int ThreadsNamed(const std::string& pid, const std::string& name) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + pid + "/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string got;
    std::getline(comm, got);
    n += got == name;
  }
  return n;
}

// The first CPU of `of`, alone.
inline cpu_set_t FirstCpuOf(const cpu_set_t& of) {
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &of)) {
      CPU_SET(c, &one);
      break;
    }
  }
  return one;
}

inline std::string MakeTempDir(const char* tag) {
  std::string t = (std::filesystem::temp_directory_path() / (std::string("ferry-") + tag + "-XXXXXX")).string();
  char* d = ::mkdtemp(t.data());
  return d ? std::string(d) : std::string();
}

// GET /metrics with a plain socket: no HTTP library between the test and the exporter.
inline std::string Scrape(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(fd.get(), req.data(), req.size(), 0) < 0) return "";
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

inline uint64_t RandomSeed() { return std::random_device{}() | (uint64_t{std::random_device{}()} << 32); }

// Holds completions back while paused (busy or stuck copy engines), and logs what the
// scheduler hands the engines, in order.
class PausableBackend : public daemon::FaultInjectingBackend {
 public:
  using daemon::FaultInjectingBackend::FaultInjectingBackend;
  struct Submitted {
    uint32_t stream;
    uint64_t bytes;
  };
  Result<daemon::FenceId> Submit(const daemon::CopyPlan& plan) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      uint64_t n = 0;
      for (auto& p : plan.pieces) n += p.length;
      log_.push_back({plan.pieces[0].stream, n});
    }
    return daemon::FaultInjectingBackend::Submit(plan);
  }
  void PollCompleted(std::vector<daemon::FenceResult>& done) override {
    daemon::FaultInjectingBackend::PollCompleted(held_);
    if (paused_) return;
    done.insert(done.end(), held_.begin(), held_.end());
    held_.clear();
  }
  // While results are held, the server must poll: the doorbell that announced them is spent.
  int completion_fd() const override {
    return paused_ || !held_.empty() ? -1 : daemon::FaultInjectingBackend::completion_fd();
  }
  void Pause(bool p) { paused_ = p; }
  // While set, no client event has happened: copies "after" one must be held by the daemon.
  // Events get no flags here, so "after" is the host-polled hand-off (as on a GPU without stream
  // memory operations) that HoldEvents controls.
  void HoldEvents(bool h) { events_held_ = h; }
  bool waits_on_flags() const override { return false; }
  Result<bool> EventHappened(daemon::SharedEvent& e) override {
    if (events_held_) return false;
    return daemon::FaultInjectingBackend::EventHappened(e);
  }
  std::vector<Submitted> log() {
    std::lock_guard<std::mutex> l(mu_);
    return log_;
  }

 private:
  std::atomic<bool> paused_{false};
  std::atomic<bool> events_held_{false};
  std::mutex mu_;
  std::vector<Submitted> log_;
  std::vector<daemon::FenceResult> held_;  // event-loop thread only
};

class DaemonHarness {
 public:
  explicit DaemonHarness(daemon::DaemonConfig config = SmallConfig(),
                         std::unique_ptr<daemon::Backend> backend = nullptr,
                         std::shared_ptr<const daemon::Policy> policy = SmallChunks(),
                         daemon::ServerObserver* observer = nullptr) {
    if (!backend) backend = HostGpu(config);
    std::vector<std::unique_ptr<daemon::Backend>> gpus;
    if (backend) gpus.push_back(std::move(backend));
    Start(std::move(config), std::move(gpus), {.policy = std::move(policy), .observer = observer});
  }
  // One host backend GPU, and the test seams of `options` (its policy: SmallChunks() if none;
  // its policy_source: "the test").
  DaemonHarness(daemon::DaemonConfig config, daemon::ServerOptions options) {
    std::vector<std::unique_ptr<daemon::Backend>> gpus;
    if (auto gpu = HostGpu(config)) gpus.push_back(std::move(gpu));
    if (!options.policy) options.policy = SmallChunks();
    Start(std::move(config), std::move(gpus), std::move(options));
  }
  // A ferryd of `gpus` simulated GPUs over `numa_nodes` simulated NUMA nodes (host backend),
  // serving those `devices` names (empty: all).
  static std::unique_ptr<DaemonHarness> SimulatedGpus(uint32_t gpus, uint32_t numa_nodes = 2,
                                                      std::vector<std::string> devices = {}) {
    daemon::DaemonConfig c = SmallConfig();
    c.host_gpus = gpus;
    c.host_numa_nodes = numa_nodes;
    c.devices = std::move(devices);
    std::string why;
    auto backends = daemon::CreateBackends(c, &why);
    EXPECT_TRUE(backends.ok()) << backends.status().ToString();
    return std::make_unique<DaemonHarness>(std::move(c), backends.ok() ? std::move(*backends) : std::vector<std::unique_ptr<daemon::Backend>>{});
  }
  // A backend per GPU (daemon::CreateBackends).
  DaemonHarness(daemon::DaemonConfig config, std::vector<std::unique_ptr<daemon::Backend>> gpus,
                std::shared_ptr<const daemon::Policy> policy = SmallChunks()) {
    Start(std::move(config), std::move(gpus), {.policy = std::move(policy)});
  }
  ~DaemonHarness() { Stop(); }

  static daemon::DaemonConfig SmallConfig() {
    daemon::DaemonConfig c;
    c.backend = daemon::BackendChoice::kHost;
    c.pool_bytes = 64ull << 20;
    c.slab_bytes = 1ull << 20;
    c.ring_entries = 64;
    c.spin_us = 50;
    return c;
  }

  // The default policy, with chunks small enough that test-sized copies are cut into several.
  static std::shared_ptr<const daemon::Policy> SmallChunks() {
    auto p = std::make_shared<daemon::Policy>();
    p->name = "test-chunked";
    p->chunk_bytes = 256 << 10;
    return p;
  }

  void Stop() {
    if (thread_.joinable()) {
      server_->Stop();
      thread_.join();
      EXPECT_TRUE(run_status_.ok()) << run_status_.ToString();
    }
    if (!dir_.empty()) {
      std::filesystem::remove_all(dir_);
      dir_.clear();
    }
  }

  std::string socket_path() const { return server_->config().SocketPath(); }
  daemon::Server& server() { return *server_; }
  daemon::Backend& backend() { return *backend_; }
  const daemon::ServerCounters& counters() const { return server_->counters(); }

  // device: the client's GPU (a simulated one's ordinal); -1: the default.
  Result<std::unique_ptr<Client>> Connect(const std::string& name = "test", int device = -1) {
    ConnectOptions o;
    o.socket_path = socket_path();
    o.name = name;
    o.device = device;
    return Client::Connect(o);
  }

  // Polls `pred` for up to `ms` milliseconds.
  template <typename Pred>
  static bool Eventually(Pred pred, int ms = 2000) {
    for (int i = 0; i < ms; ++i) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return pred();
  }

 private:
  // A host backend GPU for `config` (null, a test failure, if it cannot be made).
  static std::unique_ptr<daemon::Backend> HostGpu(const daemon::DaemonConfig& config) {
    daemon::HostBackendOptions o;
    o.streams_per_direction = daemon::kStreamsPerDirection;
    o.device_memory_bytes = config.host_gpu_memory_bytes;
    auto b = daemon::CreateHostBackend(o);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::move(*b) : nullptr;
  }

  void Start(daemon::DaemonConfig config, std::vector<std::unique_ptr<daemon::Backend>> gpus,
             daemon::ServerOptions options) {
    dir_ = MakeTempDir("rt");
    config.runtime_dir = dir_;
    backend_ = gpus.empty() ? nullptr : gpus.front().get();
    options.policy_source = "the test";
    auto s = daemon::Server::Create(config, std::move(gpus), std::move(options));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return;
    server_ = std::move(*s);
    thread_ = std::thread([this] { run_status_ = server_->Run(); });
  }

  std::string dir_;
  std::unique_ptr<daemon::Server> server_;
  daemon::Backend* backend_ = nullptr;
  std::thread thread_;
  Status run_status_;
};

}  // namespace ferry::testing

#define ASSERT_OK(expr)                                      \
  do {                                                       \
    const ::ferry::Status ferry_t_ = (expr);                 \
    ASSERT_TRUE(ferry_t_.ok()) << ferry_t_.ToString();       \
  } while (0)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) ASSERT_OK_AND_ASSIGN_IMPL_(FERRY_CONCAT_(ferry_ta_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)              \
  auto tmp = (expr);                                            \
  ASSERT_TRUE(tmp.ok()) << tmp.status().ToString();             \
  lhs = std::move(tmp).value()
