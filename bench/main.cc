// ferry-bench: ferry's benchmarks and its tuner, one program. `ferryctl bench ...` and
// `ferryctl tune` run it for operators.
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_commands.hpp"
#include "bench/list_clients.hpp"
#include "common/cli.hpp"

namespace {

constexpr const char* kUsage = R"(usage: ferry-bench COMMAND [options]   (COMMAND --help for its options)

commands:
  transfer    pageable vs pinned vs the ferry pool vs ferry staged copies over a size sweep,
              this process against ferryd, side by side (needs the CUDA toolkit and a GPU);
              --plot FILE.svg also plots bandwidth against size
  overlap     the seed workload (matmul + its output's copy) in-process and through ferryd
              under each policy: exposed copy time, nine correctness checks, a signed report
  tune        re-tune the policy on this GPU: sweep settings over the overlap workload and a
              transfer sweep, write the best policy, say what changed since the last tune
  host-copy   how fast this host copies memory (the bound on staged copies; no GPU needed)
  list-client one client process of `transfer --clients N` (it starts them; see its --help)

Each takes --socket PATH (ferryd's control socket; default $FERRY_SOCKET or
/run/ferry/ferryd.sock). ferryctl runs them as `ferryctl bench transfer|overlap` and
`ferryctl tune`.
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 64;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "-h" || command == "--help") return cli::Help(kUsage);
  if (command == "transfer") return bench::BenchTransfer(args);
  if (command == "overlap") return bench::BenchOverlap(args);
  if (command == "tune") return bench::Tune(args);
  if (command == "host-copy") return bench::HostCopy(args);
  if (command == "list-client") return bench::RunListClient(args);
  std::fprintf(stderr, "ferry-bench: unknown command '%s' (try --help)\n", command.c_str());
  return 64;
}
