// Short busy-waits, shared by the session core and the staged pipeline: a wake-up through the
// kernel costs tens of microseconds, more than many of the waits it would end.
#pragma once

#include <cstdint>
#include <thread>

#include "common/fd.hpp"

namespace ferry::detail {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until `done()` or `ns` have passed; says whether `done()` came true.
template <typename Done>
bool SpinFor(uint64_t ns, Done done) {
  const uint64_t until = MonotonicNanos() + ns;
  while (!done()) {
    if (MonotonicNanos() >= until) return false;
    CpuRelax();
  }
  return true;
}

}  // namespace ferry::detail
