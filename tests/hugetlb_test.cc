// Pools of the kernel's reserved huge pages (pool.huge_pages: hugetlb): every page huge, renewed
// slabs too, clients copying through them byte for byte; too few reserved pages is a clear
// error at start. Reserving pages needs root (/proc/sys/vm/nr_hugepages): without it the tests
// that need them skip, saying so; the ones that check refusals run anyway.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "common/fd.hpp"
#include "daemon/pinned_pool.hpp"
#include "daemon/preflight.hpp"
#include "tests/test_util.hpp"

namespace ferry::testing {
namespace {

constexpr const char* kNrHugepages = "/proc/sys/vm/nr_hugepages";

uint64_t ReadCount(const char* path) {
  std::ifstream in(path);
  uint64_t n = 0;
  in >> n;
  return n;
}

// Tests that reserve pages run one at a time (a lock file), and give back what they reserved.
class Hugetlb : public ::testing::Test {
 protected:
  void SetUp() override {
    lock_.reset(::open("/tmp/ferry-hugetlb-test.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0600));
    ASSERT_TRUE(lock_.valid());
    ASSERT_EQ(::flock(lock_.get(), LOCK_EX), 0);
    page_ = daemon::HugetlbPageBytes();
    if (page_ == 0) GTEST_SKIP() << "this kernel has no hugetlb pages";
  }
  void TearDown() override {
    if (reserved_) {
      std::ofstream(kNrHugepages) << before_;
    }
  }
  // `pages` more free hugetlb pages than now, or false (not root, or the kernel found no memory).
  bool Reserve(uint64_t pages) {
    before_ = ReadCount(kNrHugepages);
    const uint64_t free_before = daemon::FreeHugetlbPages();
    {
      std::ofstream out(kNrHugepages);
      out << before_ + pages;
      out.flush();
      if (!out) return false;
    }
    reserved_ = true;
    return daemon::FreeHugetlbPages() >= free_before + pages;
  }

  UniqueFd lock_;
  uint64_t page_ = 0;
  uint64_t before_ = 0;
  bool reserved_ = false;
};

TEST_F(Hugetlb, EveryPageOfThePoolIsHugeAndRenewedSlabsStayHuge) {
  const uint64_t slab = 2 * page_, slabs = 4;
  if (!Reserve(slab / page_ * slabs)) GTEST_SKIP() << "cannot reserve hugetlb pages here (needs root)";
  auto p = daemon::PinnedPool::Create({daemon::PoolPartSpec{-1, slab * slabs}}, slab, {}, {}, {}, {}, true);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  daemon::PinnedPool& pool = **p;
  EXPECT_TRUE(pool.hugetlb());
  EXPECT_EQ(pool.huge_page_bytes(), pool.size());

  // A client's view of a granted slab and the pool's are the same bytes.
  ASSERT_OK_AND_ASSIGN(uint32_t s, pool.GrantRun(1, 7, ::getuid()));
  ASSERT_OK_AND_ASSIGN(UniqueFd fd, pool.OpenForClient(s));
  ASSERT_OK(CheckSealedMemfd(fd.get(), slab));
  {
    ASSERT_OK_AND_ASSIGN(Mapping m, MapShared(fd.get(), slab));
    std::mt19937_64 rng(11);
    for (uint64_t i = 0; i < slab; i += 8) {
      const uint64_t v = rng();
      std::memcpy(m.data() + i, &v, 8);
    }
    EXPECT_EQ(std::memcmp(m.data(), pool.base() + s * slab, slab), 0);
  }
  fd.reset();

  // Back from the session: fresh zero pages, huge ones, before it is free again.
  pool.Quarantine(s);
  EXPECT_EQ(pool.ReclaimQuarantined(), slab);
  for (int i = 0; i < 1000 && pool.free_bytes() != pool.size(); ++i) {
    ASSERT_TRUE(WaitReadable(pool.zeroed_fd(), 10000).ok());
    pool.CollectZeroed();
  }
  ASSERT_EQ(pool.free_bytes(), pool.size());
  EXPECT_EQ(pool.broken_bytes(), 0u);
  const std::byte* renewed = pool.base() + s * slab;
  for (uint64_t i = 0; i < slab; ++i) ASSERT_EQ(renewed[i], std::byte{0}) << "byte " << i;
  EXPECT_EQ(pool.huge_page_bytes(), pool.size());
}

TEST_F(Hugetlb, TooFewReservedPagesOrAnUnevenSlabIsAClearErrorAtStart) {
  const uint64_t free_pages = daemon::FreeHugetlbPages();
  const uint64_t want = (free_pages + 1) * page_;
  Status few = daemon::CheckHugetlbPages(want);
  EXPECT_EQ(few.code(), Code::kResourceExhausted);
  EXPECT_NE(few.message().find("needs " + std::to_string(free_pages + 1) + " hugetlb pages"), std::string::npos)
      << few.message();
  EXPECT_NE(few.message().find(std::to_string(free_pages) + " are free"), std::string::npos) << few.message();
  EXPECT_NE(few.message().find("vm.nr_hugepages"), std::string::npos) << few.message();

  auto p = daemon::PinnedPool::Create({daemon::PoolPartSpec{-1, want}}, page_, {}, {}, {}, {}, true);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kResourceExhausted) << p.status().ToString();

  auto uneven = daemon::PinnedPool::Create({daemon::PoolPartSpec{-1, page_}}, page_ / 2, {}, {}, {}, {}, true);
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(uneven.status().message().find("must be a multiple of the huge page size"), std::string::npos)
      << uneven.status().ToString();

  daemon::DaemonConfig c = DaemonHarness::SmallConfig();
  c.pool_pages = daemon::PoolPages::kHugetlb;
  c.slab_bytes = page_;
  c.pool_bytes = want;
  c.runtime_dir = MakeTempDir("hugetlb");
  auto checked = daemon::Preflight(c);
  ASSERT_FALSE(checked.ok()) << "ferryd --check-config must say the pages are missing";
  EXPECT_NE(checked.status().message().find("pool.huge_pages: hugetlb"), std::string::npos) << checked.status().ToString();
  std::filesystem::remove_all(c.runtime_dir);
}

// Through ferryd: a client's copies both ways through a hugetlb pool, random data, poisoned
// destinations, every byte checked.
TEST_F(Hugetlb, ClientsCopyThroughAHugetlbPool) {
  const uint64_t pool_bytes = 8 * page_;
  if (!Reserve(pool_bytes / page_)) GTEST_SKIP() << "cannot reserve hugetlb pages here (needs root)";
  daemon::DaemonConfig c = DaemonHarness::SmallConfig();
  c.pool_pages = daemon::PoolPages::kHugetlb;
  c.slab_bytes = page_;
  c.pool_bytes = pool_bytes;
  DaemonHarness d(c);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect("hugetlb"));
  const size_t bytes = 3 * page_ + 12345;
  ASSERT_OK_AND_ASSIGN(HostBuffer host, client->AllocateHost(bytes));
  auto dev_or = client->AllocateDevice(bytes);
  ASSERT_TRUE(dev_or.ok()) << dev_or.status().ToString();
  auto& dev = *dev_or;
  ASSERT_OK_AND_ASSIGN(DeviceRegion region, client->RegisterDevice(dev.data(), bytes));
  std::mt19937 rng(5);
  std::vector<std::byte> want(bytes);
  for (int round = 0; round < 3; ++round) {
    for (auto& b : want) b = static_cast<std::byte>(rng());
    std::memcpy(host.data(), want.data(), bytes);
    std::memset(dev.data(), 0xA5, bytes);
    ASSERT_OK_AND_ASSIGN(Transfer up, client->Copy(Direction::kHostToDevice, host, 0, region, 0, bytes));
    ASSERT_OK(up.Wait(std::chrono::seconds(10)));
    ASSERT_EQ(std::memcmp(dev.data(), want.data(), bytes), 0) << "round " << round << " to the device";
    std::memset(host.data(), 0x5A, bytes);
    ASSERT_OK_AND_ASSIGN(Transfer down, client->Copy(Direction::kDeviceToHost, host, 0, region, 0, bytes));
    ASSERT_OK(down.Wait(std::chrono::seconds(10)));
    ASSERT_EQ(std::memcmp(host.data(), want.data(), bytes), 0) << "round " << round << " back to the host";
  }
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return d.counters().pool_huge_page_bytes.load() == pool_bytes; }, 5000))
      << d.counters().pool_huge_page_bytes.load();
}

}  // namespace
}  // namespace ferry::testing
