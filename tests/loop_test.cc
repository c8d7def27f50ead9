// The event loop and the exporter never block on, or die because of, one client: clients that
// do not read their replies, connections that never say hello, running out of fds, a full
// listen backlog, too many device regions, a copy thread that cannot start, and slow HTTP
// clients of /metrics. Every copy uses random data into a poisoned destination and every byte
// is checked.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/status_macros.hpp"
#include "common/wire.hpp"
#include "daemon/metrics.hpp"
#include "daemon/poller.hpp"
#include "process_util.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using testing::CopyTarget;
using testing::DaemonHarness;
using testing::FillRandom;
using testing::FirstDifference;
using testing::MakeCopyTarget;
using testing::Poison;

double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Runs `f` on a thread joined on every way out of the scope.
class JoinedThread {
 public:
  template <typename F>
  explicit JoinedThread(F f) : t_(std::move(f)) {}
  ~JoinedThread() { Join(); }
  void Join() {
    if (t_.joinable()) t_.join();
  }

 private:
  std::thread t_;
};

// One client's 4 KiB host-to-device copy, checked byte by byte, timed from submission to completion.
class Copier {
 public:
  Status Open(DaemonHarness& d) { return Open(d.socket_path()); }
  Status Open(const std::string& socket) {
    ConnectOptions o;
    o.socket_path = socket;
    o.name = "copier";
    FERRY_ASSIGN_OR_RETURN(client_, Client::Connect(o));
    FERRY_ASSIGN_OR_RETURN(HostBuffer src, client_->AllocateHost(kBytes));
    FERRY_ASSIGN_OR_RETURN(DeviceAllocation dev, client_->AllocateDevice(kBytes));
    FERRY_ASSIGN_OR_RETURN(DeviceRegion region, client_->RegisterDevice(dev.data(), dev.size()));
    src_.emplace(std::move(src));
    dev_.emplace(std::move(dev));
    region_.emplace(std::move(region));
    return Status::Ok();
  }
  // Seconds the copy took; a failed copy or a wrong byte is a test failure.
  double OneCopy(uint64_t seed) {
    auto* device = static_cast<std::byte*>(dev_->data());
    FillRandom(src_->data(), kBytes, seed);
    Poison(device, kBytes);
    const auto start = std::chrono::steady_clock::now();
    auto t = client_->Copy(Direction::kHostToDevice, *src_, 0, *region_, 0, kBytes);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return 1e9;
    const Status waited = t->Wait(30s);
    const double took = Seconds(std::chrono::steady_clock::now() - start);
    EXPECT_TRUE(waited.ok()) << waited.ToString();
    EXPECT_EQ(FirstDifference(device, src_->data(), kBytes), -1) << "seed " << seed;
    return took;
  }
  Client& client() { return *client_; }

 private:
  static constexpr size_t kBytes = 4096;
  std::unique_ptr<Client> client_;
  std::optional<HostBuffer> src_;
  std::optional<DeviceAllocation> dev_;
  std::optional<DeviceRegion> region_;
};

double P99(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, v.size() * 99 / 100)];
}

// A session spoken by hand: says hello, then sends requests and reads replies only when told.
class RawClient {
 public:
  Status Open(const std::string& socket) {
    FERRY_ASSIGN_OR_RETURN(sock_, ConnectUnix(socket, 5000));
    wire::HelloRequest h{};
    h.client_version = wire::kVersion;
    CopyCString(h.name, "no-reader");
    FERRY_RETURN_IF_ERROR(Send(sock_.get(), wire::MsgType::kHello, 0, h));
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, RecvMessage(sock_.get(), 5000));
    if (m.type() != wire::MsgType::kHelloReply) return Internal("bad hello reply");
    return FromWire(m.As<wire::HelloReply>().status);
  }
  // Sends `n` stats requests numbered from `first_seq`, waiting for room as a client would;
  // stops at the first failure (ferryd hung up).
  void SendStats(uint32_t first_seq, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
      if (!Send(sock_.get(), wire::MsgType::kStats, first_seq + i, wire::StatsRequest{}).ok()) return;
    }
  }
  bool HungUp(int timeout_ms = 0) const {
    pollfd p{sock_.get(), POLLRDHUP, 0};
    return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & (POLLHUP | POLLRDHUP)) != 0;
  }
  int sock() const { return sock_.get(); }

 private:
  UniqueFd sock_;
};

// How many stats replies a Unix socket's send buffer holds before sendmsg says EAGAIN: what
// ferryd can send to a client that never reads before it must queue.
uint32_t RepliesThatFitInASocket() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  UniqueFd a(sv[0]), b(sv[1]);
  const wire::StatsReply reply{};
  const auto frame = FrameMessage(wire::MsgType::kStatsReply, 1, &reply, sizeof reply);
  uint32_t n = 0;
  while (n < 1'000'000) {
    auto sent = TrySendFramed(a.get(), frame);
    if (!sent.ok() || !*sent) break;
    ++n;
  }
  return n;
}

daemon::DaemonConfig ManySessionsConfig() {
  auto c = DaemonHarness::SmallConfig();
  c.max_sessions = 64;
  c.limits.sessions_per_uid = 64;
  c.limits.outbound_messages = 64;
  return c;
}

// Issue 19 item 3: replies were sent with a blocking send that waited up to 1 s on a client
// whose socket buffer was full: 20 such clients stalled every other client's copies ~20 s.
TEST(EventLoop, ClientsThatDoNotReadTheirRepliesNeitherStallOthersNorPileUp) {
  DaemonHarness d(ManySessionsConfig());
  const uint32_t fit = RepliesThatFitInASocket();
  ASSERT_GT(fit, 0u);
  Copier copier;
  ASSERT_OK(copier.Open(d));
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(fit) + " replies fit in a socket");
  for (int i = 0; i < 50; ++i) copier.OneCopy(seed + i);  // warm up
  std::vector<double> baseline;
  for (int i = 0; i < 300; ++i) baseline.push_back(copier.OneCopy(seed + 1000 + i));
  ASSERT_FALSE(HasFailure());

  // 20 sessions fill their sockets and leave 32 replies each in ferryd's queue (limit 64),
  // while the copier keeps copying: 300 copies from the moment they start, and more until they
  // have sent it all. (Before the fix the loop waited 1 s on each of them in turn.)
  constexpr int kClogs = 20;
  constexpr uint32_t kQueuedEach = 32;
  std::vector<RawClient> clogs(kClogs);
  for (auto& c : clogs) ASSERT_OK(c.Open(d.socket_path()));
  std::atomic<bool> clogging_done{false};
  std::vector<double> clogged;
  {
    JoinedThread measure([&] {
      for (int i = 0; !clogging_done || i < 300; ++i) clogged.push_back(copier.OneCopy(seed + 100000 + i));
    });
    for (auto& c : clogs) c.SendStats(1, fit + kQueuedEach);
    clogging_done = true;
  }
  EXPECT_TRUE(DaemonHarness::Eventually(
      [&] { return d.counters().outbound_queued.load() >= kClogs * (kQueuedEach - 8); }, 30000))
      << d.counters().outbound_queued.load() << " replies queued";
  const double p99_base = P99(baseline), p99_clogged = P99(clogged);
  std::printf("4 KiB copy p99: %.3f ms alone, %.3f ms beside %d clients that do not read (%zu copies)\n",
              p99_base * 1e3, p99_clogged * 1e3, kClogs, clogged.size());
  // The bug made the loop wait up to 1 s per such client (copies stalled for seconds). The
  // loop's own work for 20 x (fit + 32) requests can hold a copy for tens of ms on a loaded
  // 2-core machine, more under the sanitizers (a 50 ms slack failed once under load), so the
  // slack is a quarter of the old wait.
  EXPECT_LT(p99_clogged, std::max(3 * p99_base, p99_base + 0.25)) << "the loop waited on clients that do not read";
  EXPECT_EQ(d.counters().evictions.load(), 0u) << "no queue was over its limit yet";

  // Over the limit: each of them is evicted, and the copier is still served.
  for (auto& c : clogs) c.SendStats(100000, 64);
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().evictions.load() == kClogs; }, 10000))
      << d.counters().evictions.load() << " evicted";
  for (auto& c : clogs) EXPECT_TRUE(c.HungUp(5000));
  // An evicted session's queue is dropped when the loop reaps it, a turn or so after the hang-up.
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().outbound_queued.load() == 0; }, 10000))
      << d.counters().outbound_queued.load() << " replies still queued";
  for (int i = 0; i < 20; ++i) copier.OneCopy(seed + 200000 + i);
}

// A client killed after its request reached ferryd and before the reply went out is gone, not
// misbehaving: ferryd's send says EPIPE, and it ends the session as a disconnect, with no
// eviction counted (a soak that kills clients at random saw one counted). Shutting the client's
// read side is that moment made certain: the request is read, the reply finds no reader, and no
// hang-up is in sight yet.
TEST(EventLoop, AClientGoneBeforeItsReplyIsEndedNotEvicted) {
  DaemonHarness d(ManySessionsConfig());
  Copier copier;
  ASSERT_OK(copier.Open(d));
  RawClient gone;
  ASSERT_OK(gone.Open(d.socket_path()));
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sessions.load() == 2; }));
  ASSERT_EQ(::shutdown(gone.sock(), SHUT_RD), 0);
  gone.SendStats(1, 1);
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sessions.load() == 1; }, 10000))
      << d.counters().sessions.load() << " sessions";
  EXPECT_EQ(d.counters().evictions.load(), 0u) << "a client gone before its reply was counted as evicted";
  EXPECT_EQ(d.counters().outbound_queued.load(), 0u);
  for (int i = 0; i < 20; ++i) copier.OneCopy(testing::RandomSeed() + i);
}

// Replies that had to wait in ferryd's queue arrive, all of them, in order.
TEST(EventLoop, QueuedRepliesArriveInOrderOnceTheClientReads) {
  DaemonHarness d(ManySessionsConfig());
  const uint32_t fit = RepliesThatFitInASocket();
  RawClient slow;
  ASSERT_OK(slow.Open(d.socket_path()));
  const uint32_t n = fit + 40;
  slow.SendStats(1, n);
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().outbound_queued.load() > 0; }, 10000));
  for (uint32_t seq = 1; seq <= n; ++seq) {
    auto m = RecvMessage(slow.sock(), 5000);
    ASSERT_TRUE(m.ok()) << "reply " << seq << ": " << m.status().ToString();
    ASSERT_EQ(m->type(), wire::MsgType::kStatsReply);
    ASSERT_EQ(m->header.seq, seq) << "replies out of order";
  }
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().outbound_queued.load() == 0; }));
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

size_t OpenFdCount() {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Review of issue 19: the reply queue was bounded in messages, not in the fds they carry (dup'd
// slab fds), so a client that never reads made ferryd hold an fd per AllocBuffer it sent.
// While replies wait, requests whose reply carries fds are refused with a clear message.
TEST(EventLoop, AClientThatDoesNotReadCannotMakeFerrydHoldItsBuffersFds) {
  DaemonHarness d(ManySessionsConfig());
  const uint32_t fit = RepliesThatFitInASocket();
  ASSERT_GT(fit, 0u);
  RawClient slow;
  ASSERT_OK(slow.Open(d.socket_path()));
  slow.SendStats(1, fit + 1);
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().outbound_queued.load() > 0; }, 10000));
  const size_t baseline = OpenFdCount();
  constexpr uint32_t kAllocs = 40;  // queued with the one stats reply: under limits.outbound_messages
  for (uint32_t i = 0; i < kAllocs; ++i) {
    ASSERT_OK(Send(slow.sock(), wire::MsgType::kAllocBuffer, 100000 + i, wire::AllocBufferRequest{4096}));
  }
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().outbound_queued.load() == kAllocs + 1; }, 10000))
      << d.counters().outbound_queued.load() << " replies queued";
  EXPECT_LE(OpenFdCount(), baseline + 4) << "ferryd holds the fds of replies the client does not read";

  for (uint32_t seq = 1; seq <= fit + 1; ++seq) {
    auto m = RecvMessage(slow.sock(), 5000);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->type(), wire::MsgType::kStatsReply);
  }
  for (uint32_t i = 0; i < kAllocs; ++i) {
    auto m = RecvMessage(slow.sock(), 5000);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->type(), wire::MsgType::kAllocBufferReply);
    const Status st = FromWire(m->As<wire::AllocBufferReply>().status);
    EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
    EXPECT_NE(st.message().find("waiting for this client to read them"), std::string::npos) << st.ToString();
  }
  // Once it has read them, it is served again.
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().outbound_queued.load() == 0; }));
  ASSERT_OK(Send(slow.sock(), wire::MsgType::kAllocBuffer, 200000, wire::AllocBufferRequest{4096}));
  auto m = RecvMessage(slow.sock(), 5000);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->type(), wire::MsgType::kAllocBufferReply);
  EXPECT_TRUE(FromWire(m->As<wire::AllocBufferReply>().status).ok());
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

// An idle connection: connected, never says a word.
UniqueFd ConnectIdle(const std::string& socket) {
  auto fd = ConnectUnix(socket, 5000);
  EXPECT_TRUE(fd.ok()) << fd.status().ToString();
  return fd.ok() ? std::move(*fd) : UniqueFd();
}

bool HungUp(int fd, int timeout_ms = 0) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & (POLLHUP | POLLRDHUP)) != 0;
}

// Issue 19 item 5: connections that never said hello were unlimited.
TEST(EventLoop, ConnectionsThatDoNotSayHelloBeyondThePerUidCapAreClosedAtOnce) {
  auto config = DaemonHarness::SmallConfig();
  config.limits.pending_connections = 64;
  config.limits.pending_connections_per_uid = 4;
  config.limits.hello_timeout_ms = 600000;
  DaemonHarness d(config);
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 12; ++i) idle.push_back(ConnectIdle(d.socket_path()));
  auto hung_up = [&] { return std::count_if(idle.begin(), idle.end(), [](const UniqueFd& f) { return HungUp(f.get()); }); };
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return hung_up() == 8; }, 5000)) << hung_up() << " closed";
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(hung_up(), 8) << "the 4 within the cap stay";
  EXPECT_EQ(d.counters().rejected.load(), 8u);

  // At the cap, a client of that uid is told why it was closed.
  ConnectOptions o;
  o.socket_path = d.socket_path();
  auto refused = Client::Connect(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kUnavailable);
  EXPECT_NE(refused.status().message().find("before answering hello"), std::string::npos) << refused.status().ToString();

  // One idle connection gone, a real client connects and copies.
  idle.erase(std::find_if(idle.begin(), idle.end(), [](const UniqueFd& f) { return !HungUp(f.get()); }));
  Copier copier;
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return copier.Open(d).ok(); }, 5000));
  copier.OneCopy(testing::RandomSeed());
}

TEST(EventLoop, AConnectionThatSaysNothingIsClosedAfterTheHelloDeadline) {
  auto config = DaemonHarness::SmallConfig();
  config.limits.hello_timeout_ms = 300;
  DaemonHarness d(config);
  const auto start = std::chrono::steady_clock::now();
  UniqueFd idle = ConnectIdle(d.socket_path());
  ASSERT_TRUE(HungUp(idle.get(), 10000)) << "still open after 10 s";
  const double took = Seconds(std::chrono::steady_clock::now() - start);
  EXPECT_GE(took, 0.25);
  EXPECT_LT(took, 5.0);
  EXPECT_EQ(d.counters().evictions.load(), 1u);
  Copier copier;  // a client that says hello is not affected
  ASSERT_OK(copier.Open(d));
  std::this_thread::sleep_for(500ms);
  copier.OneCopy(testing::RandomSeed());
}

// CPU seconds (user + system) a process has used.
double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), {});
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {  // fields 14 and 15: utime, stime
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// A ferryd on the host backend under `ulimit -n 48` (what it needs to start and serve a few
// clients, and no more), out of fds once Start() returns: 100 connections that never say hello
// are held in `idle` (those ferryd turned away at the door are hung up). The directory goes with it.
struct FerrydOutOfFds {
  const std::string dir;
  const std::string socket = dir + "/ferryd.sock";
  std::unique_ptr<testing::Child> ferryd;
  std::vector<UniqueFd> idle;

  explicit FerrydOutOfFds(const char* tag) : dir(testing::MakeTempDir(tag)) {}
  ~FerrydOutOfFds() {
    idle.clear();
    ferryd.reset();
    std::filesystem::remove_all(dir);
  }
  void Start() {
    {
      std::ofstream cfg(dir + "/ferryd.yaml");
      cfg << "runtime_dir: " << dir << "\nbackend: host\npool:\n  size: 8MiB\n  slab: 1MiB\nspin_us: 50\n"
          << "metrics:\n  address: \"\"\nlimits:\n  pending_connections: 4096\n  pending_connections_per_uid: 4096\n"
          << "  hello_timeout_ms: 600000\n";
    }
    ferryd = std::make_unique<testing::Child>(
        std::vector<std::string>{"/bin/sh", "-c", "ulimit -n 48 && exec \"$0\" --config \"$1\"", FERRY_DAEMON_PATH,
                                 dir + "/ferryd.yaml"},
        dir + "/ferryd.log");
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return std::filesystem::exists(socket); }, 10000)) << ferryd->Output();
    for (int i = 0; i < 100; ++i) {
      UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::strncpy(a.sun_path, socket.c_str(), sizeof a.sun_path - 1);
      if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) idle.push_back(std::move(fd));
    }
    ASSERT_TRUE(ferryd->WaitForOutput("cannot accept connections", 10s)) << ferryd->Output();
  }
};

// Issue 19 item 5: out of fds, ferryd spun at 93% of a core on EMFILE and new clients hung.
TEST(EventLoop, OutOfFdsItNeitherSpinsNorHangsAndServesOnceFdsAreFree) {
  FerrydOutOfFds f("emfile");
  ASSERT_NO_FATAL_FAILURE(f.Start());
  testing::Child& ferryd = *f.ferryd;
  const std::string& socket = f.socket;
  std::vector<UniqueFd>& idle = f.idle;
  const double cpu0 = CpuSeconds(ferryd.pid());
  std::this_thread::sleep_for(1s);
  const double cpu = CpuSeconds(ferryd.pid()) - cpu0;
  EXPECT_LT(cpu, 0.25) << "ferryd used " << cpu << " s of CPU in 1 s out of fds: it spins";

  // A client now gets an answer, not a hang.
  {
    const auto start = std::chrono::steady_clock::now();
    ConnectOptions o;
    o.socket_path = socket;
    o.timeout = 2000ms;
    auto c = Client::Connect(o);
    EXPECT_LT(Seconds(std::chrono::steady_clock::now() - start), 3.0);
    if (!c.ok()) {
      std::printf("a client while ferryd is out of fds: %s\n", c.status().ToString().c_str());
      EXPECT_EQ(c.status().code(), Code::kUnavailable) << c.status().ToString();
      EXPECT_NE(c.status().message().find("out of file descriptors"), std::string::npos) << c.status().ToString();
    }
  }
  // Once the idle connections go, clients are served.
  idle.clear();
  Copier copier;
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return copier.Open(socket).ok(); }, 10000)) << ferryd.Output();
  if (!HasFailure()) copier.OneCopy(testing::RandomSeed());
  const std::string log = ferryd.Output();
  size_t episodes = 0;
  for (size_t at = 0; (at = log.find("cannot accept connections", at)) != std::string::npos; ++at) ++episodes;
  EXPECT_GE(episodes, 1u);
  EXPECT_LE(episodes, 2u) << "logged once per episode, not per refused connection:\n" << log;
  ferryd.Signal(SIGTERM);
  EXPECT_NE(ferryd.Wait(), -1);
}

// A hello that ferryd cannot give a ring for want of fds is ferryd's want, not the client's
// fault: the client hears why (ResourceExhausted, naming the call), ferryd says it turned the
// session away and counts no eviction, and serves clients again once fds are free. Out of fds
// first (idle connections), then one of them closed: ferryd can accept one connection and has
// no fd left for its ring.
TEST(EventLoop, AHelloFerrydCannotMakeARingForIsTurnedAwayNotEvicted) {
  FerrydOutOfFds f("emfile-ring");
  ASSERT_NO_FATAL_FAILURE(f.Start());
  testing::Child& ferryd = *f.ferryd;
  const std::string& socket = f.socket;
  std::vector<UniqueFd>& idle = f.idle;
  // The connections ferryd turned away at the door are hung up; of those it holds, one goes.
  std::this_thread::sleep_for(300ms);
  std::erase_if(idle, [](const UniqueFd& f) { return HungUp(f.get()); });
  ASSERT_FALSE(idle.empty());
  idle.pop_back();
  std::this_thread::sleep_for(300ms);  // past the listen socket's pause

  ConnectOptions o;
  o.socket_path = socket;
  o.timeout = 3000ms;
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok()) << "a ring with no fd to make it in";
  EXPECT_EQ(c.status().code(), Code::kResourceExhausted) << c.status().ToString();
  EXPECT_NE(c.status().message().find("memfd_create"), std::string::npos) << c.status().ToString();
  ASSERT_TRUE(ferryd.WaitForOutput("turned away: hello refused", 5s)) << ferryd.Output();
  EXPECT_EQ(ferryd.Output().find("evicted: hello refused"), std::string::npos) << ferryd.Output();

  idle.clear();
  Copier copier;
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return copier.Open(socket).ok(); }, 10000)) << ferryd.Output();
  if (!HasFailure()) copier.OneCopy(testing::RandomSeed());
  ferryd.Signal(SIGTERM);
  EXPECT_NE(ferryd.Wait(), -1);
}

// A session's doorbell that ferryd cannot watch (epoll_ctl failing: the test seam fails it as
// ENOSPC past fs.epoll.max_user_watches would) is ferryd's want too: the client hears why, no
// eviction is counted, nothing of the session stays open in ferryd (this process has as many
// sockets, eventfds and memfds as before: a session's socket, doorbells and ring), and once
// epoll works again the next client is served and copies.
TEST(EventLoop, AHelloWhoseDoorbellFerrydCannotWatchIsTurnedAwayNotEvicted) {
  std::atomic<bool> failing{true};
  std::atomic<int> refused{0};
  daemon::ServerOptions seams;
  seams.watch_fault = [&](uint64_t tag) -> Status {
    if (!failing || (tag & 0xff) != daemon::SessionTag(0, daemon::kDoorbellKind)) return Status::Ok();
    ++refused;
    return ErrnoStatus("epoll_ctl", ENOSPC);
  };
  DaemonHarness d(DaemonHarness::SmallConfig(), std::move(seams));
  // Not every fd: ferryd's threads read /proc files for a moment after the start.
  auto open_fds = [] {
    int n = 0;
    for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
      if (target.starts_with("socket:") || target == "anon_inode:[eventfd]" || target.starts_with("/memfd:")) ++n;
    }
    return n;
  };
  const auto fds_before = open_fds();
  ConnectOptions o;
  o.socket_path = d.socket_path();
  o.timeout = 3000ms;
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok()) << "a session whose doorbell nothing watches";
  EXPECT_EQ(c.status().code(), Code::kResourceExhausted) << c.status().ToString();
  EXPECT_NE(c.status().message().find("epoll_ctl"), std::string::npos) << c.status().ToString();
  EXPECT_EQ(refused.load(), 1);
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return open_fds() == fds_before; }))
      << open_fds() << " sockets, eventfds and memfds open, " << fds_before << " before the hello";
  EXPECT_EQ(d.counters().evictions.load(), 0u);  // counted before ferryd closes the fds
  EXPECT_EQ(d.counters().sessions.load(), 0u);
  EXPECT_EQ(d.counters().sessions_total.load(), 0u);

  failing = false;
  Copier copier;
  ASSERT_OK(copier.Open(d));
  copier.OneCopy(testing::RandomSeed());
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

// Issue 19 item 6: connect ignored timeout_ms when ferryd's listen backlog was full.
TEST(Connect, HonoursItsTimeoutWhenTheListenBacklogIsFull) {
  const std::string dir = testing::MakeTempDir("backlog");
  const std::string path = dir + "/ferryd.sock";
  UniqueFd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener.get(), 1), 0);
  std::vector<UniqueFd> queued;  // never accepted
  for (int i = 0; i < 64; ++i) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ASSERT_EQ(errno, EAGAIN);
      break;
    }
    queued.push_back(std::move(fd));
  }
  ConnectOptions o;
  o.socket_path = path;
  o.timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  auto connecting = std::async(std::launch::async, [&] { return Client::Connect(o); });
  if (connecting.wait_for(5s) != std::future_status::ready) {
    listener.reset();  // wakes the blocked connect, so the test ends
    connecting.wait();
    FAIL() << "connect with a 300 ms timeout still blocked after 5 s";
  }
  const double took = Seconds(std::chrono::steady_clock::now() - start);
  auto c = connecting.get();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kTimeout) << c.status().ToString();
  EXPECT_NE(c.status().message().find("did not accept the connection within 300 ms (its listen backlog is full)"),
            std::string::npos)
      << c.status().ToString();
  EXPECT_GE(took, 0.29);
  EXPECT_LT(took, 1.5);
  std::filesystem::remove_all(dir);
}

// Issue 19 item 2: device regions (each a mapping in ferryd) were unlimited per uid; 65k of
// them reached vm.max_map_count.
TEST(Limits, DeviceRegionsBeyondTheSessionAndUidLimitsAreRefusedWithTheLimitNamed) {
  auto config = DaemonHarness::SmallConfig();
  config.limits.regions_per_session = 4;
  config.limits.regions_per_uid = 6;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto a, d.Connect("a"));
  ASSERT_OK_AND_ASSIGN(auto b, d.Connect("b"));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, a->AllocateDevice(4096));
  std::vector<DeviceRegion> regions_a, regions_b;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(DeviceRegion r, a->RegisterDevice(dev.data(), dev.size()));
    regions_a.push_back(std::move(r));
  }
  auto fifth = a->RegisterDevice(dev.data(), dev.size());
  ASSERT_FALSE(fifth.ok());
  EXPECT_EQ(fifth.status().code(), Code::kResourceExhausted);
  EXPECT_NE(fifth.status().message().find("limits.regions_per_session"), std::string::npos) << fifth.status().ToString();

  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev_b, b->AllocateDevice(4096));
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK_AND_ASSIGN(DeviceRegion r, b->RegisterDevice(dev_b.data(), dev_b.size()));
    regions_b.push_back(std::move(r));
  }
  auto seventh = b->RegisterDevice(dev_b.data(), dev_b.size());
  ASSERT_FALSE(seventh.ok());
  EXPECT_EQ(seventh.status().code(), Code::kResourceExhausted);
  EXPECT_NE(seventh.status().message().find("limits.regions_per_uid"), std::string::npos) << seventh.status().ToString();

  // Unregistering makes room again, and the regions work.
  regions_a.pop_back();
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return b->RegisterDevice(dev_b.data(), dev_b.size()).ok(); }));
  ASSERT_OK_AND_ASSIGN(HostBuffer src, b->AllocateHost(4096));
  FillRandom(src.data(), 4096, testing::RandomSeed());
  Poison(static_cast<std::byte*>(dev_b.data()), 4096);
  ASSERT_OK_AND_ASSIGN(Transfer t, b->Copy(Direction::kHostToDevice, src, 0, regions_b[0], 0, 4096));
  ASSERT_OK(t.Wait(10s));
  EXPECT_EQ(FirstDifference(static_cast<std::byte*>(dev_b.data()), src.data(), 4096), -1);
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

TEST(Limits, EventsBeyondTheSessionLimitAreRefusedWithTheLimitNamed) {
  auto config = DaemonHarness::SmallConfig();
  config.limits.events_per_session = 2;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto c, d.Connect());
  ASSERT_OK_AND_ASSIGN(SharedEvent e1, c->CreateEvent());
  ASSERT_OK_AND_ASSIGN(SharedEvent e2, c->CreateEvent());
  auto third = c->CreateEvent();
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), Code::kResourceExhausted);
  EXPECT_NE(third.status().message().find("limits.events_per_session"), std::string::npos) << third.status().ToString();
}

// Issue 19 item 2: a host-backend copy thread that could not start threw std::system_error out
// of ferryd (exit 134, every session lost).
TEST(HostBackend, ACopyThreadThatCannotStartFailsThatCopyAndFerrydServesOthers) {
  std::atomic<bool> fail_starts{true};
  daemon::HostBackendOptions options{daemon::kStreamsPerDirection};
  options.before_worker_start = [&] {
    if (fail_starts) throw std::system_error(EAGAIN, std::generic_category(), "injected: thread creation");
  };
  auto backend = daemon::CreateHostBackend(options);
  ASSERT_OK(backend.status());
  DaemonHarness d(DaemonHarness::SmallConfig(), std::move(*backend));
  ASSERT_OK_AND_ASSIGN(auto c, d.Connect());
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*c, 1 << 20));
  auto& [src, dev, region] = target;
  ASSERT_OK_AND_ASSIGN(Transfer refused, c->Copy(Direction::kHostToDevice, src, 0, region, 0, 1 << 20));
  const Status st = refused.Wait(10s);
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();

  fail_starts = false;
  Copier other;
  ASSERT_OK(other.Open(d));
  other.OneCopy(testing::RandomSeed());
  FillRandom(src.data(), src.size(), testing::RandomSeed());
  Poison(static_cast<std::byte*>(dev.data()), dev.size());
  ASSERT_OK_AND_ASSIGN(Transfer t, c->Copy(Direction::kHostToDevice, src, 0, region, 0, 1 << 20));
  ASSERT_OK(t.Wait(10s));
  EXPECT_EQ(FirstDifference(static_cast<std::byte*>(dev.data()), src.data(), 1 << 20), -1);
  EXPECT_EQ(d.counters().evictions.load(), 0u);
  EXPECT_EQ(d.counters().copies_failed.load(), 1u);
}

bool Readable(int fd, int timeout_ms) {
  auto r = WaitReadable(fd, timeout_ms);
  return r.ok() && *r;
}

// A TCP connection to the exporter.
UniqueFd ConnectTcp(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return UniqueFd();
  return fd;
}

// GET /metrics, giving up after `timeout`.
std::string ScrapeWithin(int port, std::chrono::milliseconds timeout) {
  UniqueFd fd = ConnectTcp(port);
  if (!fd.valid()) return "";
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL) < 0) return "";
  std::string out;
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0 || !Readable(fd.get(), static_cast<int>(left.count()))) return out;
    char buf[8192];
    ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// Issue 19 item 7: one half-sent HTTP request held the exporter's only worker ~28 s.
TEST(Metrics, SlowClientsDoNotHoldUpAScrapeAndAreDroppedAfterTheRequestTimeout) {
  auto m = daemon::MetricsExporter::Create("127.0.0.1:0", {"test", {"host", 0, "host", "", 0, 0, "", -1, ""}, {}});
  ASSERT_OK(m.status());
  const int port = (*m)->port();
  std::vector<UniqueFd> slow;
  for (int i = 0; i < 4; ++i) {
    UniqueFd fd = ConnectTcp(port);
    ASSERT_TRUE(fd.valid());
    const std::string half = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";  // no blank line: never ends
    ASSERT_GT(::send(fd.get(), half.data(), half.size(), MSG_NOSIGNAL), 0);
    slow.push_back(std::move(fd));
  }
  std::this_thread::sleep_for(200ms);  // the exporter has taken them up
  const auto start = std::chrono::steady_clock::now();
  const std::string body = ScrapeWithin(port, 10s);
  const double took = Seconds(std::chrono::steady_clock::now() - start);
  EXPECT_NE(body.find("ferry_build_info"), std::string::npos) << "scrape gave up after " << took << " s";
  EXPECT_LT(took, 3.0) << "before the fix: ~28 s, until civetweb's default 30 s request timeout";
  // The slow ones are dropped once the request timeout (5 s) passes.
  for (auto& fd : slow) EXPECT_TRUE(Readable(fd.get(), 15000)) << "still held after 15 s";
}

}  // namespace
}  // namespace ferry
