// A benchmark target's verdict, where the same run can also show a target out of this machine's
// reach: "If the machine's own limit is below a target, measure that limit in the same run and
// say so."
#pragma once

namespace ferry::bench {

enum class Verdict {
  kPass,
  kFail,
  kAboveMachineLimit,  // missed, and the target asks for more than this machine did in the run
};

// A figure within this fraction of the machine's limit is as close to it as copies come.
inline constexpr double kNearMachineLimit = 0.9;

// At least `needed` (GB/s), `got` measured; `machine_limit`: the fastest this machine moved data
// the same way in the same run (0: not measured). A miss is kAboveMachineLimit only where the
// target itself lies above that limit, so nothing could have met it here, and `got` came within
// kNearMachineLimit of the limit: a figure far below it is a failure whatever the target.
inline Verdict AtLeast(double got, double needed, double machine_limit) {
  if (got >= needed) return Verdict::kPass;
  const bool unreachable = machine_limit > 0 && needed > machine_limit;
  return unreachable && got >= kNearMachineLimit * machine_limit ? Verdict::kAboveMachineLimit : Verdict::kFail;
}

inline Verdict PassOrFail(bool pass) { return pass ? Verdict::kPass : Verdict::kFail; }

// The word a table of targets shows: PASS, FAIL, or LIMIT (missed, out of this machine's reach).
inline const char* VerdictWord(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "PASS";
    case Verdict::kFail:
      return "FAIL";
    case Verdict::kAboveMachineLimit:
      return "LIMIT";
  }
  return "?";
}

}  // namespace ferry::bench
