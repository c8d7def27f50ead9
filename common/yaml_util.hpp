// Helpers for ferry's YAML files (daemon config, policies): errors that say file, line, column
// and what was expected; unknown keys rejected; sizes like "64MiB"; ranges checked.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "common/byte_size.hpp"
#include "ferry/status.hpp"

namespace ferry::yamlutil {

inline constexpr size_t kMaxYamlBytes = 1 << 20;  // config and policy files are small
inline constexpr int kMaxYamlDepth = 8;

// Reads and parses a YAML file: size- and depth-limited, with file:line:col in every error.
// ferry's files need none of YAML's anchors, aliases or merge keys, and an alias can make a few
// hundred bytes stand for billions of nodes ("billion laughs"): the text is scanned as events
// first, and anchors, aliases, merge keys, duplicate keys and deep nesting are refused before
// any node graph exists, so the work per file is bounded by its size.
Result<YAML::Node> LoadFile(const std::string& path);
Result<YAML::Node> LoadString(const std::string& text, const std::string& name);
// Reads an opened YAML file for LoadString: a regular file only, at most kMaxYamlBytes (never
// more than that plus one block is read, whatever the file is).
Result<std::string> ReadYamlFd(int fd, const std::string& name);

Status ErrorAt(const std::string& file, const YAML::Node& node, std::string_view what);
Status CheckKeys(const std::string& file, const YAML::Node& map, std::initializer_list<std::string_view> allowed);

Result<uint64_t> GetSize(const std::string& file, const YAML::Node& node, uint64_t min, uint64_t max);
Result<int64_t> GetInt(const std::string& file, const YAML::Node& node, int64_t min, int64_t max);
Result<double> GetDouble(const std::string& file, const YAML::Node& node, double min, double max);
Result<std::string> GetString(const std::string& file, const YAML::Node& node);
Result<bool> GetBool(const std::string& file, const YAML::Node& node);

}  // namespace ferry::yamlutil
