#include "ferryctl/run_bench.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/cli.hpp"
#include "common/process.hpp"

namespace ferry::ctl {

int RunBench(const std::string& command, const std::vector<std::string>& args, const std::string& socket) {
  std::vector<std::string> argv{"ferry-bench", command};
  if (!socket.empty()) argv.insert(argv.end(), {"--socket", socket});
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c;
  for (auto& s : argv) c.push_back(s.data());
  c.push_back(nullptr);
  const std::string beside = ExecutableDir() + "/ferry-bench";
  if (::access(beside.c_str(), X_OK) == 0) {
    ::execv(beside.c_str(), c.data());
    cli::Fail("ferryctl", "cannot run " + beside + ": " + std::strerror(errno));
    return 127;
  }
  ::execvp("ferry-bench", c.data());
  cli::Fail("ferryctl", "`ferryctl " + std::string(command == "tune" ? "tune" : "bench " + command) +
                            "` runs ferry-bench, which is neither beside ferryctl (" + beside +
                            ") nor on PATH; build or install it (the ferry-bench target)");
  return 127;
}

}  // namespace ferry::ctl
