// Pool isolation between sessions (docs/design.md, "Isolation: what ferry promises"): the probe
// that tells whether anyone outside ferryd still holds a slab, quarantine of an ended session's
// slabs, per-uid limits, and zeroing off the event loop. The two-user version runs real
// processes of two system users: isolation_users_test.cc.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "common/channel.hpp"
#include "daemon/pinned_pool.hpp"
#include "ferry/client.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using testing::DaemonHarness;

// ---- SlabHeldOutside: the kernel's answer to "does a description other than ferryd's exist?" ----

class HeldOutside : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fd = CreateSealedMemfd("held-outside-test", kBytes);
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    slab_ = std::move(*fd);
    auto m = MapShared(slab_.get(), kBytes);  // ferryd maps its own description, like the pool
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    own_ = std::move(*m);
  }
  bool Held() {
    auto h = daemon::SlabHeldOutside(slab_.get());
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    return h.ok() && *h;
  }
  UniqueFd Reopen(int flags) {
    return UniqueFd(::open(("/proc/self/fd/" + std::to_string(slab_.get())).c_str(), flags | O_CLOEXEC));
  }
  // Waits for a forked child; false unless it exited 0.
  static bool Reap(pid_t pid) {
    int st = 0;
    return ::waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }

  static constexpr size_t kBytes = 1 << 20;
  UniqueFd slab_;
  Mapping own_;
};

TEST_F(HeldOutside, FerrydsOwnDescriptionAndMappingDoNotCount) {
  EXPECT_FALSE(Held());
  EXPECT_FALSE(Held()) << "the probe itself leaves nothing behind";
}

TEST_F(HeldOutside, AReopenedDescriptionCountsUntilClosedReadOnlyOrReadWrite) {
  for (int flags : {O_RDWR, O_RDONLY}) {
    UniqueFd other = Reopen(flags);
    ASSERT_TRUE(other.valid());
    EXPECT_TRUE(Held()) << "flags " << flags;
    other.reset();
    EXPECT_FALSE(Held()) << "flags " << flags;
  }
}

TEST_F(HeldOutside, AMappingKeepsItsDescriptionAliveAfterTheFdIsClosed) {
  UniqueFd other = Reopen(O_RDWR);
  ASSERT_TRUE(other.valid());
  auto m = MapShared(other.get(), kBytes);
  ASSERT_TRUE(m.ok());
  other.reset();
  EXPECT_TRUE(Held());
  m->reset();
  EXPECT_FALSE(Held());
}

TEST_F(HeldOutside, AForkedChildsMappingCountsUntilTheChildExits) {
  UniqueFd other = Reopen(O_RDWR);
  ASSERT_TRUE(other.valid());
  auto m = MapShared(other.get(), kBytes);
  ASSERT_TRUE(m.ok());
  other.reset();
  int go[2];
  ASSERT_EQ(::pipe2(go, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // inherits the mapping; waits for the parent's word, then exits
    char c;
    ::close(go[1]);
    _exit(::read(go[0], &c, 1) >= 0 ? 0 : 1);
  }
  ::close(go[0]);
  m->reset();  // the parent lets go; the child still maps it
  EXPECT_TRUE(Held());
  ::close(go[1]);
  EXPECT_TRUE(Reap(child));
  EXPECT_FALSE(Held());
}

TEST_F(HeldOutside, AnFdPassedToAnotherProcessCountsUntilThatProcessLetsGo) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd parent_end(sv[0]);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // receives the fd, says so, keeps it until told to go
    ::close(sv[0]);
    char c = 0;
    char ctrl[CMSG_SPACE(sizeof(int))];
    iovec iov{&c, 1};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctrl;
    mh.msg_controllen = sizeof ctrl;
    if (::recvmsg(sv[1], &mh, 0) != 1) _exit(1);
    if (::send(sv[1], "r", 1, 0) != 1) _exit(1);
    _exit(::recv(sv[1], &c, 1, 0) >= 0 ? 0 : 1);
  }
  ::close(sv[1]);
  {
    UniqueFd other = Reopen(O_RDWR);
    ASSERT_TRUE(other.valid());
    char c = 'x';
    char ctrl[CMSG_SPACE(sizeof(int))] = {};
    iovec iov{&c, 1};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctrl;
    mh.msg_controllen = sizeof ctrl;
    cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    const int fd = other.get();
    std::memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    ASSERT_EQ(::sendmsg(parent_end.get(), &mh, 0), 1);
  }  // our copy closed: only the child's remains
  char r = 0;
  ASSERT_EQ(::recv(parent_end.get(), &r, 1, 0), 1);
  EXPECT_TRUE(Held());
  // Reopening the child's fd through /proc makes another description; it counts too.
  UniqueFd via_proc;
  for (int fd = 3; fd < 64 && !via_proc.valid(); ++fd) {
    struct stat a {}, b {};
    const std::string path = "/proc/" + std::to_string(child) + "/fd/" + std::to_string(fd);
    if (::stat(path.c_str(), &a) == 0 && ::fstat(slab_.get(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
      via_proc.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    }
  }
  ASSERT_TRUE(via_proc.valid()) << "the child's fd was not found in /proc/" << child << "/fd";
  parent_end.reset();  // the child's recv returns 0: it exits
  EXPECT_TRUE(Reap(child));
  EXPECT_TRUE(Held()) << "the description re-opened through /proc is still open";
  via_proc.reset();
  EXPECT_FALSE(Held());
}

// ---- the daemon: quarantine, per-uid limits, zeroing off the loop ----

// A ferryd Server in this process, with a test seam for the slab zeroer.
class Ferryd {
 public:
  // fault: if given, set to the fault-injecting backend that wraps the host backend.
  explicit Ferryd(daemon::DaemonConfig config, daemon::ServerOptions options = {},
                  daemon::FaultInjectingBackend** fault = nullptr) {
    dir_ = testing::MakeTempDir("iso");
    config.runtime_dir = dir_;
    auto host = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
    EXPECT_TRUE(host.ok()) << host.status().ToString();
    if (!host.ok()) return;
    std::unique_ptr<daemon::Backend> backend = std::move(*host);
    if (fault != nullptr) {
      auto wrapped = std::make_unique<daemon::FaultInjectingBackend>(std::move(backend));
      *fault = wrapped.get();
      backend = std::move(wrapped);
    }
    options.policy = DaemonHarness::SmallChunks();
    auto s = daemon::Server::Create(config, std::move(backend), std::move(options));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return;
    server_ = std::move(*s);
    thread_ = std::thread([this] { run_status_ = server_->Run(); });
  }
  ~Ferryd() {
    if (thread_.joinable()) {
      server_->Stop();
      thread_.join();
      EXPECT_TRUE(run_status_.ok()) << run_status_.ToString();
    }
    std::filesystem::remove_all(dir_);
  }
  bool ok() const { return server_ != nullptr; }
  Result<std::unique_ptr<Client>> Connect(const std::string& name) {
    return Client::Connect({.socket_path = server_->config().SocketPath(), .name = name});
  }
  const daemon::ServerCounters& counters() const { return server_->counters(); }

 private:
  std::string dir_;
  std::unique_ptr<daemon::Server> server_;
  std::thread thread_;
  Status run_status_;
};

daemon::DaemonConfig Config(uint64_t pool_mib) {
  daemon::DaemonConfig c = DaemonHarness::SmallConfig();
  c.pool_bytes = pool_mib << 20;
  c.slab_bytes = 1 << 20;
  return c;
}

bool AllBytesAre(const std::byte* p, size_t n, std::byte v) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != v) return false;
  }
  return true;
}

// A random round trip through the buffer: it is usable, and every byte arrives.
void RoundTrip(Client& c, HostBuffer& buf, size_t n) {
  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, c.AllocateDevice(n));
  ASSERT_OK_AND_ASSIGN(DeviceRegion region, c.RegisterDevice(dev.data(), dev.size()));
  std::vector<std::byte> want(n);
  testing::FillRandom(want.data(), n, testing::RandomSeed());
  std::memcpy(buf.data(), want.data(), n);
  ASSERT_OK_AND_ASSIGN(Transfer up, c.Copy(Direction::kHostToDevice, buf, 0, region, 0, n));
  ASSERT_OK(up.Wait(10s));
  testing::Poison(buf.data(), n);
  ASSERT_OK_AND_ASSIGN(Transfer down, c.Copy(Direction::kDeviceToHost, buf, 0, region, 0, n));
  ASSERT_OK(down.Wait(10s));
  EXPECT_EQ(testing::FirstDifference(buf.data(), want.data(), n), -1);
}

// Issue 19 item 1: a client that ends its session but keeps its mapping must never share pages
// with the next session. Its slab stays out of the pool until it lets go, then comes back zeroed.
TEST(Quarantine, AnEndedSessionsSlabIsNotReusedWhileItsClientStillMapsIt) {
  Ferryd d(Config(4));  // four slabs of 1 MiB
  ASSERT_TRUE(d.ok());
  constexpr size_t kSlab = 1 << 20;
  std::optional<HostBuffer> kept;  // A's buffer, outliving A's session
  std::vector<std::byte> secret(4096);
  testing::FillRandom(secret.data(), secret.size(), testing::RandomSeed());
  {
    ASSERT_OK_AND_ASSIGN(auto a, d.Connect("a"));
    ASSERT_OK_AND_ASSIGN(HostBuffer buf, a->AllocateHost(secret.size()));
    std::memcpy(buf.data(), secret.data(), secret.size());
    kept.emplace(std::move(buf));
  }  // A's session ends; its mapping lives on in `kept`
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sessions == 0; }));
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().pool_quarantined_bytes == kSlab; }))
      << d.counters().pool_quarantined_bytes;

  ASSERT_OK_AND_ASSIGN(auto b, d.Connect("b"));
  std::vector<HostBuffer> bufs;
  std::vector<std::vector<std::byte>> mine;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(HostBuffer buf, b->AllocateHost(kSlab));
    EXPECT_TRUE(AllBytesAre(buf.data(), kSlab, std::byte{0})) << "a fresh slab is zeroed";
    mine.emplace_back(kSlab);
    testing::FillRandom(mine.back().data(), kSlab, testing::RandomSeed());
    std::memcpy(buf.data(), mine.back().data(), kSlab);
    bufs.push_back(std::move(buf));
  }
  auto fourth = b->AllocateHost(kSlab);
  ASSERT_FALSE(fourth.ok()) << "B got the slab A still maps";
  EXPECT_EQ(fourth.status().code(), Code::kResourceExhausted);
  EXPECT_NE(fourth.status().message().find("1 await reclaim"), std::string::npos) << fourth.status().ToString();

  // A still reads only its own bytes, and what A writes reaches none of B's buffers.
  EXPECT_EQ(testing::FirstDifference(kept->data(), secret.data(), secret.size()), -1);
  testing::FillRandom(kept->data(), secret.size(), testing::RandomSeed());
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_EQ(testing::FirstDifference(bufs[i].data(), mine[i].data(), kSlab), -1) << "buffer " << i;
  }

  // A lets go: the slab is zeroed and B may have it.
  kept.reset();
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().pool_free_bytes == kSlab; }, 5000))
      << "free " << d.counters().pool_free_bytes << ", quarantined " << d.counters().pool_quarantined_bytes;
  EXPECT_EQ(d.counters().pool_quarantined_bytes, 0u);
  ASSERT_OK_AND_ASSIGN(HostBuffer last, b->AllocateHost(kSlab));
  EXPECT_TRUE(AllBytesAre(last.data(), kSlab, std::byte{0})) << "A's secret is gone";
  RoundTrip(*b, last, kSlab);
}

size_t OpenFdCount() {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Review of issue 19: ferryd watches an ended session's client (a pidfd) only while that
// session's slabs are quarantined, not while any slab is. A client process that churns sessions
// (each buffer briefly outliving its socket) while another slab stays quarantined all along
// leaves ferryd's fd count where it was.
TEST(Quarantine, ChurningSessionsWhileAnotherSlabStaysQuarantinedLeaksNoFds) {
  Ferryd d(Config(4));
  ASSERT_TRUE(d.ok());
  constexpr uint64_t kSlab = 1 << 20;
  std::optional<HostBuffer> held;  // quarantined all along
  {
    ASSERT_OK_AND_ASSIGN(auto c, d.Connect("holder"));
    ASSERT_OK_AND_ASSIGN(HostBuffer buf, c->AllocateHost(4096));
    held.emplace(std::move(buf));
  }
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().pool_quarantined_bytes == kSlab; }));
  const size_t baseline = OpenFdCount();
  constexpr int kSessions = 40;
  for (int i = 0; i < kSessions; ++i) {
    std::optional<HostBuffer> kept;
    {
      ASSERT_OK_AND_ASSIGN(auto c, d.Connect("churn"));
      ASSERT_OK_AND_ASSIGN(HostBuffer buf, c->AllocateHost(4096));
      kept.emplace(std::move(buf));
    }  // the socket closes before the buffer is unmapped
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().pool_quarantined_bytes == 2 * kSlab; }))
        << "session " << i;
    kept.reset();
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().pool_quarantined_bytes == kSlab; }, 5000))
        << "session " << i;
  }
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sessions == 0; }));
  EXPECT_LE(OpenFdCount(), baseline + 4) << "ferryd keeps a pidfd per ended session (" << kSessions << " sessions)";
}

// Issue 19 item 1, pages pinned without a description: a client that vmsplice()s a page of its
// slab into a pipe holds a reference to the page, not to the memfd, so the probe sees the slab
// free once the client unmaps and leaves. The reclaimed slab must get fresh pages: the pipe keeps
// the old page (A's own bytes) and never reads what the next session writes.
TEST(Quarantine, APageASessionPinnedInAPipeNeverSeesTheNextSessionsBytes) {
  Ferryd d(Config(1));  // one slab of 1 MiB: B must get A's slab
  ASSERT_TRUE(d.ok());
  constexpr size_t kSlab = 1 << 20, kPage = 4096;
  std::vector<std::byte> a_bytes(kPage);
  testing::FillRandom(a_bytes.data(), kPage, testing::RandomSeed());
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK), 0);
  UniqueFd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
  {
    ASSERT_OK_AND_ASSIGN(auto a, d.Connect("a"));
    ASSERT_OK_AND_ASSIGN(HostBuffer buf, a->AllocateHost(kSlab));
    std::memcpy(buf.data(), a_bytes.data(), kPage);
    iovec iov{buf.data(), kPage};
    ASSERT_EQ(::vmsplice(pipe_write.get(), &iov, 1, SPLICE_F_NONBLOCK), static_cast<ssize_t>(kPage))
        << std::strerror(errno);
  }  // A unmaps, closes and leaves; only the pipe still references the page
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().pool_free_bytes == kSlab; }, 5000))
      << "free " << d.counters().pool_free_bytes << ", quarantined " << d.counters().pool_quarantined_bytes;

  ASSERT_OK_AND_ASSIGN(auto b, d.Connect("b"));
  ASSERT_OK_AND_ASSIGN(HostBuffer mine, b->AllocateHost(kSlab));
  EXPECT_TRUE(AllBytesAre(mine.data(), kSlab, std::byte{0})) << "a reclaimed slab reads as zeros";
  std::vector<std::byte> secret(kPage);
  testing::FillRandom(secret.data(), kPage, testing::RandomSeed());
  std::memcpy(mine.data(), secret.data(), kPage);

  std::vector<std::byte> leaked(kPage);
  ASSERT_EQ(::read(pipe_read.get(), leaked.data(), kPage), static_cast<ssize_t>(kPage)) << std::strerror(errno);
  EXPECT_NE(std::memcmp(leaked.data(), secret.data(), kPage), 0) << "A's pipe reads B's secret";
  EXPECT_EQ(testing::FirstDifference(leaked.data(), a_bytes.data(), kPage), -1) << "the pipe keeps A's own page";
  RoundTrip(*b, mine, kSlab);
}

// A reclaimed slab whose fresh pages the backend cannot pin again (cuda: cudaHostRegister
// fails) is never handed out: the engines could not reach it. It stays out, counted as broken.
TEST(Quarantine, ASlabTheBackendCannotPinAgainStaysOutOfThePool) {
  daemon::FaultInjectingBackend* fault = nullptr;
  Ferryd d(Config(2), {}, &fault);
  ASSERT_TRUE(d.ok());
  constexpr size_t kSlab = 1 << 20;
  fault->FailNextPinSlab(1);
  {
    ASSERT_OK_AND_ASSIGN(auto a, d.Connect("a"));
    ASSERT_OK_AND_ASSIGN(HostBuffer buf, a->AllocateHost(kSlab));
    testing::FillRandom(buf.data(), kSlab, testing::RandomSeed());
  }
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().pool_broken_bytes == kSlab; }, 5000))
      << "broken " << d.counters().pool_broken_bytes << ", free " << d.counters().pool_free_bytes;
  EXPECT_EQ(d.counters().pool_free_bytes, kSlab);
  EXPECT_EQ(d.counters().pool_zeroing_bytes, 0u);
  ASSERT_OK_AND_ASSIGN(auto b, d.Connect("b"));
  ASSERT_OK_AND_ASSIGN(HostBuffer one, b->AllocateHost(kSlab));
  RoundTrip(*b, one, kSlab);
  auto two = b->AllocateHost(kSlab);
  ASSERT_FALSE(two.ok()) << "B got the slab that could not be pinned again";
  EXPECT_NE(two.status().message().find("1 out of use (could not be pinned again)"), std::string::npos)
      << two.status().ToString();
}

// Issue 19 item 9: four sessions of one uid cannot take the pool; held slabs count; the
// granularity (whole slabs) is said.
TEST(UidLimits, SessionsOfOneUidShareOnePoolLimitThatCountsHeldSlabs) {
  daemon::DaemonConfig c = Config(16);
  c.session_quota_bytes = 4 << 20;
  c.limits.pool_bytes_per_uid = 8 << 20;
  Ferryd d(c);
  ASSERT_TRUE(d.ok());
  const std::string uid = "uid " + std::to_string(::geteuid());
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(auto cl, d.Connect("c" + std::to_string(i)));
    clients.push_back(std::move(cl));
  }
  ASSERT_OK_AND_ASSIGN(HostBuffer b0, clients[0]->AllocateHost(4 << 20));
  ASSERT_OK_AND_ASSIGN(HostBuffer b1, clients[1]->AllocateHost(4 << 20));
  auto over = clients[2]->AllocateHost(4 << 20);
  ASSERT_FALSE(over.ok()) << "a third session of the uid took more of the pool";
  EXPECT_EQ(over.status().code(), Code::kResourceExhausted);
  EXPECT_NE(over.status().message().find(uid + " holds 8 MiB and asks 4 MiB more"), std::string::npos)
      << over.status().ToString();
  EXPECT_NE(over.status().message().find("limits.pool_per_uid is 8 MiB"), std::string::npos) << over.status().ToString();
  // A 4 KiB buffer takes a whole slab, and the error says so.
  auto small = clients[3]->AllocateHost(4096);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("asks 1 MiB more"), std::string::npos) << small.status().ToString();
  EXPECT_NE(small.status().message().find("in whole 1 MiB slabs"), std::string::npos) << small.status().ToString();

  // Session 0 ends but its buffer stays mapped: still counted, and the error says why.
  clients[0].reset();
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().pool_quarantined_bytes == 4u << 20; }));
  over = clients[2]->AllocateHost(4 << 20);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find(uid + " holds 8 MiB (4 MiB awaiting reclaim: still mapped after its session ended)"),
            std::string::npos)
      << over.status().ToString();
  // Let go: the uid's share comes back.
  { HostBuffer gone = std::move(b0); }
  std::optional<HostBuffer> b2;
  ASSERT_TRUE(DaemonHarness::Eventually([&] {
    auto r = clients[2]->AllocateHost(4 << 20);
    if (r.ok()) b2.emplace(std::move(*r));
    return r.ok();
  }, 5000));
  RoundTrip(*clients[2], *b2, 4 << 20);
}

TEST(UidLimits, SessionsPerUidRefusesTheSeventeenthWithAClearMessage) {
  daemon::DaemonConfig c = Config(16);
  ASSERT_EQ(c.limits.sessions_per_uid, 16u);
  c.max_sessions = 64;
  Ferryd d(c);
  ASSERT_TRUE(d.ok());
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 16; ++i) {
    ASSERT_OK_AND_ASSIGN(auto cl, d.Connect(std::string("s").append(std::to_string(i))));
    clients.push_back(std::move(cl));
  }
  auto seventeenth = d.Connect("s16");
  ASSERT_FALSE(seventeenth.ok());
  EXPECT_EQ(seventeenth.status().code(), Code::kResourceExhausted);
  EXPECT_NE(seventeenth.status().message().find("uid " + std::to_string(::geteuid()) + " already has 16 sessions"),
            std::string::npos)
      << seventeenth.status().ToString();
  EXPECT_NE(seventeenth.status().message().find("limits.sessions_per_uid is 16"), std::string::npos)
      << seventeenth.status().ToString();
  clients.pop_back();
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.Connect("again").ok(); }, 5000));
  // Turned away, counted as a rejection: it broke no rule, so it is no eviction. (Read after a
  // later hello was served: by then ferryd has closed the refused session.)
  EXPECT_GE(d.counters().rejected.load(), 1u);
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

// Issue 19 item 16: renewing a reclaimed slab runs on the pool's zeroer thread. The seam holds
// the renewal until the test lets it go; another client's 4 KiB round trip completes meanwhile.
TEST(Zeroing, AnotherClientsCopyCompletesWhileAReclaimedSlabIsBeingZeroed) {
  std::mutex mu;
  std::condition_variable cv;
  bool zeroing = false, release = false;
  daemon::ServerOptions options;
  options.before_slab_renewal = [&](std::byte*, uint64_t) {
    std::unique_lock<std::mutex> l(mu);
    zeroing = true;
    cv.notify_all();
    cv.wait(l, [&] { return release; });
  };
  auto let_go = [&] {
    std::lock_guard<std::mutex> l(mu);
    release = true;
    cv.notify_all();
  };
  Ferryd d(Config(8), std::move(options));
  ASSERT_TRUE(d.ok());
  struct LetGo {  // before ferryd stops: its pool joins the zeroer
    std::function<void()> f;
    ~LetGo() { f(); }
  } guard{let_go};

  ASSERT_OK_AND_ASSIGN(auto other, d.Connect("other"));
  ASSERT_OK_AND_ASSIGN(HostBuffer small, other->AllocateHost(4096));
  {
    ASSERT_OK_AND_ASSIGN(auto leaving, d.Connect("leaving"));
    ASSERT_OK_AND_ASSIGN(HostBuffer big, leaving->AllocateHost(4 << 20));
    testing::FillRandom(big.data(), big.size(), testing::RandomSeed());
  }  // unmapped and disconnected: its slabs go to be zeroed at once
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, 10s, [&] { return zeroing; })) << "the slabs never went to the zeroer";
  }
  RoundTrip(*other, small, 4096);
  {
    std::lock_guard<std::mutex> l(mu);
    EXPECT_FALSE(release) << "the zeroing is still held";
  }
  EXPECT_EQ(d.counters().pool_zeroing_bytes, 4u << 20);
  let_go();
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().pool_free_bytes == 7u << 20; }, 5000))
      << d.counters().pool_free_bytes;
  ASSERT_OK_AND_ASSIGN(HostBuffer again, other->AllocateHost(4 << 20));
  EXPECT_TRUE(AllBytesAre(again.data(), again.size(), std::byte{0}));
}

}  // namespace
}  // namespace ferry
