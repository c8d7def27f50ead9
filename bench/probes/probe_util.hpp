// What the hardware probes share: a CUDA check that ends the probe, a clock, and --help.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::_Exit(1);                                                                          \
    }                                                                                         \
  } while (0)

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// True (after printing `usage`) when the probe was asked for --help or -h.
inline bool AskedForHelp(int argc, char** argv, const char* usage) {
  if (argc != 2 || (std::strcmp(argv[1], "-h") != 0 && std::strcmp(argv[1], "--help") != 0)) return false;
  std::puts(usage);
  return true;
}
