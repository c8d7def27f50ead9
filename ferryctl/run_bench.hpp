// `ferryctl bench ...` and `ferryctl tune ...`: the operator's way into ferry-bench, which runs
// the benchmarks and the tuner (ferryctl links none of their GPU code).
#pragma once

#include <string>
#include <vector>

namespace ferry::ctl {

// Runs `ferry-bench COMMAND --socket SOCKET ARGS...` in this process's place: the ferry-bench
// beside ferryctl's own executable, else the one on PATH. Returns only when it cannot be run
// (said on stderr; exit code 127); otherwise ferry-bench's exit code is ferryctl's.
int RunBench(const std::string& command, const std::vector<std::string>& args, const std::string& socket);

}  // namespace ferry::ctl
