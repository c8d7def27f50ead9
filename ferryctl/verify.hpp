// `ferryctl verify`: checks signed snapshot records (each signature, record id, key and the
// hash chain between them) and signed reports (bench overlap, tune).
#pragma once

#include <string>
#include <vector>

namespace ferry::ctl {

// The arguments after "verify"; returns the exit code (1 with the reason on the first failure).
int Verify(const std::vector<std::string>& args);

}  // namespace ferry::ctl
