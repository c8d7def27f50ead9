// JSON text for the reports and records ferry writes by hand (snapshots, bench and tune reports).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

namespace ferry::json {

// A JSON string literal for `s`: quotes, backslashes and control characters escaped.
inline std::string String(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += b;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A JSON number with 9 significant digits; null for NaN and infinities.
inline std::string Number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[40];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

}  // namespace ferry::json
