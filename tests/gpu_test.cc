// GPU tests (ctest label "gpu"): a real ferryd on the cuda backend, this test process as its
// client through CUDA IPC. They skip, reported as skipped, when no CUDA GPU answers.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "block_list_client.hpp"
#include "common/status_macros.hpp"
#include "daemon/issue_crew.hpp"
#include "ferry/client.hpp"
#include "gpu_kernels.hpp"
#include "process_util.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using testing::Child;
using testing::FillRandom;
using testing::FirstDifference;

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

class GpuDaemon : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA GPU answers: " << cudaGetErrorString(e);
    ASSERT_CUDA(cudaSetDevice(0));
    dir_ = testing::MakeTempDir("gpu");
    socket_ = dir_ + "/ferryd.sock";
    std::vector<std::string> args{FERRY_DAEMON_PATH,
                                  "--metrics-address",
                                  "127.0.0.1:0",
                                  "--backend",
                                  "cuda",
                                  "--runtime-dir",
                                  dir_,
                                  "--pool-size",
                                  "1GiB",
                                  "--log-level",
                                  "debug"};
    for (const std::string& a : ExtraDaemonArgs()) args.push_back(a);
    // ferryd inherits the test's environment when it starts; the test's own clients do not see it.
    const Environment env = DaemonEnvironment();
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    daemon_ = std::make_unique<Child>(args, dir_ + "/ferryd.log");
    for (const auto& [name, value] : env) ::unsetenv(name.c_str());
    ASSERT_TRUE(testing::DaemonHarness::Eventually([&] { return fs::exists(socket_); }, 30000)) << daemon_->Output();
    ConnectOptions o;
    o.socket_path = socket_;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString() << "\n" << daemon_->Output();
    client_ = std::move(*c);
    ASSERT_EQ(client_->backend(), BackendKind::kCuda) << daemon_->Output();
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    client_.reset();
    if (daemon_) {
      daemon_->Signal(SIGTERM);
      int st = daemon_->Wait(20s);
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << daemon_->Output();
      EXPECT_EQ(daemon_->Output().find("[error]"), std::string::npos) << daemon_->Output();
    }
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  virtual std::vector<std::string> ExtraDaemonArgs() const { return {}; }
  // Variables ferryd starts with (its experiments and fault injection: FERRY_FENCES, FERRY_PART_*).
  using Environment = std::vector<std::pair<std::string, std::string>>;
  virtual Environment DaemonEnvironment() const { return {}; }
  void ReclaimedSlabsStillCopyEveryByteBothWays(const char* registration_line);
  void ManySmallCopiesLandWhereTheyShould();
  void AdjacentCopiesLandWhereTheyShould();
  void ACopyAfterAnEventWaitsForTheKernelBeforeIt(size_t n);
  void SmallBlocksHostToDeviceLand(int crew_threads, std::chrono::milliseconds at_least = 0ms,
                                   bool first_list_fails = false);
  void ASmallBlockListAfterAnEventLandsAfterTheKernel(std::chrono::milliseconds at_least = 0ms);

  // Reads the whole device allocation back with the CUDA runtime, independent of ferry.
  std::vector<std::byte> ReadBack(const void* dev, size_t n) {
    std::vector<std::byte> out(n);
    EXPECT_EQ(cudaMemcpy(out.data(), dev, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

  // `n` random bytes (from `seed`) in a pool buffer of `c`'s (this test's client unless
  // named), and `n` bytes of device memory poisoned (0xA5) and registered as a region to copy
  // them into.
  struct PoisonedRegion {
    HostBuffer host;
    DeviceAllocation dev;
    DeviceRegion region;
  };
  Result<PoisonedRegion> MakePoisonedRegion(Client& c, size_t n, uint64_t seed) {
    FERRY_ASSIGN_OR_RETURN(HostBuffer host, c.AllocateHost(n));
    FERRY_ASSIGN_OR_RETURN(DeviceAllocation dev, c.AllocateDevice(n));
    if (cudaMemset(dev.data(), 0xA5, n) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
      return Internal("poisoning the region failed");
    }
    FERRY_ASSIGN_OR_RETURN(DeviceRegion region, c.RegisterDevice(dev.data(), dev.size()));
    FillRandom(host.data(), n, seed);
    return PoisonedRegion{std::move(host), std::move(dev), std::move(region)};
  }
  Result<PoisonedRegion> MakePoisonedRegion(size_t n, uint64_t seed) { return MakePoisonedRegion(*client_, n, seed); }

  // Another client of this test's ferryd: a session of its own.
  Result<std::unique_ptr<Client>> ConnectAnother(std::string name) {
    ConnectOptions o;
    o.socket_path = socket_;
    o.name = std::move(name);
    return Client::Connect(o);
  }

  // A device-to-host copy's ends for `c`: `n` random bytes (from `seed`, kept in `want`) in
  // device memory registered as a region, and a poisoned pool buffer of `n` bytes.
  struct DeviceSource {
    HostBuffer host;
    DeviceAllocation dev;
    DeviceRegion region;
    std::vector<std::byte> want;
  };
  Result<DeviceSource> MakeDeviceSource(Client& c, size_t n, uint64_t seed) {
    FERRY_ASSIGN_OR_RETURN(HostBuffer host, c.AllocateHost(n));
    FERRY_ASSIGN_OR_RETURN(DeviceAllocation dev, c.AllocateDevice(n));
    FERRY_ASSIGN_OR_RETURN(DeviceRegion region, c.RegisterDevice(dev.data(), dev.size()));
    std::vector<std::byte> want(n);
    FillRandom(want.data(), n, seed);
    if (cudaMemcpy(dev.data(), want.data(), n, cudaMemcpyHostToDevice) != cudaSuccess) {
      return Internal("filling the device source failed");
    }
    testing::Poison(host.data(), n);
    return DeviceSource{std::move(host), std::move(dev), std::move(region), std::move(want)};
  }

  // What a stream-wait test copies and checks: `n` random bytes in a pool buffer, a device
  // region (poisoned) to copy them into, and a mirror (poisoned) that the test's stream copies
  // the region into once it has waited, so that the mirror holds what the stream saw.
  struct MirroredRegion {
    size_t n;
    HostBuffer host;
    DeviceAllocation dev;
    DeviceRegion region;
    std::unique_ptr<void, decltype(&cudaFree)> mirror;
  };
  Result<MirroredRegion> MakeMirroredRegion(size_t n) {
    FERRY_ASSIGN_OR_RETURN(PoisonedRegion target, MakePoisonedRegion(n, testing::RandomSeed()));
    void* mirror = nullptr;
    if (cudaMalloc(&mirror, n) != cudaSuccess) return Internal("cudaMalloc of the mirror failed");
    MirroredRegion m{n, std::move(target.host), std::move(target.dev), std::move(target.region), {mirror, &cudaFree}};
    if (cudaMemset(mirror, 0x5A, n) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
      return Internal("poisoning the mirror failed");
    }
    return m;
  }
  // The region as the stream sees it now: copied into the mirror in the stream's order, read back.
  std::vector<std::byte> SeenByStream(const MirroredRegion& m) {
    EXPECT_EQ(cudaMemcpyAsync(m.mirror.get(), m.dev.data(), m.n, cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return ReadBack(m.mirror.get(), m.n);
  }

  std::string dir_, socket_;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<Client> client_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(GpuDaemon, CopiesEveryByteBothWaysThroughTheCopyEngines) {
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (size_t n : {size_t{1}, size_t{4095}, size_t{4096}, size_t{(1 << 20) + 13}, size_t{(64 << 20) + 7},
                   size_t{200 << 20}}) {
    SCOPED_TRACE("bytes " + std::to_string(n));
    const size_t host_off = n % 257, dev_off = n % 131, total = dev_off + n + 4096;
    ASSERT_OK_AND_ASSIGN(HostBuffer host, client_->AllocateHost(host_off + n));
    void* dev = nullptr;
    ASSERT_CUDA(cudaMalloc(&dev, total));
    ASSERT_CUDA(cudaMemset(dev, 0xA5, total));
    // ferryd is another process: nothing of ours is ordered before its copies unless we wait.
    ASSERT_CUDA(cudaDeviceSynchronize());
    {
      ASSERT_OK_AND_ASSIGN(DeviceRegion region, client_->RegisterDevice(dev, total));
      // host -> device: random bytes land exactly in [dev_off, dev_off + n), poison elsewhere.
      FillRandom(host.data() + host_off, n, seed + n);
      ASSERT_OK_AND_ASSIGN(Transfer up, client_->Copy(Direction::kHostToDevice, host, host_off, region, dev_off, n));
      ASSERT_OK(up.Wait(10s));
      std::vector<std::byte> back = ReadBack(dev, total);
      EXPECT_EQ(FirstDifference(back.data() + dev_off, host.data() + host_off, n), -1);
      for (size_t i = 0; i < dev_off; ++i) ASSERT_EQ(back[i], std::byte{0xA5}) << i;
      for (size_t i = dev_off + n; i < total; ++i) ASSERT_EQ(back[i], std::byte{0xA5}) << i;

      // device -> host: fresh random device bytes into a poisoned pool buffer.
      std::vector<std::byte> fresh(n);
      FillRandom(fresh.data(), n, seed + n + 1);
      ASSERT_CUDA(cudaMemcpy(static_cast<std::byte*>(dev) + dev_off, fresh.data(), n, cudaMemcpyHostToDevice));
      // From pageable memory cudaMemcpy may return before the bytes land on the device.
      ASSERT_CUDA(cudaDeviceSynchronize());
      testing::Poison(host.data(), host.size());
      ASSERT_OK_AND_ASSIGN(Transfer down, client_->Copy(Direction::kDeviceToHost, host, host_off, region, dev_off, n));
      ASSERT_OK(down.Wait(10s));
      EXPECT_EQ(FirstDifference(host.data() + host_off, fresh.data(), n), -1);
      for (size_t i = 0; i < host_off; ++i) ASSERT_EQ(host.data()[i], std::byte{0xA5}) << i;
    }
    cudaFree(dev);
  }
}

// Issue 19 item 1: a reclaimed slab is renewed (fresh pages unregistered and registered again
// with CUDA on its own, pool.register: per_slab) or zeroed in place under the pinning of the
// whole pool (whole). Either way, after one session took the whole pool and left, the next
// session's buffers read as zeros and its copies through those slabs move every byte both ways.
void GpuDaemon::ReclaimedSlabsStillCopyEveryByteBothWays(const char* registration_line) {
  Child& daemon = *daemon_;
  Client& client = *client_;
  const std::string& socket = socket_;
  EXPECT_NE(daemon.Output().find(registration_line), std::string::npos) << daemon.Output();
  const uint64_t full = client.Stats()->pool_free_bytes;
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ConnectOptions o;
  o.socket_path = socket;
  {
    ASSERT_OK_AND_ASSIGN(auto leaving, Client::Connect(o));
    ASSERT_OK_AND_ASSIGN(HostBuffer all, leaving->AllocateHost(full));
    FillRandom(all.data(), all.size(), seed);
  }  // every slab of the pool goes to quarantine, then is renewed or zeroed
  ASSERT_TRUE(testing::DaemonHarness::Eventually([&] { return client.Stats()->pool_free_bytes == full; }, 30000))
      << daemon.Output();
  ASSERT_OK_AND_ASSIGN(auto next, Client::Connect(o));
  const size_t n = (256 << 20) + 4099;
  ASSERT_OK_AND_ASSIGN(HostBuffer host, next->AllocateHost(n));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(host.data()[i], std::byte{0}) << "a reclaimed slab is not zero at " << i;
  void* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, n));
  ASSERT_CUDA(cudaMemset(dev, 0xA5, n));
  ASSERT_CUDA(cudaDeviceSynchronize());
  {
    ASSERT_OK_AND_ASSIGN(DeviceRegion region, next->RegisterDevice(dev, n));
    FillRandom(host.data(), n, seed + 1);
    ASSERT_OK_AND_ASSIGN(Transfer up, next->Copy(Direction::kHostToDevice, host, 0, region, 0, n));
    ASSERT_OK(up.Wait(10s));
    std::vector<std::byte> back = ReadBack(dev, n);
    EXPECT_EQ(FirstDifference(back.data(), host.data(), n), -1);

    std::vector<std::byte> fresh(n);
    FillRandom(fresh.data(), n, seed + 2);
    ASSERT_CUDA(cudaMemcpy(dev, fresh.data(), n, cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaDeviceSynchronize());
    testing::Poison(host.data(), n);
    ASSERT_OK_AND_ASSIGN(Transfer down, next->Copy(Direction::kDeviceToHost, host, 0, region, 0, n));
    ASSERT_OK(down.Wait(10s));
    EXPECT_EQ(FirstDifference(host.data(), fresh.data(), n), -1);
  }
  cudaFree(dev);
}

// No allowed_group: one trust domain, the pool pinned whole (pool.register: auto).
TEST_F(GpuDaemon, ReclaimedSlabsZeroedInPlaceStillCopyEveryByteBothWays) {
  ReclaimedSlabsStillCopyEveryByteBothWays("pool registered whole");
}

class PerSlabGpuDaemon : public GpuDaemon {
 protected:
  std::vector<std::string> ExtraDaemonArgs() const override { return {"--pool-register", "per_slab"}; }
};

TEST_F(PerSlabGpuDaemon, SlabsReclaimedWithFreshPagesStillCopyEveryByteBothWays) {
  ReclaimedSlabsStillCopyEveryByteBothWays("pool registered slab by slab");
}

// 1024 bulk copies in flight at once, then 4 KiB latency-class copies one after another both
// ways, each waited for by its completion: every copy seen done (however ferryd sees it), every
// byte where it belongs.
void GpuDaemon::ManySmallCopiesLandWhereTheyShould() {
  constexpr size_t kPiece = 64 << 10, kCount = 1024;
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ASSERT_OK_AND_ASSIGN(PoisonedRegion target, MakePoisonedRegion(kPiece * kCount, seed));
  auto& [host, dev, region] = target;
  std::vector<Transfer> ts;
  // Reverse order, so a piece landing at the wrong offset cannot go unnoticed.
  for (size_t i = kCount; i-- > 0;) {
    ASSERT_OK_AND_ASSIGN(Transfer t, client_->Copy(Direction::kHostToDevice, host, i * kPiece, region, i * kPiece, kPiece));
    ts.push_back(std::move(t));
  }
  for (auto& t : ts) ASSERT_OK(t.Wait(10s));
  std::vector<std::byte> back = ReadBack(dev.data(), dev.size());
  EXPECT_EQ(FirstDifference(back.data(), host.data(), host.size()), -1);

  // Latency copies from a client that waits for their completions, not for the done words the
  // engines write before the fence: each Wait returns only once ferryd saw its copy done.
  ConnectOptions o;
  o.socket_path = socket_;
  ::setenv("FERRY_DONE_WORDS", "0", 1);
  auto connected = Client::Connect(o);
  ::unsetenv("FERRY_DONE_WORDS");
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  Client& waiter = **connected;
  constexpr size_t kSmall = 4096, kSmallCount = 64;
  ASSERT_OK_AND_ASSIGN(HostBuffer small, waiter.AllocateHost(kSmall * kSmallCount));
  ASSERT_OK_AND_ASSIGN(DeviceRegion small_region, waiter.RegisterDevice(dev.data(), kSmall * kSmallCount));
  FillRandom(small.data(), small.size(), seed + 1);
  for (size_t i = 0; i < kSmallCount; ++i) {
    ASSERT_OK_AND_ASSIGN(Transfer up, waiter.Copy(Direction::kHostToDevice, small, i * kSmall, small_region, i * kSmall,
                                                  kSmall, {.priority = Priority::kLatency}));
    ASSERT_OK(up.Wait(10s));
  }
  back = ReadBack(dev.data(), small.size());
  EXPECT_EQ(FirstDifference(back.data(), small.data(), small.size()), -1);
  testing::Poison(small.data(), small.size());
  for (size_t i = 0; i < kSmallCount; ++i) {
    ASSERT_OK_AND_ASSIGN(Transfer down, waiter.Copy(Direction::kDeviceToHost, small, i * kSmall, small_region,
                                                    i * kSmall, kSmall, {.priority = Priority::kLatency}));
    ASSERT_OK(down.Wait(10s));
  }
  EXPECT_EQ(FirstDifference(small.data(), back.data(), small.size()), -1);
}

// A client's run of adjacent copies, which ferryd joins into larger ones on the engines (where
// the pool is registered slab by slab, never across a slab's end): 52 KiB pieces, so some of
// them straddle slabs, in order both ways; random data, poisoned destinations, every byte.
void GpuDaemon::AdjacentCopiesLandWhereTheyShould() {
  constexpr size_t kPiece = 52 << 10, kCount = 1024;
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ASSERT_OK_AND_ASSIGN(PoisonedRegion target, MakePoisonedRegion(kPiece * kCount, seed));
  auto& [host, dev, region] = target;
  const std::vector<std::byte> sent(host.data(), host.data() + host.size());
  std::vector<Transfer> ts;
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_OK_AND_ASSIGN(Transfer t,
                         client_->Copy(Direction::kHostToDevice, host, i * kPiece, region, i * kPiece, kPiece));
    ts.push_back(std::move(t));
  }
  for (auto& t : ts) ASSERT_OK(t.Wait(10s));
  std::vector<std::byte> back = ReadBack(dev.data(), dev.size());
  EXPECT_EQ(FirstDifference(back.data(), sent.data(), sent.size()), -1) << "host to device";
  testing::Poison(host.data(), host.size());
  ts.clear();
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_OK_AND_ASSIGN(Transfer t,
                         client_->Copy(Direction::kDeviceToHost, host, i * kPiece, region, i * kPiece, kPiece));
    ts.push_back(std::move(t));
  }
  for (auto& t : ts) ASSERT_OK(t.Wait(10s));
  EXPECT_EQ(FirstDifference(host.data(), sent.data(), sent.size()), -1) << "device to host";
}

TEST_F(GpuDaemon, AdjacentCopiesJoinedOnTheEnginesLandWhereTheyShould) { AdjacentCopiesLandWhereTheyShould(); }

TEST_F(PerSlabGpuDaemon, AdjacentCopiesJoinedWithinEachSlabLandWhereTheyShould) { AdjacentCopiesLandWhereTheyShould(); }

// By default the copy streams write fence words that ferryd reads instead of asking the driver.
TEST_F(GpuDaemon, ManySmallCopiesInFlightLandWhereTheyShould) {
  EXPECT_NE(daemon_->Output().find("copies seen done by fence words"), std::string::npos) << daemon_->Output();
  ManySmallCopiesLandWhereTheyShould();
}

class EventFencedGpuDaemon : public GpuDaemon {
 protected:
  Environment DaemonEnvironment() const override { return {{"FERRY_FENCES", "events"}}; }
};

TEST_F(EventFencedGpuDaemon, CopiesSeenDoneByEventsLandWhereTheyShould) {
  EXPECT_NE(daemon_->Output().find("copies seen done by events"), std::string::npos) << daemon_->Output();
  ManySmallCopiesLandWhereTheyShould();
}

// A kernel spins ~50 ms, then fills `n` device bytes; a copy of them to the host, submitted
// after an event recorded behind the kernel, must carry the kernel's bytes.
void GpuDaemon::ACopyAfterAnEventWaitsForTheKernelBeforeIt(size_t n) {
  ASSERT_OK_AND_ASSIGN(HostBuffer host, client_->AllocateHost(n));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, client_->AllocateDevice(n));
  ASSERT_OK_AND_ASSIGN(DeviceRegion region, client_->RegisterDevice(dev.data(), dev.size()));
  ASSERT_OK_AND_ASSIGN(SharedEvent ready, client_->CreateEvent());
  ASSERT_CUDA(cudaMemset(dev.data(), 0xA5, n));
  ASSERT_CUDA(cudaDeviceSynchronize());
  testing::Poison(host.data(), n);
  // ~50 ms of spinning at ~2 GHz, then 0x3C everywhere: a copy that did not wait reads 0xA5.
  ASSERT_CUDA(testing::LaunchSpinThenFill(dev.data(), n, 0x3C, 100'000'000, stream_));
  ASSERT_OK(ready.Record(stream_));
  ASSERT_OK_AND_ASSIGN(Transfer t, client_->Copy(Direction::kDeviceToHost, host, 0, region, 0, n, {.after = &ready}));
  ASSERT_OK(t.Wait(10s));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(host.data()[i], std::byte{0x3C}) << "copy ran ahead of the kernel at " << i;
}

TEST_F(GpuDaemon, ACopyAfterAnEventWaitsOnTheGpuForTheKernelBeforeIt) {
  ACopyAfterAnEventWaitsForTheKernelBeforeIt(4 << 20);
}

// FERRY_EVENT_FLAGS=device: the lanes wait on flags in device memory ferryd shares with each
// session; =host: on flags in the ring segment's host pages. Each is tested whichever is the
// default.
class DeviceFlagsGpuDaemon : public GpuDaemon {
 protected:
  Environment DaemonEnvironment() const override { return {{"FERRY_EVENT_FLAGS", "device"}}; }
};
class HostFlagsGpuDaemon : public GpuDaemon {
 protected:
  Environment DaemonEnvironment() const override { return {{"FERRY_EVENT_FLAGS", "host"}}; }
};

TEST_F(DeviceFlagsGpuDaemon, ACopyAfterAnEventWaitsOnTheGpuForTheKernelBeforeIt) {
  EXPECT_NE(daemon_->Output().find("; event flags in device memory"), std::string::npos) << daemon_->Output();
  ACopyAfterAnEventWaitsForTheKernelBeforeIt(4 << 20);
  EXPECT_NE(daemon_->Output().find("': event flags in device memory ("), std::string::npos) << daemon_->Output();
}

TEST_F(HostFlagsGpuDaemon, ACopyAfterAnEventWaitsOnTheGpuForTheKernelBeforeIt) {
  EXPECT_NE(daemon_->Output().find("; event flags in host memory"), std::string::npos) << daemon_->Output();
  ACopyAfterAnEventWaitsForTheKernelBeforeIt(4 << 20);
  EXPECT_EQ(daemon_->Output().find("': event flags in device memory"), std::string::npos) << daemon_->Output();
}

// A session that ends while a copy of its waits on the GPU for a record still behind a long
// kernel: ferryd writes the flag in its device memory itself, the copy drains, the session is
// reclaimed well before the kernel ends, and another session's copies still go. (With host
// flags the same can't be shown from this process: the ending client's cudaHostUnregister of
// its flag pages waits for its stream's write, after the kernel, so the session ends only then;
// on an H100 the session was reclaimed after the 4 s kernel had ended, 2026-12-08. ferryd's
// store into a ring flag is Handoff.AClientEvictedWithACopyWaitingOnItsFlagIsReclaimed...'s.)
TEST_F(DeviceFlagsGpuDaemon, ASessionEndedWithACopyParkedOnItsDeviceFlagIsLetGoAndReclaimed) {
  constexpr size_t n = (1 << 20) + 7;
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ASSERT_OK_AND_ASSIGN(auto leaving, ConnectAnother("leaving"));
  ASSERT_OK_AND_ASSIGN(DeviceSource src, MakeDeviceSource(*leaving, n, seed));
  ASSERT_OK_AND_ASSIGN(SharedEvent late, leaving->CreateEvent());
  ASSERT_CUDA(cudaDeviceSynchronize());
  cudaStream_t slow = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&slow, cudaStreamNonBlocking));
  ASSERT_CUDA(testing::LaunchSpin(8'000'000'000, slow));  // ~4 s
  ASSERT_OK(late.Record(slow));
  {
    ASSERT_OK_AND_ASSIGN(Transfer parked,
                         leaving->Copy(Direction::kDeviceToHost, src.host, 0, src.region, 0, n, {.after = &late}));
    ASSERT_OK_AND_ASSIGN(bool done, parked.Poll());
    EXPECT_FALSE(done) << "the copy went before its record";
  }
  // Its memory goes only after the kernel: ferryd's lane copies out of it once let go.
  DeviceSource keep = std::move(src);
  SharedEvent keep_event = std::move(late);
  leaving.reset();  // waits up to 1 s for its flag write, then keeps its flags mapped
  EXPECT_TRUE(testing::DaemonHarness::Eventually(
      [&] { return daemon_->Output().find("'leaving' reclaimed") != std::string::npos; }, 2000))
      << daemon_->Output();
  EXPECT_EQ(cudaStreamQuery(slow), cudaErrorNotReady) << "the kernel ended before the session was reclaimed";
  EXPECT_NE(daemon_->Output().find("'leaving': event flags in device memory"), std::string::npos) << daemon_->Output();
  ASSERT_OK_AND_ASSIGN(PoisonedRegion next, MakePoisonedRegion(n, seed + 1));
  ASSERT_OK_AND_ASSIGN(Transfer t, client_->Copy(Direction::kHostToDevice, next.host, 0, next.region, 0, n));
  ASSERT_OK(t.Wait(10s));
  ASSERT_CUDA(cudaStreamSynchronize(slow));
  std::vector<std::byte> landed = ReadBack(next.dev.data(), n);
  EXPECT_EQ(FirstDifference(landed.data(), next.host.data(), n), -1);
  cudaStreamDestroy(slow);
}

// A record writes the event's flag from the stream when the stream gets there, which may be after
// the client is gone (its end waits up to a second for the write into device flags; host flag
// pages are unregistered at once): the stream must still end cleanly and the process's CUDA
// context stay usable.
TEST_F(GpuDaemon, AClientGoneBeforeItsStreamWritesAnEventsFlagLeavesTheStreamUnharmed) {
  ASSERT_OK_AND_ASSIGN(SharedEvent ready, client_->CreateEvent());
  ASSERT_CUDA(testing::LaunchSpin(200'000'000, stream_));  // ~100 ms
  ASSERT_OK(ready.Record(stream_));
  ASSERT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady) << "the kernel ended before the client was gone";
  client_.reset();
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  void* p = nullptr;
  ASSERT_CUDA(cudaMalloc(&p, 4096));
  ASSERT_CUDA(cudaMemset(p, 0, 4096));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(cudaFree(p));
}

// The same with the record over a second behind: the client stops waiting for its stream's flag
// write at its end and keeps the flags' device memory mapped, so the late write still lands in
// memory that is there.
TEST_F(DeviceFlagsGpuDaemon, AClientGoneLongBeforeItsStreamWritesAnEventsFlagLeavesTheStreamUnharmed) {
  ASSERT_NE(daemon_->Output().find("; event flags in device memory"), std::string::npos) << daemon_->Output();
  ASSERT_OK_AND_ASSIGN(SharedEvent ready, client_->CreateEvent());
  ASSERT_CUDA(testing::LaunchSpin(3'000'000'000, stream_));  // ~1.5 s
  ASSERT_OK(ready.Record(stream_));
  const auto start = std::chrono::steady_clock::now();
  client_.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms) << "the client waited for its stream";
  ASSERT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady) << "the kernel ended before the client was gone";
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  void* p = nullptr;
  ASSERT_CUDA(cudaMalloc(&p, 4096));
  ASSERT_CUDA(cudaMemset(p, 0, 4096));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(cudaFree(p));
}

// GPU-side hand-off: the copy is submitted while the producing kernel still runs, goes to the
// client's lane at once and starts when the stream writes the event's flag after the kernel.
TEST_F(GpuDaemon, ACopyAfterAnEventSubmittedWhileTheKernelRunsCarriesTheKernelsOutput) {
  EXPECT_NE(daemon_->Output().find("handed off on the GPU"), std::string::npos) << daemon_->Output();
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (size_t n : {size_t{4096}, size_t{(8 << 20) + 5}}) {
    ASSERT_OK_AND_ASSIGN(HostBuffer host, client_->AllocateHost(n));
    ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, client_->AllocateDevice(n));
    ASSERT_OK_AND_ASSIGN(DeviceRegion region, client_->RegisterDevice(dev.data(), dev.size()));
    ASSERT_OK_AND_ASSIGN(SharedEvent ready, client_->CreateEvent());
    std::vector<std::byte> want(n);
    FillRandom(want.data(), n, seed + n);
    void* produced = nullptr;
    ASSERT_CUDA(cudaMalloc(&produced, n));
    ASSERT_CUDA(cudaMemcpy(produced, want.data(), n, cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemset(dev.data(), 0xA5, n));
    ASSERT_CUDA(cudaDeviceSynchronize());
    testing::Poison(host.data(), n);
    // ~100 ms of spinning, then the output lands: a copy that did not wait reads 0xA5.
    ASSERT_CUDA(testing::LaunchSpin(200'000'000, stream_));
    ASSERT_CUDA(cudaMemcpyAsync(dev.data(), produced, n, cudaMemcpyDeviceToDevice, stream_));
    ASSERT_OK(ready.Record(stream_));
    ASSERT_OK_AND_ASSIGN(Transfer t,
                         client_->Copy(Direction::kDeviceToHost, host, 0, region, 0, n, {.after = &ready}));
    EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady) << "the kernel ended before the copy was submitted";
    ASSERT_OK(t.Wait(10s));
    EXPECT_EQ(FirstDifference(host.data(), want.data(), n), -1) << "the copy ran ahead of the kernel's output";
    cudaFree(produced);
  }
}

// One client's copy waits on its lane for a record its stream makes only after a long kernel;
// another client's copies through the same ferryd complete meanwhile.
TEST_F(GpuDaemon, ACopyWaitingOnAnotherClientsEventDoesNotDelayThisClientsCopies) {
  constexpr size_t n = 4 << 20;
  ASSERT_OK_AND_ASSIGN(auto waiting, ConnectAnother("waiting"));
  ASSERT_OK_AND_ASSIGN(DeviceSource waits_for, MakeDeviceSource(*waiting, n, testing::RandomSeed()));
  ASSERT_OK_AND_ASSIGN(SharedEvent late, waiting->CreateEvent());
  ASSERT_CUDA(cudaDeviceSynchronize());
  cudaStream_t slow = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&slow, cudaStreamNonBlocking));
  ASSERT_CUDA(testing::LaunchSpin(4'000'000'000, slow));  // ~2 s
  ASSERT_OK(late.Record(slow));
  ASSERT_OK_AND_ASSIGN(Transfer waits, waiting->Copy(Direction::kDeviceToHost, waits_for.host, 0, waits_for.region, 0,
                                                     n, {.after = &late}));

  ASSERT_OK_AND_ASSIGN(HostBuffer host, client_->AllocateHost(n));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, client_->AllocateDevice(n));
  ASSERT_OK_AND_ASSIGN(DeviceRegion region, client_->RegisterDevice(dev.data(), dev.size()));
  for (Direction d : {Direction::kHostToDevice, Direction::kDeviceToHost}) {
    for (int rep = 0; rep < 5; ++rep) {
      FillRandom(host.data(), n, testing::RandomSeed());
      std::vector<std::byte> sent(host.data(), host.data() + n);
      if (d == Direction::kDeviceToHost) {
        ASSERT_CUDA(cudaMemcpy(dev.data(), sent.data(), n, cudaMemcpyHostToDevice));
        testing::Poison(host.data(), n);
      } else {
        ASSERT_CUDA(cudaMemset(dev.data(), 0xA5, n));
      }
      // The legacy stream only: a device-wide sync would wait for the spinning kernel too.
      ASSERT_CUDA(cudaStreamSynchronize(nullptr));
      ASSERT_OK_AND_ASSIGN(Transfer t, client_->Copy(d, host, 0, region, 0, n));
      ASSERT_OK(t.Wait(1s));  // not behind the other client's wait
      std::vector<std::byte> got = d == Direction::kHostToDevice ? ReadBack(dev.data(), n)
                                                                 : std::vector<std::byte>(host.data(), host.data() + n);
      EXPECT_EQ(FirstDifference(got.data(), sent.data(), n), -1);
    }
  }
  ASSERT_OK_AND_ASSIGN(bool done, waits.Poll());
  EXPECT_FALSE(done) << "the waiting client's copy went before its record";
  EXPECT_EQ(cudaStreamQuery(slow), cudaErrorNotReady) << "the kernel ended before the other client's copies did";
  ASSERT_OK(waits.Wait(20s));
  EXPECT_EQ(FirstDifference(waits_for.host.data(), waits_for.want.data(), n), -1);
  cudaStreamDestroy(slow);
}

// Each session's copies after events wait on lanes of their own: while one client's copy waits
// for a record its stream makes only after a long kernel, another client's copy after an event
// recorded at once goes (its lane is not stuck behind the first one's wait on the GPU).
TEST_F(GpuDaemon, ACopyAfterAnEventGoesWhileAnotherClientsCopyAfterAnEventStillWaits) {
  constexpr size_t n = (4 << 20) + 3;
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ASSERT_OK_AND_ASSIGN(auto waiting, ConnectAnother("waiting"));
  std::vector<DeviceSource> pairs;
  for (Client* c : {waiting.get(), client_.get()}) {
    ASSERT_OK_AND_ASSIGN(DeviceSource source, MakeDeviceSource(*c, n, seed + pairs.size()));
    pairs.push_back(std::move(source));
  }
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_OK_AND_ASSIGN(SharedEvent late, waiting->CreateEvent());
  ASSERT_OK_AND_ASSIGN(SharedEvent early, client_->CreateEvent());
  // This client's event is recorded (its flag written) before the kernel starts: in this
  // process, a stream may share a hardware queue with the kernel's and wait behind it.
  ASSERT_OK(early.Record(stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  cudaStream_t slow = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&slow, cudaStreamNonBlocking));
  ASSERT_CUDA(testing::LaunchSpin(4'000'000'000, slow));  // ~2 s
  ASSERT_OK(late.Record(slow));
  ASSERT_OK_AND_ASSIGN(Transfer waits, waiting->Copy(Direction::kDeviceToHost, pairs[0].host, 0, pairs[0].region, 0, n,
                                                     {.after = &late}));
  ASSERT_OK_AND_ASSIGN(Transfer goes, client_->Copy(Direction::kDeviceToHost, pairs[1].host, 0, pairs[1].region, 0, n,
                                                    {.after = &early}));
  // Within 1 s: not behind the other client's copy, whose record comes ~2 s on.
  ASSERT_OK(goes.Wait(1s));
  EXPECT_EQ(FirstDifference(pairs[1].host.data(), pairs[1].want.data(), n), -1);
  ASSERT_OK_AND_ASSIGN(bool done, waits.Poll());
  EXPECT_FALSE(done) << "the other client's copy went before its record";
  EXPECT_EQ(cudaStreamQuery(slow), cudaErrorNotReady) << "the kernel ended before this client's copy did";
  ASSERT_OK(waits.Wait(20s));
  EXPECT_EQ(FirstDifference(pairs[0].host.data(), pairs[0].want.data(), n), -1);
  cudaStreamDestroy(slow);
}

// Lanes parked on flags by many sessions at once (more streams than the 8 hardware queues the
// driver gives a process by default, so some may share one with ferryd's other streams) delay no
// other session's copies: not its bulk or 4 KiB copies on the shared streams, not its copy after
// an event already recorded on a lane of its own.
TEST_F(GpuDaemon, ManySessionsParkedOnTheirEventsDelayNoOtherSessionsCopies) {
  ASSERT_NE(daemon_->Output().find("handed off on the GPU"), std::string::npos) << daemon_->Output();
  // Both directions each: 26 lanes waiting. With this test's two clients, one session short of
  // the 16 one uid may hold at once (limits.sessions_per_uid).
  constexpr int kParked = 13;
  constexpr size_t n = (4 << 20) + 3;
  constexpr size_t small = 4096;
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  struct Parked {
    std::unique_ptr<Client> client;
    DeviceSource d2h;
    PoisonedRegion h2d;  // its pool buffer keeps what is sent
  };
  std::vector<Parked> parked;
  for (int i = 0; i < kParked; ++i) {
    ASSERT_OK_AND_ASSIGN(auto c, ConnectAnother("parked-" + std::to_string(i)));
    ASSERT_OK_AND_ASSIGN(DeviceSource d2h, MakeDeviceSource(*c, n, seed + 2 * i));
    ASSERT_OK_AND_ASSIGN(PoisonedRegion h2d, MakePoisonedRegion(*c, n, seed + 2 * i + 1));
    parked.push_back({std::move(c), std::move(d2h), std::move(h2d)});
  }
  ASSERT_OK_AND_ASSIGN(auto other, ConnectAnother("after-early"));
  ASSERT_OK_AND_ASSIGN(DeviceSource other_d2h, MakeDeviceSource(*other, n, seed + 2 * kParked));
  // This client's four copies (bulk and 4 KiB, both ways), each at its own offset, set up
  // before the kernel starts: while it runs, this process's own CUDA calls could wait behind it
  // (its streams may share a hardware queue with the kernel's), so the device side of the
  // host-to-device copies is read back only once it is over.
  struct Case {
    size_t bytes;
    Direction direction;
    size_t offset;
    std::vector<std::byte> sent;
  };
  std::vector<Case> cases;
  for (const size_t bytes : {n, small}) {
    for (Direction d : {Direction::kHostToDevice, Direction::kDeviceToHost}) {
      cases.push_back({bytes, d, cases.size() * n, std::vector<std::byte>(bytes)});
    }
  }
  ASSERT_OK_AND_ASSIGN(HostBuffer host, client_->AllocateHost(cases.size() * n));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, client_->AllocateDevice(cases.size() * n));
  ASSERT_OK_AND_ASSIGN(DeviceRegion region, client_->RegisterDevice(dev.data(), dev.size()));
  ASSERT_CUDA(cudaMemset(dev.data(), 0xA5, dev.size()));
  for (Case& c : cases) {
    FillRandom(c.sent.data(), c.bytes, seed + c.offset + c.bytes);
    if (c.direction == Direction::kDeviceToHost) {
      ASSERT_CUDA(
          cudaMemcpy(static_cast<std::byte*>(dev.data()) + c.offset, c.sent.data(), c.bytes, cudaMemcpyHostToDevice));
      testing::Poison(host.data() + c.offset, c.bytes);
    } else {
      std::memcpy(host.data() + c.offset, c.sent.data(), c.bytes);
    }
  }
  ASSERT_OK_AND_ASSIGN(SharedEvent early, other->CreateEvent());
  ASSERT_OK(early.Record(stream_));
  // Each parked client's event is made and recorded once before the kernel starts too (its
  // first record registers the client's flag page); the copies wait for its second record.
  std::vector<SharedEvent> lates;
  for (Parked& p : parked) {
    ASSERT_OK_AND_ASSIGN(SharedEvent late, p.client->CreateEvent());
    ASSERT_OK(late.Record(stream_));
    lates.push_back(std::move(late));
  }
  ASSERT_CUDA(cudaDeviceSynchronize());

  cudaStream_t slow = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&slow, cudaStreamNonBlocking));
  ASSERT_CUDA(testing::LaunchSpin(16'000'000'000, slow));  // ~8 s
  std::vector<Transfer> waits;
  // Whatever fails from here, nothing is freed while the kernel runs or a parked copy is out:
  // ferryd's lanes would copy into memory gone from under its mappings.
  struct DrainOnExit {
    cudaStream_t slow;
    std::vector<Transfer>& waits;
    ~DrainOnExit() {
      cudaStreamSynchronize(slow);
      for (Transfer& w : waits) (void)w.Wait(30s);
      cudaStreamDestroy(slow);
    }
  } drain{slow, waits};
  for (size_t i = 0; i < parked.size(); ++i) {
    Parked& p = parked[i];
    ASSERT_OK(lates[i].Record(slow));
    ASSERT_OK_AND_ASSIGN(Transfer d2h, p.client->Copy(Direction::kDeviceToHost, p.d2h.host, 0, p.d2h.region, 0, n,
                                                      {.after = &lates[i]}));
    waits.push_back(std::move(d2h));
    ASSERT_OK_AND_ASSIGN(Transfer h2d, p.client->Copy(Direction::kHostToDevice, p.h2d.host, 0, p.h2d.region, 0, n,
                                                      {.after = &lates[i]}));
    waits.push_back(std::move(h2d));
  }

  // Each within 1 s, where the parked copies' records come ~8 s on.
  ASSERT_OK_AND_ASSIGN(Transfer goes, other->Copy(Direction::kDeviceToHost, other_d2h.host, 0, other_d2h.region, 0, n,
                                                  {.after = &early}));
  {
    SCOPED_TRACE("a copy after a recorded event, on a lane of its own");
    ASSERT_OK(goes.Wait(1s));
  }
  EXPECT_EQ(FirstDifference(other_d2h.host.data(), other_d2h.want.data(), n), -1);
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.bytes) + " bytes " + (c.direction == Direction::kHostToDevice ? "h2d" : "d2h"));
    ASSERT_OK_AND_ASSIGN(Transfer t, client_->Copy(c.direction, host, c.offset, region, c.offset, c.bytes));
    ASSERT_OK(t.Wait(1s));
    if (c.direction == Direction::kDeviceToHost) {
      EXPECT_EQ(FirstDifference(host.data() + c.offset, c.sent.data(), c.bytes), -1);
    }
  }
  // The parked copies are still out, and the kernel still runs after that look.
  for (Transfer& w : waits) {
    ASSERT_OK_AND_ASSIGN(bool done, w.Poll());
    EXPECT_FALSE(done) << "a parked copy went before its record";
  }
  EXPECT_EQ(cudaStreamQuery(slow), cudaErrorNotReady) << "the kernel ended before the other sessions' copies did";
  for (Transfer& w : waits) ASSERT_OK(w.Wait(30s));
  ASSERT_CUDA(cudaStreamSynchronize(slow));
  for (const Case& c : cases) {
    if (c.direction != Direction::kHostToDevice) continue;
    std::vector<std::byte> landed = ReadBack(static_cast<std::byte*>(dev.data()) + c.offset, c.bytes);
    EXPECT_EQ(FirstDifference(landed.data(), c.sent.data(), c.bytes), -1) << c.bytes << " bytes h2d";
  }
  for (size_t i = 0; i < parked.size(); ++i) {
    const Parked& p = parked[i];
    EXPECT_EQ(FirstDifference(p.d2h.host.data(), p.d2h.want.data(), n), -1) << "parked client " << i << ", d2h";
    std::vector<std::byte> landed = ReadBack(p.h2d.dev.data(), n);
    EXPECT_EQ(FirstDifference(landed.data(), p.h2d.host.data(), n), -1) << "parked client " << i << ", h2d";
  }
}

TEST_F(GpuDaemon, AStreamWaitsOnTheGpuForACopyWithoutTheHostBlocking) {
  constexpr size_t n = 256 << 20;  // ~5 ms on the bus
  ASSERT_OK_AND_ASSIGN(MirroredRegion m, MakeMirroredRegion(n));
  ASSERT_OK_AND_ASSIGN(Transfer t,
                       client_->Copy(Direction::kHostToDevice, m.host, 0, m.region, 0, n, {.stream_waitable = true}));
  ASSERT_OK(t.StreamWait(stream_));
  // The consumer: a device-to-device copy on our stream, which must see the copied bytes.
  std::vector<std::byte> back = SeenByStream(m);
  EXPECT_EQ(FirstDifference(back.data(), m.host.data(), n), -1) << "the stream did not wait for the copy";
  ASSERT_OK(t.Wait(1s));
}

// Copies after events run on the session's lane; a stream waiting on a batch of them runs on only
// once every one has landed.
TEST_F(GpuDaemon, AStreamWaitingOnCopiesAfterEventsRunsOnOnlyOnceEveryOneLanded) {
  constexpr size_t kCount = 6;
  const size_t sizes[kCount] = {(32 << 20) + 3, 16 << 20, 4096, (8 << 20) + 1, 65536, (24 << 20) + 7};
  size_t offsets[kCount] = {}, n = 0;
  for (size_t i = 0; i < kCount; ++i) {
    offsets[i] = n;
    n += sizes[i];
  }
  ASSERT_OK_AND_ASSIGN(MirroredRegion m, MakeMirroredRegion(n));
  std::vector<SharedEvent> events;
  std::vector<Transfer> batch;
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_OK_AND_ASSIGN(SharedEvent ev, client_->CreateEvent());
    ASSERT_CUDA(testing::LaunchSpin(4'000'000, stream_));  // ~2 ms each
    ASSERT_OK(ev.Record(stream_));
    ASSERT_OK_AND_ASSIGN(Transfer t, client_->Copy(Direction::kHostToDevice, m.host, offsets[i], m.region, offsets[i],
                                                   sizes[i], {.after = &ev, .stream_waitable = true}));
    events.push_back(std::move(ev));
    batch.push_back(std::move(t));
  }
  ASSERT_OK(client_->StreamWait(batch, stream_));
  std::vector<std::byte> back = SeenByStream(m);
  for (size_t i = 0; i < kCount; ++i) {
    EXPECT_EQ(FirstDifference(back.data() + offsets[i], m.host.data() + offsets[i], sizes[i]), -1)
        << "the stream ran on before copy " << i << " landed";
  }
  for (Transfer& t : batch) ASSERT_OK(t.Wait(1s));
}

// GET /metrics from the daemon under test (its log names the port it bound).
std::string ScrapeDaemon(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex(R"(metrics on http://127\.0\.0\.1:([0-9]+)/metrics)"))) return "";
  return testing::Scrape(std::stoi(m[1]));
}

double ExposedSumH2d(const std::string& scrape) {
  std::smatch m;
  if (!std::regex_search(scrape, m, std::regex(R"(\nferry_exposed_seconds_sum\{[^}]*direction="h2d"[^}]*\} ([0-9.e+-]+))"))) return -1;
  return std::stod(m[1]);
}

double ExposedCountH2d(const std::string& scrape) {
  std::smatch m;
  if (!std::regex_search(scrape, m, std::regex(R"(\nferry_exposed_seconds_count\{[^}]*direction="h2d"[^}]*\} ([0-9.e+-]+))"))) return -1;
  return std::stod(m[1]);
}

TEST_F(GpuDaemon, AStreamsStallOnACopyIsMeasuredOnTheGpuAndExportedAsExposedTime) {
  constexpr size_t n = 512 << 20;  // ~10 ms on the bus: the idle stream stalls about that long
  ASSERT_OK_AND_ASSIGN(HostBuffer host, client_->AllocateHost(n));
  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, client_->AllocateDevice(n));
  ASSERT_OK_AND_ASSIGN(DeviceRegion region, client_->RegisterDevice(dev.data(), dev.size()));
  FillRandom(host.data(), n, testing::RandomSeed());
  const std::string first = ScrapeDaemon(daemon_->Output());
  ASSERT_NE(first.find("ferry_build_info"), std::string::npos) << "no scrape from the daemon";
  const double before = std::max(0.0, ExposedSumH2d(first));  // no series before the first wait
  ASSERT_OK_AND_ASSIGN(Transfer t, client_->Copy(Direction::kHostToDevice, host, 0, region, 0, n, {.stream_waitable = true}));
  ASSERT_OK(t.StreamWait(stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  // The stall is read from the GPU's timing events on the library's next call and reported
  // then; a small copy makes that call and wakes the daemon to read the report.
  ASSERT_OK_AND_ASSIGN(Transfer poke, client_->Copy(Direction::kHostToDevice, host, 0, region, 0, 4096));
  ASSERT_OK(poke.Wait(1s));
  double after = -1;
  EXPECT_TRUE(testing::DaemonHarness::Eventually([&] {
    after = ExposedSumH2d(ScrapeDaemon(daemon_->Output()));
    return after - before >= 0.004;
  }, 5000)) << "exposed h2d seconds went from " << before << " to " << after << "; the stream waited ~10 ms";
  EXPECT_LT(after - before, 1.0);
}

TEST_F(GpuDaemon, AStreamWaitsOnABatchOfCopiesWithOneProbeAndOneReport) {
  constexpr size_t kPiece = 64 << 20, kCount = 6;  // ~8 ms on the bus in all
  constexpr size_t n = kPiece * kCount;
  ASSERT_OK_AND_ASSIGN(MirroredRegion m, MakeMirroredRegion(n));
  const std::string first = ScrapeDaemon(daemon_->Output());
  const double before = std::max(0.0, ExposedSumH2d(first));
  const double reports_before = std::max(0.0, ExposedCountH2d(first));
  std::vector<Transfer> batch;
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_OK_AND_ASSIGN(Transfer t, client_->Copy(Direction::kHostToDevice, m.host, i * kPiece, m.region, i * kPiece,
                                                   kPiece, {.stream_waitable = true}));
    batch.push_back(std::move(t));
  }
  ASSERT_OK(client_->StreamWait(batch, stream_));
  std::vector<std::byte> back = SeenByStream(m);
  EXPECT_EQ(FirstDifference(back.data(), m.host.data(), n), -1) << "the stream did not wait for every copy";
  for (Transfer& t : batch) ASSERT_OK(t.Wait(1s));
  ASSERT_OK_AND_ASSIGN(Transfer poke, client_->Copy(Direction::kHostToDevice, m.host, 0, m.region, 0, 4096));
  ASSERT_OK(poke.Wait(1s));
  double after = -1, reports = -1;
  EXPECT_TRUE(testing::DaemonHarness::Eventually([&] {
    const std::string scrape = ScrapeDaemon(daemon_->Output());
    after = ExposedSumH2d(scrape);
    reports = ExposedCountH2d(scrape);
    return after - before >= 0.004 && reports - reports_before >= 2;
  }, 5000)) << "exposed h2d seconds went from " << before << " to " << after << "; the stream waited ~8 ms";
  // The batch's one report and the poke's host wait: six stream waits one by one would make seven.
  EXPECT_EQ(reports - reports_before, 2);
}

TEST_F(GpuDaemon, PageableMemoryIsStagedBothWays) {
  constexpr size_t n = (64 << 20) + 7;
  std::vector<std::byte> src(n), back(n);
  FillRandom(src.data(), n, testing::RandomSeed());
  void* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, n + 64));
  ASSERT_CUDA(cudaMemset(dev, 0xA5, n + 64));
  ASSERT_CUDA(cudaDeviceSynchronize());
  {
    ASSERT_OK_AND_ASSIGN(DeviceRegion region, client_->RegisterDevice(dev, n + 64));
    ASSERT_OK(client_->CopyStaged(Direction::kHostToDevice, src.data(), region, 3, n));
    std::vector<std::byte> got = ReadBack(dev, n + 64);
    EXPECT_EQ(FirstDifference(got.data() + 3, src.data(), n), -1);
    EXPECT_EQ(got[0], std::byte{0xA5});
    EXPECT_EQ(got[n + 3], std::byte{0xA5});
    testing::Poison(back.data(), n);
    ASSERT_OK(client_->CopyStaged(Direction::kDeviceToHost, back.data(), region, 3, n));
    EXPECT_EQ(FirstDifference(back.data(), src.data(), n), -1);
  }
  cudaFree(dev);
}

TEST_F(GpuDaemon, BadDeviceRangesAreRefusedByTheDaemon) {
  void* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, 1 << 20));
  // More than the allocation holds: the client library refuses before asking.
  EXPECT_FALSE(client_->RegisterDevice(dev, 2 << 20).ok());
  int host_var = 0;
  EXPECT_EQ(client_->RegisterDevice(&host_var, sizeof host_var).status().code(), Code::kInvalidArgument);
  cudaFree(dev);
}

TEST_F(GpuDaemon, AClientKilledMidCopyIsClosedOutAndTheDaemonStaysUp) {
  const uint64_t full = client_->Stats()->pool_free_bytes;
  auto victim = std::make_unique<Child>(
      std::vector<std::string>{FERRY_TEST_CLIENT_PATH, "hold", socket_, std::to_string(256 << 20)}, dir_ + "/victim.log");
  ASSERT_TRUE(victim->WaitForOutput("ready", 30s)) << victim->Output();
  std::this_thread::sleep_for(30ms);  // it keeps 256 MiB copies going
  victim->Signal(SIGKILL);
  EXPECT_TRUE(WIFSIGNALED(victim->Wait()));
  EXPECT_TRUE(testing::DaemonHarness::Eventually([&] { return client_->Stats()->pool_free_bytes == full; }, 10000))
      << daemon_->Output();
  EXPECT_TRUE(testing::DaemonHarness::Eventually(
      [&] { return daemon_->Output().find("'hold'") != std::string::npos &&
                   daemon_->Output().find("closed") != std::string::npos; }, 5000))
      << daemon_->Output();
  // Still serving: a fresh round trip.
  auto worker = std::make_unique<Child>(
      std::vector<std::string>{FERRY_TEST_CLIENT_PATH, "roundtrip", socket_, std::to_string(64 << 20), "3"},
      dir_ + "/worker.log");
  int st = worker->Wait(60s);
  ASSERT_TRUE(WIFEXITED(st)) << worker->Output();
  EXPECT_EQ(WEXITSTATUS(st), 0) << worker->Output();
}

// Registers `bytes` of this process's cudaMalloc memory at `dev` with ferryd through `raw`, by a
// CUDA IPC handle; the region's id.
Result<uint32_t> RegisterByIpc(testing::RawClient& raw, void* dev, uint64_t bytes) {
  wire::RegisterDeviceRequest req{};
  req.kind = static_cast<uint32_t>(wire::DeviceHandleKind::kCudaIpc);
  req.size = bytes;
  cudaIpcMemHandle_t handle;
  if (const cudaError_t e = cudaIpcGetMemHandle(&handle, dev); e != cudaSuccess) {
    return Internal(std::string("cudaIpcGetMemHandle: ") + cudaGetErrorString(e));
  }
  std::memcpy(req.handle, &handle, sizeof handle);
  return raw.Register(req);
}

// Block lists through the copy engines, written on the ring by hand: the issue's shuffled lists
// (16 KiB, 256 KiB and 2 MiB blocks) and an odd block size with per-block lengths, both ways;
// each unit goes as one cudaMemcpyBatchAsync. Every byte of both regions read back.
TEST_F(GpuDaemon, BlockListsMoveEveryByteBothWays) {
  testing::RawClient raw;
  ASSERT_OK(raw.Open(socket_));
  ASSERT_OK_AND_ASSIGN(testing::RawClient::Buffer list, raw.AllocBuffer(4 << 20));
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  struct Shape {
    uint32_t count, blocks;
    uint64_t block_bytes;
    bool lengths;
  };
  for (const Shape sh : {Shape{4096, 4608, 16 << 10, false}, Shape{512, 576, 256 << 10, false},
                         Shape{64, 72, 2 << 20, false}, Shape{300, 400, 4097, true}}) {
    SCOPED_TRACE(std::to_string(sh.count) + " blocks of " + std::to_string(sh.block_bytes));
    const uint64_t bytes = uint64_t{sh.blocks} * sh.block_bytes;
    const testing::BlockList l = testing::Shuffled(sh.count, sh.blocks, sh.block_bytes, sh.lengths, seed + sh.count);
    const std::vector<std::byte> list_bytes = l.Bytes();
    std::memcpy(list.data, list_bytes.data(), list_bytes.size());
    ASSERT_OK_AND_ASSIGN(testing::RawClient::Buffer host, raw.AllocBuffer(bytes));
    ASSERT_OK_AND_ASSIGN(testing::RawClient::Buffer back, raw.AllocBuffer(bytes));
    void* dev = nullptr;
    ASSERT_CUDA(cudaMalloc(&dev, bytes));
    ASSERT_CUDA(cudaMemset(dev, 0xA5, bytes));
    ASSERT_CUDA(cudaDeviceSynchronize());
    ASSERT_OK_AND_ASSIGN(uint32_t region, RegisterByIpc(raw, dev, bytes));

    FillRandom(host.data, bytes, seed);
    raw.Push(testing::Group(1, wire::Opcode::kBlocksHostToDevice, host.pool_offset, bytes, region, bytes,
                            sh.block_bytes, l, testing::Where::kPool, list.pool_offset));
    auto up = raw.Next();
    ASSERT_TRUE(up.has_value());
    ASSERT_EQ(up->status, 0) << daemon_->Output();
    std::vector<std::byte> want = testing::Expected(host.data, bytes, l, sh.block_bytes);
    std::vector<std::byte> got = ReadBack(dev, bytes);
    EXPECT_EQ(FirstDifference(got.data(), want.data(), bytes), -1) << "device bytes differ";

    std::vector<std::byte> fresh(bytes);
    FillRandom(fresh.data(), bytes, seed + 1);
    ASSERT_CUDA(cudaMemcpy(dev, fresh.data(), bytes, cudaMemcpyHostToDevice));
    testing::Poison(back.data, bytes);
    raw.Push(testing::Group(2, wire::Opcode::kBlocksDeviceToHost, back.pool_offset, bytes, region, bytes,
                            sh.block_bytes, l, testing::Where::kPool, list.pool_offset));
    auto down = raw.Next();
    ASSERT_TRUE(down.has_value());
    ASSERT_EQ(down->status, 0) << daemon_->Output();
    want = testing::Expected(fresh.data(), bytes, l, sh.block_bytes);
    EXPECT_EQ(FirstDifference(back.data, want.data(), bytes), -1) << "host bytes differ";
    ASSERT_OK(raw.Unregister(region));
    ASSERT_CUDA(cudaFree(dev));
  }
}

// The threads of ferryd named as the issue crew's helpers (daemon/issue_crew.hpp).
int CrewThreadsOf(pid_t pid) { return testing::ThreadsNamed(std::to_string(pid), daemon::IssueCrew::kThreadName); }

// 4096 shuffled blocks of 16 KiB host to device, random bytes into a poisoned region, every
// byte checked as soon as the list's completion comes (which takes at least `at_least`); then
// how many crew threads ferryd has. With `first_list_fails` (ferryd fails a part of it), the
// first of three lists must fail, each of its blocks wholly copied or wholly poisoned, some
// poisoned (the failed part's) and at least half copied; the two after it land whole.
void GpuDaemon::SmallBlocksHostToDeviceLand(int crew_threads, std::chrono::milliseconds at_least,
                                            bool first_list_fails) {
  testing::RawClient raw;
  ASSERT_OK(raw.Open(socket_));
  ASSERT_OK_AND_ASSIGN(testing::RawClient::Buffer list, raw.AllocBuffer(1 << 20));
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr uint32_t kCount = 4096, kBlocks = 4096;
  constexpr uint64_t kBlock = 16 << 10, kBytes = uint64_t{kBlocks} * kBlock;
  EXPECT_EQ(CrewThreadsOf(daemon_->pid()), 0) << "before any list";
  const testing::BlockList l = testing::Shuffled(kCount, kBlocks, kBlock, false, seed);
  const std::vector<std::byte> list_bytes = l.Bytes();
  std::memcpy(list.data, list_bytes.data(), list_bytes.size());
  ASSERT_OK_AND_ASSIGN(testing::RawClient::Buffer host, raw.AllocBuffer(kBytes));
  void* dev_memory = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev_memory, kBytes));
  const std::unique_ptr<void, decltype(&cudaFree)> owned(dev_memory, &cudaFree);  // freed on any ASSERT
  void* const dev = owned.get();
  ASSERT_CUDA(cudaMemset(dev, 0xA5, kBytes));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_OK_AND_ASSIGN(uint32_t region, RegisterByIpc(raw, dev, kBytes));
  for (uint64_t round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    FillRandom(host.data, kBytes, seed + 1 + round);
    const auto t0 = std::chrono::steady_clock::now();
    raw.Push(testing::Group(1 + round, wire::Opcode::kBlocksHostToDevice, host.pool_offset, kBytes, region, kBytes,
                            kBlock, l, testing::Where::kPool, list.pool_offset));
    auto up = raw.Next();
    const auto took = std::chrono::steady_clock::now() - t0;
    ASSERT_TRUE(up.has_value());
    EXPECT_GE(took, at_least) << "the list's completion came before its parts could have landed";
    const std::vector<std::byte> want = testing::Expected(host.data, kBytes, l, kBlock);
    const std::vector<std::byte> got = ReadBack(dev, kBytes);
    if (first_list_fails && round == 0) {
      EXPECT_NE(up->status, 0) << "a list with a failed part reported done";
      const std::vector<std::byte> poison(kBlock, std::byte{0xA5});
      uint32_t copied = 0, poisoned = 0;
      for (uint32_t b = 0; b < kBlocks; ++b) {
        const std::byte* at = got.data() + b * kBlock;
        if (std::memcmp(at, want.data() + b * kBlock, kBlock) == 0) {
          ++copied;
        } else if (std::memcmp(at, poison.data(), kBlock) == 0) {
          ++poisoned;
        }
      }
      EXPECT_EQ(copied + poisoned, kBlocks) << "blocks partly copied: the failure came before its copies were done";
      EXPECT_GT(poisoned, 0u) << "the failed part's blocks were copied";
      // Part 0 alone is not held back: a failure reported before the held-back parts were done
      // would leave three quarters of the blocks poisoned.
      EXPECT_GE(copied, kBlocks / 2) << "the failure came before the other parts were done";
    } else {
      ASSERT_EQ(up->status, 0) << daemon_->Output();
      EXPECT_EQ(FirstDifference(got.data(), want.data(), kBytes), -1) << "device bytes differ";
    }
    ASSERT_CUDA(cudaMemset(dev, 0xA5, kBytes));
    ASSERT_CUDA(cudaDeviceSynchronize());
  }
  EXPECT_EQ(CrewThreadsOf(daemon_->pid()), crew_threads);
  ASSERT_OK(raw.Unregister(region));
}

// ferryd's default: four threads (the loop and three helpers) issue such a list in parts.
TEST_F(GpuDaemon, ASmallBlockHostToDeviceListIsIssuedInPartsByTheCrewAndEveryByteLands) {
  SmallBlocksHostToDeviceLand(3);
}

// The crew's part streams held back on the GPU (FERRY_PART_DELAY_MS: each but the first sleeps
// 300 ms before its copies): the list's completion must wait for every part, so it comes after
// the delay with every byte in place; a fence that followed the first part alone would report
// the list done with three quarters of it still poisoned.
class DelayedPartsGpuDaemon : public GpuDaemon {
 protected:
  Environment DaemonEnvironment() const override { return {{"FERRY_PART_DELAY_MS", "300"}}; }
};

TEST_F(DelayedPartsGpuDaemon, ASmallBlockListsCompletionWaitsForEveryPart) { SmallBlocksHostToDeviceLand(3, 300ms); }

// Part 1 of the first list fails (FERRY_PART_FAIL) while parts 1 to 3 are held back 300 ms: the
// list fails, but only once the parts that did issue are done (the client may free or reuse the
// memory as soon as it hears); ferryd goes on, and the next lists land whole.
class FailedPartGpuDaemon : public GpuDaemon {
 protected:
  Environment DaemonEnvironment() const override { return {{"FERRY_PART_DELAY_MS", "300"}, {"FERRY_PART_FAIL", "1"}}; }
};

TEST_F(FailedPartGpuDaemon, AListWithAFailedPartFailsOnlyOnceItsOtherPartsAreDone) {
  SmallBlocksHostToDeviceLand(3, 300ms, /*first_list_fails=*/true);
}

// A list of small host-to-device blocks ordered after an event goes in parts too (on its lane's
// own part streams), and none of its blocks lands before the kernel ahead of the event is done:
// the kernel spins ~100 ms, then its stream copies the region (poisoned) to a mirror, then the
// event is recorded. The mirror must hold the poison alone, the region every block as soon as
// the list's completion comes (which takes at least `at_least`).
void GpuDaemon::ASmallBlockListAfterAnEventLandsAfterTheKernel(std::chrono::milliseconds at_least) {
  ASSERT_NE(daemon_->Output().find("handed off on the GPU"), std::string::npos) << daemon_->Output();
  constexpr uint32_t kBlocks = 4096;
  constexpr uint64_t kBlock = 16 << 10, kBytes = uint64_t{kBlocks} * kBlock;
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ASSERT_OK_AND_ASSIGN(PoisonedRegion target, MakePoisonedRegion(kBytes, seed));
  void* mirror_memory = nullptr;
  ASSERT_CUDA(cudaMalloc(&mirror_memory, kBytes));
  const std::unique_ptr<void, decltype(&cudaFree)> mirror(mirror_memory, &cudaFree);
  ASSERT_CUDA(cudaMemset(mirror.get(), 0x5A, kBytes));
  ASSERT_CUDA(cudaDeviceSynchronize());
  const testing::BlockList l = testing::Shuffled(kBlocks, kBlocks, kBlock, false, seed + 1);
  ASSERT_OK_AND_ASSIGN(SharedEvent ready, client_->CreateEvent());
  EXPECT_EQ(CrewThreadsOf(daemon_->pid()), 0) << "before any list";

  ASSERT_CUDA(testing::LaunchSpin(200'000'000, stream_));
  ASSERT_CUDA(cudaMemcpyAsync(mirror.get(), target.dev.data(), kBytes, cudaMemcpyDeviceToDevice, stream_));
  ASSERT_OK(ready.Record(stream_));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(
      Transfer t,
      client_->CopyBlocks(Direction::kHostToDevice, target.host, 0, target.region, 0,
                          {.block_bytes = kBlock, .src = l.src, .dst = l.dst, .lengths = {}}, {.after = &ready}));
  EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady) << "the kernel ended before the list was submitted";
  ASSERT_OK(t.Wait(10s));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, at_least)
      << "the list's completion came before its parts could have landed";
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  const std::vector<std::byte> seen = ReadBack(mirror.get(), kBytes);
  const std::vector<std::byte> poison(kBytes, std::byte{0xA5});
  EXPECT_EQ(FirstDifference(seen.data(), poison.data(), kBytes), -1) << "blocks landed before the kernel was done";
  const std::vector<std::byte> want = testing::Expected(target.host.data(), kBytes, l, kBlock);
  const std::vector<std::byte> got = ReadBack(target.dev.data(), kBytes);
  EXPECT_EQ(FirstDifference(got.data(), want.data(), kBytes), -1) << "device bytes differ";
  EXPECT_EQ(CrewThreadsOf(daemon_->pid()), 3) << "the list was not issued in parts";
}

TEST_F(GpuDaemon, ASmallBlockListAfterAnEventGoesInPartsAndWaitsForTheKernelBeforeIt) {
  ASmallBlockListAfterAnEventLandsAfterTheKernel();
}

// With the lane's parts held back 300 ms, the list's completion waits for every one of them.
TEST_F(DelayedPartsGpuDaemon, ASmallBlockListAfterAnEventCompletesOnlyOnceEveryPartLanded) {
  ASmallBlockListAfterAnEventLandsAfterTheKernel(300ms);
}

class OneIssuerGpuDaemon : public GpuDaemon {
 protected:
  std::vector<std::string> ExtraDaemonArgs() const override { return {"--issue-threads", "1"}; }
};

TEST_F(OneIssuerGpuDaemon, ASmallBlockHostToDeviceListIssuedByTheLoopAloneLandsToo) { SmallBlocksHostToDeviceLand(0); }

// One line of ferryd's engine trace: a stream's (or a lane's) share of a copy, with its timeline
// in microseconds and, for a batch issued in parts by the crew, how many parts.
struct TraceSpan {
  std::string line;
  std::string direction;  // "h2d" or "d2h"
  std::string where;      // "stream N" or "lane"
  uint64_t bytes = 0;
  double accepted = 0, issued = 0, start = 0, end = 0, seen = 0;
  int parts = 1;
};

std::vector<TraceSpan> TraceSpans(const std::string& log) {
  static const std::regex kLine(
      R"(engine trace: (h2d|d2h) (stream \d+|lane), (\d+) bytes: accepted ([0-9.]+), issued ([0-9.]+), on the engine ([0-9.]+) to ([0-9.]+), seen done ([0-9.]+) us( \(in (\d+) parts\))?)");
  std::vector<TraceSpan> spans;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), kLine); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    spans.push_back(TraceSpan{.line = m.str(),
                              .direction = m[1],
                              .where = m[2],
                              .bytes = std::stoull(m[3]),
                              .accepted = std::stod(m[4]),
                              .issued = std::stod(m[5]),
                              .start = std::stod(m[6]),
                              .end = std::stod(m[7]),
                              .seen = std::stod(m[8]),
                              .parts = m[10].matched ? std::stoi(m[10]) : 1});
  }
  return spans;
}

// Accepted, then issued before the engine ran it, the engine's run in order, and seen done after.
// The GPU's clock and the host's are lined up once, at the trace's start, to within a few
// microseconds (logged): allow 10 us of slack between them.
void ExpectTimelineHolds(const TraceSpan& span) {
  EXPECT_LE(span.accepted, span.issued);  // both on the host's clock
  EXPECT_LE(span.issued, span.start + 10);
  EXPECT_LE(span.start, span.end);
  EXPECT_LE(span.end, span.seen + 10);
}

// ferryd --trace-engine: the copies still land, and each stream's share of a copy is logged
// with a timeline that holds together (accepted, then issued before the engine ran it, seen done after).
class TracedGpuDaemon : public GpuDaemon {
 protected:
  std::vector<std::string> ExtraDaemonArgs() const override { return {"--trace-engine"}; }
};

TEST_F(TracedGpuDaemon, EachCopysTimeOnTheEnginesIsLoggedAndTheBytesStillLand) {
  constexpr size_t kBytes = (64 << 20) + 4093;
  const uint64_t seed = testing::RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ASSERT_OK_AND_ASSIGN(HostBuffer host, client_->AllocateHost(kBytes));
  void* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, kBytes));
  ASSERT_CUDA(cudaMemset(dev, 0xA5, kBytes));
  ASSERT_CUDA(cudaDeviceSynchronize());
  {
    ASSERT_OK_AND_ASSIGN(DeviceRegion region, client_->RegisterDevice(dev, kBytes));
    FillRandom(host.data(), kBytes, seed);
    ASSERT_OK_AND_ASSIGN(Transfer up, client_->Copy(Direction::kHostToDevice, host, 0, region, 0, kBytes));
    ASSERT_OK(up.Wait(10s));
    std::vector<std::byte> back = ReadBack(dev, kBytes);
    EXPECT_EQ(FirstDifference(back.data(), host.data(), kBytes), -1);
    testing::Poison(host.data(), kBytes);
    ASSERT_OK_AND_ASSIGN(Transfer down, client_->Copy(Direction::kDeviceToHost, host, 0, region, 0, kBytes));
    ASSERT_OK(down.Wait(10s));
    EXPECT_EQ(FirstDifference(host.data(), back.data(), kBytes), -1);
  }
  cudaFree(dev);

  uint64_t bytes[2] = {0, 0};
  const std::string log = daemon_->Output();
  for (const TraceSpan& span : TraceSpans(log)) {
    if (span.where == "lane") continue;
    SCOPED_TRACE(span.line);
    bytes[span.direction == "h2d" ? 0 : 1] += span.bytes;
    ExpectTimelineHolds(span);
  }
  EXPECT_EQ(bytes[0], kBytes) << log;
  EXPECT_EQ(bytes[1], kBytes) << log;
}

// A small-block list issued in parts by the crew is logged as one span a list, from its earliest
// part's start to the fence behind every part, with how many parts: 4096 x 16 KiB, three times.
TEST_F(TracedGpuDaemon, ASmallBlockListIssuedInPartsIsLoggedAsOneSpanWithItsParts) {
  SmallBlocksHostToDeviceLand(3);
  if (HasFatalFailure()) return;
  uint64_t bytes = 0;
  int spans = 0;
  const std::string log = daemon_->Output();
  for (const TraceSpan& span : TraceSpans(log)) {
    if (span.direction != "h2d" || span.where == "lane" || span.parts == 1) continue;
    SCOPED_TRACE(span.line);
    bytes += span.bytes;
    ++spans;
    EXPECT_EQ(span.parts, 4);
    ExpectTimelineHolds(span);
  }
  EXPECT_EQ(spans, 3) << log;
  EXPECT_EQ(bytes, 3 * (uint64_t{4096} << 14)) << log;
}

// A copy after an event runs on its session's lane, which logs it from the end of its wait for
// the event: after the kernel before the event, and before the copy is seen done.
TEST_F(TracedGpuDaemon, ALanesCopyAfterAnEventIsLoggedFromTheEndOfItsWait) {
  constexpr size_t n = 4 << 20;
  ACopyAfterAnEventWaitsForTheKernelBeforeIt(n);
  if (HasFatalFailure()) return;

  const std::string log = daemon_->Output();
  std::vector<TraceSpan> lane_spans;
  for (const TraceSpan& span : TraceSpans(log)) {
    if (span.direction == "d2h" && span.where == "lane") lane_spans.push_back(span);
  }
  ASSERT_FALSE(lane_spans.empty()) << log;
  const TraceSpan& span = lane_spans.front();
  SCOPED_TRACE(span.line);
  EXPECT_EQ(span.bytes, n);
  ExpectTimelineHolds(span);
  // The kernel spins ~50 ms before the event: the lane's wait ends well after the copy's issue.
  EXPECT_GT(span.start, span.issued + 10'000) << "the lane's span starts before its wait could have ended";
}

}  // namespace
}  // namespace ferry
