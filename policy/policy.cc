#include "policy/policy.hpp"

#include <fnmatch.h>
#include <sodium.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "common/status_macros.hpp"
#include "common/yaml_util.hpp"

namespace ferry::policy {
namespace {

using namespace yamlutil;

std::string SizeText(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && n >= 1024 && n % 1024 == 0) {
    n /= 1024;
    ++u;
  }
  return std::to_string(n) + units[u];
}

const char* PriorityName(StreamPriority p) { return p == StreamPriority::kGreatest ? "greatest" : "least"; }

Result<StreamPriority> GetPriority(const std::string& file, const YAML::Node& n) {
  FERRY_ASSIGN_OR_RETURN(std::string v, GetString(file, n));
  if (v == "greatest") return StreamPriority::kGreatest;
  if (v == "least") return StreamPriority::kLeast;
  return ErrorAt(file, n, "priority '" + v + "' unknown (expected greatest or least)");
}

// Names reach ferryd's log and metric labels: printable text only, so that a name cannot forge
// a log line.
Result<std::string> GetName(const std::string& file, const YAML::Node& n, const char* what) {
  FERRY_ASSIGN_OR_RETURN(std::string v, GetString(file, n));
  for (size_t i = 0; i < v.size(); ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c < 0x20 || c == 0x7f) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", c);
      return ErrorAt(file, n, std::string(what) + " has a control character (byte " + byte + " at offset " +
                                  std::to_string(i) + "); names are printable text on one line");
    }
  }
  return v;
}

// Every setting but the GPU overrides.
Result<std::shared_ptr<Policy>> SettingsFromYaml(const YAML::Node& root, const std::string& file) {
  auto p = std::make_shared<Policy>();
  if (!root.IsMap()) return ErrorAt(file, root, "a policy is a map of settings");
  FERRY_RETURN_IF_ERROR(CheckKeys(file, root, {"name", "description", "schedule", "streams", "limits", "batching",
                                               "staging", "classes", "clients", "default_class", "gpus"}));
  if (auto n = root["name"]) { FERRY_ASSIGN_OR_RETURN(p->name, GetName(file, n, "name")); }
  if (auto n = root["description"]) { FERRY_ASSIGN_OR_RETURN(p->description, GetString(file, n)); }
  if (auto s = root["schedule"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, s, {"kind", "chunk_size", "first_chunk", "ratio", "min_chunk"}));
    auto kind = s["kind"];
    if (!kind) return ErrorAt(file, s, "schedule needs a kind (serial, side-stream, chunked or geometric)");
    FERRY_ASSIGN_OR_RETURN(std::string k, GetString(file, kind));
    if (k == "serial") p->schedule = Schedule::kSerial;
    else if (k == "side-stream") p->schedule = Schedule::kSideStream;
    else if (k == "chunked") p->schedule = Schedule::kChunked;
    else if (k == "geometric") p->schedule = Schedule::kGeometric;
    else return ErrorAt(file, kind, "schedule kind '" + k + "' unknown (expected serial, side-stream, chunked or geometric)");
    auto only_for = [&](const char* key, Schedule want, const char* kind_name) -> Status {
      if (s[key] && p->schedule != want) return ErrorAt(file, s[key], std::string(key) + " applies to kind " + kind_name + " only");
      return Status::Ok();
    };
    FERRY_RETURN_IF_ERROR(only_for("chunk_size", Schedule::kChunked, "chunked"));
    FERRY_RETURN_IF_ERROR(only_for("first_chunk", Schedule::kGeometric, "geometric"));
    FERRY_RETURN_IF_ERROR(only_for("ratio", Schedule::kGeometric, "geometric"));
    FERRY_RETURN_IF_ERROR(only_for("min_chunk", Schedule::kGeometric, "geometric"));
    if (auto n = s["chunk_size"]) { FERRY_ASSIGN_OR_RETURN(p->chunk_bytes, GetSize(file, n, 64 << 10, 1ull << 32)); }
    if (auto n = s["first_chunk"]) { FERRY_ASSIGN_OR_RETURN(p->first_chunk_bytes, GetSize(file, n, 64 << 10, 1ull << 32)); }
    if (auto n = s["ratio"]) { FERRY_ASSIGN_OR_RETURN(p->ratio, GetDouble(file, n, 0.05, 0.95)); }
    if (auto n = s["min_chunk"]) { FERRY_ASSIGN_OR_RETURN(p->min_chunk_bytes, GetSize(file, n, 64 << 10, 1ull << 32)); }
  }
  if (p->schedule == Schedule::kSerial) {
    p->bulk_streams = 1;
    p->max_copies_in_flight = 1;
  }
  if (p->schedule == Schedule::kSideStream) p->bulk_streams = 1;
  if (auto s = root["streams"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, s, {"per_direction", "bulk_priority"}));
    if (auto n = s["per_direction"]) {
      if (p->schedule == Schedule::kSerial) return ErrorAt(file, n, "a serial schedule uses one stream");
      FERRY_ASSIGN_OR_RETURN(p->bulk_streams, GetInt(file, n, 1, kMaxBulkStreams));
    }
    if (auto n = s["bulk_priority"]) { FERRY_ASSIGN_OR_RETURN(p->bulk_priority, GetPriority(file, n)); }
  }
  if (auto l = root["limits"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, l, {"in_flight_bytes", "client_in_flight_bytes", "copies_in_flight",
                                              "latency_max_bytes"}));
    if (auto n = l["in_flight_bytes"]) { FERRY_ASSIGN_OR_RETURN(p->in_flight_bytes, GetSize(file, n, 64 << 10, 1ull << 40)); }
    if (auto n = l["client_in_flight_bytes"]) {
      FERRY_ASSIGN_OR_RETURN(p->client_in_flight_bytes, GetSize(file, n, 64 << 10, 1ull << 40));
    }
    if (auto n = l["copies_in_flight"]) {
      if (p->schedule == Schedule::kSerial) return ErrorAt(file, n, "a serial schedule runs one copy at a time");
      FERRY_ASSIGN_OR_RETURN(p->max_copies_in_flight, GetInt(file, n, 0, 1 << 20));
    }
    if (auto n = l["latency_max_bytes"]) { FERRY_ASSIGN_OR_RETURN(p->latency_max_bytes, GetSize(file, n, 0, 1ull << 30)); }
  }
  if (auto b = root["batching"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, b, {"threshold", "join"}));
    if (auto n = b["threshold"]) { FERRY_ASSIGN_OR_RETURN(p->batch_threshold_bytes, GetSize(file, n, 0, 1ull << 32)); }
    if (auto n = b["join"]) {
      FERRY_ASSIGN_OR_RETURN(p->join_bytes, GetSize(file, n, 0, 1ull << 32));
    }
  }
  if (auto st = root["staging"]) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, st, {"chunk_size", "threads", "buffers"}));
    if (auto n = st["chunk_size"]) { FERRY_ASSIGN_OR_RETURN(p->staging_chunk_bytes, GetSize(file, n, 64 << 10, 256ull << 20)); }
    if (auto n = st["threads"]) { FERRY_ASSIGN_OR_RETURN(p->staging_threads, GetInt(file, n, 1, 64)); }
    if (auto n = st["buffers"]) {
      FERRY_ASSIGN_OR_RETURN(p->staging_buffers, GetInt(file, n, 1, 256));
    }
  }
  if (auto cl = root["classes"]) {
    if (!cl.IsSequence() || cl.size() == 0) return ErrorAt(file, cl, "classes is a non-empty list");
    p->classes.clear();
    std::set<std::string> seen;
    for (const auto& c : cl) {
      FERRY_RETURN_IF_ERROR(CheckKeys(file, c, {"name", "weight", "latency"}));
      ClientClass k;
      if (!c["name"]) return ErrorAt(file, c, "a class needs a name");
      FERRY_ASSIGN_OR_RETURN(k.name, GetName(file, c["name"], "a class name"));
      if (!seen.insert(k.name).second) return ErrorAt(file, c["name"], "class '" + k.name + "' defined twice");
      if (auto n = c["weight"]) { FERRY_ASSIGN_OR_RETURN(k.weight, GetInt(file, n, 1, 1000)); }
      if (auto n = c["latency"]) { FERRY_ASSIGN_OR_RETURN(k.latency_allowed, GetBool(file, n)); }
      p->classes.push_back(k);
    }
    p->default_class = p->classes.front().name;
  }
  if (auto n = root["default_class"]) { FERRY_ASSIGN_OR_RETURN(p->default_class, GetName(file, n, "default_class")); }
  auto has_class = [&](const std::string& name) {
    return std::any_of(p->classes.begin(), p->classes.end(), [&](const ClientClass& c) { return c.name == name; });
  };
  if (!has_class(p->default_class)) {
    return ErrorAt(file, root["default_class"] ? root["default_class"] : root, "default_class '" + p->default_class + "' is not a defined class");
  }
  if (auto cs = root["clients"]) {
    if (!cs.IsSequence()) return ErrorAt(file, cs, "clients is a list of {name, uid, class} rules");
    for (const auto& c : cs) {
      FERRY_RETURN_IF_ERROR(CheckKeys(file, c, {"name", "uid", "class"}));
      ClientRule r;
      r.name_glob = "*";
      if (auto n = c["name"]) { FERRY_ASSIGN_OR_RETURN(r.name_glob, GetName(file, n, "a client name pattern")); }
      if (auto n = c["uid"]) { FERRY_ASSIGN_OR_RETURN(r.uid, GetInt(file, n, 0, 4294967294)); }
      if (!c["class"]) return ErrorAt(file, c, "a client rule needs a class");
      FERRY_ASSIGN_OR_RETURN(r.class_name, GetName(file, c["class"], "a class name"));
      if (!has_class(r.class_name)) return ErrorAt(file, c["class"], "class '" + r.class_name + "' is not defined in classes");
      p->clients.push_back(r);
    }
  }
  if (p->client_in_flight_bytes > p->in_flight_bytes) {
    return ErrorAt(file, root["limits"]["client_in_flight_bytes"], "client_in_flight_bytes is above in_flight_bytes");
  }
  if (p->schedule == Schedule::kGeometric && p->first_chunk_bytes != 0 && p->first_chunk_bytes < p->min_chunk_bytes) {
    return ErrorAt(file, root["schedule"]["first_chunk"], "first_chunk is below min_chunk");
  }
  return p;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// An override's policy is parsed from the file with the override's sections put over the
// file's own: `schedule` replaces the file's schedule whole (its keys depend on its kind), the
// keys of `streams`, `limits` and `batching` replace the same keys. Parsed as one file, every
// rule of a policy holds for it; its nodes keep their lines for errors.
YAML::Node OverriddenYaml(const YAML::Node& root, const YAML::Node& over) {
  YAML::Node merged(YAML::NodeType::Map);
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it->first.Scalar() != "gpus") merged[it->first.Scalar()] = it->second;
  }
  if (over["schedule"]) merged["schedule"] = over["schedule"];
  // A serial schedule sets its streams and copies in flight itself: the file's are not its own.
  const bool serial = over["schedule"] && over["schedule"].IsMap() && over["schedule"]["kind"] &&
                      over["schedule"]["kind"].IsScalar() && over["schedule"]["kind"].Scalar() == "serial";
  for (const char* section : {"streams", "limits", "batching"}) {
    const YAML::Node mine = over[section];
    const YAML::Node base = root[section];
    if (!mine && !(serial && base)) continue;
    YAML::Node keys(YAML::NodeType::Map);
    if (base && base.IsMap()) {
      for (auto it = base.begin(); it != base.end(); ++it) {
        const std::string key = it->first.Scalar();
        if (!serial || (key != "per_direction" && key != "copies_in_flight")) keys[key] = it->second;
      }
    }
    if (!mine) {
      merged[section] = keys;
      continue;
    }
    for (auto it = mine.begin(); it != mine.end(); ++it) keys[it->first.Scalar()] = it->second;
    merged[section] = keys;
  }
  return merged;
}

Status GpuOverridesFromYaml(const YAML::Node& root, const std::string& file, Policy& p) {
  const YAML::Node list = root["gpus"];
  if (!list.IsSequence() || list.size() == 0) {
    return ErrorAt(file, list, "gpus is a list of overrides, each a match (the GPUs' ordinals or UUIDs) and the "
                               "schedule, streams, limits or batching they change");
  }
  std::set<std::string> named;
  for (const YAML::Node& o : list) {
    FERRY_RETURN_IF_ERROR(CheckKeys(file, o, {"match", "schedule", "streams", "limits", "batching"}));
    const YAML::Node match = o["match"];
    if (!match) return ErrorAt(file, o, "an override needs match: the GPUs it is for (ordinals or UUIDs)");
    std::vector<YAML::Node> selectors;
    if (match.IsSequence()) {
      for (const YAML::Node& m : match) selectors.push_back(m);
    } else {
      selectors.push_back(match);
    }
    if (selectors.empty()) return ErrorAt(file, match, "match names no GPU");
    GpuOverride over;
    for (const YAML::Node& m : selectors) {
      if (!m.IsScalar()) return ErrorAt(file, m, "expected a GPU's ordinal or UUID");
      const std::string text = m.Scalar();
      std::string key;
      if (!text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        FERRY_ASSIGN_OR_RETURN(int64_t ordinal, GetInt(file, m, 0, 1023));
        over.ordinals.push_back(static_cast<int>(ordinal));
        key = std::to_string(ordinal);
      } else {
        key = Lower(text);
        if (key.rfind("gpu-", 0) != 0 && key.rfind("mig-", 0) != 0 && key.rfind("host-gpu-", 0) != 0) {
          return ErrorAt(file, m, "'" + text + "' is neither a GPU ordinal nor a GPU UUID (GPU-...)");
        }
        over.uuids.push_back(key);
      }
      if (!named.insert(key).second) return ErrorAt(file, m, "GPU " + text + " is named by another override too");
    }
    if (!o["schedule"] && !o["streams"] && !o["limits"] && !o["batching"]) {
      return ErrorAt(file, o, "the override changes nothing (give it schedule, streams, limits or batching)");
    }
    for (const char* section : {"streams", "limits", "batching"}) {
      if (o[section] && !o[section].IsMap()) return ErrorAt(file, o[section], "expected a mapping");
    }
    auto parsed = SettingsFromYaml(OverriddenYaml(root, o), file);
    if (!parsed.ok()) {
      return InvalidArgument(parsed.status().message() + " (in the override for GPU " + over.MatchText() + ")");
    }
    over.policy = std::move(*parsed);
    p.gpu_overrides.push_back(std::move(over));
  }
  return Status::Ok();
}

Result<std::shared_ptr<const Policy>> FromYaml(const YAML::Node& root, const std::string& file) {
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Policy> p, SettingsFromYaml(root, file));
  if (root["gpus"]) FERRY_RETURN_IF_ERROR(GpuOverridesFromYaml(root, file, *p));
  return std::shared_ptr<const Policy>(std::move(p));
}


}  // namespace

std::string_view ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kSerial: return "serial";
    case Schedule::kSideStream: return "side-stream";
    case Schedule::kChunked: return "chunked";
    case Schedule::kGeometric: return "geometric";
  }
  return "?";
}

std::map<std::string, std::string> CanonicalSettings(const Policy& p) {
  std::map<std::string, std::string> kv;
  kv["name"] = p.name;
  kv["schedule.kind"] = ScheduleName(p.schedule);
  if (p.schedule == Schedule::kChunked) kv["schedule.chunk_size"] = SizeText(p.chunk_bytes);
  if (p.schedule == Schedule::kGeometric) {
    kv["schedule.first_chunk"] = p.first_chunk_bytes ? SizeText(p.first_chunk_bytes) : "auto";
    char r[32];
    std::snprintf(r, sizeof r, "%g", p.ratio);
    kv["schedule.ratio"] = r;
    kv["schedule.min_chunk"] = SizeText(p.min_chunk_bytes);
  }
  kv["streams.per_direction"] = std::to_string(p.bulk_streams);
  kv["streams.bulk_priority"] = PriorityName(p.bulk_priority);
  kv["limits.in_flight_bytes"] = SizeText(p.in_flight_bytes);
  kv["limits.client_in_flight_bytes"] = SizeText(p.client_in_flight_bytes ? p.client_in_flight_bytes : p.in_flight_bytes);
  kv["limits.copies_in_flight"] = p.max_copies_in_flight ? std::to_string(p.max_copies_in_flight) : "unlimited";
  kv["limits.latency_max_bytes"] = SizeText(p.latency_max_bytes);
  kv["batching.threshold"] = SizeText(p.batch_threshold_bytes);
  kv["batching.join"] = SizeText(p.join_bytes);
  kv["staging.chunk_size"] = SizeText(p.staging_chunk_bytes);
  kv["staging.threads"] = std::to_string(p.staging_threads);
  kv["staging.buffers"] = std::to_string(p.staging_buffers);
  for (const ClientClass& c : p.classes) {
    kv["classes." + c.name] = "weight " + std::to_string(c.weight) + ", latency " + (c.latency_allowed ? "yes" : "no");
  }
  kv["default_class"] = p.default_class;
  for (size_t i = 0; i < p.clients.size(); ++i) {
    char key[32];
    std::snprintf(key, sizeof key, "clients.%03zu", i);
    kv[key] = "name " + p.clients[i].name_glob + (p.clients[i].uid >= 0 ? ", uid " + std::to_string(p.clients[i].uid) : "") +
              " -> " + p.clients[i].class_name;
  }
  return kv;
}

namespace {

// Each setting of `over` that differs from the node's (`node`: CanonicalSettings of the node's
// policy): key -> {the node's value, or "(unset)"; the override's}.
std::map<std::string, std::pair<std::string, std::string>> ChangedSettings(
    const std::map<std::string, std::string>& node, const Policy& over) {
  std::map<std::string, std::pair<std::string, std::string>> changed;
  for (auto& [k, v] : CanonicalSettings(over)) {
    auto it = node.find(k);
    if (it == node.end() || it->second != v) changed[k] = {it == node.end() ? "(unset)" : it->second, std::move(v)};
  }
  return changed;
}

}  // namespace

std::vector<std::string> GpuOverride::Changes(const Policy& node) const {
  std::vector<std::string> out;
  for (const auto& [k, change] : ChangedSettings(CanonicalSettings(node), *policy)) {
    out.push_back(k + ": " + change.first + " -> " + change.second);
  }
  return out;
}

// An override's lines: what it matches, and each setting of its policy that differs.
std::string Policy::Canonical() const {
  std::map<std::string, std::string> kv = CanonicalSettings(*this);
  const std::map<std::string, std::string> own = kv;
  for (size_t i = 0; i < gpu_overrides.size(); ++i) {
    char prefix[32];
    std::snprintf(prefix, sizeof prefix, "gpus.%03zu.", i);
    kv[std::string(prefix) + "match"] = gpu_overrides[i].MatchText();
    for (const auto& [k, change] : ChangedSettings(own, *gpu_overrides[i].policy)) kv[prefix + k] = change.second;
  }
  std::ostringstream out;
  for (const auto& [k, v] : kv) out << k << ": " << v << "\n";
  return out.str();
}

namespace {

// The settings a GPU override may change, as YAML at `ind`.
void EngineYaml(std::ostringstream& y, const Policy& p, const std::string& ind) {
  y << ind << "schedule:\n" << ind << "  kind: " << ScheduleName(p.schedule) << "\n";
  if (p.schedule == Schedule::kChunked) y << ind << "  chunk_size: " << SizeText(p.chunk_bytes) << "\n";
  if (p.schedule == Schedule::kGeometric) {
    char r[32];
    std::snprintf(r, sizeof r, "%.17g", p.ratio);
    y << ind << "  ratio: " << r << "\n" << ind << "  min_chunk: " << SizeText(p.min_chunk_bytes) << "\n";
    if (p.first_chunk_bytes) y << ind << "  first_chunk: " << SizeText(p.first_chunk_bytes) << "\n";
  }
  y << ind << "streams:\n";
  if (p.schedule != Schedule::kSerial) y << ind << "  per_direction: " << p.bulk_streams << "\n";
  y << ind << "  bulk_priority: " << PriorityName(p.bulk_priority) << "\n";
  y << ind << "limits:\n" << ind << "  in_flight_bytes: " << SizeText(p.in_flight_bytes) << "\n";
  y << ind << "  client_in_flight_bytes: " << SizeText(p.client_in_flight_bytes ? p.client_in_flight_bytes : p.in_flight_bytes) << "\n";
  if (p.schedule != Schedule::kSerial) y << ind << "  copies_in_flight: " << p.max_copies_in_flight << "\n";
  y << ind << "  latency_max_bytes: " << SizeText(p.latency_max_bytes) << "\n";
  y << ind << "batching:\n" << ind << "  threshold: " << SizeText(p.batch_threshold_bytes) << "\n";
  y << ind << "  join: " << SizeText(p.join_bytes) << "\n";
}

}  // namespace

std::string Policy::ToYaml() const {
  auto quote = [](const std::string& v) {
    std::string q = "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') q += '\\';
      q += c;
    }
    return q + "\"";
  };
  std::ostringstream y;
  y << "name: " << quote(name) << "\n";
  if (!description.empty()) y << "description: " << quote(description) << "\n";
  EngineYaml(y, *this, "");
  y << "staging:\n  chunk_size: " << SizeText(staging_chunk_bytes) << "\n  threads: " << staging_threads
    << "\n  buffers: " << staging_buffers << "\n";
  y << "classes:\n";
  for (const ClientClass& c : classes) {
    y << "  - name: " << quote(c.name) << "\n    weight: " << c.weight << "\n    latency: " << (c.latency_allowed ? "true" : "false")
      << "\n";
  }
  if (!clients.empty()) {
    y << "clients:\n";
    for (const ClientRule& r : clients) {
      y << "  - name: " << quote(r.name_glob) << "\n";
      if (r.uid >= 0) y << "    uid: " << r.uid << "\n";
      y << "    class: " << quote(r.class_name) << "\n";
    }
  }
  y << "default_class: " << quote(default_class) << "\n";
  if (!gpu_overrides.empty()) y << "gpus:\n";
  for (const GpuOverride& o : gpu_overrides) {
    y << "  - match: [";
    const char* sep = "";
    for (int n : o.ordinals) y << std::exchange(sep, ", ") << n;
    for (const std::string& u : o.uuids) y << std::exchange(sep, ", ") << quote(u);
    y << "]\n";
    EngineYaml(y, *o.policy, "    ");
  }
  return y.str();
}

std::string Policy::Hash() const {
  const std::string c = Canonical();
  unsigned char h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, reinterpret_cast<const unsigned char*>(c.data()), c.size());
  char hex[17];
  for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", h[i]);
  return hex;
}

bool GpuOverride::Matches(int ordinal, std::string_view uuid) const {
  if (std::find(ordinals.begin(), ordinals.end(), ordinal) != ordinals.end()) return true;
  return !uuid.empty() && std::find(uuids.begin(), uuids.end(), Lower(std::string(uuid))) != uuids.end();
}

std::string GpuOverride::MatchText() const {
  std::string text;
  for (int n : ordinals) text += (text.empty() ? "" : ", ") + std::to_string(n);
  for (const std::string& u : uuids) text += (text.empty() ? "" : ", ") + u;
  return text;
}

const std::shared_ptr<const Policy>& Policy::ForGpu(const std::shared_ptr<const Policy>& self, int ordinal,
                                                    std::string_view uuid) const {
  for (const GpuOverride& o : gpu_overrides) {
    if (o.Matches(ordinal, uuid)) return o.policy;
  }
  return self;
}

const ClientClass& Policy::ClassFor(const std::string& client_name, int64_t uid) const {
  std::string want = default_class;
  for (const ClientRule& r : clients) {
    if ((r.uid < 0 || r.uid == uid) && ::fnmatch(r.name_glob.c_str(), client_name.c_str(), 0) == 0) {
      want = r.class_name;
      break;
    }
  }
  for (const ClientClass& c : classes) {
    if (c.name == want) return c;
  }
  return classes.front();
}

void Policy::Pieces(uint64_t length, std::vector<uint64_t>& out) const {
  out.clear();
  switch (schedule) {
    case Schedule::kSerial:
    case Schedule::kSideStream:
      out.push_back(length);
      return;
    case Schedule::kChunked:
      for (uint64_t left = length; left > 0;) {
        const uint64_t n = std::min(left, chunk_bytes);
        out.push_back(n);
        left -= n;
      }
      return;
    case Schedule::kGeometric: {
      uint64_t next = first_chunk_bytes ? first_chunk_bytes : static_cast<uint64_t>(static_cast<double>(length) * (1 - ratio));
      for (uint64_t left = length; left > 0;) {
        uint64_t n = std::min(left, std::max(next, min_chunk_bytes));
        if (left - n < min_chunk_bytes) n = left;  // no runt after the tail piece
        out.push_back(n);
        left -= n;
        next = static_cast<uint64_t>(static_cast<double>(n) * ratio);
      }
      return;
    }
  }
}

Result<std::shared_ptr<const Policy>> ParsePolicy(const std::string& text, const std::string& name) {
  FERRY_ASSIGN_OR_RETURN(YAML::Node root, LoadString(text, name));
  return FromYaml(root, name);
}

Result<std::shared_ptr<const Policy>> LoadPolicyFile(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(YAML::Node root, LoadFile(path));
  return FromYaml(root, path);
}

std::vector<std::string> DiffCanonical(const std::string& a, const std::string& b) {
  auto lines = [](const std::string& c) {
    std::map<std::string, std::string> kv;
    std::istringstream in(c);
    for (std::string line; std::getline(in, line);) {
      const auto colon = line.find(": ");
      if (line.empty() || line[0] == '#' || colon == std::string::npos) continue;
      kv[line.substr(0, colon)] = line.substr(colon + 2);
    }
    return kv;
  };
  auto ka = lines(a), kb = lines(b);
  std::set<std::string> keys;
  for (auto& [k, v] : ka) keys.insert(k);
  for (auto& [k, v] : kb) keys.insert(k);
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    auto ia = ka.find(k), ib = kb.find(k);
    std::string va = ia == ka.end() ? "(unset)" : ia->second, vb = ib == kb.end() ? "(unset)" : ib->second;
    if (va != vb) out.push_back(k + ": " + va + " -> " + vb);
  }
  return out;
}

std::vector<std::string> DiffPolicies(const Policy& a, const Policy& b) { return DiffCanonical(a.Canonical(), b.Canonical()); }

}  // namespace ferry::policy
