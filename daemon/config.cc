#include "daemon/config.hpp"

#include "common/backend_name.hpp"
#include "common/status_macros.hpp"
#include "common/yaml_util.hpp"

namespace ferry::daemon {
namespace {

Result<DaemonConfig> FromYaml(const YAML::Node& root, const std::string& file) {
  DaemonConfig c;
  if (root.IsNull()) return c;
  FERRY_RETURN_IF_ERROR(yamlutil::CheckKeys(
      file, root,
      {"runtime_dir", "socket", "allowed_group", "backend", "device", "pool", "session_quota", "max_sessions",
       "ring_entries", "spin_us", "spin_max_us", "cpu", "policy", "metrics", "snapshots", "limits", "handoff"}));
  using namespace yamlutil;
  if (auto n = root["runtime_dir"]) { FERRY_ASSIGN_OR_RETURN(c.runtime_dir, GetString(file, n)); }
  if (auto n = root["socket"]) { FERRY_ASSIGN_OR_RETURN(c.socket_name, GetString(file, n)); }
  if (auto n = root["allowed_group"]) { FERRY_ASSIGN_OR_RETURN(c.allowed_group, GetString(file, n)); }
  if (auto n = root["backend"]) {
    FERRY_ASSIGN_OR_RETURN(std::string b, GetString(file, n));
    auto choice = ParseBackendChoice(b);
    if (!choice.ok()) return ErrorAt(file, n, choice.status().message());
    c.backend = *choice;
  }
  if (auto n = root["device"]) { FERRY_ASSIGN_OR_RETURN(c.device, GetInt(file, n, 0, 63)); }
  if (auto pool = root["pool"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, pool, {"size", "slab", "register"}));
    if (auto n = pool["register"]) {
      FERRY_ASSIGN_OR_RETURN(std::string r, GetString(file, n));
      auto mode = ParsePoolRegistration(r);
      if (!mode.ok()) return ErrorAt(file, n, mode.status().message());
      c.pool_registration = *mode;
    }
    if (auto n = pool["size"]) { FERRY_ASSIGN_OR_RETURN(c.pool_bytes, GetSize(file, n, 1ull << 20, 1ull << 40)); }
    if (auto n = pool["slab"]) { FERRY_ASSIGN_OR_RETURN(c.slab_bytes, GetSize(file, n, 64ull << 10, 1ull << 30)); }
  }
  if (auto n = root["session_quota"]) { FERRY_ASSIGN_OR_RETURN(c.session_quota_bytes, GetSize(file, n, 0, 1ull << 40)); }
  if (auto n = root["max_sessions"]) { FERRY_ASSIGN_OR_RETURN(c.max_sessions, GetInt(file, n, 1, 4096)); }
  if (auto l = root["limits"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, l,
                                    {"sessions_per_uid", "pool_per_uid", "regions_per_session", "regions_per_uid",
                                     "events_per_session", "pending_connections", "pending_connections_per_uid",
                                     "hello_timeout_ms", "outbound_messages"}));
    Limits& lim = c.limits;
    if (auto n = l["sessions_per_uid"]) { FERRY_ASSIGN_OR_RETURN(lim.sessions_per_uid, GetInt(file, n, 1, 4096)); }
    if (auto n = l["pool_per_uid"]) { FERRY_ASSIGN_OR_RETURN(lim.pool_bytes_per_uid, GetSize(file, n, 0, 1ull << 40)); }
    if (auto n = l["regions_per_session"]) { FERRY_ASSIGN_OR_RETURN(lim.regions_per_session, GetInt(file, n, 1, 65536)); }
    if (auto n = l["regions_per_uid"]) { FERRY_ASSIGN_OR_RETURN(lim.regions_per_uid, GetInt(file, n, 1, 1 << 20)); }
    if (auto n = l["events_per_session"]) { FERRY_ASSIGN_OR_RETURN(lim.events_per_session, GetInt(file, n, 1, 65536)); }
    if (auto n = l["pending_connections"]) { FERRY_ASSIGN_OR_RETURN(lim.pending_connections, GetInt(file, n, 1, 4096)); }
    if (auto n = l["pending_connections_per_uid"]) {
      FERRY_ASSIGN_OR_RETURN(lim.pending_connections_per_uid, GetInt(file, n, 1, 4096));
    }
    if (auto n = l["hello_timeout_ms"]) { FERRY_ASSIGN_OR_RETURN(lim.hello_timeout_ms, GetInt(file, n, 10, 600000)); }
    if (auto n = l["outbound_messages"]) { FERRY_ASSIGN_OR_RETURN(lim.outbound_messages, GetInt(file, n, 4, 65536)); }
  }
  if (auto n = root["ring_entries"]) { FERRY_ASSIGN_OR_RETURN(c.ring_entries, GetInt(file, n, 8, 65536)); }
  if (auto n = root["spin_us"]) { FERRY_ASSIGN_OR_RETURN(c.spin_us, GetInt(file, n, 0, 1000000)); }
  if (auto n = root["spin_max_us"]) {
    FERRY_ASSIGN_OR_RETURN(c.spin_max_us, GetInt(file, n, 0, 1000000));
  }
  if (auto n = root["cpu"]) { FERRY_ASSIGN_OR_RETURN(c.cpu, GetInt(file, n, -1, 4095)); }
  if (auto n = root["handoff"]) {
    FERRY_ASSIGN_OR_RETURN(std::string h, GetString(file, n));
    if (h != "gpu" && h != "host") {
      return ErrorAt(file, n, "handoff '" + h + "' unknown (expected gpu or host)");
    }
    c.handoff_on_gpu = h == "gpu";
  }
  if (auto n = root["policy"]) { FERRY_ASSIGN_OR_RETURN(c.policy_path, GetString(file, n)); }
  if (auto m = root["metrics"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, m, {"address"}));
    if (auto n = m["address"]) { FERRY_ASSIGN_OR_RETURN(c.metrics_address, GetString(file, n)); }
  }
  if (auto sn = root["snapshots"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, sn, {"dir", "key", "interval_seconds"}));
    if (auto n = sn["dir"]) { FERRY_ASSIGN_OR_RETURN(c.snapshot_dir, GetString(file, n)); }
    if (auto n = sn["key"]) { FERRY_ASSIGN_OR_RETURN(c.snapshot_key, GetString(file, n)); }
    if (auto n = sn["interval_seconds"]) {
      FERRY_ASSIGN_OR_RETURN(double secs, GetDouble(file, n, 0.1, 86400));
      c.snapshot_interval_ms = static_cast<uint64_t>(secs * 1000);
    }
    if (!c.snapshot_dir.empty() && c.snapshot_key.empty()) return ErrorAt(file, sn, "snapshots.dir needs snapshots.key");
  }
  Status v = ValidateConfig(c);
  if (!v.ok()) return v.WithContext(file);
  return c;
}

}  // namespace

Status ValidateConfig(const DaemonConfig& c) {
  if (c.runtime_dir.empty() || c.runtime_dir[0] != '/') return InvalidArgument("runtime_dir must be an absolute path");
  if (c.socket_name.empty() || c.socket_name.find('/') != std::string::npos) {
    return InvalidArgument("socket must be a file name inside runtime_dir");
  }
  if ((c.slab_bytes & (c.slab_bytes - 1)) != 0) return InvalidArgument("pool.slab must be a power of two");
  if (c.slab_bytes % 4096 != 0) return InvalidArgument("pool.slab must be a multiple of 4 KiB");
  if (c.pool_bytes % c.slab_bytes != 0) return InvalidArgument("pool.size must be a multiple of pool.slab");
  if (c.pool_bytes / c.slab_bytes > 65536) return InvalidArgument("pool.size / pool.slab must be at most 65536 slabs");
  if ((c.ring_entries & (c.ring_entries - 1)) != 0) return InvalidArgument("ring_entries must be a power of two");
  if (c.session_quota_bytes > c.pool_bytes) return InvalidArgument("session_quota is larger than the pool");
  if (c.limits.pool_bytes_per_uid > c.pool_bytes) return InvalidArgument("limits.pool_per_uid is larger than the pool");
  if (c.limits.pool_bytes_per_uid != 0 && c.limits.pool_bytes_per_uid < c.slab_bytes) {
    return InvalidArgument("limits.pool_per_uid (" + std::to_string(c.limits.pool_bytes_per_uid) +
                           " bytes) is smaller than one pool.slab (" + std::to_string(c.slab_bytes) +
                           " bytes), so every allocation would fail: set it to 0 (no limit) or at least pool.slab");
  }
  if (c.limits.regions_per_session > c.limits.regions_per_uid) {
    return InvalidArgument("limits.regions_per_session is larger than limits.regions_per_uid");
  }
  if (c.limits.pending_connections_per_uid > c.limits.pending_connections) {
    return InvalidArgument("limits.pending_connections_per_uid is larger than limits.pending_connections");
  }
  if (c.spin_max_us != 0 && c.spin_max_us < c.spin_us) {
    return InvalidArgument("spin_max_us (" + std::to_string(c.spin_max_us) + ") must be 0 or at least spin_us (" +
                           std::to_string(c.spin_us) + ")");
  }
  return Status::Ok();
}

Result<DaemonConfig> ParseConfig(const std::string& text, const std::string& name) {
  FERRY_ASSIGN_OR_RETURN(YAML::Node root, yamlutil::LoadString(text, name));
  return FromYaml(root, name);
}

Result<DaemonConfig> LoadConfig(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(YAML::Node root, yamlutil::LoadFile(path));
  return FromYaml(root, path);
}

Result<PoolRegistration> ParsePoolRegistration(std::string_view text) {
  if (text == "auto") return PoolRegistration::kAuto;
  if (text == "whole") return PoolRegistration::kWhole;
  if (text == "per_slab") return PoolRegistration::kPerSlab;
  return InvalidArgument("pool.register '" + std::string(text) + "' unknown (expected auto, whole or per_slab)");
}

bool RegistersSlabBySlab(const DaemonConfig& c) {
  switch (c.pool_registration) {
    case PoolRegistration::kWhole: return false;
    case PoolRegistration::kPerSlab: return true;
    case PoolRegistration::kAuto: return !c.allowed_group.empty();
  }
  return true;
}

Result<BackendChoice> ParseBackendChoice(std::string_view text) {
  if (text == "auto") return BackendChoice::kAuto;
  if (auto kind = ParseBackendName(text)) return *kind == wire::BackendKind::kCuda ? BackendChoice::kCuda : BackendChoice::kHost;
  return InvalidArgument("backend '" + std::string(text) + "' unknown (expected auto, cuda or host)");
}

std::string_view BackendChoiceName(BackendChoice b) {
  switch (b) {
    case BackendChoice::kAuto: return "auto";
    case BackendChoice::kCuda: return BackendName(wire::BackendKind::kCuda);
    case BackendChoice::kHost: return BackendName(wire::BackendKind::kHost);
  }
  return "?";
}

}  // namespace ferry::daemon
