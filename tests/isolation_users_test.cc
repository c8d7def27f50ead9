// Pool isolation with two real users (docs/design.md, "Isolation: what ferry promises"): a root
// ferryd serving an allowed_group, and clients of two system users made for the test, using the
// C API the way issue 19's attack did (alloc, disconnect, keep using ferry_host_data()).
// Needs root to create the users; skipped otherwise (CI runs it as root).
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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
using testing::DaemonHarness;

int Shell(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// ferry_isolation_client running as `uid`: one command a line in, one answer a line out.
class UserClient {
 public:
  UserClient(const std::string& dir, const std::string& tag, uid_t uid, gid_t gid, const std::string& socket)
      : out_path_(dir + "/" + tag + ".log") {
    const std::string program = dir + "/ferry_isolation_client";
    const std::string libs = "LD_LIBRARY_PATH=" + dir;
    UniqueFd out(::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    int in[2];
    if (!out.valid() || ::pipe2(in, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {  // async-signal-safe calls only
      const gid_t groups[1] = {gid};
      if (::dup2(in[0], 0) < 0 || ::dup2(out.get(), 1) < 0 || ::dup2(out.get(), 2) < 0) _exit(70);
      if (::setgroups(1, groups) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) _exit(71);
      char* argv[] = {const_cast<char*>(program.c_str()), const_cast<char*>(socket.c_str()), nullptr};
      char* envp[] = {const_cast<char*>(libs.c_str()), nullptr};
      ::execve(program.c_str(), argv, envp);
      _exit(72);
    }
    ::close(in[0]);
    in_.reset(in[1]);
  }
  ~UserClient() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }

  // Sends one command and returns its answer ("ok ...", or what went wrong).
  std::string Do(const std::string& cmd) {
    const std::string line = cmd + "\n";
    if (::write(in_.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) return "write failed";
    const std::string prefix = std::to_string(++sent_) + ": ";
    for (auto end = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < end;) {
      std::ifstream f(out_path_);
      for (std::string l; std::getline(f, l);) {
        if (l.rfind(prefix, 0) == 0) return l.substr(prefix.size());
      }
      std::this_thread::sleep_for(2ms);
    }
    std::ifstream f(out_path_);
    return "no answer to '" + cmd + "'; output: " + std::string(std::istreambuf_iterator<char>(f), {});
  }
  // Waits for the process to end after "quit".
  bool Exited() {
    int st = 0;
    const bool ok = ::waitpid(pid_, &st, 0) == pid_ && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    pid_ = -1;
    return ok;
  }

 private:
  std::string out_path_;
  pid_t pid_ = -1;
  UniqueFd in_;
  unsigned sent_ = 0;
};

class TwoUsers : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "needs root: creates two system users and a group (useradd/groupadd -r) to test isolation "
                      "between uids; CI runs it as root";
    }
    const std::string tag = std::to_string(::getpid());
    group_ = "ferryiso" + tag;
    users_ = {"ferryisoa" + tag, "ferryisob" + tag};
    ASSERT_EQ(Shell("groupadd -r " + group_), 0);
    made_group_ = true;
    for (auto& u : users_) {
      ASSERT_EQ(Shell("useradd -r -M -N -g " + group_ + " -s /usr/sbin/nologin " + u), 0) << u;
      made_users_.push_back(u);
      passwd* pw = ::getpwnam(u.c_str());
      ASSERT_NE(pw, nullptr) << u;
      uids_.push_back(pw->pw_uid);
    }
    group* g = ::getgrnam(group_.c_str());
    ASSERT_NE(g, nullptr);
    gid_ = g->gr_gid;

    dir_ = testing::MakeTempDir("users");
    ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);  // the users reach the socket (itself 0660, group-owned)
    fs::copy_file(FERRY_ISOLATION_CLIENT_PATH, dir_ + "/ferry_isolation_client");
    fs::copy_file(FERRY_LIBRARY_PATH, dir_ + "/libferry.so.0");  // the build tree may be closed to them
    socket_ = dir_ + "/ferryd.sock";
    {
      std::ofstream f(dir_ + "/ferryd.yaml");
      f << "runtime_dir: " << dir_ << "\nallowed_group: " << group_ << "\nbackend: host\n"
        << "pool:\n  size: 8MiB\n  slab: 1MiB\nlimits:\n  pool_per_uid: 3MiB\n";
    }
    daemon_ = std::make_unique<Child>(
        std::vector<std::string>{FERRY_DAEMON_PATH, "--config", dir_ + "/ferryd.yaml", "--metrics-address", "",
                                 "--log-level", "debug"},
        dir_ + "/ferryd.log");
    ASSERT_GT(daemon_->pid(), 0);
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return fs::exists(socket_); }, 10000)) << daemon_->Output();
  }
  void TearDown() override {
    observer_.reset();
    daemon_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
    for (auto& u : made_users_) Shell("userdel " + u + " 2>/dev/null");
    if (made_group_) Shell("groupdel " + group_ + " 2>/dev/null");
  }
  std::unique_ptr<UserClient> As(int user, const std::string& tag) {
    return std::make_unique<UserClient>(dir_, tag, uids_[user], gid_, socket_);
  }
  uint64_t PoolFree() {
    if (!observer_) {
      auto c = Client::Connect({.socket_path = socket_, .name = "observer"});
      if (!c.ok()) return 0;
      observer_ = std::move(*c);
    }
    auto st = observer_->Stats();
    return st.ok() ? st->pool_free_bytes : 0;
  }

  std::string group_, dir_, socket_;
  std::vector<std::string> users_, made_users_;
  std::vector<uid_t> uids_;
  gid_t gid_ = 0;
  bool made_group_ = false;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<Client> observer_;
};

TEST_F(TwoUsers, AUserWhoKeepsAnEndedSessionsMappingSharesNoPageWithAnotherAndPaysForIt) {
  constexpr int kSlab = 1 << 20;
  // User 1 takes a slab, writes a secret, disconnects and keeps the mapping.
  auto u1 = As(0, "user1");
  ASSERT_EQ(u1->Do("connect"), "ok");
  ASSERT_EQ(u1->Do("alloc " + std::to_string(kSlab)), "ok 0");
  ASSERT_EQ(u1->Do("fill 0 90"), "ok");
  ASSERT_EQ(u1->Do("disconnect"), "ok");

  // User 2 connects next and takes its whole share: fresh zeroed pages, none of user 1's.
  auto u2 = As(1, "user2");
  ASSERT_EQ(u2->Do("connect"), "ok");
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(u2->Do("alloc " + std::to_string(kSlab)), "ok " + std::to_string(i)) << daemon_->Output();
    EXPECT_EQ(u2->Do("check " + std::to_string(i) + " 0"), "ok") << "user 2 sees bytes it did not write";
    ASSERT_EQ(u2->Do("fill " + std::to_string(i) + " 178"), "ok");
  }

  // User 1 still sees only its own secret, and its writes reach none of user 2's buffers.
  EXPECT_EQ(u1->Do("check 0 90"), "ok") << "user 1 reads another user's bytes";
  ASSERT_EQ(u1->Do("fill 0 17"), "ok");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(u2->Do("check " + std::to_string(i) + " 178"), "ok") << "buffer " << i;

  // User 1's held slab counts against user 1: its next session gets 2 MiB, not 3; user 2 was unaffected.
  ASSERT_EQ(u1->Do("connect"), "ok");
  ASSERT_EQ(u1->Do("alloc " + std::to_string(kSlab)), "ok 1");
  ASSERT_EQ(u1->Do("alloc " + std::to_string(kSlab)), "ok 2");
  const std::string refused = u1->Do("alloc " + std::to_string(kSlab));
  EXPECT_NE(refused.find("uid " + std::to_string(uids_[0]) +
                         " holds 3 MiB (1 MiB awaiting reclaim: still mapped after its session ended)"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("limits.pool_per_uid is 3 MiB"), std::string::npos) << refused;

  // Both let go: every slab is zeroed and back in the pool.
  ASSERT_EQ(u1->Do("quit"), "ok");
  EXPECT_TRUE(u1->Exited());
  ASSERT_EQ(u2->Do("quit"), "ok");
  EXPECT_TRUE(u2->Exited());
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return PoolFree() == 8u * kSlab; }, 5000))
      << "pool free " << PoolFree() << "\n" << daemon_->Output();
  EXPECT_NE(daemon_->Output().find("1 MiB quarantined"), std::string::npos) << daemon_->Output();
}

}  // namespace
}  // namespace ferry
