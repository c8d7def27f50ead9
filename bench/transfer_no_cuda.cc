// ferry-bench transfer without the CUDA toolkit: the sweep times real GPU copies, so it says why
// it cannot run instead. `--only blocks` runs the blocks section's ferry list copies against a
// ferryd on the host backend (bench/block_lists.hpp), which needs no GPU.
#include <cstdio>

#include "bench/bench_commands.hpp"
#include "bench/block_lists.hpp"
#include "bench/list_clients.hpp"
#include "common/cli.hpp"

namespace ferry::bench {

int RunTransferSweep(const std::vector<std::string>& args) {
  ConnectOptions options;
  HostBlocksOptions run;
  bool only_blocks = false, other = false;
  std::string first_other;
  cli::Args a(args);
  while (a.Next()) {
    if (a.Is("--socket") && a.HasValue()) {
      options.socket_path = a.Value();
    } else if (a.Is("--quick")) {
      run.quick = true;
    } else if (a.Is("--max-size")) {
      if (!a.ByteSizeValue(4096, 1ull << 40, run.max_bytes)) {
        cli::Fail("ferry-bench", "--max-size takes a size, 4 KiB .. 1 TiB");
        return 64;
      }
    } else if (a.Is("--clients")) {
      if (!a.IntValue(2, kMaxListClients, run.clients)) {
        cli::Fail("ferry-bench", "--clients takes 2.." + std::to_string(kMaxListClients));
        return 64;
      }
    } else if (a.Is("--only") && a.HasValue()) {
      const std::string sections = a.Value();
      only_blocks = sections == "blocks";
      if (!only_blocks && first_other.empty()) first_other = "--only " + sections;
      other = other || !only_blocks;
    } else {
      // --plot comes here as the --csv it writes first (bench_commands.cc).
      if (first_other.empty()) first_other = a.Is("--csv") ? "--csv or --plot" : a.current();
      other = true;
    }
  }
  if (only_blocks && !other) return RunBlocksOnHostBackend(options, run);
  if (only_blocks) {
    std::fprintf(stderr,
                 "ferry-bench: without the CUDA toolkit, transfer --only blocks runs against a ferryd on the host "
                 "backend and prints its table only: it takes --socket, --quick, --max-size and --clients, not %s\n",
                 first_other.c_str());
    return 64;
  }
  std::fprintf(stderr,
               "ferry-bench: transfer measures copies to a GPU: this ferry-bench was built without the CUDA "
               "toolkit (rebuild with it, -DFERRY_CUDA=ON, on a machine with the GPU; --only blocks runs the "
               "block-list copies alone against a ferryd on the host backend)\n");
  return 1;
}

}  // namespace ferry::bench
