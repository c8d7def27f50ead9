// Linked instead of cuda_device.cc when ferry is built without the CUDA toolkit.
#include "client/device_api.hpp"

namespace ferry::detail {

Result<std::unique_ptr<ClientDevice>> MakeCudaClientDevice(int) {
  return NotSupported("ferryd runs the cuda backend, but this libferry was built without CUDA");
}

Result<int> CurrentCudaDevice() { return NotSupported("ferryd runs the cuda backend, but this libferry was built without CUDA"); }

}  // namespace ferry::detail
