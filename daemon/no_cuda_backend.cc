// Linked instead of cuda_backend.cc when ferry is built without the CUDA toolkit.
#include "daemon/backend.hpp"

namespace ferry::daemon {

std::string CublasVersion() { return "none"; }

Result<std::unique_ptr<Backend>> CreateCudaBackend(const GpuLocation&, uint32_t, bool, uint32_t) {
  return NotSupported("this ferryd was built without the CUDA toolkit (host backend only)");
}

Result<std::vector<int>> ResolveCudaDevices(const std::vector<std::string>&) {
  return NotSupported("this ferryd was built without the CUDA toolkit (host backend only)");
}

Result<std::vector<GpuLocation>> LocateCudaGpus(const std::vector<std::string>&) {
  return NotSupported("this ferryd was built without the CUDA toolkit (host backend only)");
}

}  // namespace ferry::daemon
