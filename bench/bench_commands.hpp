// ferry-bench's commands (ferryctl's `bench ...` and `tune` run them), and what they share.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/status.hpp"
#include "bench/overlap.hpp"

namespace ferry::bench {

// Each takes the arguments after the command's name and returns the exit code.
int BenchOverlap(const std::vector<std::string>& args);
int BenchTransfer(const std::vector<std::string>& args);  // the sweep, then --plot
int Tune(const std::vector<std::string>& args);
int HostCopy(const std::vector<std::string>& args);
// The transfer sweep itself (bench/transfer.cc; without CUDA, a message that it needs it).
int RunTransferSweep(const std::vector<std::string>& args);

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

}  // namespace ferry::bench
