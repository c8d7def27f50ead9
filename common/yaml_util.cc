#include "common/yaml_util.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <limits>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include <yaml-cpp/eventhandler.h>

#include "common/fd.hpp"
#include "common/status_macros.hpp"

namespace ferry::yamlutil {
namespace {

std::string Position(const YAML::Mark& m) { return std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1); }

// Thrown out of yaml-cpp's parser by FileScanner to stop it at the first refusal.
struct Refusal {
  Status status;
};

// Walks a file's parse events (no node graph is built) and refuses what ferry's files never
// need and what would make later work unbounded: anchors and aliases (one alias node stands for
// a whole subtree, so a few hundred bytes can expand to billions of nodes), merge keys,
// nesting deeper than kMaxYamlDepth (yaml-cpp recurses per level), and keys given twice in one
// mapping (yaml-cpp would silently keep one of them).
class FileScanner : public YAML::EventHandler {
 public:
  explicit FileScanner(const std::string& name) : name_(name) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { OnNode(mark, anchor, nullptr); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Refuse(mark, kNoAliases); }
  void OnAnchor(const YAML::Mark& mark, const std::string&) override { Refuse(mark, kNoAliases); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor, const std::string& value) override {
    OnNode(mark, anchor, &value);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    OnNode(mark, anchor, nullptr);
    Open(mark, false);
  }
  void OnSequenceEnd() override { open_.pop_back(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor, YAML::EmitterStyle::value) override {
    OnNode(mark, anchor, nullptr);
    Open(mark, true);
  }
  void OnMapEnd() override { open_.pop_back(); }

 private:
  static constexpr const char* kNoAliases =
      "aliases and anchors are not allowed in ferry files (write each setting out in full)";

  struct Collection {
    bool is_map = false;
    bool next_is_key = true;                  // maps: their events alternate key, value
    std::map<std::string, YAML::Mark> keys;  // maps: scalar keys seen so far
  };

  [[noreturn]] void Refuse(const YAML::Mark& mark, const std::string& what) {
    throw Refusal{InvalidArgument(name_ + ":" + Position(mark) + ": " + what)};
  }

  void OnNode(const YAML::Mark& mark, YAML::anchor_t anchor, const std::string* scalar) {
    if (anchor != YAML::NullAnchor) Refuse(mark, kNoAliases);
    if (open_.empty() || !open_.back().is_map) return;
    Collection& map = open_.back();
    const bool is_key = std::exchange(map.next_is_key, !map.next_is_key);
    if (!is_key || scalar == nullptr) return;
    if (*scalar == "<<") Refuse(mark, "merge keys ('<<') are not allowed in ferry files (write each setting out in full)");
    auto [it, fresh] = map.keys.emplace(*scalar, mark);
    if (!fresh) Refuse(mark, "key '" + *scalar + "' repeats the one at " + Position(it->second) + " (give each key once)");
  }

  void Open(const YAML::Mark& mark, bool is_map) {
    if (open_.size() >= static_cast<size_t>(kMaxYamlDepth)) {
      Refuse(mark, "nested deeper than " + std::to_string(kMaxYamlDepth) +
                       " levels (ferry's files need a few; is this the right file, or is its indentation off?)");
    }
    open_.push_back(Collection{.is_map = is_map, .next_is_key = true, .keys = {}});
  }

  const std::string& name_;
  std::vector<Collection> open_;
};

}  // namespace

Result<YAML::Node> LoadString(const std::string& text, const std::string& name) {
  if (text.size() > kMaxYamlBytes) {
    return InvalidArgument(name + ": " + std::to_string(text.size()) + " bytes; the limit is 1 MiB");
  }
  try {
    {
      std::istringstream in(text);
      YAML::Parser parser(in);
      FileScanner scanner(name);
      parser.HandleNextDocument(scanner);
    }
    // Only now build the nodes: no aliases, so as many nodes as the text spells out.
    return YAML::Load(text);
  } catch (const Refusal& r) {
    return r.status;
  } catch (const YAML::Exception& e) {
    return InvalidArgument(name + ":" + Position(e.mark) + ": " + e.msg);
  }
}

Result<std::string> ReadYamlFd(int fd, const std::string& name) {
  if (Status regular = CheckRegularFile(fd, name); !regular.ok()) {
    if (regular.code() != Code::kInvalidArgument) return regular;
    return InvalidArgument(regular.message() + "; give the path of a YAML file");
  }
  // Read at most one byte past the limit, whatever the file claims its size is.
  std::string text(kMaxYamlBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::pread(fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("read " + name, errno);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > kMaxYamlBytes) return InvalidArgument(name + " is larger than 1 MiB, the limit for ferry's YAML files");
  text.resize(got);
  return text;
}

Result<YAML::Node> LoadFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (ReadYamlFd then refuses it).
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) return ErrnoStatus("cannot open " + path, errno);
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadYamlFd(fd.get(), path));
  return LoadString(text, path);
}

Status ErrorAt(const std::string& file, const YAML::Node& node, std::string_view what) {
  YAML::Mark m = node.Mark();
  std::string where = file;
  if (!m.is_null()) where.append(":").append(std::to_string(m.line + 1)).append(":").append(std::to_string(m.column + 1));
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

Result<uint64_t> GetSize(const std::string& file, const YAML::Node& node, uint64_t min, uint64_t max) {
  if (!node.IsScalar()) return ErrorAt(file, node, "expected a size such as 64MiB");
  Result<uint64_t> v = ParseByteSize(node.Scalar());
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
