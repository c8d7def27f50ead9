// Integration tests: a real ferryd Server (host backend) inside the test process, real clients
// over the real socket and rings. Every copy uses random data into a poisoned destination and
// every byte is checked.
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "block_list_client.hpp"
#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/status_macros.hpp"
#include "common/wire.hpp"
#include "raw_connection.hpp"
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

// Copies `n` random bytes host -> device -> host through the daemon and checks both legs.
void RoundTrip(Client& client, size_t n, size_t host_off, size_t dev_off, uint64_t seed) {
  ASSERT_OK_AND_ASSIGN(HostBuffer src, client.AllocateHost(host_off + n));
  ASSERT_OK_AND_ASSIGN(HostBuffer dst, client.AllocateHost(host_off + n));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, client.AllocateDevice(dev_off + n));
  ASSERT_TRUE(dev.host_visible());
  ASSERT_OK_AND_ASSIGN(DeviceRegion region, client.RegisterDevice(dev.data(), dev.size()));
  auto* d = static_cast<std::byte*>(dev.data());
  FillRandom(src.data() + host_off, n, seed);
  Poison(d, dev.size());
  Poison(dst.data(), dst.size());

  ASSERT_OK_AND_ASSIGN(Transfer up, client.Copy(Direction::kHostToDevice, src, host_off, region, dev_off, n));
  ASSERT_OK(up.Wait(10s));
  EXPECT_EQ(FirstDifference(d + dev_off, src.data() + host_off, n), -1) << "device bytes differ, n=" << n;
  for (size_t i = 0; i < dev_off; ++i) ASSERT_EQ(d[i], std::byte{0xA5}) << "wrote before the target range";

  ASSERT_OK_AND_ASSIGN(Transfer down, client.Copy(Direction::kDeviceToHost, dst, host_off, region, dev_off, n));
  ASSERT_OK(down.Wait(10s));
  EXPECT_EQ(FirstDifference(dst.data() + host_off, src.data() + host_off, n), -1) << "host bytes differ, n=" << n;
  for (size_t i = 0; i < host_off; ++i) ASSERT_EQ(dst.data()[i], std::byte{0xA5}) << "wrote before the target range";
}

TEST(Daemon, CopiesEveryByteBothWaysAtAwkwardSizesAndOffsets) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  EXPECT_EQ(client->backend(), BackendKind::kHost);
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // 1 byte, odd sizes, exactly one chunk, chunk +- 1, and sizes spanning several 1 MiB slabs.
  for (size_t n : {size_t{1}, size_t{7}, size_t{4096}, size_t{65537}, size_t{256 << 10}, size_t{(256 << 10) + 1},
                   size_t{(3 << 20) + 13}}) {
    RoundTrip(*client, n, /*host_off=*/n % 61, /*dev_off=*/n % 37, seed + n);
    if (HasFatalFailure()) return;
  }
}

TEST(Daemon, ServesSeveralClientsAtOnceWithoutMixingTheirData) {
  DaemonHarness d;
  constexpr int kClients = 4;
  std::vector<std::thread> threads;
  std::atomic<int> passed{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = d.Connect("client-" + std::to_string(c));
      ASSERT_TRUE(client.ok()) << client.status().ToString();
      for (int rep = 0; rep < 5; ++rep) {
        RoundTrip(**client, (1 << 20) + c * 4099 + rep, rep * 3, c * 5, testing::RandomSeed());
        if (::testing::Test::HasFailure()) return;
      }
      passed++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(passed.load(), kClients);
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

TEST(Daemon, ManySmallCopiesInFlightAllComplete) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  constexpr size_t kPiece = 4096, kCount = 300;  // more than the ring holds: back-pressure
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, kPiece * kCount));
  auto& [src, dev, region] = target;
  FillRandom(src.data(), src.size(), testing::RandomSeed());
  Poison(static_cast<std::byte*>(dev.data()), dev.size());
  std::vector<Transfer> ts;
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_OK_AND_ASSIGN(Transfer t, client->Copy(Direction::kHostToDevice, src, i * kPiece, region, i * kPiece, kPiece,
                                                  {.priority = i % 2 ? Priority::kLatency : Priority::kBulk}));
    ts.push_back(std::move(t));
  }
  for (auto& t : ts) ASSERT_OK(t.Wait(10s));
  EXPECT_EQ(FirstDifference(static_cast<std::byte*>(dev.data()), src.data(), src.size()), -1);
}

// ferryd polls 50 us after its last request and then sleeps: spin_max_us 0 keeps the window
// from learning longer gaps.
daemon::DaemonConfig SleepsAfter50UsConfig() {
  auto config = DaemonHarness::SmallConfig();
  config.spin_us = 50;
  config.spin_max_us = 0;
  return config;
}

// How often ferryd went to sleep (each wake-up delays a request) in the gaps between a client's
// copies that the client kept to within a bound.
struct GapSleeps {
  int gaps = 0;
  uint64_t sleeps = 0;
};

// Copies 4 KiB of fresh random data to the device every `period`, `reps` times, checking every
// byte. Counts the sleeps of gaps no longer than `on_time`: a loaded machine now and then holds
// the test's thread past ferryd's poll window, and a sleep there is the client's doing.
GapSleeps SleepsWhileCopyingEvery(DaemonHarness& d, Client& client, std::chrono::microseconds period, int reps,
                                  std::chrono::microseconds on_time = std::chrono::hours(1)) {
  constexpr size_t kBytes = 4096;
  GapSleeps out;
  auto src = client.AllocateHost(kBytes);
  auto dev = client.AllocateDevice(kBytes);
  EXPECT_TRUE(src.ok() && dev.ok());
  if (!src.ok() || !dev.ok()) return out;
  auto region = client.RegisterDevice(dev->data(), dev->size());
  EXPECT_TRUE(region.ok()) << region.status().ToString();
  if (!region.ok()) return out;
  auto* device = static_cast<std::byte*>(dev->data());
  // From one submission to the next: ferryd's idle time after a copy, and whatever held the test's
  // thread on its way back from the wait, are both inside it.
  auto last_submit = std::chrono::steady_clock::now();
  uint64_t sleeps_so_far = d.counters().sleeps.load();
  for (int i = 0; i < reps; ++i) {
    std::this_thread::sleep_for(period);
    FillRandom(src->data(), kBytes, testing::RandomSeed());
    Poison(device, kBytes);
    const auto submit = std::chrono::steady_clock::now();
    const auto gap = submit - last_submit;
    last_submit = submit;
    auto t = client.Copy(Direction::kHostToDevice, *src, 0, *region, 0, kBytes);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return out;
    const Status waited = t->Wait(10s);
    EXPECT_TRUE(waited.ok()) << waited.ToString();
    EXPECT_EQ(FirstDifference(device, src->data(), kBytes), -1) << "copy " << i;
    const uint64_t sleeps_now = d.counters().sleeps.load();
    if (gap <= on_time) {
      ++out.gaps;
      out.sleeps += sleeps_now - sleeps_so_far;
    }
    sleeps_so_far = sleeps_now;
  }
  return out;
}

TEST(Daemon, AStreamWaitOnABatchWaitsForEveryCopyOfIt) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  ASSERT_OK_AND_ASSIGN(auto other, d.Connect("other"));
  constexpr size_t kPiece = (1 << 20) + 3, kCount = 6;
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, kPiece * kCount));
  auto& [src, dev, region] = target;
  FillRandom(src.data(), src.size(), testing::RandomSeed());
  Poison(static_cast<std::byte*>(dev.data()), dev.size());
  ASSERT_OK_AND_ASSIGN(std::vector<Transfer> ts,
                       CopyPieces(*client, target, kPiece, kCount, {.stream_waitable = true}));
  // The host backend's stream wait is a host wait: every byte is there when it returns.
  ASSERT_OK(client->StreamWait(ts, nullptr));
  EXPECT_EQ(FirstDifference(static_cast<std::byte*>(dev.data()), src.data(), src.size()), -1);
  for (auto& t : ts) ASSERT_OK(t.Poll().status());
  std::vector<Transfer> none;
  EXPECT_TRUE(client->StreamWait(none, nullptr).ok());
  std::vector<Transfer> empty(1);
  EXPECT_EQ(client->StreamWait(empty, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(other->StreamWait(ts, nullptr).code(), Code::kInvalidArgument) << "another client's transfers";
}

// A request that finds ferryd asleep waits for it to wake (~100 us on the H200's host). So while a
// client keeps copying every few milliseconds ferryd stays awake, and once it goes quiet ferryd
// sleeps; with spin_max_us 0 it sleeps in every gap longer than spin_us.
TEST(Daemon, StaysAwakeForAClientThatCopiesEveryFewMillisecondsAndSleepsOnceItStops) {
  auto config = DaemonHarness::SmallConfig();
  config.spin_us = 50;
  config.spin_max_us = 100'000;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  SleepsWhileCopyingEvery(d, *client, 3ms, 3);  // it learns the gap
  // 30 gaps the client kept to within 5 ms (ferryd's window is twice the 3 ms gap). Beside two
  // busy loops on two cores, 10 rounds once kept only 25: a round costs ~0.1 s, so allow 40.
  GapSleeps kept;
  for (int round = 0; round < 40 && kept.gaps < 30; ++round) {
    const GapSleeps r = SleepsWhileCopyingEvery(d, *client, 3ms, 30 - kept.gaps, 5ms);
    kept.gaps += r.gaps;
    kept.sleeps += r.sleeps;
  }
  ASSERT_GE(kept.gaps, 30) << "the machine never let the test keep a 3 ms gap within 5 ms";
  EXPECT_LE(kept.sleeps, 5u) << "ferryd slept " << kept.sleeps << " times in 30 gaps of 3 ms";
  const uint64_t window = d.counters().poll_window_ns.load();
  EXPECT_GE(window, 6'000'000u) << "twice the 3 ms gap, at least";
  EXPECT_LE(window, 100'000'000u) << "never past spin_max_us";

  const uint64_t before = d.counters().sleeps.load();
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sleeps.load() > before; }, 1000))
      << "ferryd never went to sleep after the client stopped";
}

TEST(Daemon, WithSpinMaxZeroItSleepsInEveryGapLongerThanSpinUs) {
  auto config = SleepsAfter50UsConfig();
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  // Gaps of 10 ms, far over spin_us: ferryd's loop would have to be kept off the cores for a whole
  // gap to miss its sleep.
  const GapSleeps all = SleepsWhileCopyingEvery(d, *client, 10ms, 30);
  EXPECT_GE(all.sleeps, 30u) << "one sleep a 10 ms gap at least";
  EXPECT_EQ(d.counters().poll_window_ns.load(), 50'000u);
}

// A wait's report wakes a sleeping ferryd, but it is no request: it must not teach the poll
// window a gap. A client copying every 45 ms and waiting 15 ms after each copy once made ferryd
// learn 15 ms gaps and poll a core for 20 ms (spin_max_us) after each copy and each wait.
TEST(Daemon, WaitReportsAloneDoNotTeachThePollWindow) {
  auto config = DaemonHarness::SmallConfig();
  config.spin_us = 50;
  config.spin_max_us = 20'000;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  constexpr size_t kBytes = 4096;
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, kBytes));
  auto& [src, dev, region] = target;
  std::byte* device = target.device();
  for (int step = 0; step < 12; ++step) {
    FillRandom(src.data(), kBytes, testing::RandomSeed() + step);
    Poison(device, kBytes);
    ASSERT_OK_AND_ASSIGN(Transfer t, client->Copy(Direction::kHostToDevice, src, 0, region, 0, kBytes));
    std::this_thread::sleep_for(15ms);
    ASSERT_OK(t.Wait(10s));
    EXPECT_EQ(FirstDifference(device, src.data(), kBytes), -1) << "step " << step;
    std::this_thread::sleep_for(30ms);
  }
  EXPECT_EQ(d.counters().poll_window_ns.load(), 50'000u) << "gaps between copies are 45 ms, past spin_max_us";
}

// Waiting on a copy tells ferryd how long the wait was, in a ring entry. Waits on a whole ring's
// worth of copies done while ferryd slept once filled the ring with reports nobody woke it for:
// ferryd read none of them, the metrics never got them, and the client's next copy found the
// ring full and failed after 1 s ("0 copies in flight").
TEST(Daemon, WaitsOnAWholeRingOfCopiesDoneWhileFerrydSleptReachItAndTheNextCopiesGo) {
  auto config = SleepsAfter50UsConfig();
  const size_t count = config.ring_entries;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  constexpr size_t kPiece = 4096 + 40;
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, kPiece * count));
  auto& [src, dev, region] = target;
  std::byte* device = target.device();
  for (int round = 0; round < 2; ++round) {
    FillRandom(src.data(), src.size(), testing::RandomSeed() + round);
    Poison(device, dev.size());
    const uint64_t completed = d.counters().copies_completed.load();
    const uint64_t reports = d.counters().wait_reports_accepted.load();
    const uint64_t sleeps = d.counters().sleeps.load();
    auto ts = CopyPieces(*client, target, kPiece, count);
    ASSERT_TRUE(ts.ok()) << "round " << round << ", " << ts.status().ToString();
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().copies_completed.load() >= completed + count; }))
        << "round " << round << ": the copies never completed";
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sleeps.load() > sleeps; }))
        << "round " << round << ": ferryd never went to sleep";
    std::this_thread::sleep_for(20ms);  // asleep now: its poll window is 50 us
    for (auto& t : *ts) ASSERT_OK(t.Wait(10s));
    EXPECT_EQ(FirstDifference(device, src.data(), src.size()), -1) << "round " << round;
    EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().wait_reports_accepted.load() == reports + count; }))
        << "round " << round << ": ferryd took " << d.counters().wait_reports_accepted.load() - reports << " of "
        << count << " wait reports";
  }
}

// A client rings the submit doorbell only when it takes ferryd's sleeping bit, so a burst of
// copies that finds ferryd asleep rings it once for each time ferryd said it would sleep: each
// ring is a system call the client pays, and a burst once paid one a copy until ferryd was up
// and had cleared the bit.
TEST(Daemon, ABurstOfCopiesRingsFerrydsDoorbellOnceForEachTimeItSaidItWouldSleep) {
  auto config = SleepsAfter50UsConfig();
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  constexpr size_t kPiece = 4096 + 40, kCount = 64;
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, kPiece * kCount));
  auto& [src, dev, region] = target;
  std::byte* device = target.device();
  // A round whose burst finds ferryd up (kept off the cores past 20 ms, or woken by something
  // else) rings nothing and proves little: up to 10 rounds, for 3 that rang.
  int rang = 0;
  for (int round = 0; round < 10 && rang < 3; ++round) {
    FillRandom(src.data(), src.size(), testing::RandomSeed() + round);
    Poison(device, dev.size());
    std::this_thread::sleep_for(20ms);  // asleep now: its poll window is 50 us
    ASSERT_GT(d.counters().sleeps.load(), 0u) << "round " << round << ": ferryd never went to sleep";
    const uint64_t announced = d.counters().sleeps_announced.load();
    const uint64_t rings = d.counters().submit_doorbells.load();
    const uint64_t completed = d.counters().copies_completed.load();
    ASSERT_OK_AND_ASSIGN(std::vector<Transfer> ts, CopyPieces(*client, target, kPiece, kCount));
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().copies_completed.load() >= completed + kCount; }))
        << "round " << round << ": the copies never completed";
    // The bit set before the burst, then one ring at most for each time ferryd set it again
    // (a ring is read after the setting it answers is counted: rings first, then settings). Before
    // the waits: each wait's report may ring too, once a setting, and ferryd sleeps between them.
    const uint64_t burst_rings = d.counters().submit_doorbells.load() - rings;
    EXPECT_LE(burst_rings, d.counters().sleeps_announced.load() - announced + 1)
        << "round " << round << ": rings past the times ferryd set the sleeping bit";
    if (burst_rings > 0) ++rang;
    for (auto& t : ts) ASSERT_OK(t.Wait(10s));
    EXPECT_EQ(FirstDifference(device, src.data(), src.size()), -1) << "round " << round;
  }
  EXPECT_EQ(rang, 3) << "too few bursts found ferryd asleep";
}

// ferryd believes a wait report only for a copy it remembers; it remembers two rings' worth (at
// least 4096). It once remembered 4096 whatever the ring, and refused the reports of a client
// with a larger ring waiting on more copies than that.
TEST(Daemon, WaitReportsOnMoreCopiesThan4096AreBelievedWithARingLargeEnough) {
  auto config = DaemonHarness::SmallConfig();
  config.ring_entries = 8192;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  constexpr size_t kCount = 6000, kPiece = 40;
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, kPiece * kCount));
  auto& [src, dev, region] = target;
  FillRandom(src.data(), src.size(), testing::RandomSeed());
  Poison(target.device(), dev.size());
  const uint64_t reports = d.counters().wait_reports_accepted.load();
  const uint64_t refused = d.counters().wait_reports_refused.load();
  ASSERT_OK_AND_ASSIGN(std::vector<Transfer> ts, CopyPieces(*client, target, kPiece, kCount));
  for (auto& t : ts) ASSERT_OK(t.Wait(10s));
  EXPECT_EQ(FirstDifference(target.device(), src.data(), src.size()), -1);
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().wait_reports_accepted.load() == reports + kCount; }))
      << d.counters().wait_reports_accepted.load() - reports << " of " << kCount << " wait reports believed";
  EXPECT_EQ(d.counters().wait_reports_refused.load(), refused);
}

// A waiter spins, then sleeps on the doorbell, while no completion arrived since it last looked.
// It once compared with the ring as any thread last reaped it: a completion posted while no
// thread slept (so no doorbell rang) and reaped by another thread left the waiter spinning out
// its whole spin (FERRY_SPIN_US) or asleep until some other completion came.
TEST(Client, AWaiterSeesItsCopyDoneWhenAnotherThreadReapedItsCompletion) {
  DaemonHarness d;
  ::setenv("FERRY_SPIN_US", "2000000", 1);  // a missed completion costs 2 s of spinning
  auto connected = d.Connect();
  ::unsetenv("FERRY_SPIN_US");
  ASSERT_OK_AND_ASSIGN(auto client, std::move(connected));
  constexpr size_t kPiece = 64, kCopies = 1000;
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, kPiece * 2));
  auto& [src, dev, region] = target;
  std::byte* device = target.device();
  ASSERT_OK_AND_ASSIGN(Transfer done, client->Copy(Direction::kHostToDevice, src, kPiece, region, kPiece, kPiece));
  ASSERT_OK(done.Wait(10s));
  // The waiter and the reapers share a CPU, so that one is often preempted between its look at
  // the ring and the next; ferryd's loop runs where the scheduler puts it.
  cpu_set_t allowed, one;
  ASSERT_EQ(::pthread_getaffinity_np(::pthread_self(), sizeof allowed, &allowed), 0);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) {
      CPU_SET(c, &one);
      break;
    }
  }
  ASSERT_EQ(::pthread_setaffinity_np(::pthread_self(), sizeof one, &one), 0);
  std::atomic<bool> stop{false};
  std::vector<std::thread> reapers;
  for (int k = 0; k < 2; ++k) {
    reapers.emplace_back([&] {
      ::pthread_setaffinity_np(::pthread_self(), sizeof one, &one);
      while (!stop.load(std::memory_order_relaxed)) (void)done.Poll();  // reaps whatever arrived
    });
  }
  for (size_t i = 0; i < kCopies && !HasFailure(); ++i) {
    FillRandom(src.data(), kPiece, testing::RandomSeed() + i);
    Poison(device, kPiece);
    auto t = client->Copy(Direction::kHostToDevice, src, 0, region, 0, kPiece);
    if (!t.ok()) {
      ADD_FAILURE() << "copy " << i << ": " << t.status().ToString();
      break;
    }
    const auto before = std::chrono::steady_clock::now();
    const Status waited = t->Wait(10s);
    EXPECT_TRUE(waited.ok()) << "copy " << i << ": " << waited.ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - before, 1s)
        << "copy " << i << ": its wait spun out its 2 s spin for a completion another thread had reaped";
    EXPECT_EQ(FirstDifference(device, src.data(), kPiece), -1) << "copy " << i;
  }
  stop = true;
  for (auto& r : reapers) r.join();
  ::pthread_setaffinity_np(::pthread_self(), sizeof allowed, &allowed);
}

// Many threads of one client waiting at once, none spinning: one sleeps on the doorbell and
// wakes the others when it rings (reading an eventfd wakes only its reader). A wake-up lost
// between them (or ferryd skipping the doorbell while a thread says it waits) would leave a
// thread asleep until its sleep cap, here 60 s, where a wake-up comes in microseconds.
TEST(Client, ManyThreadsWaitingAtOnceAreEachWokenForTheirCopies) {
  DaemonHarness d;
  ::setenv("FERRY_SPIN_US", "0", 1);
  ::setenv("FERRY_SLEEP_CAP_MS", "60000", 1);
  auto connected = d.Connect();
  ::unsetenv("FERRY_SPIN_US");
  ::unsetenv("FERRY_SLEEP_CAP_MS");
  ASSERT_OK_AND_ASSIGN(auto client, std::move(connected));
  constexpr size_t kThreads = 8, kRounds = 150, kPiece = 4096;
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, kThreads * kPiece));
  std::byte* host = static_cast<std::byte*>(target.host.data());
  std::byte* device = target.device();
  std::mutex failures_mu;
  std::vector<std::string> failures;
  auto fail = [&](size_t k, size_t round, const std::string& what) {
    std::lock_guard<std::mutex> l(failures_mu);
    failures.push_back("thread " + std::to_string(k) + " round " + std::to_string(round) + ": " + what);
  };
  // Returns false (having said why) where the copy failed, or its wait took past the bound.
  auto copy_and_wait = [&](size_t k, size_t round, Direction dir) {
    const size_t at = k * kPiece;
    auto t = client->Copy(dir, target.host, at, target.region, at, kPiece);
    if (!t.ok()) {
      fail(k, round, t.status().ToString());
      return false;
    }
    const auto before = std::chrono::steady_clock::now();
    const Status waited = t->Wait(120s);
    const auto took = std::chrono::steady_clock::now() - before;
    if (!waited.ok() || took > 10s) {
      fail(k, round,
           "waited " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
               " ms: " + waited.ToString());
      return false;
    }
    return true;
  };
  std::vector<std::thread> threads;
  for (size_t k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      std::vector<std::byte> want(kPiece);
      for (size_t round = 0; round < kRounds; ++round) {
        FillRandom(want.data(), kPiece, testing::RandomSeed() + k * kRounds + round);
        std::memcpy(host + k * kPiece, want.data(), kPiece);
        Poison(device + k * kPiece, kPiece);
        if (!copy_and_wait(k, round, Direction::kHostToDevice)) return;
        if (FirstDifference(device + k * kPiece, want.data(), kPiece) != -1) {
          fail(k, round, "device bytes differ");
          return;
        }
        Poison(host + k * kPiece, kPiece);
        if (!copy_and_wait(k, round, Direction::kDeviceToHost)) return;
        if (FirstDifference(host + k * kPiece, want.data(), kPiece) != -1) {
          fail(k, round, "host bytes differ");
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures, the first: " << failures.front();
}

TEST(Daemon, ClientSideChecksRejectCopiesOutsideTheirBuffers) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, 4096));
  auto& [host, dev, region] = target;
  EXPECT_EQ(client->Copy(Direction::kHostToDevice, host, 1, region, 0, 4096).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(client->Copy(Direction::kHostToDevice, host, 0, region, 4095, 2).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(client->Copy(Direction::kHostToDevice, host, 0, region, 0, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(client->Copy(Direction::kHostToDevice, host, SIZE_MAX, region, 0, 2).status().code(), Code::kInvalidArgument);
}

// RegisterDeviceAllocation registers an allocation once, whatever pointer inside it is asked
// for (a session limited to 2 regions would refuse a third), and addresses the pointer at its
// offset; allocations freed and made again are registered anew, past the region limit too.
TEST(Daemon, RegisterDeviceAllocationRegistersEachAllocationOnceAndCopiesAtThePointer) {
  auto config = DaemonHarness::SmallConfig();
  config.limits.regions_per_session = 2;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  ASSERT_OK_AND_ASSIGN(HostBuffer host, client->AllocateHost(64 << 10));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, client->AllocateDevice(1 << 20));
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto* base = static_cast<std::byte*>(dev.data());
  std::vector<DeviceRegion> held;  // all alive at once: one registration between them, or the limit refuses
  for (size_t k = 0; k < 100; ++k) {
    const size_t at = (k * 10007) % ((1 << 20) - (64 << 10)), n = 1 + (k * 331) % (64 << 10);
    size_t offset = 0;
    ASSERT_OK_AND_ASSIGN(DeviceRegion region, client->RegisterDeviceAllocation(base + at, n, &offset));
    ASSERT_EQ(region.data(), dev.data());
    ASSERT_EQ(offset, at);
    FillRandom(host.data(), n, seed + k);
    Poison(base, dev.size());
    ASSERT_OK_AND_ASSIGN(Transfer t, client->Copy(Direction::kHostToDevice, host, 0, region, offset, n));
    ASSERT_OK(t.Wait(10s));
    ASSERT_EQ(FirstDifference(base + at, host.data(), n), -1) << "k=" << k;
    for (size_t i = 0; i < at; ++i) ASSERT_EQ(base[i], std::byte{0xA5}) << "wrote before the pointer, k=" << k;
    for (size_t i = at + n; i < dev.size(); ++i) ASSERT_EQ(base[i], std::byte{0xA5}) << "wrote past the range, k=" << k;
    held.push_back(std::move(region));
  }
  held.clear();
  size_t offset = 0;
  EXPECT_EQ(client->RegisterDeviceAllocation(base + 100, 1 << 20, &offset).status().code(), Code::kInvalidArgument);
  HostBuffer stray = std::move(host);
  EXPECT_EQ(client->RegisterDeviceAllocation(stray.data(), 1, &offset).status().code(), Code::kInvalidArgument);
  // Ten allocations, each freed before the next: never more than two regions at once in ferryd.
  for (int k = 0; k < 10; ++k) {
    ASSERT_OK_AND_ASSIGN(DeviceAllocation other, client->AllocateDevice(4096 * (k + 1)));
    ASSERT_OK_AND_ASSIGN(DeviceRegion region, client->RegisterDeviceAllocation(other.data(), 4096, &offset));
    ASSERT_EQ(region.data(), other.data());
    FillRandom(stray.data(), 4096, seed + 1000 + k);
    Poison(static_cast<std::byte*>(other.data()), other.size());
    ASSERT_OK_AND_ASSIGN(Transfer t, client->Copy(Direction::kHostToDevice, stray, 0, region, 0, 4096));
    ASSERT_OK(t.Wait(10s));
    ASSERT_EQ(FirstDifference(static_cast<std::byte*>(other.data()), stray.data(), 4096), -1) << "k=" << k;
  }
  client->ForgetDeviceAllocations();
  ASSERT_OK_AND_ASSIGN(DeviceAllocation a, client->AllocateDevice(4096));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation b, client->AllocateDevice(4096));
  ASSERT_OK(client->RegisterDevice(a.data(), a.size()).status());
  ASSERT_OK(client->RegisterDevice(b.data(), b.size()).status());
}

// SharedEvent::RecordAfter: on the host backend nothing runs on streams, so the record is at once
// and a copy after the event runs.
TEST(Daemon, ACopyAfterAnEventRecordedAfterAForeignEventRuns) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, 8192));
  auto& [host, dev, region] = target;
  ASSERT_OK_AND_ASSIGN(SharedEvent ev, client->CreateEvent());
  EXPECT_EQ(ev.RecordAfter(nullptr).code(), Code::kInvalidArgument);
  int foreign = 0;  // stands in for a framework's cudaEvent_t
  ASSERT_OK(ev.RecordAfter(&foreign));
  FillRandom(host.data(), 8192, testing::RandomSeed());
  Poison(static_cast<std::byte*>(dev.data()), dev.size());
  ASSERT_OK_AND_ASSIGN(Transfer t, client->Copy(Direction::kHostToDevice, host, 0, region, 0, 8192, {.after = &ev}));
  ASSERT_OK(t.Wait(10s));
  EXPECT_EQ(FirstDifference(static_cast<std::byte*>(dev.data()), host.data(), 8192), -1);
}

// Slabs stay with a session until it ends: its process has them mapped, and a mapping cannot
// be revoked, so handing them to another session would leak data. Freed buffers are reused
// inside the session.
TEST(Daemon, QuotaAndPoolExhaustionAreClearErrorsAndEndingASessionGivesItBack) {
  auto config = DaemonHarness::SmallConfig();
  config.pool_bytes = 8ull << 20;
  config.session_quota_bytes = 6ull << 20;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto a, d.Connect("a"));
  ASSERT_OK_AND_ASSIGN(auto b, d.Connect("b"));
  {
    ASSERT_OK_AND_ASSIGN(HostBuffer big, a->AllocateHost(6ull << 20));
    auto over = a->AllocateHost(1);
    EXPECT_EQ(over.status().code(), Code::kResourceExhausted) << over.status().ToString();
    auto rest = b->AllocateHost(3ull << 20);  // only 2 MiB left in the pool
    EXPECT_EQ(rest.status().code(), Code::kResourceExhausted) << rest.status().ToString();
    ASSERT_OK_AND_ASSIGN(HostBuffer fits, b->AllocateHost(2ull << 20));
    ASSERT_OK_AND_ASSIGN(DaemonStats st, b->Stats());
    EXPECT_EQ(st.pool_free_bytes, 0u);
  }
  // Freed inside the session: a can allocate its quota again, b still cannot take a's slabs.
  {
    ASSERT_OK_AND_ASSIGN(HostBuffer again, a->AllocateHost(6ull << 20));
    EXPECT_EQ(b->AllocateHost(3ull << 20).status().code(), Code::kResourceExhausted);
  }
  a.reset();  // the session ends once the client and everything it handed out are gone
  Result<HostBuffer> r = Internal("not tried");
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return (r = b->AllocateHost(4ull << 20)).ok(); }))
      << r.status().ToString();
}

// A buffer is one reply with an fd per slab, at most 200: one over was refused only after its
// slabs were granted, and they stayed the session's, out of every other session's reach, while
// the pool's free bytes said they were free.
TEST(Daemon, ABufferOverTheSlabsOneReplyCarriesIsRefusedAndTakesNoSlab) {
  auto config = DaemonHarness::SmallConfig();
  config.pool_bytes = 256ull << 20;
  config.slab_bytes = 1ull << 20;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto a, d.Connect("a"));
  auto over = a->AllocateHost(201ull << 20);
  EXPECT_EQ(over.status().code(), Code::kInvalidArgument) << over.status().ToString();
  EXPECT_NE(over.status().message().find("more than 200 slabs; raise pool.slab"), std::string::npos)
      << over.status().ToString();
  ASSERT_OK_AND_ASSIGN(DaemonStats st, a->Stats());
  EXPECT_EQ(st.pool_free_bytes, config.pool_bytes) << "the refused buffer took slabs";
  ASSERT_OK_AND_ASSIGN(auto b, d.Connect("b"));
  ASSERT_OK_AND_ASSIGN(HostBuffer other, b->AllocateHost(200ull << 20));
  ASSERT_OK_AND_ASSIGN(st, b->Stats());
  EXPECT_EQ(st.pool_free_bytes, 56ull << 20);
}

// On the host backend a device region is a client's memfd, mapped whole by ferryd, and a sparse
// one costs its maker nothing: 89 registrations took ferryd's whole address space and every
// later client was refused ("mmap: Cannot allocate memory"). The simulated GPU now has a memory
// size (host.gpu_memory) that all clients' regions together may reach, as on a real GPU.
TEST(Daemon, TheHostBackendsDeviceRegionsFitItsSimulatedGpusMemoryInBytes) {
  auto config = DaemonHarness::SmallConfig();
  config.host_gpu_memory_bytes = 8ull << 20;
  DaemonHarness d(config);
  testing::RawClient a, b;
  ASSERT_OK(a.Open(d.socket_path(), "a"));
  ASSERT_OK(b.Open(d.socket_path(), "b"));
  ASSERT_OK_AND_ASSIGN(testing::RawClient::Region six, a.RegisterRegion(6ull << 20));
  auto over = b.RegisterRegion(4ull << 20);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), Code::kResourceExhausted) << over.status().ToString();
  EXPECT_NE(over.status().message().find("host-gpu-0 has 8388608 bytes of memory, 6291456 of them registered"),
            std::string::npos)
      << over.status().ToString();
  ASSERT_OK_AND_ASSIGN(testing::RawClient::Region two, b.RegisterRegion(2ull << 20));  // what is left
  auto past = b.RegisterRegion(4096);
  EXPECT_FALSE(past.ok()) << "a region past the GPU's memory";
  // Unregistered, a region's bytes are the GPU's again.
  ASSERT_OK(a.Unregister(six.id));
  Result<testing::RawClient::Region> four = Internal("not tried");
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return (four = b.RegisterRegion(4ull << 20)).ok(); }))
      << four.status().ToString();
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

// ferryd keeps an entry for each buffer: 262,144 buffers of 256 bytes once made it hold 16 MiB
// for 64 MiB of pool, and the pool's size was the only bound.
TEST(Daemon, ASessionsBuffersAreBoundedInNumber) {
  auto config = DaemonHarness::SmallConfig();
  config.limits.buffers_per_session = 4;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto a, d.Connect("a"));
  std::vector<HostBuffer> held;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(HostBuffer b, a->AllocateHost(256));
    held.push_back(std::move(b));
  }
  auto fifth = a->AllocateHost(256);
  EXPECT_EQ(fifth.status().code(), Code::kResourceExhausted) << fifth.status().ToString();
  EXPECT_NE(fifth.status().message().find("limits.buffers_per_session"), std::string::npos)
      << fifth.status().ToString();
  ASSERT_OK_AND_ASSIGN(auto b, d.Connect("b"));  // another session's count is its own
  EXPECT_TRUE(b->AllocateHost(256).ok());
  held.pop_back();  // freed
  Result<HostBuffer> again = Internal("not tried");
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return (again = a->AllocateHost(256)).ok(); }))
      << again.status().ToString();
}

TEST(Daemon, AFreedBufferComesBackZeroedToTheNextClient) {
  auto config = DaemonHarness::SmallConfig();
  config.pool_bytes = 2ull << 20;
  DaemonHarness d(config);
  {
    ASSERT_OK_AND_ASSIGN(auto a, d.Connect("a"));
    ASSERT_OK_AND_ASSIGN(HostBuffer secret, a->AllocateHost(2ull << 20));
    FillRandom(secret.data(), secret.size(), 42);
  }
  ASSERT_OK_AND_ASSIGN(auto b, d.Connect("b"));
  HostBuffer* got = nullptr;
  Result<HostBuffer> r = Internal("not tried");
  ASSERT_TRUE(DaemonHarness::Eventually([&] {
    r = b->AllocateHost(2ull << 20);
    return r.ok();
  }));
  got = &*r;
  for (size_t i = 0; i < got->size(); ++i) ASSERT_EQ(got->data()[i], std::byte{0}) << "byte " << i << " leaked";
}

TEST(Daemon, DeviceFailureFailsThatCopyAndTheDaemonKeepsServing) {
  auto config = DaemonHarness::SmallConfig();
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(inner.ok());
  auto faulty = std::make_unique<daemon::FaultInjectingBackend>(std::move(*inner));
  auto* fault = faulty.get();
  DaemonHarness d(config, std::move(faulty));
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, 1 << 20));
  auto& [host, dev, region] = target;
  FillRandom(host.data(), host.size(), testing::RandomSeed());

  fault->FailNextSubmits(1);
  ASSERT_OK_AND_ASSIGN(Transfer t1, client->Copy(Direction::kHostToDevice, host, 0, region, 0, 1 << 20));
  EXPECT_EQ(t1.Wait(5s).code(), Code::kDevice);

  fault->FailNextCompletions(1);
  ASSERT_OK_AND_ASSIGN(Transfer t2, client->Copy(Direction::kHostToDevice, host, 0, region, 0, 4096));
  EXPECT_EQ(t2.Wait(5s).code(), Code::kDevice);

  fault->FailNextOpenRegion(1);
  EXPECT_EQ(client->RegisterDevice(dev.data(), dev.size()).status().code(), Code::kDevice);

  Poison(static_cast<std::byte*>(dev.data()), dev.size());
  ASSERT_OK_AND_ASSIGN(Transfer t3, client->Copy(Direction::kHostToDevice, host, 0, region, 0, 1 << 20));
  ASSERT_OK(t3.Wait(5s));
  EXPECT_EQ(FirstDifference(static_cast<std::byte*>(dev.data()), host.data(), 1 << 20), -1);
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

// A client that speaks the protocol by hand, to do what libferry never would.
class RawSession : public testing::RawConnection {
 public:
  // A pool buffer of this session and a device region (a sealed memfd, as on the host backend).
  Result<uint64_t> AllocBuffer(uint64_t size) {
    wire::AllocBufferRequest req{size};
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kAllocBuffer, req));
    FERRY_RETURN_IF_ERROR(FromWire(m.As<wire::AllocBufferReply>().status));
    return m.As<wire::AllocBufferReply>().pool_offset;
  }
  Result<uint32_t> RegisterRegion(uint64_t size) {
    FERRY_ASSIGN_OR_RETURN(UniqueFd mem, CreateSealedMemfd("ferry-sim-gpu0", size));
    wire::RegisterDeviceRequest req{};
    req.kind = static_cast<uint32_t>(wire::DeviceHandleKind::kHostMemfd);
    req.size = size;
    const int fd = mem.get();
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kRegisterDevice, req, fd));
    FERRY_RETURN_IF_ERROR(FromWire(m.As<wire::RegisterDeviceReply>().status));
    return m.As<wire::RegisterDeviceReply>().region_id;
  }
  // A buffer of at most one slab, mapped here too (BufferBytes): its pool offset.
  Result<uint64_t> AllocMappedBuffer(uint64_t size) {
    wire::AllocBufferRequest req{size};
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kAllocBuffer, req));
    const auto r = m.As<wire::AllocBufferReply>();
    FERRY_RETURN_IF_ERROR(FromWire(r.status));
    if (r.slab_count != 1 || m.fds.size() != 1) return Internal("a buffer of one slab was expected");
    FERRY_ASSIGN_OR_RETURN(Mapping slab, MapShared(m.fds[0].get(), reply_.slab_bytes));
    mapped_.push_back(std::move(slab));
    return r.pool_offset;
  }
  // The bytes of the buffer AllocMappedBuffer gave last.
  std::byte* BufferBytes(uint64_t pool_offset) { return mapped_.back().data() + pool_offset % reply_.slab_bytes; }
  // A device region whose memfd stays mapped here: (region id, its bytes).
  Result<std::pair<uint32_t, Mapping>> RegisterMappedRegion(uint64_t size) {
    FERRY_ASSIGN_OR_RETURN(UniqueFd mem, CreateSealedMemfd("ferry-sim-gpu0", size));
    FERRY_ASSIGN_OR_RETURN(Mapping bytes, MapShared(mem.get(), size));
    wire::RegisterDeviceRequest req{};
    req.kind = static_cast<uint32_t>(wire::DeviceHandleKind::kHostMemfd);
    req.size = size;
    const int fd = mem.get();
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kRegisterDevice, req, fd));
    FERRY_RETURN_IF_ERROR(FromWire(m.As<wire::RegisterDeviceReply>().status));
    return std::pair<uint32_t, Mapping>{m.As<wire::RegisterDeviceReply>().region_id, std::move(bytes)};
  }

  // A host-to-device copy's entry, to push as it is or after changes.
  static wire::SubmissionEntry HostToDevice(uint64_t tag, uint64_t pool_offset, uint64_t length, uint32_t region_id) {
    wire::SubmissionEntry e{};
    e.user_tag = tag;
    e.opcode = static_cast<uint16_t>(wire::Opcode::kHostToDevice);
    e.pool_offset = pool_offset;
    e.length = length;
    e.region_id = region_id;
    return e;
  }

 private:
  std::vector<Mapping> mapped_;  // slabs of AllocMappedBuffer
};

// Records what reaches the metrics and snapshots.
class RecordingObserver : public daemon::ServerObserver {
 public:
  void OnCopyDone(const daemon::CopyRecord&) override {}
  void OnExposed(const daemon::ExposedRecord& r) override {
    std::lock_guard<std::mutex> l(mu);
    exposed.push_back(r.seconds);
    copy_seconds.push_back(r.copy_seconds);
  }
  void OnPolicy(const daemon::Policy&) override {}
  void OnPolicyRefused() override {}
  void OnRejected(std::string_view reason) override {
    std::lock_guard<std::mutex> l(mu);
    if (reason == "wait_report") ++refused;
  }
  std::mutex mu;
  std::vector<double> exposed, copy_seconds;
  int refused = 0;
};

// A client waiting for room in its submission ring sleeps on the completion doorbell with
// kClientWaitingForRoom set. Reading submissions makes room without posting a completion (a wait
// report posts none), so ferryd rings the doorbell for the read itself; the client once slept
// out a 1 ms timer there, every time. A client not waiting for room is not woken.
TEST(Daemon, ReadingSubmissionsRingsTheDoorbellOfAClientWaitingForRoom) {
  DaemonHarness d;
  RawSession raw;
  ASSERT_OK(raw.Open(d.socket_path()));
  auto report = [&, tag = uint64_t{1000}]() mutable {
    wire::SubmissionEntry e{};
    e.opcode = static_cast<uint16_t>(wire::Opcode::kReportWait);
    e.user_tag = ++tag;  // no copy of this session: refused, and nothing is posted
    const uint64_t refused = d.counters().wait_reports_refused.load();
    raw.Push(e);
    return DaemonHarness::Eventually([&] { return d.counters().wait_reports_refused.load() > refused; });
  };
  pollfd doorbell{raw.complete_doorbell(), POLLIN, 0};
  raw.header()->client_state.value.store(0);
  ASSERT_TRUE(report()) << "ferryd never read the report";
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(::poll(&doorbell, 1, 0), 0) << "a client not waiting was woken";

  raw.header()->client_state.value.store(wire::kClientWaitingForRoom);
  ASSERT_TRUE(report()) << "ferryd never read the report";
  EXPECT_EQ(::poll(&doorbell, 1, 2000), 1) << "no doorbell for the room its read made";
  EXPECT_EQ(raw.header()->cq_tail.value.load(), 0u) << "the doorbell was for a completion, not the room";
}

// ferryd takes a client's waiting bits when it rings its completion doorbell: a client asleep
// while its copies complete one turn after another is rung once (ferryd once wrote the eventfd
// on every turn that posted one while the bit stayed set), and again only once it has set a bit
// again. A ring for room (a read that posts nothing) takes the completion bit too: one ring wakes
// the client.
TEST(Daemon, FerrydRingsASleepingClientOnceAndAgainOnlyAfterItSetsItsBitAgain) {
  DaemonHarness d;
  RawSession raw;
  ASSERT_OK(raw.Open(d.socket_path()));
  constexpr uint64_t kBytes = (64 << 10) + 13;
  ASSERT_OK_AND_ASSIGN(uint64_t host, raw.AllocMappedBuffer(kBytes));
  ASSERT_OK_AND_ASSIGN(auto region, raw.RegisterMappedRegion(kBytes));
  std::byte* src = raw.BufferBytes(host);
  std::byte* dev = region.second.data();
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  uint64_t tag = 0;
  // One copy at a time: each completion is posted on a turn of its own.
  auto copy_one_by_one = [&](int count) -> ::testing::AssertionResult {
    for (int i = 0; i < count; ++i) {
      FillRandom(src, kBytes, seed + ++tag);
      Poison(dev, kBytes);
      raw.Push(RawSession::HostToDevice(tag, host, kBytes, region.first));
      auto done = raw.Next();
      if (!done.has_value()) return ::testing::AssertionFailure() << "copy " << tag << " never completed";
      if (done->user_tag != tag || done->status != 0) {
        return ::testing::AssertionFailure()
               << "copy " << tag << ": completion of " << done->user_tag << ", status " << done->status;
      }
      if (FirstDifference(dev, src, kBytes) != -1) return ::testing::AssertionFailure() << "copy " << tag << " wrong";
    }
    return ::testing::AssertionSuccess();
  };
  const int doorbell = raw.complete_doorbell();
  auto& state = raw.header()->client_state.value;
  DrainDoorbell(doorbell);

  state.store(wire::kClientWaiting);
  ASSERT_TRUE(copy_one_by_one(8));
  EXPECT_EQ(DrainDoorbell(doorbell), 1u) << "rings for 8 completions posted while the client slept";
  EXPECT_EQ(state.load(), 0u) << "ferryd took the bit as it rang";
  ASSERT_TRUE(copy_one_by_one(4));
  EXPECT_EQ(DrainDoorbell(doorbell), 0u) << "rang a client that had not set its bit again";
  state.store(wire::kClientWaiting);
  ASSERT_TRUE(copy_one_by_one(3));
  EXPECT_EQ(DrainDoorbell(doorbell), 1u) << "rings after the client set its bit again";

  // Waiting for room and for completions: a wait report (refused: no copy of the session has
  // its tag) is read and posts nothing; that read rings and takes both bits.
  state.store(wire::kClientWaiting | wire::kClientWaitingForRoom);
  wire::SubmissionEntry report{};
  report.opcode = static_cast<uint16_t>(wire::Opcode::kReportWait);
  report.user_tag = 1'000'000;
  const uint64_t refused = d.counters().wait_reports_refused.load();
  raw.Push(report);
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().wait_reports_refused.load() > refused; }));
  // ferryd counts the refusal as it reads the entry and rings once the read is done.
  pollfd rung{doorbell, POLLIN, 0};
  EXPECT_EQ(::poll(&rung, 1, 2000), 1) << "no ring for the read of a client waiting for room";
  EXPECT_EQ(DrainDoorbell(doorbell), 1u) << "more than one ring for the read of a client waiting for room";
  EXPECT_EQ(state.load(), 0u) << "the ring for room took the completion bit too";
  ASSERT_TRUE(copy_one_by_one(2));
  EXPECT_EQ(DrainDoorbell(doorbell), 0u) << "rang again for completions after one ring took both bits";
}

// A client reporting waits it never had (a forged exposed time of an hour, the 100,000-wait
// attack): only a real copy of its own session, once, no longer than that copy has existed.
TEST(Daemon, WaitReportsAreBelievedOnlyForARealCopyOnceAndNoLongerThanItExisted) {
  RecordingObserver seen;
  DaemonHarness d(DaemonHarness::SmallConfig(), nullptr, DaemonHarness::SmallChunks(), &seen);
  RawSession raw;
  ASSERT_OK(raw.Open(d.socket_path()));
  ASSERT_OK_AND_ASSIGN(uint64_t pool_offset, raw.AllocBuffer(1 << 20));
  ASSERT_OK_AND_ASSIGN(uint32_t region, raw.RegisterRegion(1 << 20));
  const wire::SubmissionEntry copy = RawSession::HostToDevice(7, pool_offset, 64 << 10, region);
  // Another session's real copy of tag 8: that tag means nothing in the raw session.
  RawSession other;
  ASSERT_OK(other.Open(d.socket_path()));
  ASSERT_OK_AND_ASSIGN(uint64_t other_offset, other.AllocBuffer(1 << 20));
  ASSERT_OK_AND_ASSIGN(uint32_t other_region, other.RegisterRegion(1 << 20));
  other.Push(RawSession::HostToDevice(8, other_offset, 64 << 10, other_region));
  auto other_done = other.Next();
  ASSERT_TRUE(other_done.has_value());
  ASSERT_EQ(other_done->status, 0);

  auto report = [&](uint64_t tag, uint64_t ns) {
    wire::SubmissionEntry e{};
    e.opcode = static_cast<uint16_t>(wire::Opcode::kReportWait);
    e.user_tag = tag;
    e.length = ns;
    // Reports have no completion: keep within the ring by waiting for ferryd to read them.
    ASSERT_TRUE(DaemonHarness::Eventually(
        [&] { return raw.header()->sq_tail.value.load() - raw.header()->sq_head.value.load() < 16; }));
    raw.Push(e);
  };
  constexpr uint64_t kHour = 3600ull * 1'000'000'000;
  for (uint64_t tag = 1000; tag < 1100; ++tag) report(tag, kHour);  // no copies at all
  report(8, 1000);                                                  // the other session's copy
  const uint64_t before_submit = MonotonicNanos();
  raw.Push(copy);
  auto done = raw.Next();
  ASSERT_TRUE(done.has_value());
  ASSERT_EQ(done->status, 0);
  const uint64_t real_wait = MonotonicNanos() - before_submit;
  report(7, kHour);      // longer than the copy has existed
  report(7, real_wait / 2);  // the real one: believed
  report(7, real_wait / 2);  // again: a duplicate
  // A NOP after them: its completion says every report before it was read.
  wire::SubmissionEntry nop{};
  nop.user_tag = 99;
  raw.Push(nop);
  auto nop_done = raw.Next();
  ASSERT_TRUE(nop_done.has_value());
  EXPECT_EQ(nop_done->user_tag, 99u);

  EXPECT_EQ(d.counters().wait_reports_accepted.load(), 1u);
  EXPECT_EQ(d.counters().wait_reports_refused.load(), 103u);
  std::lock_guard<std::mutex> l(seen.mu);
  ASSERT_EQ(seen.exposed.size(), 1u);
  EXPECT_NEAR(seen.exposed[0], static_cast<double>(real_wait / 2) * 1e-9, 1e-9);
  EXPECT_GT(seen.copy_seconds[0], 0.0);  // ferryd's own time of that copy, beside the report
  EXPECT_EQ(seen.refused, 103);
}

// Where the stream wait is a host wait, the caller is blocked for the whole call: ferryd hears one
// report for the batch, against its newest copy, as long as the call from its start to the last
// copy's completion. One report per copy left the time between the copies' waits unreported.
TEST(Daemon, AHostStreamWaitIsReportedOnceForTheWholeBatchAndTheWholeCall) {
  RecordingObserver seen;
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(inner.ok());
  auto backend = std::make_unique<testing::PausableBackend>(std::move(*inner));
  testing::PausableBackend* be = backend.get();
  DaemonHarness d(DaemonHarness::SmallConfig(), std::move(backend), DaemonHarness::SmallChunks(), &seen);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  constexpr size_t kPiece = 64 << 10, kCount = 3;
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*client, kPiece * kCount));
  auto& [src, dev, region] = target;
  FillRandom(src.data(), src.size(), testing::RandomSeed());
  Poison(static_cast<std::byte*>(dev.data()), dev.size());
  be->Pause(true);  // the engines hold every completion until released below
  ASSERT_OK_AND_ASSIGN(std::vector<Transfer> ts,
                       CopyPieces(*client, target, kPiece, kCount, {.stream_waitable = true}));
  // Released 20 ms into the call (a hold, not a synchronization: what is checked holds whenever
  // the release comes), so the report has a length to check.
  std::atomic<uint64_t> call_start{0};
  std::thread releaser([&] {
    while (call_start.load() == 0 || MonotonicNanos() < call_start.load() + 20'000'000) std::this_thread::sleep_for(1ms);
    be->Pause(false);
  });
  call_start.store(MonotonicNanos());
  const Status waited = client->StreamWait(ts, nullptr);
  const uint64_t call_ns = MonotonicNanos() - call_start.load();
  releaser.join();
  ASSERT_OK(waited);
  EXPECT_EQ(FirstDifference(static_cast<std::byte*>(dev.data()), src.data(), src.size()), -1);
  // A copy's completion after the report: ferryd has read the ring up to it.
  ASSERT_OK_AND_ASSIGN(Transfer probe, client->Copy(Direction::kDeviceToHost, src, 0, region, 0, 4096));
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return probe.Poll().ok() && *probe.Poll(); }, 10000));
  EXPECT_EQ(d.counters().wait_reports_accepted.load(), 1u);
  std::lock_guard<std::mutex> l(seen.mu);
  EXPECT_EQ(seen.refused, 0);
  ASSERT_EQ(seen.exposed.size(), 1u);
  // From the call's start (a few instructions after call_start) to the batch's end, which came
  // after the release: 20 ms at least, less whatever preempted those few instructions.
  EXPECT_GE(seen.exposed[0], 0.010);
  EXPECT_LE(seen.exposed[0], static_cast<double>(call_ns) * 1e-9);
}

TEST(Daemon, RejectsSubmissionsThatPointOutsideTheSessionsOwnMemory) {
  DaemonHarness d;
  RawSession raw;
  ASSERT_OK(raw.Open(d.socket_path()));
  // Another client's real buffer and region: the raw session must not be able to reach them.
  ASSERT_OK_AND_ASSIGN(auto victim, d.Connect("victim"));
  ASSERT_OK_AND_ASSIGN(HostBuffer vbuf, victim->AllocateHost(1 << 20));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation vdev, victim->AllocateDevice(1 << 20));
  ASSERT_OK_AND_ASSIGN(DeviceRegion vregion, victim->RegisterDevice(vdev.data(), vdev.size()));
  Poison(vbuf.data(), vbuf.size());

  struct Case {
    const char* what;
    wire::SubmissionEntry e;
    Code want;
  };
  auto entry = [](uint64_t tag) { return RawSession::HostToDevice(tag, 0, 4096, 1); };
  std::vector<Case> cases;
  cases.push_back({"someone else's pool offset, no region", entry(1), Code::kInvalidArgument});
  auto e = entry(2);
  e.opcode = 99;
  cases.push_back({"unknown opcode", e, Code::kInvalidArgument});
  e = entry(3);
  e.flags = 1;
  cases.push_back({"reserved flags", e, Code::kInvalidArgument});
  e = entry(4);
  e.length = 0;
  cases.push_back({"zero length", e, Code::kInvalidArgument});
  e = entry(5);
  e.pool_offset = UINT64_MAX - 10;
  cases.push_back({"offset that overflows", e, Code::kInvalidArgument});
  e = entry(6);
  e.priority = 7;
  cases.push_back({"unknown priority", e, Code::kInvalidArgument});
  for (const Case& c : cases) {
    raw.Push(c.e);
    auto done = raw.Next();
    ASSERT_TRUE(done.has_value()) << c.what << ": no completion";
    EXPECT_EQ(done->user_tag, c.e.user_tag) << c.what;
    EXPECT_EQ(static_cast<Code>(done->status), c.want) << c.what;
  }
  // The victim's buffer is untouched and it still works.
  for (size_t i = 0; i < vbuf.size(); ++i) ASSERT_EQ(vbuf.data()[i], std::byte{0xA5});
  RoundTrip(*victim, 4096, 0, 0, testing::RandomSeed());
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

TEST(Daemon, AGarbageRingIndexEvictsOnlyThatClient) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto good, d.Connect("good"));
  RawSession raw;
  ASSERT_OK(raw.Open(d.socket_path()));
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sessions.load() == 2; }));
  raw.header()->sq_tail.value.store(0x7fffffff);  // claims two billion submissions
  raw.Kick();
  EXPECT_TRUE(raw.DaemonHungUp());
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().evictions.load() == 1; }));
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sessions.load() == 1; }));
  RoundTrip(*good, 1 << 20, 3, 5, testing::RandomSeed());
}

TEST(Daemon, AClientThatNeverReapsCompletionsIsEvictedNotBuffered) {
  DaemonHarness d;
  RawSession raw;
  ASSERT_OK(raw.Open(d.socket_path()));
  wire::SubmissionEntry nop{};
  // Never advance cq_head; the daemon must not buffer completions without bound.
  const uint64_t deadline = MonotonicNanos() + 5'000'000'000ull;
  while (d.counters().evictions.load() == 0 && MonotonicNanos() < deadline) {
    uint32_t tail = raw.header()->sq_tail.value.load();
    while (tail - raw.header()->sq_head.value.load() < 32) {
      nop.user_tag = tail;
      raw.sq()[tail & 63] = nop;
      raw.header()->sq_tail.value.store(++tail);
    }
    raw.Kick();
    std::this_thread::sleep_for(100us);
  }
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().evictions.load() == 1; }));
}

// What a hello of another protocol version looks like on the wire: its layout is frozen.
std::vector<std::byte> ForeignHello(uint16_t version) {
  std::vector<std::byte> frame = FrameMessage(wire::MsgType::kHello, 1, nullptr, 0);
  wire::HelloRequest h{};
  h.client_version = version;
  wire::MsgHeader hdr{wire::kMagic, version, static_cast<uint16_t>(wire::MsgType::kHello), sizeof h, 1};
  frame.resize(sizeof hdr + sizeof h);
  std::memcpy(frame.data(), &hdr, sizeof hdr);
  std::memcpy(frame.data() + sizeof hdr, &h, sizeof h);
  return frame;
}

TEST(Daemon, AClientOfAnotherProtocolVersionIsToldBothVersions) {
  DaemonHarness d;
  for (uint16_t version : {uint16_t(wire::kVersion - 1), uint16_t(wire::kVersion + 1), uint16_t(1)}) {
    SCOPED_TRACE("client protocol " + std::to_string(version));
    ASSERT_OK_AND_ASSIGN(UniqueFd sock, ConnectUnix(d.socket_path()));
    ASSERT_OK_AND_ASSIGN(bool sent, TrySendFramed(sock.get(), ForeignHello(version)));
    ASSERT_TRUE(sent);
    ASSERT_OK_AND_ASSIGN(ReceivedMessage m, RecvMessage(sock.get(), 5000));
    ASSERT_EQ(m.type(), wire::MsgType::kHelloReply);
    Status st = FromWire(m.As<wire::HelloReply>().status);
    EXPECT_EQ(st.code(), Code::kProtocol) << st.ToString();
    EXPECT_NE(st.message().find("ferryd speaks protocol " + std::to_string(wire::kVersion) + ", this client speaks protocol " +
                                std::to_string(version)),
              std::string::npos)
        << st.ToString();
    EXPECT_TRUE(m.fds.empty());
  }
  // The daemon keeps serving clients of its own version.
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  RoundTrip(*client, 4096, 0, 0, testing::RandomSeed());
}

TEST(Client, ToldByAFerrydOfAnotherVersionItSaysBothVersions) {
  const std::string dir = testing::MakeTempDir("foreign");
  const std::string path = dir + "/ferryd.sock";
  ASSERT_OK_AND_ASSIGN(UniqueFd listener, ListenUnix(path, 0600));
  constexpr uint16_t kTheirs = wire::kVersion + 7;
  std::thread fake_ferryd([&] {
    pollfd ready{listener.get(), POLLIN, 0};  // the listener does not block: wait for the client
    if (::poll(&ready, 1, 30000) != 1) return;
    auto conn = AcceptUnix(listener.get());
    if (!conn.ok()) return;
    auto hello = RecvMessage(conn->get(), 5000);
    if (!hello.ok()) return;
    // A ferryd of version kTheirs refusing this client: its reply starts with the frozen status.
    wire::HelloReply r{};
    r.status = ToWire(ProtocolError("ferryd speaks protocol " + std::to_string(kTheirs) + ", this client speaks " +
                                    std::to_string(hello->header.version)));
    wire::MsgHeader hdr{wire::kMagic, kTheirs, static_cast<uint16_t>(wire::MsgType::kHelloReply), sizeof r, hello->header.seq};
    std::vector<std::byte> frame(sizeof hdr + sizeof r);
    std::memcpy(frame.data(), &hdr, sizeof hdr);
    std::memcpy(frame.data() + sizeof hdr, &r, sizeof r);
    (void)TrySendFramed(conn->get(), frame);
    (void)RecvMessage(conn->get(), 2000);  // until the client hangs up
  });
  ConnectOptions o;
  o.socket_path = path;
  auto c = Client::Connect(o);
  fake_ferryd.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kProtocol) << c.status().ToString();
  EXPECT_NE(c.status().message().find("ferryd speaks protocol " + std::to_string(kTheirs) +
                                      ", this client speaks protocol " + std::to_string(wire::kVersion)),
            std::string::npos)
      << c.status().ToString();
  std::filesystem::remove_all(dir);
}

TEST(Daemon, RefusesAClientOfAnotherProtocolVersion) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(UniqueFd sock, ConnectUnix(d.socket_path()));
  wire::HelloRequest h{};
  h.client_version = wire::kVersion + 1;
  ASSERT_OK(Send(sock.get(), wire::MsgType::kHello, 1, h));
  ASSERT_OK_AND_ASSIGN(ReceivedMessage m, RecvMessage(sock.get(), 5000));
  ASSERT_EQ(m.type(), wire::MsgType::kHelloReply);
  Status st = FromWire(m.As<wire::HelloReply>().status);
  EXPECT_EQ(st.code(), Code::kProtocol) << st.ToString();
  EXPECT_TRUE(m.fds.empty());
}

TEST(Daemon, AClientNoticesWhenTheDaemonGoesAway) {
  auto d = std::make_unique<DaemonHarness>();
  ASSERT_OK_AND_ASSIGN(auto client, d->Connect());
  ASSERT_OK_AND_ASSIGN(HostBuffer host, client->AllocateHost(4096));
  d->Stop();
  auto r = client->AllocateHost(4096);
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
}

// GPU-side hand-off, simulated by the host backend: a copy ordered after a flagged event goes to
// its session's lane at once and starts when the client's flag reaches the record it names.
struct FlagWaitSetup {
  RawSession raw;
  uint64_t host = 0;
  std::pair<uint32_t, Mapping> region;
  wire::RegisterEventReply event{};
  static constexpr uint64_t kBytes = 300'001;

  Status Open(const std::string& socket) {
    FERRY_RETURN_IF_ERROR(raw.Open(socket));
    FERRY_ASSIGN_OR_RETURN(host, raw.AllocMappedBuffer(kBytes));
    FERRY_ASSIGN_OR_RETURN(region, raw.RegisterMappedRegion(kBytes));
    FERRY_ASSIGN_OR_RETURN(event, raw.RegisterEvent(wire::kEventWantsFlag));
    return Status::Ok();
  }
  // Host to device, after the event's record `value`.
  void SubmitAfter(uint64_t tag, uint32_t value) {
    wire::SubmissionEntry e = RawSession::HostToDevice(tag, host, kBytes, region.first);
    e.wait_event_id = event.event_id;
    e.wait_value = value;
    raw.Push(e);
  }
};

TEST(Handoff, ACopyAfterAFlaggedEventWaitsUntilTheRecordItNamesAndNoLonger) {
  DaemonHarness d;
  FlagWaitSetup c;
  ASSERT_OK(c.Open(d.socket_path()));
  ASSERT_NE(c.event.flag_index, wire::kNoFlag);
  ASSERT_LT(c.event.flag_index, wire::kEventFlags);
  EXPECT_EQ(c.raw.Flag(c.event.flag_index).load(), 0u) << "a flag is zeroed when handed out";
  std::byte* src = c.raw.BufferBytes(c.host);
  std::byte* dev = c.region.second.data();
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  FillRandom(src, c.kBytes, seed);
  Poison(dev, c.kBytes);
  c.raw.Flag(c.event.flag_index).store(1);  // the client's record 1 has happened, record 2 not yet
  c.SubmitAfter(7, 2);
  // Nothing moves while the flag is below the record the copy waits for (ferryd reads the
  // submission within a loop turn; 100 ms is many of them).
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return c.raw.header()->sq_head.value.load() == 1; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(c.raw.header()->cq_tail.value.load(), 0u) << "the copy completed before its record happened";
  for (size_t i = 0; i < c.kBytes; ++i) ASSERT_EQ(dev[i], std::byte{0xA5}) << "moved a byte before the record, at " << i;
  const uint64_t recorded = MonotonicNanos();
  c.raw.Record(c.event.flag_index, 2);
  auto done = c.raw.Next();
  const uint64_t waited = MonotonicNanos() - recorded;
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->user_tag, 7u);
  EXPECT_EQ(done->status, 0);
  EXPECT_EQ(done->bytes, c.kBytes);
  EXPECT_EQ(FirstDifference(dev, src, c.kBytes), -1);
  // The lane sleeps on the flag word and the record wakes it (without the wake, within 1 ms).
  EXPECT_LT(waited, 500'000'000u) << "the copy went " << waited << " ns after its record";
  // A record already passed (cyclically: 2 is past 0xffffffff) does not wait.
  Poison(dev, c.kBytes);
  c.SubmitAfter(8, 0xffffffffu);
  done = c.raw.Next();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status, 0);
  EXPECT_EQ(FirstDifference(dev, src, c.kBytes), -1);
}

TEST(Handoff, WhileOneClientsCopyWaitsOnItsFlagAnotherClientsCopiesGo) {
  DaemonHarness d;
  FlagWaitSetup waiting;
  ASSERT_OK(waiting.Open(d.socket_path()));
  FillRandom(waiting.raw.BufferBytes(waiting.host), waiting.kBytes, 11);
  waiting.SubmitAfter(1, 1);
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return waiting.raw.header()->sq_head.value.load() == 1; }));
  ASSERT_OK_AND_ASSIGN(auto other, d.Connect("other"));
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (size_t n : {size_t{1}, size_t{4096}, size_t{(1 << 20) + 3}}) RoundTrip(*other, n, 5, 3, seed + n);
  // The other client's own "after" copies go too, on its own lane.
  ASSERT_OK_AND_ASSIGN(SharedEvent ev, other->CreateEvent());
  ASSERT_OK(ev.Record(nullptr));
  ASSERT_OK_AND_ASSIGN(CopyTarget target, MakeCopyTarget(*other, 65537));
  auto& [src, dev, region] = target;
  FillRandom(src.data(), src.size(), seed);
  Poison(static_cast<std::byte*>(dev.data()), dev.size());
  ASSERT_OK_AND_ASSIGN(Transfer t, other->Copy(Direction::kHostToDevice, src, 0, region, 0, 65537, {.after = &ev}));
  ASSERT_OK(t.Wait(10s));
  EXPECT_EQ(FirstDifference(static_cast<std::byte*>(dev.data()), src.data(), 65537), -1);
  EXPECT_EQ(waiting.raw.header()->cq_tail.value.load(), 0u) << "the waiting copy went without its record";
  waiting.raw.Flag(waiting.event.flag_index).store(1);
  auto done = waiting.raw.Next();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status, 0);
  EXPECT_EQ(FirstDifference(waiting.region.second.data(), waiting.raw.BufferBytes(waiting.host), waiting.kBytes), -1);
}

// A client whose copy waits on a flag it never writes, then breaks the protocol: evicted, its
// wait let go by ferryd, its session reclaimed, while another client copies all along.
TEST(Handoff, AClientEvictedWithACopyWaitingOnItsFlagIsReclaimedWhileAnotherKeepsCopying) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto other, d.Connect("other"));
  std::atomic<bool> stop{false};
  std::atomic<int> round_trips{0};
  std::thread copier([&] {
    for (uint64_t i = 0; !stop; ++i) {
      RoundTrip(*other, 100'003, 1, 2, i);
      if (::testing::Test::HasFailure()) return;
      ++round_trips;
    }
  });
  struct StopOnExit {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~StopOnExit() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } stop_copier{stop, copier};
  {
    FlagWaitSetup dying;
    ASSERT_OK(dying.Open(d.socket_path()));
    dying.SubmitAfter(1, 5);
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return dying.raw.header()->sq_head.value.load() == 1; }));
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().in_flight.load() >= 1; }));
    dying.raw.header()->sq_tail.value.store(0x7fffffff);
    dying.raw.Kick();
    EXPECT_TRUE(dying.raw.DaemonHungUp());
    EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().evictions.load() == 1; }));
    EXPECT_TRUE(DaemonHarness::Eventually([&] { return dying.raw.Flag(dying.event.flag_index).load() == 5u; }))
        << "ferryd lets the lane's wait go";
    EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sessions.load() == 1; }, 10'000))
        << "the evicted session was never reclaimed";
  }
  const int at_reclaim = round_trips.load();
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return round_trips.load() >= at_reclaim + 3; }, 10'000));
  stop = true;
  copier.join();
  ASSERT_FALSE(HasFailure());
  ASSERT_OK_AND_ASSIGN(DaemonStats after, other->Stats());
  EXPECT_EQ(after.sessions, 1u);
  other.reset();
  // Every slab comes back to the pool once no session holds it.
  ASSERT_OK_AND_ASSIGN(auto probe, d.Connect("probe"));
  EXPECT_TRUE(DaemonHarness::Eventually([&] {
    auto s = probe->Stats();
    return s.ok() && s->pool_free_bytes == s->pool_bytes;
  }, 10'000)) << "the evicted session's slabs never came back";
}

// The values a client's copies wait for are its own to choose: waits on one flag half the
// counter apart (no single value satisfies both, cyclically), or spread around it, must still all
// be let go when the session ends, or its lane never drains and the session is never reclaimed.
TEST(Handoff, AClientEndingWithWaitsSpreadAroundTheCounterIsReclaimed) {
  const std::vector<std::vector<uint32_t>> spreads = {{1, 0x80000001u}, {1, 0x60000001u, 0xc0000001u}};
  for (const auto& values : spreads) {
    SCOPED_TRACE("wait values " + ::testing::PrintToString(values));
    DaemonHarness d;
    auto dying = std::make_unique<FlagWaitSetup>();
    ASSERT_OK(dying->Open(d.socket_path()));
    std::byte* src = dying->raw.BufferBytes(dying->host);
    std::byte* dev = dying->region.second.data();
    const uint64_t seed = testing::RandomSeed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    FillRandom(src, dying->kBytes, seed);
    Poison(dev, dying->kBytes);
    for (size_t i = 0; i < values.size(); ++i) dying->SubmitAfter(i + 1, values[i]);
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return dying->raw.header()->sq_head.value.load() == values.size(); }));
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().in_flight.load() == values.size(); }));
    dying->raw.header()->sq_tail.value.store(0x7fffffff);
    dying->raw.Kick();
    EXPECT_TRUE(dying->raw.DaemonHungUp());
    EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sessions.load() == 0; }, 10'000))
        << "the session's lane never drained: it was never reclaimed";
    EXPECT_EQ(d.counters().in_flight.load(), 0u);
    // Its waits were let go, not dropped: the copies ran, every byte.
    EXPECT_EQ(FirstDifference(dev, src, dying->kBytes), -1);
    dying.reset();  // its slabs stay quarantined while mapped here
    ASSERT_OK_AND_ASSIGN(auto probe, d.Connect("probe"));
    EXPECT_TRUE(DaemonHarness::Eventually([&] {
      auto s = probe->Stats();
      return s.ok() && s->pool_free_bytes == s->pool_bytes;
    }, 10'000)) << "the ended session's slabs never came back";
  }
}

// An ended session's lane waits are let go by writing its flags, again on every reap pass, as a
// client still running may write them back. A quiet ferryd once slept with no timer at all: a
// client that wrote its flag back until after the last pass left its session (slabs, region,
// lane) unreclaimed for good.
TEST(Handoff, AnEndedSessionThatWritesItsFlagBackIsReclaimedByAQuietFerryd) {
  auto config = DaemonHarness::SmallConfig();
  config.limits.hello_timeout_ms = 200;  // no hello deadline left to wake ferryd later
  DaemonHarness d(config);
  FlagWaitSetup dying;
  ASSERT_OK(dying.Open(d.socket_path()));
  dying.SubmitAfter(1, 5);
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().in_flight.load() == 1; }));
  std::atomic<bool> stop{false};
  std::thread writer([&] {  // evicted but still running, it keeps its flag at 0
    while (!stop) dying.raw.Flag(dying.event.flag_index).store(0, std::memory_order_relaxed);
  });
  dying.raw.header()->sq_tail.value.store(0x7fffffff);
  dying.raw.Kick();
  EXPECT_TRUE(dying.raw.DaemonHungUp());
  std::this_thread::sleep_for(300ms);  // past ferryd's passes while it had work
  stop = true;
  writer.join();
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sessions.load() == 0; }, 10'000))
      << "never reclaimed: in flight " << d.counters().in_flight.load() << ", flag "
      << dying.raw.Flag(dying.event.flag_index).load();
  EXPECT_EQ(d.counters().in_flight.load(), 0u);
}

// A session at its cap on copies in flight (half its completion ring), all parked on a flag,
// with one more entry on its ring: ferryd cannot take the entry until a copy finishes. It once
// saw the ring not empty and polled a core for as long as the copies waited.
TEST(Handoff, ASessionAtItsCapWithMoreOnItsRingLetsFerrydSleep) {
  DaemonHarness d;
  FlagWaitSetup c;
  ASSERT_OK(c.Open(d.socket_path()));
  const uint32_t cap = DaemonHarness::SmallConfig().ring_entries;  // half of twice the ring
  for (uint32_t i = 0; i < cap; ++i) c.SubmitAfter(i + 1, 1);
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().in_flight.load() == cap; }));
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return c.raw.header()->sq_head.value.load() == cap; }));
  wire::SubmissionEntry nop{};
  nop.user_tag = 999;
  const uint64_t sleeps = d.counters().sleeps.load();
  c.raw.Push(nop);  // its doorbell wakes ferryd
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().sleeps.load() > sleeps; }, 5000) &&
              c.raw.DaemonSleepsFor(100ms))
      << "ferryd polls over an entry it cannot take";
  EXPECT_EQ(c.raw.header()->sq_head.value.load(), cap) << "read past the cap";
  c.raw.Record(c.event.flag_index, 1);
  std::vector<bool> seen(cap + 1, false);
  for (uint32_t i = 0; i <= cap; ++i) {
    auto done = c.raw.Next(20s);
    ASSERT_TRUE(done.has_value()) << "completion " << i;
    EXPECT_EQ(done->status, 0) << "request " << done->user_tag;
    const uint64_t index = done->user_tag == 999 ? cap : done->user_tag - 1;
    ASSERT_LT(index, seen.size());
    seen[index] = true;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), cap + 1);
}

// Room on a turn is counted in entries, but wait reports (and refused requests) leave nothing in
// flight: a session whose room this turn went to wait reports is not at its cap, and the entry
// behind them is read on the next turn. It was once taken for a session at its cap, and a quiet
// ferryd slept over the entry until an unrelated copy finished.
TEST(Handoff, WaitReportsTakingATurnsRoomLeaveTheEntryBehindThemReadable) {
  DaemonHarness d;
  FlagWaitSetup c;
  ASSERT_OK(c.Open(d.socket_path()));
  c.SubmitAfter(1, 5);  // parked on its flag: 1 in flight, room for 63 entries a turn
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().in_flight.load() == 1; }));
  ASSERT_TRUE(c.raw.DaemonSleepsFor(20ms));
  const uint32_t entries = DaemonHarness::SmallConfig().ring_entries;
  uint32_t tail = c.raw.header()->sq_tail.value.load();
  for (uint32_t i = 0; i + 1 < entries; ++i) {
    wire::SubmissionEntry report{};
    report.opcode = static_cast<uint16_t>(wire::Opcode::kReportWait);
    report.user_tag = 12345;  // no copy of this session: refused, nothing posted
    report.length = 1;
    c.raw.sq()[tail++ & (entries - 1)] = report;
  }
  wire::SubmissionEntry nop{};
  nop.user_tag = 999;
  c.raw.sq()[tail++ & (entries - 1)] = nop;
  c.raw.header()->sq_tail.value.store(tail);
  c.raw.Kick();
  auto done = c.raw.Next(2s);  // a stalled one waited for a timer of ferryd's (5 s)
  ASSERT_TRUE(done.has_value()) << "the entry behind the reports was not read: sq_head "
                                << c.raw.header()->sq_head.value.load() << ", tail " << tail;
  EXPECT_EQ(done->user_tag, 999u);
  c.raw.Record(c.event.flag_index, 5);
  auto copied = c.raw.Next(5s);
  ASSERT_TRUE(copied.has_value());
  EXPECT_EQ(copied->user_tag, 1u);
  EXPECT_EQ(copied->status, 0);
}

// ferryd stopping lets its sessions' lane waits go too, each of them, and waits for those copies
// (they use the sessions' memory) before it lets go of the sessions.
TEST(Handoff, AStoppingFerrydLetsEveryLaneWaitGoBeforeItEndsTheSessions) {
  DaemonHarness d;
  FlagWaitSetup c;
  ASSERT_OK(c.Open(d.socket_path()));
  std::byte* src = c.raw.BufferBytes(c.host);
  std::byte* dev = c.region.second.data();
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  FillRandom(src, c.kBytes, seed);
  Poison(dev, c.kBytes);
  // Records 1 and 2 the client never makes: two waits on one flag, as an honest client's are.
  c.SubmitAfter(1, 1);
  c.SubmitAfter(2, 2);
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().in_flight.load() == 2; }));
  d.Stop();
  EXPECT_EQ(d.counters().in_flight.load(), 0u) << "ferryd stopped with copies waiting on a session's flag";
  EXPECT_EQ(d.counters().copies_completed.load(), 2u);
  EXPECT_EQ(FirstDifference(dev, src, c.kBytes), -1);
}

TEST(Handoff, EventsBeyondTheFlagAreaAreHandedOffOnTheHostAndStillWork) {
  DaemonHarness d;
  FlagWaitSetup c;
  ASSERT_OK(c.Open(d.socket_path()));
  ASSERT_EQ(c.event.flag_index, 0u);
  ASSERT_OK_AND_ASSIGN(auto unflagged, c.raw.RegisterEvent(0));
  EXPECT_EQ(unflagged.flag_index, wire::kNoFlag) << "an event nothing is ordered after needs no flag";
  // A client that could map device flags asks; the host backend keeps them in the ring all the same.
  for (uint32_t i = 1; i < wire::kEventFlags; ++i) {
    ASSERT_OK_AND_ASSIGN(auto r, c.raw.RegisterEvent(wire::kEventWantsFlag | (i % 2 ? wire::kEventTakesDeviceFlag : 0)));
    ASSERT_EQ(r.flag_index, i);
    // The host backend keeps every flag in the ring segment and shares no device memory.
    ASSERT_EQ(r.flag_place, wire::kFlagInRing);
    ASSERT_EQ(r.flag_memory_bytes, 0u);
    ASSERT_EQ(r.reserved, 0u);
    ASSERT_EQ(c.raw.last_event_reply_fds(), 0u);
  }
  ASSERT_OK_AND_ASSIGN(c.event, c.raw.RegisterEvent(wire::kEventWantsFlag));
  EXPECT_EQ(c.event.flag_index, wire::kNoFlag) << "flag area full";
  std::byte* src = c.raw.BufferBytes(c.host);
  std::byte* dev = c.region.second.data();
  FillRandom(src, c.kBytes, testing::RandomSeed());
  Poison(dev, c.kBytes);
  c.SubmitAfter(3, 9);  // the host backend's events have always happened; the value is not a flag's
  auto done = c.raw.Next();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status, 0);
  EXPECT_EQ(FirstDifference(dev, src, c.kBytes), -1);
  // Through libferry: an event past the flag area orders its copies all the same.
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  std::vector<SharedEvent> events;
  for (size_t i = 0; i <= wire::kEventFlags; ++i) {
    ASSERT_OK_AND_ASSIGN(SharedEvent ev, client->CreateEvent());
    events.push_back(std::move(ev));
  }
  ASSERT_OK_AND_ASSIGN(HostBuffer host, client->AllocateHost(4099));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation mem, client->AllocateDevice(4099));
  ASSERT_OK_AND_ASSIGN(DeviceRegion region, client->RegisterDevice(mem.data(), mem.size()));
  for (SharedEvent* ev : {&events.front(), &events.back()}) {
    ASSERT_OK(ev->Record(nullptr));
    ASSERT_OK(ev->Record(nullptr));
    FillRandom(host.data(), host.size(), testing::RandomSeed());
    Poison(static_cast<std::byte*>(mem.data()), mem.size());
    ASSERT_OK_AND_ASSIGN(Transfer t, client->Copy(Direction::kHostToDevice, host, 0, region, 0, 4099, {.after = ev}));
    ASSERT_OK(t.Wait(10s));
    EXPECT_EQ(FirstDifference(static_cast<std::byte*>(mem.data()), host.data(), 4099), -1);
  }
}

TEST(Handoff, AnEventWithUnknownFlagsIsRefused) {
  DaemonHarness d;
  RawSession raw;
  ASSERT_OK(raw.Open(d.socket_path()));
  for (uint32_t flags : {4u, wire::kEventWantsFlag | wire::kEventTakesDeviceFlag | 8u, 0x80000000u}) {
    const auto r = raw.RegisterEvent(flags);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << flags;
    EXPECT_NE(r.status().message().find("unknown event flags " + std::to_string(flags)), std::string::npos)
        << r.status().ToString();
  }
  // The known bits alone are taken.
  ASSERT_OK_AND_ASSIGN(auto r, raw.RegisterEvent(wire::kEventWantsFlag | wire::kEventTakesDeviceFlag));
  EXPECT_EQ(r.flag_index, 0u);
}

}  // namespace
}  // namespace ferry
