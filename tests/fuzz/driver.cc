// Runs a fuzz target without libFuzzer (GCC builds, CI): the seed inputs, then random and
// mutated inputs until the time budget is spent. With Clang, FERRY_FUZZ_LIBFUZZER builds the
// same targets against libFuzzer instead.
//   fuzz_target [--seconds N] [--seed S] [seed files...]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  double seconds = 5;
  uint64_t seed = std::random_device{}();
  std::vector<std::vector<uint8_t>> corpus;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::stod(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::stoull(argv[++i]);
    } else {
      std::ifstream f(a, std::ios::binary);
      corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
  }
  if (corpus.empty()) corpus.push_back({});
  std::mt19937_64 rng(seed);
  std::printf("fuzzing for %.0f s, seed %llu, %zu seed inputs\n", seconds, (unsigned long long)seed, corpus.size());
  std::fflush(stdout);
  for (auto& c : corpus) LLVMFuzzerTestOneInput(c.data(), c.size());
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = 0;
  std::vector<uint8_t> in;
  while (std::chrono::steady_clock::now() < end) {
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
        in.resize(in.empty() ? rng() % 64 : rng() % (2 * in.size() + 1), static_cast<uint8_t>(rng()));
        break;
      default:  // splice in interesting values
        for (int k = 0; k < 4 && in.size() >= 8; ++k) {
          const uint64_t vals[] = {0, 1, 0x7fffffff, 0xffffffff, ~0ull, 1ull << 63, 4096, 0x59525246};
          uint64_t v = vals[rng() % 8];
          std::memcpy(&in[rng() % (in.size() - 7)], &v, 8);
        }
    }
    LLVMFuzzerTestOneInput(in.data(), in.size());
    ++runs;
    if (runs % 4 == 0 && corpus.size() < 256) corpus.push_back(in);
  }
  std::printf("%llu inputs, no crash\n", (unsigned long long)runs);
  return 0;
}
