// ferryd while it starts: its socket answers before the pool is built, every hello refused
// "starting" with how far it got; libferry waits for it (up to its connect timeout), ferryctl's
// status does not; once ready, the clients that waited copy as any other.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>

#include "client/operator_control.hpp"
#include "daemon/server.hpp"
#include "ferry/client.hpp"
#include "tests/test_util.hpp"

namespace ferry::testing {
namespace {

// A gate the server's start waits at (ServerOptions::before_pool_build) until the test opens it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool reached = false, open = false;
  void Wait() {
    std::unique_lock<std::mutex> l(mu);
    reached = true;
    cv.notify_all();
    cv.wait(l, [&] { return open; });
  }
  void AwaitReached() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return reached; });
  }
  void Open() {
    std::lock_guard<std::mutex> l(mu);
    open = true;
    cv.notify_all();
  }
};

TEST(StartingFerryd, AnswersStartingUntilReadyAndClientsThatWaitedCopy) {
  const std::string dir = MakeTempDir("rt");
  daemon::DaemonConfig config = DaemonHarness::SmallConfig();
  config.runtime_dir = dir;
  Gate gate;
  auto backend = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(backend.ok());
  auto created = std::async(std::launch::async, [&] {
    return daemon::Server::Create(config, std::move(*backend),
                                  {.policy = DaemonHarness::SmallChunks(), .policy_source = "the test",
                                   .before_pool_build = [&] { gate.Wait(); }});
  });
  gate.AwaitReached();
  const std::string socket = config.SocketPath();

  // ferryctl status's way: no waiting, the progress at once.
  ctl::Control now;
  Status st = now.Open(socket, std::chrono::milliseconds(0));
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("ferryd is starting: building the pool"), std::string::npos)
      << st.ToString();
  // A client that will not wait long enough hears the same.
  auto impatient = Client::Connect({.socket_path = socket, .name = "impatient", .timeout = std::chrono::milliseconds(100)});
  ASSERT_FALSE(impatient.ok());
  EXPECT_EQ(impatient.status().code(), Code::kUnavailable);
  EXPECT_NE(impatient.status().message().find("ferryd is starting"), std::string::npos) << impatient.status().ToString();
  // A patient one waits, and is served once the start is done.
  auto patient = std::async(std::launch::async, [&] {
    return Client::Connect({.socket_path = socket, .name = "patient", .timeout = std::chrono::seconds(30)});
  });
  EXPECT_EQ(patient.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  gate.Open();
  auto server = created.get();
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::thread loop([&] { ASSERT_OK((*server)->Run()); });
  auto c = patient.get();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  constexpr size_t kBytes = 1 << 20;
  auto host = (*c)->AllocateHost(kBytes);
  auto dev = (*c)->AllocateDevice(kBytes);
  ASSERT_TRUE(host.ok() && dev.ok());
  auto region = (*c)->RegisterDevice(dev->data(), kBytes);
  ASSERT_TRUE(region.ok());
  std::mt19937 rng(7);
  std::vector<std::byte> want(kBytes);
  for (auto& b : want) b = static_cast<std::byte>(rng());
  std::memcpy(host->data(), want.data(), kBytes);
  std::memset(dev->data(), 0xA5, kBytes);
  auto t = (*c)->Copy(Direction::kHostToDevice, *host, 0, *region, 0, kBytes);
  ASSERT_TRUE(t.ok());
  ASSERT_OK(t->Wait(std::chrono::seconds(10)));
  EXPECT_EQ(std::memcmp(dev->data(), want.data(), kBytes), 0);
  // The start's phases are kept for the metrics.
  EXPECT_GT((*server)->counters().start_total_ns.load(), 0u);
  EXPECT_GE((*server)->counters().start_total_ns.load(), (*server)->counters().start_pool_ns.load());
  c->reset();
  (*server)->Stop();
  loop.join();
  server->reset();
  std::filesystem::remove_all(dir);
}

// A stop during the start (SIGTERM: main.cc's stop_requested) gives up the pool's build at
// once instead of faulting in the whole pool first, which takes minutes for hundreds of GiB:
// Create answers kAborted, the socket is gone, and the runtime directory is free for the next.
TEST(StartingFerryd, AStopDuringThePoolsBuildEndsTheStartAtOnce) {
  const std::string dir = MakeTempDir("rt");
  daemon::DaemonConfig config = DaemonHarness::SmallConfig();
  config.runtime_dir = dir;
  config.pool_bytes = 1ull << 30;  // a GiB: seconds to fault in on a small machine
  config.slab_bytes = 8ull << 20;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> asked{0};
  auto backend = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(backend.ok());
  auto server = daemon::Server::Create(config, std::move(*backend),
                                       {.policy = DaemonHarness::SmallChunks(),
                                        .policy_source = "the test",
                                        .before_pool_build = [&] { stop = true; },
                                        .stop_requested = [&] {
                                          ++asked;
                                          return stop.load();
                                        }});
  ASSERT_FALSE(server.ok()) << "the start went on to the end after the stop";
  EXPECT_EQ(server.status().code(), Code::kAborted) << server.status().ToString();
  EXPECT_GT(asked.load(), 0u);
  EXPECT_FALSE(std::filesystem::exists(config.SocketPath()));
  // The next ferryd on the directory starts (the lock went with the first).
  auto next_backend = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(next_backend.ok());
  config.pool_bytes = 64ull << 20;
  auto next = daemon::Server::Create(config, std::move(*next_backend), {.policy = DaemonHarness::SmallChunks()});
  EXPECT_TRUE(next.ok()) << next.status().ToString();
  next->reset();
  std::filesystem::remove_all(dir);
}

// Backends that cannot be made (no GPU answers) end the start with their reason, and the pool's
// build stops for it rather than running to the end first.
TEST(StartingFerryd, BackendsThatFailEndTheStartWithTheirReason) {
  const std::string dir = MakeTempDir("rt");
  daemon::DaemonConfig config = DaemonHarness::SmallConfig();
  config.runtime_dir = dir;
  auto checked = daemon::Preflight(config);
  ASSERT_TRUE(checked.ok()) << checked.status().ToString();
  daemon::GpuSource source;
  source.numa_nodes = {-1};
  source.make = []() -> Result<daemon::GpuBackends> { return Unavailable("no CUDA GPU answers: the test's"); };
  auto server = daemon::Server::Create(std::move(*checked), std::move(source), {.policy = DaemonHarness::SmallChunks()});
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), Code::kUnavailable) << server.status().ToString();
  EXPECT_NE(server.status().message().find("the test's"), std::string::npos) << server.status().ToString();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry::testing
