// What `ferryctl tune` records of one A/B comparison (bench/ab_verdict), and how it is written:
// in percent for the tables, in JSON for the report.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bench/ab_verdict.hpp"
#include "bench/transfer_sweep.hpp"
#include "policy/policy.hpp"

namespace ferry::bench {

// One comparison: B (a candidate, or the start against itself) against A (the best so far).
struct Comparison {
  std::string label, change;                     // change: "key: old -> new; ..." from A, or what B is
  std::shared_ptr<const policy::Policy> policy;  // B
  std::string a_hash;
  AbResult ab;
  std::vector<AbPair> pairs;
  // Means over the pairs of each side's two exposed times (seconds).
  double a_pipelined = 0, a_in_step = 0, b_pipelined = 0, b_in_step = 0;
  bool checks_passed = true;
  std::string check_failure;
  std::vector<Bandwidth> sweep;  // the start's: every size
  double largest_gbps = 0;       // the slower direction at the largest size
  // The bandwidth guard of a candidate the rule would keep: A's and B's largest copy in pairs.
  AbResult bandwidth;
  std::vector<AbPair> bandwidth_pairs;  // seconds per GB, the slower direction
  std::string verdict;                  // the rule's, or "rejected: ..."; "better: kept" once kept
  bool kept = false;
};

std::string AbJson(const AbResult& r, const std::vector<AbPair>& pairs);
std::string ComparisonJson(const Comparison& c);

}  // namespace ferry::bench
