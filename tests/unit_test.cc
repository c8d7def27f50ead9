// Unit tests: Status, sizes, config validation, the pinned pool's arenas, the control channel.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <regex>
#include <stdexcept>
#include <thread>

#include "client/streaming_copy.hpp"
#include "common/byte_size.hpp"
#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/signed_records.hpp"
#include "common/signing.hpp"
#include "common/yaml_util.hpp"
#include "daemon/config.hpp"
#include "daemon/pinned_pool.hpp"
#include "daemon/policy_loader.hpp"
#include "daemon/poll_window.hpp"
#include "daemon/staged_copies.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using daemon::ParseConfig;

TEST(Status, CarriesCodeAndMessage) {
  Status s = ResourceExhausted("pool full");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_EQ(s.ToString(), "ResourceExhausted: pool full");
  EXPECT_EQ(s.WithContext("alloc").message(), "alloc: pool full");
  EXPECT_TRUE(Status::Ok().ok());
  Result<int> r = InvalidArgument("no");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  Result<int> v = 7;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7);
}

TEST(Sizes, ParseUnitsAndRejectGarbage) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64MiB"), 64ull << 20);
  EXPECT_EQ(*ParseByteSize("1 GiB"), 1ull << 30);
  EXPECT_EQ(*ParseByteSize("2MB"), 2000000u);
  EXPECT_FALSE(ParseByteSize("MiB").ok());
  EXPECT_FALSE(ParseByteSize("12 parsecs").ok());
  EXPECT_FALSE(ParseByteSize("99999999999999999999").ok());
  EXPECT_FALSE(ParseByteSize("17179869184TiB").ok());
}

TEST(Config, DefaultsAndOverrides) {
  auto c = ParseConfig("backend: host\npool:\n  size: 64MiB\n  slab: 1MiB\npolicy: /etc/ferry/p.yaml\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->backend, daemon::BackendChoice::kHost);
  EXPECT_EQ(c->pool_bytes, 64ull << 20);
  EXPECT_EQ(c->slab_bytes, 1ull << 20);
  EXPECT_EQ(c->policy_path, "/etc/ferry/p.yaml");
  EXPECT_EQ(c->socket_name, "ferryd.sock");
}

TEST(Config, ShippedFileIsValid) {
  auto c = daemon::LoadConfig(FERRY_SOURCE_DIR "/config/ferryd.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->backend, daemon::BackendChoice::kAuto);
  // The file says its values are the defaults.
  const daemon::DaemonConfig defaults;
  EXPECT_EQ(c->spin_us, defaults.spin_us);
  EXPECT_EQ(c->spin_max_us, defaults.spin_max_us);
  EXPECT_EQ(c->pool_bytes, defaults.pool_bytes);
  EXPECT_EQ(c->ring_entries, defaults.ring_entries);
  EXPECT_EQ(c->pool_registration, defaults.pool_registration);
  EXPECT_EQ(c->issue_threads, defaults.issue_threads);
  const daemon::Limits& l = c->limits;
  const daemon::Limits& d = defaults.limits;
  EXPECT_EQ(l.sessions_per_uid, d.sessions_per_uid);
  EXPECT_EQ(l.pool_bytes_per_uid, d.pool_bytes_per_uid);
  EXPECT_EQ(l.regions_per_session, d.regions_per_session);
  EXPECT_EQ(l.regions_per_uid, d.regions_per_uid);
  EXPECT_EQ(l.events_per_session, d.events_per_session);
  EXPECT_EQ(l.pending_connections, d.pending_connections);
  EXPECT_EQ(l.pending_connections_per_uid, d.pending_connections_per_uid);
  EXPECT_EQ(l.hello_timeout_ms, d.hello_timeout_ms);
  EXPECT_EQ(l.outbound_messages, d.outbound_messages);
}

// pool.register: auto pins slab by slab exactly when other users may connect.
TEST(Config, PoolRegistrationFollowsWhoMayConnectUnlessSet) {
  auto c = ParseConfig("pool:\n  register: auto\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(daemon::RegistersSlabBySlab(*c));
  c->allowed_group = "ferry";
  EXPECT_TRUE(daemon::RegistersSlabBySlab(*c));
  c->pool_registration = daemon::PoolRegistration::kWhole;
  EXPECT_FALSE(daemon::RegistersSlabBySlab(*c));
  c->allowed_group.clear();
  c->pool_registration = daemon::PoolRegistration::kPerSlab;
  EXPECT_TRUE(daemon::RegistersSlabBySlab(*c));
  auto bad = ParseConfig("pool:\n  register: sometimes\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("t.yaml:2:13: pool.register 'sometimes' unknown"), std::string::npos)
      << bad.status().message();
}

// handoff: where copies ordered after a client's event are handed off; gpu unless set.
TEST(Config, HandoffIsOnTheGpuUnlessSetToTheHost) {
  auto c = ParseConfig("spin_us: 200\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->handoff_on_gpu);
  c = ParseConfig("handoff: host\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->handoff_on_gpu);
  auto bad = ParseConfig("handoff: sometimes\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("t.yaml:1:10: handoff 'sometimes' unknown (expected gpu or host)"),
            std::string::npos)
      << bad.status().message();
}

// issue_threads: the threads that issue a batch of small host-to-device copies in parts; 4
// unless set, 1 to 16.
TEST(Config, IssueThreadsAreFourUnlessSetWithinOneToSixteen) {
  auto c = ParseConfig("spin_us: 200\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->issue_threads, 4u);
  c = ParseConfig("issue_threads: 1\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->issue_threads, 1u);
  c = ParseConfig("issue_threads: 16\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->issue_threads, 16u);
  for (const char* bad : {"issue_threads: 0\n", "issue_threads: 17\n", "issue_threads: many\n"}) {
    auto b = ParseConfig(bad, "t.yaml");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("t.yaml:1:16"), std::string::npos) << b.status().message();
  }
}

// host.copy_rate and host.slow, the host backend's simulated link (a test tool): the rate, the
// settings a slowed policy has, and the factor its copies take; a policy matches only with every
// setting named.
TEST(Config, HostLinkSlowsThePoliciesWithTheNamedSettings) {
  auto c = ParseConfig(
      "host: {copy_rate: 16MiB, slow: {when: {streams.bulk_priority: least, schedule.kind: chunked}, factor: 1.5}}\n",
      "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const daemon::HostLink& link = c->host_link;
  EXPECT_EQ(link.bytes_per_second, 16ull << 20);
  daemon::Policy least, greatest, geometric;
  greatest.bulk_priority = daemon::StreamPriority::kGreatest;
  geometric.schedule = daemon::Schedule::kGeometric;
  EXPECT_EQ(link.FactorFor(&least), 1.5);
  EXPECT_EQ(link.FactorFor(&greatest), 1.0);
  EXPECT_EQ(link.FactorFor(&geometric), 1.0);
  EXPECT_EQ(link.FactorFor(nullptr), 1.0);
  EXPECT_EQ(link.Duration(16ull << 20, 1.0), std::chrono::seconds(1));
  EXPECT_EQ(link.Duration(16ull << 20, 1.5), std::chrono::milliseconds(1500));
  auto plain = ParseConfig("host: {gpus: 1}\n", "t.yaml");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->host_link.paced());
  EXPECT_EQ(plain->host_link.Duration(1 << 20, 1.0), std::chrono::nanoseconds(0));
}

struct BadConfig {
  const char* text;
  const char* message;  // must appear in the error
};

class ConfigErrors : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ConfigErrors, SayWhereAndWhat) {
  auto c = ParseConfig(GetParam().text, "bad.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find(GetParam().message), std::string::npos) << c.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    All, ConfigErrors,
    ::testing::Values(BadConfig{"bakend: host\n", "bad.yaml:1:1: unknown key 'bakend'"},
                      BadConfig{"host: {slow: {when: {streams.bulk_priority: least}, factor: 1.2}}\n",
                                "host.slow needs host.copy_rate"},
                      BadConfig{"host: {copy_rate: 16MiB, slow: {when: {streams.priority: least}, factor: 1.2}}\n",
                                "'streams.priority' is not a policy setting (one of: "},
                      BadConfig{"host: {copy_rate: 16MiB, slow: {when: {streams.bulk_priority: least}}}\n",
                                "host.slow needs a factor"},
                      BadConfig{"host: {copy_rate: 16MiB, slow: {factor: 1.2}}\n", "host.slow.when takes policy settings"},
                      BadConfig{"backend: gpu\n", "bad.yaml:1:10: backend 'gpu' unknown"},
                      BadConfig{"pool:\n  size: lots\n", "bad.yaml:2:9: expected a size"},
                      BadConfig{"pool:\n  size: 64MiB\n  slab: 3MiB\n", "power of two"},
                      BadConfig{"pool:\n  size: 10MiB\n  slab: 4MiB\n", "multiple of pool.slab"},
                      BadConfig{"ring_entries: 100\n", "ring_entries must be a power of two"},
                      BadConfig{"pool:\n  size: 64MiB\n  slab: 4MiB\nlimits:\n  pool_per_uid: 1MiB\n",
                                "limits.pool_per_uid (1048576 bytes) is smaller than one pool.slab"},
                      BadConfig{"max_sessions: 0\n", "bad.yaml:1:15: value 0 out of range [1, 4096]"},
                      BadConfig{"runtime_dir: relative/dir\n", "absolute path"},
                      BadConfig{"spin_us: 500\nspin_max_us: 100\n",
                                "spin_max_us (100) must be 0 or at least spin_us (500)"},
                      BadConfig{"pool: [1, 2\n", "bad.yaml:"},
                      BadConfig{"a: {b: {c: {d: {e: {f: {g: {h: {i: 1}}}}}}}}\n", "nested deeper"}),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return "case" + std::to_string(info.index); });

TEST(Config, HugeFileIsRejected) {
  std::string big(2 << 20, '#');
  auto c = ParseConfig(big, "huge.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("the limit is"), std::string::npos);
}

// A staged copy that the scheduler marks as joining, and that starts where the last one ends
// on both sides, becomes part of it; any other stays a copy of its own.
TEST(StagedCopies, JoinsAMarkedCopyOnlyWhereBothSidesContinueTheLast) {
  std::vector<std::byte> src(1 << 20), dst(1 << 20);
  daemon::StagedCopies st;
  st.Add(dst.data(), src.data(), 4096, true, false);
  st.Add(dst.data() + 4096, src.data() + 4096, 4096, true, true);  // joins
  ASSERT_EQ(st.sizes.size(), 1u);
  EXPECT_EQ(st.sizes[0], 8192u);
  st.Add(dst.data() + 8192, src.data() + 8192, 4096, true, false);    // adjacent, not marked
  st.Add(dst.data() + 16384, src.data() + 12288, 4096, true, true);   // destination has a gap
  st.Add(dst.data() + 20480, src.data() + 20480, 4096, true, true);   // source has a gap
  st.Add(dst.data() + 24576, src.data() + 24576, 4096, false, true);  // not batchable
  st.Add(dst.data() + 28672, src.data() + 28672, 4096, true, true);   // after one not batchable
  EXPECT_EQ(st.sizes, (std::vector<size_t>{8192, 4096, 4096, 4096, 4096, 4096}));
  EXPECT_EQ(st.dsts.back(), dst.data() + 28672);
  EXPECT_EQ(st.srcs.back(), src.data() + 28672);
  EXPECT_EQ(st.batchable, (std::vector<bool>{true, true, true, true, false, true}));
  st.ClearCopies();
  st.Add(dst.data() + 32768, src.data() + 32768, 4096, true, true);  // nothing staged to join
  EXPECT_EQ(st.sizes, (std::vector<size_t>{4096}));
}

// ferryd polls after its last activity for a window that follows the gaps between requests.
TEST(PollWindow, StretchesToBridgeTheGapsClientsLeaveAndShrinksWhenTheyGoQuiet) {
  constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;
  daemon::PollWindow w(200 * kUs, 20 * kMs);
  EXPECT_EQ(w.ns(), 200 * kUs) << "before any gap: spin_us";

  w.OnQuietGap(50 * kUs);  // inside a burst: polling bridged it anyway
  EXPECT_EQ(w.ns(), 200 * kUs);

  w.OnQuietGap(3 * kMs);  // a client copying every 3 ms: poll twice that
  EXPECT_EQ(w.ns(), 6 * kMs);
  w.OnQuietGap(1 * kMs);  // the longest recent gap decides
  EXPECT_EQ(w.ns(), 6 * kMs);
  w.OnQuietGap(15 * kMs);  // twice 15 ms is past the cap
  EXPECT_EQ(w.ns(), 20 * kMs);

  // A gap longer than the cap means the client went quiet: it counts as nothing, and once the
  // bridgeable gaps have aged out, ferryd is back to spin_us.
  for (size_t i = 0; i + 1 < daemon::PollWindow::kRemembered; ++i) {
    w.OnQuietGap(1000 * kMs);
    EXPECT_EQ(w.ns(), 20 * kMs) << "the 15 ms gap is still remembered after " << i + 1 << " quiet ones";
  }
  w.OnQuietGap(1000 * kMs);
  EXPECT_EQ(w.ns(), 200 * kUs);
}

TEST(PollWindow, WithNoMaximumItIsAlwaysSpinUs) {
  daemon::PollWindow w(200'000, 0);
  for (uint64_t gap : {100'000ull, 3'000'000ull, 50'000'000ull}) {
    w.OnQuietGap(gap);
    EXPECT_EQ(w.ns(), 200'000u);
  }
}

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto p = daemon::PinnedPool::Create(8ull << 20, 1ull << 20);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    pool_ = std::move(*p);
  }
  std::unique_ptr<daemon::PinnedPool> pool_;
};

// The pool starts on a 2 MiB boundary and asks for huge pages; how many it got depends on the
// kernel's shmem_enabled setting, and is counted from /proc/self/smaps.
TEST_F(PoolTest, StartsOnAHugePageBoundaryAndCountsTheHugePagesItGot) {
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool_->base()) % (2u << 20), 0u);
  EXPECT_LE(pool_->huge_page_bytes(), pool_->size());
  EXPECT_EQ(pool_->huge_page_bytes() % (2u << 20), 0u);
  const std::string setting = daemon::ShmemHugePageSetting();
  EXPECT_TRUE(setting == "never" || setting == "advise" || setting == "always" || setting == "within_size" ||
              setting == "deny" || setting == "force" || setting == "unknown")
      << setting;
  if (setting == "never" || setting == "deny") {
    EXPECT_EQ(pool_->huge_page_bytes(), 0u);
  }
  std::vector<std::byte> small(4096);
  EXPECT_EQ(daemon::MappedHugePageBytes(small.data(), small.size()), 0u) << "no shared-memory huge page there";
}

// Review of issue 19: an exception while renewing a reclaimed slab ended ferryd (it escaped the
// zeroer thread). The slab now stays out of the pool, broken.
TEST(PoolZeroer, ASlabWhoseRenewalThrowsStaysOutOfThePool) {
  daemon::SlabReclaimHooks hooks;
  hooks.pin = [](std::byte*, uint64_t) -> Status { throw std::runtime_error("backend hook threw"); };
  auto p = daemon::PinnedPool::Create(4ull << 20, 1ull << 20, hooks);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  daemon::PinnedPool& pool = **p;
  auto slab = pool.GrantRun(1, 1, ::getuid());
  ASSERT_TRUE(slab.ok()) << slab.status().ToString();
  pool.Quarantine(*slab);
  EXPECT_EQ(pool.ReclaimQuarantined(), 1ull << 20);
  for (int i = 0; i < 1000 && pool.broken_bytes() == 0; ++i) {
    pool.CollectZeroed();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(pool.broken_bytes(), 1ull << 20);
  EXPECT_EQ(pool.free_bytes(), 3ull << 20);
}

// Review of issue 19: the policy loader caught std::exception only; anything else thrown on its
// worker ended ferryd. It is now the load's error.
// The pool's pages are mapped at start by one thread per usable CPU (each a share of at least
// min_share): every page of the range resident afterwards, whatever the split, and its progress
// reported from nothing to all of it.
TEST(PoolFaultIn, EveryPageIsResidentAfterAParallelFaultIn) {
  const long page = ::sysconf(_SC_PAGESIZE);
  for (uint64_t n : {uint64_t{1} << 20, (uint64_t{24} << 20) + 3 * 4096, uint64_t{64} << 20}) {
    void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(m, MAP_FAILED);
    auto* p = static_cast<std::byte*>(m);
    std::vector<std::pair<uint64_t, uint64_t>> reports;
    const unsigned threads = daemon::FaultInParallel(
        p, n, 4ull << 20, [&](uint64_t faulted, uint64_t total) { reports.emplace_back(faulted, total); },
        std::chrono::milliseconds(1));
    ASSERT_GE(reports.size(), 2u);
    EXPECT_EQ(reports.front(), std::make_pair(uint64_t{0}, n)) << "a report at the start";
    EXPECT_EQ(reports.back(), std::make_pair(n, n)) << "and one at the end";
    for (size_t i = 1; i < reports.size(); ++i) {
      EXPECT_LE(reports[i - 1].first, reports[i].first) << "progress only grows";
      EXPECT_EQ(reports[i].second, n);
    }
    EXPECT_GE(threads, 1u);
    EXPECT_LE(threads, std::max<uint64_t>(1, std::min<uint64_t>(daemon::UsableCpus(), n / (4ull << 20))));
    std::vector<unsigned char> resident((n + page - 1) / page);
    ASSERT_EQ(::mincore(m, n, resident.data()), 0);
    for (size_t i = 0; i < resident.size(); ++i) ASSERT_TRUE(resident[i] & 1) << "page " << i << " of " << n << " bytes";
    ::munmap(m, n);
  }
}

TEST(PolicyLoaderThread, AThrowThatIsNotAStdExceptionBecomesTheLoadsError) {
  auto loader = daemon::PolicyLoader::Create([](const std::string&) { throw 42; });
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  daemon::PolicyLoad load;
  load.path = "/nonexistent/policy.yaml";
  load.name = "policy.yaml";
  ASSERT_TRUE((*loader)->Submit(std::move(load)));
  std::vector<daemon::PolicyLoad> done;
  for (int i = 0; i < 1000 && done.empty(); ++i) {
    done = (*loader)->TakeDone();
    if (done.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), Code::kInternal) << done[0].status.ToString();
  EXPECT_NE(done[0].status.message().find("reading the policy failed"), std::string::npos);
}

TEST_F(PoolTest, SessionsNeverShareASlab) {
  daemon::SessionArena a(*pool_, 1, pool_->size());
  daemon::SessionArena b(*pool_, 2, pool_->size());
  auto x = a.Allocate(1000);
  auto y = b.Allocate(1000);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_NE(x->first_slab, y->first_slab);
  EXPECT_EQ(pool_->owner(x->first_slab), 1u);
  EXPECT_EQ(pool_->owner(y->first_slab), 2u);
  // Small buffers of one session pack into its slab.
  auto x2 = a.Allocate(1000);
  ASSERT_TRUE(x2.ok());
  EXPECT_EQ(x2->first_slab, x->first_slab);
  EXPECT_EQ(pool_->free_bytes(), 6ull << 20);
}

TEST_F(PoolTest, LargeBuffersSpanContiguousSlabs) {
  daemon::SessionArena a(*pool_, 1, pool_->size());
  auto x = a.Allocate(3ull << 20);
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->slab_count, 3u);
  for (uint32_t s = x->first_slab; s < x->first_slab + 3; ++s) EXPECT_EQ(pool_->owner(s), 1u);
}

TEST_F(PoolTest, ABufferOverTheSlabLimitIsRefusedBeforeAnySlabIsGranted) {
  daemon::SessionArena a(*pool_, 1, pool_->size());
  auto over = a.Allocate((3ull << 20) + 1, 3);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), Code::kInvalidArgument);
  EXPECT_NE(over.status().message().find("more than 3 slabs"), std::string::npos) << over.status().ToString();
  EXPECT_EQ(pool_->free_bytes(), pool_->size()) << "a refused buffer took slabs";
  auto fits = a.Allocate(3ull << 20, 3);
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_EQ(fits->slab_count, 3u);
}

// A buffer that fits the limit but lands in a free range straddling one slab more is refused
// too; the range stays the session's for what fits.
TEST_F(PoolTest, ABufferStraddlingOneSlabOverTheLimitIsRefusedAndItsRangeReused) {
  daemon::SessionArena a(*pool_, 1, pool_->size());
  auto whole = a.Allocate(4ull << 20);
  ASSERT_TRUE(whole.ok());
  ASSERT_TRUE(a.Free(whole->pool_offset).ok());
  ASSERT_TRUE(a.Allocate(256).ok());  // the free range now starts 256 bytes into a slab
  auto straddling = a.Allocate(3ull << 20, 3);
  ASSERT_FALSE(straddling.ok());
  EXPECT_EQ(straddling.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(pool_->free_bytes(), pool_->size() - (4ull << 20));
  auto fits = a.Allocate(2ull << 20, 3);
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_EQ(fits->pool_offset, whole->pool_offset + 256);
}

TEST_F(PoolTest, QuotaAndExhaustionAreClearErrors) {
  daemon::SessionArena a(*pool_, 1, 2ull << 20);
  ASSERT_TRUE(a.Allocate(2ull << 20).ok());
  auto over = a.Allocate(1);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), Code::kResourceExhausted);
  EXPECT_NE(over.status().message().find("quota"), std::string::npos);
  daemon::SessionArena b(*pool_, 2, pool_->size());
  auto huge = b.Allocate(7ull << 20);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), Code::kResourceExhausted);
}

TEST_F(PoolTest, ReleasedSlabsAreZeroedAndReturned) {
  uint32_t slab;
  {
    daemon::SessionArena a(*pool_, 1, pool_->size());
    auto x = a.Allocate(4096);
    ASSERT_TRUE(x.ok());
    slab = x->first_slab;
    std::memset(pool_->base() + x->pool_offset, 0x77, 4096);
  }
  // Quarantined first; no description of it is open outside the pool, so it goes to be zeroed.
  EXPECT_EQ(pool_->quarantined_bytes(), pool_->slab_bytes());
  EXPECT_EQ(pool_->ReclaimQuarantined(), pool_->slab_bytes());
  for (int i = 0; i < 1000 && pool_->free_bytes() != pool_->size(); ++i) {
    ASSERT_TRUE(WaitReadable(pool_->zeroed_fd(), 10000).ok());
    pool_->CollectZeroed();
  }
  EXPECT_EQ(pool_->free_bytes(), pool_->size());
  EXPECT_EQ(pool_->owner(slab), 0u);
  const std::byte* p = pool_->base() + slab * pool_->slab_bytes();
  for (size_t i = 0; i < pool_->slab_bytes(); ++i) ASSERT_EQ(p[i], std::byte{0}) << "byte " << i;
}

TEST_F(PoolTest, FindBoundsEveryRangeAndDefersFreeWhileInFlight) {
  daemon::SessionArena a(*pool_, 1, pool_->size());
  auto x = a.Allocate(4096);
  ASSERT_TRUE(x.ok());
  uint64_t off = 0;
  EXPECT_NE(a.Find(x->pool_offset, 4096, &off), nullptr);
  EXPECT_EQ(a.Find(x->pool_offset + 1, 4096, &off), nullptr);       // runs past the end
  EXPECT_EQ(a.Find(x->pool_offset, UINT64_MAX, &off), nullptr);     // overflow
  EXPECT_EQ(a.Find(x->pool_offset + 4096, 1, &off), nullptr);       // not allocated
  EXPECT_EQ(a.Find(UINT64_MAX, 1, &off), nullptr);
  daemon::BufferInfo* b = a.Find(x->pool_offset, 16, &off);
  ASSERT_NE(b, nullptr);
  b->in_flight = 1;
  ASSERT_TRUE(a.Free(x->pool_offset).ok());
  EXPECT_EQ(a.Find(x->pool_offset, 16, &off), nullptr);  // freeing: no new copies
  EXPECT_EQ(a.buffer_count(), 1u);
  a.CopyDone(x->pool_offset);
  EXPECT_EQ(a.buffer_count(), 0u);
  EXPECT_EQ(a.Free(x->pool_offset).code(), Code::kNotFound);
}

TEST(Channel, CarriesMessagesAndFds) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto mem = CreateSealedMemfd("t", 4096);
  ASSERT_TRUE(mem.ok());
  wire::AllocBufferRequest req{12345};
  int fd = mem->get();
  ASSERT_OK(Send(a.get(), wire::MsgType::kAllocBuffer, 9, req, &fd, 1));
  auto m = RecvMessage(b.get(), 1000);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->type(), wire::MsgType::kAllocBuffer);
  EXPECT_EQ(m->header.seq, 9u);
  EXPECT_EQ(m->As<wire::AllocBufferRequest>().size, 12345u);
  ASSERT_EQ(m->fds.size(), 1u);
  EXPECT_TRUE(CheckSealedMemfd(m->fds[0].get(), 4096).ok());
}

TEST(Channel, RejectsBadMagicVersionTypeAndLength) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto send_raw = [&](wire::MsgHeader h, size_t payload) {
    std::vector<char> buf(sizeof h + payload, 0);
    std::memcpy(buf.data(), &h, sizeof h);
    ASSERT_EQ(::send(a.get(), buf.data(), buf.size(), 0), static_cast<ssize_t>(buf.size()));
  };
  const size_t n = sizeof(wire::AllocBufferRequest);
  send_raw({0xdeadbeef, wire::kVersion, 3, static_cast<uint32_t>(n), 1}, n);
  EXPECT_NE(RecvMessage(b.get(), 1000).status().message().find("bad magic"), std::string::npos);
  send_raw({wire::kMagic, 99, 3, static_cast<uint32_t>(n), 1}, n);
  EXPECT_NE(RecvMessage(b.get(), 1000).status().message().find("protocol version 99"), std::string::npos);
  send_raw({wire::kMagic, wire::kVersion, 999, static_cast<uint32_t>(n), 1}, n);
  EXPECT_NE(RecvMessage(b.get(), 1000).status().message().find("unknown control message type"), std::string::npos);
  send_raw({wire::kMagic, wire::kVersion, 3, static_cast<uint32_t>(n), 1}, n - 1);
  EXPECT_EQ(RecvMessage(b.get(), 1000).status().code(), Code::kProtocol);
  send_raw({wire::kMagic, wire::kVersion, 3, 4, 1}, 4);
  EXPECT_EQ(RecvMessage(b.get(), 1000).status().code(), Code::kProtocol);
}

TEST(Memfd, PeerMustSealIt) {
  UniqueFd unsealed(::memfd_create("u", MFD_CLOEXEC));
  ASSERT_TRUE(unsealed.valid());
  ASSERT_EQ(::ftruncate(unsealed.get(), 4096), 0);
  EXPECT_FALSE(CheckSealedMemfd(unsealed.get(), 4096).ok());
  auto sealed = CreateSealedMemfd("s", 4096);
  ASSERT_TRUE(sealed.ok());
  EXPECT_TRUE(CheckSealedMemfd(sealed->get(), 4096).ok());
  EXPECT_FALSE(CheckSealedMemfd(sealed->get(), 8192).ok());  // smaller than claimed
  EXPECT_NE(::ftruncate(sealed->get(), 0), 0);                // cannot be shrunk under us
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

TEST(Signing, SignVerifyAndEveryTamperFails) {
  const std::string dir = testing::MakeTempDir("keys");
  ASSERT_OK_AND_ASSIGN(signing::KeyId id, signing::GenerateKeyFiles(dir, "k"));
  signing::SecretKey sk;
  ASSERT_OK(signing::LoadSecretKey(dir + "/k.key", sk));
  ASSERT_OK_AND_ASSIGN(signing::PublicKey pk, signing::LoadPublicKey(dir + "/k.pub"));
  EXPECT_EQ(pk.id, id);
  const std::string data = "{\"seq\": 1}\n";
  ASSERT_OK_AND_ASSIGN(std::string sig, signing::Sign(sk, data, "ferry snapshot X seq 1", "u"));
  ASSERT_OK_AND_ASSIGN(std::string trusted, signing::Verify(pk, data, sig));
  EXPECT_EQ(trusted, "ferry snapshot X seq 1");
  EXPECT_FALSE(signing::Verify(pk, "{\"seq\": 2}\n", sig).ok());
  std::string tampered = sig;
  tampered.replace(tampered.find("seq 1"), 5, "seq 2");
  EXPECT_EQ(signing::Verify(pk, data, tampered).status().code(), Code::kPermissionDenied);
  ASSERT_OK(signing::GenerateKeyFiles(dir, "other").status());
  ASSERT_OK_AND_ASSIGN(signing::PublicKey other, signing::LoadPublicKey(dir + "/other.pub"));
  EXPECT_FALSE(signing::Verify(other, data, sig).ok());
  EXPECT_FALSE(signing::GenerateKeyFiles(dir, "k").ok()) << "never overwrite a key";
  ::chmod((dir + "/k.key").c_str(), 0644);
  signing::SecretKey again;
  EXPECT_EQ(signing::LoadSecretKey(dir + "/k.key", again).code(), Code::kPermissionDenied);
  std::filesystem::remove_all(dir);
}

TEST(Signing, RecordIdsLookLikeTheirFormatAndFollowTheContent) {
  const std::string a = signing::RecordId("a"), b = signing::RecordId("b");
  EXPECT_TRUE(std::regex_match(a, std::regex("FRY(-[0-9A-HJKMNP-TV-Z]{5}){4}"))) << a;
  EXPECT_NE(a, b);
  EXPECT_EQ(a, signing::RecordId("a"));
}

// What every reader of a signed record believes: the trusted comment exactly as ferry writes it,
// naming the record's own id; and which files in a directory are snapshots.
TEST(SignedRecords, ATrustedCommentIsBelievedOnlyExactlyAsWrittenAndNamingThisRecord) {
  const std::string dir = testing::MakeTempDir("signed");
  ASSERT_OK(signing::GenerateKeyFiles(dir, "k").status());
  signing::SecretKey sk;
  ASSERT_OK(signing::LoadSecretKey(dir + "/k.key", sk));
  const signing::PublicKey pk = signing::PublicKeyOf(sk);
  const std::string record = "{\"seq\": 7}\n", id = signing::RecordId(record);
  auto signed_as = [&](const std::string& trusted) {
    auto sig = signing::Sign(sk, record, trusted, "u");
    EXPECT_TRUE(sig.ok());
    return signing::VerifyRecord(pk, record, sig.ok() ? *sig : "");
  };
  ASSERT_OK_AND_ASSIGN(signing::SignedIdentity snap, signed_as(signing::SnapshotTrustedComment(id, 7)));
  EXPECT_FALSE(snap.is_report);
  EXPECT_EQ(snap.id, id);
  EXPECT_EQ(snap.seq, 7u);
  ASSERT_OK_AND_ASSIGN(signing::SignedIdentity report, signed_as(signing::ReportTrustedComment("tune", id)));
  EXPECT_TRUE(report.is_report);
  EXPECT_EQ(report.report_kind, "tune");
  EXPECT_EQ(report.id, id);
  for (const std::string& bad : {"ferry snapshot " + id + " seq 7 extra", "ferry snapshot " + id + " seq +7",
                                 "ferry snapshot " + id + "  seq 7", "ferry report tune " + id + " x",
                                 " ferry report tune " + id, std::string("ferry snapshot seq 7"), std::string("x")}) {
    auto v = signed_as(bad);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_NE(v.status().message().find("not a ferry record's"), std::string::npos) << v.status().message();
  }
  auto other = signed_as(signing::SnapshotTrustedComment(signing::RecordId("another record"), 7));
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("does not match the record's hash"), std::string::npos);

  for (const char* name : {"snapshot-000002.json", "snapshot-1000000.json", "snapshot-000010.json",
                           "snapshot-1.json", "snapshot-000003.json.tmp", "snapshot-000004.jsonx",
                           "snapshot-000005.json.minisig", "snapshot-x.json", "report.json"}) {
    ASSERT_OK(WriteFileAtomically(dir + "/" + name, "x"));
  }
  ASSERT_OK_AND_ASSIGN(signing::SnapshotListing listed, signing::ListSnapshots(dir));
  std::vector<std::pair<uint64_t, std::string>> want = {
      {2, "snapshot-000002.json"}, {10, "snapshot-000010.json"}, {1000000, "snapshot-1000000.json"}};
  EXPECT_EQ(listed.snapshots, want);
  EXPECT_EQ(listed.strays, (std::vector<std::string>{"snapshot-1.json", "snapshot-x.json"}));
  EXPECT_FALSE(signing::ListSnapshots(dir + "/none").ok());

  auto unsigned_file = signing::ReadSignedFile(dir + "/report.json", 1 << 20);
  ASSERT_FALSE(unsigned_file.ok());
  EXPECT_NE(unsigned_file.status().message().find("no signature beside the record"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Files, AnAtomicWriteReplacesTheWholeFileAndLeavesNothingBehindWhenItCannot) {
  const std::string dir = testing::MakeTempDir("atomic");
  const std::string path = dir + "/f";
  ASSERT_OK(WriteFileAtomically(path, "first version"));
  ASSERT_OK(WriteFileAtomically(path, "second"));
  ASSERT_OK_AND_ASSIGN(std::string text, ReadWholeFile(path, 1024));
  EXPECT_EQ(text, "second");
  EXPECT_FALSE(ReadWholeFile(path, 3).ok()) << "longer than allowed";
  struct stat st{};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_EQ(::symlink(path.c_str(), (dir + "/link").c_str()), 0);
  EXPECT_TRUE(ReadWholeFile(dir + "/link", 1024).ok()) << "a symlink followed";
  EXPECT_FALSE(ReadWholeFile(dir + "/link", 1024, false).ok()) << "a symlink refused";
  // A FIFO where a file should be: refused at once, not waited on.
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  auto fifo = ReadWholeFile(dir + "/fifo", 1024);
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("fifo is a FIFO, not a regular file"), std::string::npos) << fifo.status().ToString();
  // Links planted where a temporary file might go are never written through.
  for (const char* planted : {"/g.tmp", "/g.tmp.XXXXXX"}) ASSERT_EQ(::symlink(path.c_str(), (dir + planted).c_str()), 0);
  ASSERT_OK(WriteFileAtomically(dir + "/g", "new"));
  ASSERT_OK_AND_ASSIGN(text, ReadWholeFile(path, 1024));
  EXPECT_EQ(text, "second");
  ASSERT_OK_AND_ASSIGN(text, ReadWholeFile(dir + "/g", 1024, false));
  EXPECT_EQ(text, "new");
  // A rename that cannot happen (onto a directory) leaves no temporary file.
  ASSERT_EQ(::mkdir((dir + "/d").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir + "/d/sub").c_str(), 0755), 0);
  EXPECT_FALSE(WriteFileAtomically(dir + "/d", "x").ok());
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_NE(e.path().filename().string().rfind("d.tmp", 0), 0u) << e.path();
  }
  // In place, for outputs a user names: through a link, an existing file keeping its mode.
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  ASSERT_OK(WriteWholeFile(dir + "/link", "third"));
  ASSERT_OK_AND_ASSIGN(text, ReadWholeFile(path, 1024));
  EXPECT_EQ(text, "third");
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  std::filesystem::remove_all(dir);
}

// The staged path's copy: every byte lands, at sizes around the streaming threshold and the
// vector widths, from and to every misalignment, and nothing outside the range is touched.
TEST(StreamingCopy, TheStagedPathsCopyIsChosenByDirectionFromTheEnvironment) {
  using detail::StagedCopyModeFrom;
  EXPECT_TRUE(StagedCopyModeFrom(nullptr).streaming_in) << "unset: streaming both ways";
  EXPECT_TRUE(StagedCopyModeFrom(nullptr).streaming_out);
  EXPECT_FALSE(StagedCopyModeFrom("memcpy").streaming_in);
  EXPECT_FALSE(StagedCopyModeFrom("memcpy").streaming_out);
  EXPECT_TRUE(StagedCopyModeFrom("streaming").streaming_in);
  EXPECT_TRUE(StagedCopyModeFrom("streaming").streaming_out);
  EXPECT_FALSE(StagedCopyModeFrom("streaming-out").streaming_in);
  EXPECT_TRUE(StagedCopyModeFrom("streaming-out").streaming_out);
  EXPECT_TRUE(StagedCopyModeFrom("fast please").streaming_in) << "unknown: the default";
}

TEST(StreamingCopy, EveryByteArrivesAtAwkwardSizesAndAlignmentsAndNothingElseIsWritten) {
  constexpr size_t kGuard = 256;
  std::vector<std::byte> src((1 << 20) + 4 * kGuard), dst(src.size());
  testing::FillRandom(src.data(), src.size(), 77);
  for (size_t n : {size_t{1}, size_t{63}, size_t{65536} - 1, size_t{65536}, size_t{65536} + 127, size_t{200003},
                   size_t{1} << 20}) {
    for (size_t src_off : {0, 1, 33}) {
      for (size_t dst_off : {0, 7, 64}) {
        std::memset(dst.data(), 0xA5, dst.size());
        detail::StreamingCopy(dst.data() + kGuard + dst_off, src.data() + kGuard + src_off, n);
        ASSERT_EQ(std::memcmp(dst.data() + kGuard + dst_off, src.data() + kGuard + src_off, n), 0)
            << n << " bytes, source +" << src_off << ", destination +" << dst_off;
        for (size_t i = 0; i < kGuard + dst_off; ++i) ASSERT_EQ(dst[i], std::byte{0xA5}) << "written before the range";
        for (size_t i = kGuard + dst_off + n; i < dst.size(); ++i)
          ASSERT_EQ(dst[i], std::byte{0xA5}) << "written after it";
      }
    }
  }
}

}  // namespace
}  // namespace ferry
