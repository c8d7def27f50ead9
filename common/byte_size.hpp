// Byte counts as people write them: "64MiB", "1 GiB", "4096", "2MB".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/status.hpp"

namespace ferry {

// "1GiB", "64 MiB", "4096", "2MB" -> bytes (B, KiB, MiB, GiB, TiB; KB, MB, GB: powers of ten).
Result<uint64_t> ParseByteSize(std::string_view text);

// The largest binary unit that divides n exactly: "64 MiB", "3 KiB", "1000 B".
std::string FormatByteSize(uint64_t n);

}  // namespace ferry
