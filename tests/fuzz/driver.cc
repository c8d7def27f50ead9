// Runs a fuzz target without libFuzzer (GCC builds, CI): the seed inputs, then random and
// mutated inputs until the time budget is spent. With Clang, FERRY_FUZZ_LIBFUZZER builds the
// same targets against libFuzzer instead.
//   fuzz_target [--seconds N] [--seed S] [--timeout SECONDS] [--runs N] [seed files or directories...]
// An input that runs longer than --timeout (default 1 s) is a hang: the driver writes it to
// hang-<pid>.input, says so, and fails, as libFuzzer's -timeout does. --runs: stop after N
// generated inputs (a long mode for 10^6 and more) instead of after --seconds.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

constexpr size_t kMaxInputBytes = 64 << 10;  // generated inputs grow up to this (libFuzzer: -max_len)

// The input running now and since when (0: none), for the watchdog thread.
std::atomic<uint64_t> g_started_ns{0};
std::atomic<const std::vector<uint8_t>*> g_current{nullptr};
// The first input also builds the target's world (a live ferryd with its pool, under a
// sanitizer on busy cores: seconds), so it alone gets this long.
constexpr double kFirstInputSeconds = 60;
std::atomic<bool> g_first_done{false};

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

void RunOne(const std::vector<uint8_t>& in) {
  g_current.store(&in);
  g_started_ns.store(NowNs(), std::memory_order_release);
  LLVMFuzzerTestOneInput(in.data(), in.size());
  g_started_ns.store(0, std::memory_order_release);
  g_first_done.store(true, std::memory_order_release);
}

// Runs on its own thread for the life of the process: the input cannot be interrupted, so a
// hang ends the process (with the input saved) rather than the run going on forever.
[[noreturn]] void Watchdog(double timeout_s) {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t started = g_started_ns.load(std::memory_order_acquire);
    const double allowed_s = g_first_done.load(std::memory_order_acquire) ? timeout_s : std::max(timeout_s, kFirstInputSeconds);
    if (started == 0 || NowNs() - started <= static_cast<uint64_t>(allowed_s * 1e9)) continue;
    // The main thread is stuck in this input, so it stays put while it is saved.
    const std::vector<uint8_t>& in = *g_current.load();
    const std::string path = "hang-" + std::to_string(::getpid()) + ".input";
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(in.data()),
                                                static_cast<std::streamsize>(in.size()));
    std::fprintf(stderr, "HANG: an input of %zu bytes ran longer than %.1f s (saved as %s)\n", in.size(),
                 allowed_s, path.c_str());
    std::fflush(stderr);
    std::_Exit(70);
  }
}

void AddSeed(const std::string& path, std::vector<std::vector<uint8_t>>& corpus) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(path)) {
      if (e.is_regular_file()) AddSeed(e.path().string(), corpus);
    }
    return;
  }
  std::ifstream f(path, std::ios::binary);
  corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 5, timeout = 1;
  uint64_t max_runs = 0;
  uint64_t seed = std::random_device{}();
  std::vector<std::vector<uint8_t>> corpus;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::stod(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::stoull(argv[++i]);
    } else if (a == "--timeout" && i + 1 < argc) {
      timeout = std::stod(argv[++i]);
    } else if (a == "--runs" && i + 1 < argc) {
      max_runs = std::stoull(argv[++i]);
    } else {
      AddSeed(a, corpus);
    }
  }
  if (corpus.empty()) corpus.push_back({});
  std::mt19937_64 rng(seed);
  if (max_runs > 0) {
    std::printf("fuzzing for %llu inputs, seed %llu, %zu seed inputs, %.1f s per input at most\n",
                (unsigned long long)max_runs, (unsigned long long)seed, corpus.size(), timeout);
  } else {
    std::printf("fuzzing for %.0f s, seed %llu, %zu seed inputs, %.1f s per input at most\n", seconds,
                (unsigned long long)seed, corpus.size(), timeout);
  }
  std::fflush(stdout);
  std::thread(Watchdog, timeout).detach();
  for (auto& c : corpus) RunOne(c);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = 0;
  std::vector<uint8_t> in;
  while (max_runs > 0 ? runs < max_runs : std::chrono::steady_clock::now() < end) {
    const auto& base = corpus[rng() % corpus.size()];
    in = base;
    switch (rng() % 4) {
      case 0:  // fresh random bytes
        in.resize(rng() % 512);
        for (auto& b : in) b = static_cast<uint8_t>(rng());
        break;
      case 1:  // flip bits
        for (int k = 0, n = 1 + static_cast<int>(rng() % 8); k < n && !in.empty(); ++k) in[rng() % in.size()] ^= 1 << (rng() % 8);
        break;
      case 2:  // truncate or extend
        in.resize(in.empty() ? rng() % 64 : std::min<size_t>(kMaxInputBytes, rng() % (2 * in.size() + 1)),
                  static_cast<uint8_t>(rng()));
        break;
      default:  // splice in interesting values
        for (int k = 0; k < 4 && in.size() >= 8; ++k) {
          const uint64_t vals[] = {0, 1, 0x7fffffff, 0xffffffff, ~0ull, 1ull << 63, 4096, 0x59525246};
          uint64_t v = vals[rng() % 8];
          std::memcpy(&in[rng() % (in.size() - 7)], &v, 8);
        }
    }
    RunOne(in);
    ++runs;
    if (runs % 4 == 0 && corpus.size() < 256) corpus.push_back(in);
  }
  std::printf("%llu inputs, no crash\n", (unsigned long long)runs);
  return 0;
}
