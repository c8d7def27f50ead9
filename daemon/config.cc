#include "daemon/config.hpp"

#include <algorithm>

#include "common/backend_name.hpp"
#include "common/status_macros.hpp"
#include "common/yaml_util.hpp"
#include "daemon/backend.hpp"

namespace ferry::daemon {
namespace {

Result<DaemonConfig> FromYaml(const YAML::Node& root, const std::string& file) {
  DaemonConfig c;
  if (root.IsNull()) return c;
  FERRY_RETURN_IF_ERROR(yamlutil::CheckKeys(
      file, root, {"runtime_dir", "socket",        "allowed_group", "backend",      "device",  "devices",      "host",
                   "pool",        "session_quota", "max_sessions",  "ring_entries", "spin_us", "spin_max_us",  "cpu",
                   "policy",      "metrics",       "snapshots",     "limits",       "handoff", "issue_threads"}));
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
  if (auto n = root["device"]) {  // before devices: one GPU, by ordinal
    if (root["devices"]) return ErrorAt(file, n, "device and devices both set: keep devices (a list of GPUs)");
    FERRY_ASSIGN_OR_RETURN(int ordinal, GetInt(file, n, 0, 63));
    c.devices = {std::to_string(ordinal)};
  }
  if (auto n = root["devices"]) {
    if (n.IsScalar()) {
      FERRY_ASSIGN_OR_RETURN(std::string text, GetString(file, n));
      auto list = ParseDeviceList(text);
      if (!list.ok()) return ErrorAt(file, n, list.status().message());
      c.devices = *list;
    } else if (n.IsSequence()) {
      for (const auto& item : n) {
        FERRY_ASSIGN_OR_RETURN(std::string text, GetString(file, item));
        auto one = ParseDeviceList(text);
        if (!one.ok() || one->size() != 1) {
          return ErrorAt(file, item, "'" + text + "' is not a GPU (a CUDA ordinal like 0, or a UUID like GPU-...)");
        }
        if (std::find(c.devices.begin(), c.devices.end(), one->front()) != c.devices.end()) {
          return ErrorAt(file, item, "GPU " + text + " named twice");
        }
        c.devices.push_back(one->front());
      }
      if (c.devices.empty()) return ErrorAt(file, n, "devices is an empty list (all: every GPU ferryd sees)");
    } else {
      return ErrorAt(file, n, "devices takes all or a list of CUDA ordinals and GPU UUIDs");
    }
  }
  if (auto h = root["host"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, h, {"gpus", "numa_nodes", "gpu_memory", "copy_rate", "slow"}));
    if (auto n = h["gpus"]) { FERRY_ASSIGN_OR_RETURN(c.host_gpus, GetInt(file, n, 1, 16)); }
    if (auto n = h["numa_nodes"]) { FERRY_ASSIGN_OR_RETURN(c.host_numa_nodes, GetInt(file, n, 1, 8)); }
    if (auto n = h["gpu_memory"]) {
      FERRY_ASSIGN_OR_RETURN(c.host_gpu_memory_bytes, GetSize(file, n, 1ull << 20, 1ull << 44));
    }
    if (auto n = h["copy_rate"]) {
      FERRY_ASSIGN_OR_RETURN(c.host_link.bytes_per_second, GetSize(file, n, 1ull << 10, 1ull << 40));
    }
    if (auto slow = h["slow"]) {
      FERRY_RETURN_IF_ERROR(CheckKeys(file, slow, {"when", "factor"}));
      if (!h["copy_rate"]) return ErrorAt(file, slow, "host.slow needs host.copy_rate: it slows copies on that link");
      auto when = slow["when"];
      if (!when || !when.IsMap() || when.size() == 0) {
        return ErrorAt(file, slow, "host.slow.when takes policy settings, e.g. {streams.bulk_priority: least}");
      }
      for (const auto& kv : when) {
        FERRY_ASSIGN_OR_RETURN(std::string key, GetString(file, kv.first));
        FERRY_ASSIGN_OR_RETURN(std::string value, GetString(file, kv.second));
        if (Status st = CheckPolicySettingKey(key); !st.ok()) return ErrorAt(file, kv.first, st.message());
        c.host_link.slow_when.emplace_back(key, value);
      }
      if (!slow["factor"]) return ErrorAt(file, slow, "host.slow needs a factor (1.2: 20% slower)");
      FERRY_ASSIGN_OR_RETURN(c.host_link.slow_factor, GetDouble(file, slow["factor"], 0.01, 100));
    }
  }
  if (auto pool = root["pool"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, pool, {"size", "slab", "register", "huge_pages"}));
    if (auto n = pool["huge_pages"]) {
      FERRY_ASSIGN_OR_RETURN(std::string v, GetString(file, n));
      auto pages = ParsePoolPages(v);
      if (!pages.ok()) return ErrorAt(file, n, pages.status().message());
      c.pool_pages = *pages;
    }
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
                                     "events_per_session", "buffers_per_session", "pending_connections",
                                     "pending_connections_per_uid", "hello_timeout_ms", "outbound_messages"}));
    Limits& lim = c.limits;
    if (auto n = l["sessions_per_uid"]) { FERRY_ASSIGN_OR_RETURN(lim.sessions_per_uid, GetInt(file, n, 1, 4096)); }
    if (auto n = l["pool_per_uid"]) { FERRY_ASSIGN_OR_RETURN(lim.pool_bytes_per_uid, GetSize(file, n, 0, 1ull << 40)); }
    if (auto n = l["regions_per_session"]) { FERRY_ASSIGN_OR_RETURN(lim.regions_per_session, GetInt(file, n, 1, 65536)); }
    if (auto n = l["regions_per_uid"]) { FERRY_ASSIGN_OR_RETURN(lim.regions_per_uid, GetInt(file, n, 1, 1 << 20)); }
    if (auto n = l["events_per_session"]) { FERRY_ASSIGN_OR_RETURN(lim.events_per_session, GetInt(file, n, 1, 65536)); }
    if (auto n = l["buffers_per_session"]) {
      FERRY_ASSIGN_OR_RETURN(lim.buffers_per_session, GetInt(file, n, 1, 1 << 20));
    }
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
  if (auto n = root["issue_threads"]) {
    FERRY_ASSIGN_OR_RETURN(c.issue_threads, GetInt(file, n, 1, static_cast<int64_t>(kMaxIssueThreads)));
  }
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
    FERRY_RETURN_IF_ERROR(CheckKeys(file, sn, {"dir", "key", "interval_seconds", "host_id"}));
    if (auto n = sn["dir"]) { FERRY_ASSIGN_OR_RETURN(c.snapshot_dir, GetString(file, n)); }
    if (auto n = sn["key"]) { FERRY_ASSIGN_OR_RETURN(c.snapshot_key, GetString(file, n)); }
    if (auto n = sn["host_id"]) { FERRY_ASSIGN_OR_RETURN(c.snapshot_host_id, GetString(file, n)); }
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

Result<std::vector<std::string>> ParseDeviceList(std::string_view text) {
  std::vector<std::string> out;
  if (text.empty() || text == "all") return out;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string item(text.substr(begin, end - begin));
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    const bool ordinal = !item.empty() && item.size() <= 2 && item.find_first_not_of("0123456789") == std::string::npos;
    const bool uuid = item.size() > 4 && item.compare(0, 4, "GPU-") == 0 &&
                      item.find_first_not_of("0123456789abcdefABCDEF-", 4) == std::string::npos;
    if (!ordinal && !uuid) {
      return InvalidArgument("'" + item + "' is not a GPU: devices are all, or CUDA ordinals (0, 1) and UUIDs (GPU-...)");
    }
    if (ordinal) item = std::to_string(std::stoi(item));  // "00" is GPU 0
    if (std::find(out.begin(), out.end(), item) != out.end()) return InvalidArgument("GPU " + item + " named twice");
    out.push_back(item);
    begin = end + 1;
  }
  if (out.size() > 16) return InvalidArgument("at most 16 GPUs");
  return out;
}

std::string DeviceListText(const std::vector<std::string>& devices) {
  if (devices.empty()) return "all";
  std::string s;
  for (const auto& d : devices) s += (s.empty() ? "" : ",") + d;
  return s;
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

Result<PoolPages> ParsePoolPages(std::string_view text) {
  if (text == "transparent") return PoolPages::kTransparent;
  if (text == "hugetlb") return PoolPages::kHugetlb;
  return InvalidArgument("pool.huge_pages '" + std::string(text) + "' unknown (expected transparent or hugetlb)");
}

std::string_view PoolPagesName(PoolPages pages) { return pages == PoolPages::kHugetlb ? "hugetlb" : "transparent"; }

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
