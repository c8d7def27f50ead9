// The crew that issues a batch's parts at once (daemon/issue_crew.hpp): every part runs once,
// the helpers' parts side by side with the caller's, the first error by part index comes back,
// and no job is lost between runs.
#include "daemon/issue_crew.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "daemon/numa.hpp"
#include "test_util.hpp"

namespace ferry::daemon {
namespace {

using namespace std::chrono_literals;

TEST(IssueCrew, EveryPartRunsOnceAndRunReturnsWhenAllHave) {
  IssueCrew crew(4);
  std::vector<std::atomic<int>> calls(4);
  const Status st = crew.Run(4, [&](uint32_t part) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * part));  // the last part ends last
    calls[part].fetch_add(1);
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.message();
  for (size_t p = 0; p < calls.size(); ++p) EXPECT_EQ(calls[p].load(), 1) << "part " << p;
}

// Each part waits for all four to have started: only threads running at once get past it.
TEST(IssueCrew, TheHelpersPartsRunAtOnceWithTheCallers) {
  IssueCrew crew(4);
  std::atomic<int> arrived{0};
  std::vector<std::thread::id> ran_on(4);
  const Status st = crew.Run(4, [&](uint32_t part) {
    ran_on[part] = std::this_thread::get_id();
    arrived.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (arrived.load() < 4) {
      if (std::chrono::steady_clock::now() > deadline) return Internal("part " + std::to_string(part) + " ran alone");
      std::this_thread::yield();
    }
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(ran_on[0], std::this_thread::get_id());
  for (uint32_t p = 1; p < 4; ++p) {
    EXPECT_NE(ran_on[p], std::this_thread::get_id()) << "part " << p;
    for (uint32_t q = 1; q < p; ++q) EXPECT_NE(ran_on[p], ran_on[q]) << "parts " << q << " and " << p;
  }
}

TEST(IssueCrew, TheFirstErrorByPartIndexComesBackAfterEveryPartRan) {
  IssueCrew crew(4);
  std::atomic<int> ran{0};
  const Status st = crew.Run(4, [&](uint32_t part) -> Status {
    ran.fetch_add(1);
    if (part == 3) return Internal("part three failed");
    if (part == 2) {
      std::this_thread::sleep_for(20ms);  // fails after part 3 did
      return DeviceError("part two failed");
    }
    return Status::Ok();
  });
  EXPECT_EQ(ran.load(), 4);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "part two failed");
}

TEST(IssueCrew, PartsPastTheHelpersRunOnTheCallersThread) {
  IssueCrew one(1);
  std::vector<std::thread::id> ran_on(3);
  ASSERT_TRUE(one.Run(3,
                      [&](uint32_t part) {
                        ran_on[part] = std::this_thread::get_id();
                        return Status::Ok();
                      })
                  .ok());
  for (const auto& id : ran_on) EXPECT_EQ(id, std::this_thread::get_id());

  IssueCrew two(2);
  std::vector<std::thread::id> of_two(5);
  ASSERT_TRUE(two.Run(5,
                      [&](uint32_t part) {
                        of_two[part] = std::this_thread::get_id();
                        return Status::Ok();
                      })
                  .ok());
  EXPECT_NE(of_two[1], std::this_thread::get_id());
  for (uint32_t p : {0u, 2u, 3u, 4u}) EXPECT_EQ(of_two[p], std::this_thread::get_id()) << "part " << p;
}

// Jobs one after another, of changing sizes: a helper that missed a wake or ran a job twice
// leaves a count off or Run waiting forever (the test's timeout).
TEST(IssueCrew, ManyRunsInARowEachRunEveryPartOnce) {
  IssueCrew crew(4);
  std::vector<std::atomic<int>> calls(4);
  int expected[4] = {0, 0, 0, 0};
  for (int job = 0; job < 5000; ++job) {
    const uint32_t parts = 1 + job % 4;
    ASSERT_TRUE(crew.Run(parts,
                         [&](uint32_t part) {
                           calls[part].fetch_add(1);
                           return Status::Ok();
                         })
                    .ok());
    for (uint32_t p = 0; p < parts; ++p) ++expected[p];
    if (job % 500 == 0) {
      for (size_t p = 0; p < 4; ++p) ASSERT_EQ(calls[p].load(), expected[p]) << "job " << job << ", part " << p;
    }
  }
  for (size_t p = 0; p < 4; ++p) EXPECT_EQ(calls[p].load(), expected[p]) << "part " << p;
}

// A part that throws fails its part with Internal, on a helper as on the caller's thread; the
// crew goes on.
TEST(IssueCrew, APartThatThrowsFailsItsPartAndTheCrewGoesOn) {
  IssueCrew crew(2);
  for (uint32_t thrower : {0u, 1u}) {
    const Status st = crew.Run(2, [&](uint32_t part) -> Status {
      if (part == thrower) throw std::runtime_error("part " + std::to_string(part));
      return Status::Ok();
    });
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), Code::kInternal);
    EXPECT_NE(st.message().find("part " + std::to_string(thrower)), std::string::npos) << st.message();
  }
  const Status not_an_exception = crew.Run(2, [&](uint32_t part) -> Status {
    if (part == 1) throw 7;
    return Status::Ok();
  });
  EXPECT_EQ(not_an_exception.code(), Code::kInternal) << not_an_exception.ToString();
  std::atomic<int> ran{0};
  ASSERT_TRUE(crew.Run(2,
                       [&](uint32_t) {
                         ran.fetch_add(1);
                         return Status::Ok();
                       })
                  .ok());
  EXPECT_EQ(ran.load(), 2);
}

// The helpers may run on every CPU the constructing thread could, whatever the CPUs of the
// thread that later asks (ferryd's event loop may be pinned to one).
TEST(IssueCrew, HelpersRunOnTheConstructingThreadsCpusNotOnTheAskingThreads) {
  cpu_set_t all;
  ASSERT_EQ(::sched_getaffinity(0, sizeof all, &all), 0);
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "one CPU: nothing to tell apart";
  IssueCrew crew(2);
  int helper_cpus = 0;
  std::thread asker([&] {
    const cpu_set_t one = testing::FirstCpuOf(all);
    ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
    ASSERT_TRUE(crew.Run(2,
                         [&](uint32_t part) {
                           if (part == 1) {
                             cpu_set_t mine;
                             if (::sched_getaffinity(0, sizeof mine, &mine) == 0) helper_cpus = CPU_COUNT(&mine);
                           }
                           return Status::Ok();
                         })
                    .ok());
  });
  asker.join();
  EXPECT_EQ(helper_cpus, CPU_COUNT(&all));
}

// Given CPUs (the GPU's node's), the helpers run there and nowhere else, wherever the
// constructing and the asking threads may run.
TEST(IssueCrew, HelpersRunOnTheCpusTheCrewIsGiven) {
  const std::vector<int> allowed = AffinityCpus();
  ASSERT_FALSE(allowed.empty());
  const int given = allowed.front();
  IssueCrew crew(3, {given});
  std::vector<cpu_set_t> helper_cpus(3);
  std::vector<int> got(3, -1);
  ASSERT_TRUE(crew.Run(3,
                       [&](uint32_t part) {
                         got[part] = ::sched_getaffinity(0, sizeof helper_cpus[part], &helper_cpus[part]);
                         return Status::Ok();
                       })
                  .ok());
  for (uint32_t p = 1; p < 3; ++p) {
    ASSERT_EQ(got[p], 0) << "part " << p;
    EXPECT_EQ(CPU_COUNT(&helper_cpus[p]), 1) << "part " << p;
    EXPECT_TRUE(CPU_ISSET(given, &helper_cpus[p])) << "part " << p;
  }
}

// The helpers go on the GPU's node's CPUs that ferryd may use, else on all it may use, and the
// crew is no larger than where they go.
TEST(PlaceCrew, HelpersGoOnTheNodesAllowedCpusAndTheCrewIsNoLargerThanThem) {
  const std::vector<int> allowed = {0, 1, 2, 3, 8, 9, 10, 11};
  CrewPlacement on_node = PlaceCrew(4, {8, 9, 10, 11, 12, 13}, allowed);
  EXPECT_EQ(on_node.cpus, (std::vector<int>{8, 9, 10, 11}));
  EXPECT_EQ(on_node.threads, 4u);

  CrewPlacement few = PlaceCrew(8, {2, 3, 4, 5}, allowed);
  EXPECT_EQ(few.cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(few.threads, 2u) << "more threads than CPUs only take turns";

  CrewPlacement none_allowed_there = PlaceCrew(4, {16, 17}, allowed);
  EXPECT_EQ(none_allowed_there.cpus, allowed);
  EXPECT_EQ(none_allowed_there.threads, 4u);

  CrewPlacement node_unknown = PlaceCrew(16, {}, allowed);
  EXPECT_EQ(node_unknown.cpus, allowed);
  EXPECT_EQ(node_unknown.threads, 8u);

  CrewPlacement affinity_unknown = PlaceCrew(4, {0, 1}, {});
  EXPECT_TRUE(affinity_unknown.cpus.empty());
  EXPECT_EQ(affinity_unknown.threads, 4u);

  EXPECT_EQ(PlaceCrew(0, {0}, allowed).threads, 1u) << "the caller's thread is always one";
  EXPECT_EQ(PlaceCrew(1, {}, allowed).threads, 1u);
}

// This process's threads named as the crew's helpers.
int HelperThreads() { return testing::ThreadsNamed("self", IssueCrew::kThreadName); }

// A joined thread leaves /proc/self/task a moment after its join returns: waits (up to 10 s)
// for the helpers of crews already destroyed to be gone.
int HelperThreadsOnceJoinedOnesLeft() {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (HelperThreads() != 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  return HelperThreads();
}

// Helpers start at the first Run with more than one part, carry the crew's name, and are
// joined by the destructor.
TEST(IssueCrew, HelpersStartAtTheFirstRunThatNeedsThemAndStopWithTheCrew) {
  ASSERT_EQ(HelperThreadsOnceJoinedOnesLeft(), 0);  // earlier tests' crews, in one process
  {
    IssueCrew idle(8);
    ASSERT_TRUE(idle.Run(1, [](uint32_t) { return Status::Ok(); }).ok());
    EXPECT_EQ(HelperThreads(), 0) << "a one-part run needs no helper";
  }
  const auto t0 = std::chrono::steady_clock::now();
  {
    IssueCrew used(8);
    ASSERT_TRUE(used.Run(2, [](uint32_t) { return Status::Ok(); }).ok());
    EXPECT_EQ(HelperThreads(), 7);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(HelperThreadsOnceJoinedOnesLeft(), 0);
}

}  // namespace
}  // namespace ferry::daemon
