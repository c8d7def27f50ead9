#include "common/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

namespace ferry {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed); }

void EmitLogLine(LogLevel level, std::string_view line) {
  static constexpr const char* kNames[] = {"debug", "info", "warning", "error"};
  std::string out = "ferryd[";
  out += kNames[static_cast<int>(level)];
  out += "] ";
  out += line;
  out += '\n';
  // One write per line so lines from several threads never interleave.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, out.data(), out.size());
}

}  // namespace ferry
