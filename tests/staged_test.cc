// The staged path: pageable host memory to and from the device through pool buffers, with
// client threads copying chunks while ferryd moves the staged ones. Every byte checked.
#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace ferry {
namespace {

using testing::DaemonHarness;
using testing::FillRandom;
using testing::FirstDifference;
using testing::Poison;

struct Device {
  DeviceAllocation dev;
  DeviceRegion region;
};

Device NewDevice(Client& c, size_t n) {
  auto dev = c.AllocateDevice(n);
  EXPECT_TRUE(dev.ok());
  auto r = c.RegisterDevice(dev->data(), dev->size());
  EXPECT_TRUE(r.ok());
  return Device{std::move(*dev), std::move(*r)};
}

TEST(Staged, PageableMemoryGoesBothWaysAtEverySizeAndAlignment) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect("staged"));
  constexpr size_t kMax = (5 << 20) + 333;
  Device dev = NewDevice(*client, kMax + 64);
  // Plain heap memory, at odd offsets: nothing here comes from the pool.
  std::vector<std::byte> src(kMax + 64), dst(kMax + 64);
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (size_t n : {size_t{1}, size_t{4095}, size_t{256 << 10}, size_t{(256 << 10) + 1}, size_t{3 << 20}, kMax}) {
    for (size_t align : {size_t{0}, size_t{7}}) {
      SCOPED_TRACE("bytes " + std::to_string(n) + " misaligned by " + std::to_string(align));
      std::byte* s = src.data() + align;
      std::byte* t = dst.data() + align;
      FillRandom(s, n, seed + n + align);
      auto* dv = static_cast<std::byte*>(dev.dev.data());
      Poison(dv, kMax + 64);
      ASSERT_OK(client->CopyStaged(Direction::kHostToDevice, s, dev.region, 13, n, {.chunk_bytes = 256 << 10, .threads = 4}));
      ASSERT_EQ(FirstDifference(dv + 13, s, n), -1);
      for (size_t i = 0; i < 13; ++i) ASSERT_EQ(dv[i], std::byte{0xA5});
      ASSERT_EQ(dv[13 + n], std::byte{0xA5}) << "wrote past the end";
      Poison(t, n + 1);
      ASSERT_OK(client->CopyStaged(Direction::kDeviceToHost, t, dev.region, 13, n, {.chunk_bytes = 256 << 10, .threads = 4}));
      ASSERT_EQ(FirstDifference(t, s, n), -1);
      ASSERT_EQ(t[n], std::byte{0xA5}) << "wrote past the end";
    }
  }
}

TEST(Staged, ThePolicySetsChunksAndThreadsAndClientsStageAtOnce) {
  auto policy = daemon::ParsePolicy("staging: {chunk_size: 512KiB, threads: 3, buffers: 6}\n", "t.yaml");
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  auto config = DaemonHarness::SmallConfig();
  config.pool_bytes = 128ull << 20;
  DaemonHarness d(config, nullptr, *policy);
  constexpr size_t kBytes = 7 << 20;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int c = 0; c < 3; ++c) {
    threads.emplace_back([&, c] {
      auto client = d.Connect("stager-" + std::to_string(c));
      ASSERT_TRUE(client.ok());
      Device dev = NewDevice(**client, kBytes);
      std::vector<std::byte> src(kBytes), back(kBytes);
      for (int rep = 0; rep < 3; ++rep) {
        FillRandom(src.data(), kBytes, testing::RandomSeed());
        Poison(back.data(), kBytes);
        ASSERT_OK((*client)->CopyStaged(Direction::kHostToDevice, src.data(), dev.region, 0, kBytes));
        ASSERT_OK((*client)->CopyStaged(Direction::kDeviceToHost, back.data(), dev.region, 0, kBytes));
        ASSERT_EQ(FirstDifference(back.data(), src.data(), kBytes), -1);
      }
      // Staging buffers stay with each client for reuse, the policy's six of 512 KiB at most:
      // whatever the others are doing, the three clients hold no more of the pool than that.
      auto st = (*client)->Stats();
      ASSERT_TRUE(st.ok());
      EXPECT_LE(st->pool_bytes - st->pool_free_bytes, 3u * 6u * (512u << 10));
      ok++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 3);
}

TEST(Staged, OneOrTwoBuffersAreEnoughAndTwoThreadsOfOneClientTakeTurns) {
  // Four threads stage each chunk together; with one or two pool buffers every chunk waits for
  // the one before it to land (host to device) or to be copied out (device to host).
  for (int buffers : {1, 2}) {
    SCOPED_TRACE("buffers " + std::to_string(buffers));
    auto policy = daemon::ParsePolicy(
        "staging: {chunk_size: 64KiB, threads: 4, buffers: " + std::to_string(buffers) + "}\n", "t.yaml");
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    DaemonHarness d(DaemonHarness::SmallConfig(), nullptr, *policy);
    ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
    constexpr size_t kBytes = (3 << 20) + 777;
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        Device dev = NewDevice(*client, kBytes);
        std::vector<std::byte> src(kBytes), back(kBytes);
        const uint64_t seed = testing::RandomSeed() + t;
        SCOPED_TRACE("seed " + std::to_string(seed));
        for (int rep = 0; rep < 3; ++rep) {
          FillRandom(src.data(), kBytes, seed + rep);
          Poison(static_cast<std::byte*>(dev.dev.data()), kBytes);
          Poison(back.data(), kBytes);
          ASSERT_OK(client->CopyStaged(Direction::kHostToDevice, src.data(), dev.region, 0, kBytes));
          ASSERT_EQ(FirstDifference(static_cast<std::byte*>(dev.dev.data()), src.data(), kBytes), -1);
          ASSERT_OK(client->CopyStaged(Direction::kDeviceToHost, back.data(), dev.region, 0, kBytes));
          ASSERT_EQ(FirstDifference(back.data(), src.data(), kBytes), -1);
        }
      });
    }
    for (auto& t : threads) t.join();
  }
}

TEST(Staged, ACopyThatFailsOnTheDeviceMidwayEndsWithTheErrorAndTheNextCopyWorks) {
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(inner.ok());
  auto faulty = std::make_unique<daemon::FaultInjectingBackend>(std::move(*inner));
  auto* fault = faulty.get();
  DaemonHarness d(DaemonHarness::SmallConfig(), std::move(faulty));
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  constexpr size_t kBytes = 4 << 20;
  Device dev = NewDevice(*client, kBytes);
  std::vector<std::byte> src(kBytes), back(kBytes);
  FillRandom(src.data(), kBytes, testing::RandomSeed());
  const StagedCopyOptions opts{.chunk_bytes = 256 << 10, .threads = 4};
  for (Direction dir : {Direction::kHostToDevice, Direction::kDeviceToHost}) {
    SCOPED_TRACE(dir == Direction::kHostToDevice ? "host to device" : "device to host");
    fault->FailSubmitsAfter(10, 1);  // the eleventh of sixteen chunks: past the eight sent ahead
    std::byte* host = dir == Direction::kHostToDevice ? src.data() : back.data();
    EXPECT_EQ(client->CopyStaged(dir, host, dev.region, 0, kBytes, opts).code(), Code::kDevice);
  }
  auto* dv = static_cast<std::byte*>(dev.dev.data());
  Poison(dv, kBytes);
  Poison(back.data(), kBytes);
  ASSERT_OK(client->CopyStaged(Direction::kHostToDevice, src.data(), dev.region, 0, kBytes, opts));
  ASSERT_EQ(FirstDifference(dv, src.data(), kBytes), -1);
  ASSERT_OK(client->CopyStaged(Direction::kDeviceToHost, back.data(), dev.region, 0, kBytes, opts));
  ASSERT_EQ(FirstDifference(back.data(), src.data(), kBytes), -1);
  EXPECT_EQ(d.counters().evictions.load(), 0u);
}

TEST(Staged, BadArgumentsAreClearErrors) {
  DaemonHarness d;
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  Device dev = NewDevice(*client, 4096);
  std::vector<std::byte> buf(8192);
  EXPECT_EQ(client->CopyStaged(Direction::kHostToDevice, nullptr, dev.region, 0, 16).code(), Code::kInvalidArgument);
  EXPECT_EQ(client->CopyStaged(Direction::kHostToDevice, buf.data(), dev.region, 0, 0).code(), Code::kInvalidArgument);
  EXPECT_EQ(client->CopyStaged(Direction::kHostToDevice, buf.data(), dev.region, 1, 4096).code(), Code::kInvalidArgument);
}

TEST(Staged, WhenThePoolCannotHoldAStagingBufferTheCopyFailsCleanly) {
  auto config = DaemonHarness::SmallConfig();
  config.pool_bytes = 2ull << 20;
  DaemonHarness d(config);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  Device dev = NewDevice(*client, 8 << 20);
  std::vector<std::byte> buf(8 << 20);
  Status st = client->CopyStaged(Direction::kHostToDevice, buf.data(), dev.region, 0, buf.size(),
                                 {.chunk_bytes = 4 << 20, .threads = 2});
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  // And the client still works.

  ASSERT_OK(client->CopyStaged(Direction::kHostToDevice, buf.data(), dev.region, 0, 1 << 20,
                               {.chunk_bytes = 256 << 10, .threads = 2}));
}

// The staged path's copy workers in this process now (they are named ferry-stage).
size_t StagingWorkers() { return static_cast<size_t>(testing::ThreadsNamed("self", "ferry-stage")); }

// The policy asks for 8 copy threads; a client allowed one CPU copies on its own thread alone
// (more would only queue for it), and with its CPUs back it starts workers.
TEST(Staged, AClientUsesNoMoreCopyThreadsThanItHasCpus) {
  auto policy = daemon::ParsePolicy("staging: {chunk_size: 1MiB, threads: 8, buffers: 4}\n", "t.yaml");
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  DaemonHarness d(DaemonHarness::SmallConfig(), nullptr, *policy);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect());
  constexpr size_t kBytes = 8 << 20;
  Device dev = NewDevice(*client, kBytes);
  std::vector<std::byte> src(kBytes), back(kBytes);
  FillRandom(src.data(), kBytes, testing::RandomSeed());

  cpu_set_t all;
  ASSERT_EQ(::sched_getaffinity(0, sizeof all, &all), 0);
  const cpu_set_t one = testing::FirstCpuOf(all);
  ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
  ASSERT_EQ(StagingWorkers(), 0u);
  Poison(back.data(), kBytes);
  const Status up = client->CopyStaged(Direction::kHostToDevice, src.data(), dev.region, 0, kBytes);
  const Status down = client->CopyStaged(Direction::kDeviceToHost, back.data(), dev.region, 0, kBytes);
  const size_t alone = StagingWorkers();
  ASSERT_EQ(::sched_setaffinity(0, sizeof all, &all), 0);
  ASSERT_OK(up);
  ASSERT_OK(down);
  EXPECT_EQ(FirstDifference(back.data(), src.data(), kBytes), -1);
  EXPECT_EQ(alone, 0u) << "no copy workers on one CPU";

  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "one CPU: no second half to the story";
  Poison(back.data(), kBytes);
  ASSERT_OK(client->CopyStaged(Direction::kHostToDevice, src.data(), dev.region, 0, kBytes));
  ASSERT_OK(client->CopyStaged(Direction::kDeviceToHost, back.data(), dev.region, 0, kBytes));
  EXPECT_EQ(FirstDifference(back.data(), src.data(), kBytes), -1);
  const size_t expected_workers = std::min<size_t>(8, static_cast<size_t>(CPU_COUNT(&all))) - 1;
  EXPECT_EQ(StagingWorkers(), expected_workers);
}

}  // namespace
}  // namespace ferry
