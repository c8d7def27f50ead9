// NUMA placement of ferryd's pool (daemon/numa, daemon/pinned_pool): sysfs and numa_maps read
// from fake trees and real-format text, mbind on this machine's first node, and a pool cut into
// parts, one bound to that node and one for a node that is not online here.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "daemon/numa.hpp"
#include "daemon/pinned_pool.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using daemon::PinnedPool;
using daemon::PoolPartSpec;

constexpr uint64_t kMiB = 1ull << 20;

// A throwaway directory standing in for /sys.
class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("sysfs");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(root_ + "/" + rel).parent_path());
    std::ofstream(root_ + "/" + rel) << text;
  }
  std::string root_;
};

TEST_F(FakeSysfs, APciDevicesNodeIsReadWhicheverWayItsBusIdIsSpelled) {
  Write("bus/pci/devices/0000:19:00.0/numa_node", "0\n");
  Write("bus/pci/devices/0000:9a:00.0/numa_node", "1\n");
  Write("bus/pci/devices/0000:3b:00.0/numa_node", "-1\n");        // no node from the firmware
  fs::create_directories(root_ + "/bus/pci/devices/0000:5d:00.0");  // no numa_node file
  fs::create_directories(root_ + "/bus/pci/devices/0000:db:00.0/numa_node");  // not readable as a file
  Write("bus/pci/devices/0000:e1:00.0/numa_node", "one\n");
  Write("bus/pci/devices/10000:01:00.0/numa_node", "1\n");  // a VMD domain
  EXPECT_EQ(daemon::NumaNodeOfPciDevice("00000000:19:00.0", root_), 0) << "CUDA's 8-digit domain";
  EXPECT_EQ(daemon::NumaNodeOfPciDevice("0000:19:00.0", root_), 0) << "sysfs' own spelling";
  EXPECT_EQ(daemon::NumaNodeOfPciDevice("00000000:9A:00.0", root_), 1) << "upper case, as CUDA prints it";
  EXPECT_EQ(daemon::NumaNodeOfPciDevice("0000:9a:00.0", root_), 1);
  EXPECT_EQ(daemon::NumaNodeOfPciDevice("00010000:01:00.0", root_), 1);
  EXPECT_EQ(daemon::NumaNodeOfPciDevice("0000:3B:00.0", root_), -1) << "the file says -1";
  EXPECT_EQ(daemon::NumaNodeOfPciDevice("0000:5d:00.0", root_), -1) << "no numa_node file";
  EXPECT_EQ(daemon::NumaNodeOfPciDevice("0000:db:00.0", root_), -1) << "numa_node unreadable";
  EXPECT_EQ(daemon::NumaNodeOfPciDevice("0000:e1:00.0", root_), -1) << "numa_node not a number";
  EXPECT_EQ(daemon::NumaNodeOfPciDevice("0000:c1:00.0", root_), -1) << "no such device";
  for (const char* bad : {"", "19:00.0", "0000:19:00.8", "0000:19:00", "zzzz:19:00.0", "0000:019:00.0",
                          "000000000:19:00.0", "0000:19:0.0", "0000:19:00.0/../../x"}) {
    EXPECT_EQ(daemon::SysfsPciBusId(bad), "") << bad;
    EXPECT_EQ(daemon::NumaNodeOfPciDevice(bad, root_), -1) << bad;
  }
  EXPECT_EQ(daemon::SysfsPciBusId("00000000:9A:0F.3"), "0000:9a:0f.3");
  EXPECT_EQ(daemon::SysfsPciBusId("0000:9a:0f.3"), "0000:9a:0f.3");
  EXPECT_EQ(daemon::SysfsPciBusId("00010000:01:00.0"), "10000:01:00.0");
}

TEST_F(FakeSysfs, OnlineNodesAndNodeCpusAreReadFromTheKernelsListFormat) {
  EXPECT_TRUE(daemon::OnlineNumaNodes(root_).empty()) << "no node directory: a kernel without NUMA";
  Write("devices/system/node/online", "0-1,3\n");
  Write("devices/system/node/node0/cpulist", "0-3,8-11\n");
  Write("devices/system/node/node1/cpulist", "4-7,12\n");
  Write("devices/system/node/node3/cpulist", "\n");  // a node of memory only
  EXPECT_EQ(daemon::OnlineNumaNodes(root_), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(daemon::CpusOfNumaNode(0, root_), (std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(daemon::CpusOfNumaNode(1, root_), (std::vector<int>{4, 5, 6, 7, 12}));
  EXPECT_TRUE(daemon::CpusOfNumaNode(3, root_).empty());
  EXPECT_TRUE(daemon::CpusOfNumaNode(2, root_).empty()) << "not online: no directory";
  EXPECT_TRUE(daemon::CpusOfNumaNode(-1, root_).empty());
  EXPECT_EQ(daemon::IntersectCpus(daemon::CpusOfNumaNode(0, root_), {1, 2, 4, 9, 30}), (std::vector<int>{1, 2, 9}));

  Write("devices/system/node/node0/meminfo",
        "Node 0 MemTotal:       24683756 kB\nNode 0 MemFree:        21031648 kB\n");
  Write("devices/system/node/node1/meminfo", "Node 1 MemFree:        21031648 kB\n");
  Write("devices/system/node/node3/meminfo", "Node 3 MemTotal:       lots kB\n");
  EXPECT_EQ(daemon::NumaNodeMemTotal(0, root_), 24683756ull << 10);
  EXPECT_EQ(daemon::NumaNodeMemTotal(1, root_), 0u) << "no MemTotal line";
  EXPECT_EQ(daemon::NumaNodeMemTotal(2, root_), 0u) << "no meminfo";
  EXPECT_EQ(daemon::NumaNodeMemTotal(3, root_), 0u) << "not a number";

  EXPECT_EQ(daemon::ParseCpuList("5,1-2,2"), (std::vector<int>{1, 2, 5}));
  EXPECT_EQ(daemon::ParseCpuList("  7 \n"), (std::vector<int>{7}));
  for (const char* bad : {"3-1", "a", "0,,1", "1,", ",1", "-1", "1-", "0-99999999", "1 2"}) {
    EXPECT_TRUE(daemon::ParseCpuList(bad).empty()) << bad;
  }
}

TEST(NumaSysfs, ThisMachinesNodesHoldEveryCpuThisProcessMayRunOn) {
  const std::vector<int> nodes = daemon::OnlineNumaNodes();
  if (nodes.empty()) GTEST_SKIP() << "this kernel reports no NUMA nodes (no /sys/devices/system/node/online)";
  std::vector<int> all;
  for (int n : nodes) {
    for (int c : daemon::CpusOfNumaNode(n)) all.push_back(c);
  }
  std::sort(all.begin(), all.end());
  const std::vector<int> mine = daemon::AffinityCpus();
  ASSERT_FALSE(mine.empty());
  EXPECT_EQ(mine.size(), daemon::UsableCpus());
  EXPECT_EQ(daemon::IntersectCpus(mine, all), mine);
  for (int n : nodes) EXPECT_GT(daemon::NumaNodeMemTotal(n), 0u) << "node " << n;
}

TEST(NumaMaps, BytesPerNodeAreCountedForTheMappingsInsideTheRangeOnly) {
  const std::string text =
      "55d0c0000000 default file=/usr/sbin/ferryd mapped=10 N0=10 kernelpagesize_kB=4\n"  // below the range
      "7f12a0000000 bind:0 file=/memfd:ferry-pool-slab-0\\040(deleted) dirty=2048 active=0 N0=2048 "
      "kernelpagesize_kB=4\n"
      "7f12a0800000 bind:1 file=/memfd:ferry-pool-slab-1\\040(deleted) dirty=512 N0=256 N1=256 kernelpagesize_kB=4\n"
      "7f12a1000000 default file=/dev/hugepages/pool huge dirty=4 N1=4 kernelpagesize_kB=2048\n"
      "7f12a1800000 interleave:0-1 anon=3 dirty=3 N2=1 N3=2 kernelpagesize_kB=1048576\n"
      "\n"
      "garbage line\n"
      "7f12a0400000 default N0=abc kernelpagesize_kB=4\n"                       // a count that is not one
      "7f12a0500000 default N0=5\n"                                             // no page size
      "7f12a0600000 default N0=18446744073709551615 kernelpagesize_kB=4\n"      // bytes past 64 bits
      "zz12a0700000 default N0=5 kernelpagesize_kB=4\n"                         // not an address
      "7f12a0900000 default\n"                                                  // no pages mapped
      "7f12b0000000 default anon=100 dirty=100 N0=100 kernelpagesize_kB=4\n"    // at the range's end
      "7f12a1900000 default anon=1 N1=1 kernelpagesize_kB=4";                  // no newline at the end
  const std::map<int, uint64_t> got = daemon::ParseNumaMaps(text, 0x7f12a0000000, 0x7f12b0000000);
  const std::map<int, uint64_t> want = {{0, 8 * kMiB + kMiB}, {1, kMiB + 8 * kMiB + 4096}, {2, 1ull << 30},
                                        {3, 2ull << 30}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(daemon::ParseNumaMaps(text, 0x7f12a0800000, 0x7f12a1000000), (std::map<int, uint64_t>{{0, kMiB}, {1, kMiB}}))
      << "one mapping, at the range's start";
  EXPECT_TRUE(daemon::ParseNumaMaps(text, 0x1000, 0x2000).empty());
  EXPECT_TRUE(daemon::ParseNumaMaps("", 0, UINTPTR_MAX).empty());
}

// The first node this machine has online (node 0 on every machine ferry knows), or -1.
int LocalNode() {
  const std::vector<int> nodes = daemon::OnlineNumaNodes();
  return nodes.empty() ? -1 : nodes.front();
}
// A node this machine does not have online.
int AbsentNode() {
  const std::vector<int> nodes = daemon::OnlineNumaNodes();
  return nodes.empty() ? 1 : nodes.back() + 1;
}

// The numa_maps line of the mapping that starts at p ("" when none does).
std::string NumaMapsLine(const void* p) {
  char start[32];
  std::snprintf(start, sizeof start, "%lx ", static_cast<unsigned long>(reinterpret_cast<uintptr_t>(p)));
  std::ifstream f("/proc/self/numa_maps");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(start, 0) == 0) return line;
  }
  return "";
}

// Skips the test where this machine cannot bind to its own first node, saying why.
#define FERRY_SKIP_UNLESS_BINDABLE(node)                                                          \
  do {                                                                                            \
    if ((node) < 0) GTEST_SKIP() << "this kernel reports no NUMA nodes";                          \
    void* probe = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); \
    ASSERT_NE(probe, MAP_FAILED);                                                                 \
    Status s = daemon::BindToNumaNode(static_cast<std::byte*>(probe), 4096, (node));              \
    ::munmap(probe, 4096);                                                                        \
    if (s.code() == Code::kPermissionDenied || s.code() == Code::kNotSupported) GTEST_SKIP() << s.ToString(); \
  } while (0)

TEST(NumaBind, PagesBoundToThisMachinesFirstNodeAreCountedThereInNumaMaps) {
  const int node = LocalNode();
  FERRY_SKIP_UNLESS_BINDABLE(node);
  const uint64_t n = 8 * kMiB;
  void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<std::byte*>(m);
  Status bound = daemon::BindToNumaNode(p, n, node);
  ASSERT_TRUE(bound.ok()) << bound.ToString();
  EXPECT_TRUE(daemon::BytesOnNumaNodes(p, n).empty()) << "nothing faulted in yet";
  testing::FillRandom(p, n, testing::RandomSeed());
  EXPECT_EQ(daemon::BytesOnNumaNodes(p, n), (std::map<int, uint64_t>{{node, n}}));
  EXPECT_NE(NumaMapsLine(p).find(" bind:" + std::to_string(node) + " "), std::string::npos) << NumaMapsLine(p);
  ::munmap(m, n);
}

TEST(NumaBind, ANodeThatIsNotOnlineIsRefusedWithAClearError) {
  if (LocalNode() < 0) GTEST_SKIP() << "this kernel reports no NUMA nodes";
  const uint64_t n = 2 * kMiB;
  void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<std::byte*>(m);
  Status s = daemon::BindToNumaNode(p, n, AbsentNode());
  if (s.code() == Code::kPermissionDenied || s.code() == Code::kNotSupported) GTEST_SKIP() << s.ToString();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("mbind to node " + std::to_string(AbsentNode()) + ": the node is not online"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(daemon::BindToNumaNode(p, n, -1).code(), Code::kInvalidArgument);
  EXPECT_EQ(daemon::BindToNumaNode(p + 1, 4096, 0).code(), Code::kInvalidArgument) << "not page-aligned";
  ::munmap(m, n);
}

// Several ranges fault in at once, every page of each resident, progress over all of them, and
// no range gets more threads than it was given.
TEST(PoolFaultIn, RangesFaultInTogetherEachWithinItsThreads) {
  const uint64_t a = 24 * kMiB, b = 9 * kMiB + 4096;
  void* m = ::mmap(nullptr, a + b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<std::byte*>(m);
  const std::vector<int> cpus = daemon::AffinityCpus();
  std::vector<std::pair<uint64_t, uint64_t>> reports;
  const std::vector<unsigned> used = daemon::FaultInParallel(
      {daemon::FaultRange{p, a, {cpus.front()}, 3}, daemon::FaultRange{p + a, b, {}, 0}}, 2 * kMiB,
      [&](uint64_t done, uint64_t total) { reports.emplace_back(done, total); }, std::chrono::milliseconds(1));
  ASSERT_EQ(used.size(), 2u);
  EXPECT_GE(used[0], 1u);
  EXPECT_LE(used[0], 3u);
  EXPECT_GE(used[1], 1u);
  EXPECT_LE(used[1], daemon::UsableCpus());
  ASSERT_GE(reports.size(), 2u);
  EXPECT_EQ(reports.front(), std::make_pair(uint64_t{0}, a + b));
  EXPECT_EQ(reports.back(), std::make_pair(a + b, a + b));
  std::vector<unsigned char> resident((a + b) / 4096);
  ASSERT_EQ(::mincore(m, a + b, resident.data()), 0);
  for (size_t i = 0; i < resident.size(); ++i) ASSERT_TRUE(resident[i] & 1) << "page " << i;
  ::munmap(m, a + b);
}

TEST(PoolParts, TwoPartsHaveTheirSlabsInARowAndEachGrantsFromItsOwnOnly) {
  const int local = LocalNode(), absent = AbsentNode();
  std::vector<std::pair<uint64_t, uint64_t>> reports;
  auto made = PinnedPool::Create({PoolPartSpec{local, 4 * kMiB}, PoolPartSpec{absent, 3 * kMiB}}, kMiB, {},
                                 [&](uint64_t done, uint64_t total) { reports.emplace_back(done, total); });
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  PinnedPool& pool = **made;
  ASSERT_EQ(pool.part_count(), 2u);
  EXPECT_EQ(pool.size(), 7 * kMiB) << "one range";
  EXPECT_EQ(pool.slab_count(), 7u);
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.front(), std::make_pair(uint64_t{0}, 7 * kMiB)) << "progress over both parts";
  EXPECT_EQ(reports.back(), std::make_pair(7 * kMiB, 7 * kMiB));
  const daemon::PoolPart &p0 = pool.part(0), &p1 = pool.part(1);
  EXPECT_EQ(p0.numa_node, local);
  EXPECT_EQ(p0.first_slab, 0u);
  EXPECT_EQ(p0.slab_count, 4u);
  EXPECT_EQ(p0.bytes, 4 * kMiB);
  EXPECT_EQ(p1.numa_node, absent);
  EXPECT_EQ(p1.first_slab, 4u);
  EXPECT_EQ(p1.slab_count, 3u);
  EXPECT_EQ(p1.bytes, 3 * kMiB);
  EXPECT_GE(p0.fault_threads, 1u);
  EXPECT_GE(p1.fault_threads, 1u);
  EXPECT_EQ(pool.fault_threads(), p0.fault_threads + p1.fault_threads);
  for (uint32_t s = 0; s < 7; ++s) EXPECT_EQ(pool.part_of_slab(s), s < 4 ? 0u : 1u) << s;

  // Where the pages are.
  EXPECT_FALSE(p1.bound);
  EXPECT_FALSE(p1.placed());
  EXPECT_EQ(p1.placement, "not placed: node " + std::to_string(absent) + " is not online on this machine");
  EXPECT_EQ(p1.bytes_on_node, 0u);
  if (local >= 0 && p0.bound) {
    EXPECT_EQ(p0.bytes_on_node, 4 * kMiB);
    EXPECT_EQ(p0.bytes_by_node, (std::map<int, uint64_t>{{local, 4 * kMiB}}));
    EXPECT_EQ(p0.placement, "all 4 MiB on node " + std::to_string(local));
    EXPECT_TRUE(p0.placed());
    EXPECT_EQ(daemon::BytesOnNumaNodes(pool.base(), 4 * kMiB), (std::map<int, uint64_t>{{local, 4 * kMiB}}));
    for (uint32_t s = 0; s < 4; ++s) {
      const std::string line = NumaMapsLine(pool.base() + s * kMiB);
      EXPECT_NE(line.find(" bind:" + std::to_string(local) + " "), std::string::npos) << line;
    }
    EXPECT_NE(NumaMapsLine(pool.base() + 4 * kMiB).find(" default "), std::string::npos) << "part 1 is not bound";
  } else {
    std::printf("node %d could not be bound here: %s\n", local, p0.placement.c_str());
    EXPECT_FALSE(p0.placed());
  }

  // Grants stay in their part.
  const uint32_t uid = ::getuid();
  auto a = pool.GrantRun(2, 1, uid, 1);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, 4u);
  auto b = pool.GrantRun(1, 2, uid, 1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*b, 6u);
  EXPECT_EQ(pool.free_bytes(1), 0u);
  EXPECT_EQ(pool.free_bytes(0), 4 * kMiB);
  EXPECT_EQ(pool.free_bytes(), 4 * kMiB);
  auto full = pool.GrantRun(1, 3, uid, 1);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), Code::kResourceExhausted);
  EXPECT_EQ(full.status().message(),
            "pool part of node " + std::to_string(absent) + " has no 1 free slabs in a row (0 of 3 free)");
  pool.Quarantine(*b);
  full = pool.GrantRun(1, 3, uid, 1);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.status().message().find("(0 of 3 free; 1 await reclaim"), std::string::npos)
      << full.status().message() << ": the part's own quarantine";
  auto c = pool.GrantRun(4, 4, uid, 0);
  ASSERT_TRUE(c.ok()) << "part 0 still grants while part 1 is full: " << c.status().ToString();
  EXPECT_EQ(*c, 0u);
  EXPECT_EQ(pool.free_bytes(0), 0u);
  EXPECT_EQ(pool.GrantRun(1, 5, uid, 2).status().code(), Code::kInvalidArgument) << "no part 2";
}

TEST(PoolParts, PartSizesThatAreNotWholeSlabsAreRoundedUpAndSayWhatWasAsked) {
  auto made = PinnedPool::Create({PoolPartSpec{-1, kMiB + kMiB / 2}, PoolPartSpec{-1, 4097}}, kMiB);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  PinnedPool& pool = **made;
  EXPECT_EQ(pool.part(0).requested_bytes, kMiB + kMiB / 2);
  EXPECT_EQ(pool.part(0).bytes, 2 * kMiB);
  EXPECT_EQ(pool.part(0).slab_count, 2u);
  EXPECT_EQ(pool.part(1).requested_bytes, 4097u);
  EXPECT_EQ(pool.part(1).bytes, kMiB);
  EXPECT_EQ(pool.part(1).first_slab, 2u);
  EXPECT_EQ(pool.size(), 3 * kMiB);
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_EQ(pool.part(i).placement, "no node");
    EXPECT_FALSE(pool.part(i).placed());
    EXPECT_TRUE(pool.part(i).bytes_by_node.empty());
  }
  EXPECT_EQ(PinnedPool::Create({PoolPartSpec{0, 0}}, kMiB).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PinnedPool::Create(std::vector<PoolPartSpec>{}, kMiB).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PinnedPool::Create({PoolPartSpec{-1, kMiB}}, 1000).status().code(), Code::kInvalidArgument)
      << "slabs of whole pages";
  // The one-part form: exactly its size, of no node.
  auto one = PinnedPool::Create(4 * kMiB, kMiB);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_EQ((*one)->part_count(), 1u);
  EXPECT_EQ((*one)->part(0).numa_node, -1);
  EXPECT_EQ((*one)->part(0).slab_count, 4u);
  EXPECT_EQ((*one)->part(0).placement, "no node");
  EXPECT_EQ(PinnedPool::Create(4 * kMiB + 1, kMiB).status().code(), Code::kInvalidArgument);
}

// A session's buffers come from its part; a full part says so, naming its node, and the other
// part still serves.
TEST(PoolParts, ASessionsBuffersComeFromItsOwnPart) {
  const int local = LocalNode(), absent = AbsentNode();
  auto made = PinnedPool::Create({PoolPartSpec{local, 2 * kMiB}, PoolPartSpec{absent, 2 * kMiB}}, kMiB);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  PinnedPool& pool = **made;
  daemon::SessionArena far(pool, 1, 64 * kMiB, ::getuid(), 0, 1);
  daemon::SessionArena near(pool, 2, 64 * kMiB, ::getuid(), 0, 0);
  EXPECT_EQ(far.part(), 1u);
  auto x = far.Allocate(2 * kMiB - 100);  // rounds up to both of its slabs
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  EXPECT_EQ(x->first_slab, 2u);
  EXPECT_EQ(x->pool_offset, 2 * kMiB);
  EXPECT_EQ(x->slab_count, 2u);
  // The buffer is the part's memory: random bytes written there read back, the other part untouched.
  std::vector<std::byte> want(x->size);
  testing::FillRandom(want.data(), want.size(), testing::RandomSeed());
  testing::Poison(pool.base(), 2 * kMiB);
  std::memcpy(pool.base() + x->pool_offset, want.data(), want.size());
  EXPECT_EQ(testing::FirstDifference(pool.base() + x->pool_offset, want.data(), want.size()), -1);
  auto y = far.Allocate(4096);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), Code::kResourceExhausted);
  EXPECT_NE(y.status().message().find("pool part of node " + std::to_string(absent) + " has no 1 free slabs"),
            std::string::npos)
      << y.status().message();
  auto big = near.Allocate(3 * kMiB);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("larger than the pool part of node " + std::to_string(local) + " ("),
            std::string::npos)
      << big.status().message();
  auto z = near.Allocate(2 * kMiB);
  ASSERT_TRUE(z.ok()) << z.status().ToString();
  EXPECT_EQ(z->first_slab, 0u);
  for (size_t i = 0; i < 2 * kMiB; ++i) ASSERT_EQ(pool.base()[i], std::byte{0xA5}) << i;
}

// shmem keeps the binding on the file: a reclaimed slab's fresh pages (the hole punched in its
// memfd, faulted in again by the zeroer, on no particular CPU) are on the node again.
TEST(PoolParts, AReclaimedSlabsFreshPagesAreOnItsNodeAgain) {
  const int node = LocalNode();
  FERRY_SKIP_UNLESS_BINDABLE(node);
  auto made = PinnedPool::Create({PoolPartSpec{node, 4 * kMiB}}, kMiB);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  PinnedPool& pool = **made;
  ASSERT_TRUE(pool.part(0).placed()) << pool.part(0).placement;
  auto slab = pool.GrantRun(1, 1, ::getuid());
  ASSERT_TRUE(slab.ok()) << slab.status().ToString();
  std::byte* p = pool.base() + uint64_t{*slab} * kMiB;
  testing::FillRandom(p, kMiB, testing::RandomSeed());
  pool.Quarantine(*slab);
  ASSERT_EQ(pool.ReclaimQuarantined(), kMiB);
  for (int i = 0; i < 1000 && pool.free_bytes(0) < 4 * kMiB; ++i) {
    pool.CollectZeroed();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(pool.free_bytes(0), 4 * kMiB);
  const std::vector<std::byte> zeros(kMiB);
  ASSERT_EQ(testing::FirstDifference(p, zeros.data(), kMiB), -1) << "fresh pages";
  EXPECT_EQ(daemon::BytesOnNumaNodes(p, kMiB), (std::map<int, uint64_t>{{node, kMiB}}));
  EXPECT_NE(NumaMapsLine(p).find(" bind:" + std::to_string(node) + " "), std::string::npos)
      << "the file keeps its binding: " << NumaMapsLine(p);
}

}  // namespace
}  // namespace ferry
