// Built without the CUDA toolkit: the overlap workload has the host engine only.
#include "bench/overlap.hpp"

namespace ferry::overlap {

Result<std::unique_ptr<StepEngine>> MakeCudaStepEngine(int, int) {
  return NotSupported("ferry was built without the CUDA toolkit: the GPU engine is not available");
}

}  // namespace ferry::overlap
