#include "common/cli.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "common/byte_size.hpp"

namespace ferry::cli {

int Fail(std::string_view prefix, std::string_view what) {
  std::fprintf(stderr, "%.*s: %.*s\n", static_cast<int>(prefix.size()), prefix.data(), static_cast<int>(what.size()),
               what.data());
  return 1;
}

int Help(std::string_view usage) {
  std::fwrite(usage.data(), 1, usage.size(), stdout);
  return 0;
}

Args::Args(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) args_.emplace_back(argv[i]);
}

bool Args::Next() {
  ++at_;
  return at_ < args_.size();
}

std::string Args::Value() { return HasValue() ? args_[++at_] : std::string(); }

bool Args::ParseInt(const std::string& text, long long lo, long long hi, long long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || v < lo || v > hi) return false;
  out = v;
  return true;
}

bool Args::ParseBytes(const std::string& text, uint64_t lo, uint64_t hi, uint64_t& out) {
  Result<uint64_t> v = ParseByteSize(text);
  if (!v.ok() || *v < lo || *v > hi) return false;
  out = *v;
  return true;
}

}  // namespace ferry::cli
