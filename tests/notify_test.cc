// ferryd under systemd: the pool's build reported (STATUS, EXTEND_TIMEOUT_USEC), READY=1 once
// serving, WATCHDOG=1 only while copies make progress.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cstdlib>

#include "common/fd.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

class FakeSystemd {
 public:
  FakeSystemd() {
    path_ = testing::MakeTempDir("notify") + "/notify.sock";
    fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof a.sun_path - 1);
    EXPECT_EQ(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ::setenv("NOTIFY_SOCKET", path_.c_str(), 1);
    ::setenv("WATCHDOG_USEC", "100000", 1);  // 100 ms: ferryd pings every 50 ms
    ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
  }
  ~FakeSystemd() {
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("WATCHDOG_USEC");
    ::unsetenv("WATCHDOG_PID");
  }
  // Messages received within `ms`.
  std::vector<std::string> Collect(int ms) {
    std::vector<std::string> out;
    const uint64_t end = MonotonicNanos() + static_cast<uint64_t>(ms) * 1000000;
    while (MonotonicNanos() < end) {
      auto ready = WaitReadable(fd_.get(), 5);
      if (!ready.ok() || !*ready) continue;
      char buf[512];
      ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
      if (n <= 0) continue;
      out.emplace_back(buf, static_cast<size_t>(n));
      if (out.back().find("WATCHDOG=1") != std::string::npos) ping_ns_.push_back(MonotonicNanos());
    }
    return out;
  }
  // The median time between the watchdog pings received since the last call (ms; -1 if < 2).
  double MedianPingIntervalMs() {
    std::vector<double> gaps;
    for (size_t i = 1; i < ping_ns_.size(); ++i) gaps.push_back(double(ping_ns_[i] - ping_ns_[i - 1]) / 1e6);
    ping_ns_.clear();
    if (gaps.empty()) return -1;
    std::sort(gaps.begin(), gaps.end());
    return gaps[gaps.size() / 2];
  }
  // Messages received until `count` of them hold `what`, or for at most `max_ms` (a loaded
  // machine may hold the pinging thread for a while).
  std::vector<std::string> CollectUntil(const std::string& what, int count, int max_ms) {
    std::vector<std::string> out;
    const uint64_t end = MonotonicNanos() + static_cast<uint64_t>(max_ms) * 1000000;
    while (Count(out, what) < count && MonotonicNanos() < end) {
      for (auto& m : Collect(20)) out.push_back(std::move(m));
    }
    return out;
  }
  static int Count(const std::vector<std::string>& v, const std::string& what) {
    int n = 0;
    for (auto& m : v) n += m.find(what) != std::string::npos;
    return n;
  }

 private:
  std::string path_;
  UniqueFd fd_;
  std::vector<uint64_t> ping_ns_;  // when each WATCHDOG=1 was received
};

TEST(Systemd, ReadyThenWatchdogOnlyWhileCopiesProgress) {
  FakeSystemd systemd;
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(inner.ok());
  auto backend = std::make_unique<testing::PausableBackend>(std::move(*inner));
  testing::PausableBackend* be = backend.get();  // paused: a stuck copy engine
  testing::DaemonHarness d(testing::DaemonHarness::SmallConfig(), std::move(backend));
  auto first = systemd.CollectUntil("WATCHDOG=1", 3, 5000);
  ASSERT_GE(FakeSystemd::Count(first, "READY=1"), 1);
  // Before READY: the pool's build and registration, each extending the start timeout.
  ASSERT_GE(first.size(), 3u);
  EXPECT_NE(first[0].find("EXTEND_TIMEOUT_USEC="), std::string::npos) << first[0];
  EXPECT_NE(first[0].find("STATUS=building the pool: 0 of 64 MiB"), std::string::npos) << first[0];
  int ready_at = -1, built_at = -1, registering_at = -1;
  for (size_t i = 0; i < first.size(); ++i) {
    if (built_at < 0 && first[i].find("STATUS=building the pool: 64 of 64 MiB") != std::string::npos) built_at = int(i);
    if (registering_at < 0 && first[i].find("STATUS=registering the pool") != std::string::npos) registering_at = int(i);
    if (ready_at < 0 && first[i].find("READY=1") != std::string::npos) ready_at = int(i);
  }
  EXPECT_TRUE(built_at >= 0 && built_at < registering_at && registering_at < ready_at)
      << "built at " << built_at << ", registering at " << registering_at << ", ready at " << ready_at;
  EXPECT_GE(FakeSystemd::Count(first, "WATCHDOG=1"), 3);
  systemd.MedianPingIntervalMs();  // those may have waited in the socket: timed from here
  systemd.CollectUntil("WATCHDOG=1", 7, 5000);
  const double idle_ms = systemd.MedianPingIntervalMs();
  EXPECT_GT(idle_ms, 0);
  EXPECT_LT(idle_ms, 100) << "idle: fed every 50 ms, within systemd's 100 ms";

  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  ASSERT_OK_AND_ASSIGN(testing::CopyTarget target, testing::MakeCopyTarget(*client, 1 << 20));
  auto& [host, dev, region] = target;
  be->Pause(true);
  ASSERT_OK_AND_ASSIGN(Transfer t, client->Copy(Direction::kHostToDevice, host, 0, region, 0, 1 << 20));
  systemd.Collect(120);  // the ping in flight when the stall began
  auto stuck = systemd.Collect(400);
  EXPECT_EQ(FakeSystemd::Count(stuck, "WATCHDOG=1"), 0) << "a stuck copy must starve the watchdog";

  be->Pause(false);
  ASSERT_OK(t.Wait(5s));
  auto after = systemd.CollectUntil("WATCHDOG=1", 2, 5000);
  EXPECT_GE(FakeSystemd::Count(after, "WATCHDOG=1"), 2) << "fed again once copies progress";
  systemd.MedianPingIntervalMs();
  systemd.CollectUntil("WATCHDOG=1", 7, 5000);
  const double after_ms = systemd.MedianPingIntervalMs();
  EXPECT_GT(after_ms, 0);
  EXPECT_LT(after_ms, 100) << "fed every 50 ms again";
  d.Stop();
  EXPECT_GE(FakeSystemd::Count(systemd.Collect(100), "STOPPING=1"), 1);
}

}  // namespace
}  // namespace ferry
