// The backends' names as configuration, options and reports spell them: "cuda" and "host".
#pragma once

#include <optional>
#include <string_view>

#include "common/wire.hpp"

namespace ferry {

inline std::string_view BackendName(wire::BackendKind kind) {
  return kind == wire::BackendKind::kCuda ? "cuda" : "host";
}

// "cuda" or "host"; nullopt for anything else (callers that also take "auto" check it first).
inline std::optional<wire::BackendKind> ParseBackendName(std::string_view name) {
  if (name == "cuda") return wire::BackendKind::kCuda;
  if (name == "host") return wire::BackendKind::kHost;
  return std::nullopt;
}

enum class BackendKind;  // the public API's (ferry/client.hpp): the same values as wire::BackendKind
inline std::string_view BackendName(BackendKind kind) { return BackendName(static_cast<wire::BackendKind>(kind)); }

}  // namespace ferry
