// Benchmark verdicts (bench/target_verdict.hpp): a miss is put down to the machine only when the
// target asks for more than the machine's own limit measured in the same run.
#include "bench/target_verdict.hpp"

#include <gtest/gtest.h>

#include <string>

namespace ferry::bench {
namespace {

TEST(TargetVerdict, MetIsAPassWhateverTheLimit) {
  EXPECT_EQ(AtLeast(52.0, 50.0, 0), Verdict::kPass);
  EXPECT_EQ(AtLeast(50.0, 50.0, 55.0), Verdict::kPass);
  EXPECT_EQ(AtLeast(80.0, 70.0, 55.0), Verdict::kPass);  // a limit measured low does not fail a met target
}

TEST(TargetVerdict, AMissWithinTheMachinesReachIsAFailure) {
  EXPECT_EQ(AtLeast(40.0, 50.0, 55.0), Verdict::kFail);
  EXPECT_EQ(AtLeast(40.0, 55.0, 55.0), Verdict::kFail);  // exactly the limit: reachable
}

TEST(TargetVerdict, AMissAboveTheMeasuredLimitIsTheMachines) {
  // 512 x 256 KiB: twice a 37.8 GB/s loop against a 55.3 GB/s bus.
  EXPECT_EQ(AtLeast(52.3, 75.6, 55.3), Verdict::kAboveMachineLimit);
}

// Out of reach or not, a figure far below what the machine did is the copy's failure.
TEST(TargetVerdict, AFigureFarBelowTheLimitFailsEvenAnUnreachableTarget) {
  EXPECT_EQ(AtLeast(10.0, 75.6, 55.3), Verdict::kFail);
  EXPECT_EQ(AtLeast(0.89 * 55.3, 75.6, 55.3), Verdict::kFail);
  EXPECT_EQ(AtLeast(0.91 * 55.3, 75.6, 55.3), Verdict::kAboveMachineLimit);
}

TEST(TargetVerdict, WithoutALimitMeasuredAMissIsAFailure) { EXPECT_EQ(AtLeast(52.3, 75.6, 0), Verdict::kFail); }

TEST(TargetVerdict, WordsAreWhatTheTablesPrint) {
  EXPECT_EQ(std::string(VerdictWord(PassOrFail(true))), "PASS");
  EXPECT_EQ(std::string(VerdictWord(PassOrFail(false))), "FAIL");
  EXPECT_EQ(std::string(VerdictWord(Verdict::kAboveMachineLimit)), "LIMIT");
}

}  // namespace
}  // namespace ferry::bench
