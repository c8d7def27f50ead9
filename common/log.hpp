// Minimal leveled logging to stderr (journald picks it up under systemd). Thread-safe per line.
#pragma once

#include <sstream>
#include <string_view>

namespace ferry {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void EmitLogLine(LogLevel level, std::string_view line);

class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine() { EmitLogLine(level_, stream_.str()); }
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  template <typename T>
  LogLine& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace ferry

#define FERRY_LOG(level) \
  if (!::ferry::LogEnabled(::ferry::LogLevel::level)) {} else ::ferry::LogLine(::ferry::LogLevel::level)
