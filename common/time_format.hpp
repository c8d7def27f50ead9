// Wall-clock times as ISO 8601 text, UTC: what records and reports carry as issued_at.
#pragma once

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

namespace ferry {

enum class IsoPrecision { kSeconds, kMilliseconds };

// 2026-12-02T19:24:18Z, or 2026-12-02T19:24:18.123Z with kMilliseconds.
inline std::string IsoTimeUtc(std::chrono::system_clock::time_point t,
                              IsoPrecision precision = IsoPrecision::kSeconds) {
  const std::time_t s = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&s, &tm);
  char buf[64];
  if (precision == IsoPrecision::kSeconds) {
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec);
  } else {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  }
  return buf;
}

inline std::string IsoTimeUtcNow() { return IsoTimeUtc(std::chrono::system_clock::now()); }

}  // namespace ferry
