// The small shared helpers in common/: JSON text, ISO times, byte sizes, backend names, the
// command-line argument walker.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/backend_name.hpp"
#include "common/byte_size.hpp"
#include "common/cli.hpp"
#include "common/json.hpp"
#include "common/process.hpp"
#include "common/time_format.hpp"
#include "common/wire.hpp"
#include "ferry/client.hpp"

namespace ferry {
namespace {

TEST(Json, StringEscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(json::String("plain"), "\"plain\"");
  EXPECT_EQ(json::String("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(json::String(std::string("\n\t\x01", 3)), "\"\\u000a\\u0009\\u0001\"");
  EXPECT_EQ(json::String(std::string("\0", 1)), "\"\\u0000\"");
  EXPECT_EQ(json::String("h\xc3\xa9"), "\"h\xc3\xa9\"");  // UTF-8 passes through
}

TEST(Json, NumberIsNullForNanAndInfinity) {
  EXPECT_EQ(json::Number(0.5), "0.5");
  EXPECT_EQ(json::Number(1.0 / 3), "0.333333333");
  EXPECT_EQ(json::Number(std::nan("")), "null");
  EXPECT_EQ(json::Number(HUGE_VAL), "null");
}

TEST(TimeFormat, IsoTimeUtcInSecondsAndMilliseconds) {
  // 2026-12-02T19:24:18.123Z
  const auto t = std::chrono::system_clock::time_point(std::chrono::milliseconds(1796239458123LL));
  EXPECT_EQ(IsoTimeUtc(t), "2026-12-02T19:24:18Z");
  EXPECT_EQ(IsoTimeUtc(t, IsoPrecision::kMilliseconds), "2026-12-02T19:24:18.123Z");
  EXPECT_EQ(IsoTimeUtcNow().size(), 20u);
}

TEST(ByteSize, ParsesUnitsAndRefusesNonsense) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64MiB"), 64ull << 20);
  EXPECT_EQ(*ParseByteSize("1 GiB"), 1ull << 30);
  EXPECT_EQ(*ParseByteSize("2MB"), 2000000u);
  EXPECT_EQ(*ParseByteSize("3KiB"), 3072u);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("MiB").ok());
  EXPECT_FALSE(ParseByteSize("12 parsecs").ok());
  EXPECT_FALSE(ParseByteSize("99999999999999999999").ok());
  EXPECT_FALSE(ParseByteSize("17179869184GiB").ok());  // overflows 64 bits
}

TEST(ByteSize, FormatsWithTheLargestExactUnit) {
  EXPECT_EQ(FormatByteSize(64ull << 20), "64 MiB");
  EXPECT_EQ(FormatByteSize(1ull << 30), "1 GiB");
  EXPECT_EQ(FormatByteSize(3072), "3 KiB");
  EXPECT_EQ(FormatByteSize(1000), "1000 B");
  EXPECT_EQ(FormatByteSize(0), "0 B");
  for (uint64_t n : {4096ull, 96ull << 20, 5ull << 30}) EXPECT_EQ(*ParseByteSize(FormatByteSize(n)), n);
}

TEST(BackendName, RoundTripsAndAgreesWithThePublicEnum) {
  EXPECT_EQ(BackendName(wire::BackendKind::kCuda), "cuda");
  EXPECT_EQ(BackendName(wire::BackendKind::kHost), "host");
  EXPECT_EQ(BackendName(BackendKind::kCuda), "cuda");
  EXPECT_EQ(BackendName(BackendKind::kHost), "host");
  EXPECT_EQ(ParseBackendName("cuda"), wire::BackendKind::kCuda);
  EXPECT_EQ(ParseBackendName("host"), wire::BackendKind::kHost);
  EXPECT_FALSE(ParseBackendName("auto"));
  EXPECT_FALSE(ParseBackendName("CUDA"));
}

TEST(Cli, WalksOptionsValuesAndOperands) {
  cli::Args a({"--out", "x.yaml", "--n", "96", "--quick", "file", "--max-size", "4MiB"});
  std::string out, operand;
  int n = 0;
  bool quick = false;
  uint64_t max_size = 0;
  while (a.Next()) {
    if (a.Is("--out"))
      out = a.Value();
    else if (a.Is("--n"))
      ASSERT_TRUE(a.IntValue(64, 16384, n));
    else if (a.Is("--quick"))
      quick = true;
    else if (a.Is("--max-size"))
      ASSERT_TRUE(a.ByteSizeValue(64 << 10, 1ull << 32, max_size));
    else
      operand = a.current();
  }
  EXPECT_EQ(out, "x.yaml");
  EXPECT_EQ(n, 96);
  EXPECT_TRUE(quick);
  EXPECT_EQ(operand, "file");
  EXPECT_EQ(max_size, 4ull << 20);
}

TEST(Cli, RefusesBadNumbersAndMissingValues) {
  int n = 7;
  cli::Args a({"--n", "12abc", "--n", "63", "--n", "-1", "--n"});
  while (a.Next()) EXPECT_FALSE(a.IntValue(64, 16384, n)) << a.current();
  EXPECT_EQ(n, 7);  // unchanged on every failure
  cli::Args b({"-h"});
  ASSERT_TRUE(b.Next());
  EXPECT_TRUE(b.IsHelp());
  EXPECT_FALSE(b.HasValue());
  EXPECT_EQ(b.Value(), "");
  EXPECT_FALSE(b.Next());
}

TEST(Cli, FailPrintsThePrefixAndReturnsOne) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(cli::Fail("ferryctl: tune", "--n takes 64..16384"), 1);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "ferryctl: tune: --n takes 64..16384\n");
}

TEST(Process, RunProgramPassesTheExitCodeThrough) {
  EXPECT_EQ(RunProgram({"sh", "-c", "exit 3"}, "test"), 3);
  EXPECT_EQ(RunProgram({"true"}, "test"), 0);
  EXPECT_EQ(RunProgram({"/nonexistent/program"}, "test"), 127);
  EXPECT_NE(ExecutableDir(), ".");
}

// The submit doorbell's rule: of the submitters that find ferryd's sleeping bit set, one takes
// it and rings; the others, and everyone once it is taken, ring nothing.
TEST(SubmitDoorbell, OneOfTheSubmittersThatFindFerrydAsleepTakesItsBitAndRings) {
  std::atomic<uint32_t> state{0};
  EXPECT_FALSE(wire::TakeDaemonSleeping(state)) << "ferryd awake";
  state = wire::kDaemonSleeping;
  EXPECT_TRUE(wire::TakeDaemonSleeping(state));
  EXPECT_EQ(state.load(), 0u);
  EXPECT_FALSE(wire::TakeDaemonSleeping(state)) << "taken already";
  for (int round = 0; round < 50; ++round) {
    state = wire::kDaemonSleeping;
    std::atomic<int> go{0}, rings{0};
    std::vector<std::thread> submitters;
    for (int t = 0; t < 4; ++t) {
      submitters.emplace_back([&] {
        go.fetch_add(1);
        while (go.load() < 4) std::this_thread::yield();
        if (wire::TakeDaemonSleeping(state)) rings.fetch_add(1);
      });
    }
    for (auto& t : submitters) t.join();
    ASSERT_EQ(rings.load(), 1) << "round " << round;
  }
}

}  // namespace
}  // namespace ferry
