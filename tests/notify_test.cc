// ferryd under systemd: READY=1 once serving, WATCHDOG=1 only while copies make progress.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

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
      if (n > 0) out.emplace_back(buf, static_cast<size_t>(n));
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
};

TEST(Systemd, ReadyThenWatchdogOnlyWhileCopiesProgress) {
  FakeSystemd systemd;
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(inner.ok());
  auto backend = std::make_unique<testing::PausableBackend>(std::move(*inner));
  testing::PausableBackend* be = backend.get();  // paused: a stuck copy engine
  testing::DaemonHarness d(testing::DaemonHarness::SmallConfig(), std::move(backend));
  auto first = systemd.Collect(300);
  ASSERT_GE(FakeSystemd::Count(first, "READY=1"), 1);
  EXPECT_GE(FakeSystemd::Count(first, "WATCHDOG=1"), 3) << "idle: fed every 50 ms";

  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  ASSERT_OK_AND_ASSIGN(HostBuffer host, client->AllocateHost(1 << 20));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, client->AllocateDevice(1 << 20));
  ASSERT_OK_AND_ASSIGN(DeviceRegion region, client->RegisterDevice(dev.data(), dev.size()));
  be->Pause(true);
  ASSERT_OK_AND_ASSIGN(Transfer t, client->Copy(Direction::kHostToDevice, host, 0, region, 0, 1 << 20));
  systemd.Collect(120);  // the ping in flight when the stall began
  auto stuck = systemd.Collect(400);
  EXPECT_EQ(FakeSystemd::Count(stuck, "WATCHDOG=1"), 0) << "a stuck copy must starve the watchdog";

  be->Pause(false);
  ASSERT_OK(t.Wait(5s));
  auto after = systemd.Collect(300);
  EXPECT_GE(FakeSystemd::Count(after, "WATCHDOG=1"), 2) << "fed again once copies progress";
  d.Stop();
  EXPECT_GE(FakeSystemd::Count(systemd.Collect(100), "STOPPING=1"), 1);
}

}  // namespace
}  // namespace ferry
