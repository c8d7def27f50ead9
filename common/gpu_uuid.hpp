// A GPU's UUID as nvidia-smi and CUDA print it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ferry {

inline std::string FormatGpuUuid(const uint8_t* u) {
  char text[48];
  std::snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return text;
}

// The name the host backend gives its simulated GPU `ordinal` where a real one has its UUID.
inline std::string SimulatedGpuName(int ordinal) { return "host-gpu-" + std::to_string(ordinal); }

}  // namespace ferry
