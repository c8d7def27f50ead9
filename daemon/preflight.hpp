// What ferryd checks before it starts that needs no GPU: `ferryd --check-config` (the unit's
// ExecStartPre) and every start run the same Preflight, so a config the check passes does not
// then fail to start for any of these reasons.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>

#include "daemon/config.hpp"
#include "policy/policy.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

// A config that passed Preflight, and what the checks found out: what a Server is built from,
// so nothing is validated or loaded twice.
struct CheckedConfig {
  DaemonConfig config;
  std::shared_ptr<const Policy> policy;  // config.policy_path's, or the built-in default
  std::string policy_source;             // where `policy` came from, for the log
  std::optional<gid_t> allowed_gid;      // allowed_group's id; none: owner only
};

// allowed_group exists; the runtime directory is acceptable (CheckRuntimeDir) or can be
// created; metrics.address is host:port; the snapshot key loads (a regular file, mode 0600, a
// ferry secret key) and the snapshot directory is writable or can be created; the policy file
// loads.
Result<CheckedConfig> Preflight(const DaemonConfig& config);

// A runtime directory holds ferryd's socket and lock file; whoever can write to it could plant
// a symbolic link where ferryd creates them (ferryd may run as root). It must be a directory
// (not a symbolic link) owned by ferryd's effective uid and writable by no one else.
Status CheckRuntimeDir(const std::string& dir);

// "host:port" (port 0: any free port); "" (no exporter) passes.
Status CheckMetricsAddress(const std::string& address);

}  // namespace ferry::daemon
