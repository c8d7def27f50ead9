#include "common/byte_size.hpp"

#include <cctype>
#include <limits>

namespace ferry {

Result<uint64_t> ParseByteSize(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t start = i;
  uint64_t v = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return InvalidArgument("size overflows 64 bits");
    v = v * 10 + d;
    ++i;
  }
  if (i == start) return InvalidArgument("expected a size such as 4096, 64MiB or 1GiB");
  while (i < text.size() && text[i] == ' ') ++i;
  std::string unit(text.substr(i));
  struct U {
    const char* name;
    uint64_t mult;
  };
  static constexpr U kUnits[] = {{"", 1},
                                 {"B", 1},
                                 {"KiB", 1ull << 10},
                                 {"MiB", 1ull << 20},
                                 {"GiB", 1ull << 30},
                                 {"TiB", 1ull << 40},
                                 {"KB", 1000},
                                 {"MB", 1000000},
                                 {"GB", 1000000000ull}};
  for (const U& u : kUnits) {
    if (unit == u.name) {
      if (v > std::numeric_limits<uint64_t>::max() / u.mult) return InvalidArgument("size overflows 64 bits");
      return v * u.mult;
    }
  }
  return InvalidArgument("unknown size unit '" + unit + "' (expected B, KiB, MiB, GiB, TiB, KB, MB or GB)");
}

std::string FormatByteSize(uint64_t n) {
  if (n >= (1ull << 30) && n % (1ull << 30) == 0) return std::to_string(n >> 30) + " GiB";
  if (n >= (1ull << 20) && n % (1ull << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= (1ull << 10) && n % (1ull << 10) == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

}  // namespace ferry
