// The command-line programs' shared pieces: walking arguments, help, and failing with the
// program's name in front.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::cli {

// Prints "PREFIX: WHAT" on stderr and returns 1, a command's exit code for a failure. PREFIX is
// the program, and the command where it helps ("ferryctl", "ferryctl: tune").
int Fail(std::string_view prefix, std::string_view what);
// Prints a command's help text on stdout and returns 0.
int Help(std::string_view usage);

// Walks a command's arguments in order:
//   cli::Args a(args);
//   while (a.Next()) {
//     if (a.IsHelp()) return cli::Help(kUsage);
//     else if (a.Is("--out")) out = a.Value();
//     else if (a.Is("--n")) { if (!a.IntValue(64, 16384, n)) return cli::Fail("x", "--n takes 64..16384"); }
//     else return cli::Fail("x", "unknown option '" + a.current() + "'");
//   }
class Args {
 public:
  explicit Args(std::vector<std::string> args) : args_(std::move(args)) {}
  Args(int argc, char** argv, int first = 1);

  bool Next();  // moves to the next argument; false past the last
  const std::string& current() const { return args_[at_]; }
  bool Is(std::string_view option) const { return current() == option; }
  bool IsHelp() const { return Is("-h") || Is("--help"); }
  bool HasValue() const { return at_ + 1 < args_.size(); }  // an argument follows the current one
  // An argument follows that is not an option (does not begin with '-'): an optional value.
  bool HasOperand() const { return HasValue() && !args_[at_ + 1].empty() && args_[at_ + 1][0] != '-'; }
  // Takes the argument after the current one; "" when there is none.
  std::string Value();
  // Takes the argument after the current one as an integer in [lo, hi] into `out`; false (and
  // `out` unchanged) when there is none, or it is not all digits, or it is out of range.
  template <typename T>
  bool IntValue(long long lo, long long hi, T& out) {
    long long v = 0;
    if (!ParseInt(Value(), lo, hi, v)) return false;
    out = static_cast<T>(v);
    return true;
  }
  // The same for a byte count ("64MiB", "4096": common/byte_size.hpp).
  template <typename T>
  bool ByteSizeValue(uint64_t lo, uint64_t hi, T& out) {
    uint64_t v = 0;
    if (!ParseBytes(Value(), lo, hi, v)) return false;
    out = static_cast<T>(v);
    return true;
  }

  static bool ParseInt(const std::string& text, long long lo, long long hi, long long& out);
  static bool ParseBytes(const std::string& text, uint64_t lo, uint64_t hi, uint64_t& out);

 private:
  std::vector<std::string> args_;
  size_t at_ = static_cast<size_t>(-1);  // before the first
};

}  // namespace ferry::cli
