// One ferryd serving several GPUs, on the host backend's simulated GPUs and NUMA nodes: sessions
// name their GPU, copies run on that GPU's streams, device memory is checked against it (from
// the memory, not the client's word), and every figure is counted per GPU.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "daemon/backend.hpp"
#include "daemon/server.hpp"
#include "ferry/client.hpp"
#include "tests/raw_connection.hpp"
#include "tests/test_util.hpp"

namespace ferry::testing {
namespace {

constexpr size_t kMiB = 1 << 20;

// A ferryd on `gpus` simulated GPUs over two simulated NUMA nodes, serving `devices` of them.

// Round trips through the pool to the client's GPU and back, random data each time, the
// destinations poisoned first, every byte checked. Returns the bytes it copied each way.
void RoundTrips(Client& c, size_t bytes, int rounds, uint32_t seed, uint64_t* copied) {
  auto host = c.AllocateHost(bytes);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  auto dev = c.AllocateDevice(bytes);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  auto region = c.RegisterDevice(dev->data(), bytes);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  std::mt19937 rng(seed);
  std::vector<std::byte> want(bytes);
  for (int r = 0; r < rounds; ++r) {
    for (auto& b : want) b = static_cast<std::byte>(rng());
    std::memcpy(host->data(), want.data(), bytes);
    std::memset(dev->data(), 0xA5, bytes);
    auto up = c.Copy(Direction::kHostToDevice, *host, 0, *region, 0, bytes);
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    ASSERT_OK(up->Wait(std::chrono::seconds(10)));
    ASSERT_EQ(std::memcmp(dev->data(), want.data(), bytes), 0) << "round " << r << " to the device";
    std::memset(host->data(), 0x5A, bytes);
    auto down = c.Copy(Direction::kDeviceToHost, *host, 0, *region, 0, bytes);
    ASSERT_TRUE(down.ok()) << down.status().ToString();
    ASSERT_OK(down->Wait(std::chrono::seconds(10)));
    ASSERT_EQ(std::memcmp(host->data(), want.data(), bytes), 0) << "round " << r << " back to the host";
    *copied += bytes;
  }
}

TEST(MultiGpu, ClientsOfTwoGpusCopyAtOnceEachOnItsOwnGpu) {
  auto harness = DaemonHarness::SimulatedGpus(2);
  DaemonHarness& d = *harness;
  auto c0 = d.Connect("gpu0", 0);
  auto c1 = d.Connect("gpu1", 1);
  ASSERT_TRUE(c0.ok()) << c0.status().ToString();
  ASSERT_TRUE(c1.ok()) << c1.status().ToString();
  EXPECT_EQ((*c0)->gpu_uuid(), "host-gpu-0");
  EXPECT_EQ((*c1)->gpu_uuid(), "host-gpu-1");
  EXPECT_EQ((*c0)->numa_node(), 0);
  EXPECT_EQ((*c1)->numa_node(), 1);
  EXPECT_EQ(d.counters().gpu[0].sessions.load(), 1u);
  EXPECT_EQ(d.counters().gpu[1].sessions.load(), 1u);
  uint64_t copied0 = 0, copied1 = 0;
  std::thread t0([&] { RoundTrips(**c0, 3 * kMiB + 4096 + 17, 6, 1, &copied0); });
  std::thread t1([&] { RoundTrips(**c1, 2 * kMiB + 999, 8, 2, &copied1); });
  t0.join();
  t1.join();
  ASSERT_GT(copied0, 0u);
  ASSERT_GT(copied1, 0u);
  EXPECT_EQ(d.counters().gpu[0].bytes_h2d.load(), copied0);
  EXPECT_EQ(d.counters().gpu[0].bytes_d2h.load(), copied0);
  EXPECT_EQ(d.counters().gpu[1].bytes_h2d.load(), copied1);
  EXPECT_EQ(d.counters().gpu[1].bytes_d2h.load(), copied1);
  EXPECT_EQ(d.counters().gpu[0].copies_completed.load(), 12u);
  EXPECT_EQ(d.counters().gpu[1].copies_completed.load(), 16u);
}

// A raw session: names its GPU by hand and registers a memfd made "for" another simulated GPU.
class RawGpuSession : public RawConnection {
 public:
  Result<wire::UseGpuReply> UseGpu(int ordinal) {
    wire::UseGpuRequest req{};
    req.ordinal = ordinal;
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kUseGpu, req));
    if (m.type() != wire::MsgType::kUseGpuReply) return Internal("bad reply");
    return m.As<wire::UseGpuReply>();
  }
  Status RegisterMemoryOf(int ordinal, int32_t claimed_ordinal) {
    FERRY_ASSIGN_OR_RETURN(UniqueFd mem, CreateSealedMemfd("ferry-sim-gpu" + std::to_string(ordinal), 1 << 20));
    wire::RegisterDeviceRequest req{};
    req.kind = static_cast<uint32_t>(wire::DeviceHandleKind::kHostMemfd);
    req.device_ordinal = claimed_ordinal;
    req.size = 1 << 20;
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kRegisterDevice, req, mem.get()));
    return FromWire(m.As<wire::RegisterDeviceReply>().status);
  }
  Status Alloc() {
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kAllocBuffer, wire::AllocBufferRequest{4096}));
    return FromWire(m.As<wire::AllocBufferReply>().status);
  }
  // A buffer of `size`, its slabs' fds kept (as libferry keeps them mapped); returns its offset.
  Result<uint64_t> AllocKeep(uint64_t size) {
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kAllocBuffer, wire::AllocBufferRequest{size}));
    const auto r = m.As<wire::AllocBufferReply>();
    FERRY_RETURN_IF_ERROR(FromWire(r.status));
    for (UniqueFd& f : m.fds) slabs_.push_back(std::move(f));
    return r.pool_offset;
  }
  Status Free(uint64_t pool_offset) {
    FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kFreeBuffer, wire::FreeBufferRequest{pool_offset}));
    return FromWire(m.As<wire::SimpleReply>().status);
  }

 private:
  std::vector<UniqueFd> slabs_;
};

// The pool has a part per NUMA node of the GPUs, half each here; a client's buffers come from
// its GPU's part.
TEST(MultiGpu, EachClientsBuffersComeFromItsGpusNumaNode) {
  auto harness = DaemonHarness::SimulatedGpus(2);
  DaemonHarness& d = *harness;
  const auto& parts = d.counters().pool_part;
  ASSERT_EQ(d.counters().pool_parts.load(), 2u);
  EXPECT_EQ(parts[0].numa_node.load(), 0);
  EXPECT_EQ(parts[1].numa_node.load(), 1);
  EXPECT_EQ(parts[0].bytes.load() + parts[1].bytes.load(), 64u * kMiB);
  EXPECT_EQ(parts[0].bytes.load(), 32u * kMiB);
  auto c1 = d.Connect("gpu1", 1);
  ASSERT_TRUE(c1.ok()) << c1.status().ToString();
  auto b1 = (*c1)->AllocateHost(5 * kMiB);
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ(parts[1].free_bytes.load(), 27u * kMiB);
  EXPECT_EQ(parts[0].free_bytes.load(), 32u * kMiB);
  auto c0 = d.Connect("gpu0", 0);
  ASSERT_TRUE(c0.ok());
  auto b0 = (*c0)->AllocateHost(3 * kMiB);
  ASSERT_TRUE(b0.ok());
  EXPECT_EQ(parts[0].free_bytes.load(), 29u * kMiB);
  EXPECT_EQ(parts[1].free_bytes.load(), 27u * kMiB);
  // A part that is full says so, naming its node, while the other still grants.
  auto too_much = (*c1)->AllocateHost(28 * kMiB);
  ASSERT_FALSE(too_much.ok());
  EXPECT_EQ(too_much.status().code(), Code::kResourceExhausted);
  EXPECT_NE(too_much.status().message().find("node 1"), std::string::npos) << too_much.status().ToString();
  auto fits = (*c0)->AllocateHost(28 * kMiB);
  EXPECT_TRUE(fits.ok()) << fits.status().ToString();
}

TEST(MultiGpu, MemoryOfAnotherGpuIsRefusedWhateverTheClientClaims) {
  auto harness = DaemonHarness::SimulatedGpus(2);
  DaemonHarness& d = *harness;
  RawGpuSession s;
  ASSERT_OK(s.Open(d.socket_path()));
  auto use = s.UseGpu(0);
  ASSERT_TRUE(use.ok()) << use.status().ToString();
  ASSERT_OK(FromWire(use->status));
  // The request claims GPU 0; the memory was made for GPU 1.
  Status st = s.RegisterMemoryOf(1, 0);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("host-gpu-1"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("host-gpu-0"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("one session per GPU"), std::string::npos) << st.ToString();
  // Its own GPU's memory is taken, whatever ordinal the request claims.
  ASSERT_OK(s.RegisterMemoryOf(0, 7));
  // The refusal cost the session nothing: it still copies.
  auto c = d.Connect("gpu1", 1);
  ASSERT_TRUE(c.ok());
  uint64_t copied = 0;
  RoundTrips(**c, 64 << 10, 2, 3, &copied);
  EXPECT_EQ(copied, 2u * (64 << 10));
}

TEST(MultiGpu, AGpuIsNamedBeforeTheSessionUsesAnything) {
  auto harness = DaemonHarness::SimulatedGpus(2);
  DaemonHarness& d = *harness;
  RawGpuSession s;
  ASSERT_OK(s.Open(d.socket_path()));
  ASSERT_OK(s.Alloc());
  auto use = s.UseGpu(1);
  ASSERT_TRUE(use.ok());
  EXPECT_EQ(FromWire(use->status).code(), Code::kInvalidArgument);
  EXPECT_NE(FromWire(use->status).message().find("before it allocates"), std::string::npos);
}

// A session's slabs are bounded by its quota whatever it does: naming its GPU again after it
// took slabs (and freed its buffers) must not hand it a fresh arena while the old one's slabs,
// still mapped by the client, sit in quarantine outside the session's quota.
TEST(MultiGpu, NamingTheGpuAgainDoesNotEscapeTheSessionQuota) {
  daemon::DaemonConfig c = DaemonHarness::SmallConfig();
  c.runtime_dir = MakeTempDir("rt");
  c.host_gpus = 2;
  c.host_numa_nodes = 1;  // one pool part: every slab the session takes shows in its free bytes
  c.session_quota_bytes = 2 * kMiB;
  std::string why;
  auto backends = daemon::CreateBackends(c, &why);
  ASSERT_TRUE(backends.ok()) << backends.status().ToString();
  auto server = daemon::Server::Create(c, std::move(*backends), {.policy = DaemonHarness::SmallChunks()});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Status run;
  std::thread loop([&] { run = (*server)->Run(); });
  const uint64_t pool = (*server)->pool_bytes();
  {
    RawGpuSession s;
    ASSERT_OK(s.Open((*server)->config().SocketPath()));
    auto use = s.UseGpu(0);
    ASSERT_TRUE(use.ok()) << use.status().ToString();
    ASSERT_OK(FromWire(use->status));
    int refused = 0;
    for (int round = 0; round < 4; ++round) {
      auto off = s.AllocKeep(2 * kMiB);
      ASSERT_TRUE(off.ok()) << "round " << round << ": " << off.status().ToString();
      ASSERT_OK(s.Free(*off));
      auto again = s.UseGpu(round % 2);
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      if (!FromWire(again->status).ok()) {
        EXPECT_EQ(FromWire(again->status).code(), Code::kInvalidArgument) << FromWire(again->status).ToString();
        ++refused;
      }
      // The session's slabs (in its arena or quarantined for it) never pass its quota.
      EXPECT_LE(pool - (*server)->counters().pool_free_bytes.load(), c.session_quota_bytes) << "round " << round;
    }
    EXPECT_EQ(refused, 4);
    EXPECT_EQ((*server)->counters().gpu[0].sessions.load() + (*server)->counters().gpu[1].sessions.load(), 1u);
  }
  (*server)->Stop();
  loop.join();
  EXPECT_TRUE(run.ok()) << run.ToString();
  server->reset();
  std::filesystem::remove_all(c.runtime_dir);
}

TEST(MultiGpu, OnlyTheConfiguredGpusAreServed) {
  auto harness = DaemonHarness::SimulatedGpus(3, 2, {"2", "0"});
  DaemonHarness& d = *harness;
  auto c1 = d.Connect("gpu1", 1);
  ASSERT_FALSE(c1.ok());
  EXPECT_EQ(c1.status().code(), Code::kNotFound);
  EXPECT_NE(c1.status().message().find("host-gpu-1 is not one this ferryd serves"), std::string::npos)
      << c1.status().ToString();
  EXPECT_NE(c1.status().message().find("host-gpu-2, host-gpu-0"), std::string::npos) << c1.status().ToString();
  auto c2 = d.Connect("gpu2", 2);
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  EXPECT_EQ((*c2)->gpu_uuid(), "host-gpu-2");
  uint64_t copied = 0;
  RoundTrips(**c2, 1 * kMiB, 2, 4, &copied);
  // ferryd's GPU index 0 is host-gpu-2 (the order devices lists them).
  EXPECT_EQ(d.counters().gpu[0].bytes_h2d.load(), copied);
  EXPECT_EQ(d.counters().gpu[1].bytes_h2d.load(), 0u);
}

TEST(MultiGpu, TheDevicesKeyParses) {
  auto all = daemon::ParseConfig("devices: all\n", "t.yaml");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_TRUE(all->devices.empty());
  auto list = daemon::ParseConfig("devices: [0, GPU-5f3e0c1a-aaaa-bbbb-cccc-0123456789ab]\n", "t.yaml");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->devices, (std::vector<std::string>{"0", "GPU-5f3e0c1a-aaaa-bbbb-cccc-0123456789ab"}));
  auto legacy = daemon::ParseConfig("device: 3\n", "t.yaml");
  ASSERT_TRUE(legacy.ok());
  EXPECT_EQ(legacy->devices, std::vector<std::string>{"3"});
  auto host = daemon::ParseConfig("host:\n  gpus: 4\n  numa_nodes: 2\n", "t.yaml");
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->host_gpus, 4u);
  EXPECT_EQ(host->host_numa_nodes, 2u);
  for (const char* bad : {"devices: [0, 0]\n", "devices: [1, 01]\n", "devices: [gpu0]\n", "devices: []\n", "device: 0\ndevices: [1]\n",
                          "devices: {a: 1}\n", "host:\n  gpus: 0\n", "host:\n  cpus: 2\n"}) {
    auto c = daemon::ParseConfig(bad, "t.yaml");
    EXPECT_FALSE(c.ok()) << bad;
    if (!c.ok()) {
      EXPECT_NE(c.status().message().find("t.yaml:"), std::string::npos) << c.status().ToString();
    }
  }
  auto flag = daemon::ParseDeviceList("0, 2,GPU-ab");
  ASSERT_TRUE(flag.ok());
  EXPECT_EQ(*flag, (std::vector<std::string>{"0", "2", "GPU-ab"}));
  EXPECT_FALSE(daemon::ParseDeviceList("0,,1").ok());
  EXPECT_FALSE(daemon::ParseDeviceList("0,00").ok()) << "GPU 0 twice";
  auto padded = daemon::ParseDeviceList("01");
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(*padded, std::vector<std::string>{"1"});
}

}  // namespace
}  // namespace ferry::testing
