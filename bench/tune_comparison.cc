#include "bench/tune_comparison.hpp"

#include <sstream>

#include "common/json.hpp"

namespace ferry::bench {

std::string AbJson(const AbResult& r, const std::vector<AbPair>& pairs) {
  std::ostringstream o;
  o << "{\"verdict\": " << json::String(AbVerdictName(r.verdict)) << ", \"reason\": " << json::String(r.reason)
    << ", \"pairs\": " << r.pairs << ", \"early\": " << (r.early ? "true" : "false")
    << ", \"a_score_seconds\": " << json::Number(r.mean_a) << ", \"b_score_seconds\": " << json::Number(r.mean_b)
    << ", \"difference\": " << json::Number(r.difference) << ", \"interval\": [" << json::Number(r.low) << ", "
    << json::Number(r.high) << "], \"interval_confidence\": " << json::Number(r.level)
    << ", \"pair_sd\": " << json::Number(r.pair_sd) << ", \"min_effect\": " << json::Number(r.min_effect)
    << ", \"scores\": [";
  for (size_t i = 0; i < pairs.size(); ++i)
    o << (i ? ", " : "") << "[" << json::Number(pairs[i].a) << ", " << json::Number(pairs[i].b) << "]";
  o << "]}";
  return o.str();
}

std::string ComparisonJson(const Comparison& c) {
  std::ostringstream o;
  o << "{\"label\": " << json::String(c.label) << ", \"change\": " << json::String(c.change)
    << ", \"policy_hash\": " << json::String(c.policy->Hash()) << ", \"against_hash\": " << json::String(c.a_hash)
    << ", \"checks_passed\": " << (c.checks_passed ? "true" : "false") << ", \"verdict\": " << json::String(c.verdict)
    << ", \"kept\": " << (c.kept ? "true" : "false")
    << ", \"a_pipelined_exposed_seconds\": " << json::Number(c.a_pipelined)
    << ", \"a_in_step_exposed_seconds\": " << json::Number(c.a_in_step)
    << ", \"b_pipelined_exposed_seconds\": " << json::Number(c.b_pipelined)
    << ", \"b_in_step_exposed_seconds\": " << json::Number(c.b_in_step) << ", \"ab\": " << AbJson(c.ab, c.pairs);
  if (!c.bandwidth_pairs.empty())
    o << ", \"largest_copy_gbps\": " << json::Number(c.largest_gbps)
      << ", \"bandwidth_guard\": " << AbJson(c.bandwidth, c.bandwidth_pairs);
  if (!c.sweep.empty()) {
    o << ", \"largest_copy_gbps\": " << json::Number(c.largest_gbps) << ", \"sweep\": [";
    for (size_t i = 0; i < c.sweep.size(); ++i) {
      o << (i ? ", " : "") << "{\"bytes\": " << c.sweep[i].bytes << ", \"direction\": \"" << c.sweep[i].direction
        << "\", \"gbps\": " << json::Number(c.sweep[i].gbps) << "}";
    }
    o << "]";
  }
  o << "}";
  return o.str();
}

}  // namespace ferry::bench
