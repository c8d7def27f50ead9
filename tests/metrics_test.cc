// The metrics exporter in-process: what it counts, and that it binds in a binary that also maps
// Boost.Interprocess regions: the first design notes suspected them of the "null context"
// failure (docs/design.md, "Known hazards"); the cause is static thread-local storage instead
// (metrics_tls_test.cc).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <boost/interprocess/anonymous_shared_memory.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <regex>

#include "daemon/metrics.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
namespace bip = boost::interprocess;

using testing::Scrape;

double Sample(const std::string& scrape, const std::string& series) {
  std::regex re("\n" + std::regex_replace(series, std::regex(R"([{}()\[\].+*?^$|\\])"), R"(\$&)") + " ([0-9.e+-]+)");
  std::smatch m;
  if (!std::regex_search(scrape, m, re)) return -1;
  return std::stod(m[1]);
}

daemon::MetricsInfo Info() { return {"test", {"host", 0, "host", "", 0, 0, "", -1, ""}, {}}; }

TEST(Metrics, TheExporterBindsInABinaryThatMapsBoostInterprocessRegions) {
  // A region mapped before the exporter starts, one mapped while it runs, and a named segment.
  bip::mapped_region before = bip::anonymous_shared_memory(1 << 20);
  bip::shared_memory_object::remove("ferry-metrics-test");
  bip::shared_memory_object shm(bip::create_only, "ferry-metrics-test", bip::read_write, bip::permissions(0600));
  shm.truncate(1 << 20);
  bip::mapped_region named(shm, bip::read_write);
  auto m = daemon::MetricsExporter::Create("127.0.0.1:0", Info());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  bip::mapped_region after = bip::anonymous_shared_memory(1 << 20);
  EXPECT_GT((*m)->port(), 0);
  EXPECT_NE(Scrape((*m)->port()).find("ferry_build_info"), std::string::npos);
  bip::shared_memory_object::remove("ferry-metrics-test");
}

TEST(Metrics, ABusyAddressIsAClearError) {
  auto first = daemon::MetricsExporter::Create("127.0.0.1:0", Info());
  ASSERT_TRUE(first.ok());
  auto second = daemon::MetricsExporter::Create("127.0.0.1:" + std::to_string((*first)->port()), Info());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kUnavailable);
  EXPECT_NE(second.status().message().find("cannot serve metrics on 127.0.0.1:"), std::string::npos)
      << second.status().message();
}

// Block lists: each one is counted once by direction and result, its blocks when it succeeded;
// a single copy (no blocks) counts in neither.
TEST(Metrics, CountsBlockListsAndTheirBlocks) {
  auto m = daemon::MetricsExporter::Create("127.0.0.1:0", Info());
  ASSERT_TRUE(m.ok());
  using daemon::Direction;
  (*m)->OnCopyDone({0, Direction::kHostToDevice, false, "default", "p", 10 * 4096, 10, 0, 0.001, true});
  (*m)->OnCopyDone({0, Direction::kHostToDevice, false, "default", "p", 20 * 4096, 20, 0, 0.001, true});
  (*m)->OnCopyDone({0, Direction::kDeviceToHost, false, "default", "p", 0, 5, 0, 0.001, false});
  (*m)->OnCopyDone({0, Direction::kDeviceToHost, false, "default", "p", 4096, 0, 0, 0.001, true});
  std::string s;
  ASSERT_TRUE(testing::DaemonHarness::Eventually([&] {
    s = Scrape((*m)->port());
    // Every family read after the last event was applied (a scrape reads family after family).
    return Sample(s, R"(ferry_copies_total{class="default",direction="d2h",policy="p",result="ok"})") == 1 &&
           Sample(s, R"(ferry_block_lists_total{direction="d2h",result="failed"})") == 1 &&
           Sample(s, R"(ferry_blocks_total{direction="h2d"})") == 30;
  }, 10000)) << s;
  EXPECT_EQ(Sample(s, R"(ferry_block_lists_total{direction="h2d",result="ok"})"), 2);
  EXPECT_EQ(Sample(s, R"(ferry_block_lists_total{direction="d2h",result="failed"})"), 1);
  EXPECT_EQ(Sample(s, R"(ferry_block_lists_total{direction="d2h",result="ok"})"), -1) << "a single copy is no list";
  EXPECT_EQ(Sample(s, R"(ferry_blocks_total{direction="h2d"})"), 30);
  EXPECT_EQ(Sample(s, R"(ferry_blocks_total{direction="d2h"})"), -1) << "a failed list's blocks were not copied";
}

TEST(Metrics, CountsWhatTheDaemonDid) {
  auto m = daemon::MetricsExporter::Create("127.0.0.1:0", Info());
  ASSERT_TRUE(m.ok());
  testing::DaemonHarness d(testing::DaemonHarness::SmallConfig(), nullptr, testing::DaemonHarness::SmallChunks(),
                           m->get());
  (*m)->Attach(&d.server());
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect("metrics"));
  ASSERT_OK_AND_ASSIGN(testing::CopyTarget target, testing::MakeCopyTarget(*client, 1 << 20));
  auto& [host, dev, region] = target;
  testing::FillRandom(host.data(), host.size(), 7);
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK_AND_ASSIGN(Transfer t, client->Copy(Direction::kHostToDevice, host, 0, region, 0, 1 << 20));
    ASSERT_OK(t.Wait(5s));
  }
  ASSERT_OK_AND_ASSIGN(Transfer t, client->Copy(Direction::kDeviceToHost, host, 0, region, 0, 4096));
  ASSERT_OK(t.Wait(5s));
  EXPECT_FALSE(client->AllocateHost(1ull << 40).ok());  // refused: larger than the pool
  std::string s;
  // The exporter applies events in order on its own thread every 50 ms, and a scrape reads one
  // family after another: wait for a scrape in which every family shows the last copy (d2h).
  ASSERT_TRUE(testing::DaemonHarness::Eventually([&] {
    s = Scrape((*m)->port());
    return Sample(s, R"(ferry_exposed_seconds_count{class="default",direction="d2h",policy="test-chunked"})") == 1 &&
           Sample(s, R"(ferry_copied_bytes_total{direction="d2h"})") == 4096 &&
           Sample(s, R"(ferry_copy_duration_seconds_count{class="default",direction="d2h"})") == 1 &&
           Sample(s, R"(ferry_copies_total{class="default",direction="d2h",policy="test-chunked",result="ok"})") == 1;
  }, 10000)) << s;
  EXPECT_EQ(Sample(s, R"(ferry_copies_total{class="default",direction="h2d",policy="test-chunked",result="ok"})"), 5);
  EXPECT_EQ(Sample(s, R"(ferry_copied_bytes_total{direction="h2d"})"), 5 << 20);
  EXPECT_EQ(Sample(s, R"(ferry_copied_bytes_total{direction="d2h"})"), 4096);
  EXPECT_EQ(Sample(s, R"(ferry_exposed_seconds_count{class="default",direction="h2d",policy="test-chunked"})"), 5);
  EXPECT_EQ(Sample(s, R"(ferry_copy_duration_seconds_count{class="default",direction="h2d"})"), 5);
  EXPECT_EQ(Sample(s, R"(ferry_rejected_total{reason="exhausted"})"), 1);
  EXPECT_EQ(Sample(s, "ferry_clients"), 1);
  EXPECT_EQ(Sample(s, R"(ferry_pool_bytes{state="used"})"), 1 << 20) << "one 1 MiB slab: the host buffer";
  EXPECT_EQ(Sample(s, R"(ferry_policy_info{hash=")" + d.server().policy()->Hash() + R"(",policy="test-chunked"})"), 1);
  EXPECT_EQ(s.find("pid="), std::string::npos) << "no per-process labels";
  (*m)->Attach(nullptr);
}

}  // namespace
}  // namespace ferry
