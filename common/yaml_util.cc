#include "common/yaml_util.hpp"

#include <cctype>
#include <fstream>
#include <limits>
#include <sstream>

namespace ferry::yamlutil {
namespace {

int Depth(const YAML::Node& n, int limit) {
  if (limit < 0) return 0;
  int best = 0;
  if (n.IsMap() || n.IsSequence()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      const YAML::Node child = n.IsMap() ? it->second : *it;
      int d = Depth(child, limit - 1);
      if (d > best) best = d;
      if (best > limit) break;
    }
    return best + 1;
  }
  return 0;
}

Status CheckDepth(const YAML::Node& root, const std::string& name) {
  if (Depth(root, kMaxYamlDepth + 1) > kMaxYamlDepth) {
    return InvalidArgument(name + ": nested deeper than " + std::to_string(kMaxYamlDepth) + " levels");
  }
  return Status::Ok();
}

}  // namespace

Result<YAML::Node> LoadString(const std::string& text, const std::string& name) {
  if (text.size() > kMaxYamlBytes) {
    return InvalidArgument(name + ": " + std::to_string(text.size()) + " bytes, the limit is " +
                           std::to_string(kMaxYamlBytes));
  }
  // yaml-cpp recurses per nesting level while parsing; refuse absurd nesting before it does.
  int depth = 0, max_depth = 0;
  for (char c : text) {
    if (c == '[' || c == '{') max_depth = std::max(max_depth, ++depth);
    if (c == ']' || c == '}') --depth;
  }
  if (max_depth > 64) return InvalidArgument(name + ": flow collections nested " + std::to_string(max_depth) + " deep");
  try {
    YAML::Node root = YAML::Load(text);
    FERRY_RETURN_IF_ERROR(CheckDepth(root, name));
    return root;
  } catch (const YAML::Exception& e) {
    return InvalidArgument(name + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                           ": " + e.msg);
  }
}

Result<YAML::Node> LoadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return LoadString(ss.str(), path);
}

Status ErrorAt(const std::string& file, const YAML::Node& node, std::string_view what) {
  YAML::Mark m = node.Mark();
  std::string where = file;
  if (!m.is_null()) where += ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
  return InvalidArgument(where + ": " + std::string(what));
}

Status CheckKeys(const std::string& file, const YAML::Node& map, std::initializer_list<std::string_view> allowed) {
  if (!map.IsMap()) return ErrorAt(file, map, "expected a mapping");
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it->first.IsScalar()) return ErrorAt(file, it->first, "expected a key");
    const std::string key = it->first.Scalar();
    bool ok = false;
    for (auto a : allowed) ok |= (a == key);
    if (!ok) {
      std::string list;
      for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      return ErrorAt(file, it->first, "unknown key '" + key + "' (expected one of: " + list + ")");
    }
  }
  return Status::Ok();
}

Result<uint64_t> ParseSize(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t start = i;
  uint64_t v = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return InvalidArgument("size overflows 64 bits");
    v = v * 10 + d;
    ++i;
  }
  if (i == start) return InvalidArgument("expected a size such as 4096, 64MiB or 1GiB");
  while (i < text.size() && text[i] == ' ') ++i;
  std::string unit(text.substr(i));
  struct U { const char* name; uint64_t mult; };
  static constexpr U kUnits[] = {{"", 1}, {"B", 1}, {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30},
                                 {"TiB", 1ull << 40}, {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000ull}};
  for (const U& u : kUnits) {
    if (unit == u.name) {
      if (v > std::numeric_limits<uint64_t>::max() / u.mult) return InvalidArgument("size overflows 64 bits");
      return v * u.mult;
    }
  }
  return InvalidArgument("unknown size unit '" + unit + "' (expected B, KiB, MiB, GiB, TiB, KB, MB or GB)");
}

Result<uint64_t> GetSize(const std::string& file, const YAML::Node& node, uint64_t min, uint64_t max) {
  if (!node.IsScalar()) return ErrorAt(file, node, "expected a size such as 64MiB");
  Result<uint64_t> v = ParseSize(node.Scalar());
  if (!v.ok()) return ErrorAt(file, node, v.status().message());
  if (*v < min || *v > max) {
    return ErrorAt(file, node, "size " + node.Scalar() + " out of range [" + std::to_string(min) + ", " +
                                   std::to_string(max) + "] bytes");
  }
  return v;
}

Result<int64_t> GetInt(const std::string& file, const YAML::Node& node, int64_t min, int64_t max) {
  if (!node.IsScalar()) return ErrorAt(file, node, "expected an integer");
  const std::string& s = node.Scalar();
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos, 10);
  } catch (...) {
    return ErrorAt(file, node, "expected an integer, got '" + s + "'");
  }
  if (pos != s.size()) return ErrorAt(file, node, "expected an integer, got '" + s + "'");
  if (v < min || v > max) {
    return ErrorAt(file, node, "value " + s + " out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return static_cast<int64_t>(v);
}

Result<double> GetDouble(const std::string& file, const YAML::Node& node, double min, double max) {
  if (!node.IsScalar()) return ErrorAt(file, node, "expected a number");
  const std::string& s = node.Scalar();
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    return ErrorAt(file, node, "expected a number, got '" + s + "'");
  }
  if (pos != s.size() || !(v >= min && v <= max)) {
    std::ostringstream os;
    os << "expected a number in [" << min << ", " << max << "], got '" << s << "'";
    return ErrorAt(file, node, os.str());
  }
  return v;
}

Result<std::string> GetString(const std::string& file, const YAML::Node& node) {
  if (!node.IsScalar()) return ErrorAt(file, node, "expected a string");
  return node.Scalar();
}

Result<bool> GetBool(const std::string& file, const YAML::Node& node) {
  if (!node.IsScalar()) return ErrorAt(file, node, "expected true or false");
  const std::string& s = node.Scalar();
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  return ErrorAt(file, node, "expected true or false, got '" + s + "'");
}

}  // namespace ferry::yamlutil
