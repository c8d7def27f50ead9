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
  // One message, one line: control characters (a client's or a file's text may carry them)
  // are written escaped, so that nothing logged can forge a line of its own.
  for (char c : line) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    }
  }
  out += '\n';
  // One write per line so lines from several threads never interleave.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, out.data(), out.size());
}

}  // namespace ferry
