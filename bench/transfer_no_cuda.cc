// ferry-bench transfer without the CUDA toolkit: the sweep times real GPU copies, so it says why
// it cannot run instead.
#include <cstdio>

#include "bench/bench_commands.hpp"

namespace ferry::bench {

int RunTransferSweep(const std::vector<std::string>&) {
  std::fprintf(stderr,
               "ferry-bench: transfer measures copies to a GPU: this ferry-bench was built without the CUDA "
               "toolkit (rebuild with it, -DFERRY_CUDA=ON, on a machine with the GPU)\n");
  return 1;
}

}  // namespace ferry::bench
