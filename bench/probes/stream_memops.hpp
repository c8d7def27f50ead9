// The stream memory operations the probes use (cuStreamWriteValue32, cuStreamWaitValue32),
// reached through the runtime's entry points, the host words they work on (a mapped page), and
// a driver-call check that ends the probe.
#pragma once

#include <cuda.h>

#include "bench/probes/probe_util.hpp"

using StreamValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
inline StreamValue32 write_value = nullptr;
inline StreamValue32 wait_value = nullptr;

inline void LoadDriverEntryPoints() {
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", reinterpret_cast<void**>(&write_value), 12000,
                                      cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess) std::_Exit(2);
  CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", reinterpret_cast<void**>(&wait_value), 12000,
                                      cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess) std::_Exit(2);
}

inline void Relax() { __builtin_ia32_pause(); }

// A registered page's device address (the page mapped, for the GPU to read and write).
inline CUdeviceptr MapPage(void* page) {
  CK(cudaHostRegister(page, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
  void* d = nullptr;
  CK(cudaHostGetDevicePointer(&d, page, 0));
  return reinterpret_cast<CUdeviceptr>(d);
}

inline void CkCu(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s failed: %d\n", what, static_cast<int>(r));
    std::_Exit(1);
  }
}
