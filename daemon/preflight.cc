#include "daemon/preflight.hpp"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/signing.hpp"
#include "daemon/pinned_pool.hpp"
#include "common/status_macros.hpp"

namespace ferry::daemon {
namespace {

// The nearest ancestor of `path` that exists (for a directory ferryd would create).
std::string ExistingAncestor(std::string path) {
  struct stat st {};
  while (!path.empty() && ::stat(path.c_str(), &st) != 0) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return path;
}

// A directory ferryd writes into, or one it can create.
Status CheckWritableDir(const std::string& dir, const std::string& what) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return InvalidArgument(what + " " + dir + " is not a directory");
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      return ErrnoStatus(what + " " + dir + " is not writable by ferryd's user (uid " + std::to_string(::geteuid()) + ")",
                         errno);
    }
    return Status::Ok();
  }
  if (errno != ENOENT) return ErrnoStatus("stat " + what + " " + dir, errno);
  const std::string parent = ExistingAncestor(dir);
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    return ErrnoStatus(what + " " + dir + " does not exist and ferryd's user (uid " + std::to_string(::geteuid()) +
                           ") cannot create it in " + parent,
                       errno);
  }
  return Status::Ok();
}

}  // namespace

Status CheckRuntimeDir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return ErrnoStatus("runtime_dir " + dir, errno);
  if (S_ISLNK(st.st_mode)) {
    return InvalidArgument("runtime_dir " + dir + " is a symbolic link; point runtime_dir at the directory itself");
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("runtime_dir " + dir + " is not a directory");
  if (st.st_uid != ::geteuid()) {
    return PermissionDenied("runtime_dir " + dir + " is owned by uid " + std::to_string(st.st_uid) +
                            ", not by ferryd's user (uid " + std::to_string(::geteuid()) +
                            "); give ferryd a directory of its own (systemd: RuntimeDirectory=)");
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    return PermissionDenied("runtime_dir " + dir + " is mode " + mode +
                            ": others can write to it and plant links where ferryd creates its files; "
                            "chmod go-w it, or give ferryd a directory of its own");
  }
  return Status::Ok();
}

Status CheckMetricsAddress(const std::string& address) {
  if (address.empty()) return Status::Ok();
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("metrics.address '" + address + "' " + why +
                           " (expected host:port such as 127.0.0.1:9477, port 0 for any free port, or \"\" for no exporter)");
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return bad("has no port");
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (host.empty()) return bad("has no host");
  if (host.front() == '[' ? host.back() != ']' : host.find_first_of(":[] \t") != std::string::npos) {
    return bad("has a malformed host");
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) > 65535) {
    return bad("has no valid port (0 to 65535)");
  }
  return Status::Ok();
}

Result<CheckedConfig> Preflight(const DaemonConfig& config) {
  FERRY_RETURN_IF_ERROR(ValidateConfig(config).WithContext("invalid config"));
  CheckedConfig checked;
  checked.config = config;
  if (!config.allowed_group.empty()) {
    const group* g = ::getgrnam(config.allowed_group.c_str());
    if (g == nullptr) {
      return NotFound("allowed_group '" + config.allowed_group +
                      "' does not exist (create it, or leave allowed_group unset to allow only ferryd's own user)");
    }
    checked.allowed_gid = g->gr_gid;
  }
  if (::access(config.runtime_dir.c_str(), F_OK) == 0) {
    FERRY_RETURN_IF_ERROR(CheckRuntimeDir(config.runtime_dir));
  } else {
    FERRY_RETURN_IF_ERROR(CheckWritableDir(config.runtime_dir, "runtime_dir"));
  }
  FERRY_RETURN_IF_ERROR(CheckMetricsAddress(config.metrics_address));
  if (config.pool_pages == PoolPages::kHugetlb) FERRY_RETURN_IF_ERROR(CheckHugetlbPool(config.slab_bytes, config.pool_bytes));
  if (!config.snapshot_dir.empty()) {
    signing::SecretKey key;
    FERRY_RETURN_IF_ERROR(signing::LoadSecretKey(config.snapshot_key, key).WithContext("snapshots.key"));
    FERRY_RETURN_IF_ERROR(CheckWritableDir(config.snapshot_dir, "snapshots.dir"));
  }
  if (config.policy_path.empty()) {
    checked.policy = std::make_shared<const Policy>();
    checked.policy_source = "built-in default";
  } else {
    FERRY_ASSIGN_OR_RETURN(checked.policy, LoadPolicyFile(config.policy_path));
    checked.policy_source = config.policy_path;
  }
  return checked;
}

}  // namespace ferry::daemon
