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

// At least `needed` (GB/s), `got` measured; `machine_limit`: the fastest this machine moved data
// the same way in the same run (0: not measured). A miss is kAboveMachineLimit only where the
// target itself lies above that limit, so nothing could have met it here.
inline Verdict AtLeast(double got, double needed, double machine_limit) {
  if (got >= needed) return Verdict::kPass;
  return machine_limit > 0 && needed > machine_limit ? Verdict::kAboveMachineLimit : Verdict::kFail;
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
