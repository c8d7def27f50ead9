// What the hardware probes share: a CUDA check that ends the probe, a clock, and --help.
#pragma once

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

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

// A zeroed page shared with the child process forked next (MAP_SHARED), as a T; nullptr where
// mmap fails. Call it before any CUDA call: a child forked after CUDA starts cannot use CUDA.
template <typename T>
T* MapSharedPageBeforeFork() {
  static_assert(sizeof(T) <= 4096 && std::is_trivially_destructible_v<T>);
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return nullptr;
  std::memset(page, 0, 4096);
  return new (page) T{};
}

// A zeroed page of this process's own (MAP_PRIVATE) as 32-bit words, for words a stream writes
// or waits on; ends the probe where mmap fails.
inline uint32_t* MapPrivateWordPage() {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    std::perror("mmap");
    std::_Exit(1);
  }
  std::memset(page, 0, 4096);
  return static_cast<uint32_t*>(page);
}
