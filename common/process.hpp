// Running other programs from ferry's command-line tools.
#pragma once

#include <string>
#include <vector>

namespace ferry {

// The directory this process's executable is in ("." when it cannot be told).
std::string ExecutableDir();

// Runs argv[0] (searched on PATH when it has no '/') with these arguments and waits: its exit
// code, 128 + the signal that ended it, or 127 when it could not be started (said on stderr,
// after `prefix: `).
int RunProgram(const std::vector<std::string>& argv, const std::string& prefix);

}  // namespace ferry
