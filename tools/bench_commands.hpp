// The benchmark and tuning commands of ferryctl.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/status.hpp"
#include "tools/overlap.hpp"

namespace ferry::tools {

int BenchOverlap(const std::vector<std::string>& args, const std::string& socket);
int BenchTransfer(const std::vector<std::string>& args, const std::string& socket);
int Tune(const std::vector<std::string>& args, const std::string& socket);

// Where the shipped policies are: $FERRY_POLICY_DIR, /etc/ferry/policies, the installed ones,
// ../policies beside the binary, ./policies.
std::string DefaultPolicyDir();
// "a.yaml,dir,..." into policy files (a directory: its *.yaml, sorted).
Result<std::vector<std::string>> ExpandPolicies(const std::string& spec);
// auto: the engine matching ferryd's backend; n = 0: the default size for it.
Result<std::unique_ptr<overlap::StepEngine>> MakeEngine(const std::string& which, const std::string& socket, int n);
// Writes PATH.minisig for `data` (the file's contents), minisign format, trusted comment
// "ferry report KIND RECORD-ID".
Status SignFile(const std::string& path, const std::string& data, const std::string& key_path, const std::string& kind);

}  // namespace ferry::tools
