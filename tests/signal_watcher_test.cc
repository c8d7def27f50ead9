// ferryd's signals on a thread of their own (daemon/signal_watcher.hpp). Each scenario runs in a
// child process of its own (gtest's death-test machinery, which starts it afresh), as ferryd's
// main does: the watcher first, then the other threads. The child exits 0 when every check held,
// and says what did not otherwise.
#include "daemon/signal_watcher.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

namespace ferry::daemon {
namespace {

using namespace std::chrono_literals;

// Polls `done` for up to 10 s.
template <typename F>
bool Eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

#define CHILD_CHECK(cond)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "check failed at line %d: %s\n", __LINE__, #cond); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

// Before anything is attached a SIGTERM and a SIGHUP are kept, and handed over at Attach;
// after it, each goes at once; after Detach, none goes to what was attached: a SIGHUP then is
// kept for the next Attach instead.
int SignalsBeforeAndAfterAttach() {
  auto watcher = SignalWatcher::Start();
  CHILD_CHECK(watcher.ok());
  CHILD_CHECK(!(*watcher)->stop_requested());
  ::kill(::getpid(), SIGHUP);
  std::this_thread::sleep_for(50ms);  // the watcher reads it, and keeps it
  ::kill(::getpid(), SIGTERM);
  CHILD_CHECK(Eventually([&] { return (*watcher)->stop_requested(); }));
  std::atomic<int> stops{0}, reloads{0};
  (*watcher)->Attach({.stop = [&] { ++stops; }, .reload = [&] { ++reloads; }});
  CHILD_CHECK(stops.load() == 1);
  CHILD_CHECK(reloads.load() == 1);
  ::kill(::getpid(), SIGHUP);
  CHILD_CHECK(Eventually([&] { return reloads.load() == 2; }));
  ::kill(::getpid(), SIGINT);
  CHILD_CHECK(Eventually([&] { return stops.load() == 2; }));
  (*watcher)->Detach();
  ::kill(::getpid(), SIGHUP);
  // Whether the watcher read it before this Attach (kept, handed over) or after (sent at once),
  // it goes to the new actions, once, and never to the detached ones.
  std::atomic<int> later_reloads{0};
  (*watcher)->Attach({.stop = [] {}, .reload = [&] { ++later_reloads; }});
  CHILD_CHECK(Eventually([&] { return later_reloads.load() == 1; }));
  std::this_thread::sleep_for(50ms);
  CHILD_CHECK(later_reloads.load() == 1);
  CHILD_CHECK(stops.load() == 2 && reloads.load() == 2);
  CHILD_CHECK((*watcher)->stop_requested());
  return 0;
}

TEST(SignalWatcher, SignalsBeforeTheServerIsAttachedAreHandedOverAndLaterOnesGoAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(SignalsBeforeAndAfterAttach()), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace ferry::daemon
