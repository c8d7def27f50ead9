// Real processes: the ferryd binary and separate client processes, started and killed the way
// an operator and a crashing inference server would.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.hpp"
#include "process_util.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using testing::Child;

// The entries of /dev/shm that name ferry. /dev/shm is the machine's: other processes (a browser
// test beside this one) add and remove their own entries there at any moment.
std::set<std::string> FerryShmEntries() {
  std::set<std::string> names;
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find("ferry") != std::string::npos) names.insert(name);
  }
  return names;
}

// Mappings of, and fds into, /dev/shm that a process holds: ferry's segments are memfds, never there.
size_t DevShmUse(pid_t pid) {
  size_t n = 0;
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(maps, line);) n += line.find(" /dev/shm/") != std::string::npos;
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code link_ec;
    n += fs::read_symlink(e.path(), link_ec).string().rfind("/dev/shm/", 0) == 0;
  }
  return n;
}

class RealDaemon : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("proc");
    socket_ = dir_ + "/ferryd.sock";
    shm_before_ = FerryShmEntries();
    daemon_ = std::make_unique<Child>(
        std::vector<std::string>{FERRY_DAEMON_PATH, "--metrics-address", "127.0.0.1:0", "--backend", "host", "--runtime-dir", dir_, "--pool-size",
                                 "64MiB", "--slab-size", "1MiB", "--log-level", "debug"},
        dir_ + "/ferryd.log");
    ASSERT_GT(daemon_->pid(), 0);
    ASSERT_TRUE(testing::DaemonHarness::Eventually([&] { return fs::exists(socket_); }, 10000))
        << daemon_->Output();
  }
  void TearDown() override {
    daemon_.reset();
    fs::remove_all(dir_);
  }
  std::unique_ptr<Child> StartClient(std::vector<std::string> args, const std::string& tag) {
    args.insert(args.begin(), FERRY_TEST_CLIENT_PATH);
    return std::make_unique<Child>(std::move(args), dir_ + "/" + tag + ".log");
  }
  uint64_t PoolFree(Client& c) {
    auto st = c.Stats();
    return st.ok() ? st->pool_free_bytes : 0;
  }

  std::string dir_, socket_;
  std::set<std::string> shm_before_;
  std::unique_ptr<Child> daemon_;
};

TEST_F(RealDaemon, SeveralClientProcessesCopyAtOnceAndEveryByteArrives) {
  std::vector<std::unique_ptr<Child>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(StartClient({"roundtrip", socket_, std::to_string((3 << 20) + 17 * i), "10"},
                                  std::string("c").append(std::to_string(i))));
  }
  for (auto& c : clients) {
    int st = c->Wait();
    ASSERT_TRUE(WIFEXITED(st)) << c->Output();
    EXPECT_EQ(WEXITSTATUS(st), 0) << c->Output();
  }
}

TEST_F(RealDaemon, AClientKilledMidCopyIsReclaimedWhileOthersKeepWorking) {
  ConnectOptions o;
  o.socket_path = socket_;
  ASSERT_OK_AND_ASSIGN(auto observer, Client::Connect(o));
  const uint64_t full = PoolFree(*observer);
  ASSERT_EQ(full, 64ull << 20);

  auto worker = StartClient({"hold", socket_, std::to_string(4 << 20)}, "worker");
  ASSERT_TRUE(worker->WaitForOutput("ready")) << worker->Output();
  auto victim = StartClient({"hold", socket_, std::to_string(8 << 20)}, "victim");
  ASSERT_TRUE(victim->WaitForOutput("ready")) << victim->Output();
  const uint64_t before = PoolFree(*observer);
  EXPECT_EQ(before, full - (24ull << 20));  // both hold two buffers and keep copying
  victim->Signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_TRUE(WIFSIGNALED(victim->Wait()));
  // Reclaimed within a second of the kill: its 16 MiB back in the pool, the worker untouched.
  // Renewing the 16 slabs is most of it: ~20 ms, under 100 ms with the cores 4x oversubscribed.
  ASSERT_TRUE(testing::DaemonHarness::Eventually([&] { return PoolFree(*observer) == before + (16ull << 20); }, 2000))
      << "pool free " << PoolFree(*observer) << "\n" << daemon_->Output();
  const auto reclaim = std::chrono::steady_clock::now() - killed;
  EXPECT_LT(reclaim, 1s) << std::chrono::duration_cast<std::chrono::milliseconds>(reclaim).count() << " ms\n"
                         << daemon_->Output();
  // The worker kept copying (and checking every byte) through it.
  auto check = StartClient({"roundtrip", socket_, std::to_string(4 << 20), "10"}, "check");
  int st = check->Wait();
  ASSERT_TRUE(WIFEXITED(st)) << check->Output();
  EXPECT_EQ(WEXITSTATUS(st), 0) << check->Output();
  EXPECT_EQ(worker->Wait(10ms), -1) << "the worker must still be running: " << worker->Output();
  worker->Signal(SIGKILL);
  worker->Wait();
  EXPECT_TRUE(testing::DaemonHarness::Eventually([&] { return PoolFree(*observer) == full; }, 2000))
      << "pool free " << PoolFree(*observer) << " of " << full << "\n" << daemon_->Output();
  ASSERT_OK_AND_ASSIGN(DaemonStats s, observer->Stats());
  EXPECT_EQ(s.sessions, 1u);
}

TEST_F(RealDaemon, SigtermStopsCleanlyAndLeavesNothingBehind) {
  auto holder = StartClient({"hold", socket_, std::to_string(1 << 20)}, "holder");
  ASSERT_TRUE(holder->WaitForOutput("ready")) << holder->Output();
  EXPECT_EQ(DevShmUse(daemon_->pid()), 0u);
  EXPECT_EQ(DevShmUse(holder->pid()), 0u);
  daemon_->Signal(SIGTERM);
  int st = daemon_->Wait(15s);
  ASSERT_TRUE(WIFEXITED(st)) << daemon_->Output();
  EXPECT_EQ(WEXITSTATUS(st), 0) << daemon_->Output();
  EXPECT_NE(daemon_->Output().find("stopped cleanly"), std::string::npos) << daemon_->Output();
  EXPECT_FALSE(fs::exists(socket_));
  EXPECT_EQ(FerryShmEntries(), shm_before_);
  // The client sees the daemon go and fails its next copy instead of hanging.
  int cst = holder->Wait(15s);
  ASSERT_TRUE(WIFEXITED(cst)) << holder->Output();
  EXPECT_EQ(WEXITSTATUS(cst), 2) << holder->Output();
}

TEST_F(RealDaemon, ASecondFerrydOnTheSameDirectoryIsRefusedAndTheFirstKeepsServing) {
  Child second({FERRY_DAEMON_PATH, "--metrics-address", "", "--backend", "host", "--runtime-dir", dir_, "--pool-size",
                "16MiB", "--slab-size", "1MiB"},
               dir_ + "/second.log");
  int st = second.Wait();
  ASSERT_TRUE(WIFEXITED(st)) << second.Output();
  EXPECT_NE(WEXITSTATUS(st), 0);
  EXPECT_NE(second.Output().find("another ferryd (pid " + std::to_string(daemon_->pid()) + ") serves"), std::string::npos)
      << second.Output();
  auto c = StartClient({"roundtrip", socket_, "4096", "2"}, "still");
  st = c->Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << c->Output();
}

TEST_F(RealDaemon, AfterFerrydIsKilledClientsGetAClearErrorAndARestartServesAgain) {
  auto holder = StartClient({"hold", socket_, std::to_string(1 << 20)}, "holder");
  ASSERT_TRUE(holder->WaitForOutput("ready")) << holder->Output();
  EXPECT_EQ(DevShmUse(daemon_->pid()), 0u);
  EXPECT_EQ(DevShmUse(holder->pid()), 0u);
  daemon_->Signal(SIGKILL);
  EXPECT_TRUE(WIFSIGNALED(daemon_->Wait()));
  int st = holder->Wait(15s);
  ASSERT_TRUE(WIFEXITED(st)) << holder->Output();
  EXPECT_EQ(WEXITSTATUS(st), 2);
  EXPECT_NE(holder->Output().find("ferryd went away"), std::string::npos) << holder->Output();
  EXPECT_EQ(FerryShmEntries(), shm_before_) << "memfd segments leave nothing behind, even on SIGKILL";
  // The stale socket file is still there; a new ferryd takes the directory over.
  daemon_ = std::make_unique<Child>(
      std::vector<std::string>{FERRY_DAEMON_PATH, "--metrics-address", "127.0.0.1:0", "--backend", "host",
                               "--runtime-dir", dir_, "--pool-size", "64MiB", "--slab-size", "1MiB"},
      dir_ + "/ferryd2.log");
  ASSERT_TRUE(daemon_->WaitForOutput("ready")) << daemon_->Output();
  auto c = StartClient({"roundtrip", socket_, std::to_string(3 << 20), "3"}, "again");
  st = c->Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << c->Output();
}

TEST_F(RealDaemon, AStoppedClientDoesNotHoldUpTheOthers) {
  auto sleeper = StartClient({"hold", socket_, std::to_string(4 << 20)}, "sleeper");
  ASSERT_TRUE(sleeper->WaitForOutput("ready")) << sleeper->Output();
  sleeper->Signal(SIGSTOP);
  auto c = StartClient({"roundtrip", socket_, std::to_string(4 << 20), "20"}, "busy");
  int st = c->Wait(120s);  // seconds when it works, even under TSan on busy cores; never, when it does not
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << c->Output();
  sleeper->Signal(SIGCONT);
  std::this_thread::sleep_for(50ms);
  sleeper->Signal(SIGKILL);
  sleeper->Wait();
}

TEST_F(RealDaemon, TheCApiWorksFromAPlainCProgram) {
  Child c({FERRY_C_API_TEST_PATH, socket_}, dir_ + "/c.log");
  int st = c.Wait();
  ASSERT_TRUE(WIFEXITED(st)) << c.Output();
  EXPECT_EQ(WEXITSTATUS(st), 0) << c.Output();
  EXPECT_NE(c.Output().find("all checks passed"), std::string::npos) << c.Output();
}

TEST_F(RealDaemon, ACProgramBuiltAgainstTheFirstPublishedStructsStillWorks) {
  Child c({FERRY_C_API_V1_TEST_PATH, socket_}, dir_ + "/c_v1.log");
  int st = c.Wait();
  ASSERT_TRUE(WIFEXITED(st)) << c.Output();
  EXPECT_EQ(WEXITSTATUS(st), 0) << c.Output();
  EXPECT_NE(c.Output().find("all checks passed"), std::string::npos) << c.Output();
}

TEST_F(RealDaemon, TheSocketIsNotWorldAccessible) {
  struct stat st{};
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & S_IRWXO, 0u) << std::oct << st.st_mode;
}

TEST_F(RealDaemon, FerryctlAppliesPoliciesAndABadOneChangesNothing) {
  auto ctl = [&](std::vector<std::string> args, const std::string& tag) {
    args.insert(args.begin(), {FERRY_CTL_PATH, "--socket", socket_});
    auto c = std::make_unique<Child>(std::move(args), dir_ + "/" + tag + ".log");
    int st = c->Wait();
    return std::make_pair(WIFEXITED(st) ? WEXITSTATUS(st) : -1, c->Output());
  };
  const std::string src = FERRY_SOURCE_DIR;
  auto [rc0, before] = ctl({"policy", "show"}, "show0");
  ASSERT_EQ(rc0, 0) << before;
  {
    std::ofstream(dir_ + "/bad.yaml") << "name: broken\nschedule:\n  kind: chunked\n  chunk_size: 8MiB\n  ratio: 2\n";
  }
  auto [rc1, out1] = ctl({"policy", "apply", dir_ + "/bad.yaml"}, "bad");
  EXPECT_EQ(rc1, 1);
  EXPECT_NE(out1.find("bad.yaml:5:10: ratio applies to kind geometric only"), std::string::npos) << out1;
  EXPECT_NE(out1.find("unchanged"), std::string::npos) << out1;
  EXPECT_EQ(ctl({"policy", "show"}, "show1").second, before);

  auto [rc2, out2] = ctl({"policy", "apply", src + "/policies/geometric.yaml"}, "good");
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("applied"), std::string::npos) << out2;
  auto [rc3, diff] = ctl({"policy", "diff", "running", src + "/policies/geometric.yaml"}, "diff");
  EXPECT_EQ(rc3, 0);
  EXPECT_EQ(diff, "no differences\n");
  EXPECT_TRUE(testing::DaemonHarness::Eventually(
      [&] { return daemon_->Output().find("policy switched: chunked") != std::string::npos; }, 2000))
      << daemon_->Output();
  // Copies still work under the new policy.
  auto c = StartClient({"roundtrip", socket_, std::to_string(5 << 20), "3"}, "after");
  int st = c->Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << c->Output();
}

TEST(Ferryd, SighupReloadsThePolicyFile) {
  std::string dir = testing::MakeTempDir("hup");
  const std::string policy = dir + "/policy.yaml";
  std::ofstream(policy) << "name: one\nschedule: {kind: serial}\n";
  Child d({FERRY_DAEMON_PATH, "--metrics-address", "127.0.0.1:0", "--backend", "host", "--runtime-dir", dir, "--pool-size", "16MiB", "--slab-size", "1MiB",
           "--policy", policy},
          dir + "/ferryd.log");
  // The socket answers "starting" before ferryd is ready: its log says when it is.
  ASSERT_TRUE(testing::DaemonHarness::Eventually([&] { return d.Output().find("[info] ready") != std::string::npos; }, 10000))
      << d.Output();
  std::ofstream(policy) << "name: two\nschedule: {kind: side-stream}\n";
  d.Signal(SIGHUP);
  EXPECT_TRUE(testing::DaemonHarness::Eventually(
      [&] { return d.Output().find("policy switched: one") != std::string::npos; }, 5000)) << d.Output();
  std::ofstream(policy) << "name: three\nschedule: {kind: nonsense}\n";
  d.Signal(SIGHUP);
  EXPECT_TRUE(testing::DaemonHarness::Eventually(
      [&] { return d.Output().find("refused, keeping two") != std::string::npos; }, 5000)) << d.Output();
  d.Signal(SIGTERM);
  int st = d.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << d.Output();
  fs::remove_all(dir);
}

TEST(Ferryd, AskedToTraceTheEnginesOnTheHostBackendItSaysItCannotAndServes) {
  std::string dir = testing::MakeTempDir("trace");
  Child d({FERRY_DAEMON_PATH, "--metrics-address", "", "--backend", "host", "--runtime-dir", dir, "--pool-size",
           "16MiB", "--slab-size", "1MiB", "--trace-engine"},
          dir + "/ferryd.log");
  ASSERT_TRUE(testing::DaemonHarness::Eventually([&] { return d.Output().find("[info] ready") != std::string::npos; }, 10000))
      << d.Output();
  EXPECT_NE(d.Output().find("--trace-engine ignored: the host backend has no copy engines"), std::string::npos)
      << d.Output();
  d.Signal(SIGTERM);
  int st = d.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << d.Output();
  fs::remove_all(dir);
}

TEST(Ferryd, ABadConfigIsRefusedWithItsLineAndColumn) {
  std::string dir = testing::MakeTempDir("cfg");
  {
    std::ofstream f(dir + "/bad.yaml");
    f << "pool:\n  size: 64MiB\n  slab: lots\n";
  }
  Child c({FERRY_DAEMON_PATH, "--check-config", "--config", dir + "/bad.yaml"}, dir + "/out.log");
  int st = c.Wait();
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_NE(WEXITSTATUS(st), 0);
  EXPECT_NE(c.Output().find("bad.yaml:3:"), std::string::npos) << c.Output();
  // The shipped config, on this machine: --check-config checks that allowed_group exists and
  // that runtime_dir is ferryd's own, so name a group that exists here and a directory of ours.
  std::string shipped;
  {
    std::ifstream in(std::string(FERRY_SOURCE_DIR) + "/config/ferryd.yaml");
    shipped.assign(std::istreambuf_iterator<char>(in), {});
  }
  const group* own_group = ::getgrgid(::getgid());
  ASSERT_NE(own_group, nullptr);
  for (auto [from, to] : {std::pair<std::string, std::string>{"allowed_group: ferry ", "allowed_group: " + std::string(own_group->gr_name) + " "},
                          {"runtime_dir: /run/ferry ", "runtime_dir: " + dir + "/rt "}}) {
    ASSERT_NE(shipped.find(from), std::string::npos) << from;
    shipped.replace(shipped.find(from), from.size(), to);
  }
  std::ofstream(dir + "/shipped.yaml") << shipped;
  Child good({FERRY_DAEMON_PATH, "--check-config", "--config", dir + "/shipped.yaml"}, dir + "/good.log");
  st = good.Wait();
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << good.Output();
  EXPECT_NE(good.Output().find("polls 200 to 20000 us after its last activity"), std::string::npos) << good.Output();
  fs::remove_all(dir);
}

TEST(Ferryd, HelpDescribesEveryFlag) {
  std::string dir = testing::MakeTempDir("help");
  Child c({FERRY_DAEMON_PATH, "--help"}, dir + "/out.log");
  int st = c.Wait();
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  for (const char* flag :
       {"--config", "--runtime-dir", "--backend", "--pool-size", "--check-config", "--log-level", "--issue-threads"}) {
    EXPECT_NE(c.Output().find(flag), std::string::npos) << flag;
  }
  fs::remove_all(dir);
}

// --issue-threads takes a whole number of threads, 1 to 16; anything else stops ferryd with a
// usage error (exit 2) that says what it takes.
TEST(Ferryd, IssueThreadsOutOfRangeOrNotANumberIsAUsageError) {
  std::string dir = testing::MakeTempDir("issue-threads");
  for (const char* bad : {"0", "17", "4x", " 4", "-1"}) {
    Child c({FERRY_DAEMON_PATH, "--issue-threads", bad, "--check-config", "--backend", "host"}, dir + "/bad.log");
    const int st = c.Wait();
    ASSERT_TRUE(WIFEXITED(st)) << bad;
    EXPECT_EQ(WEXITSTATUS(st), 2) << bad << ": " << c.Output();
    EXPECT_NE(c.Output().find("--issue-threads takes 1 to 16"), std::string::npos) << bad << ": " << c.Output();
  }
  Child good({FERRY_DAEMON_PATH, "--issue-threads", "16", "--check-config", "--backend", "host"}, dir + "/good.log");
  const int st = good.Wait();
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << good.Output();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ferry
