// Policies and configs from arbitrary bytes: an error or a value, never a crash or a hang.
#include <cstddef>
#include <cstdint>
#include <string>

#include "daemon/config.hpp"
#include "policy/policy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto p = ferry::daemon::ParsePolicy(text, "fuzz.yaml");
  if (p.ok()) {
    std::vector<uint64_t> pieces;
    (*p)->Pieces(1ull << 30, pieces);
    uint64_t sum = 0;
    for (uint64_t n : pieces) sum += n;
    if (sum != 1ull << 30) __builtin_trap();  // a schedule must cover the copy exactly
    (void)(*p)->Hash();
  }
  auto c = ferry::daemon::ParseConfig(text, "fuzz.yaml");
  if (c.ok() && !ferry::daemon::ValidateConfig(*c).ok()) __builtin_trap();  // parsed means valid
  return 0;
}
